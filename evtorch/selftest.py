"""GPU correctness suite: ``python -m evtorch.selftest`` (or ``evtorch selftest``).

Runs every case of ``evtorch.testing`` (each registry op, input role, view, reduction, vector stage, the source
documents' examples) on CUDA in fp16, bf16 and fp32 (TF32 off) with outputs poisoned before each run, in both
reduction modes, and every GEMM template on the examples (the TMA templates also on column-major operands),
against eager PyTorch on the float64 product.
Tolerances: fp32 relative error <= 1e-5, fp16/bf16 <= 1e-2 relative Frobenius; NaN never passes. Prints a
summary and exits non-zero on any failure.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback

import torch


def _cases():
    from .testing import all_cases
    return all_cases()


def run(sizes=((257, 193, 129, 3), (1024, 768, 512, 2)), dtypes=("float32", "float16", "bfloat16"),
        deterministic=(False, True), verbose=False, shard=(0, 1), only: str | None = None) -> dict:
    """Every check, or (``only``) those whose name contains that text, e.g. a template config's short name;
    ``shard`` = (i, n): every n-th of them from the i-th."""
    from .codegen.configs import GemmConfig, device_info, fits_smem
    from .codegen.policy import DEEP_RING_STAGES
    from .examples import EXAMPLES
    from .testing import Case, check

    os.environ["EVTORCH_POISON"] = "1"
    results = {"passed": 0, "failed": 0, "failures": [], "max_error": {}}
    device = "cuda"

    counter = [0]

    def record(name, fn):
        if only is not None and only not in name:
            return
        counter[0] += 1
        if (counter[0] - 1) % shard[1] != shard[0]:  # another process runs this one
            return
        try:
            errs = fn()
            results["passed"] += 1
            key = name.split("|")[1]
            results["max_error"][key] = max(results["max_error"].get(key, 0.0), max(errs, default=0.0))
            if verbose:
                print(f"ok   {name}  max rel err {max(errs, default=0):.2e}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, the suite goes on
            results["failed"] += 1
            results["failures"].append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            print(f"FAIL {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            if verbose:
                traceback.print_exc()

    cases = _cases()
    for M, N, K, L in sizes:
        # float64 at the first (ragged) size too: the portable template's CUDA-core dot and the float64 math, which
        # the interpreter's Triton accepts more of than the device's (a float64 GEMM failed to compile on Triton
        # 3.6 until 2026-11-29, unseen while no GPU check ran one)
        for dname in dtypes + (("float64",) if (M, N, K, L) == tuple(sizes[0]) and "float64" not in dtypes else ()):
            dtype = getattr(torch, dname)
            for det in deterministic:
                for case in cases:
                    if det and not case.name.startswith(("reduce", "vector", "example", "amax", "dag")):
                        continue
                    record(f"{case.name}|{dname}|{M}x{N}x{K}|det={det}",
                           lambda case=case: check(case, M=M, N=N, K=K, L=L, device=device, dtype=dtype,
                                                   deterministic=det))
    # every template takes every epilogue
    templates = [GemmConfig("portable", 64, 64, 32, 8, 1, 4, 3),
                 GemmConfig("splitk", 64, 64, 64, 8, 4, 4, 3),
                 # the heuristic's split-K tile (policy._few_rows_config): 16-row dots, BLOCK_K 128
                 GemmConfig("splitk", 16, 64, 128, 8, 4, 4, 4),
                 # ... and over TMA loads (wgmma tiles; pointer loads where the operands don't allow TMA)
                 GemmConfig("splitk", 64, 64, 64, 8, 4, 4, 4, (("TMA_LOADS", True),)),
                 # the heuristic's TMA split-K tiles on odd splits (policy.wave_split_k takes any count; K blocks
                 # dealt out in uneven runs, some empty): 128x128 on six stages, 128x256 on four
                 GemmConfig("splitk", 128, 128, 64, 8, 3, 8, 6, (("TMA_LOADS", True),)),
                 GemmConfig("splitk", 128, 256, 64, 8, 7, 8, 4, (("TMA_LOADS", True),)),
                 GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),)),
                 # 128x128 on one warpgroup (policy._PERSISTENT_128) and the few-rows 128x128 (policy._FEW_ROWS_128)
                 GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True),)),
                 GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 5, (("EPILOGUE_SUBTILE", True),)),
                 # few output tiles (policy._FEW_ROWS_16): small tiles on deep rings, BLOCK_K 128 included
                 GemmConfig("persistent_tma", 64, 64, 128, 8, 1, 4, 6),
                 GemmConfig("persistent_tma", 128, 64, 64, 8, 1, 4, 8),
                 GemmConfig("persistent_tma", 64, 128, 64, 8, 1, 4, 8),
                 # Gluon ping-pong (Hopper, fp16/bf16; elsewhere it runs as persistent_tma): halves with the
                 # prefetch rule, quarters without prefetch, and halves with the epilogue's one M x N input
                 # through the loader (EPI_TMA, a tuner candidate; epilogues without such an input run it as
                 # halves at 4 stages)
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5, (("EPILOGUE_SUBTILE", True),)),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5, (("EPILOGUE_SUBTILE", 4), ("PREFETCH", 0))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True))),
                 # the halves with a sixth ring stage (a tuner candidate for short K loops, policy.DEEP_RING_STAGES)
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, DEEP_RING_STAGES, (("EPILOGUE_SUBTILE", True),)),
                 # the epilogue as a loop over slices read back from shared memory: the consumers' shared
                 # whole-tile buffer on halves (a tuner candidate), a half-tile buffer each on quarters
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True), ("EPI_SMEM", 1))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_SMEM", 2))),
                 # ... and on eighths (128 x 16 slices: ptxas interleaves the per-element chains)
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", 8), ("EPI_SMEM", 1))),
                 # three consumers: the loop through a ring of two whole-tile buffers, and slices from registers
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 3,
                            (("EPILOGUE_SUBTILE", 4), ("EPI_SMEM", 1), ("CONSUMERS", 3), ("PREFETCH", 0))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4,
                            (("EPILOGUE_SUBTILE", 4), ("CONSUMERS", 3), ("PREFETCH", 0))),
                 # consumers of two warpgroups (num_warps=8): halves with the prefetch rule, quarters with the
                 # loader's input ring, and the loop from the shared whole-tile buffer on quarters
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 5, (("EPILOGUE_SUBTILE", True),)),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_TMA", True))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_SMEM", 1))),
                 # the epilogue as a runtime loop over slices carried in registers: halves with the prefetch rule,
                 # quarters with the loader's input ring, two-warpgroup consumers on quarters
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5, (("EPILOGUE_SUBTILE", True), ("EPI_LOOP", True))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4,
                            (("EPILOGUE_SUBTILE", 4), ("EPI_TMA", True), ("EPI_LOOP", True))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 5, (("EPILOGUE_SUBTILE", 4), ("EPI_LOOP", True))),
                 # the epilogue in the accumulator's wgmma layout, with the loader's input ring (the tuner's
                 # configs for epilogues that store no M x N tile), on halves and two-warpgroup quarters, five
                 # ring stages as the tuner runs them (policy.MMA_TMA_STAGES: 2 KiB left for barriers and
                 # reduction scratch); and as a runtime loop over the register-carried halves
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5,
                            (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True), ("EPI_MMA", True))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 5,
                            (("EPILOGUE_SUBTILE", 4), ("EPI_TMA", True), ("EPI_MMA", True))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5,
                            (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True), ("EPI_MMA", True), ("EPI_LOOP", True))),
                 # tile outputs stored by TMA from shared buffers: in the wgmma layout with the loader's input ring
                 # (output 0 in the input's slice buffer), and from the blocked layout on quarters
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4,
                            (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True), ("EPI_MMA", True), ("TMA_STORE", 2))),
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5,
                            (("EPILOGUE_SUBTILE", 4), ("PREFETCH", 0), ("TMA_STORE", 2))),
                 # ... and on the deep ring in the wgmma layout (the tuner's short-K config for two outputs and no
                 # M x N input: quarters, whose output buffers fit beside six stages)
                 GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, DEEP_RING_STAGES,
                            (("EPILOGUE_SUBTILE", 4), ("EPI_MMA", True), ("TMA_STORE", 2))),
                 # the epilogue-warpgroup schedule: 128x256 tiles, quarters handed off through two fp32 buffers
                 GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPILOGUE_SUBTILE", 4), ("EPI_WG", 2)))]
    # whole 128 x 128 (and 64 x 64) tiles, where the launcher sets EVEN_M / EVEN_N and the epilogue's bounds masks
    # fold away, in every dtype; ragged rows and columns (masks kept; TMA-aligned rows) in bfloat16
    shapes = [(512, 384, d) for d in dtypes] + [(520, 376, d) for d in dtypes if d == "bfloat16"]
    info = device_info(device)
    for cfg in templates:
        # float64 runs on the pointer-loaded templates only (policy.tma_template_allowed): their split-K workspace
        # and reduce in float64, ragged
        wide = cfg.template in ("portable", "splitk") and not cfg.flag("TMA_LOADS") and "float64" not in dtypes
        for name, ex in EXAMPLES.items():
            for tm, tn, dname in shapes + ([(520, 376, "float64")] if wide else []):
                dtype = getattr(torch, dname)
                # a persistent_tma or TMA split-K config sized for 16-bit operands may not fit wider ones (64x64x128
                # on six stages in float32: 384 KiB; split-K's 128x128x64 on six: 320 KiB), which the tuner never
                # offers unscaled (policy._scale_for_dtype, _fit_stages)
                if cfg.template in ("persistent_tma", "splitk") and not fits_smem(cfg, dtype, info):
                    continue
                case = Case(f"template_{cfg.short()}_{name}", ex.fn,
                            lambda M, N, L, d, t, ex=ex: ex.make_inputs(M, N, d, t))
                record(f"{case.name}|{dname}|{tm}x{tn}x1024|det=False",
                       functools.partial(template_check, case, cfg, tm, tn, 1024, device, dtype))
    # operands stored column-major (a weight gradient's X^T, a transposed weight): the TMA templates' *_COL_MAJOR
    # descriptors, which the row-major checks above never take
    for cfg in templates:
        if not (cfg.template == "persistent_tma" or cfg.flag("TMA_LOADS")):
            continue
        for name in ("lincomb_relu", "row_reduction"):
            ex = EXAMPLES[name]
            case = Case(f"layout_{cfg.short()}_{name}", ex.fn, lambda M, N, L, d, t, ex=ex: ex.make_inputs(M, N, d, t))
            for a_col, b_col in ((True, False), (False, True)):
                record(f"{case.name}_{'A' if a_col else 'B'}col|bfloat16|512x384x1024|det=False",
                       functools.partial(template_check, case, cfg, 512, 384, 1024, device, torch.bfloat16,
                                         a_col=a_col, b_col=b_col))
    return results


def template_check(case, cfg, M: int, N: int, K: int, device, dtype: torch.dtype, *, a_col: bool = False,
                   b_col: bool = False, backend: str | None = None) -> list[float]:
    """``case`` through ``evt.gemm`` with ``cfg`` forced on (M, K) @ (K, N) operands (``a_col`` / ``b_col``:
    stored column-major, the same values), against the float64 product and epilogue; the relative errors. With a
    column-major operand the config must still run its own template (not a fallback), so the check is what it
    says."""
    import evtorch as evt
    from .runtime.gemm_launch import resolve_config
    from .testing import operands, reference_device, rel_error, tolerance

    A, B = operands(case, M, N, K, 1, device, dtype)
    if a_col:
        A = A.t().contiguous().t()
    if b_col:
        B = B.t().contiguous().t()
    if a_col or b_col:
        assert resolve_config(A, B, cfg).template == cfg.template, f"{cfg.short()} falls back on these operands"
    kw = case.make_inputs(M, N, 1, device, dtype)
    out = evt.gemm(A, B, case.fn, config=cfg, **({"backend": backend} if backend else {}), **kw)
    ref_device = reference_device(dtype, A.device)
    ref = case.fn(A.to(ref_device).double() @ B.to(ref_device).double(),
                  **{k: v.to(ref_device).double() if torch.is_tensor(v) and v.is_floating_point() else v
                     for k, v in kw.items()})
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    ref = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    errs = [rel_error(o, r.to(o.dtype) if o.dtype in (torch.float16, torch.bfloat16) else r) for o, r in zip(out, ref)]
    lim = tolerance(dtype, kw)
    assert all(e <= lim for e in errs), f"errors {errs} > {lim}"
    return errs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="evtorch selftest", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one size only")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th check starting at i (parallel compiles)")
    p.add_argument("--only", metavar="TEXT", help="only the checks whose name contains TEXT (a template config's "
                   "short name, e.g. epi_mma; an op or example name)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("evtorch selftest needs a CUDA GPU (the CPU suite is `python -m pytest tests`).")
        return 2
    t0 = time.time()
    sizes = ((257, 193, 129, 3),) if args.quick else ((257, 193, 129, 3), (1024, 768, 512, 2))
    i, n = (int(x) for x in args.shard.split("/"))
    res = run(sizes=sizes, verbose=args.verbose, shard=(i, n), only=args.only)
    import triton
    res.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               seconds=round(time.time() - t0, 1))
    print(f"\nevtorch selftest on {res['device']} (torch {res['torch']}, triton {res['triton']}): "
          f"{res['passed']} passed, {res['failed']} failed in {res['seconds']} s")
    for k, v in sorted(res["max_error"].items()):
        print(f"  max relative error {k:9s}: {v:.2e}")
    for f in res["failures"][:40]:
        print("  FAIL", f)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if res["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
