"""One-shot GPU check of the GEMM templates: correctness of every template, then timing vs torch.matmul.

Run on a CUDA machine (written for one H100/H200 lease; everything is batched into one process):

    PYTHONUNBUFFERED=1 python benchmarks/template_check.py --out $OUT

Correctness: fresh random inputs, output poisoned with NaN, relative Frobenius error against a float64
product of the same (rounded) inputs, for portable / splitk / persistent_tma in fp16, bf16, fp32 (IEEE and
TF32), on ragged, transposed, batched and K=0 problems; split-K bitwise determinism; the persistent
variants (flatten, warp_specialize). Timing: bf16 8192x8192x4096 and 4096^3, do_bench median, persistent
configs and the portable fallback against torch.matmul, then one real ``pick_config`` tuning run.
A global deadline keeps the run inside the lease; results go to results.json and log.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

T0 = time.time()


def _isolate_package() -> None:
    """Import evtorch's codegen/runtime without running evtorch/__init__ (which pulls in the frontend,
    passes and API): this script measures the templates alone, whatever state the rest is in."""
    import types

    if "evtorch" in sys.modules:
        return
    pkg = types.ModuleType("evtorch")
    pkg.__path__ = [str(Path(__file__).resolve().parents[1] / "evtorch")]
    sys.modules["evtorch"] = pkg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--deadline-s", type=float, default=420.0)
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes, no timing")
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    dev = "cpu" if args.dry_run else "cuda"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("EVTORCH_CACHE_DIR", "/tmp/evtorch_cache")
    log_file = open(out_dir / "log.txt", "w")

    def log(*parts):
        text = " ".join(str(p) for p in parts)
        print(text, flush=True)
        log_file.write(text + "\n")
        log_file.flush()

    def time_left() -> float:
        return args.deadline_s - (time.time() - T0)

    import torch
    import triton

    _isolate_package()
    if not torch.cuda.is_available() and not args.dry_run:
        log("no CUDA device; nothing to do")
        return 1

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    from evtorch.codegen.configs import GemmConfig, device_info
    from evtorch.codegen.policy import candidate_configs, heuristic_config
    from evtorch.testing import store_module_source
    from evtorch.runtime import autotune
    from evtorch.runtime.gemm_launch import gemm_problem, launch_gemm, resolve_config, tma_eligible
    from evtorch.runtime.source_cache import load_module

    info = device_info(dev)
    env = {
        "torch": torch.__version__, "triton": triton.__version__, "device": info.name,
        "capability": info.capability, "num_sms": info.num_sms, "smem": info.smem_bytes,
    }
    log("ENV", json.dumps(env))
    results = {"env": env, "correctness": [], "variants": [], "timing": [], "tuning": None, "kernels": []}

    mod = load_module(store_module_source(), "template_check")

    def run(A, B, cfg, allow_tf32=False, out=None):
        p = gemm_problem(A, B)
        if out is None:
            out = torch.full((p.L, p.M, p.N), float("nan"), dtype=A.dtype, device=A.device)
        launch_gemm(mod, "g", A, B, [out, out.stride(0), out.stride(1), out.stride(2)], cfg, allow_tf32)
        return out

    def rel_err(out, A, B):
        ref = torch.matmul(A.double(), B.double())
        if ref.dim() == 2:
            ref = ref.unsqueeze(0)
        ref = ref.expand(out.shape)
        if torch.isnan(out).any():
            return float("nan")
        denom = ref.norm().item()
        return (out.double() - ref).norm().item() / (denom if denom > 0 else 1.0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, device=dev, dtype=torch.float32).to(dtype)

    # (M, N, K) per case; the dry run shrinks them but keeps the alignment classes.
    sz = (lambda n: n) if not args.dry_run else (lambda n: max(1, n // 8))
    cases = {
        "ragged_aligned": lambda dt: (rnd(sz(1000), sz(512) + 8, dtype=dt), rnd(sz(512) + 8, sz(1000), dtype=dt)),
        "transposed": lambda dt: (rnd(sz(512) + 8, sz(768), dtype=dt).t(), rnd(sz(1000), sz(512) + 8, dtype=dt).t()),
        "batchedA_bcastB": lambda dt: (rnd(3, sz(300), sz(128) + 8, dtype=dt), rnd(sz(128) + 8, sz(256) + 8, dtype=dt)),
        "batched_both_colB": lambda dt: (rnd(2, sz(200), sz(256) + 8, dtype=dt),
                                         rnd(2, sz(128) + 8, sz(256) + 8, dtype=dt).transpose(1, 2)),
        "ragged_unaligned": lambda dt: (rnd(sz(1000), sz(512) + 5, dtype=dt), rnd(sz(512) + 5, sz(1037), dtype=dt)),
        "K0": lambda dt: (rnd(sz(100), 0, dtype=dt), rnd(0, sz(90), dtype=dt)),
    }
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}

    def cfgs_for(dtype):
        bk = 32 if dtype == torch.float32 else 64
        return [
            GemmConfig("portable", 128, 128, bk // 2, 8, 1, 4, 4),
            GemmConfig("splitk", 64, 64, bk, 8, 4, 4, 3),
            GemmConfig("persistent_tma", 128, 256, bk, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),)),
            GemmConfig("persistent_tma", 128, 128, bk, 8, 1, 8, 4),
        ]

    def check_one(name, dtype, cfg, allow_tf32=False):
        A, B = cases[name](dtype)
        resolved = resolve_config(A, B, cfg)
        rec = {"case": name, "dtype": str(dtype), "config": cfg.short(), "ran": resolved.template,
               "tf32": allow_tf32}
        try:
            t = time.time()
            out = run(A, B, cfg, allow_tf32)
            sync()
            rec["err"] = rel_err(out, A, B)
            limit = 3e-3 if allow_tf32 else tol[dtype]
            rec["ok"] = bool(rec["err"] <= limit)
            if name == "K0":
                rec["ok"] = rec["ok"] and bool((out == 0).all())
            if cfg.template == "splitk":
                rec["deterministic"] = bool(torch.equal(out, run(A, B, cfg, allow_tf32)))
                rec["ok"] = rec["ok"] and rec["deterministic"]
            rec["s"] = round(time.time() - t, 2)
        except Exception as exc:  # noqa: BLE001 - record and continue
            rec["ok"] = False
            rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            log(traceback.format_exc()[-3000:])
        results["correctness"].append(rec)
        log("CHECK", json.dumps(rec))

    # 1) core correctness
    core_cases = ["ragged_aligned", "transposed", "batchedA_bcastB", "batched_both_colB"]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for cfg in cfgs_for(dtype):
            for name in core_cases:
                if time_left() < 200:
                    break
                check_one(name, dtype, cfg)

    # 2) timing vs torch.matmul (bf16)
    def kernel_report():
        """Registers / spills / smem / wgmma count of the compiled persistent kernels (best effort)."""
        rows = []
        try:
            fn = getattr(mod, "g_persistent_tma")
            for cache in fn.device_caches.values():
                for key, k in cache[0].items():
                    ptx = k.asm.get("ptx", "")
                    rows.append({"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
                                 "shared": getattr(k.metadata, "shared", None), "wgmma": ptx.count("wgmma.mma_async"),
                                 "num_warps": getattr(k.metadata, "num_warps", None),
                                 "num_stages": getattr(k.metadata, "num_stages", None)})
        except Exception as exc:  # noqa: BLE001
            rows.append({"error": f"{type(exc).__name__}: {exc}"})
        return rows

    timing_cfgs = [
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),)),
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True), ("FLATTEN", True))),
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True), ("WARP_SPECIALIZE", True))),
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", True),)),
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3),
        GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 4),
        GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True),)),
        GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 4, (("FLATTEN", True),)),
        GemmConfig("persistent_tma", 256, 128, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),)),
        GemmConfig("persistent_tma", 128, 128, 128, 8, 1, 8, 3),
        GemmConfig("portable", 128, 128, 32, 8, 1, 4, 4),
        GemmConfig("portable", 128, 256, 64, 8, 1, 8, 3),
    ]
    for (M, N, K) in ((8192, 8192, 4096), (4096, 4096, 4096)) if not args.dry_run else ():
        if time_left() < 90:
            log("SKIP timing", M, N, K, "deadline")
            break
        dtype = torch.bfloat16
        A, B = rnd(M, K, dtype=dtype), rnd(K, N, dtype=dtype)
        flops = 2.0 * M * N * K
        out_t = torch.empty(M, N, device="cuda", dtype=dtype)
        ms_torch = autotune.time_ms(lambda: torch.matmul(A, B, out=out_t))
        ms_torch2 = autotune.time_ms(lambda: torch.matmul(A, B, out=out_t))
        row = {"shape": [M, N, K], "dtype": "bf16", "torch_ms": [ms_torch, ms_torch2],
               "torch_tflops": flops / ms_torch / 1e9, "configs": {}}
        log("TIME torch", M, N, K, f"{ms_torch:.4f} ms / {ms_torch2:.4f} ms", f"{flops / ms_torch / 1e9:.1f} TFLOP/s")
        out = torch.empty(1, M, N, device="cuda", dtype=dtype)
        for cfg in timing_cfgs:
            if time_left() < 60:
                break
            try:
                t = time.time()
                out.fill_(float("nan"))
                run(A, B, cfg, out=out)
                torch.cuda.synchronize()
                compile_s = time.time() - t
                err = rel_err(out, A, B) if M * N * K <= 4096 ** 3 else None
                ms = autotune.time_ms(lambda: run(A, B, cfg, out=out))
                row["configs"][cfg.short()] = {"ms": ms, "tflops": flops / ms / 1e9, "vs_torch": ms_torch / ms,
                                               "err": err, "first_call_s": round(compile_s, 2)}
                log("TIME", cfg.short(), M, N, K, f"{ms:.4f} ms", f"{flops / ms / 1e9:.1f} TFLOP/s",
                    f"x{ms_torch / ms:.3f} of torch", f"err={err}")
            except Exception as exc:  # noqa: BLE001
                row["configs"][cfg.short()] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
                log("TIME FAIL", cfg.short(), traceback.format_exc()[-2500:])
        results["timing"].append(row)
    results["kernels"] = kernel_report()
    log("KERNELS", json.dumps(results["kernels"])[:3000])

    # 3) remaining correctness: fallback, K=0, TF32, persistent loop variants
    extra = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for cfg in cfgs_for(dtype):
            extra.append(("ragged_unaligned", dtype, cfg, False))
            if cfg.template != "persistent_tma":
                extra.append(("K0", dtype, cfg, False))
    for cfg in cfgs_for(torch.float32):
        extra.append(("transposed", torch.float32, cfg, True))
    for flags in ((("FLATTEN", True),), (("WARP_SPECIALIZE", True),), (("EPILOGUE_SUBTILE", True), ("FLATTEN", True))):
        cfg = GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 3, flags)
        for name in ("ragged_aligned", "batched_both_colB"):
            extra.append((name, torch.float16, cfg, False))
    for name, dtype, cfg, tf32 in extra:
        if time_left() < 45:
            log("SKIP remaining correctness: deadline")
            break
        check_one(name, dtype, cfg, tf32)

    # 4) the real tuning path once (bounded list, cached to disk)
    if time_left() > 40 and not args.dry_run:
        try:
            M = N = K = 4096
            A, B = rnd(M, K, dtype=torch.bfloat16), rnd(K, N, dtype=torch.bfloat16)
            ok = tma_eligible(A, B)
            cands = candidate_configs(M, N, K, torch.bfloat16, dev, tma_ok=ok, max_candidates=8)
            heur = heuristic_config(M, N, K, torch.bfloat16, dev, tma_ok=ok)
            out = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
            key = autotune.make_tune_key(A, B, "store", [c.template for c in cands])
            t = time.time()
            best = autotune.pick_config(cands, lambda c: autotune.time_ms(lambda: run(A, B, c, out=out)),
                                        key=key, heuristic=heur, device=dev)
            results["tuning"] = {"key": key, "heuristic": heur.short(), "best": best.short(),
                                 "candidates": [c.short() for c in cands], "seconds": round(time.time() - t, 1)}
            log("TUNE", json.dumps(results["tuning"]))
        except Exception as exc:  # noqa: BLE001
            results["tuning"] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
            log("TUNE FAIL", traceback.format_exc()[-2500:])

    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    # Short table last (the tail of the output is what comes back inline).
    bad = [r for r in results["correctness"] if not r.get("ok")]
    log(f"\nCORRECTNESS: {len(results['correctness']) - len(bad)}/{len(results['correctness'])} ok")
    for r in bad:
        log("  BAD", json.dumps(r)[:400])
    for row in results["timing"]:
        log(f"TIMING bf16 {row['shape']}: torch {row['torch_ms'][0]:.3f} ms ({row['torch_tflops']:.0f} TFLOP/s)")
        for name, v in sorted(row["configs"].items(), key=lambda kv: kv[1].get("ms", 1e9)):
            if "ms" in v:
                log(f"  {name:60s} {v['ms']:.3f} ms {v['tflops']:.0f} TFLOP/s x{v['vs_torch']:.3f}")
            else:
                log(f"  {name:60s} FAILED {v['error'][:150]}")
    log(f"total {time.time() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
