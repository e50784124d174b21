"""Does a config's public call cost more than its kernel? The public call, the same call captured in a CUDA graph
and replayed, and cuBLAS, timed in interleaved rounds (``Harness.paired``: L2 flushed before every run), plus the
tuner's own timing for short calls (``autotune.time_ms(graph=True)``: one call's graph, replayed with L2 flushed).

Why: the tuner ranks candidates by graph replays, the bench reports the public call; in three runs of
2026-11-22 the persistent TMA kernel's public call for bias_gelu_aux at 8192x8192x4096 ran 2.3-3.8% over its
graph-replayed time, ping-pong rows -1.5% to +2% (docs/benchmarks-log.md, "Next steps as they stood on
2026-11-27", item 0)::

    python -m benchmarks.launch_paths --out $OUT --from benchmarks/results/bench_h200.json \\
        --rows bias_gelu_aux,identity,lincomb_relu --shape 8192x8192x4096 --extra 'bias_gelu_aux={"template": ...}'

Each row runs with the config that bench run picked; ``--extra W=CONFIG_JSON`` (a ``GemmConfig.to_dict()``) adds
another config for workload W.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import Harness  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--from", dest="source", type=Path, default=Path("benchmarks/results/bench_h200.json"))
    ap.add_argument("--rows", default="bias_gelu_aux,identity,lincomb_relu")
    ap.add_argument("--shape", default="8192x8192x4096")
    ap.add_argument("--extra", action="append", default=[], help="W=<GemmConfig.to_dict() JSON>")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    import evtorch as evt
    from benchmarks.workloads import bench_workload
    from evtorch.codegen.configs import GemmConfig
    from evtorch.examples import operands
    from evtorch.runtime import autotune

    shape = [int(v) for v in args.shape.split("x")]
    bench = json.loads(args.source.read_text())
    rows = {r["workload"]: r for r in bench["rows"] if r["shape"] == shape}
    extra: dict[str, list[str]] = {}
    for spec in args.extra:
        name, _, value = spec.partition("=")
        extra.setdefault(name, []).append(value)
    results: dict = {"shape": shape, "source": str(args.source), "rows": []}
    h = Harness(types.SimpleNamespace(out=str(args.out), deadline_s=1e9), "launch_paths", results, cuda=True,
                warmup_ms=25, rep_ms=250, t0=time.time())
    M, N, K = shape
    torch.manual_seed(0)
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    for name in args.rows.split(","):
        row = rows[name]
        fn, mk = bench_workload(name)
        inputs = mk(M, N, "cuda", torch.bfloat16)
        configs = [GemmConfig.from_dict(row["config_dict"])]
        configs += [GemmConfig.from_dict(json.loads(spec)) for spec in extra.get(name, [])]
        epilogue = None if name == "identity" else fn  # evt.gemm(A, B) is the plain GEMM
        for cfg in configs:
            def public(cfg=cfg):
                return evt.gemm(A, B, epilogue, config=cfg, **inputs)

            public()
            torch.cuda.synchronize()
            replay = h.capture(public)
            fns = {"cublas": lambda: torch.matmul(A, B), "public": public}
            if replay is not None:
                fns["graph"] = replay
            t = h.paired(fns, rounds=args.rounds)
            tuner = autotune.time_ms(public, graph=True)
            rec = {"workload": name, "config": cfg.short(), "tuner_ms": tuner,
                   **{f"{k}_ms": v[0] for k, v in t.items()}, **{f"{k}_rounds": v[1] for k, v in t.items()}}
            results["rows"].append(rec)
            h.log(f"{name:14s} {cfg.short():70s} cublas {rec['cublas_ms']:.4f} public {rec['public_ms']:.4f} "
                  f"graph {rec.get('graph_ms', float('nan')):.4f} tuner {tuner:.4f} "
                  f"public/graph {rec['public_ms'] / rec.get('graph_ms', float('nan')):.3f}")
            h.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
