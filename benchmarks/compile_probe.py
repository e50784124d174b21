"""What torch.compile runs for a bench workload, and evtorch's forced configs timed in the same rounds:

    TORCH_LOGS=output_code PYTHONUNBUFFERED=1 python -m benchmarks.compile_probe --out $OUT \
        [--workload bias_gelu_aux] [--shape 8192x8192x4096] [--configs pers,pp_mma,...] 2> $OUT/compile_code.txt

Compiles the workload as ``evtorch bench`` does (``torch.compile(mode="max-autotune-no-cudagraphs")`` with the
bench's Inductor settings, a fresh Inductor cache; with ``TORCH_LOGS=output_code`` Inductor writes the code it
generated to stderr), then times cuBLAS, the compiled function and evtorch's public call on each
forced config (``CONFIGS``) in interleaved rounds (``Harness.paired``), every evtorch config first checked with
poisoned outputs against the fp32 reference. Writes compile_probe.json and compile_probe_log.txt under --out. For
finding what a torch.compile row that beats evtorch does, and whether a config evtorch already has can do the same.
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

T0 = time.time()


def _configs(fn=None, inputs=None, M=128, N=128):
    """name -> forced config: the persistent TMA halves, the ping-pong halves in the blocked and the wgmma layout
    (``ablation.configs_for``'s regs / mma for this epilogue, where given) and portable (non-persistent) tiles."""
    from benchmarks.ablation import configs_for
    from evtorch.codegen.configs import GemmConfig

    halves = (("EPILOGUE_SUBTILE", True),)
    pp = configs_for(fn, inputs, M, N, ["regs", "mma"]) if fn is not None else {}
    return {
        "pers": GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, halves),
        **({"pp": pp["regs"]} if "regs" in pp else {}),
        **({"pp_mma": pp["mma"]} if "mma" in pp else {}),
        "portable_128x128_w4_s3": GemmConfig("portable", 128, 128, 64, 8, 1, 4, 3),
        "portable_128x128_w4_s4": GemmConfig("portable", 128, 128, 64, 8, 1, 4, 4),
        "portable_128x256_w8_s3": GemmConfig("portable", 128, 256, 64, 8, 1, 8, 3),
        "portable_256x128_w8_s3": GemmConfig("portable", 256, 128, 64, 8, 1, 8, 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workload", default="bias_gelu_aux")
    ap.add_argument("--shape", default="8192x8192x4096")
    ap.add_argument("--configs", default="", help="comma-separated (default all): pers, pp, pp_mma, portable_...")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep-ms", type=float, default=250.0)
    ap.add_argument("--deadline-s", type=float, default=500.0)
    args = ap.parse_args(argv)
    os.environ["EVTORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtorch_compile_probe_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_compile_probe_")
    import torch
    import triton

    import evtorch as evt
    from benchmarks.experiment import poisoned
    from benchmarks.harness import Harness
    from benchmarks.pingpong_check import max_error
    from benchmarks.run import INDUCTOR_SETTINGS
    from benchmarks.workloads import WORKLOADS
    from evtorch.examples import eager_reference, operands

    results = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "argv": sys.argv[1:]}, "rows": {}}
    b = Harness(args, "compile_probe", results, cuda=True, warmup_ms=25.0, rep_ms=args.rep_ms, t0=T0)
    b.log("ENV", json.dumps(results["env"]))
    M, N, K = (int(v) for v in args.shape.split("x"))
    torch.manual_seed(0)
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    fn, make = WORKLOADS[args.workload][:2]
    inputs = make(M, N, "cuda", torch.bfloat16)
    ref = eager_reference(fn, A, B, **inputs)

    for key, value in INDUCTOR_SETTINGS.items():
        setattr(torch._inductor.config, key, value)
    ns = {"fn": fn}
    exec("def base(A, B, **kw):\n    return fn(A @ B, **kw)\n", ns)
    cfn = torch.compile(ns["base"], mode="max-autotune-no-cudagraphs", dynamic=False)
    t = time.time()
    results["compile_err"] = max_error(cfn(A, B, **inputs), ref)
    torch.cuda.synchronize()
    results["compile_s"] = round(time.time() - t, 1)
    b.log(f"compiled in {results['compile_s']} s, err {results['compile_err']:.1e}")

    fns = {"cublas": lambda: torch.matmul(A, B), "compile": lambda: cfn(A, B, **inputs)}
    configs = _configs(fn, inputs, M, N)
    wanted = args.configs.split(",") if args.configs else list(configs)
    for name in wanted:
        cfg = configs[name]

        def call(cfg=cfg):
            return evt.gemm(A, B, fn, config=cfg, **inputs)
        try:
            err = max_error(poisoned(call), ref)
        except Exception as exc:  # noqa: BLE001 - a config this epilogue cannot run is reported, not fatal
            b.log(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        results["rows"][name] = {"config": cfg.short(), "err": err}
        fns[name] = call
    timed = b.paired(fns, rounds=args.rounds)
    cub = timed["cublas"][0]
    for name, (ms, rounds) in timed.items():
        row = results["rows"].setdefault(name, {})
        row.update(ms=ms, rounds=rounds, vs_cublas=ms / cub, vs_compile=ms / timed["compile"][0])
        b.log(f"{name:26s} {ms:.4f} ms | {ms / cub:.3f} x cuBLAS | {row['vs_compile']:.3f} x torch.compile"
              + (f" | err {row['err']:.1e}" if "err" in row else ""))
    return b.finish()


if __name__ == "__main__":
    sys.exit(main())
