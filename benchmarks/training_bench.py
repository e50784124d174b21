"""Training benchmark (issue 6): forward + backward of fused GEMM epilogues vs eager PyTorch and torch.compile.

    python benchmarks/training_bench.py --quick --out DIR      # one device call, ~3-5 minutes on an H100/H200
    python benchmarks/training_bench.py --dry-run              # CPU: Triton interpreter, tiny sizes

Workloads (bf16 inputs, fp32 accumulation; leaves: x/A, weight/B and every float input):

- ``bias_gelu``: the MLP up-projection ``gelu_tanh(x @ W.T + b)``; evtorch: ``evt.linear(x, W, gelu_tanh, b)``;
  backward with a random output gradient;
- ``bce_loss``: ``((C - 1) * z + log(clamp(sigmoid(z), 1e-3, 0.999))).sum()`` with ``z = A @ B + b[:, None]``, a
  scalar loss; evtorch: ``evt.gemm(A, B, bce_loss, C=C, b=b)``;
- ``mlp`` / ``mlp_relu``: a transformer MLP block, up-projection with bias + tanh-GELU (ReLU) then down-projection
  with bias, (M, N, K) = (tokens, hidden, model width); evtorch: two ``evt.linear`` calls, whose backward hands the
  hidden activation's gradient to the up-projection (cross-layer fusion, ``integration.deferred``), fused or not
  as it decides; ``evt_fuse`` / ``evt_nofuse`` force it with ``EVTORCH_FUSE_BACKWARD=always`` / ``never``.

Contenders per (workload, shape): ``eager`` (the function on ``A @ B``), ``compile`` (torch.compile of it,
``--compile-mode``), ``evt`` (policy "save": the forward keeps the accumulator when the backward needs it),
``evt_recompute`` (policy "recompute": the backward recomputes A @ B), ``evt_compiled`` (torch.compile(fullgraph=True)
of the evtorch call: the operator must not break the graph) and, on a GPU, ``compile_cg`` / ``evt_compiled_cg``
(with ``--cuda-graphs``: the same two compiled with ``mode="reduce-overhead"``, CUDA graphs, so a step costs its
device time and not the host time around it, which evtorch's public step spends more of than eager's). Reported: forward ms, forward+backward ms
(``triton.testing.do_bench`` medians, L2 flushed), peak extra memory of one step, and ratios to eager/compile.

Before timing, a correctness section (GPU): gradients of every leaf against torch autograd of the eager function
in fp32 (TF32 off) and bf16 (against the fp32 reference of the same rounded inputs), for both policies, batched
and ragged shapes, plus torch.compile fullgraph (default and ``mode="reduce-overhead"``, CUDA graphs) and
``torch.library.opcheck``. Writes ``training_bench.json`` under ``--out`` and prints a compact table last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script or as benchmarks.<name>
from benchmarks.harness import Harness, kernel_times  # noqa: E402

T0 = time.time()
SHAPES = [(8192, 4096, 1024), (8192, 8192, 4096)]       # (M, N, K), the speed issue's shapes
QUICK_SHAPES = [(8192, 4096, 1024)]
WORKLOADS = ("bias_gelu", "bce_loss", "mlp", "mlp_relu")
DRY_SHAPES = [(48, 40, 32)]


# ------------------------------------------------------------------------------------------------ workloads
def gelu_tanh(y):
    import torch.nn.functional as F
    return F.gelu(y, approximate="tanh")


def bce_loss(acc, C, b):
    import torch
    z = acc + b[:, None]
    return ((C - 1) * z + torch.log(torch.clamp(torch.sigmoid(z), 1e-3, 0.999))).sum()


def make_workload(name, M, N, K, device, dtype, policy="save", batch=None):
    """(evt fn, eager fn, leaves, grad_outputs) for one workload; every fn maps leaves -> output tensor."""
    import torch
    import torch.nn.functional as F

    import evtorch as evt
    g = torch.Generator(device="cpu").manual_seed(hash((name, M, N, K)) % 2**31)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype).requires_grad_()
    lead = (batch,) if batch else ()
    if name == "bias_gelu":
        x, W, b = rnd(*lead, M, K, scale=K ** -0.25), rnd(N, K, scale=K ** -0.25), rnd(N, scale=0.1)

        def evt_fn(x, W, b):
            return evt.linear(x, W, gelu_tanh, b, policy=policy)

        def eager_fn(x, W, b):
            return F.gelu(F.linear(x, W, b), approximate="tanh")
        gy = torch.randn(*lead, M, N, generator=g).to(device=device, dtype=dtype)
        return evt_fn, eager_fn, [x, W, b], gy
    if name == "bce_loss":
        A, B = rnd(*lead, M, K, scale=K ** -0.25), rnd(K, N, scale=K ** -0.25)
        C = (torch.rand(*lead, M, N, generator=g) > 0.5).to(device=device, dtype=dtype)
        b = rnd(*lead, M, scale=0.1)
        if batch:  # per-batch row bias (L, M) broadcast as (L, M, 1)
            def epi(acc, C, b):
                z = acc + b[..., None]
                return ((C - 1) * z + torch.log(torch.clamp(torch.sigmoid(z), 1e-3, 0.999))).sum()
        else:
            epi = bce_loss

        def evt_fn(A, B, b):
            return evt.gemm(A, B, epi, C=C, b=b) if policy == "save" else \
                evt.integration.fused_gemm(A, B, epi, policy=policy, C=C, b=b)

        def eager_fn(A, B, b):
            return epi(A @ B, C=C, b=b)
        return evt_fn, eager_fn, [A, B, b], None
    if name in ("mlp", "mlp_relu"):  # M tokens, N hidden, K model width
        act = gelu_tanh if name == "mlp" else torch.relu
        x, W1, b1 = rnd(*lead, M, K, scale=K ** -0.25), rnd(N, K, scale=K ** -0.25), rnd(N, scale=0.1)
        W2, b2 = rnd(K, N, scale=N ** -0.5), rnd(K, scale=0.1)

        def evt_fn(x, W1, b1, W2, b2):
            return evt.linear(evt.linear(x, W1, act, b1, policy=policy), W2, None, b2, policy=policy)

        def eager_fn(x, W1, b1, W2, b2):
            return F.linear(act(F.linear(x, W1, b1)), W2, b2)
        gy = torch.randn(*lead, M, K, generator=g).to(device=device, dtype=dtype)
        return evt_fn, eager_fn, [x, W1, b1, W2, b2], gy
    raise ValueError(name)


FUSION = {"evt_fuse": "always", "evt_nofuse": "never"}  # contender -> EVTORCH_FUSE_BACKWARD


class fusion:
    """EVTORCH_FUSE_BACKWARD=``how`` inside (the knob is read per backward)."""

    def __init__(self, how: str):
        self.how = how

    def __enter__(self):
        self.old = os.environ.get("EVTORCH_FUSE_BACKWARD")
        os.environ["EVTORCH_FUSE_BACKWARD"] = self.how

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("EVTORCH_FUSE_BACKWARD", None)
        else:
            os.environ["EVTORCH_FUSE_BACKWARD"] = self.old
        return False


# ------------------------------------------------------------------------------------------------ helpers
class Run(Harness):
    def __init__(self, args):
        import torch
        super().__init__(args, "training_bench", {"env": {}, "checks": [], "rows": [], "errors": []},
                         cuda=torch.cuda.is_available() and not args.dry_run, warmup_ms=args.warmup_ms,
                         rep_ms=args.rep_ms, t0=T0, cpu_reps=2)
        self.device = "cuda" if self.cuda else "cpu"

    def peak_mb(self, fn) -> float | None:
        """Peak memory allocated during one call, above what was allocated before it (MiB)."""
        if not self.cuda:
            return None
        torch = self.torch
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


def rel_err(got, ref) -> float:
    if got is None or ref is None:
        return float("nan") if (got is None) != (ref is None) else 0.0
    ref = ref.detach().float()
    return float((got.detach().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def grads_of(fn, leaves, gy):
    import torch
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, gy, allow_unused=True)


# ------------------------------------------------------------------------------------------------ correctness
def check(r: Run, label, fn_pair, tol):
    """Outputs and gradients of evt vs the eager function in fp32 on the same inputs."""
    evt_fn, eager_fn, leaves, gy = fn_pair
    torch = r.torch
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    out, grads = grads_of(evt_fn, leaves, gy)
    ref, ref_grads = grads_of(eager_fn, ref_leaves, None if gy is None else gy.float())
    errs = {"out": rel_err(out, ref)}
    errs.update({f"d{i}": rel_err(g, rg) for i, (g, rg) in enumerate(zip(grads, ref_grads))})
    # torch itself in the same dtype bounds what is reachable: ReLU's mask flips near 0 in bf16 put several
    # percent into summed gradients for torch as for evtorch; a value may be 3x torch's error, or ``tol``
    if leaves[0].dtype != torch.float32:
        t_out, t_grads = grads_of(eager_fn, leaves, gy)
        base = {"out": rel_err(t_out, ref)}
        base.update({f"d{i}": rel_err(g, rg) for i, (g, rg) in enumerate(zip(t_grads, ref_grads))})
    else:
        base = {k: 0.0 for k in errs}
    ok = all(e <= max(tol, 3 * base[k]) for k, e in errs.items())
    worst = max(errs.values())
    r.results["checks"].append({"check": label, "ok": ok, "worst_rel_err": worst, "errors": errs, "tol": tol,
                                "torch_same_dtype": base})
    r.log(f"  {'ok ' if ok else 'BAD'} {label:<52} worst rel err {worst:.2e} (tol {tol:.0e}; torch in this "
          f"dtype {max(base.values()):.1e})")
    del torch
    return ok


def correctness(r: Run):
    torch = r.torch
    r.log("== correctness: gradients vs torch autograd of the eager function ==")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    shapes = [(256, 192, 128), (300, 200, 136)] if r.cuda else [(20, 24, 16)]
    for name in r.args.workloads.split(","):
        for (M, N, K) in shapes:
            for dtype, tol in ((torch.float32, 2e-4), (torch.bfloat16, 3e-2)):
                for policy in ("save", "recompute"):
                    label = f"{name} {M}x{N}x{K} {str(dtype)[6:]} {policy}"
                    try:
                        check(r, label, make_workload(name, M, N, K, r.device, dtype, policy), tol)
                    except Exception as exc:  # noqa: BLE001
                        record_error(r, label, exc)
        label = f"{name} batched(3) 128x96x64 fp32"
        try:
            check(r, label, make_workload(name, 128, 96, 64, r.device, torch.float32, batch=3), 2e-4)
        except Exception as exc:  # noqa: BLE001
            record_error(r, label, exc)
    for how in ("always", "never"):
        label = f"mlp, EVTORCH_FUSE_BACKWARD={how}: the backward hand-off is {'fused' if how == 'always' else 'computed'}"
        try:
            from evtorch.integration import deferred
            before = dict(deferred.STATS)
            for dtype, tol in ((torch.float32, 2e-4), (torch.bfloat16, 3e-2)):
                with fusion(how):
                    check(r, f"mlp 256x192x128 {str(dtype)[6:]} fusion {how}",
                          make_workload("mlp", 256, 192, 128, r.device, dtype), tol)
            got = {k: deferred.STATS[k] - before[k] for k in before}
            ok = got == ({"fused": 2, "materialized": 0} if how == "always" else {"fused": 0, "materialized": 0})
            r.results["checks"].append({"check": label, "ok": ok, "stats": got})
            r.log(f"  {'ok ' if ok else 'BAD'} {label}: {got}")
        except Exception as exc:  # noqa: BLE001
            record_error(r, label, exc)
    # torch.compile: fullgraph (no graph breaks) and CUDA graphs
    modes = [("default", None)] + ([("reduce-overhead", "reduce-overhead")] if r.cuda else [])
    for mode_name, mode in modes:
        label = f"compile fullgraph mode={mode_name} bias_gelu bf16"
        try:
            torch._dynamo.reset()
            evt_fn, eager_fn, leaves, gy = make_workload("bias_gelu", 256, 192, 128, r.device, torch.bfloat16)
            compiled = torch.compile(evt_fn, fullgraph=True, mode=mode)
            ok = True
            for _ in range(3):  # reduce-overhead records the graph on a later call: check every one
                ok = check(r, f"{label} (call {_ + 1})", (compiled, eager_fn, leaves, gy), 3e-2) and ok
        except Exception as exc:  # noqa: BLE001
            record_error(r, label, exc)
    label = "opcheck evtorch::gemm (bias_gelu, bf16)"
    try:
        from evtorch.integration import op_arguments
        _, _, leaves, _ = make_workload("bias_gelu", 128, 96, 64, r.device, torch.bfloat16)
        x, W, b = leaves
        args = op_arguments(x, W.t(), ("linear", gelu_tanh, True), linear_bias=b)
        torch.library.opcheck(torch.ops.evtorch.gemm.default, args)
        r.results["checks"].append({"check": label, "ok": True})
        r.log(f"  ok  {label}")
    except Exception as exc:  # noqa: BLE001
        record_error(r, label, exc)
    r.save()


def record_error(r: Run, label, exc):
    text = f"{type(exc).__name__}: {str(exc)[:300]}"
    r.results["errors"].append({"where": label, "error": text, "traceback": traceback.format_exc()[-3000:]})
    r.results["checks"].append({"check": label, "ok": False, "error": text})
    r.log(f"  ERR {label}: {text}")


# ------------------------------------------------------------------------------------------------ timing
def tuning_records() -> dict:
    """Path -> record of every tuning result the autotuner has stored (``autotune.stored_records``)."""
    from evtorch.runtime.autotune import stored_records
    return {str(rec["path"]): rec for rec in stored_records()}


def tuned_since(before: dict) -> list[dict]:
    """What a first call tuned: per GEMM signature whose record is new since ``before`` (``tuning_records``), its
    label, candidate count and the tuning's phases in seconds (compile, first pass, final, ...)."""
    return [{"label": rec["label"], "candidates": len(rec["timings_ms"]), "phases_s": rec["phases_s"]}
            for path, rec in tuning_records().items() if path not in before]


def timing(r: Run, shapes):
    torch = r.torch
    r.log("== timing: forward and forward+backward (ms) ==")
    dtype = torch.bfloat16 if r.cuda else torch.float32
    for name in r.args.workloads.split(","):
        for (M, N, K) in shapes:
            if r.time_left() < 30:
                r.log(f"  deadline: skipping {name} {M}x{N}x{K}")
                continue
            row = {"workload": name, "M": M, "N": N, "K": K, "dtype": str(dtype), "ms": {}, "fwd_ms": {},
                   "graph_ms": {}, "peak_mb": {}, "first_call_s": {}, "first_call_tuning": {}}
            contenders = [("eager", "save", None), ("evt", "save", None), ("evt_recompute", "recompute", None),
                          ("evt_compiled", "save", "evt")]
            if name.startswith("mlp"):
                contenders[2:2] = [("evt_fuse", "save", None), ("evt_nofuse", "save", None)]
            if not r.args.no_compile:
                contenders.insert(1, ("compile", "save", "eager"))
            if r.cuda and r.args.cuda_graphs:  # CUDA graphs through torch.compile: the steps without host time
                contenders += ([] if r.args.no_compile else [("compile_cg", "save", "eager_cg")]) + \
                    [("evt_compiled_cg", "save", "evt_cg")]
            for label, policy, compiled in contenders:
                if compiled and r.time_left() < 60:
                    r.log(f"  deadline: skipping {label}")
                    continue
                try:
                    evt_fn, eager_fn, leaves, gy = make_workload(name, M, N, K, r.device, dtype, policy)
                    fn = eager_fn if label in ("eager", "compile") else evt_fn
                    if compiled:
                        torch._dynamo.reset()
                        kw = {"evt": {"fullgraph": True}, "eager": {"mode": r.args.compile_mode},
                              "evt_cg": {"fullgraph": True, "mode": "reduce-overhead"},
                              "eager_cg": {"mode": "reduce-overhead"}}[compiled]
                        fn = torch.compile(fn, **kw)

                    def fwd():
                        with torch.no_grad():
                            fn(*leaves)

                    def step(fn=fn):
                        out = fn(*leaves)
                        torch.autograd.grad(out, leaves, gy)
                    if label in FUSION:
                        def step(fn=fn, how=FUSION[label]):
                            with fusion(how):
                                out = fn(*leaves)
                                torch.autograd.grad(out, leaves, gy)
                    before = tuning_records()
                    t = time.time()
                    step()
                    if r.cuda:
                        torch.cuda.synchronize()
                    row["first_call_s"][label] = round(time.time() - t, 2)
                    row["first_call_tuning"][label] = tuned = tuned_since(before)
                    row["peak_mb"][label] = r.peak_mb(step)
                    row["ms"][label] = r.timer(step)
                    row["fwd_ms"][label] = r.timer(fwd) if not compiled else None
                    row["graph_ms"][label] = r.graph_timer(step) if label in ("eager", "evt", *FUSION) else None
                    if r.args.profile and r.cuda:
                        row.setdefault("kernels_us", {})[label] = kernel_times(step, calls=5)
                    r.log(f"  {name:<10} {M}x{N}x{K} {label:<14} fwd {fmt(row['fwd_ms'][label])} ms  fwd+bwd "
                          f"{row['ms'][label]:.3f} ms  (CUDA graph {fmt(row['graph_ms'][label])} ms)  peak "
                          f"{fmt(row['peak_mb'][label], '{:.0f}')} MiB  (first call {row['first_call_s'][label]} s)")
                    for kname, us in sorted(row.get("kernels_us", {}).get(label, {}).items(), key=lambda kv: -kv[1]):
                        r.log(f"      {us:9.1f} us  {kname}")
                    for rec in tuned:  # where the first call's time went: one line per GEMM signature it tuned
                        phases = ", ".join(f"{k} {v:.1f}" for k, v in rec["phases_s"].items())
                        r.log(f"      tuned {rec['label']}: {rec['candidates']} candidates; {phases} s")
                except Exception as exc:  # noqa: BLE001
                    record_error(r, f"timing {name} {M}x{N}x{K} {label}", exc)
                finally:
                    if r.cuda:
                        torch.cuda.empty_cache()
            ms = row["ms"]
            if "evt" in ms:
                row["evt_over_eager"] = ms["evt"] / ms["eager"] if "eager" in ms else None
                row["evt_over_compile"] = ms["evt"] / ms["compile"] if "compile" in ms else None
            r.results["rows"].append(row)
            r.save()


def fmt(x, f="{:.3f}"):
    return "-" if x is None else f.format(x)


def table(r: Run):
    lines = ["", "== training_bench summary ==", f"device: {r.results['env'].get('device')}"]
    checks = r.results["checks"]
    bad = [c["check"] for c in checks if not c.get("ok")]
    lines.append(f"correctness: {len(checks) - len(bad)}/{len(checks)} ok" + (f"; FAILED: {bad}" if bad else ""))
    cols = ["eager", "compile", "evt", "evt_fuse", "evt_nofuse", "evt_recompute", "evt_compiled", "compile_cg",
            "evt_compiled_cg"]
    lines.append(f"{'workload':<10} {'M x N x K':<16} " + " ".join(f"{c:>13}" for c in cols) +
                 f" {'evt/eager':>9} {'evt/comp':>8}   fwd+bwd ms (peak MiB)")
    for row in r.results["rows"]:
        cells = []
        for c in cols:
            ms, mb = row["ms"].get(c), row["peak_mb"].get(c)
            cells.append(f"{fmt(ms):>7}({fmt(mb, '{:.0f}'):>4})" if ms is not None else f"{'-':>13}")
        lines.append(f"{row['workload']:<10} {row['M']}x{row['N']}x{row['K']:<6} " + " ".join(f"{c:>13}" for c in cells)
                     + f" {fmt(row.get('evt_over_eager'), '{:.2f}'):>9} {fmt(row.get('evt_over_compile'), '{:.2f}'):>8}")
    lines.append("fwd+bwd captured in one CUDA graph (device time, ms): " + "; ".join(
        f"{row['workload']} {row['M']}x{row['N']}x{row['K']}: " + ", ".join(
            f"{c} {fmt(row['graph_ms'].get(c))}" for c in ("eager", "evt", *FUSION) if c in row["ms"])
        for row in r.results["rows"]))
    lines.append("forward only (ms): " + "; ".join(
        f"{row['workload']} {row['M']}x{row['N']}x{row['K']}: " + ", ".join(
            f"{c} {fmt(row['fwd_ms'].get(c))}" for c in cols if row["fwd_ms"].get(c) is not None)
        for row in r.results["rows"]))
    if r.results["errors"]:
        lines.append(f"errors: {len(r.results['errors'])} (see training_bench.json)")
    lines.append(f"total {time.time() - T0:.0f} s")
    r.log("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "training_bench_out")
    ap.add_argument("--quick", action="store_true", help="one shape, short timing, heuristic GEMM configs")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny sizes")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default 8192x4096x1024,8192x8192x4096)")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode of the eager baseline "
                    "(default: max-autotune-no-cudagraphs, or the default mode with --quick)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="also time compile_cg / evt_compiled_cg: the eager and evtorch steps under "
                    "torch.compile(mode='reduce-overhead'), CUDA graphs, so without host time")
    ap.add_argument("--autotune", action="store_true", help="autotune evtorch GEMMs (default off with --quick)")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--warmup-ms", type=float, default=None)
    ap.add_argument("--rep-ms", type=float, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="also record each contender's CUDA kernels per step (torch.profiler, us) in the JSON: "
                         "which kernel a slow step spends its time in")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        ap.error(f"--workloads: unknown {', '.join(unknown)}; expected some of {', '.join(WORKLOADS)}")
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (nothing imported it yet)
    args.warmup_ms = args.warmup_ms or (10.0 if args.quick else 25.0)
    args.rep_ms = args.rep_ms or (40.0 if args.quick else 100.0)
    if args.compile_mode is None and not args.quick:
        args.compile_mode = "max-autotune-no-cudagraphs"
    os.environ["EVTORCH_AUTOTUNE"] = "1" if (args.autotune or not args.quick) else "0"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    import evtorch  # noqa: F401
    r = Run(args)
    r.results["env"] = {"device": torch.cuda.get_device_name() if r.cuda else "cpu (Triton interpreter)"
                        if args.dry_run else "cpu", "torch": torch.__version__,
                        "triton": __import__("triton").__version__, "argv": sys.argv,
                        "autotune": os.environ["EVTORCH_AUTOTUNE"], "compile_mode": args.compile_mode}
    if args.dry_run:
        _use_triton_backend_on_cpu()
    r.log(f"training_bench on {r.results['env']['device']}")
    if args.shapes:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    else:
        shapes = DRY_SHAPES if (args.dry_run or not r.cuda) else (QUICK_SHAPES if args.quick else SHAPES)
    if not args.skip_checks:
        tune, os.environ["EVTORCH_AUTOTUNE"] = os.environ["EVTORCH_AUTOTUNE"], "0"  # checks: no tuning needed
        try:
            correctness(r)
        finally:
            os.environ["EVTORCH_AUTOTUNE"] = tune
    timing(r, shapes)
    r.save()
    table(r)
    return 0 if all(c.get("ok") for c in r.results["checks"]) and not r.results["errors"] else 1


def _use_triton_backend_on_cpu():
    """In a dry run the evtorch contenders run the generated kernels (interpreter) rather than the reference."""
    import evtorch.api as api
    import evtorch.integration.function as function

    def triton_by_default(real):
        def call(A, B, epilogue=None, **kw):
            if kw.get("backend") is None:
                kw["backend"] = "triton"
            return real(A, B, epilogue, **kw)
        return call
    api.gemm = triton_by_default(api.gemm)
    function.prepare = triton_by_default(function.prepare)


if __name__ == "__main__":
    sys.exit(main())
