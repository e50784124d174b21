"""The segmented associative scan against the look-back on a GPU: correctness, then timings (one device call).

    python benchmarks/scan_segmented_bench.py [--out DIR] [--budget S] [--dry] [--phase explore|confirm]

1. correctness of ``strategy="segmented"`` (every associative kind, fp32 and bf16, ragged T and lanes, k = 2,
   post and broadcast inputs, persistent grids, the long cumsum twice on fresh data: a race shows as a
   moving error) against float64 references, outputs over NaN-poisoned memory;
2. the copy bandwidth (bytes read + written by a 1 GiB device-to-device copy), measured twice;
3. sweeps under a CUDA graph (``scan_bench.sweep``: each config first checked against float64 on the data it
   is timed on; the ``/nocarry`` timing controls fail that check by design and are marked WRONG), the most
   important case first, stopping at the time budget;
4. the old defaults and the best of each sweep again with plain ``triton.testing.do_bench`` (median, L2
   flushed between calls), interleaved, two rounds.
Writes DIR/scan_segmented_bench.json after each step and prints a summary last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import scan_bench as B  # noqa: E402  (check, poison, sweep, bench, copy_bandwidth, the bodies, RESULTS)
import evtorch as evt  # noqa: E402
from evtorch.scan import ScanConfig  # noqa: E402

S, LB, TP, NC = "segmented", "lookback", "threepass", "segmented/nocarry"


def C(bt, bn, nw, strategy, window=None, seg=None, hint=None, persist=None, sub=None, keep=None, prefetch=None):
    return ScanConfig(bt, bn, nw, strategy=strategy, window=window, seg=seg, sub=sub, l2hint=hint, persist=persist,
                      keep=keep, prefetch=prefetch)


OLD = {"cumsum long": C(16, 512, 4, LB, 16, sub=1), "cumsum short": C(16, 512, 4, LB, 1, sub=1),
       "cumsum bf16 long": C(16, 512, 4, LB, 8, sub=1), "linear long": C(8, 512, 4, TP, seg=256),
       "linear short": C(16, 512, 4, LB, 8, sub=1), "lae long": C(8, 512, 4, LB, 8, sub=1),
       "cumsum bf16 short": C(16, 512, 4, LB, 1, sub=1), "linear bf16 long": C(8, 512, 4, TP, seg=256)}
SWEEPS = {
    "cumsum long": [OLD["cumsum long"], C(16, 512, 4, "lookback/nocarry", 16, sub=1),
                    C(16, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 32, hint=False), C(16, 512, 4, S, 8, 64),
                    C(16, 512, 4, S, 8, 128), C(8, 512, 4, S, 8, 16), C(8, 512, 4, S, 8, 32),
                    C(16, 512, 4, S, 8, 64, persist=2), C(16, 512, 4, S, 8, 32, persist=3),
                    C(16, 512, 4, S, 8, 128, persist=1), C(16, 1024, 8, S, 8, 32), C(16, 512, 4, NC, 8, 32),
                    C(32, 512, 4, LB, 8, sub=1), C(16, 512, 4, S, 16, 32)],
    "cumsum short": [OLD["cumsum short"], C(16, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 64), C(8, 512, 4, S, 8, 16),
                     C(16, 512, 4, S, 8, 32, persist=3), C(16, 512, 4, S, 4, 64)],
    "linear long": [OLD["linear long"], C(16, 512, 4, S, 8, 32), C(8, 512, 4, S, 8, 32),
                    C(16, 512, 4, S, 8, 64, persist=2), C(8, 512, 4, S, 8, 16)],
    "linear short": [OLD["linear short"], C(16, 512, 4, S, 8, 32), C(8, 512, 4, S, 8, 32)],
    "cumsum bf16 long": [OLD["cumsum bf16 long"], C(16, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 64)],
    "cumsum bf16 short": [OLD["cumsum short"], C(16, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 64)],
    "lae long": [OLD["lae long"], C(8, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 32)],
}
# run 4 (--phase confirm): the new defaults (run 3's best) against more programs per multiprocessor at the same
# or smaller L2 footprint (a register cap, persistent grids, 8-step tiles), and the cases run 3 left open
NEW = {"cumsum long": C(16, 512, 4, S, 8, 32, sub=1), "cumsum bf16 long": C(16, 512, 4, S, 8, 64, sub=1),
       "linear long": C(16, 512, 4, S, 8, 32, sub=1), "lae long": C(8, 512, 4, S, 8, 32, sub=1),
       "linear bf16 long": C(8, 512, 4, TP, 1, 256, sub=1)}


def R_(cfg, **kw):
    from dataclasses import replace
    return replace(cfg, **kw)


SWEEPS_CONFIRM = {
    "cumsum long": [NEW["cumsum long"], R_(NEW["cumsum long"], maxnreg=96), R_(NEW["cumsum long"], maxnreg=80),
                    C(8, 512, 4, S, 8, 32, persist=5), C(8, 512, 4, S, 8, 32, persist=6),
                    R_(NEW["cumsum long"], maxnreg=96, persist=5), C(16, 256, 2, S, 8, 64, persist=5),
                    C(8, 512, 4, S, 8, 64, persist=3)],
    "cumsum bf16 long": [NEW["cumsum bf16 long"], C(16, 1024, 4, S, 8, 32), C(8, 1024, 4, S, 8, 32, persist=5),
                         C(8, 1024, 4, S, 8, 32)],
    "cumsum bf16 short": [OLD["cumsum bf16 short"], C(16, 1024, 4, LB, 1, sub=1), C(8, 1024, 4, LB, 1, sub=1)],
    "linear long": [NEW["linear long"], C(8, 512, 4, S, 8, 32, persist=5), C(8, 512, 4, S, 8, 64, persist=3)],
    "linear bf16 long": [NEW["linear bf16 long"], C(8, 1024, 4, S, 8, 32), C(8, 512, 4, S, 8, 32)],
    "lae long": [NEW["lae long"], C(8, 512, 4, S, 8, 64), C(8, 512, 4, S, 8, 16)],
}
# run 5 (--phase hold): the run-4 defaults against the same kernels with the segment's last tile held in
# registers from the first read (keep), the second read's first tile loaded before the look-back (pre), both
DEF = {"cumsum long": C(16, 512, 4, S, 8, 32, sub=1), "cumsum short": C(16, 512, 4, LB, 1, sub=1),
       "cumsum bf16 long": C(16, 1024, 4, S, 8, 32, sub=1), "cumsum bf16 short": C(16, 1024, 4, LB, 1, sub=1),
       "linear long": C(16, 512, 4, S, 8, 32, sub=1), "linear bf16 long": C(8, 1024, 4, S, 8, 32, sub=1)}
K_, P_, KP = {"keep": True}, {"prefetch": True}, {"keep": True, "prefetch": True}
SWEEPS_HOLD = {
    "cumsum long": [DEF["cumsum long"], R_(DEF["cumsum long"], **P_), R_(DEF["cumsum long"], **K_),
                    R_(DEF["cumsum long"], **KP), C(16, 512, 4, NC, 8, 32),
                    R_(DEF["cumsum long"], seg=64, **KP), R_(DEF["cumsum long"], block_t=8, **KP)],
    "cumsum bf16 long": [DEF["cumsum bf16 long"], R_(DEF["cumsum bf16 long"], **P_),
                         R_(DEF["cumsum bf16 long"], **K_), C(8, 1024, 4, S, 8, 32, sub=1, **KP)],
    "linear long": [DEF["linear long"], R_(DEF["linear long"], **P_), R_(DEF["linear long"], **K_),
                    C(8, 512, 4, S, 8, 32, sub=1, **KP)],
    "cumsum short": [DEF["cumsum short"], C(16, 512, 4, S, 8, 32, sub=1, **KP), C(16, 512, 4, S, 8, 32, sub=1, **K_)],
    "cumsum bf16 short": [DEF["cumsum bf16 short"], C(16, 1024, 4, S, 8, 32, sub=1, **KP)],
    "linear bf16 long": [DEF["linear bf16 long"], R_(DEF["linear bf16 long"], **P_)],
}
HOLD_CHECKS = [C(16, 512, 4, S, 8, 32, **K_), C(16, 512, 4, S, 8, 32, **P_), C(16, 512, 4, S, 8, 32, **KP),
               C(8, 1024, 4, S, 8, 32, **KP), C(16, 512, 4, S, 8, 64, persist=2, **KP)]


def _op_inputs(T, n, dt, g):
    """(name, body, float64 reference, X) for each one-component kind that runs in ``dt`` (not min / prod in
    bf16; not logaddexp under the interpreter, which takes minutes for its reduce over a 16 x 512 tile)."""
    for name, (fn, ref) in OPS.items():
        if (dt == torch.bfloat16 and name in ("min", "prod")) or (B.DRY and name == "logaddexp"):
            continue
        X = torch.randn(T, n, device=B.DEV, generator=g)
        if name == "prod":
            X = 1.0 + 0.01 * X
        yield name, fn, ref, X.to(dt)


def _check_post(label: str, cfg, g) -> None:
    """A post fused after the linear recurrence (``y = c * h``) against the float64 loop."""
    (T, n) = B.size(1000, 300)
    A, X, Cc = (torch.rand(T, n, device=B.DEV, generator=g), torch.randn(T, n, device=B.DEV, generator=g),
                torch.randn(T, n, device=B.DEV, generator=g))
    P = evt.scan(lambda h, a, x, c: a * h + x, A, X, Cc, init=torch.zeros(1, n, device=B.DEV),
                 post=lambda h, a, x, c: c * h, config=cfg)
    H = B.loop_ref(lambda h, a, x, c: a * h + x, torch.zeros(1, n, device=B.DEV), A, X, Cc)
    B.check(f"{label} post y = c * h (linear)", P, Cc.double() * H, 1e-4)


def _check_linear(T: int, n: int, dt, tol: float, g, checks: list):
    """``a * h + x`` from fresh (T, n) inputs of ``dt`` under each (label, config) of ``checks``, over
    poisoned memory, against the float64 loop; returns X for further checks."""
    A = (0.9 + 0.1 * torch.rand(T, n, device=B.DEV, generator=g)).to(dt)
    X = torch.randn(T, n, device=B.DEV, generator=g).to(dt)
    for label, cfg in checks:
        B.poison((T, n), dt)
        B.check(label, evt.scan(B.LIN, A, X, init=X[:1], config=cfg), B.loop_ref(B.LIN, X[:1], A, X), tol)
    return X


def hold_checks():
    """keep / prefetch: every kind, fp32 and bf16, ragged T and lanes, init rows, post, over poisoned memory."""
    B.log("== correctness of segmented keep / prefetch on CUDA ==")
    g = torch.Generator(device=B.DEV).manual_seed(13)
    dev = B.DEV
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        tag_ = "f32" if dt == torch.float32 else "bf16"
        for T, n in ((4099, 8191), (2053, 1000), (37, 3)):
            T, n = B.size(T, n)
            for name, fn, ref, X in _op_inputs(T, n, dt, g):
                for i, cfg in enumerate(HOLD_CHECKS[2:4] if name != "sum" else HOLD_CHECKS):
                    B.poison((T, n), dt)
                    B.check(f"hold {name} {tag_} {T}x{n} {tag(cfg)}", evt.scan(fn, X, config=cfg), ref(X), tol)
            X = _check_linear(T, n, dt, tol, g, [(f"hold linear {tag_} {T}x{n} {tag(cfg)}", cfg)
                                                 for cfg in HOLD_CHECKS])
            init = torch.randn(2, n, device=dev, generator=g).to(dt)
            B.poison((T, n), dt)
            B.check(f"hold k=2 init sum {tag_} {T}x{n}", evt.scan(B.ADD, X, init=init, config=HOLD_CHECKS[2]),
                    torch.cat([init.double(), init[1:].double() + X[2:].double().cumsum(0)]), tol)
    _check_post("hold", HOLD_CHECKS[2], g)


# the candidates checked for correctness first (A: the expected default, B: persistent, C: short tiles)
CHECK_A, CHECK_B, CHECK_C = C(16, 512, 4, S, 8, 32), C(16, 512, 4, S, 8, 64, persist=2), C(8, 512, 4, S, 8, 16)
OPS = {"sum": (B.ADD, lambda X: X.double().cumsum(0)),
       "max": (B.MAX, lambda X: X.double().cummax(0).values),
       "min": (lambda h, x: torch.minimum(h, x), lambda X: X.double().cummin(0).values),
       "prod": (lambda h, x: h * x, lambda X: X.double().cumprod(0)),
       "logaddexp": (B.LAE, lambda X: X.double().logcumsumexp(0))}


def correctness():
    B.log("== correctness of the segmented strategy on CUDA ==")
    g = torch.Generator(device=B.DEV).manual_seed(11)
    dev = B.DEV
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        tag = "f32" if dt == torch.float32 else "bf16"
        for T, n in ((4099, 8191), (2053, 1000), (37, 3), (3, 700)):
            T, n = B.size(T, n)
            for name, fn, ref, X in _op_inputs(T, n, dt, g):
                B.poison((T, n), dt)
                B.check(f"segmented {name} {tag} {T}x{n}", evt.scan(fn, X, config=CHECK_A), ref(X), tol)
            X = _check_linear(T, n, dt, tol, g, [(f"segmented linear {tag} {T}x{n} #{i}", cfg)
                                                 for i, cfg in enumerate((CHECK_A, CHECK_B))])
            for i, cfg in enumerate((CHECK_B, CHECK_C)):
                B.poison((T, n), dt)
                B.check(f"segmented sum {tag} {T}x{n} #{i + 1}", evt.scan(B.ADD, X, config=cfg),
                        X.double().cumsum(0), tol)
    (T, n) = B.size(1000, 300)
    X = torch.randn(T, n, device=dev, generator=g)
    init = torch.randn(2, n, device=dev, generator=g)
    B.check("segmented k=2 init sum", evt.scan(B.ADD, X, init=init, config=CHECK_A),
            torch.cat([init.double(), init[1:].double() + X[2:].double().cumsum(0)]), 1e-4)
    _check_post("segmented", CHECK_A, g)
    Ab = torch.rand(T, 1, device=dev, generator=g)
    B.check("segmented broadcast a (T, 1)", evt.scan(B.LIN, Ab, X, init=X[:1], config=CHECK_A),
            B.loop_ref(B.LIN, X[:1], Ab, X), 1e-4)
    for i, cfg in enumerate((CHECK_A, CHECK_B, CHECK_C)):
        for rep in range(2 if not B.DRY else 1):
            X = torch.randn(*B.size(65536, 1024), device=dev, generator=g)
            B.poison(X.shape, X.dtype)
            B.check(f"segmented cumsum #{i}.{rep} {tuple(X.shape)}", evt.scan(B.ADD, X, config=cfg),
                    X.double().cumsum(0), 1e-4)


def default_checks():
    """The defaults on long ragged scans (T - 1 not a multiple of the segment, lanes not of the tile)."""
    B.log("== correctness of the defaults on long ragged shapes ==")
    g = torch.Generator(device=B.DEV).manual_seed(12)
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        tag_ = "f32" if dt == torch.float32 else "bf16"
        for T, n in ((65539, 1000), (20001, 1537)):
            T, n = B.size(T, n)
            X = torch.randn(T, n, device=B.DEV, generator=g).to(dt)
            for name in ("sum", "max", "logaddexp"):
                fn, ref = OPS[name]
                B.poison((T, n), dt)
                B.check(f"default {name} {tag_} {T}x{n}", evt.scan(fn, X), ref(X), tol)
            A = (0.9 + 0.1 * torch.rand(T, n, device=B.DEV, generator=g)).to(dt)
            B.poison((T, n), dt)
            B.check(f"default linear {tag_} {T}x{n}", evt.scan(B.LIN, A, X, init=X[:1]), B.loop_ref(B.LIN, X[:1], A, X),
                    tol)


def tag(cfg: ScanConfig | None) -> str:
    if cfg is None:
        return "default (heuristic)"
    s = f"{cfg.strategy} {cfg.block_t}x{cfg.block_n} nw{cfg.num_warps} w{cfg.window}"
    if (cfg.strategy or "").startswith(("segmented", "threepass")):
        s += f" seg{cfg.seg}"
    if cfg.l2hint is False:
        s += " nohint"
    if cfg.persist:
        s += f" persist{cfg.persist}"
    if cfg.maxnreg:
        s += f" maxnreg{cfg.maxnreg}"
    if cfg.keep:
        s += " keep"
    if cfg.prefetch:
        s += " pre"
    return s


def launch_phase(cases) -> None:
    """Each case's default: checked against float64 once (poisoned output), then per round the public call with
    plain ``do_bench`` (host work and every launch included) and its CUDA-graph replay (kernels alone)."""
    import statistics
    B.log("== defaults: public call (plain do_bench) vs CUDA graph, three rounds ==")
    rows = B.RESULTS.setdefault("launch", [])
    for name, (fn, shape, dt, fl, ref, tol) in cases.items():
        try:
            out = fn(None)
            B.poison(out.shape, out.dtype)
            B.check(f"launch {name} default", fn(None), ref(), max(tol, 1e-12))
        except Exception as e:  # noqa: BLE001
            B.RESULTS["errors"].append(f"launch {name}: {type(e).__name__}: {str(e)[:300]}")
    for rnd in range(3):
        for name, (fn, shape, dt, fl, _, _) in cases.items():
            try:
                plain, graph = B.bench(lambda: fn(None), graph=False), B.bench(lambda: fn(None), graph=True)
            except Exception as e:  # noqa: BLE001
                B.RESULTS["errors"].append(f"launch {name}: {type(e).__name__}: {str(e)[:300]}")
                continue
            rows.append({"case": name, "round": rnd, "plain_ms": plain, "graph_ms": graph, "floor_ms": fl})
            B.log(f"  {name:18s} plain {plain * 1e3:8.1f} us ({plain / fl:5.2f}x floor)  graph {graph * 1e3:8.1f} us "
                  f"({graph / fl:5.2f}x)")
    B.log("\n== summary (median of rounds) ==")
    for name in cases:
        got = [r for r in rows if r["case"] == name]
        if got:
            p = statistics.median(r["plain_ms"] for r in got)
            g = statistics.median(r["graph_ms"] for r in got)
            B.log(f"{name:18s} plain {p * 1e3:8.1f} us {p / got[0]['floor_ms']:5.2f}x floor | graph {g * 1e3:8.1f} us "
                  f"{g / got[0]['floor_ms']:5.2f}x | floor {got[0]['floor_ms'] * 1e3:.1f} us")
    fails = [c for c in B.RESULTS["correctness"] if not c["ok"]]
    B.log(f"correctness: {len(B.RESULTS['correctness']) - len(fails)}/{len(B.RESULTS['correctness'])} ok"
          + (f"; FAILED {[c['case'] for c in fails]}" if fails else "") + f"; errors {len(B.RESULTS['errors'])}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=240.0, help="seconds after which sweeps stop")
    ap.add_argument("--dry", action="store_true", help="tiny sizes on CPU (Triton interpreter): checks the script")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--phase", choices=["explore", "confirm", "hold", "launch"], default="explore",
                    help="explore: run 3's sweeps; confirm: run 4 (the defaults, register caps, persistent grids); "
                         "launch: no sweeps, the defaults' public call (plain do_bench) against its CUDA-graph "
                         "replay, three rounds (run 7: one launch per scan)")
    ap.add_argument("--plain-s", type=float, default=45.0, help="seconds past the budget for the plain timings")
    ap.add_argument("--sweep-s", type=float, default=None,
                    help="sweep budget counted from the end of the correctness pass (replaces --budget; run 5 lost "
                         "all its sweeps to a 150 s correctness pass under --budget 150)")
    args = ap.parse_args(argv)
    B.TIME_BUDGET_S, B.OUT_DIR = args.budget, args.out
    if args.dry:
        B.DEV, B.DRY = "cpu", True
        os.environ["TRITON_INTERPRET"] = "1"
        plain = evt.scan
        evt.scan = lambda *a, **k: plain(*a, **{"backend": "triton", **k})
    import triton
    R = B.RESULTS
    R["env"] = {"device": torch.cuda.get_device_name() if not B.DRY else "cpu (dry run)", "torch": torch.__version__,
                "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    B.log(json.dumps(R["env"]))

    def dump():
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scan_segmented_bench.json"), "w") as f:
            json.dump(R, f, indent=1, default=str)

    t0 = time.time()
    if not args.skip_correctness:
        try:
            if args.phase == "explore":
                correctness()
            elif args.phase == "hold":
                hold_checks()
            else:
                B.log("== scan_bench's correctness (every mode, the defaults) ==")
                B.correctness(False)
                default_checks()
        except Exception:
            R["errors"].append(traceback.format_exc())
            B.log(traceback.format_exc())
    B.log(f"(correctness took {time.time() - t0:.0f} s)")
    if args.sweep_s is not None:
        B.TIME_BUDGET_S = args.budget = time.time() - B.T_START + args.sweep_s
    dump()
    bws = [B.copy_bandwidth() for _ in range(2)]
    bw = max(bws)
    R["copy_bandwidth_GBps"] = [b / 1e9 for b in bws]
    B.log(f"== copy bandwidth: {', '.join(f'{b / 1e9:.0f}' for b in bws)} GB/s (read + write); floor uses the "
          f"larger ==")
    floor = lambda nbytes: nbytes / bw * 1e3  # noqa: E731  (ms)
    g = torch.Generator(device=B.DEV).manual_seed(2)
    (Tl, nl), (Ts, ns) = B.size(65536, 1024), B.size(4096, 8192)
    XL = torch.randn(Tl, nl, device=B.DEV, generator=g)
    AL = 0.5 + 0.5 * torch.rand(Tl, nl, device=B.DEV, generator=g)
    XS = torch.randn(Ts, ns, device=B.DEV, generator=g)
    AS = 0.5 + 0.5 * torch.rand(Ts, ns, device=B.DEV, generator=g)
    XLb, XSb = XL.bfloat16(), XS.bfloat16()
    cases = {  # name: (fn of config, shape, dtype, floor ms, reference, tol)
        "cumsum long": (lambda c: evt.scan(B.ADD, XL, config=c), (Tl, nl), "f32", floor(8 * XL.numel()),
                        lambda: XL.double().cumsum(0), 1e-4),
        "cumsum short": (lambda c: evt.scan(B.ADD, XS, config=c), (Ts, ns), "f32", floor(8 * XS.numel()),
                         lambda: XS.double().cumsum(0), 1e-4),
        "linear long": (lambda c: evt.scan(B.LIN, AL, XL, init=XL[:1], config=c), (Tl, nl), "f32",
                        floor(12 * XL.numel()), lambda: B.loop_ref(B.LIN, XL[:1], AL, XL), 1e-4),
        "linear short": (lambda c: evt.scan(B.LIN, AS, XS, init=XS[:1], config=c), (Ts, ns), "f32",
                         floor(12 * XS.numel()), lambda: B.loop_ref(B.LIN, XS[:1], AS, XS), 1e-4),
        "cumsum bf16 long": (lambda c: evt.scan(B.ADD, XLb, config=c), (Tl, nl), "bf16", floor(4 * XL.numel()),
                             lambda: XLb.double().cumsum(0), 2e-2),
        "cumsum bf16 short": (lambda c: evt.scan(B.ADD, XSb, config=c), (Ts, ns), "bf16", floor(4 * XS.numel()),
                              lambda: XSb.double().cumsum(0), 2e-2),
        "lae long": (lambda c: evt.scan(B.LAE, XL, config=c), (Tl, nl), "f32", floor(8 * XL.numel()),
                     lambda: XL.double().logcumsumexp(0), 1e-4),
    }
    if args.phase in ("confirm", "hold"):
        ALb = AL.bfloat16()
        cases["linear bf16 long"] = (lambda c: evt.scan(B.LIN, ALb, XLb, init=XLb[:1], config=c), (Tl, nl), "bf16",
                                     floor(6 * XL.numel()), lambda: B.loop_ref(B.LIN, XLb[:1], ALb, XLb), 2e-2)
    if args.phase == "launch":
        cases["max long"] = (lambda c: evt.scan(lambda p, x: torch.maximum(p, x), XL, config=c), (Tl, nl), "f32",
                             floor(8 * XL.numel()), lambda: XL.cummax(0).values.double(), 0.0)
        launch_phase(cases)
        dump()
        return
    best = R.setdefault("best", {})
    B.log("== sweeps (CUDA graph, median; each config checked against float64 first) ==")
    sweeps = {"explore": SWEEPS, "confirm": SWEEPS_CONFIRM, "hold": SWEEPS_HOLD}[args.phase]
    for name, cfgs in sweeps.items():
        if B.DRY and name == "lae long":
            continue
        fn, shape, dt, fl, ref, tol = cases[name]
        cache = {}

        def get_ref():
            if "r" not in cache:
                cache["r"] = ref()
            return cache["r"]
        try:
            res = B.sweep(name, fn, shape, dt, fl, cfgs, get_ref, tol, reps=2 if name == "cumsum long" else 1,
                          rep_ms=100)
            best[name] = {"ms": res[0], "x_floor": res[0] / fl, "config": res[1], "floor_ms": fl}
        except Exception:
            R["errors"].append(traceback.format_exc())
            B.log(traceback.format_exc())
        cache.clear()
        dump()
    B.log("== old default vs best of each sweep, plain do_bench (median, L2 flushed), two rounds ==")
    plains = R.setdefault("plain", [])
    names = list(best) if args.phase == "explore" else list(cases)
    if args.phase == "hold":  # the run-4 defaults against each sweep's best, the long fp32 cumsum first
        names = [n for n in SWEEPS_HOLD if n in best]
    for rnd in range(2 if args.phase == "explore" else 3):
        for name in names:
            b = best.get(name, {"config": None})
            if time.time() - B.T_START > args.budget + args.plain_s:
                continue
            fn, shape, dt, fl, _, _ = cases[name]
            runs = [("old", OLD[name])] if args.phase != "hold" else [("default", None)]
            if args.phase == "confirm":
                runs.append(("default", None))
            if b["config"] is not None:
                runs.append(("best", b["config"]))
            for label, cfg in runs:
                try:
                    ms = B.bench(lambda: fn(cfg), graph=False)
                except Exception as e:
                    R["errors"].append(f"plain {name} {cfg}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                plains.append({"case": name, "which": label, "config": tag(cfg), "ms": ms, "x_floor": ms / fl,
                               "round": rnd})
                B.log(f"  {name:18s} {label:7s} {tag(cfg):52s} {ms * 1e3:8.1f} us  {ms / fl:5.2f}x floor")
    dump()
    B.log("\n== summary ==")
    fails = [c for c in R["correctness"] if not c["ok"] and "nocarry" not in c["case"]]
    n_ok = sum(1 for c in R["correctness"] if "nocarry" not in c["case"])
    B.log(f"correctness (controls excluded): {n_ok - len(fails)}/{n_ok} ok"
          + (f"; FAILED: {[c['case'] for c in fails]}" if fails else ""))
    B.log(f"copy bandwidth {R['copy_bandwidth_GBps']} GB/s")
    for r in R["timings"]:
        B.log(f"{r['case']:18s} {r['dtype']:4s} {r['variant'][6:]:60s} {r['ms'] * 1e3:8.1f} us {r['x_floor']:5.2f}x")
    import statistics
    for name in dict.fromkeys(p["case"] for p in R.get("plain", [])):
        if name not in cases:
            continue
        for label in ("old", "default", "best"):
            ms = [p["ms"] for p in R["plain"] if p["case"] == name and p["which"] == label]
            if ms:
                cfgs = {p["config"] for p in R["plain"] if p["case"] == name and p["which"] == label}
                B.log(f"plain {name:18s} {label:7s} median of {len(ms)}: {statistics.median(ms) * 1e3:8.1f} us "
                      f"{statistics.median(ms) / cases[name][3]:5.2f}x floor  {', '.join(cfgs)}")
    for k, v in best.items():
        B.log(f"best {k}: {v['ms'] * 1e3:.1f} us = {v['x_floor']:.2f}x floor ({v['floor_ms'] * 1e3:.1f} us) "
              f"{tag(v['config']) if v['config'] else None}")
    B.log(f"errors: {len(R['errors'])}; total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
