"""Forced configs on GEMMs whose output tiles cannot fill the GPU (few rows: inference batches, split-K territory).

    python -m benchmarks.skinny_probe --out $OUT [--shapes 128x4096x4096,...] [--workloads identity,bias_gelu_aux]

Per shape and workload: cuBLAS (``torch.matmul``) and each config of ``configs()`` forced through ``evt.gemm``
(``triton.testing.do_bench``, median, L2 flushed; the public call), the max error over the fp32 reference (outputs
poisoned), and the tuner's pick with a fresh cache; with ``--graph`` also each forced config's and the heuristic's
pick's CUDA-graph replay (``graph_ms``: the kernels alone, so a host-bound call shows as ms > graph_ms). For
choosing the candidates ``policy.candidate_configs`` offers in that regime (docs/benchmarks.md, "Few rows");
writes skinny.json under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import kernel_times  # noqa: E402

SHAPES = "16x4096x4096,128x4096x4096,256x4096x4096,128x14336x4096,128x4096x14336"


def configs(M: int, N: int, K: int) -> dict:
    """Name -> GemmConfig: the current small-tile portable picks, the TMA templates' small tiles, split-K over
    portable tiles at 2, 4 and 8 slices and over TMA loads (wgmma tiles) at 2 to 16."""
    from evtorch.codegen.configs import GemmConfig

    out = {
        "portable_32x32x64_w2": GemmConfig("portable", 32, 32, 64, 8, 1, 2, 4),
        "portable_64x64x64_w4": GemmConfig("portable", 64, 64, 64, 8, 1, 4, 3),
        "portable_128x64x64_w4": GemmConfig("portable", 128, 64, 64, 8, 1, 4, 3),
        "tma_128x64x64_w4": GemmConfig("persistent_tma", 128, 64, 64, 8, 1, 4, 4),
        "tma_64x128x64_w4": GemmConfig("persistent_tma", 64, 128, 64, 8, 1, 4, 4),
        "tma_128x128x64_w4_sub": GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True),)),
        # the large problems' heuristic before the ping-pong kernel took its place (2026-11-28)
        "tma_128x256x64_w8_s3_sub": GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),)),
    }
    # the few-rows 128x128 on other warp counts and rings (names with w/s: the split kernel's 8 warps on 6 stages
    # ran a K step in 0.86 of the few-rows tile's time, policy._STEP_COST)
    for warps, stages in ((8, 3), (8, 4), (8, 5), (4, 5), (4, 6)):
        out[f"tma_128x128x64_w{warps}_s{stages}_sub"] = GemmConfig("persistent_tma", 128, 128, 64, 8, 1, warps, stages,
                                                                 (("EPILOGUE_SUBTILE", True),))
    for bm, bn, bk, stages in ((64, 64, 64, 4), (64, 64, 64, 8), (64, 64, 64, 12), (64, 64, 128, 4), (64, 64, 128, 6),
                               (128, 64, 64, 6), (128, 64, 64, 8), (64, 128, 64, 6), (64, 128, 64, 8)):
        out[f"tma_{bm}x{bn}x{bk}_w4_s{stages}"] = GemmConfig("persistent_tma", bm, bn, bk, 8, 1, 4, stages)
    for bm, bn, bk, warps, stages in ((64, 64, 64, 4, 3), (128, 64, 64, 4, 3), (64, 128, 64, 4, 3),
                                      (128, 128, 64, 4, 3), (16, 64, 128, 4, 4)):
        for split in (2, 4, 8):
            if K // (bk * split) >= 4:
                out[f"splitk_{bm}x{bn}x{bk}_sk{split}"] = GemmConfig("splitk", bm, bn, bk, 8, split, warps, stages)
    # split-K over the TMA main loop (TMA_LOADS): wgmma tiles, each split's K run through descriptors
    for bm, bn, bk, warps, stages in ((64, 64, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                      (128, 128, 64, 8, 4)):
        for split in (2, 3, 4, 8, 16):
            if K // (bk * split) >= 4:
                out[f"splitk_tma_{bm}x{bn}x{bk}_sk{split}"] = GemmConfig("splitk", bm, bn, bk, 8, split, warps, stages,
                                                                      (("TMA_LOADS", True),))
    # ... and the main loops of the large-problem templates: a deeper ring, the 128x256 tile (names with w/s)
    for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 6), (128, 128, 64, 4, 6), (128, 256, 64, 8, 3),
                                      (128, 256, 64, 8, 4)):
        for split in (2, 3, 4, 5, 6, 7, 8, 16):
            if K // (bk * split) >= 4:
                out[f"splitk_tma_{bm}x{bn}x{bk}_w{warps}_s{stages}_sk{split}"] = GemmConfig(
                    "splitk", bm, bn, bk, 8, split, warps, stages, (("TMA_LOADS", True),))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--workloads", default="identity,bias_gelu_aux")
    ap.add_argument("--deadline-s", type=float, default=400.0)
    ap.add_argument("--configs", default="",
                    help="comma-separated names of configs() to force (default: all; 'none': only the heuristic's "
                         "pick and the tuner's)")
    ap.add_argument("--graph", action="store_true",
                    help="also time each forced config and the heuristic's pick as a CUDA-graph replay (graph_ms: "
                         "the kernels without the call's host work, as the tuner times short calls)")
    ap.add_argument("--no-tune", action="store_true",
                    help="skip the tuner's pick (its compiles take most of a row's time): forced configs and the "
                         "heuristic only")
    ap.add_argument("--profile", type=int, default=0,
                    help="also list the CUDA kernels (torch.profiler, us per call) of the N fastest configs")
    args = ap.parse_args(argv)
    os.environ["EVTORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtorch_skinny_")
    import torch
    import triton

    import evtorch as evt
    from benchmarks.experiment import environ, poisoned, tuned_config
    from benchmarks.pingpong_check import max_error
    from benchmarks.workloads import bench_workload
    from evtorch.examples import eager_reference, operands
    from evtorch.runtime.autotune import stored_records, time_ms

    t0 = time.time()
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731

    def graph_ms(fn) -> dict:
        return {"graph_ms": time_ms(fn, graph=True, settle_ms=0)} if args.graph else {}
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        A, B = operands(M, N, K, "cuda", torch.bfloat16)
        cublas = bench(lambda: torch.matmul(A, B))
        all_cfgs = chosen = configs(M, N, K)
        if args.configs:
            wanted = set(args.configs.split(",")) - {"none"}
            unknown = wanted - set(all_cfgs)
            if unknown:
                print(f"{shape}: no config named {sorted(unknown)} at this shape (configs() leaves out splits "
                      "with fewer than 4 K blocks)", flush=True)
            chosen = {k: v for k, v in all_cfgs.items() if k in wanted}
        for name in args.workloads.split(","):
            if time.time() - t0 > args.deadline_s:
                print(f"deadline: {shape} {name} skipped", flush=True)
                continue
            fn, mk = bench_workload(name)
            inputs = mk(M, N, "cuda", torch.bfloat16)
            ref = eager_reference(fn, A.float(), B.float(), **inputs)
            row = {"shape": [M, N, K], "workload": name, "cublas_ms": cublas, "configs": {}}
            for cname, cfg in chosen.items():
                call = lambda cfg=cfg: evt.gemm(A, B, fn, config=cfg, **inputs)  # noqa: E731
                try:
                    err = max_error(poisoned(call), ref)
                    ms = bench(call)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, not fatal
                    row["configs"][cname] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    continue
                row["configs"][cname] = {"ms": ms, "x_cublas": ms / cublas, "max_err": err, **graph_ms(call)}
            call = lambda: evt.gemm(A, B, fn, **inputs)  # noqa: E731
            with environ("EVTORCH_AUTOTUNE", "0"):  # the heuristic's pick
                err = max_error(poisoned(call), ref)
                ms = bench(call)
                row["heuristic"] = {"ms": ms, "x_cublas": ms / cublas, "max_err": err,
                                    "config": tuned_config(fn, A, B, inputs), **graph_ms(call)}
            if not args.no_tune:  # the tuner's pick, tuned into a fresh cache (this row's record only)
                with environ("EVTORCH_AUTOTUNE", "1"), environ("EVTORCH_CACHE_DIR",
                                                                tempfile.mkdtemp(prefix="evtorch_skinny_tune_")):
                    call()
                    ms = bench(call)
                    record = (stored_records() or [{}])[-1]
                row["tuned"] = {"ms": ms, "x_cublas": ms / cublas,
                                "best": record.get("best") and record["best"].short(),
                                "timings_ms": record.get("timings_ms"), "final_ms": record.get("final_ms")}
            if args.profile:
                ranked = sorted((v["ms"], k) for k, v in row["configs"].items() if "ms" in v)[:args.profile]
                row["profile"] = {k: kernel_times(lambda: evt.gemm(A, B, fn, config=all_cfgs[k], **inputs))
                                  for _, k in ranked}
                row["profile"]["cublas"] = kernel_times(lambda: torch.matmul(A, B))
            rows.append(row)
            # with --graph, rank and print the kernels' replay (the public call's timing swings with the host in
            # this regime: docs/benchmarks.md, "Split-K's main loop and reduce tile"), the call's in brackets
            timing = "graph_ms" if args.graph else "ms"
            best = sorted((v[timing], k) for k, v in row["configs"].items() if timing in v)[:4]
            h = row["heuristic"]
            heur = f"{h[timing] / cublas:.3f}" + (f" (call {h['x_cublas']:.3f})" if args.graph else "")
            print(f"{shape:16s} {name:14s} cuBLAS {cublas * 1e3:7.1f} us | heuristic {heur} "
                  f"({h['config']}, err {h['max_err']:.1e}) | "
                  + (f"tuned {row['tuned']['x_cublas']:.3f} ({row['tuned']['best']}) | " if "tuned" in row else "")
                  + ("graph: " if args.graph else "") + " ".join(f"{k} {v / cublas:.3f}" for v, k in best),
                  flush=True)
            meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "argv": sys.argv[1:] if argv is None else list(argv),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))}
            (out / "skinny.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
