"""A/B of the launch's epilogue specialisations on the configs a bench run picked, in one process and one device call:

    PYTHONUNBUFFERED=1 python -m benchmarks.launch_flags_ab --from-bench benchmarks/results/bench_h200.json --out $OUT \
        [--variant even|index|both] [--shapes 8192x4096x1024] [--workloads a,b] [--rounds 4]

Variant A launches as ``evt.gemm`` does: EVEN_M / EVEN_N set where M and N are multiples of the tile (the
epilogue's bounds masks fold away), INDEX_DTYPE int32 where every epilogue tensor's offsets fit. Variant B is the
same config with ``--variant``'s flags forced to what the general case gets: ``even``, both EVEN flags off (the
kernel of a ragged shape: masks kept); ``index``, int64 offsets; ``both``, both. Per workload and shape: one
poisoned call of each variant against the fp32 reference (``evtorch bench``'s error); then cuBLAS, A and B
captured in CUDA graphs and timed in ``--rounds`` interleaved rounds (``Harness.paired``: settled first, do_bench
medians with L2 flushed). Writes ab_<variant>.json and ab_<variant>_log.txt under --out.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.time()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-bench", required=True, help="a bench JSON: each row's picked config (config_dict)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x4096x1024")
    ap.add_argument("--workloads", default="")
    ap.add_argument("--variant", choices=("even", "index", "both"), default="even")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--deadline-s", type=float, default=500.0)
    return ap.parse_args(argv)


@contextlib.contextmanager
def general_launches(variant: str):
    """Launches prepared inside take the general case's flags for ``variant``: EVEN_M = EVEN_N = False (the masked
    kernel) and / or int64 offsets; remembered launches are dropped on entry and exit, so each variant prepares
    its own."""
    import evtorch.runtime.gemm as rg

    real_prepare, real_limit = rg.prepare_launch, rg._INT32_LIMIT

    def prepare(*args, **kwargs):
        launch = real_prepare(*args, **kwargs)
        for kw in (launch.common, launch.reduce_kwargs):
            if kw:
                kw.update(EVEN_M=False, EVEN_N=False)
                if "EVEN_K" in kw:  # the pointer templates' K loop
                    kw["EVEN_K"] = False
        return launch

    rg.clear_caches()
    if variant in ("even", "both"):
        rg.prepare_launch = prepare
    if variant in ("index", "both"):
        rg._INT32_LIMIT = 1  # no tensor fits: every launch keeps int64 offsets
    try:
        yield
    finally:
        rg.prepare_launch, rg._INT32_LIMIT = real_prepare, real_limit
        rg.clear_caches()


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["EVTORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtorch_even_ab_")
    import torch

    import evtorch as evt
    from benchmarks.experiment import poisoned
    from benchmarks.harness import Harness
    from benchmarks.pingpong_check import max_error, workload
    from evtorch.codegen.configs import GemmConfig
    from evtorch.examples import eager_reference, operands

    bench = json.loads(Path(args.from_bench).read_text())
    shapes = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
    names = set(args.workloads.split(",")) if args.workloads else None
    results = {"env": {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "argv": sys.argv[1:],
                       "from_bench": args.from_bench, "variant": args.variant}, "rows": []}
    import triton

    results["env"]["triton"] = triton.__version__
    b = Harness(args, f"ab_{args.variant}", results, cuda=True, warmup_ms=25.0, rep_ms=args.rep_ms, t0=T0)
    b.log("ENV", json.dumps(results["env"]))
    for src in bench["rows"]:
        M, N, K = src["shape"]
        if (M, N, K) not in shapes or (names and src["workload"] not in names) or not src.get("config_dict"):
            continue
        if b.time_left() < 40:
            b.log(f"deadline: {src['workload']} {M}x{N}x{K} skipped")
            continue
        cd = src["config_dict"]
        config = GemmConfig.from_dict(ast.literal_eval(cd) if isinstance(cd, str) else cd)
        fn, make_inputs = workload(src["workload"])
        A, B = operands(M, N, K, "cuda", torch.bfloat16)
        inputs = make_inputs(M, N, "cuda", torch.bfloat16)
        ref = eager_reference(fn, A, B, **inputs)

        def call():
            return evt.gemm(A, B, fn, config=config, **inputs)

        row = {"workload": src["workload"], "shape": [M, N, K], "config": config.short(),
               "err": {"A": max_error(poisoned(call), ref)}}
        graph_a = b.capture(call)
        with general_launches(args.variant):
            row["err"]["B"] = max_error(poisoned(call), ref)
            graph_b = b.capture(call)
        if graph_a is None or graph_b is None:
            b.log(f"{src['workload']}: capture failed")
            continue
        timed = b.paired({"cublas": lambda: torch.matmul(A, B), "A": graph_a, "B": graph_b}, rounds=args.rounds)
        row.update({k: {"ms": v[0], "rounds": v[1]} for k, v in timed.items()})
        cub = timed["cublas"][0]
        row["A_vs_cublas"], row["B_vs_cublas"] = timed["A"][0] / cub, timed["B"][0] / cub
        row["A_vs_B"] = timed["A"][0] / timed["B"][0]
        results["rows"].append(row)
        b.log(f"{src['workload']:15s} {M}x{N}x{K} {config.short():60s} cuBLAS {cub:.4f} ms | as launched (A) "
              f"{row['A_vs_cublas']:.3f} | general {args.variant} (B) {row['B_vs_cublas']:.3f} | "
              f"A/B {row['A_vs_B']:.3f} | "
              f"err {row['err']['A']:.1e} / {row['err']['B']:.1e}")
        b.save()
    return b.finish()


if __name__ == "__main__":
    sys.exit(main())
