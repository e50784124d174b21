"""A/B of one environment setting on the benchmark workloads, in one process and one device call:

    PYTHONUNBUFFERED=1 python -m benchmarks.ab_check --out $OUT --env EVTORCH_DISABLE_PASSES=stable \
        [--workloads bce_loss,identity] [--shapes 8192x8192x4096,8192x4096x1024] [--deadline-s 300] [--approximations]

Variant A is the environment as it is, variant B the same with ``--env NAME=VALUE`` set (e.g. a pass skipped with
``EVTORCH_DISABLE_PASSES``, or ``EVTORCH_FAST_MATH=never``). Per shape and workload:

1. correctness of each variant: one call with outputs poisoned (``EVTORCH_POISON=1``), max error over the fp32
   reference (as ``evtorch bench``) and over the float64 one (the tuner's pick, or with ``--from-bench`` the
   recorded config);
2. the forced configs (``--config``, comma-separated; default the 128x256 persistent halves kernel; also the
   ping-pong halves from registers, through the loader or from shared memory; with ``--from-bench JSON`` each row's
   config as that bench run picked it, 'bench') of each variant, CUDA-graph replay
   (do_bench median, L2 flushed), in ``--rounds`` interleaved rounds A, B (default 3): the spread of a variant's
   rounds is the noise, and the log's ``A/B`` is the ratio of the two medians. Both variants are compiled first,
   and before each round the GPU runs cuBLAS back to back for ``--settle-ms`` (default 1000): a round right after
   a compile's idle otherwise runs at a cool board's clocks (in the 2026-11-27 08:25 run the large shape's first
   rounds came out 5-9% faster than their repeats);
3. (unless ``--no-tune``) the tuned default of each variant (``EVTORCH_AUTOTUNE=1``, 5 candidates, a fresh tuning
   cache), timed the same way; the configs the tuner picked;
4. cuBLAS (``torch.matmul``) right before and after the row, each after settling: ratios divide by the one
   before.

``--approximations`` first runs ``fastmath_check``'s error table of the tlmath approximations (float64 reference).
Writes ab.json and ab_log.txt under --out. ``--dry-run``: tiny sizes through the Triton interpreter (checks the
script; no timing of graphs, no tuning).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.experiment import environ, poisoned, tuned_config, workload_rows  # noqa: E402
from benchmarks.pingpong_check import max_error, workload  # noqa: E402

T0 = time.time()


def parse_args(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--env", required=True, help="NAME=VALUE set for variant B")
    ap.add_argument("--workloads", default="bce_loss,identity")
    ap.add_argument("--shapes", default="8192x8192x4096,8192x4096x1024")
    ap.add_argument("--config", default=None,
                    help=f"forced configs, comma-separated, of {sorted(FORCED)} (default tma_128x256_halves, or none "
                         "with --from-bench)")
    ap.add_argument("--from-bench", metavar="JSON",
                    help="also force each row's config as that bench run recorded it (forced config 'bench'; rows "
                         "the run has no config for are skipped)")
    ap.add_argument("--no-tune", action="store_true", help="forced configs only (no tuned default)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved A, B rounds per config (default 3)")
    ap.add_argument("--settle-ms", type=float, default=1000.0,
                    help="cuBLAS run back to back before each round and each cuBLAS timing (default 1000; 0: none)")
    ap.add_argument("--deadline-s", type=float, default=300.0)
    ap.add_argument("--approximations", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    name, sep, value = args.env.partition("=")
    if not sep or not name:
        ap.error(f"--env must be NAME=VALUE, got {args.env!r}")
    args.env_name, args.env_value = name, value
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.settle_ms < 0:
        ap.error(f"--settle-ms must be >= 0, got {args.settle_ms}")
    args.configs = (args.config or ("" if args.from_bench else "tma_128x256_halves")).split(",")
    args.configs = [c for c in args.configs if c]
    args.bench_configs = {}
    if args.from_bench:
        bench = json.loads(Path(args.from_bench).read_text())
        args.bench_configs = {(r["workload"], tuple(r["shape"])): r["config_dict"] for r in bench.get("rows", [])
                              if r.get("config_dict")}
    unknown = [c for c in args.configs if c not in FORCED]
    if unknown:
        ap.error(f"--config: unknown {unknown}; known: {sorted(FORCED)}")
    return args


def _tma_halves():
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),))


def _pingpong(stages, **flags):
    from evtorch.codegen.configs import GemmConfig

    return lambda: GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, stages,
                              (("EPILOGUE_SUBTILE", True),) + tuple(flags.items()))


FORCED = {"tma_128x256_halves": _tma_halves, "pp_halves": _pingpong(5), "pp_halves_tma": _pingpong(4, EPI_TMA=True),
          "pp_halves_smem": _pingpong(4, EPI_SMEM=1)}


def _settler(cuda: bool, ms: float, fn):
    """A call that keeps the GPU busy with ``fn`` for ``ms`` (``evtorch.runtime.autotune.settle``), or does nothing
    on CPU / with ``ms`` 0."""
    if not cuda or ms <= 0:
        return lambda: None
    from evtorch.runtime.autotune import settle

    return lambda: settle(fn, ms)


def median_ratio(a: list, b: list) -> float | None:
    """median(a) / median(b) over the timings present (None where either has none)."""
    import statistics

    a, b = [x for x in a if x], [x for x in b if x]
    return statistics.median(a) / statistics.median(b) if a and b else None


def _fmt(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


class Variant:
    """Variant B's environment setting, applied around each ``run('B', fn)``; A runs ``fn`` as the environment is."""

    def __init__(self, name: str, value: str):
        self.name, self.value = name, value

    def run(self, which: str, fn):
        if which != "B":
            return fn()
        with environ(self.name, self.value):
            return fn()


def check(variant, which, A, B, fn, inputs, kw) -> dict:
    """One poisoned call of variant ``which``: max error over the fp32 reference (``eager_reference``, as ``evtorch
    bench``: inputs in their own dtype) and over the float64 one (operands and float inputs in float64)."""
    import torch

    import evtorch as evt
    from evtorch.examples import eager_reference

    out = variant.run(which, lambda: poisoned(lambda: evt.gemm(A, B, fn, **kw, **inputs)))
    ref32 = eager_reference(fn, A, B, **inputs)
    ref64 = eager_reference(fn, A.double(), B.double(), **{
        k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()})
    return {"max_err_fp32": max_error(out, ref32), "max_err_fp64": max_error(out, ref64)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["EVTORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtorch_ab_")  # fresh kernels and tuning
    import torch

    import evtorch as evt
    import evtorch.runtime.gemm as rg
    from benchmarks.harness import Harness

    cuda = not args.dry_run and torch.cuda.is_available()
    results = {"env": {"torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu",
                       "argv": sys.argv[1:], "variant_B": args.env}, "approximations": None, "rows": []}
    b = Harness(args, "ab", results, cuda=cuda, warmup_ms=25.0, rep_ms=100.0, t0=T0)
    b.dev = "cuda" if cuda else "cpu"
    import triton

    results["env"]["triton"] = triton.__version__
    b.log("ENV", json.dumps(results["env"]))
    if args.approximations and cuda:
        from benchmarks.fastmath_check import approximations

        results["approximations"] = approximations(False)
        b.log("APPROX", json.dumps(results["approximations"]))
    variant = Variant(args.env_name, args.env_value)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if not args.dry_run else [(64, 64, 32)]
    kw = {} if cuda else {"backend": "triton"}
    forced = {c: FORCED[c]() for c in args.configs}
    timer = b.graph_timer if cuda else b.timer
    for M, N, K, A, B, name, fn, inputs in workload_rows(b, shapes, args.workloads.split(","), workload, skip_s=30):
        row_forced = dict(forced)
        if args.from_bench:
            recorded = args.bench_configs.get((name, (M, N, K)))
            if recorded is None:
                b.log(f"{name} {M}x{N}x{K}: no config in {args.from_bench}; skipped")
                continue
            from evtorch.codegen.configs import GemmConfig

            row_forced["bench"] = GemmConfig.from_dict(recorded)
        row = {"workload": name, "shape": [M, N, K], "check": {},
               "forced": {c: {"A": [], "B": []} for c in row_forced}, "tuned": {"A": [], "B": []},
               "tuned_config": {}, "bench_config": row_forced["bench"].short() if "bench" in row_forced else None}
        results["rows"].append(row)
        settle_gpu = _settler(cuda, args.settle_ms, lambda: torch.matmul(A, B))
        settle_gpu()
        row["cublas_ms"] = b.timer(lambda: torch.matmul(A, B))
        # (also compiles both variants' default kernels; with --from-bench, the recorded config's: no tuning)
        check_kw = dict(kw, config=row_forced["bench"]) if "bench" in row_forced else kw
        for which in "AB":
            row["check"][which] = check(variant, which, A, B, fn, inputs, check_kw)
        for cname, cfg in row_forced.items():
            call = lambda: evt.gemm(A, B, fn, config=cfg, **kw, **inputs)  # noqa: E731
            for which in "AB":  # compiled before the first timed round
                variant.run(which, call)
            for _ in range(args.rounds):
                settle_gpu()
                for which in "AB":
                    row["forced"][cname][which].append(variant.run(which, lambda: timer(call)))
        if cuda and not args.no_tune:
            os.environ["EVTORCH_AUTOTUNE"] = "1"
            rg.MAX_TUNE_CANDIDATES = 5
            try:
                for which in "AB":
                    row["tuned_config"][which] = variant.run(which, lambda: tuned_config(fn, A, B, inputs))
                for _ in range(args.rounds):
                    settle_gpu()
                    for which in "AB":
                        row["tuned"][which].append(variant.run(which, lambda: timer(
                            lambda: evt.gemm(A, B, fn, **inputs))))
            finally:
                os.environ.pop("EVTORCH_AUTOTUNE", None)
        settle_gpu()
        row["cublas_ms_after"] = b.timer(lambda: torch.matmul(A, B))
        c = row["cublas_ms"]

        def ratios(vs):
            return "/".join(f"{v / c:.3f}" if v else "-" for v in vs)
        for v in row["forced"].values():
            v["A_over_B"] = median_ratio(v["A"], v["B"])
        row["tuned"]["A_over_B"] = median_ratio(row["tuned"]["A"], row["tuned"]["B"])
        forced_text = " | ".join(f"{cname} A {ratios(v['A'])} B {ratios(v['B'])} A/B {_fmt(v['A_over_B'])}"
                                 for cname, v in row["forced"].items())
        b.log(f"{name:15s} {M}x{N}x{K} cuBLAS {c:.4f} after {row['cublas_ms_after']:.4f} | {forced_text} | tuned A {ratios(row['tuned']['A'])} ({row['tuned_config'].get('A')})"
              f" B {ratios(row['tuned']['B'])} ({row['tuned_config'].get('B')}) A/B {_fmt(row['tuned']['A_over_B'])} | err A "
              f"{row['check']['A']['max_err_fp64']:.2e} B {row['check']['B']['max_err_fp64']:.2e} (fp64 reference)")
        b.save()
    return b.finish()


if __name__ == "__main__":
    sys.exit(main())
