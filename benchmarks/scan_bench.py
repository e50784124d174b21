"""evt.scan on a GPU: correctness (fp32, bf16) and speed against the memory floor and PyTorch.

    python benchmarks/scan_bench.py [--out DIR] [--quick] [--budget S] [--no-tanh-sweep]

One run does everything (it was written for a single device call):
1. correctness of every scan mode on CUDA against float64 references (torch.cumsum/cummax/logcumsumexp or an
   eager loop), fresh random data, outputs allocated over freed NaN-filled memory (an unwritten element shows);
2. the device's copy bandwidth (bytes read + written / time of a large device-to-device copy);
3. timings (triton.testing.do_bench, median) of torch.cumsum and evt.scan at its defaults: cumulative sums on
   (65536, 1024) and (4096, 8192) fp32 and bf16, the linear recurrence ``a * h + x``, and ``tanh(a * h + x)``
   against an eager PyTorch loop, the scans also under a CUDA graph (kernel time without Python launch
   overhead);
4. sweeps of launch configs under a CUDA graph (``*_SWEEP`` below: the defaults before and the candidates),
   each config first checked against float64 on the data it is timed on (a config that fails is timed but
   never reported as best). The floor of each is its bytes (inputs read once, output written once) over the
   measured copy bandwidth.
Everything goes to DIR/scan_bench.json (rewritten after each sweep); a summary table is printed last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import evtorch as evt  # noqa: E402
from evtorch.scan import ScanConfig  # noqa: E402

RESULTS: dict = {"correctness": [], "timings": [], "errors": []}
T_START = time.time()
TIME_BUDGET_S = 290  # sweeps stop here so that the results are written well inside a 6-minute device call
TANH_SWEEPS = True
OUT_DIR = "."
DEV = "cuda"
DRY = False  # --dry: tiny sizes on CPU through Triton's interpreter, to check this script without a GPU

ADD = lambda p, x: p + x  # noqa: E731  (bodies defined once: a trace is cached per body)
MAX = lambda h, x: torch.maximum(h, x)  # noqa: E731
LIN = lambda h, a, x: a * h + x  # noqa: E731
LAE = lambda h, x: torch.logaddexp(h, x)  # noqa: E731
TANH = lambda h, a, x: torch.tanh(a * h + x)  # noqa: E731


_LB, _TP, _PK = "lookback", "threepass", "packed"


def C(bt, bn, nw, strategy, window=None, sub=None, seg=None):
    return ScanConfig(bt, bn, nw, strategy=strategy, window=window, seg=seg, sub=sub)


# the defaults of docs/scan.md's runs 1-2 (the look-back; long scans are segmented by default since run 4),
# timed in every run for comparison
OLD_CUMSUM_LONG, OLD_CUMSUM_SHORT = C(16, 512, 4, _LB, 16, 1), C(16, 512, 4, _LB, 1, 1)
OLD_CUMSUM_BF16_LONG = C(16, 512, 4, _LB, 8, 1)
OLD_LINEAR_LONG, OLD_LINEAR_SHORT = C(8, 512, 4, _TP, seg=256), C(16, 512, 4, _LB, 8, 1)
OLD_LAE = C(8, 512, 4, _LB, 8, 1)
# sweeps: (chunk steps, lanes, warps, strategy, look-back window, sub-blocks); each compiled offline for sm_90
# without spills first (benchmarks/scan_compile_check.py)
CUMSUM_LONG_SWEEP = [OLD_CUMSUM_LONG, C(64, 128, 4, _LB, 8, 4), C(16, 512, 4, _PK, 8, 1), C(32, 256, 4, _PK, 8, 2),
                     C(64, 128, 4, _PK, 4, 4), C(64, 128, 4, _PK, 8, 4), C(64, 128, 8, _PK, 8, 8),
                     C(128, 64, 4, _PK, 8, 8), C(32, 128, 4, _PK, 8, 4), C(64, 256, 8, _PK, 8, 4)]
CUMSUM_SHORT_SWEEP = [OLD_CUMSUM_SHORT, C(16, 512, 4, _PK, 8, 1), C(32, 256, 4, _PK, 8, 2), C(64, 128, 4, _PK, 8, 4),
                      C(64, 128, 8, _PK, 8, 8), C(128, 64, 4, _PK, 8, 8)]
CUMSUM_BF16_LONG_SWEEP = [OLD_CUMSUM_BF16_LONG, C(64, 128, 4, _PK, 8, 8), C(128, 128, 8, _PK, 8, 16),
                          C(64, 256, 8, _PK, 8, 8), C(128, 64, 4, _PK, 8, 16)]
CUMSUM_BF16_SHORT_SWEEP = [OLD_CUMSUM_SHORT, C(64, 128, 4, _PK, 8, 8), C(128, 128, 8, _PK, 8, 16),
                           C(32, 256, 4, _PK, 8, 4)]
LINEAR_LONG_SWEEP = [OLD_LINEAR_LONG, OLD_LINEAR_SHORT, C(64, 128, 8, _LB, 8, 8), C(32, 128, 4, _LB, 8, 4),
                     C(64, 64, 4, _LB, 8, 8)]
LINEAR_SHORT_SWEEP = [OLD_LINEAR_SHORT, C(64, 128, 8, _LB, 8, 8), C(32, 128, 4, _LB, 8, 4), C(64, 64, 4, _LB, 8, 8)]
LINEAR_BF16_SWEEP = [OLD_LINEAR_LONG, C(64, 128, 8, _LB, 8, 16)]
LAE_SWEEP = [OLD_LAE, C(64, 128, 4, _PK, 8, 4), C(32, 128, 4, _PK, 8, 4)]
TANH_SWEEP = [ScanConfig(block_n=b, num_warps=max(1, b // 32), depth=d)
              for b, d in ((32, 2), (32, 8), (64, 4), (128, 4), (32, 16))]
# correctness() runs these on the long shape, a ragged bf16 shape and the linear recurrence (packed configs
# fall back to the flag look-back there)
STRATEGY_CHECKS = [ScanConfig(strategy=_LB, window=1), ScanConfig(strategy=_TP, seg=256),
                   C(32, 128, 4, _PK, 8, 4), C(128, 64, 4, _PK, 8, 8),
                   ScanConfig(16, 512, 4, strategy="segmented", window=8, seg=32),
                   ScanConfig(8, 512, 4, strategy="segmented", window=8, seg=32, persist=5)]
# for benchmarks/scan_compile_check.py
ASSOC_SWEEP = CUMSUM_LONG_SWEEP + CUMSUM_SHORT_SWEEP + LAE_SWEEP
LINEAR_SWEEP = LINEAR_LONG_SWEEP + LINEAR_BF16_SWEEP
BF16_SWEEP = CUMSUM_BF16_LONG_SWEEP + CUMSUM_BF16_SHORT_SWEEP


def size(T, n):
    """The problem size, shrunk in --dry runs."""
    if not DRY:
        return T, n
    return max(2, min(T, 67)), max(1, min(n, 19))


def log(msg):
    print(msg, flush=True)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return float("inf")
    if torch.isnan(a).any() and not torch.isnan(b).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def poison(shape, dtype):
    """Fill then free memory of the output's size, so an unwritten output element reads NaN."""
    t = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    del t


def loop_ref(fn, init, *xs):
    """float64 eager loop over time (the oracle for non-torch-builtin recurrences)."""
    xs = [x.double() for x in xs]
    h = [r.double() for r in init]
    out = list(h)
    cur = h[-1]
    for t in range(len(init), xs[0].shape[0]):
        cur = fn(cur, *[x[t] for x in xs])
        out.append(cur)
    return torch.stack(out)


def check(name, got, ref, tol):
    err = rel(got, ref)
    ok = bool(err == err and err < tol)
    RESULTS["correctness"].append({"case": name, "rel_err": err, "tol": tol, "ok": ok})
    log(f"  [{'ok' if ok else 'FAIL'}] {name}: rel err {err:.3g} (tol {tol:g})")


def correctness(quick: bool):
    log("== correctness on CUDA ==")
    g = torch.Generator(device=DEV).manual_seed(1)
    dev = DEV
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        tag = "f32" if dt == torch.float32 else "bf16"
        for T, n in ((65536, 1024), (4099, 8191), (37, 3), (3, 700)):
            if quick and T * n > 2**24:
                continue
            T, n = size(T, n)
            X = torch.randn(T, n, device=dev, generator=g).to(dt)
            poison((T, n), dt)
            Y = evt.scan(ADD, X)
            check(f"cumsum {tag} {T}x{n}", Y, X.double().cumsum(0), tol)
            poison((T, n), dt)
            check(f"cummax {tag} {T}x{n}", evt.scan(MAX, X), X.double().cummax(0).values, tol)
        for T, n in ((2053, 1000), (64, 4096)):
            T, n = size(T, n)
            A = (0.9 + 0.1 * torch.rand(T, n, device=dev, generator=g)).to(dt)
            X = torch.randn(T, n, device=dev, generator=g).to(dt)
            poison((T, n), dt)
            H = evt.scan(LIN, A, X, init=X[:1])
            check(f"linear {tag} {T}x{n}", H, loop_ref(LIN, X[:1], A, X), tol)
            check(f"logcumsumexp {tag} {T}x{n}", evt.scan(LAE, X), X.double().logcumsumexp(0), tol)
            poison((T, n), dt)
            Z = evt.scan(TANH, A, X, init=X[:1])
            check(f"tanh {tag} {T}x{n}", Z, loop_ref(TANH, X[:1], A, X), tol)
    # features, fp32
    (T, n), m = size(1000, 300), 5
    X = torch.randn(T, n, device=dev, generator=g)
    A = torch.rand(T, n, device=dev, generator=g)
    C = torch.randn(T, n, device=dev, generator=g)
    init = torch.randn(2, n, device=dev, generator=g) * 0.1
    Y = evt.scan(lambda h, x: 0.5 * h + 0.3 * h.at(-2) + 0.1 * x, X, init=init)
    ref = [init[0].double(), init[1].double()]
    for t in range(2, T):
        ref.append(0.5 * ref[-1] + 0.3 * ref[-2] + 0.1 * X[t].double())
    check("k=2 init, h.at(-2)", Y, torch.stack(ref), 1e-4)
    S1, S2 = evt.scan(lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), X, init=(X[:1], torch.zeros(1, m, device=dev)))
    r1 = X.double().cumsum(0)
    r2 = torch.cat([torch.zeros(1, m, device=dev, dtype=torch.float64),
                    r1[:-1, :1].expand(-1, m).cumsum(0)])
    check("coupled s1 (TVM example)", S1, r1, 1e-4)
    check("coupled s2 (TVM example)", S2, r2, 1e-4)
    P = evt.scan(lambda h, a, x, c: a * h + x, A, X, C, init=torch.zeros(1, n, device=dev),
                 post=lambda h, a, x, c: c * h)
    H = loop_ref(lambda h, a, x, c: a * h + x, torch.zeros(1, n, device=dev), A, X, C)
    check("post y = c * h (linear)", P, C.double() * H, 1e-4)
    X3 = torch.randn(8, T, 33 if not DRY else 3, device=dev, generator=g)
    check("dim=1, rows (8, 33)", evt.scan(lambda h, x: h * 0.9 + x, X3, dim=1),
          loop_ref(lambda h, x: h * 0.9 + x, X3[:, :1].movedim(1, 0), X3.movedim(1, 0)).movedim(0, 1), 1e-4)
    Ab = torch.rand(T, 1, device=dev, generator=g)
    check("broadcast a (T, 1)", evt.scan(lambda h, a, x: a * h + x, Ab, X, init=X[:1]),
          loop_ref(lambda h, a, x: a * h + x, X[:1], Ab, X), 1e-4)
    # autograd (parallel backward) against the eager loop's autograd
    Tg, ng = size(500, 64)
    Ag = (0.5 + 0.5 * torch.rand(Tg, ng, device=dev, generator=g)).requires_grad_()
    Xg = torch.randn(Tg, ng, device=dev, generator=g).requires_grad_()
    w = torch.randn(Tg, ng, device=dev, generator=g)
    (evt.scan(LIN, Ag, Xg, init=Xg[:1]) * w).sum().backward()
    ga, gx = Ag.grad.clone(), Xg.grad.clone()
    Ag.grad = Xg.grad = None
    h, hs = Xg[0], [Xg[0]]
    for t in range(1, Tg):
        h = Ag[t] * h + Xg[t]
        hs.append(h)
    (torch.stack(hs) * w).sum().backward()
    check("backward dL/da (linear)", ga, Ag.grad, 1e-4)
    check("backward dL/dx (linear)", gx, Xg.grad, 1e-4)
    # both parallel strategies, several tilings; repeated on fresh data: a race in the look-back would show as
    # a moving error
    strategies = STRATEGY_CHECKS
    for i, cfg in enumerate(strategies):
        for rep in range(2 if not DRY else 1):
            X = torch.randn(*size(65536, 1024), device=dev, generator=g)
            A = 0.9 + 0.1 * torch.rand(*X.shape, device=dev, generator=g)
            poison(X.shape, X.dtype)
            check(f"cumsum {cfg.strategy} #{i}.{rep} {tuple(X.shape)}", evt.scan(ADD, X, config=cfg),
                  X.double().cumsum(0), 1e-4)
            if rep == 0:
                Xs, As = X[:3001], A[:3001]
                poison(Xs.shape, Xs.dtype)
                check(f"linear {cfg.strategy} #{i} {tuple(Xs.shape)}", evt.scan(LIN, As, Xs, init=Xs[:1], config=cfg),
                      loop_ref(LIN, Xs[:1], As, Xs), 1e-4)
        Xb = torch.randn(*size(4099, 8191), device=dev, generator=g).bfloat16()
        check(f"cumsum bf16 {cfg.strategy} #{i} {tuple(Xb.shape)}", evt.scan(ADD, Xb, config=cfg),
              Xb.double().cumsum(0), 2e-2)


def copy_bandwidth() -> float:
    import triton
    if DRY:
        return 1e11
    x = torch.empty(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    x.normal_()
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    bw = 2 * x.numel() * 4 / (ms * 1e-3)
    del x, y
    torch.cuda.empty_cache()
    return bw


def bench(fn, graph: bool, rep: int = 100):
    import triton
    if DRY:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def record(case, shape, dtype, variant, ms, floor_ms, extra=None):
    row = {"case": case, "shape": list(shape), "dtype": dtype, "variant": variant, "ms": ms, "floor_ms": floor_ms,
           "x_floor": ms / floor_ms if floor_ms else None}
    row.update(extra or {})
    RESULTS["timings"].append(row)
    xf = f"{ms / floor_ms:6.2f}x floor" if floor_ms else ""
    log(f"  {case:18s} {str(tuple(shape)):15s} {dtype:5s} {variant:34s} {ms * 1e3:10.1f} us  {xf}")


def sweep(case, fn_of_cfg, shape, dtype, floor_ms, configs, ref=None, tol=1e-4, reps=1, rep_ms=100):
    """Check each config's output against ``ref()`` (float64; fresh NaN-poisoned outputs; ``reps`` runs: a
    race shows as a moving error), then time it under a CUDA graph. Returns (best ms, config) over the
    configs that passed."""
    best = (math.inf, None)
    for cfg in configs:
        if time.time() - T_START > TIME_BUDGET_S:
            log(f"  (time budget reached: skipping the rest of the {case} sweep)")
            break
        tag = (f"{cfg.strategy or ''}{'/w' + str(cfg.window) if cfg.window else ''}"
               f"{'/seg' + str(cfg.seg) if cfg.seg else ''}{'/sub' + str(cfg.sub) if cfg.sub else ''}"
               f"{'/nohint' if cfg.l2hint is False else ''}{'/persist' + str(cfg.persist) if cfg.persist else ''}"
               f"{'/maxnreg' + str(cfg.maxnreg) if cfg.maxnreg else ''}"
               f"{'/keep' if getattr(cfg, 'keep', None) else ''}{'/pre' if getattr(cfg, 'prefetch', None) else ''}")
        name = f"graph {cfg.block_t},{cfg.block_n},{cfg.num_warps},d{cfg.depth} {tag}"
        try:
            ok = True
            if ref is not None:
                r = ref()
                for i in range(reps):
                    out = fn_of_cfg(cfg)
                    poison(out.shape, out.dtype)
                    out = fn_of_cfg(cfg)
                    n0 = len(RESULTS["correctness"])
                    check(f"{case} {dtype} {tuple(shape)} {name} .{i}", out, r, tol)
                    ok = ok and RESULTS["correctness"][n0]["ok"]
                    del out
            ms = bench(lambda: fn_of_cfg(cfg), graph=True, rep=rep_ms)
        except Exception as e:  # a config that fails to compile or launch is reported, not fatal
            RESULTS["errors"].append(f"{case} {cfg}: {type(e).__name__}: {str(e)[:300]}")
            log(f"  {case} {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        record(case, shape, dtype, name + ("" if ok else " WRONG"), ms, floor_ms,
               {"config": str(cfg), "checked": ref is not None, "ok": ok})
        if ok:
            best = min(best, (ms, cfg), key=lambda p: p[0])
    return best


def _time_eager(fn) -> float:
    """Median of 3 timed runs of a long eager loop (after one warm-up), in ms."""
    if DRY:
        return bench(fn, False)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[1]


def timings(bw: float, quick: bool):
    log("== timings (median; 'graph' = under a CUDA graph, no Python launch overhead) ==")
    g = torch.Generator(device=DEV).manual_seed(2)
    floor = lambda nbytes: nbytes / bw * 1e3  # noqa: E731  (ms)
    data = {}
    for T, n in ((65536, 1024), (4096, 8192)):
        T, n = size(T, n)
        X = torch.randn(T, n, device=DEV, generator=g)
        A = 0.5 + 0.5 * torch.rand(T, n, device=DEV, generator=g)
        data[(T, n)] = (X, A)
        fl, fl3 = floor(2 * X.numel() * 4), floor(3 * X.numel() * 4)
        record("cumsum", (T, n), "f32", "torch.cumsum", bench(lambda: torch.cumsum(X, 0), False), fl)
        record("cumsum", (T, n), "f32", "evt.scan", bench(lambda: evt.scan(ADD, X), False), fl)
        record("cumsum", (T, n), "f32", "evt.scan graph", bench(lambda: evt.scan(ADD, X), True), fl)
        Xb = X.bfloat16()
        record("cumsum", (T, n), "bf16", "evt.scan graph", bench(lambda: evt.scan(ADD, Xb), True),
               floor(2 * X.numel() * 2))
        del Xb
        record("linear a*h+x", (T, n), "f32", "evt.scan graph",
               bench(lambda: evt.scan(LIN, A, X, init=X[:1]), True), fl3)

    log("== tanh(a * h + x): sequential time loop vs an eager PyTorch loop ==")
    tanh_data = {}
    for T, n in ((4096, 8192), (16384, 1024)):
        T, n = size(T, n)
        A = torch.rand(T, n, device=DEV, generator=g)
        X = torch.randn(T, n, device=DEV, generator=g)
        tanh_data[(T, n)] = (X, A)
        fl3 = floor(3 * X.numel() * 4)

        def eager():
            out = torch.empty_like(X)
            h = X[0]
            out[0] = h
            for t in range(1, T):
                h = torch.tanh(A[t] * h + X[t])
                out[t] = h
            return out

        eager_ms = _time_eager(eager)
        RESULTS.setdefault("eager_ms", {})[f"{T}x{n}"] = eager_ms
        record("tanh(a*h+x)", (T, n), "f32", "eager PyTorch loop", eager_ms, fl3)
        ms = bench(lambda: evt.scan(TANH, A, X, init=X[:1]), False)
        record("tanh(a*h+x)", (T, n), "f32", "evt.scan", ms, fl3, {"speedup_vs_eager": eager_ms / ms})
        log(f"    speedup vs eager loop: {eager_ms / ms:.1f}x")
    if quick:
        return

    log("== config sweeps (CUDA graph; each config checked against float64 first) ==")
    best = RESULTS.setdefault("best", {})
    refs = {}

    def cached(key, make):
        def get():
            if key not in refs:
                refs[key] = make()
            return refs[key]
        return get

    def run(key, case, fn_of_cfg, shape, dtype, floor_ms, cfgs, ref, tol=1e-4, reps=1, rep_ms=50):
        b = sweep(case, fn_of_cfg, shape, dtype, floor_ms, cfgs, ref, tol, reps, rep_ms)
        best[key] = [b[0], b[0] / floor_ms, str(b[1])]
        refs.clear()
        dump(OUT_DIR)

    (Tl, nl), (Ts, ns) = size(65536, 1024), size(4096, 8192)
    (XL, AL), (XS, AS) = data[(Tl, nl)], data[(Ts, ns)]
    fl = lambda X, item=4, k=2: floor(k * X.numel() * item)  # noqa: E731
    run(f"cumsum f32 {Tl}x{nl}", "cumsum", lambda c: evt.scan(ADD, XL, config=c), (Tl, nl), "f32", fl(XL),
        CUMSUM_LONG_SWEEP, cached(0, lambda: XL.double().cumsum(0)), reps=2, rep_ms=100)
    run(f"cumsum f32 {Ts}x{ns}", "cumsum", lambda c: evt.scan(ADD, XS, config=c), (Ts, ns), "f32", fl(XS),
        CUMSUM_SHORT_SWEEP, cached(0, lambda: XS.double().cumsum(0)), rep_ms=100)
    XLb, XSb = XL.bfloat16(), XS.bfloat16()
    run(f"cumsum bf16 {Tl}x{nl}", "cumsum", lambda c: evt.scan(ADD, XLb, config=c), (Tl, nl), "bf16",
        fl(XL, 2), CUMSUM_BF16_LONG_SWEEP, cached(0, lambda: XLb.double().cumsum(0)), 2e-2)
    run(f"cumsum bf16 {Ts}x{ns}", "cumsum", lambda c: evt.scan(ADD, XSb, config=c), (Ts, ns), "bf16",
        fl(XS, 2), CUMSUM_BF16_SHORT_SWEEP, cached(0, lambda: XSb.double().cumsum(0)), 2e-2)
    run(f"linear f32 {Tl}x{nl}", "linear a*h+x", lambda c: evt.scan(LIN, AL, XL, init=XL[:1], config=c),
        (Tl, nl), "f32", fl(XL, 4, 3), LINEAR_LONG_SWEEP, cached(0, lambda: loop_ref(LIN, XL[:1], AL, XL)))
    run(f"linear f32 {Ts}x{ns}", "linear a*h+x", lambda c: evt.scan(LIN, AS, XS, init=XS[:1], config=c),
        (Ts, ns), "f32", fl(XS, 4, 3), LINEAR_SHORT_SWEEP, cached(0, lambda: loop_ref(LIN, XS[:1], AS, XS)))
    ALb = AL.bfloat16()
    run(f"linear bf16 {Tl}x{nl}", "linear a*h+x", lambda c: evt.scan(LIN, ALb, XLb, init=XLb[:1], config=c),
        (Tl, nl), "bf16", fl(XL, 2, 3), LINEAR_BF16_SWEEP, cached(0, lambda: loop_ref(LIN, XLb[:1], ALb, XLb)),
        2e-2)
    del XLb, XSb, ALb
    run(f"logcumsumexp f32 {Tl}x{nl}", "logcumsumexp", lambda c: evt.scan(LAE, XL, config=c), (Tl, nl), "f32",
        fl(XL), LAE_SWEEP, cached(0, lambda: XL.double().logcumsumexp(0)))
    if TANH_SWEEPS:
        for (T, n), (X, A) in tanh_data.items():
            b = sweep("tanh(a*h+x)", lambda c: evt.scan(TANH, A, X, init=X[:1], config=c), (T, n), "f32",
                      floor(3 * X.numel() * 4), TANH_SWEEP)
            best[f"tanh {T}x{n}"] = [b[0], RESULTS["eager_ms"][f"{T}x{n}"] / b[0], str(b[1])]


def dump(out: str):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scan_bench.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def main(argv=None):
    global DEV, DRY, TIME_BUDGET_S, TANH_SWEEPS, OUT_DIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="smaller correctness sizes, no config sweeps")
    ap.add_argument("--dry", action="store_true", help="tiny sizes on CPU (Triton interpreter): checks the script")
    ap.add_argument("--budget", type=float, default=290.0, help="seconds after which sweeps stop")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--no-tanh-sweep", action="store_true", help="time tanh(a*h+x) at its defaults only")
    args = ap.parse_args(argv)
    TIME_BUDGET_S, TANH_SWEEPS, OUT_DIR = args.budget, not args.no_tanh_sweep, args.out
    if args.dry:
        DEV, DRY = "cpu", True
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported below
        plain = evt.scan
        evt.scan = lambda *a, **k: plain(*a, **{"backend": "triton", **k})  # the generated kernels, on CPU
    import triton
    RESULTS["env"] = {"device": torch.cuda.get_device_name() if not DRY else "cpu (dry run)",
                      "torch": torch.__version__,
                      "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    log(json.dumps(RESULTS["env"]))
    t0 = time.time()
    try:
        if not args.skip_correctness:
            correctness(args.quick)
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    log(f"(correctness took {time.time() - t0:.0f} s)")
    dump(args.out)
    try:
        bw = copy_bandwidth()
        RESULTS["copy_bandwidth_GBps"] = bw / 1e9
        log(f"== device copy bandwidth: {bw / 1e9:.0f} GB/s (read + write) ==")
        timings(bw, args.quick)
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    dump(args.out)
    log("\n== summary ==")
    fails = [c for c in RESULTS["correctness"] if not c["ok"]]
    log(f"correctness: {len(RESULTS['correctness']) - len(fails)}/{len(RESULTS['correctness'])} ok"
        + (f"; FAILED: {[c['case'] for c in fails]}" if fails else ""))
    for r in RESULTS["timings"]:
        if "graph " in r["variant"] and r["variant"] != "evt.scan graph":
            continue
        xf = f"{r['x_floor']:.2f}x floor" if r["x_floor"] else ""
        sp = f"  {r['speedup_vs_eager']:.1f}x vs eager" if "speedup_vs_eager" in r else ""
        log(f"{r['case']:14s} {str(tuple(r['shape'])):14s} {r['dtype']:4s} {r['variant']:20s} {r['ms'] * 1e3:9.1f} us "
            f"{xf}{sp}")
    for k, v in RESULTS.get("best", {}).items():
        log(f"best {k}: {v}")
    log(f"errors: {len(RESULTS['errors'])}; total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
