"""Where torch.compile's max-autotune spends a bench row's compile (issue 4; docs/benchmarks-log.md, "Next steps
as they stood on 2026-11-27", item 0).

At 8192 x 4096 x 1024 the bench's three pointwise rows take 39-66 s each to compile, the same graphs 5-18 s at
8192 x 8192 x 4096; the bench's fit in one device call hangs on those seconds. This compiles one workload as the
bench does (``torch.compile(mode="max-autotune-no-cudagraphs")``, the bench's ``INDUCTOR_SETTINGS``, a fresh
Inductor cache) under cProfile and writes the functions with the most cumulative time, so the phase that costs the
seconds (GEMM template autotuning, epilogue-fusion benchmarking, coordinate-descent tuning) is named by
measurement. Triton compiles run in Inductor's worker processes, so they show up as the main thread's waits.

    PYTHONUNBUFFERED=1 python -m benchmarks.compile_profile --out $OUT [--workload lincomb_relu] [--shape 8192x4096x1024]
        [--before compile:8192x8192x4096,evt:8192x4096x1024] [--no-profile]

``--before`` runs steps in the same process first, as the bench does (its small-shape compiles come after the large
shape's and after evtorch's first calls), to find why a compile takes longer inside the bench than alone.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


INDUCTOR_FRAMES = ("(select_algorithm|autotun|benchmark|coordinate_descent|scheduler|codecache|async_compile|"
                   "triton_heuristics|compile_fx|graph.py|wrapper|kernel/)")


def _compile(torch, fn, name: str, A, B, inputs: dict):
    """``fn(A @ B)`` through torch.compile as the bench compiles it (``run.compile_baseline``: a fresh code object
    per call, so Dynamo compiles it anew); the compiled function and the first call's seconds."""
    from benchmarks.run import compile_baseline

    compiled = compile_baseline(fn, name, "max-autotune-no-cudagraphs")
    t = time.perf_counter()
    compiled(A, B, **inputs)
    if A.is_cuda:
        torch.cuda.synchronize()
    return compiled, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or "compile_profile_out")
    ap.add_argument("--workload", default="lincomb_relu")
    ap.add_argument("--shape", default="8192x4096x1024")
    ap.add_argument("--before", default="", help="comma-separated steps run first in the same process, as the "
                    "bench runs them: compile:MxNxK[:workload] (a torch.compile first call), evt:MxNxK[:workload] "
                    "(evtorch's first call, tuning included)")
    ap.add_argument("--no-profile", action="store_true", help="time the compile without cProfile's overhead")
    ap.add_argument("--gc", choices=("none", "freeze"), default="none",
                    help="freeze: gc.collect() and gc.freeze() before the profiled compile (the objects the steps "
                         "before left are then never traversed again by the collector)")
    ap.add_argument("--reset", action="store_true", help="torch._dynamo.reset() after the steps of --before")
    ap.add_argument("--pool", choices=("as-is", "shutdown", "ready"), default="as-is",
                    help="Inductor's compile-worker pool before the profiled compile: shut down "
                         "(shutdown_compile_workers), or woken up and waited for (wakeup, wait_pool_ready)")
    ap.add_argument("--top", type=int, default=60)
    args = ap.parse_args(argv)
    # fresh caches (Inductor's and Triton's), as on a freshly started machine, unless the caller sets them
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_profile_"))
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton_profile_"))
    import torch

    import evtorch as evt
    from benchmarks.run import INDUCTOR_SETTINGS
    from benchmarks.workloads import WORKLOADS
    from evtorch.examples import operands

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    for key, value in INDUCTOR_SETTINGS.items():
        setattr(torch._inductor.config, key, value)

    def problem(shape: str, workload: str):
        M, N, K = (int(d) for d in shape.split("x"))
        torch.manual_seed(0)
        A, B = operands(M, N, K, dev, dtype)
        return A, B, WORKLOADS[workload].make_inputs(M, N, dev, A.dtype)

    log = []
    steps = [step for step in args.before.split(",") if step]
    for step in steps:
        kind, shape, *rest = step.split(":")
        workload = rest[0] if rest else args.workload
        A, B, inputs = problem(shape, workload)
        t = time.perf_counter()
        if kind == "compile":
            _compile(torch, WORKLOADS[workload].fn, workload, A, B, inputs)
        elif kind == "evt":
            evt.gemm(A, B, WORKLOADS[workload].fn, **inputs)
            torch.cuda.synchronize() if dev == "cuda" else None
        else:
            raise SystemExit(f"--before: step kind must be compile or evt, got {kind!r} in {step!r}")
        log.append(f"before: {step} {time.perf_counter() - t:.1f} s")
        print(log[-1], flush=True)
        del A, B, inputs
    A, B, inputs = problem(args.shape, args.workload)
    if args.reset:
        torch._dynamo.reset()
        log.append("torch._dynamo.reset() before the compile")
    if args.pool != "as-is":
        import torch._inductor.async_compile as ac

        t = time.perf_counter()
        if args.pool == "shutdown":
            ac.shutdown_compile_workers()
        else:  # ready: the sidecar's workers started and answering before the compile
            ac.AsyncCompile.wakeup()
            ac.AsyncCompile.wait_pool_ready()
        log.append(f"compile-worker pool {args.pool}: {time.perf_counter() - t:.1f} s")
    if args.gc == "freeze":
        gc.collect()
        gc.freeze()
    gc_s, gc_runs, started = [0.0], [0], [0.0]

    def gc_clock(phase, info):  # the collector's own time during the compile
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - started[0]
            gc_runs[0] += info["generation"] == 2

    log.append(f"live objects tracked by gc: {len(gc.get_objects())}, frozen: {gc.get_freeze_count()}")
    gc.callbacks.append(gc_clock)
    prof = None if args.no_profile else cProfile.Profile()
    if prof is not None:
        prof.enable()
    _, seconds = _compile(torch, WORKLOADS[args.workload].fn, args.workload, A, B, inputs)
    gc.callbacks.remove(gc_clock)
    gc.unfreeze()
    log.append(f"garbage collection during the compile: {gc_s[0]:.1f} s ({gc_runs[0]} full collections)")
    text = io.StringIO()
    if prof is not None:
        prof.disable()
        stats = pstats.Stats(prof, stream=text)
        # Inductor's own phases (the frames above them are Dynamo's wrappers, the same for every graph)
        stats.sort_stats("cumulative").print_stats(INDUCTOR_FRAMES, args.top)
        stats.sort_stats("tottime").print_stats(args.top // 2)
    head = "".join(line + "\n" for line in log) + \
        f"{args.workload} {args.shape} on {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}: " \
        f"first call (compile) {seconds:.1f} s{'' if prof else ' (no profiler)'}\n"
    tag = f"{args.workload}_{args.shape}" + (f"_after_{len(steps)}" if steps else "") + ("" if prof else "_np") + \
        ("_gcfreeze" if args.gc == "freeze" else "") + \
        ("_reset" if args.reset else "") + ("" if args.pool == "as-is" else f"_pool{args.pool}")
    (out / f"compile_profile_{tag}.txt").write_text(head + text.getvalue())
    print(head, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
