"""GEMM tile policy: the candidate space per template, pruning, and a no-tuning pick.

Why a separate module: which config values are worth compiling depends on the device (shared memory, SM count,
capability) and the problem shape, and the autotuner needs a short, safe candidate list (every compile costs
seconds). That knowledge is curated tables and the measurements behind them, revised with every benchmark run;
the ``GemmConfig`` record, the device info and the resource checks the candidates are pruned by stay in
``configs``, which this module imports (never the reverse).

The epilogue never enters this space: it is called once per (sub-)tile whatever the config, so fusing more
ops never multiplies the number of candidates.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import torch

from evtorch.codegen.configs import (DTYPE_BYTES, HOPPER, TMA_DTYPES, DeviceInfo, GemmConfig, cdiv, check_sizes,
                                     consumers_from_registers, device_info, elem_bytes, fits_registers, fits_shape,
                                     fits_smem, interpreter_config, next_pow2, resident_programs, tiles_128)


def splitk_worthwhile(M: int, N: int, K: int, L: int, info: DeviceInfo) -> bool:
    """Split-K pays only when output tiles cannot fill the GPU and each split still has a long K loop."""
    if info.kind != "cuda":
        return False
    tiles = cdiv(M, 64) * cdiv(N, 64) * max(L, 1)
    return tiles < info.num_sms and K >= 1024 and K >= 2 * max(M, N)


def choose_split_k(M: int, N: int, K: int, L: int, config: GemmConfig, info: DeviceInfo) -> int:
    """Smallest power of two that brings the program count to about one wave, <= 16, and leaving each
    split at least 4 K-blocks (fewer makes the partial write-back dominate)."""
    tiles = config.tiles(M, N, L)
    split = 1
    while split < 16 and tiles * split < info.num_sms and K // (config.BLOCK_K * split * 2) >= 4:
        split *= 2
    return max(split, 2)


def resident_split_k(M: int, N: int, K: int, L: int, config: GemmConfig, dtype: torch.dtype,
                     info: DeviceInfo) -> int:
    """Smallest power of two <= 16 whose programs reach three quarters of what the SMs hold at once, counting the
    programs one SM's shared memory holds (a 16x64x128 tile on four stages takes 80 KiB: two per Hopper SM), and
    leaving each split at least 4 K-blocks; at least 2. The heuristic's 16-row split-K tile: ``choose_split_k``
    counts one program per SM, so 80 tiles (128x640) took 2 splits, 160 programs for 264 slots, 1.805 x cuBLAS,
    where 4 ran 1.548 (H200); at 64 tiles both rules give 4 (64x1024x8192: 1.187, against 1.338 on 2 and 1.406
    on 8, H100)."""
    tiles = config.tiles(M, N, L)
    slots = info.num_sms * max(1, resident_programs(config, dtype, info))
    split = 2
    while split < 16 and 4 * tiles * split < 3 * slots and K // (config.BLOCK_K * split * 2) >= 4:
        split *= 2
    return split


def wave_split_k(M: int, N: int, K: int, L: int, config: GemmConfig, info: DeviceInfo) -> int:
    """Largest split <= 16 whose programs (tiles x splits) still fit one wave of the SMs, leaving each split at
    least 4 K-blocks; at least 2. For wgmma tiles a second, mostly idle wave costs more than the extra splits
    save: 1024x1024x65536 on 128x128 tiles ran 1.080 x cuBLAS on 2 splits (128 programs) and 1.180 on 4 (H100).
    Any count, not only powers of two (the partial kernel deals K blocks out in runs of ``cdiv(blocks, SPLIT_K)``):
    36 tiles (768x768) take 3 splits, 108 programs, where 2 left 60 of 132 SMs idle."""
    tiles = config.tiles(M, N, L)
    split = 2
    while split < 16 and tiles * (split + 1) <= info.num_sms and K // (config.BLOCK_K * (split + 1)) >= 4:
        split += 1
    return split


def splitk_tma_worthwhile(M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo, tma_ok: bool,
                          allow_tf32: bool = False) -> bool:
    """Split-K over TMA loads is offered where the TMA template is allowed, 128x128 tiles make less than a wave and
    K is long against the output (>= 4 max(M, N), >= 2048): each split then still runs a wgmma main loop of its
    own. The heuristic takes it only in the regime measured to pay (``heuristic_config``)."""
    return (tma_template_allowed(dtype, info, tma_ok, allow_tf32) and tiles_128(M, N, L) < info.num_sms
            and K >= 4 * max(M, N) and K >= 2048)


#: The heuristic's cost model for a problem with fewer than a wave of 128x128 tiles and a long K, where it
#: chooses between the unsplit few-rows tile and split-K over TMA loads (``cost_steps``). A config's cost is the
#: busiest SM's MMA work in K steps of a 128x128x64 tile, times the cost of a step on that config's tile and
#: template against the split kernel's 128x128 (``_STEP_COST``), and for a split a fixed cost (the reduce kernel's
#: launch and the partials' first touch, ``SPLIT_FIXED_STEPS``) and one per MB of float32 partials the splits write
#: and the reduce reads (``PARTIAL_STEPS_PER_MB``). Fitted, least squares on relative error, to 216 kernel timings
#: by graph replay on an H200 (2026-11-28, identity; 20 shapes from 512x512x8192 to 1024x1024x65536 with the four
#: few-rows tiles and the two split tiles on 2-8 splits; benchmarks/results/skinny_h200_20261128_*.json, docs/
#: benchmarks.md "Split-K's cost model"): 5.8% rms error; the heuristic's pick then ran within 1.5% of the fastest
#: config measured at 19 of the 20 shapes, 8.6% behind it at 768x768x6144 (the unsplit 64x128 against 3 splits, a
#: near tie in the model); with the few-rows 128x128's new ring, 2.7-2.8% behind 6 stages on one warpgroup at the
#: four shapes that pick it for the identity (``tests/test_gemm_template.py`` holds the heuristic to these runs).
#: In microseconds a step of the split's 128x128 tile took 0.307, the split's fixed cost 10.7 against 4.0 for an
#: unsplit kernel, a MB of partials 0.62. The few-rows 128x128 was fitted at 1.16 on four stages and one
#: warpgroup; on five stages and two (``_FEW_ROWS_128``) it ran 0.93 of that time (identity), so 1.08.
_STEP_COST = {("splitk", 128, 128): 1.0, ("splitk", 128, 256): 0.96, ("persistent_tma", 128, 128): 1.08,
              ("persistent_tma", 64, 128): 1.38, ("persistent_tma", 128, 64): 1.54,
              ("persistent_tma", 64, 64): 2.01}
SPLIT_FIXED_STEPS = 22.0
PARTIAL_STEPS_PER_MB = 2.0
#: A step of the split's 128x128 tile in microseconds (the fit's), which puts the memory floor in steps.
STEP_US = 0.307
# A cost per split (the reduce kernel's programs read the partials one split after another), which the MB term prices
# as bandwidth only: 0. At 128 and 256 rows the model over-split (the run of 2026-11-28 15:00: 2.8-7.2% behind the
# fastest at five of seven shapes); a per-split cost of 3-4 steps took that run from 3.2% to 2.1-2.3% behind on
# geometric mean but the 38 shapes of all runs since 07:22 from 0.94% to 1.5-2.3%, so it stays 0
# (``python -m benchmarks.cost_model_fit --per-split --cv`` refits every constant and scores the picks). What those
# shapes lacked was the memory floor (``memory_floor_steps``): a 128-row GEMM streams its B in once however many
# splits share it (128x2048x8192: 36 MB of operands, 28 steps at the H200's 4.2 TB/s, against 16 steps of MMA work
# a program on 8 splits), so more splits only add partials. With the floor the picks of that run are the fastest
# timed at six of its eight shapes (1.8% and 2.7% behind at the others; 0.6% on geometric mean, 3.2% without), and
# the 38 shapes 0.37% behind the fastest (``cost_model_fit``). A refit of every constant without the 46 timings the
# floor sets fits better (7.4-7.6% rms error against 9.4-9.6%) but ranks worse (0.64-0.74% behind), so the
# constants stay as fitted at 12:00. On the H100 (3.0 TB/s) the floor binds sooner:
# 512x512x16384 and x32768 take 7 splits instead of 8, 128x2048x8192 the unsplit 64x64 (not timed on an H100).
REDUCE_STEPS_PER_SPLIT = 0.0


def memory_floor_steps(M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo) -> float:
    """The steps (of ``STEP_US``) it takes to stream both operands in once at the device's copy bandwidth: no main
    loop finishes sooner, however its K is split. 0 where the bandwidth is unknown."""
    if not info.copy_gbps:
        return 0.0
    operand_bytes = (M + N) * K * max(L, 1) * DTYPE_BYTES[dtype]
    return operand_bytes / (info.copy_gbps * 1e3 * STEP_US)


def main_loop_steps(config: GemmConfig, M: int, N: int, K: int, L: int, dtype: torch.dtype,
                    info: DeviceInfo) -> float:
    """The busiest SM's MMA work under ``config``: its turns (``cdiv(programs, slots)``) times a program's tile
    area and K, in steps of the split kernel's 128x128x64 tile, at the config's tile's rate (``_STEP_COST``);
    float32 operands at half the 16-bit rate (TF32)."""
    split = max(config.SPLIT_K, 1)
    turns = cdiv(config.tiles(M, N, L) * split, info.num_sms * config.programs_per_sm)
    steps = turns * config.BLOCK_M * config.BLOCK_N * cdiv(K, split) / (128 * 128 * 64)
    return steps * _STEP_COST[(config.template, config.BLOCK_M, config.BLOCK_N)] * (2 if DTYPE_BYTES[dtype] == 4 else 1)


def cost_steps(config: GemmConfig, M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo) -> float:
    """The heuristic's cost of ``config`` at this problem, in K steps of the split kernel's 128x128x64 tile on
    16-bit operands: the busiest SM's MMA work (``main_loop_steps``), but no less than the operands' bytes at the
    copy bandwidth (``memory_floor_steps``), plus a split's fixed and partials' costs. float32 operands run at
    half the 16-bit rate (TF32), which leaves the split's fixed cost relatively smaller. Defined for the few-rows
    tiles and the split-K tiles over TMA loads only (KeyError otherwise): it ranks those, nothing else."""
    split = max(config.SPLIT_K, 1)
    steps = max(main_loop_steps(config, M, N, K, L, dtype, info), memory_floor_steps(M, N, K, L, dtype, info))
    if split > 1:
        steps += (SPLIT_FIXED_STEPS + PARTIAL_STEPS_PER_MB * split * M * N * max(L, 1) * 4 / 1e6
                  + REDUCE_STEPS_PER_SPLIT * split)
    return steps


def splitk_tma_heuristic(M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo) -> GemmConfig | None:
    """The cheapest split-K over TMA loads by ``cost_steps``, or None where no split fits one wave: the split
    kernel's 128x128 tile on 6 stages or 128x256 on 4 (where N >= 256), each on 2 up to as many splits as fit one
    wave of the SMs with four K blocks a split. Each split's main loop is a whole GEMM's, so the tile and ring the
    large problems run at 98% of cuBLAS pay here too. One wave only: a second, mostly idle wave of a split
    costs more than its shorter splits save (1280x1024x12288: 128x128 on 3 splits, 240 programs, 1.454-1.493 x
    cuBLAS, against 1.229 for 128x256 on 3, 120 programs; 1024x1024x65536 on 128x128: 1.080 on 2 splits, 1.180
    on 4, H100). Measured picks (H200, kernels, identity): 768x768x49152 1.014 x cuBLAS on 18 128x256 tiles x 7
    splits (1.093 on 128x128 x 3), 1024x1024x16384 1.039 on 128x128 x 2 (1.079 on 128x256 x 4), 512x512x16384
    1.163 on 128x128 x 8 (1.645 unsplit on 64x64), 1280x1024x12288 1.229 on 128x256 x 3 (1.563 unsplit on
    128x128); docs/benchmarks.md, "Split-K's cost model"."""
    candidates = []
    for bn, stages in ((128, 6), (256, 4)):
        if bn == 256 and N < 256:  # half the tile's columns would be empty
            continue
        bm_, bn_, bk_, stages_ = _scale_for_dtype(128, bn, 64, stages, dtype)
        base = GemmConfig("splitk", bm_, bn_, bk_, 8, 2, 8, stages_, (("TMA_LOADS", True),))
        if base.tiles(M, N, L) * 2 > info.num_sms or K // (bk_ * 2) < 4:  # not even two splits fit one wave
            continue
        candidates += [_fit_stages(dataclasses.replace(base, SPLIT_K=split), dtype, info)
                       for split in range(2, wave_split_k(M, N, K, L, base, info) + 1)]
    if not candidates:
        return None
    return min(candidates, key=lambda c: cost_steps(c, M, N, K, L, dtype, info))


def _splitk_tma_space(M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo) -> list[GemmConfig]:
    """The TMA split-K tiles at their one-wave split and at twice it (a second wave measured ahead of one for
    128x64 at 512x512x32768: 1.225 against 2.007, H100)."""
    out = []
    for bm, bn, bk, stages, warps in _SPLITK_TMA_16:
        bm, bn, bk, stages = _scale_for_dtype(bm, bn, bk, stages, dtype)
        base = GemmConfig("splitk", bm, bn, bk, 8, 2, warps, stages, (("TMA_LOADS", True),))
        split = wave_split_k(M, N, K, L, base, info)
        for sk in (split, 2 * split):
            if sk <= 16 and K // (bk * sk) >= 4:
                out.append(dataclasses.replace(base, SPLIT_K=sk))
    return out


# Curated (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) for 16-bit inputs; fp32/fp64 derive from them.
_PORTABLE_16 = (
    (128, 128, 32, 4, 4),
    (128, 128, 64, 3, 8),
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
    (64, 64, 64, 3, 4),
    (64, 64, 32, 4, 4),
    (128, 32, 32, 4, 4),
    (32, 128, 32, 4, 4),
    (64, 32, 32, 5, 2),
    (32, 64, 32, 5, 2),
    (32, 32, 64, 4, 2),
    (16, 64, 128, 4, 4),
    (64, 16, 128, 4, 4),
    (16, 128, 64, 4, 4),
)
_SPLITK_16 = ((64, 64, 64, 3, 4), (128, 64, 64, 3, 4), (64, 128, 64, 3, 4), (32, 64, 128, 3, 4), (16, 64, 128, 4, 4))
# Split-K over TMA loads (TMA_LOADS; Hopper), (BM, BN, BK, stages, warps): wgmma tiles for long-K problems whose
# 128x128 tiles make less than a wave, such as weight gradients (K = tokens). H100, bf16, through ``evt.gemm``
# (docs/benchmarks.md "Few rows", "Split-K over TMA loads"): 1024x1024x65536 128x128 on 2 splits 1.080 x cuBLAS
# (the tuner's unsplit 64x128 pick 1.219, the heuristic's 128x64 1.694); 512x512x32768 128x64 on 8 splits 1.225
# and 128x128 on 8 1.248 (the tuner's portable split-K 1.320). On the fewest tiles (16 of 64x64) the portable
# 16x64x128 split-K stays ahead (1.21-1.46 against 1.39-1.50).
# The large problems' main loops (H200, 2026-11-28: 128x256 on 4 stages, 128x128 on 6; ``splitk_tma_heuristic``)
# ahead of 128x128 on 4 stages by 4-14%, so they replace it.
_SPLITK_TMA_16 = ((128, 256, 64, 4, 8), (128, 128, 64, 6, 8), (128, 64, 64, 4, 4), (64, 64, 128, 4, 4))
# (BM, BN, BK, stages, warps, subtile, warp_specialize, flatten), best first as measured on an H200 with
# Triton 3.6, bf16, store epilogue (benchmarks/template_check.py; TFLOP/s at 8192x8192x4096 / 4096^3,
# torch.matmul 684 / 703): 128x256x64 s3 w8 subtile 668 / 690, +flatten 684 / 692, +warp_specialize
# 681 / 696, s4 654 / 687, 256x128 subtile 649 / 641, 128x256 no subtile 675 / 636, 128x128x64 w4 subtile
# 637 / 624, 128x128x64 w8 640 / 607, 128x128x128 623 / 605. 128x128 + flatten was worst (572 / 565).
# subtile 4 = the epilogue on quarters [128, 64] (benchmarks/pingpong_check.py, H200, Triton 3.6): no register
# spills left in any bench epilogue (mixed_dag 50 -> 0, dgelu_bgrad 26 -> 0), with flatten lincomb_relu 0.90x at
# 8192x4096x1024 and 0.95x at 8192x8192x4096 of the best halves config; the others within +-5% (noise): a tuner
# candidate in the first five, replacing 128x256 s4 (never picked). Quarters without flatten: the fifth candidate,
# for epilogues with one M x N input, which it prefetches whole before the K loop (PREFETCH rule; prefetch run:
# rowreduce_tanh 1.08 -> 1.05 / 1.63 -> 1.53, bce_loss 1.18 -> 1.13 / 2.08 -> 1.91, dgelu_bgrad 1.84 -> 1.68 at
# 8192x8192x4096 / 8192x4096x1024), displacing halves + warp_specialize (within noise of halves).
# Few output tiles (M of 64-512 against N, K in the thousands: inference batches): small tiles on deep rings, which
# keep enough TMA copies in flight to stream B at the copy rate where 128x256 or 128x128 tiles leave most SMs idle.
# On an H100 (2026-11-27, benchmarks/skinny_probe.py, identity, x cuBLAS, do_bench with L2 flushed): 64x64x128 on six
# stages 1.083 / 1.065 / 0.931 at 128x4096x4096 / 64x4096x4096 / 128x4096x14336 (the tuner's picks before: 1.50
# ping-pong, 1.23 portable 16x64, 1.02 split-K), 64x64x64 on twelve 1.111 / 1.121 / 0.960; 128x64 and 64x128 on
# eight 1.011 / 1.014 at 256x4096x4096 against 1.25 / 1.23 on four (the stage count they had) and 1.10 / 1.09 on
# six. (BM, BN, BK, stages, warps, subtile, warp_specialize, flatten), best first.
_FEW_ROWS_16 = (
    (64, 64, 128, 6, 4, False, False, False),
    # 64x128 ahead of 128x64 (the heuristic takes the first of equal areas): one m64n128 wgmma a K step instead of
    # two m64n64, half the A reads from shared memory a FLOP; on an H100 64x128 ran 65.2 us against 88.9 for
    # 128x64 at 1024x1024x16384 and 1.219 against 1.694 x cuBLAS at 1024x1024x65536, level (1.007-1.014) at
    # 256x4096x4096 (docs/benchmarks.md "Split-K over TMA loads")
    (64, 128, 64, 8, 4, False, False, False),
    (128, 64, 64, 8, 4, False, False, False),
)
# 128x128 on four stages, one warpgroup, halves: a tuner candidate for the large problems
_PERSISTENT_128 = (128, 128, 64, 4, 4, True, False, False)
# The largest tile ``_few_rows_config`` considers: 128x128 on five stages, two warpgroups, halves. On an H200
# (2026-11-28, kernels by graph replay, x the fastest of six rings / warp counts at 5 shapes with 64-120 such tiles,
# K = 2048-12288; docs/benchmarks.md "The few-rows 128x128's ring") 1.025 for the identity and 1.000 for dgelu_bgrad,
# where the four stages on one warpgroup it had ran 1.106 and 1.123 (1536x1024x12288: 1.329 -> 1.230 x cuBLAS) and
# three stages on two (the large problems' ring) 1.415 and 1.352; six stages on one warpgroup 1.001 and 1.032.
_FEW_ROWS_128 = (128, 128, 64, 5, 8, True, False, False)
_PERSISTENT_16 = (
    (128, 256, 64, 3, 8, True, False, False),
    (128, 256, 64, 3, 8, True, False, True),
    (128, 256, 64, 3, 8, 4, False, True),
    (128, 256, 64, 3, 8, 4, False, False),
    (128, 256, 64, 3, 8, True, True, False),
    (128, 256, 64, 4, 8, True, False, False),
    (256, 128, 64, 3, 8, True, False, False),
    (128, 256, 64, 3, 8, False, False, False),
    _PERSISTENT_128,
    (128, 128, 64, 4, 8, False, False, False),
    (128, 128, 128, 3, 8, False, False, False),
    *_FEW_ROWS_16,
)

# Ping-pong on the persistent TMA template (PROGRAMS_PER_SM=2, 128x128x64, 4 warps, 3 stages: two programs co-resident
# per SM, checked by occupancy) is not offered: on the H200 (Triton 3.6) it was 5-24% slower than the configs above at
# 8192x8192x4096 and only on par (dgelu_bgrad) or slower at 8192x4096x1024; its main loop alone is 5-18% slower and
# the epilogues did not hide under it (docs/benchmarks.md). It stays available as a GemmConfig flag.
# Portable (non-persistent) 128x128x64, 3 stages, 4 warps: ~96 KiB of shared memory and one warpgroup, so two
# programs share an SM and the hardware interleaves them: one program's epilogue (loads, math, stores) runs while
# the other's main loop keeps the tensor cores busy ("ping-pong" by occupancy). The persistent TMA kernel runs one
# program per SM, so its epilogue stalls the tensor cores; on Hopper this is the tuner's alternative for heavy
# epilogues and short K loops, where the epilogue is a large share of each tile's time.
_PINGPONG_16 = ((128, 128, 64, 3, 4),)

# The Gluon ping-pong template (gluon_template.py): two consumer warpgroups alternate 128x128 tiles over a 5-deep
# TMA ring (5 x 32 KiB), so one's epilogue runs under the other's main loop. (BM, BN, BK, stages, subtile, PREFETCH
# or None for the rule). H200 run 2 (docs/benchmarks.md, "Gluon ping-pong"): halves with the rule's one-slice-ahead
# prefetch were the fastest config of lincomb_relu / bias_gelu_aux at 8192x4096x1024 (1.38 / 1.35 -> 1.26 x cuBLAS),
# halves without prefetch of colbcast_leaky / rowreduce_tanh / dgelu_bgrad (-6 to -7%); quarters without prefetch
# matched or beat the persistent configs at 8192x8192x4096 on four rows; bce_loss and mixed_dag lost (spills,
# reductions): the tuner decides per epilogue. Halves with the M x N input through the loader (EPI_TMA, 4 stages;
# H200 run 3) were the fastest config of colbcast_leaky / rowreduce_tanh / dgelu_bgrad at 8192x4096x1024 (2-4% below
# the others) and 3% slower than the register prefetch for lincomb_relu: the fourth ping-pong config, ahead of quarters.
# Quarters without prefetch ran mixed_dag 399 -> 220 us once its amax reductions ran as floats (H200, 8192x4096x1024,
# as the tuner times it; halves 210 us, the persistent configs 224-225 us, docs/benchmarks.md): ``for_epilogue``
# drops the EPI_TMA config where the epilogue has no input for it (mixed_dag has two), so quarters is then among the
# first five.
# The epilogue-warpgroup schedule of the same template (flag EPI_WG: 128x256 tiles, the accumulator handed to a
# third warpgroup through shared memory) is not offered: on the H200 it was 6-38% slower than the fastest of these
# configs at 8192x8192x4096 and 12-111% at 8192x4096x1024, the identity included (docs/benchmarks.md, "Epilogue
# warpgroup schedule"). It stays available as a GemmConfig flag.
# The consumers' epilogue as a loop over slices read back from one shared whole-tile buffer (flag EPI_SMEM = 1,
# halves, 4 stages) was the fastest config of mixed_dag at 8192x4096x1024 in three H200 runs (1.87 / 1.82 / 1.85 x
# cuBLAS against 1.98 / 1.95 / 1.99 for ping-pong halves and 2.07 / 2.12 for quarters without prefetch) and slower
# for bce_loss (docs/benchmarks-log.md, "Epilogue loop from shared memory"); it follows the EPI_TMA config, so an
# epilogue without the loader's input (mixed_dag) times it among its first five instead of quarters.
# The same loop on eighths (EPILOGUE_SUBTILE=8, 128x16 slices: ptxas then interleaves the per-element chains that
# it schedules back to back on halves) is not offered: in the last of three H200 runs it was 4-62% slower than the
# best config of every row at 8192x4096x1024 and 1-13% at 8192x8192x4096 (docs/benchmarks.md, "Eighths in the
# epilogue loop").
# Three consumer warpgroups (flag CONSUMERS = 3) are not offered either: on the H200 the loop from shared memory
# leaves room for 3 A/B stages beside its two tile buffers (the identity alone at 1.21-1.35 x cuBLAS) and slices
# from registers spill at 160 registers; only bce_loss at 8192x4096x1024 gained (-3%) (docs/benchmarks.md, "Three
# consumer warpgroups").
# Consumers of two warpgroups (num_warps = 8; quarters, the input through the loader, 4 stages): each scheduler runs
# two warps of a consumer's epilogue and each thread holds 64 accumulator values (112 registers in all). On the
# H200 (2026-11-22, docs/benchmarks-log.md, "Consumers of two warpgroups") this was bce_loss's fastest config at
# 8192x4096x1024 (1.37 x cuBLAS against 1.47 for the best other config) and ran within 1-2% of the best for
# rowreduce_tanh / colbcast_leaky there, but 1-7% slower than the best config of every row at 8192x8192x4096. So
# for short K loops (K <= _SHORT_K, where a tile's epilogue outlasts its main loop) it takes the place of ping-pong
# halves without prefetch in the first five (that config was no row's pick at 8192x4096x1024 in the last bench, and
# three rows' at 8192x8192x4096); for longer K loops it comes after the other ping-pong configs.
# The consumers' epilogue as a runtime loop over slices carried in registers (flag EPI_LOOP) is not offered: on the
# H200 it ran level with or slower than the same config with the slices inlined at 8192x4096x1024, and within the
# run-to-run spread at 8192x8192x4096 (docs/benchmarks-log.md, "Three epilogue schedules that did not pay"); in the
# wgmma layout with the loader's input (the tuner's configs for one-input epilogues) level for rowreduce_tanh and
# dgelu_bgrad and 17% slower for bce_loss at 8192x4096x1024 on an H100 ("The epilogue loop in the wgmma layout").
_SHORT_K = 2048  # between the two measured points, K = 1024 (a win) and K = 4096 (a loss)
# A sixth ring stage for short K loops (ping-pong halves from registers, 6 x 32 KiB: 213 KB of shared memory with
# the layout conversion's scratch). An epilogue's tile stores slow the other consumer's A / B copies (Nsight
# Compute on an H100: its waits for a landed ring slot grew 74% with a second store, docs/benchmarks.md, "The
# epilogues taken apart"); a deeper ring hides part of that. On an H100 at 8192x4096x1024 (same rounds, CUDA-graph
# replay): bias_gelu_aux 1.237 -> 1.165 x cuBLAS, bias_two_stores 1.153 -> 1.097, dgelu_bgrad 1.510 -> 1.473,
# one_input 1.113 -> 1.154; at 8192x8192x4096 slower (bias_gelu_aux 1.035 -> 1.112), so short K loops only.
# ``for_epilogue`` keeps all six stages: where TMA stores an input-less epilogue's outputs, in the wgmma layout on
# slices small enough for the output buffers to fit beside them (``_deep_in_mma_layout``), else in the blocked layout.
DEEP_RING_STAGES = 6
# Ring stages of an EPI_TMA config whose epilogue runs in the wgmma layout (``for_epilogue``): five 32 KiB stages
# beside the two consumers' 64 KiB of input slices, 224 KiB (229,768-230,072 bytes compiled for the bench's
# epilogues, of the Hopper opt-in limit's 232,448: no conversion scratch; ``_fit_stages`` lowers it elsewhere).
# On an H100 (2026-11-27, docs/benchmarks-log.md, "A fifth ring stage beside the loader's input"; CUDA-graph
# replay, 4 rounds) against four stages: at 8192x4096x1024 bce_loss 1.299 -> 1.266 x cuBLAS, rowreduce_tanh
# 1.304 -> 1.247, dgelu_bgrad 1.372 -> 1.312; at 8192x8192x4096 1.099 -> 1.067, 1.108 -> 1.064, 1.123 -> 1.099.
MMA_TMA_STAGES = 5
_PINGPONG_DEEP = (128, 128, 64, DEEP_RING_STAGES, 2, None, False, 0, 4)
# (BM, BN, BK, stages, subtile, PREFETCH or None, EPI_TMA, EPI_SMEM, warps)
_PINGPONG_GLUON_16 = ((128, 128, 64, 5, 2, None, False, 0, 4), (128, 128, 64, 5, 2, 0, False, 0, 4),
                      (128, 128, 64, 4, 2, None, True, 0, 4), (128, 128, 64, 4, 2, None, False, 1, 4),
                      (128, 128, 64, 5, 4, 0, False, 0, 4), (128, 128, 64, 4, 4, None, True, 0, 8))

# The heuristic's configs for a wave or more of 128x128 tiles where ping-pong is allowed: ping-pong halves from
# registers (the first entry above), and for an epilogue with an M x N input the loader can bring, halves with that
# input through the loader (the EPI_TMA entry); ``epilogue_heuristic`` picks between them and adapts the pick as
# ``for_epilogue`` does the tuner's list. Of the candidates the tuner timed in the H200 bench of 2026-11-28 09:20
# (docs/benchmarks.md, "The heuristic without tuning"), these ran within 0-3.3% of the fastest at both issue shapes
# for all eight workloads, the identity included (1.004 / 1.001), where the 128x256 persistent halves kernel the
# heuristic had ran 1.006-1.054 at 8192x8192x4096 and 1.061-1.247 at 8192x4096x1024.
_PINGPONG_HEURISTIC, _PINGPONG_HEURISTIC_TMA = _PINGPONG_GLUON_16[0], _PINGPONG_GLUON_16[2]

# Epilogue-only passes (K = 0: a backward's epilogue over a saved accumulator, ``integration.ops``): no K loop, so
# memory-bound tiles that hold the epilogue's temporaries without spilling, and many programs. (BM, BN, warps),
# BLOCK_K 16, one stage; the first is the heuristic's. A 128x256 tile on 8 warps (what the sized-to-the-problem rule
# gave K = 0, and the tuner's only candidate) ran GELU's backward pass at 8192x4096 in 3.15 ms, 64x64 in 80-83 us
# (H200, 2026-11-28, benchmarks/training_bench.py --profile). Of seven small tiles the tuner timed on the H200
# (benchmarks/results/tuning_k0_h200_20261129.json: GELU's backward at 8192x4096, a plain linear's at 8192x1024),
# these three won or came within 10% of the winner; the four others (64x128, 128x64, 32x128, 128x128 on 8 warps)
# took 1.11-2.81x the fastest, and their compiles and timings a first call's seconds.
_EPILOGUE_ONLY_16 = ((64, 64, 4), (128, 32, 4), (32, 64, 2))

# fp32 without TF32 has no tensor-core path: tl.dot becomes FMA loops whose register use grows with the
# tile. On the H200 run, 128x256 / 128x128 persistent fp32-IEEE kernels spilled 24 to 3052 registers
# (col-major operands worst), so IEEE fp32 keeps tiles at <= 128x64 and never uses persistent_tma.
_IEEE_FP32_MAX_TILE = 128 * 64


def _scale_for_dtype(bm: int, bn: int, bk: int, stages: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """Wider elements: shrink BLOCK_K (same bytes per K step); fp64 also caps the tile (no tensor-core path
    for large tiles; registers hold 8-byte accumulators)."""
    if dtype == torch.float32:
        bk = max(16, bk // 2)
    elif dtype == torch.float64:
        bm, bn, bk = min(bm, 64), min(bn, 64), max(16, bk // 4)
        stages = min(stages, 3)
    return bm, bn, bk, stages


def _portable_space(dtype: torch.dtype, template: str) -> list[GemmConfig]:
    base = _SPLITK_16 if template == "splitk" else _PORTABLE_16
    out = []
    for bm, bn, bk, stages, warps in base:
        bm, bn, bk, stages = _scale_for_dtype(bm, bn, bk, stages, dtype)
        if dtype == torch.float64 and warps > 4:
            warps = 4
        out.append(GemmConfig(template, bm, bn, bk, 8, 1, warps, stages))
    return out


def _persistent_space(dtype: torch.dtype, table=_PERSISTENT_16) -> list[GemmConfig]:
    out = []
    for bm, bn, bk, stages, warps, subtile, ws, flat in table:
        bm, bn, bk, stages = _scale_for_dtype(bm, bn, bk, stages, dtype)
        extra = (("EPILOGUE_SUBTILE", subtile), ("FLATTEN", flat), ("WARP_SPECIALIZE", ws))
        out.append(GemmConfig("persistent_tma", bm, bn, bk, 8, 1, warps, stages, extra))
    return out


def _persistent_heuristic(N: int, dtype: torch.dtype, info: DeviceInfo) -> GemmConfig:
    """persistent_tma on 128x256 tiles (128x128 where N < 256), 3 stages, 8 warps, halves (fp32: BLOCK_K 32)."""
    bm, bn, bk, stages = _scale_for_dtype(128, 256 if N >= 256 else 128, 64, 3, dtype)
    cfg = GemmConfig("persistent_tma", bm, bn, bk, 8, 1, 8, stages, (("EPILOGUE_SUBTILE", True),))
    return _fit_stages(cfg, dtype, info)


def _pingpong_heuristic(dtype: torch.dtype, info: DeviceInfo) -> GemmConfig:
    """The heuristic's ping-pong halves (``_PINGPONG_HEURISTIC``) as they fit ``info``'s shared memory."""
    return _fit_stages(_gluon_config(_PINGPONG_HEURISTIC), dtype, info)


def _gluon_config(entry: tuple) -> GemmConfig:
    """A ping-pong config of ``_PINGPONG_GLUON_16``'s form (BM, BN, BK, stages, subtile, PREFETCH or None, EPI_TMA,
    EPI_SMEM, warps)."""
    bm, bn, bk, stages, sub, pf, tma, smem, warps = entry
    return GemmConfig("pingpong", bm, bn, bk, 8, 1, warps, stages,
                      (("EPILOGUE_SUBTILE", sub), ("EPI_TMA", tma), ("EPI_SMEM", smem))
                      + ((("PREFETCH", pf),) if pf is not None else ()))


def _epilogue_only_space(dtype: torch.dtype) -> list[GemmConfig]:
    """The tiles of epilogue-only passes (K = 0, ``_EPILOGUE_ONLY_16``), heuristic first; fp64 capped at 64x64."""
    out = []
    for bm, bn, warps in _EPILOGUE_ONLY_16:
        if dtype == torch.float64 and bm * bn > 64 * 64:
            continue
        out.append(GemmConfig("portable", bm, bn, 16, 8, 1, warps, 1))
    return out


def pingpong_allowed(dtype: torch.dtype, info: DeviceInfo, tma_ok: bool) -> bool:
    """The Gluon ping-pong template (``gluon_template``) is offered on Hopper for TMA-able fp16/bf16 operands when
    the installed Triton has Gluon's Hopper API; the launcher still falls back to persistent_tma for layouts it
    does not take (column-major A, batched operands: ``gemm_launch.resolve_config``)."""
    from .gluon_template import available

    return tma_ok and info.is_hopper and DTYPE_BYTES.get(dtype) == 2 and available()


def tma_template_allowed(dtype: torch.dtype, info: DeviceInfo, tma_ok: bool, allow_tf32: bool = False) -> bool:
    """persistent_tma is offered only on Hopper (capability 9.x), for fp16/bf16 operands, or fp32 with TF32
    allowed (its value is feeding wgmma; IEEE fp32 runs on FMA units and spills), whose layout passed the
    TMA checks (``gemm_launch.tma_eligible``)."""
    if dtype == torch.float32 and not allow_tf32:
        return False
    return tma_ok and info.is_hopper and dtype in TMA_DTYPES


def _few_rows_space(M: int, N: int, L: int, dtype: torch.dtype, info: DeviceInfo, tma_ok: bool,
                    allow_tf32: bool) -> set[GemmConfig]:
    """The few-rows TMA tiles (``_FEW_ROWS_16`` as the dtype scales them) where the problem has fewer than a wave
    of 128x128 tiles and the TMA template is allowed; empty otherwise (a large problem's list does not move)."""
    if not tma_template_allowed(dtype, info, tma_ok, allow_tf32) or tiles_128(M, N, L) >= info.num_sms:
        return set()
    return set(_persistent_space(dtype, _FEW_ROWS_16))


def _few_rows_config(M: int, N: int, K: int, L: int, dtype: torch.dtype, info: DeviceInfo, tma_ok: bool,
                     allow_tf32: bool) -> tuple[GemmConfig, bool] | None:
    """The heuristic's persistent_tma config for a problem with fewer than a wave of 128x128 tiles but at least 64
    rows and columns, and whether its tiles fill three quarters of the SMs: the largest tile not taller or wider
    than the problem (64x14336x4096: 64x128, not 128x128 with half its rows empty) that does, or a larger one
    whose busiest SM does no more work (``_busiest_turn``: 768x768 takes 64x128, not 144 tiles of 64x64), of 128x128
    on five stages and two warpgroups (``_FEW_ROWS_128``; on four stages and one it ran 1.00 x cuBLAS at
    128x14336x4096, 112 tiles, against 1.09 for 128x64, H100), 128x64 or 64x128 on eight and 64x64x128 on six
    (``_FEW_ROWS_16``), else 64x64x128 (64x4096x4096: 64 tiles, 1.10-1.13 x cuBLAS against
    1.23 for the portable pick). None where the TMA template is not allowed, the problem is narrower than 64, has
    a wave of 128x128 tiles or a K too short for any of these tiles' K steps."""
    if not tma_template_allowed(dtype, info, tma_ok, allow_tf32) or min(M, N) < 64:
        return None
    if tiles_128(M, N, L) >= info.num_sms:
        return None
    table = (_FEW_ROWS_128,) + _FEW_ROWS_16
    space = sorted(_persistent_space(dtype, table), key=lambda c: -c.BLOCK_M * c.BLOCK_N)  # larger first
    space = [c for c in space if fits_shape(c, M, N, K)]  # no rows, columns or K steps of MMA work wasted
    if not space:  # (K <= 32: the portable heuristic's tile)
        return None
    for i, cfg in enumerate(space):
        if _fills_gpu(cfg, M, N, L, info):
            # a larger tile that does as much in each SM's busiest turn (wave quantisation) does it faster
            turn = _busiest_turn(cfg, M, N, L, info)
            larger = next((c for c in space[:i] if _busiest_turn(c, M, N, L, info) <= turn), cfg)
            return _fit_stages(larger, dtype, info), True
    return _fit_stages(space[-1], dtype, info), False


def _busiest_turn(config: GemmConfig, M: int, N: int, L: int, info: DeviceInfo) -> int:
    """The output elements the busiest SM works through: a persistent grid of ``min(tiles, SMs)`` programs gives
    some programs ``cdiv(tiles, SMs)`` tiles. 768x768 has 144 tiles of 64x64 (three quarters of 132 SMs, so they
    "fill" it) but twelve SMs run two, as long as the 72 tiles of 64x128 take each on one SM, and the larger tile
    runs its FLOPs faster (one m64n128 wgmma a K step instead of two m64n64): at 768x768x16384 64x128 on eight
    stages ran 1.371 x cuBLAS against 1.798 for 64x64x128 on six (H200, identity, kernels;
    docs/benchmarks.md "Split-K's threshold")."""
    tiles = config.tiles(M, N, L)
    return cdiv(tiles, info.num_sms * config.programs_per_sm) * config.BLOCK_M * config.BLOCK_N


def _fits_precision(config: GemmConfig, dtype: torch.dtype, allow_tf32: bool) -> bool:
    if dtype == torch.float32 and not allow_tf32:
        return config.template == "portable" and config.BLOCK_M * config.BLOCK_N <= _IEEE_FP32_MAX_TILE
    return True


def _dedupe(configs: list[GemmConfig]) -> list[GemmConfig]:
    seen: set[GemmConfig] = set()
    out = []
    for cfg in configs:
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


def candidate_configs(
    M: int,
    N: int,
    K: int,
    dtype: torch.dtype,
    device: torch.device | str | int | None = None,
    *,
    L: int = 1,
    tma_ok: bool = False,
    allow_tf32: bool = False,
    max_candidates: int = 16,
) -> list[GemmConfig]:
    """Pruned candidate list for autotuning, heuristic config first, at most ``max_candidates`` long.

    Pruning: shared memory (operand stages vs the device limit), problem shape (no tiles far larger than
    M/N/K), split-K only when tiles are few vs SMs and K is long, persistent_tma only on Hopper with TMA-able
    operands, small tiles for fp32 without TF32. On the interpreter or CPU the single small interpreter
    config is returned.
    """
    check_sizes(M, N, K, L)
    elem_bytes(dtype)
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
    info = device_info(device)
    if info.kind != "cuda":
        return [interpreter_config(M, N, K)]
    if K == 0:
        return _epilogue_only_space(dtype)[:max_candidates]
    heuristic = heuristic_config(M, N, K, dtype, device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)
    space: list[GemmConfig] = []
    if tma_template_allowed(dtype, info, tma_ok, allow_tf32):
        persistent = _persistent_space(dtype)
        pingpong = [GemmConfig("portable", bm, bn, bk, 8, 1, warps, stages)
                    for bm, bn, bk, stages, warps in _PINGPONG_16] if DTYPE_BYTES[dtype] == 2 else []
        if pingpong_allowed(dtype, info, tma_ok):
            gluon = [_gluon_config(e) for e in _PINGPONG_GLUON_16 + (_PINGPONG_DEEP,)]
            # five candidates (the bench's default): halves, ping-pong halves with / without prefetch (short K:
            # two-warpgroup consumers instead), quarters + flatten, ping-pong halves with the input through the
            # loader (the EPI_TMA configs are dropped by ``for_epilogue`` where the epilogue has no such input);
            # then ping-pong halves looped from shared memory, ping-pong quarters
            wide, deep = gluon[5:6], gluon[6:]
            if K <= _SHORT_K:  # the deep ring right after the halves it deepens
                gluon = gluon[:1] + deep + wide + gluon[2:5] + gluon[1:2]
            else:
                gluon = gluon[:5] + wide
            space += persistent[:1] + gluon[:2] + persistent[2:3] + gluon[2:] + persistent[1:2] + persistent[3:]
            space += pingpong
        else:
            space += persistent[:2] + pingpong + persistent[2:]
    if splitk_tma_worthwhile(M, N, K, L, dtype, info, tma_ok, allow_tf32):
        space += _splitk_tma_space(M, N, K, L, dtype, info)
    if splitk_worthwhile(M, N, K, L, info):
        for cfg in _portable_space(dtype, "splitk"):
            split = choose_split_k(M, N, K, L, cfg, info)
            space.append(GemmConfig("splitk", cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.GROUP_M, split,
                                    cfg.num_warps, cfg.num_stages))
    space += _portable_space(dtype, "portable")
    kept = [c for c in space
            if fits_smem(c, dtype, info) and fits_registers(c) and fits_shape(c, M, N, K)
            and _fits_precision(c, dtype, allow_tf32)]
    # configs whose tiles fill at least 3/4 of the SMs first (stable: for large problems nothing moves), so that a
    # short tuning list for a small problem is not spent on tiles that leave most of the GPU idle; with fewer than
    # a wave of 128x128 tiles the few-rows TMA tiles come first whether they fill or not: at 256x1024x8192 64x64x128
    # on 64 tiles ran 1.21 x cuBLAS (H100) where the tuner, which never timed it behind eleven split-K and small
    # portable tiles that fill, picked split-K at 1.39
    few = _few_rows_space(M, N, L, dtype, info, tma_ok, allow_tf32)
    kept.sort(key=lambda c: (c not in few, not _fills_gpu(c, M, N, L, info)))
    return _dedupe([heuristic] + kept)[:max_candidates]


def for_epilogue(candidates: list[GemmConfig], *, tma_input: bool, tile_stores: bool = True, tma_outputs: int = 0,
                 tile_inputs: int = 0, reductions: bool = False, dtype: torch.dtype = torch.float16,
                 info: DeviceInfo | None = None) -> list[GemmConfig]:
    """``candidates`` as this epilogue can use them (``info``: the device whose shared memory they must fit; None:
    a Hopper GPU's, the only devices whose candidate lists hold the configs this changes).

    - EPI_TMA needs the epilogue's one 16-bit M x N input (``EpilogueCode.tma_input``). With it, such a config runs
      in the accumulator's wgmma layout (EPI_MMA: no layout conversion through shared memory) where the epilogue
      stores no M x N tile (``tile_stores`` False: losses, reductions, vector outputs) or stores its ``tma_outputs``
      tile outputs by TMA (TMA_STORE): its only M x N traffic then goes through TMA.
    - Without that input, an epilogue with no M x N input (``tile_inputs`` 0) whose tile outputs TMA can store runs
      the EPI_TMA configs as EPI_MMA + TMA_STORE instead, and so does every other ping-pong config from registers;
      otherwise an EPI_TMA config would run as the ping-pong halves before it at one stage fewer, a near-copy that
      would spend a tuning slot, so it is dropped and the next candidate moves up (mixed_dag, with two inputs:
      ping-pong quarters without prefetch). The deep-ring config (DEEP_RING_STAGES) keeps its sixth stage: in the
      wgmma layout on the fewest slices whose output buffers fit beside it (``_deep_in_mma_layout``), else as it is.
    - An epilogue with no M x N input has nothing to prefetch: its configs drop PREFETCH, so a config and its
      PREFETCH=0 twin (the same kernel: bias_gelu_aux's ping-pong halves were timed twice) take one tuning slot,
      and the next distinct candidate moves up.
    - An epilogue that reduces (``reductions``: row, column or scalar sums / extrema) drops the persistent
      template's flattened tile loop on halves, the one config that runs it several times slower: on an H100
      (2026-11-26, docs/benchmarks.md "H100 runs of 2026-11-26"; the bench's own measurement of every candidate)
      dgelu_bgrad 2.37 ms against 0.94-0.98 for the other 128x256 persistent configs at 8192x8192x4096 and 0.37
      against 0.18-0.20 at 8192x4096x1024, rowreduce_tanh 0.47 against 0.17-0.19 there, bce_loss 1.08 against
      0.91-0.98 and 0.19 against 0.16-0.18; never picked, it only spent a tuning slot. Quarters with the same
      loop, and halves without it, are unaffected, and epilogues without reductions keep it (bias_gelu_aux 0.885
      ms, level with the rest).
    - A config whose added buffers do not fit in shared memory loses stages (``_fit_stages``).

    Measured on the H200 (docs/benchmarks-log.md, "Tile outputs stored by TMA"; "The epilogue in the wgmma layout"):
    bce_loss 1.41 -> 1.33 x cuBLAS with EPI_MMA; with EPI_MMA + TMA_STORE at 8192x4096x1024 rowreduce_tanh 1.31 ->
    1.24, dgelu_bgrad 1.50 -> 1.42, bias_gelu_aux 1.28 -> 1.23, colbcast_leaky and lincomb_relu level. An epilogue
    loading M x N inputs itself loses in the wgmma layout (4-byte loads: mixed_dag 2.00 -> 2.04-2.62), so its other
    configs keep the blocked layout."""
    info = HOPPER if info is None or info.kind != "cuda" else info
    stored = tma_outputs if tile_stores else 0
    mma_ok = not tile_stores or stored > 0

    def converted(c: GemmConfig, *, keep_tma: bool, fit: bool = True) -> GemmConfig | None:
        """``c`` in the wgmma layout (TMA-stored outputs where the epilogue has them), with ``fit`` its stages
        cut to fit ``info``'s shared memory; None where even two stages do not fit beside its buffers (an
        epilogue with many TMA-stored outputs: six halves' buffers alone take 192 KiB)."""
        extra = {k: v for k, v in c.extra if keep_tma or k != "EPI_TMA"}
        extra.update(EPI_MMA=True, **({"TMA_STORE": stored} if stored else {}))
        # the wgmma layout needs no conversion scratch, which leaves room for a fifth ring stage beside the
        # loader's input slices (MMA_TMA_STAGES)
        stages = max(c.num_stages, MMA_TMA_STAGES) if keep_tma else c.num_stages
        c = dataclasses.replace(c, extra=tuple(extra.items()), num_stages=stages)
        if not fit:
            return c
        c = _fit_stages(c, dtype, info)
        return c if fits_smem(c, dtype, info) else None

    no_inputs = tile_inputs == 0 and not tma_input
    out = []
    for c in candidates:
        if reductions and c.template == "persistent_tma" and c.flag("FLATTEN") and c.epilogue_subtiles == 2:
            continue
        if no_inputs and "PREFETCH" in dict(c.extra):  # nothing to prefetch: the rule's config
            c = dataclasses.replace(c, extra=tuple(x for x in c.extra if x[0] != "PREFETCH"))
        from_registers = c.template == "pingpong" and consumers_from_registers(dict(c.extra))
        # a conversion that does not fit leaves the config as it was (a from-registers config, or an EPI_TMA one
        # with its input) or drops it (an EPI_TMA config without that input would run as a near-copy of halves)
        if c.flag("EPI_TMA"):
            if tma_input:
                out.append((converted(c, keep_tma=True) or c) if mma_ok else c)
            elif tile_inputs == 0 and stored:
                out.append(converted(c, keep_tma=False))
        elif from_registers and tile_inputs == 0 and stored and c.num_stages < DEEP_RING_STAGES:
            out.append(converted(c, keep_tma=False) or c)
        elif from_registers and tile_inputs == 0 and stored:
            out.append(_deep_in_mma_layout(converted(c, keep_tma=False, fit=False), c, dtype, info))
        else:
            out.append(c)
    return _dedupe([c for c in out if c is not None])


def epilogue_heuristic(heuristic: GemmConfig, N: int, K: int, *, dtype: torch.dtype, info: DeviceInfo | None = None,
                       tile_ops: int = 1, **traits) -> GemmConfig:
    """``heuristic`` (``heuristic_config``'s for a problem with ``N`` columns and a K of ``K``) as an epilogue with
    ``traits`` (``for_epilogue``'s keywords) runs it: the config an untuned call
    launches, adapted as the tuner's list is. The ping-pong halves heuristic (``heuristic_choice``) takes the
    epilogue's M x N input through the loader where it has one the loader can bring (``tma_input``: lincomb_relu,
    rowreduce_tanh, bce_loss, dgelu_bgrad), and runs in the wgmma layout with TMA-stored outputs where it has no
    input (the identity, bias_gelu_aux); with inputs the loader cannot bring (mixed_dag's two) it stays as it is.
    An epilogue that only stores the accumulator (no M x N operation but casts, ``tile_ops`` 0, no inputs, no
    reductions) runs the persistent 128x256 kernel instead where K >= _SHORT_K: with nothing to overlap but the
    store, the larger tile's main loop wins (H200, 2026-11-28, kernels x cuBLAS, ping-pong / 128x256: 4096^3
    1.164 / 1.099, 2048^3 1.096 / 1.050, 8192x8192x4096 1.038 / 1.043; at 8192x4096x1024 1.038 / 1.133)."""
    info = HOPPER if info is None or info.kind != "cuda" else info
    if heuristic == _pingpong_heuristic(dtype, info):
        store_only = (tile_ops == 0 and not traits.get("tma_input") and not traits.get("tile_inputs")
                      and not traits.get("reductions"))
        if store_only and K >= _SHORT_K:
            heuristic = _persistent_heuristic(N, dtype, info)
        elif traits.get("tma_input"):
            heuristic = _gluon_config(_PINGPONG_HEURISTIC_TMA)
    adapted = for_epilogue([heuristic], dtype=dtype, info=info, **traits)
    return adapted[0] if adapted else heuristic


def _deep_in_mma_layout(mma: GemmConfig, deep: GemmConfig, dtype: torch.dtype, info: DeviceInfo) -> GemmConfig:
    """The deep ring (``deep``: DEEP_RING_STAGES, from registers) as ``mma`` runs it, in the wgmma layout with its
    tile outputs stored by TMA, on the fewest slices (at most quarters) whose output buffers fit beside all of its
    stages: the layout's 2 KiB of headroom leaves 32 KiB beside six 32 KiB stages, one output's halves or two
    outputs' quarters (229,656 and 229,688 bytes compiled for sm_90). Where even quarters do not fit, ``deep``
    itself: its stage is what it is for. On an H100 at 8192x4096x1024 (2026-11-27, docs/benchmarks-log.md, "The
    deep ring in the wgmma layout"; CUDA-graph replay, 4 rounds) the identity 1.028 -> 1.005 x cuBLAS on halves
    and bias_gelu_aux 1.212 -> 1.172 on quarters, against the deep ring in the blocked layout."""
    cfg = mma
    while not fits_smem(cfg, dtype, info) and cfg.epilogue_subtiles < 4:
        extra = dict(cfg.extra, EPILOGUE_SUBTILE=2 * cfg.epilogue_subtiles)
        cfg = dataclasses.replace(cfg, extra=tuple(extra.items()))
    return cfg if fits_smem(cfg, dtype, info) else deep


def _fills(config: GemmConfig, M: int, N: int, L: int, info: DeviceInfo, share: Fraction) -> bool:
    """Whether ``config``'s programs (tiles times splits) occupy ``share`` of the device's program slots."""
    programs = config.tiles(M, N, L) * max(config.SPLIT_K, 1)
    return programs >= share * info.num_sms * config.programs_per_sm


def _fills_gpu(config: GemmConfig, M: int, N: int, L: int, info: DeviceInfo) -> bool:
    return _fills(config, M, N, L, info, Fraction(3, 4))


# Below this share of the SMs a few-rows tile's K loop is worth splitting; above it the tile unsplit wins. On an
# H100 through ``evt.gemm`` (docs/benchmarks.md "Few rows"; identity / dgelu_bgrad, x cuBLAS): on 16 tiles of 64x64
# (64x1024x8192, 128x512x16384, 256x256x16384) split-K over 16x64x128 ran 1.19-1.43 / 1.39-1.63 against
# 1.40-1.97 / 1.61-2.15 unsplit; on 32 (128x1024x8192, 256x512x8192) 64x64x128 unsplit ran 1.34-1.45 / 1.52-1.72
# against 1.44-1.75 / 1.61-1.95 for the heuristic's split-K; on 64 (256x1024x8192, 512x512x8192, 128x2048x8192)
# 1.16-1.22 / 1.31-1.43 against 2.46-2.58 for the heuristic's split-K then. Between them, on an H200 (2026-11-28,
# identity): on 24 tiles 64x1536x8192 split 4 ways ran 1.224 against 1.327 unsplit, 128x768x8192 1.552 against
# 1.580; on 20, 128x640x8192, 1.548 against 1.541. So a fifth (26 tiles on 132 SMs): 24 split, 32 not.
SPLIT_BELOW_SHARE = Fraction(1, 5)


def _fit_stages(config: GemmConfig, dtype: torch.dtype, info: DeviceInfo) -> GemmConfig:
    """Lower num_stages (then BLOCK_K) until the operand buffers fit in shared memory; the result may still not
    fit (callers that can drop a config check ``fits_smem``). A ping-pong config keeps BLOCK_K = 64 (its TMA tiles
    are 128-byte swizzled), so it loses stages only."""
    cfg = config
    min_k = 64 if cfg.template == "pingpong" else 16
    while not fits_smem(cfg, dtype, info):
        if cfg.num_stages > 2:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.BLOCK_K > min_k:
            cfg = dataclasses.replace(cfg, BLOCK_K=cfg.BLOCK_K // 2)
        else:
            break
    return cfg


def heuristic_config(
    M: int,
    N: int,
    K: int,
    dtype: torch.dtype,
    device: torch.device | str | int | None = None,
    *,
    L: int = 1,
    tma_ok: bool = False,
    allow_tf32: bool = False,
    pingpong_ok: bool = True,
) -> GemmConfig:
    """A good single config without tuning. ``pingpong_ok``: the operands' layout is one the ping-pong kernel takes
    (``gemm_launch.pingpong_eligible``: not a column-major A; batched operands never are), which the runtime knows
    and the shape does not.

    - interpreter / CPU: small portable tiles (``interpreter_config``);
    - an epilogue-only pass (K = 0): small one-stage portable tiles (``_EPILOGUE_ONLY_16``);
    - Hopper, TMA-able fp16/bf16 operands, Gluon's Hopper API and at least one wave of 128x128 tiles: ping-pong
      halves on five stages, which the runtime adapts to the epilogue (``epilogue_heuristic``: the loader's input,
      TMA-stored outputs; the persistent kernel below for a store-only epilogue at K >= 2048);
    - the same without Gluon, or fp32 with ``allow_tf32``: persistent_tma 128x256x64 (fp32: BK 32), 3 stages, 8
      warps, epilogue sub-tiling: 98% of
      torch.matmul (cuBLAS) on an H200 at 4096^3 and 8192x8192x4096 bf16 (690 / 668 TFLOP/s vs 703 / 684);
      the flatten / warp_specialize variants were within run-to-run noise (~2%) and are left to the tuner;
    - the same operands with 16 or more 128x128 tiles but less than a wave, at least 64 rows and columns and a
      long K (``splitk_tma_worthwhile``: weight gradients, K = tokens): split-K over TMA loads on the large
      problems' main loops (``splitk_tma_heuristic``: 128x128 or 128x256 tiles, up to one wave of splits) where
      the cost model (``cost_steps``) puts it ahead of the unsplit few-rows tile below. On an H200 (kernels, x
      cuBLAS; docs/benchmarks.md "Split-K's cost model") 768x768x8192 0.98 (1.13 unsplit), 512x512x16384 1.16
      (1.65), 1280x1024x12288 1.23 (1.56), 768x768x49152 1.01, 1024x1024x16384 1.04;
    - the same operands with fewer tiles, but at least 64 rows and columns: persistent_tma on the largest tile
      that fills the GPU, down to 64x64x128 on six stages (``_few_rows_config``);
    - fewer tiles than that (less than ``SPLIT_BELOW_SHARE`` of the SMs) and a long K: split-K over 16x64x128
      tiles, the split that brings the programs to three quarters of what the SMs hold at once
      (``resident_split_k``): fewer, longer splits than 64x64 tiles need for as many programs, so a quarter of
      the partials to write and sum. On an H100 through ``evt.gemm`` (docs/benchmarks.md, "Few rows"):
      1.166 / 1.300 x cuBLAS at 64x1024x8192 / 128x512x16384 (split 4), where 64x64 tiles took 1.64-1.70 on 8
      splits and 1.90-2.05 on the 16 they were given here before; at 256x256x16384 the tuner timed it 1.45
      against 2.00 for 64x64 on 16 splits;
    - too few tiles for any of those to fill the GPU, at least 64 rows and columns: 64x64x128 on six stages
      (1.18-1.45 x cuBLAS on 32-64 tiles with K = 8192, where the split-K above ran 1.44-2.59);
    - otherwise portable tiles sized to the problem: on Hopper 16-bit up to 128x256x64 (627 TFLOP/s at
      8192x8192x4096 bf16 vs 459 for 128x128x32), elsewhere up to 128x128x32 with 4 stages; fp32 without
      TF32 (FMA path) at most 64x64; fp64 at most 64x64.
    """
    return heuristic_choice(M, N, K, dtype, device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32,
                            pingpong_ok=pingpong_ok)[0]


def heuristic_choice(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device | str | int | None = None,
                     *, L: int = 1, tma_ok: bool = False, allow_tf32: bool = False,
                     pingpong_ok: bool = True) -> tuple[GemmConfig, str]:
    """``heuristic_config``'s pick and the rule that made it, in words (``evtorch configs`` prints it)."""
    check_sizes(M, N, K, L)
    elem_bytes(dtype)
    info = device_info(device)
    if info.kind != "cuda":
        return interpreter_config(M, N, K), "the interpreter: small portable tiles"
    L = max(L, 1)
    if K == 0:
        return _epilogue_only_space(dtype)[0], "an epilogue-only pass (K = 0): small memory-bound tiles"
    # where the launcher would run ping-pong as the persistent kernel on its 128x128 tile (batched operands, a
    # column-major A: ``gemm_launch.resolve_config``), the 128x256 persistent kernel below instead
    if pingpong_ok and L == 1 and pingpong_allowed(dtype, info, tma_ok) and tiles_128(M, N, L) >= info.num_sms:
        return (_pingpong_heuristic(dtype, info),
                "a wave or more of 128x128 tiles: the ping-pong kernel on halves (an epilogue's M x N input through "
                "the loader)")
    if tma_template_allowed(dtype, info, tma_ok, allow_tf32) and tiles_128(M, N, L) >= info.num_sms:
        return _persistent_heuristic(N, dtype, info), "a wave or more of 128x128 tiles: the persistent TMA kernel"
    few_rows = _few_rows_config(M, N, K, L, dtype, info, tma_ok, allow_tf32)
    if few_rows is not None and tiles_128(M, N, L) >= 16 \
            and splitk_tma_worthwhile(M, N, K, L, dtype, info, tma_ok, allow_tf32):
        split = splitk_tma_heuristic(M, N, K, L, dtype, info)
        if split is not None:
            split_cost, unsplit_cost = (cost_steps(c, M, N, K, L, dtype, info) for c in (split, few_rows[0]))
            if split_cost < unsplit_cost:
                return split, (f"16+ 128x128 tiles below a wave and a long K: split-K over TMA loads, "
                               f"{split.BLOCK_M}x{split.BLOCK_N} tiles on {split.SPLIT_K} splits of "
                               f"{K // split.SPLIT_K}; the cost model's {split_cost:.0f} steps against "
                               f"{unsplit_cost:.0f} for the unsplit {few_rows[0].BLOCK_M}x{few_rows[0].BLOCK_N}")
    if few_rows is not None and few_rows[1]:
        return few_rows[0], "fewer than a wave of 128x128 tiles: the largest TMA tile that fills the SMs"
    few_fill = few_rows is not None and _fills(few_rows[0], M, N, L, info, SPLIT_BELOW_SHARE)
    if splitk_worthwhile(M, N, K, L, info) and not few_fill:
        bm, bn, bk, stages = _scale_for_dtype(16, 64, 128, 4, dtype)
        base = GemmConfig("splitk", bm, bn, bk, 8, 1, 4, stages)
        split = resident_split_k(M, N, K, L, base, dtype, info)
        return (_fit_stages(GemmConfig("splitk", bm, bn, bk, 8, split, 4, stages), dtype, info),
                f"too few tiles for a fifth of the SMs and a long K: split-K over 16-row tiles, {split} splits")
    if few_rows is not None:
        why = ("the smallest fills a fifth of the SMs or more" if few_fill else "K too short to split")
        return few_rows[0], f"too few TMA tiles to fill three quarters of the SMs, {why}: the smallest TMA tile"
    ieee_fp32 = dtype == torch.float32 and not allow_tf32
    cap_m, cap_n = (64, 64) if ieee_fp32 else (128, 128)
    if info.is_hopper and DTYPE_BYTES[dtype] == 2:
        cap_n = 256
    bm = min(cap_m, max(16, next_pow2(M)))
    bn = min(cap_n, max(16, next_pow2(N)))
    # small problems: halve the tile (the longer side first) down to 64 until about a wave of programs fills the
    # SMs (1024^3 bf16 on 132 SMs: 32 tiles of 128x256, 128 of 64x128)
    while 4 * cdiv(M, bm) * cdiv(N, bn) * L < 3 * info.num_sms and max(bm, bn) > 64:
        if bn >= bm:
            bn //= 2
        else:
            bm //= 2
    if bm * bn >= 128 * 256:
        bk, stages, warps = 64, 3, 8
    elif bm * bn >= 128 * 128:
        bk, stages, warps = 32, 4, 4
    else:
        bk, stages, warps = (32 if ieee_fp32 else 64), 3, (4 if bm * bn >= 64 * 64 else 2)
    bk = min(bk, max(16, next_pow2(K)))
    if not ieee_fp32:
        bm, bn, bk, stages = _scale_for_dtype(bm, bn, bk, stages, dtype)
    else:
        bk = min(bk, 32)
    return (_fit_stages(GemmConfig("portable", bm, bn, bk, 8, 1, warps, stages), dtype, info),
            "portable tiles sized to the problem (" + (
                "under 64 rows or columns, or a K too short for the TMA tiles"
                if tma_template_allowed(dtype, info, tma_ok, allow_tf32)
                else "no TMA template for these operands or this device") + ")")
