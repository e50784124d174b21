"""Ping-pong experiment on the persistent TMA template (issue 4): forced configs x workloads x shapes, one lease.

Run on a CUDA machine (Hopper), everything in one command:

    PYTHONUNBUFFERED=1 python -m benchmarks.pingpong_check --out $OUT [--deadline-s 380] [--workers 10]

1. Compile + check, in parallel processes (Triton compilation is CPU-bound; the Triton and evtorch caches on disk
   are shared, so the timing process below only loads binaries): every (workload, config) at both shapes through
   ``evt.gemm(..., config=cfg)`` with outputs poisoned (max error against the fp32 reference, NaN = unwritten),
   the compiled kernel's registers / spills / shared memory and how many of its programs fit one SM
   (cuOccupancyMaxActiveBlocksPerMultiprocessor: a PROGRAMS_PER_SM=2 config must show >= 2); the examples on
   ragged and batched problems in fp16 / bf16 with fresh random inputs against a float64 reference, both
   reduction modes; and ``evtorch.selftest --quick`` with the heuristic replaced by the ping-pong configs wherever
   persistent_tma applies.
2. Timing, one process: per shape and workload, cuBLAS (``torch.matmul``) right before the row, then every config
   captured in a CUDA graph and replayed (device time, do_bench median, L2 flushed), the baseline config timed
   first and again last (its spread = the noise).

Writes pingpong.json, pingpong_log.txt, workers_log.txt and selftest logs under --out; prints a table last.
``--dry-run`` runs a tiny version through the Triton interpreter on CPU (checks the script only).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.experiment import (ROOT, finish_workers, parser, poisoned, start_workers, worker_env,  # noqa: E402
                                  worker_share, workload_rows)

T0 = time.time()

SHAPES = tuple(tuple(int(d) for d in s.split("x")) for s in os.environ["PINGPONG_SHAPES"].split(",")) if \
    os.environ.get("PINGPONG_SHAPES") else ((8192, 8192, 4096), (8192, 4096, 1024))
WORKLOADS = tuple(os.environ.get("PINGPONG_WORKLOADS", "").split(",")) if os.environ.get("PINGPONG_WORKLOADS") else (
    "identity", "lincomb_relu", "bias_gelu_aux", "colbcast_leaky", "rowreduce_tanh", "bce_loss", "dgelu_bgrad",
    "mixed_dag")


CONFIG_SET = os.environ.get("PINGPONG_SET", "run1")


def tma(bm, bn, warps, stages, **flags):
    """A persistent_tma config (BLOCK_K 64, GROUP_M 8) with ``flags`` as its extra."""
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("persistent_tma", bm, bn, 64, 8, 1, warps, stages, tuple(flags.items()))


def gl(stages, sub, warps=4, **flags):
    """A Gluon ping-pong config (128x128x64, GROUP_M 8) on ``sub`` epilogue slices with ``flags``; ``warps`` = 8:
    consumers of two warpgroups."""
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("pingpong", 128, 128, 64, 8, 1, warps, stages,
                      (("EPILOGUE_SUBTILE", sub),) + tuple(flags.items()))


def wg(stages, sub, slots, **flags):
    """An epilogue-warpgroup config (Gluon, 128x256x64, GROUP_M 8): ``slots`` accumulator hand-off buffers of
    ``sub`` slices per tile."""
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, stages,
                      (("EPILOGUE_SUBTILE", sub), ("EPI_WG", slots)) + tuple(flags.items()))


def _references() -> dict:
    """The configs the ping-pong experiments measure a variant against: the persistent halves kernel, ping-pong
    halves, and ping-pong halves with the epilogue input through the loader."""
    return {"base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True), "g_h": gl(5, 2), "g_h_tma": gl(4, 2, EPI_TMA=True)}


def configs() -> dict:
    """name -> GemmConfig. base* = today's persistent candidates (the tuner's picks in the last bench run).
    PINGPONG_SET=run1: ping-pong (2 programs per SM) on halves / quarters / warp-specialized, one-program
    control; run2: quarters on today's 128x256 tile (the H200 run of 2026-11-21 also had PROGRAMS_PER_SM=2 with a
    staggered start, STAGGER=8 / 24 in commit e4d4d71: slower everywhere, removed)."""
    if CONFIG_SET == "prefetch":  # M x N epilogue inputs loaded before the K loop / slices ahead (PREFETCH)
        return {
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, PREFETCH=0),
            "base_q4_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True, PREFETCH=0),
            "h_pf1": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, PREFETCH=1),
            "h_pf2": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, PREFETCH=2),
            "hf_pf2": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, FLATTEN=True, PREFETCH=2),
            "q4f_pf1": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True, PREFETCH=1),
            "q4f_pf4": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True, PREFETCH=4),
            "q4_auto": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4),
            "q4f_auto": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True),
        }
    if CONFIG_SET == "subtile8":  # the shared-memory epilogue loop on 128x16 slices (16 values per thread)
        return {
            **_references(),
            "es1_h": gl(4, 2, EPI_SMEM=1),
            "es1_s8": gl(4, 8, EPI_SMEM=1),
            "es1_q4": gl(4, 4, EPI_SMEM=1),
            "es2_s8": gl(4, 8, EPI_SMEM=2),
            "es2_q4": gl(4, 4, EPI_SMEM=2),
        }
    if CONFIG_SET == "loop":  # the consumers' epilogue as a runtime loop over slices carried in registers
        return {
            **_references(),
            "g_q4": gl(5, 4),
            "w_q4_tma": gl(4, 4, 8, EPI_TMA=True),
            "el_h": gl(5, 2, EPI_LOOP=True),
            "el_q4": gl(5, 4, EPI_LOOP=True),
            "el_q4_p0": gl(5, 4, EPI_LOOP=True, PREFETCH=0),
            "el_h_tma": gl(4, 2, EPI_LOOP=True, EPI_TMA=True),
            "el_q4_tma": gl(4, 4, EPI_LOOP=True, EPI_TMA=True),
            "w_el_q4": gl(5, 4, 8, EPI_LOOP=True),
            "w_el_q4_tma": gl(4, 4, 8, EPI_LOOP=True, EPI_TMA=True),
        }
    if CONFIG_SET == "mmaloop":  # the register loop (EPI_LOOP) in the wgmma layout, against the tuner's picks
        return {
            **_references(),
            "mma_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True),
            "mma_h_tma_ts": gl(4, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2),
            "mma_el_q4_tma_ts": gl(4, 4, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True, TMA_STORE=2),
            "mma_el_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True),
            "mma_el_h_tma_ts": gl(4, 2, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True, TMA_STORE=2),
        }
    if CONFIG_SET == "mmastages":  # the wgmma-layout configs with the loader's input ring on a fifth ring stage
        return {
            **_references(),
            "mma_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True),
            "mma_h_tma_ts1": gl(4, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=1),
            "mma_h_tma_s5": gl(5, 2, EPI_MMA=True, EPI_TMA=True),
            "mma_h_tma_ts1_s5": gl(5, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=1),
        }
    if CONFIG_SET == "prefetch2pp":  # two M x N inputs (mixed_dag) prefetched a slice ahead in the ping-pong loop
        return {  # (the rule prefetches one input only: two spilled on the persistent template)
            "es1_h": gl(4, 2, EPI_SMEM=1),  # the tuner's pick at 8192x4096x1024 (no prefetch by the rule)
            "es1_q4": gl(4, 4, EPI_SMEM=1, PREFETCH=0),
            "es1_q4_pf1": gl(4, 4, EPI_SMEM=1, PREFETCH=1),  # no spills offline (sm_90, Triton 3.9)
            "es1_h_pf1": gl(4, 2, EPI_SMEM=1, PREFETCH=1),  # 144 bytes of stack offline
            "g_q4_pf1": gl(5, 4, PREFETCH=1),  # 56 bytes of stack offline
        }
    if CONFIG_SET in ("mmadeep1", "mmadeep2"):
        # TMA-stored tile outputs in the wgmma layout (1: identity; 2: bias_gelu_aux) on a sixth ring stage: the
        # layout's 2 KiB of headroom leaves room for six 32 KiB stages beside 32 KiB of output buffers
        ts = int(CONFIG_SET[-1])
        return {
            "g_h_s6": gl(6, 2),  # the deep ring in the blocked layout (policy.DEEP_RING_STAGES)
            "mma_ts_h_s5": gl(5, 2, EPI_MMA=True, TMA_STORE=ts, PREFETCH=0),
            "mma_ts_q4_s5": gl(5, 4, EPI_MMA=True, TMA_STORE=ts, PREFETCH=0),
            "mma_ts_q4_s6": gl(6, 4, EPI_MMA=True, TMA_STORE=ts, PREFETCH=0),
            **({"mma_ts_h_s6": gl(6, 2, EPI_MMA=True, TMA_STORE=ts, PREFETCH=0)} if ts == 1 else {}),
        }
    if CONFIG_SET == "mma":  # the consumers' epilogue in the accumulator's wgmma layout (EPI_MMA)
        return {
            **_references(),
            "g_q4": gl(5, 4),
            "w_q4_tma": gl(4, 4, 8, EPI_TMA=True),
            "es1_h": gl(4, 2, EPI_SMEM=1),
            "mma_h": gl(5, 2, EPI_MMA=True),
            "mma_h_p0": gl(5, 2, EPI_MMA=True, PREFETCH=0),
            "mma_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True),
            "mma_q4": gl(5, 4, EPI_MMA=True),
            "mma_q4_tma": gl(4, 4, EPI_MMA=True, EPI_TMA=True),
            "w_mma_q4_tma": gl(4, 4, 8, EPI_MMA=True, EPI_TMA=True),
        }
    if CONFIG_SET == "tmastore":  # the consumers' tile outputs stored by TMA (TMA_STORE), in the wgmma layout or not
        return {
            **_references(),
            "g_q4": gl(5, 4),
            "w_q4_tma": gl(4, 4, 8, EPI_TMA=True),
            "mma_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True),
            "ts_h": gl(4, 2, TMA_STORE=2),
            "mma_ts_h": gl(4, 2, EPI_MMA=True, TMA_STORE=2),
            "mma_ts_h_p0": gl(4, 2, EPI_MMA=True, TMA_STORE=2, PREFETCH=0),
            "mma_ts_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2),
            "mma_ts_q4": gl(5, 4, EPI_MMA=True, TMA_STORE=2, PREFETCH=0),
            "mma_ts_q4_tma": gl(4, 4, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2),
            "w_mma_ts_q4_tma": gl(4, 4, 8, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2),
        }
    if CONFIG_SET == "loop2":  # the register loop against the tuner's long-K candidates (run with --rounds 3)
        return {
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
            "q4flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True),
            "g_h": gl(5, 2),
            "g_h_p0": gl(5, 2, PREFETCH=0),
            "g_h_tma": gl(4, 2, EPI_TMA=True),
            "el_h_p0": gl(5, 2, EPI_LOOP=True, PREFETCH=0),
            "el_q4_p0": gl(5, 4, EPI_LOOP=True, PREFETCH=0),
            "el_q4": gl(5, 4, EPI_LOOP=True),
            "el_h_tma": gl(4, 2, EPI_LOOP=True, EPI_TMA=True),
            "el_q4_tma": gl(4, 4, EPI_LOOP=True, EPI_TMA=True),
        }
    if CONFIG_SET == "wide":  # consumers of two warpgroups (num_warps=8): two epilogue warps per scheduler
        return {
            **_references(),
            "es1_h": gl(4, 2, EPI_SMEM=1),
            "g_q4_p0": gl(5, 4, PREFETCH=0),
            "w_h": gl(5, 2, 8),
            "w_q4": gl(5, 4, 8),
            "w_q4_p0": gl(5, 4, 8, PREFETCH=0),
            "w_h_tma": gl(4, 2, 8, EPI_TMA=True),
            "w_q4_tma": gl(4, 4, 8, EPI_TMA=True),
            "w_es1_q4": gl(4, 4, 8, EPI_SMEM=1),
        }
    if CONFIG_SET == "consumers3":  # three consumer warpgroups: two epilogues run beside each main loop
        return {
            **_references(),
            "es1_h": gl(4, 2, EPI_SMEM=1),
            "c3_es1_q4_p0": gl(3, 4, EPI_SMEM=1, CONSUMERS=3, PREFETCH=0),
            "c3_es1_h_p0": gl(3, 2, EPI_SMEM=1, CONSUMERS=3, PREFETCH=0),
            "c3_es1_s8_p0": gl(3, 8, EPI_SMEM=1, CONSUMERS=3, PREFETCH=0),
            "c3_q4_p0": gl(4, 4, CONSUMERS=3, PREFETCH=0),
            # (H200 run: also "c3_q4_tma", three consumers with EPI_TMA; rejected since 2026-11-26: it left output
            # elements unwritten once a first call ran the loader's copies, and its error check here ran without them)
        }
    if CONFIG_SET == "epismem":  # the consumers' epilogue as a loop over slices read back from shared memory
        return {  # (H200 run 1 also had es1_q4 / es1_q4_p0, run 2 es2_h / es2_h_p0: slower than es1_h / es2_q4)
            **_references(),
            "g_q4_p0": gl(5, 4, PREFETCH=0),
            "es1_h": gl(4, 2, EPI_SMEM=1),
            "es2_q4": gl(4, 4, EPI_SMEM=2),
        }
    if CONFIG_SET == "whole":  # a ping-pong consumer's epilogue on the whole 128x128 tile (more independent chains)
        return {
            **_references(),
            "g_h_p0": gl(5, 2, PREFETCH=0),
            "g_w1_p0": gl(5, 1, PREFETCH=0),
            "g_w1": gl(5, 1),
        }
    if CONFIG_SET == "epiwg":  # the epilogue-warpgroup schedule (two MMA warpgroups on 128x256, one epilogue)
        return {  # the last two are the selftest workers' configs
            **_references(),
            "wg_q4_p0": wg(3, 4, 2, PREFETCH=0),
            "wg_q4": wg(3, 4, 2),
            "wg_q4_s2r3": wg(2, 4, 3),
        }
    if CONFIG_SET == "gluon2":  # the epilogue's M x N input through the ping-pong loader (EPI_TMA, 4 stages)
        return {
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
            "g_h": gl(5, 2),
            "g_h_p0": gl(5, 2, PREFETCH=0),
            "g_h_s4": gl(4, 2),
            "g_h_tma": gl(4, 2, EPI_TMA=True),
            "g_q4_tma": gl(4, 4, EPI_TMA=True),
        }
    if CONFIG_SET == "gluon":  # the Gluon ping-pong template (two consumer warpgroups, ordered main loops)
        return {  # run 2 (epilogue in a 16-byte blocked layout, PREFETCH rule: one slice ahead for one input)
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
            "base_q4_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True),
            "base_q4": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4),
            "g_h_p0": gl(5, 2, PREFETCH=0),
            "g_q4_p0": gl(5, 4, PREFETCH=0),
            "g_q4_s6": gl(6, 4),
            "g_h": gl(5, 2),
            "g_q4": gl(5, 4),
        }
    if CONFIG_SET == "prefetch2":  # two M x N inputs (mixed_dag): one quarter slice ahead holds 32 registers
        return {
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, PREFETCH=0),
            "base_q4": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, PREFETCH=0),
            "q4_pf1": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, PREFETCH=1),
            "q4_pf2": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, PREFETCH=2),
        }
    if CONFIG_SET == "run2":
        return {
            "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
            "base_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, FLATTEN=True),
            "base_q4": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4),
            "base_q4_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True),
            "pp2_q4": tma(128, 128, 4, 3, EPILOGUE_SUBTILE=4, PROGRAMS_PER_SM=2),
        }
    return {
        "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
        "base_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, FLATTEN=True),
        "base_ws": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True, WARP_SPECIALIZE=True),
        "pp2_h": tma(128, 128, 4, 3, EPILOGUE_SUBTILE=True, PROGRAMS_PER_SM=2),
        "pp2_q4": tma(128, 128, 4, 3, EPILOGUE_SUBTILE=4, PROGRAMS_PER_SM=2),
        "pp2_h_ws": tma(128, 128, 4, 3, EPILOGUE_SUBTILE=True, PROGRAMS_PER_SM=2, WARP_SPECIALIZE=True),
        "pp1_h": tma(128, 128, 4, 3, EPILOGUE_SUBTILE=True),  # control: the same tile, one program per SM
    }


def workload(name):
    from benchmarks.workloads import WORKLOADS as W, identity

    if name == "identity":
        return identity, (lambda M, N, d, t: {})
    return W[name].fn, W[name].make_inputs


def max_error(out, ref) -> float:
    from benchmarks.run import max_error as me

    return me(out, ref)


# ------------------------------------------------------------------------------------------------ resources
def _occupancy(k, threads: int, shared: int):
    try:
        from cuda.bindings import driver as cud

        fn = k.function
        for handle in (fn, getattr(cud, "CUfunction")(fn)):
            try:
                err, n = cud.cuOccupancyMaxActiveBlocksPerMultiprocessor(handle, threads, shared)
                if int(err) == 0:
                    return int(n)
            except Exception:  # noqa: BLE001
                continue
    except Exception:  # noqa: BLE001
        pass
    return None


def kernel_rows(module, seen: set) -> list:
    """Resources of the GEMM kernels of ``module`` not in ``seen`` (ids), which this adds to ``seen``."""
    rows = []
    for name in dir(module):
        fn = getattr(module, name)
        caches = getattr(fn, "device_caches", None)
        if not caches or not name.startswith("gemm_"):
            continue
        for cache in caches.values():
            for key, k in cache[0].items():
                if id(k) in seen:
                    continue
                seen.add(id(k))
                md = getattr(k, "metadata", None)
                warps = getattr(md, "num_warps", None)
                shared = getattr(md, "shared", None)
                regs = getattr(k, "n_regs", None)
                row = {"kernel": name, "n_regs": regs, "n_spills": getattr(k, "n_spills", None), "shared": shared,
                       "num_warps": warps, "num_stages": getattr(md, "num_stages", None)}
                if warps and shared is not None:
                    row["blocks_per_sm"] = _occupancy(k, warps * 32, shared)
                    if regs:
                        per_warp = -(-regs * 32 // 256) * 256
                        row["blocks_per_sm_est"] = min(65536 // (per_warp * warps), 233472 // (shared + 1024))
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ phase 1
def worker(args) -> int:
    """Compile + check the jobs of shard i/n (jobs: 'W:workload:config' or 'E:example:config:dtype')."""
    import torch

    import evtorch as evt
    from evtorch.api import get_epilogue
    from evtorch.codegen.program import build_program
    from evtorch.runtime.gemm import fast_math_mode
    from evtorch.examples import EXAMPLES, eager_reference, operands
    from evtorch.testing import rel_error

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw_backend = {} if dev == "cuda" else {"backend": "triton"}
    cfgs = configs()
    mine = worker_share(args)
    results = []
    shapes = SHAPES if not args.dry_run else ((64, 64, 32), (64, 32, 32))
    seen_by_module: dict = {}
    for job in mine:
        parts = job.split(":")
        rec = {"job": job}
        t = time.time()
        try:
            if parts[0] == "W":
                name, cname = parts[1], parts[2]
                cfg = cfgs[cname]
                fn, mk = workload(name)
                rec["shapes"] = {}
                for (M, N, K) in shapes:
                    torch.manual_seed(1234 + M + N + K)
                    A, B = operands(M, N, K, dev, torch.bfloat16 if dev == "cuda" else torch.float16)
                    inputs = mk(M, N, dev, A.dtype)
                    out = poisoned(lambda: evt.gemm(A, B, fn, config=cfg, **kw_backend, **inputs))
                    ref = eager_reference(fn, A, B, **inputs)
                    rec["shapes"][f"{M}x{N}x{K}"] = {"err": max_error(out, ref)}
                    ep = get_epilogue(fn, (M, N), torch.float32, inputs)
                    module = build_program(ep, out_dtype=A.dtype, fast_math=fast_math_mode(A)).module
                    seen = seen_by_module.setdefault(id(module), set())
                    ks = kernel_rows(module, seen)
                    if ks:
                        rec.setdefault("kernels", []).extend(ks)
                    del out, ref, A, B, inputs
            else:  # E: example on ragged / batched problems vs float64, both reduction modes
                name, cname, dname = parts[1], parts[2], parts[3]
                cfg = cfgs[cname]
                dtype = getattr(torch, dname)
                ex = EXAMPLES[name]
                errs = []
                sizes = ((1000, 776, 520, 1), (300, 264, 136, 3)) if not args.dry_run else ((40, 48, 32, 1),)
                for (M, N, K, L) in sizes:
                    for det in (False, True):
                        torch.manual_seed(len(errs) + M)
                        A, B = operands(M, N, K, dev, dtype, batch=L if L > 1 else None)
                        if L > 1:
                            B = B[0]  # batched A, broadcast B
                        kw = ex.make_inputs(M, N, dev, dtype)
                        out = poisoned(lambda: evt.gemm(A, B, ex.fn, config=cfg, deterministic=det, **kw_backend,
                                                        **kw))
                        ref = ex.fn(torch.matmul(A.double(), B.double()),
                                    **{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                                       for k, v in kw.items()})
                        out = out if isinstance(out, tuple) else (out,)
                        ref = ref if isinstance(ref, tuple) else (ref,)
                        for o, r in zip(out, ref):
                            errs.append(rel_error(o, r.to(o.dtype) if o.dtype in (torch.float16, torch.bfloat16)
                                                  else r))
                rec["errs"] = errs
                rec["ok"] = all(e <= 1e-2 for e in errs)
        except Exception as exc:  # noqa: BLE001
            os.environ.pop("EVTORCH_POISON", None)
            rec["error"] = f"{type(exc).__name__}: {exc}"[:1500]
            traceback.print_exc()
        rec["s"] = round(time.time() - t, 1)
        print("JOB", json.dumps(rec)[:600], flush=True)
        results.append(rec)
    Path(args.result).write_text(json.dumps(results, default=str))
    return 0


def selftest_worker(args) -> int:
    """``evtorch.selftest --quick`` shard with the heuristic config replaced by a ping-pong config wherever the
    operands allow persistent_tma (fp16 / bf16, TMA layout): every case runs the new template path."""
    import evtorch.runtime.gemm as rg
    from evtorch import selftest

    cfgs = configs()
    i, n = (int(x) for x in args.selftest.split("/"))
    pick = list(cfgs.values())[-2 if i % 2 == 0 else -1]
    orig = rg.heuristic_config

    def heuristic(M, N, K, dtype, device=None, *, L=1, tma_ok=False, allow_tf32=False):
        if tma_ok and dtype.itemsize == 2:
            return pick
        return orig(M, N, K, dtype, device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)

    rg.heuristic_config = heuristic
    os.environ["EVTORCH_AUTOTUNE"] = "0"
    return selftest.main(["--quick", "--shard", f"{i}/{n}", "--json", str(Path(args.out) / f"selftest_{i}.json")])


def phase1(args, log) -> dict:
    cfgs = configs()
    heavy_first = sorted(WORKLOADS, key=lambda w: -["identity", "lincomb_relu", "bias_gelu_aux", "colbcast_leaky",
                                                    "bce_loss", "rowreduce_tanh", "dgelu_bgrad",
                                                    "mixed_dag"].index(w))
    jobs = [f"W:{w}:{c}" for w in heavy_first for c in cfgs]
    for ex in ("mixed_dag", "row_reduction", "bce_loss", "column_broadcast", "lincomb_relu"):
        for c in {"run1": ("pp2_h", "pp2_q4", "pp2_h_ws"), "prefetch": ("q4_auto", "q4f_auto", "h_pf2"),
                  "prefetch2": ("q4_pf1",), "gluon": ("g_h", "g_q4"), "gluon2": ("g_h_tma", "g_q4_tma"),
                  "epiwg": ("wg_q4", "wg_q4_s2r3"), "epismem": ("es1_h", "es2_q4"), "whole": ("g_w1_p0",),
                  "subtile8": ("es1_s8", "es2_s8"), "consumers3": ("c3_es1_q4_p0", "c3_q4_p0", "c3_q4_tma"),
                  "wide": ("w_h", "w_q4_p0", "w_q4_tma", "w_es1_q4"),
                  "loop": ("el_h", "el_q4_p0", "el_q4_tma", "w_el_q4_tma"), "loop2": ("el_h_p0", "el_q4"),
                  "mma": ("mma_h", "mma_q4_tma"), "tmastore": ("mma_ts_h_tma", "ts_h", "w_mma_ts_q4_tma")}.get(
                CONFIG_SET, tuple(cfgs)[-2:]):  # a set without an entry: its last two configs
            for d in ("bfloat16", "float16"):
                jobs.append(f"E:{ex}:{c}:{d}")
    if args.dry_run:
        jobs = ["W:mixed_dag:base", "W:mixed_dag:pp2_q4", "W:rowreduce_tanh:pp2_h_ws", "E:mixed_dag:pp2_h:float16"]
        if CONFIG_SET == "prefetch":
            jobs = ["W:mixed_dag:base", "W:mixed_dag:q4f_auto", "W:lincomb_relu:h_pf1", "E:mixed_dag:q4f_pf1:float16"]
        if CONFIG_SET == "gluon":
            jobs = ["W:mixed_dag:base", "W:mixed_dag:g_q4", "W:lincomb_relu:g_h", "E:mixed_dag:g_h:float16"]
        if CONFIG_SET == "gluon2":
            jobs = ["W:lincomb_relu:base", "W:lincomb_relu:g_h_tma", "E:lincomb_relu:g_q4_tma:float16"]
        if CONFIG_SET == "epiwg":
            jobs = ["W:lincomb_relu:base", "W:lincomb_relu:wg_q4", "E:mixed_dag:wg_q4_s2r3:float16"]
        if CONFIG_SET == "epismem":
            jobs = ["W:lincomb_relu:base", "W:bce_loss:es2_q4", "E:mixed_dag:es2_h:float16"]
        if CONFIG_SET == "subtile8":
            jobs = ["W:lincomb_relu:base", "W:bce_loss:es1_s8", "E:mixed_dag:es2_s8:float16"]
        if CONFIG_SET == "wide":
            jobs = ["W:lincomb_relu:base", "W:bce_loss:w_q4", "E:mixed_dag:w_q4_tma:float16"]
        if CONFIG_SET == "loop":
            jobs = ["W:lincomb_relu:base", "W:bce_loss:el_q4", "E:mixed_dag:el_h_tma:float16"]
        if CONFIG_SET == "consumers3":
            jobs = ["W:lincomb_relu:base", "W:bce_loss:c3_es1_q4_p0", "E:mixed_dag:c3_q4_tma:float16"]
    out, scratch = Path(args.out), Path(args.scratch)
    t = time.time()
    procs, logf = start_workers("benchmarks.pingpong_check", args, jobs, log)
    st = args.selftest_shards if not args.dry_run else 0
    for i in range(st):
        cmd = [sys.executable, "-m", "benchmarks.pingpong_check", "--selftest", f"{i}/{st}", "--out", str(out)]
        procs.append(subprocess.Popen(cmd, env=worker_env(), stdout=open(scratch / f"selftest_{i}.log", "w"),
                                      stderr=subprocess.STDOUT, cwd=ROOT))
    res = finish_workers(args, procs, logf, t, log)
    selftest = []
    for i in range(st):
        f = out / f"selftest_{i}.json"
        if f.exists():
            selftest.append(json.loads(f.read_text()))
            f.unlink()
    summary = {"passed": sum(r["passed"] for r in selftest), "failed": sum(r["failed"] for r in selftest),
               "failures": [x for r in selftest for x in r["failures"]], "shards_done": len(selftest),
               "shards": st}
    tails = [(scratch / f"selftest_{i}.log").read_text()[-1500:] for i in range(st)
             if (scratch / f"selftest_{i}.log").exists()]
    (out / "selftest_log.txt").write_text("\n=====\n".join(tails))
    log(f"phase 1: {len(res)} jobs in {time.time() - t:.0f} s; selftest (ping-pong configs) {summary['passed']} passed,"
        f" {summary['failed']} failed, {summary['shards_done']}/{st} shards")
    return {"jobs": res, "selftest": summary}


# ------------------------------------------------------------------------------------------------ phase 2
def phase2(args, b, results) -> None:
    import torch

    import evtorch as evt

    cfgs = configs()
    order = ["base"] + [c for c in cfgs if c != "base"] + ["base#2"] if "base" in cfgs else list(cfgs)
    first = next(iter(cfgs))  # a set without "base" configs measures against its first config
    shapes = SHAPES if not args.dry_run else ((64, 64, 32),)
    names = WORKLOADS if not args.dry_run else ("identity", "mixed_dag")
    kw = {} if b.cuda else {"backend": "triton"}
    for M, N, K, A, B, name, fn, inputs in workload_rows(b, shapes, names, workload, skip_s=20):
        row = {"workload": name, "shape": [M, N, K], "ms": {}}
        results["timing"].append(row)
        if args.rounds > 1 and b.cuda:
            _paired_row(b, row, cfgs, lambda cfg: evt.gemm(A, B, fn, config=cfg, **inputs),
                        lambda: torch.matmul(A, B), args.rounds)
        else:
            row["cublas_ms"] = b.timer(lambda: torch.matmul(A, B))
            for cname in order:
                cfg = cfgs[cname.split("#")[0]]
                try:
                    ms = b.graph_timer(lambda: evt.gemm(A, B, fn, config=cfg, **kw, **inputs)) if b.cuda else \
                        b.timer(lambda: evt.gemm(A, B, fn, config=cfg, **kw, **inputs))
                except Exception as exc:  # noqa: BLE001
                    ms = None
                    row.setdefault("errors", {})[cname] = f"{type(exc).__name__}: {exc}"[:300]
                row["ms"][cname] = ms
            row["cublas_ms_after"] = b.timer(lambda: torch.matmul(A, B))
        base = min((v for k, v in row["ms"].items() if k.startswith("base") and v), default=row["ms"].get(first))
        best = min((v, k) for k, v in row["ms"].items() if v)
        b.log(f"{name:15s} {M}x{N}x{K} cuBLAS {row['cublas_ms']:.4f} | " + " ".join(
            f"{k}={v / row['cublas_ms']:.3f}" if v else f"{k}=FAIL" for k, v in row["ms"].items())
            + (f" | best {best[1]} {best[0] / base:.3f} of best base" if base else ""))
        b.save()


def _paired_row(b, row: dict, cfgs: dict, call, cublas, rounds: int) -> None:
    """``--rounds R``: cuBLAS and every config's call captured in CUDA graphs, then R rounds that each time them
    all in turn (as ``Harness.paired``, each with the harness's full repeats; cuBLAS first, then the configs in an
    order reversed every other round, so no config always follows the same one). A config's entry in
    ``row["ms"]`` is cuBLAS's median times the median over the rounds of its time / cuBLAS's time in the same
    round: the ratio sees one round's clocks (on the H200 cuBLAS alone drifted 0.70 -> 0.83 ms within one row of
    a single-round run), and the rounds give its spread (``row["ratios"]``)."""
    graphs = {"cublas": b.capture(cublas) or cublas}
    for cname, cfg in cfgs.items():
        graphs[cname] = b.capture(lambda cfg=cfg: call(cfg))  # None (logged) where the call or capture fails
        if graphs[cname] is None:
            row.setdefault("errors", {})[cname] = "capture failed (see the log)"
    names = [k for k, v in graphs.items() if v is not None]
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[:1] + names[:0:-1]:
            times[k].append(b.timer(graphs[k]))
    row["cublas_ms"] = statistics.median(times["cublas"])
    row["cublas_ms_after"] = times["cublas"][-1]
    row["ratios"] = {k: [t / c for t, c in zip(times[k], times["cublas"])] for k in names if k != "cublas"}
    row["ms"] = {k: row["cublas_ms"] * statistics.median(v) for k, v in row["ratios"].items()}


def main() -> int:
    ap = parser("pingpong", deadline_s=380.0, phase1_s=170.0, workers=10)
    ap.add_argument("--selftest-shards", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1,
                    help="phase 2: R > 1 times cuBLAS and every config in R interleaved rounds (ratios per round)")
    ap.add_argument("--selftest")
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("EVTORCH_CACHE_DIR", "/tmp/evtorch_pingpong_cache")
    if args.worker:
        return worker(args)
    if args.selftest:
        return selftest_worker(args)

    from benchmarks.harness import Harness

    results = {"env": {}, "configs": {}, "phase1": None, "timing": []}
    b = Harness(args, "pingpong", results, cuda=not args.dry_run, warmup_ms=25.0, rep_ms=100.0, t0=T0)
    b.dev = "cuda" if b.cuda else "cpu"
    import torch
    import triton

    results["env"] = {"torch": torch.__version__, "triton": triton.__version__,
                      "device": torch.cuda.get_device_name() if b.cuda else "cpu (interpreter)",
                      "argv": sys.argv[1:]}
    results["configs"] = {k: v.short() for k, v in configs().items()}
    b.log("ENV", json.dumps(results["env"]))
    results["phase1"] = phase1(args, b.log)
    b.save()
    phase2(args, b, results)
    b.save()

    # summary last (the reply carries the tail)
    b.log("\nRESOURCES (n_regs / spills / shared KiB / blocks per SM) and max error per (workload, config):")
    for rec in results["phase1"]["jobs"]:
        if rec["job"].startswith("W:"):
            ks = rec.get("kernels", [])
            kt = ";".join(f"{k['n_regs']}/{k['n_spills']}/{(k['shared'] or 0) // 1024}/{k.get('blocks_per_sm')}"
                          f"({k.get('blocks_per_sm_est')})" for k in ks)
            errs = ",".join(f"{v['err']:.1e}" for v in rec.get("shapes", {}).values())
            b.log(f"  {rec['job'][2:]:30s} {kt:34s} err {errs} {rec.get('error', '')[:200]}")
    bad = [r for r in results["phase1"]["jobs"] if r["job"].startswith("E:") and not r.get("ok")]
    n_e = sum(r["job"].startswith("E:") for r in results["phase1"]["jobs"])
    b.log(f"EXAMPLES ragged/batched vs float64: {n_e - len(bad)}/{n_e} ok")
    for r in bad:
        b.log("  BAD", json.dumps(r)[:300])
    st = results["phase1"]["selftest"]
    b.log(f"SELFTEST with ping-pong configs: {st['passed']} passed, {st['failed']} failed "
          f"({st['shards_done']}/{st['shards']} shards)", "; ".join(st["failures"][:5]))
    b.log("\nTIME / cuBLAS (CUDA-graph replay; cuBLAS before/after the row):")
    cn = list(configs()) + (["base#2"] if "base" in configs() else [])
    b.log(f"{'workload':15s} {'shape':16s} {'cublas':>7s} " + " ".join(f"{c:>9s}" for c in cn))
    for row in results["timing"]:
        c = row["cublas_ms"]
        b.log(f"{row['workload']:15s} {'x'.join(map(str, row['shape'])):16s} {c:7.4f} " + " ".join(
            f"{(row['ms'].get(k) or float('nan')) / c:9.3f}" for k in cn) + f"  (after {row['cublas_ms_after']:.4f})")
    b.log(f"total {time.time() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
