"""Gluon source text for the Hopper ping-pong GEMM: one epilogue overlaps the other consumer's main loop.

Why a second language: the persistent TMA template (``gemm_template.persistent_tma``) runs the epilogue after
the main loop in the same warps, so the tensor cores idle while it runs (docs/benchmarks.md measures 4-20 us per
wave of 132 tiles). Triton's SPMD model cannot give two warpgroups of one program different tiles; Gluon (Triton's
explicit-layout dialect, ``triton.experimental.gluon``, in both Triton 3.6 and 3.9) can, through
``gl.warp_specialize``. This is CUTLASS's "ping-pong" schedule:

- a **loader** partition (1 warp) walks the program's tiles in order and fills a STAGES-deep ring of A/B shared
  memory buffers with TMA copies (``ready`` barriers: bytes arrived; ``empty`` barriers: slot consumed);
- two **consumer** partitions (one warpgroup each) take alternate tiles (consumer c: the program's tiles
  ``2j + c``); each runs wgmma over the ring into its own [BLOCK_M, BLOCK_N] register accumulator and then the
  generated epilogue on it;
- a **turn** barrier pair orders the consumers' main loops: consumer c starts its main loop only after the other
  finished its previous one, so the main loops run back to back at the full tensor-core rate and each epilogue
  runs while the other consumer's main loop keeps the tensor cores busy.

The epilogue is the same ``@triton.jit`` function the other templates call (Gluon calls Triton functions, and
every broadcast, load, store, reduction and atomic in it takes the layout of the tensors it is given). With
EPILOGUE_SUBTILE = S the accumulator is split into S [BLOCK_M, BLOCK_N/S] slices (``pid_n`` = S * pid_n + s), as
in the persistent template, so the epilogue's temporaries fit the registers left beside the accumulator; each
slice is moved from the wgmma layout (pairs of columns over 8 rows per thread: 4-byte accesses) to a blocked
layout of 8 consecutive columns per thread, with ``offs_m`` / ``offs_n`` in its slice layouts, so the epilogue's
loads and stores are 16-byte vectors (H200 run 1 -> 2: lincomb_relu 1.86 -> 1.55 x cuBLAS at 8192x4096x1024).
With PREFETCH = 1 the M x N inputs of slice 0 are loaded before the consumer's main loop and those of slice s + 1
before slice s runs (the emitter's ``epilogue_prefetch`` / ``epilogue_pf`` pair). With EPI_TMA the loader also
copies the epilogue's one M x N input by TMA into shared memory, half way through each tile's K steps (two slot
sets of S slice buffers, one per consumer: consumer c's tiles always use set c), and the consumer reads each slice
from there (H200 run 3: -2 to -4% on three of four one-input workloads at 8192x4096x1024). With EPI_SMEM the
consumer stores its accumulator's slices into shared memory and runs the epilogue as one runtime loop over them
(``_epi_smem_loop``): one slice's epilogue code per consumer instead of one per slice. It removed the
instruction-fetch stalls of long epilogues but added the round trip and, with one buffer for both consumers,
serialized their epilogues: faster for mixed_dag (-5 to -7% at 8192x4096x1024), slower for bce_loss
(docs/benchmarks-log.md, "Epilogue loop from shared memory").

A second schedule in the same kernel, **EPI_WG = R** (the "epilogue warpgroup"): two MMA warpgroups
(``_mma``, 8 warps) run the main loop of every 128 x 256 tile of the program and issue their own TMA copies
(``_issue``, STAGES - 1 K steps ahead, across tile boundaries); at the end of a tile they split the accumulator
into EPILOGUE_SUBTILE slices and store each into the next of R fp32 shared-memory buffers (``acc_ready`` /
``acc_empty`` barriers); the default partition (``_epi``, one warpgroup) reads each slice back in the epilogue's
layout, frees its buffer and runs the epilogue. It keeps the persistent template's 128 x 256 tile (the ping-pong
kernel's 128 x 128 tiles move 1.4x the L2 bytes) and still overlaps the epilogue. No separate loader warp: 16
warps would cap every thread at 128 registers, too few for the m64n256 main loop (ptxas compiles the whole kernel
under the launch cap). Measured on the H200 (docs/benchmarks-log.md, "Epilogue warpgroup schedule"): 6-38% slower
than the other templates at 8192x8192x4096 and 12-111% at 8192x4096x1024, so the tuner does not offer it; it
stays a config flag.

Scope: 16-bit operands (wgmma from shared memory), row-major A, row- or column-major B, no batch (L == 1), K > 0;
elsewhere the launcher runs a ping-pong config as persistent_tma (``gemm_launch.resolve_config``), and the tuner
offers it only on Hopper (``policy.pingpong_allowed``). Register budget: 12 warps (two consumer
warpgroups and the loader's warpgroup) share 64K registers: launched with ``maxnreg`` = 168, the loader drops to
24 and each consumer rises to 240 (``setmaxnreg``), i.e. 112 registers beside a 128-register accumulator.

**CONSUMERS = 3**: a third consumer partition (``_consume2``); consumer c takes the program's tiles 3j + c and
starts its main loop after consumer c - 1's (cyclically, one ``turn`` barrier each). Two epilogues then run beside
each main loop, so an epilogue up to twice a tile's main loop would hide; but 16 warps leave the consumers 160
registers (spills for heavy epilogues from registers), and the EPI_SMEM loop's ring of CONSUMERS - 1 whole-tile
fp32 buffers leaves room for 3 A/B stages, which slow the main loop (H200: the identity at 1.21-1.35x cuBLAS;
docs/benchmarks-log.md, "Three consumer warpgroups"). A flag the tuner does not offer.

**Consumers of two warpgroups** (launched with num_warps = 8, the ping-pong pair only): the consumer partitions
take their layouts from ``gl.num_warps()``, so each wgmma runs on 64 rows of the 128-row tile per warpgroup, each
thread holds 64 accumulator values and each scheduler runs two warps of a consumer's epilogue. Gluon puts a
barrier over the partition's threads before every ``mbarrier.arrive``, so a ring slot is released only after both
warpgroups' wgmma have read it. 20 warps (the loader's padded to a warpgroup) at MAXNREG8 leave each consumer
CONSUMER_REGS8 = 112 registers. Measured on the H200: bce_loss 7% faster at 8192x4096x1024, the other rows no
faster (docs/benchmarks-log.md, "Consumers of two warpgroups"); the tuner tries it for short K loops.

**EPI_LOOP**: the consumer keeps its slices in registers and runs the epilogue as a runtime loop that takes
``acc_s0`` and shifts the other slices down each iteration (``_epi_reg_loop``): one slice's epilogue code per
consumer, as with EPI_SMEM, without the shared-memory round trip; in either layout (EPI_MMA), with the loader's
input and TMA stores. Measured level with or slower than the inlined slices, in the blocked layout on the H200
(docs/benchmarks-log.md, "Three epilogue schedules that did not pay") and in the wgmma layout on an H100 ("The
epilogue loop in the wgmma layout": bce_loss 17% slower): instruction fetch is where a consumer's epilogue waits,
not what sets its length. A flag the tuner does not offer.

**EPI_MMA**: the epilogue runs in the accumulator's own wgmma layout (``_EPI_LAYOUT``: an NVMMA distributed layout
of the slice's width), so moving a slice to it is a no-op instead of a round trip through shared memory; the
epilogue's global loads and stores are then 4-byte pieces instead of 16-byte vectors. On the H200 that paid where
the epilogue stores no M x N tile and its input comes through the loader (bce_loss at 8192x4096x1024: 1.41 ->
1.33 x cuBLAS) and lost 6-40% where it stores tiles, so ``policy.for_epilogue`` turns it on for the EPI_TMA
candidates of epilogues without tile stores. Converting nothing, it needs no shared-memory scratch either, which
leaves room for a fifth A / B ring stage beside the loader's input slices (``policy.MMA_TMA_STAGES``).

**TMA_STORE = T**: the epilogue's T M x N outputs come back from ``<fn>_st`` / ``<fn>_pf_st`` instead of being
stored by it; the consumer writes each slice's value into a shared buffer (output 0 into the EPI_TMA input's slice
buffer it has just read, released to the loader at its next main loop; the others into a buffer per consumer,
reused once ``tma.store_wait`` says the previous slice's store has read it) and a TMA store copies it out. With
EPI_MMA that gives tile-storing epilogues the wgmma layout without 4-byte stores: on the H200 at 8192x4096x1024
rowreduce_tanh 1.31 -> 1.24 and dgelu_bgrad 1.50 -> 1.42 x cuBLAS (docs/benchmarks.md, "Tile outputs stored by
TMA"); ``policy.for_epilogue`` decides where the tuner uses it.
"""

from __future__ import annotations

import functools

from .epilogue import LAUNCH_FLAGS, launch_flags_signature
from .gemm_template import GROUP_ORDER, _check_identifier, _indent, _pf_names, jit_decorator

HEADER = ("from triton.experimental import gluon\n"
          "from triton.experimental.gluon import language as gl\n"
          "from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, "
          "warpgroup_mma, warpgroup_mma_wait\n"
          "try:  # Triton >= 3.7 calls the TMA load async_load (async_copy_global_to_shared raises there)\n"
          "    from triton.experimental.gluon.language.nvidia.hopper.tma import async_load as tma_load\n"
          "except ImportError:  # Triton 3.6\n"
          "    from triton.experimental.gluon.language.nvidia.hopper.tma import async_copy_global_to_shared "
          "as tma_load\n"
          "try:  # Triton >= 3.7 calls the TMA store async_store (async_copy_shared_to_global raises there)\n"
          "    from triton.experimental.gluon.language.nvidia.hopper.tma import async_store as tma_store\n"
          "except ImportError:  # Triton 3.6\n"
          "    from triton.experimental.gluon.language.nvidia.hopper.tma import async_copy_shared_to_global "
          "as tma_store\n"
          "try:  # a barrier over the calling partition's warps: thread_barrier in Triton 3.6, barrier in 3.9\n"
          "    from triton.experimental.gluon.language import thread_barrier as partition_barrier\n"
          "except ImportError:\n"
          "    from triton.experimental.gluon.language import barrier as partition_barrier\n")

# Registers per thread (setmaxnreg): consumers, loader; the kernel is launched with MAXNREG so that
# 128 * (2 * CONSUMER_REGS + LOADER_REGS) <= 65536 and MAXNREG * 384 <= 65536.
CONSUMER_REGS = 240
LOADER_REGS = 24
MAXNREG = 168
WORKER_WARPS = (4, 1)  # consumer 1, loader; consumer 0 is the default partition (num_warps = 4)
# CONSUMERS = 3: 16 warps (three consumer warpgroups, the loader's padded to one) under the launch cap MAXNREG3 =
# 65536 / 512; the loader drops to LOADER_REGS and each consumer rises to CONSUMER_REGS3 (3 * 128 * 160 + 128 * 24
# <= 65536)
CONSUMER_REGS3 = 160
MAXNREG3 = 128
WORKER_WARPS3 = (4, 4, 1)
# Consumers of two warpgroups (launched with num_warps = 8): 20 warps (the loader's padded to a warpgroup) under
# the launch cap MAXNREG8 = 65536 / 640 rounded down to 8; the loader drops to LOADER_REGS and each consumer rises to
# CONSUMER_REGS8 (2 * 256 * 112 + 128 * 24 <= 640 * 96)
CONSUMER_REGS8 = 112
MAXNREG8 = 96
WORKER_WARPS8 = (8, 1)
# EPI_WG schedule: 12 warps (the epilogue warpgroup = default partition, two MMA warpgroups that also issue the
# TMA copies), launched with MAXNREG_WG = 65536 / 384 rounded down to 8: the MMA warpgroups ask for MMA_REGS, the
# epilogue warpgroup gets the rest (a 16-warp variant with a separate loader failed to compile under its 128 cap,
# "Insufficient registers (128)", although ptxas honours setmaxnreg in the ping-pong consumers: not established why).
MAXNREG_WG = 168
MMA_REGS = 160


def launch_maxnreg(epi_wg: int, consumers: int, num_warps: int = 4) -> int:
    """The ``maxnreg`` a launch of the kernel needs (each schedule's warps share 64K registers at this cap):
    MAXNREG_WG for the EPI_WG schedule, MAXNREG3 for three consumers, MAXNREG8 for a pair of two-warpgroup
    consumers (``num_warps`` = 8), MAXNREG for the ping-pong pair of warpgroups."""
    if epi_wg:
        return MAXNREG_WG
    return MAXNREG3 if consumers == 3 else MAXNREG8 if num_warps == 8 else MAXNREG


def _warp_specialize(partitions: tuple[str, ...], warps: tuple[int, ...], regs: tuple[int, ...]) -> str:
    """The kernel's ``gl.warp_specialize`` call (inside an ``if`` branch): partitions ``__KERNEL___<name>`` in
    order (the first is the default partition), each with the shared argument list, then the workers' warp and
    register counts."""
    lines = (["gl.warp_specialize(["] + [f"    (__KERNEL___{name}, ({_ARGS}))," for name in partitions]
             + [f"], [{', '.join(map(str, warps))}], [{', '.join(map(str, regs))}])"])
    return _indent("\n".join(lines), 8)

_SWIZZLE = GROUP_ORDER.replace("__T__", "t").replace("tl.", "gl.")  # the persistent template's tile order

# Template text shared by the partitions: the tile grid (with _SWIZZLE's group size), the epilogue's slice layout
# and a tile's row / column offsets in it
_GRID = """\
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    num_tiles = num_pid_m * num_pid_n
"""
_EPI_LAYOUT = """\
    EPI_N: gl.constexpr = BLOCK_N // EPILOGUE_SUBTILE
    if EPI_MMA:  # the accumulator slice's own wgmma layout: no conversion through shared memory
        epi_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                             instr_shape=[16, EPI_N, 16])
    else:
        epi_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (EPI_N // 8), EPI_N // 8], [gl.num_warps(), 1],
                                                    [1, 0])
"""
_EPI_OFFS = """\
        offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, epi_layout))
        offs_n = pid_n * BLOCK_N + gl.arange(0, EPI_N, layout=gl.SliceLayout(0, epi_layout))
"""

_ARGS = ("a_desc, b_desc, a_bufs, b_bufs, ready, empty, turn, c_desc, c_bufs, c_ready, c_empty, acc_bufs, "
         "acc_ready, acc_empty__TMA_OUT__, M, N, K, L, start_pid__PARAMS_CALL__, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, "
         "NUM_PROGRAMS, STAGES, B_COL_MAJOR, EPILOGUE_SUBTILE, PREFETCH, EPI_TMA, EPI_WG, EPI_SMEM, EPI_LOOP, "
         "EPI_MMA, CONSUMERS, TMA_STORE, __LAUNCH_FLAGS__")

_PARTITION_SIG = """\
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, turn, c_desc, c_bufs, c_ready, c_empty, acc_bufs, acc_ready,
    acc_empty__TMA_OUT__, M, N, K, L, start_pid,
__PARAMS_SIG__    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, B_COL_MAJOR: gl.constexpr, EPILOGUE_SUBTILE: gl.constexpr,
    PREFETCH: gl.constexpr, EPI_TMA: gl.constexpr, EPI_WG: gl.constexpr, EPI_SMEM: gl.constexpr,
    EPI_LOOP: gl.constexpr, EPI_MMA: gl.constexpr, CONSUMERS: gl.constexpr, TMA_STORE: gl.constexpr,
    __LAUNCH_FLAGS_SIG__,
"""

_PINGPONG = '''\
@gluon.jit
def __KERNEL___copy(a_desc, b_desc, a_bufs, b_bufs, ready, slot, off_m, off_n, ki, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, B_COL_MAJOR: gl.constexpr):
    """The TMA copies of K step ``ki`` of the tile at (off_m, off_n) into ring slot ``slot`` (its ``ready``
    barrier expects their bytes)."""
    mbarrier.expect(ready.index(slot), (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * a_desc.dtype.primitive_bitwidth // 8)
    tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(slot), a_bufs.index(slot))
    if B_COL_MAJOR:
        tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(slot), b_bufs.index(slot))
    else:
        tma_load(b_desc, [ki * BLOCK_K, off_n], ready.index(slot), b_bufs.index(slot))


@gluon.jit
def __KERNEL___mma_step(a_bufs, b_bufs, ready, acc, cnt, STAGES: gl.constexpr, B_COL_MAJOR: gl.constexpr):
    """The ``cnt``-th K step of a main loop: wait for ring slot cnt % STAGES, start its wgmma, and wait until the
    step before is done (its slot may then be refilled); the accumulator."""
    slot = cnt % STAGES
    mbarrier.wait(ready.index(slot), (cnt // STAGES) & 1)
    if B_COL_MAJOR:
        b = b_bufs.index(slot).permute((1, 0))
    else:
        b = b_bufs.index(slot)
    acc = warpgroup_mma(a_bufs.index(slot), b, acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=1, deps=[acc])


@gluon.jit
def __KERNEL___load(
''' + _PARTITION_SIG + '''\
):
    """Loader partition: TMA copies of every (tile, K step) of this program into the ring, in consumption order."""
''' + _GRID + '''\
    k_tiles = gl.cdiv(K, BLOCK_K)
    EPI_N: gl.constexpr = BLOCK_N // EPILOGUE_SUBTILE
    c_nbytes: gl.constexpr = BLOCK_M * EPI_N * c_desc.dtype.primitive_bitwidth // 8
    cnt = 0
    tseq = 0
    for t in range(start_pid, num_tiles, NUM_PROGRAMS):
''' + _indent(_SWIZZLE, 8) + '''\
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for ki in range(k_tiles):
            slot = cnt % STAGES
            mbarrier.wait(empty.index(slot), ((cnt // STAGES) & 1) ^ 1)
            __KERNEL___copy(a_desc, b_desc, a_bufs, b_bufs, ready, slot, off_m, off_n, ki, BLOCK_M, BLOCK_N, BLOCK_K,
                            B_COL_MAJOR)
__LOADER_C__            cnt += 1
        tseq += 1


@gluon.jit
def __KERNEL___consume(
''' + _PARTITION_SIG + '''\
    WHICH: gl.constexpr,
):
    """Consumer WHICH (0 .. CONSUMERS - 1): the program's tiles CONSUMERS * j + WHICH; main loop after the
    previous consumer's (WHICH - 1, cyclically), then epilogue."""
    FIRST: gl.constexpr = 1 if WHICH == 0 else 0  # consumer 0's first turn and buffer wait pass at once
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    # The epilogue's layout: 8 consecutive columns per thread (16-byte loads and stores of 16-bit tiles), a warp's
    # threads along a slice row first. The wgmma layout gives each thread pairs of columns in 8 rows, so loads and
    # stores in it are 4-byte accesses over many rows.
''' + _EPI_LAYOUT + _GRID + '''\
    k_tiles = gl.cdiv(K, BLOCK_K)
    j = 0
    for t in range(start_pid + WHICH * NUM_PROGRAMS, num_tiles, CONSUMERS * NUM_PROGRAMS):
''' + _indent(_SWIZZLE, 8) + '''\
''' + _EPI_OFFS + '''\
__PREFETCH_TOP__        cnt = (CONSUMERS * j + WHICH) * k_tiles
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ FIRST)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        for ki in range(k_tiles):
            acc = __KERNEL___mma_step(a_bufs, b_bufs, ready, acc, cnt, STAGES, B_COL_MAJOR)
            if ki > 0:
                mbarrier.arrive(empty.index((cnt - 1) % STAGES), count=1)
__RELEASE_C__            cnt += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(empty.index((cnt + STAGES - 1) % STAGES), count=1, pred=k_tiles > 0)
        mbarrier.arrive(turn.index((WHICH + 1) % CONSUMERS), count=1)
        if EPI_SMEM > 0:
__EPI_SMEM_LOOP__        elif EPI_LOOP:
__EPI_REG_LOOP__        else:
__EPILOGUE_CALLS__        j += 1
__STORE_DRAIN__

@gluon.jit
def __KERNEL___consume0(
''' + _PARTITION_SIG + '''\
):
    __KERNEL___consume(''' + _ARGS + ''', 0)


@gluon.jit
def __KERNEL___consume1(
''' + _PARTITION_SIG + '''\
):
    __KERNEL___consume(''' + _ARGS + ''', 1)


@gluon.jit
def __KERNEL___consume2(
''' + _PARTITION_SIG + '''\
):
    __KERNEL___consume(''' + _ARGS + ''', 2)


@gluon.jit
def __KERNEL___issue(a_desc, b_desc, a_bufs, b_bufs, ready, idx, start_pid, k_tiles, num_pid_m, num_pid_n,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                     NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, B_COL_MAJOR: gl.constexpr):
    """EPI_WG schedule: the TMA copies of the program's ``idx``-th (tile, K step) into ring slot idx % STAGES."""
    t = start_pid + (idx // k_tiles) * NUM_PROGRAMS
    ki = idx % k_tiles
    num_pid_in_group = GROUP_M * num_pid_n
''' + _indent(_SWIZZLE, 4) + '''\
    __KERNEL___copy(a_desc, b_desc, a_bufs, b_bufs, ready, idx % STAGES, pid_m * BLOCK_M, pid_n * BLOCK_N, ki,
                    BLOCK_M, BLOCK_N, BLOCK_K, B_COL_MAJOR)


@gluon.jit
def __KERNEL___mma(
''' + _PARTITION_SIG + '''\
):
    """EPI_WG schedule, MMA partition (two warpgroups, 64 rows each): every tile of the program into one
    [BLOCK_M, BLOCK_N] accumulator, then its EPILOGUE_SUBTILE slices into the EPI_WG-deep hand-off ring. It also
    issues the TMA copies, STAGES - 1 K steps ahead across tile boundaries (a separate loader warp would make 16
    warps, and 65536 / 512 = 128 registers per thread cannot hold a 128-register accumulator's main loop)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(num_tiles - start_pid, NUM_PROGRAMS) * k_tiles
    for i in gl.static_range(STAGES - 1):
        if i < total:
            __KERNEL___issue(a_desc, b_desc, a_bufs, b_bufs, ready, i, start_pid, k_tiles, num_pid_m, num_pid_n,
                             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, STAGES, B_COL_MAJOR)
    cnt = 0
    tseq = 0
    for t in range(start_pid, num_tiles, NUM_PROGRAMS):
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        for ki in range(k_tiles):
            acc = __KERNEL___mma_step(a_bufs, b_bufs, ready, acc, cnt, STAGES, B_COL_MAJOR)
            # the step before is done: its slot, (cnt - 1) % STAGES, takes the copies STAGES - 1 steps ahead
            if cnt + STAGES - 1 < total:
                __KERNEL___issue(a_desc, b_desc, a_bufs, b_bufs, ready, cnt + STAGES - 1, start_pid, k_tiles,
                                 num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, STAGES,
                                 B_COL_MAJOR)
            cnt += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
__HANDOFF_STORES__        tseq += 1


@gluon.jit
def __KERNEL___epi(
''' + _PARTITION_SIG + '''\
):
    """EPI_WG schedule, epilogue partition (one warpgroup): the program's tiles in the MMA partition's order,
    each slice read from the hand-off ring (freed at once), then the generated epilogue on it."""
''' + _EPI_LAYOUT + _GRID + '''\
    tseq = 0
    for t in range(start_pid, num_tiles, NUM_PROGRAMS):
''' + _indent(_SWIZZLE, 8) + '''\
''' + _EPI_OFFS + '''\
__PREFETCH_TOP____EPI_WG_CALLS__        tseq += 1


@gluon.jit
def __KERNEL__(
    A_ptr, B_ptr,
    M, N, K, L,
    stride_al, stride_am, stride_ak,
    stride_bl, stride_bk, stride_bn,
__PARAMS_SIG__    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    ALLOW_TF32: gl.constexpr, ACC_DTYPE: gl.constexpr, DOT_UPCAST: gl.constexpr,
    __LAUNCH_FLAGS_SIG__,
    NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, B_COL_MAJOR: gl.constexpr, EPILOGUE_SUBTILE: gl.constexpr,
    PREFETCH: gl.constexpr, EPI_TMA: gl.constexpr, EPI_WG: gl.constexpr, EPI_SMEM: gl.constexpr,
    EPI_LOOP: gl.constexpr, EPI_MMA: gl.constexpr, CONSUMERS: gl.constexpr, TMA_STORE: gl.constexpr,
):
    """Ping-pong GEMM + epilogue (Hopper, Gluon); grid (min(NUM_PROGRAMS, tiles),), launched with num_warps=4
    and maxnreg=launch_maxnreg(EPI_WG, CONSUMERS); 16-bit A row-major (M, K), B (K, N) row-major or, with
    B_COL_MAJOR, column-major."""
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    a_desc = tma.make_tensor_descriptor(A_ptr, shape=[M, K], strides=[stride_am, 1],
                                        block_shape=[BLOCK_M, BLOCK_K], layout=smem)
    if B_COL_MAJOR:
        b_desc = tma.make_tensor_descriptor(B_ptr, shape=[N, K], strides=[stride_bn, 1],
                                            block_shape=[BLOCK_N, BLOCK_K], layout=smem)
        b_bufs = gl.allocate_shared_memory(B_ptr.dtype.element_ty, [STAGES, BLOCK_N, BLOCK_K], smem)
    else:
        b_desc = tma.make_tensor_descriptor(B_ptr, shape=[K, N], strides=[stride_bk, 1],
                                            block_shape=[BLOCK_K, BLOCK_N], layout=smem)
        b_bufs = gl.allocate_shared_memory(B_ptr.dtype.element_ty, [STAGES, BLOCK_K, BLOCK_N], smem)
    a_bufs = gl.allocate_shared_memory(A_ptr.dtype.element_ty, [STAGES, BLOCK_M, BLOCK_K], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turn.index(i), count=1)
    # EPI_TMA: the epilogue's one M x N input comes through the loader too (TMA into 2 x EPILOGUE_SUBTILE slice
    # buffers: one set per consumer); otherwise placeholders (the partitions take the same arguments)
    C_SLOTS: gl.constexpr = CONSUMERS * EPILOGUE_SUBTILE if EPI_TMA else 1
__C_RING____O_RING__    c_ready = gl.allocate_shared_memory(gl.int64, [C_SLOTS, 1], mbarrier.MBarrierLayout())
    c_empty = gl.allocate_shared_memory(gl.int64, [C_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(C_SLOTS):
        mbarrier.init(c_ready.index(i), count=1)
        mbarrier.init(c_empty.index(i), count=1)
    # EPI_WG: the MMA partition hands each accumulator slice to the epilogue partition through a ring of EPI_WG
    # fp32 [BLOCK_M, BLOCK_N / EPILOGUE_SUBTILE] buffers. EPI_SMEM: EPILOGUE_SUBTILE such slices hold the
    # consumers' accumulators (1: a ring of CONSUMERS - 1 whole tiles the consumers take in tile order, acc_empty
    # saying when the tile before has read its buffer; 2: half a tile each). Otherwise placeholders.
    ACC_SWIZZLE: gl.constexpr = 128 if BLOCK_N // EPILOGUE_SUBTILE * 4 >= 128 else BLOCK_N // EPILOGUE_SUBTILE * 4
    acc_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=ACC_SWIZZLE, element_bitwidth=32, rank=2)
    if EPI_WG > 0:
        acc_bufs = gl.allocate_shared_memory(gl.float32, [EPI_WG, BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE], acc_smem)
    elif EPI_SMEM > 0:
        ACC_BUFS: gl.constexpr = ((CONSUMERS - 1) * EPILOGUE_SUBTILE if EPI_SMEM == 1
                                  else CONSUMERS * (EPILOGUE_SUBTILE // 2))
        acc_bufs = gl.allocate_shared_memory(gl.float32, [ACC_BUFS, BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE], acc_smem)
    else:
        acc_bufs = a_bufs
    ACC_SLOTS: gl.constexpr = EPI_WG if EPI_WG > 0 else CONSUMERS
    acc_ready = gl.allocate_shared_memory(gl.int64, [ACC_SLOTS, 1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [ACC_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ACC_SLOTS):
        mbarrier.init(acc_ready.index(i), count=1)
        mbarrier.init(acc_empty.index(i), count=1)
    start_pid = gl.program_id(0)
    if EPI_WG > 0:
''' + _warp_specialize(("epi", "mma"), (8,), (MMA_REGS,)) + '''\
    elif gl.num_warps() == 8:
''' + _warp_specialize(("consume0", "consume1", "load"), WORKER_WARPS8, (CONSUMER_REGS8, LOADER_REGS)) + '''\
    elif CONSUMERS == 3:
''' + _warp_specialize(("consume0", "consume1", "consume2", "load"), WORKER_WARPS3,
                       (CONSUMER_REGS3, CONSUMER_REGS3, LOADER_REGS)) + '''\
    else:
''' + _warp_specialize(("consume0", "consume1", "load"), WORKER_WARPS, (CONSUMER_REGS, LOADER_REGS))


# The loader's copy of the epilogue's one M x N input (EPI_TMA), half way through the tile's K steps: slot set
# tseq % 2 (the consumer that takes this tile), freed by that consumer's epilogue two tiles earlier.
_LOADER_C = """\
if EPI_TMA:
    if ki == k_tiles // 2:
        for sl in gl.static_range(EPILOGUE_SUBTILE):
            cslot = (tseq % CONSUMERS) * EPILOGUE_SUBTILE + sl
            mbarrier.wait(c_empty.index(cslot), ((tseq // CONSUMERS) & 1) ^ 1)
            mbarrier.expect(c_ready.index(cslot), c_nbytes)
            tma_load(c_desc, [off_m, off_n + sl * EPI_N], c_ready.index(cslot), c_bufs.index(cslot))
"""


def _c_ring(tma_input) -> str:
    """The EPI_TMA descriptor and slice buffers for the input (pointer param, M stride param), else placeholders."""
    if tma_input is None:
        return _indent("c_desc = a_desc\nc_bufs = a_bufs", 4)
    ptr, stride_m = tma_input
    return _indent(f"""if EPI_TMA:
    C_SWIZZLE: gl.constexpr = 128 if BLOCK_N // EPILOGUE_SUBTILE * 2 >= 128 else BLOCK_N // EPILOGUE_SUBTILE * 2
    c_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=C_SWIZZLE, element_bitwidth=16, rank=2)
    c_desc = tma.make_tensor_descriptor({ptr}, shape=[M, N], strides=[{stride_m}, 1],
                                        block_shape=[BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE], layout=c_smem)
    c_bufs = gl.allocate_shared_memory({ptr}.dtype.element_ty, [C_SLOTS, BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE], c_smem)
else:
    c_desc = a_desc
    c_bufs = a_bufs""", 4)


def _o_ring(tma_outputs, tma_input) -> str:
    """TMA_STORE: a descriptor per TMA-stored output and one [BM, BN / EPILOGUE_SUBTILE] shared buffer per consumer
    and output that the consumer writes each slice's value into before its TMA store; output 0 takes the input's
    slice buffer instead where the input comes through the loader (EPI_TMA: the slice there has just been read).
    Placeholders without TMA_STORE (the partitions take the same arguments)."""
    if not tma_outputs:
        return ""
    lines = ["if TMA_STORE:",
             "    O_N: gl.constexpr = BLOCK_N // EPILOGUE_SUBTILE",
             "    O_SWIZZLE: gl.constexpr = 128 if O_N * 2 >= 128 else O_N * 2",
             "    o_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=O_SWIZZLE, element_bitwidth=16, rank=2)"]
    for k, (ptr, stride_m) in enumerate(tma_outputs):
        lines += [f"    o_desc{k} = tma.make_tensor_descriptor({ptr}, shape=[M, N], strides=[{stride_m}, 1],",
                  "                                        block_shape=[BLOCK_M, O_N], layout=o_smem)"]
        alloc = f"gl.allocate_shared_memory({ptr}.dtype.element_ty, [CONSUMERS, BLOCK_M, O_N], o_smem)"
        if k == 0 and tma_input is not None:
            lines += ["    if EPI_TMA:", "        o_bufs0 = a_bufs", "    else:", f"        o_bufs0 = {alloc}"]
        else:
            lines.append(f"    o_bufs{k} = {alloc}")
    lines.append("else:")
    lines += [f"    o_desc{k} = a_desc\n    o_bufs{k} = a_bufs" for k in range(len(tma_outputs))]
    return _indent("\n".join(lines), 4)


def _tma_stores(i: int | str, count: int, c_slot: str | None) -> list[str]:
    """TMA_STORE: the lines after slice ``i``'s ``_st`` call (``i`` a number, or the EPI_LOOP's loop variable) that
    store its ``count`` returned outputs ``o0 ..``:
    each written into its shared buffer (once the previous slice's TMA store of that output has read it: the
    stores complete in issue order, ``count`` per slice) and copied out by TMA, which clips rows and columns past
    M and N. ``c_slot``: the input's slice buffer that output 0 takes (EPI_TMA), read by every warp just before."""
    lines = []
    for k in range(count):
        buf = f"c_bufs.index({c_slot})" if k == 0 and c_slot is not None else f"o_bufs{k}.index(WHICH)"
        lines += ["partition_barrier()"] if k == 0 and c_slot is not None else [f"tma.store_wait({count - 1})",
                                                                                "partition_barrier()"]
        lines += [f"{buf}.store(o{k})", "fence_async_shared()",
                  f"tma_store(o_desc{k}, [pid_m * BLOCK_M, pid_n * BLOCK_N + {i} * EPI_N], {buf})"]
    return lines


def _release_c(stores: int, tma_input) -> str:
    """TMA_STORE with EPI_TMA: the input slice buffers of the consumer's previous tile took its output 0, so they
    are released (for the loader's copy half way through this tile's K steps) only once their TMA stores have
    read them: after this main loop's first wgmma is issued, by when they long have."""
    if not stores or tma_input is None:
        return ""
    return _indent("""if TMA_STORE and EPI_TMA:
    if (ki == 0) & (j > 0):
        tma.store_wait(0)
        for sl in gl.static_range(EPILOGUE_SUBTILE):
            mbarrier.arrive(c_empty.index(WHICH * EPILOGUE_SUBTILE + sl), count=1)
""", 12)


def _store_drain(stores: int) -> str:
    """TMA_STORE: the consumer's last TMA stores have read their shared buffers before the program ends."""
    return _indent("if TMA_STORE:\n    tma.store_wait(0)\n", 4) if stores else ""


def _call(fn: str, args: str, stores: int, i: int | str, c_slot: str | None = None, plain_first=()) -> list[str]:
    """The epilogue call ``fn`` on ``acc_e`` with ``args`` (after the lines ``plain_first``); with ``stores``
    TMA-stored outputs, under TMA_STORE its ``_st`` twin instead, whose returned values ``_tma_stores`` writes out
    (slice ``i``; ``c_slot``: see there)."""
    plain = [*plain_first, f"{fn}(acc_e, {args})"]
    if not stores:
        return plain
    outs = ", ".join(f"o{k}" for k in range(stores))
    return (["if TMA_STORE:", f"    {outs} = {fn}_st(acc_e, {args})"]
            + ["    " + line for line in _tma_stores(i, stores, c_slot)] + ["else:"] + ["    " + p for p in plain])


def _acc_slice(i: int, n: int, from_smem: bool) -> list[str]:
    """Lines that put slice ``i`` of ``n`` into ``acc_e`` in the epilogue's layout: from the split accumulator
    (ping-pong consumers), or from the EPI_WG hand-off ring, whose slot is released as soon as every warp of the
    epilogue warpgroup has read it (the thread barrier: the arrive is one thread's)."""
    if not from_smem:
        return [f"acc_e = gl.convert_layout(acc_s{i}, epi_layout)"]
    return [f"q = tseq * {n} + {i}",
            "mbarrier.wait(acc_ready.index(q % EPI_WG), (q // EPI_WG) & 1)",
            "acc_e = acc_bufs.index(q % EPI_WG).load(epi_layout)",
            "partition_barrier()",
            "mbarrier.arrive(acc_empty.index(q % EPI_WG), count=1)"]


def _split_lines(n: int) -> list[str]:
    """Lines that split ``acc`` [BLOCK_M, BLOCK_N] into ``acc_s0 .. acc_s{n-1}`` (n a power of two), column slices
    in order, by repeated halving (reshape to [BLOCK_M, 2, W / 2], permute, split)."""
    names, lines, width = ["acc"], [], 1
    while width < n:
        width *= 2
        halves = [f"acc_s{k}" if width == n else f"acc_h{width}_{k}" for k in range(width)]
        for k, name in enumerate(names):
            split = f"gl.split(gl.permute(gl.reshape({name}, (BLOCK_M, 2, BLOCK_N // {width})), (0, 2, 1)))"
            lines.append(f"{halves[2 * k]}, {halves[2 * k + 1]} = {split}")
        names = halves
    return lines or ["acc_s0 = acc"]


def _per_subtiling(slice_lines, split: bool, indent: int = 8, counts: tuple[int, ...] = (4, 2, 1)) -> str:
    """Constexpr branches on EPILOGUE_SUBTILE (``counts``, the last one the else branch): in each, with ``split``
    ``acc`` split into ``acc_s0 .. acc_s{n-1}`` (all of it before the first slice), then ``slice_lines(i, n)``
    for every slice i of n; indented by ``indent``."""
    out = []
    for k, n in enumerate(counts):
        out.append("else:" if k == len(counts) - 1 else f"{'if' if k == 0 else 'elif'} EPILOGUE_SUBTILE == {n}:")
        body = _split_lines(n) if split else []
        for i in range(n):
            body += slice_lines(i, n)
        out += ["    " + line for code in body for line in code.split("\n")]
    return _indent("\n".join(out), indent)


def _slice_args(s: str, n: str) -> str:
    """The epilogue call's arguments after the accumulator, for slice ``s`` of ``n`` (expressions: numbers in the
    unrolled calls, names in the EPI_SMEM loop)."""
    return f"offs_m, offs_n + {s} * EPI_N, pid_m, {n} * pid_n + {s}, 0, M, N, L, __LAUNCH_FLAGS____PARAMS_CALL__"


def _prefetch_call(s: str | None, rows: str = "M") -> str:
    """The call that loads slice ``s``'s M x N inputs (None: slice 0), masked to the rows below ``rows``. A row
    bound other than M (0 past the last slice, whose columns may lie past N) must stay a mask: EVEN_M is then
    False."""
    cols = "offs_n" if s is None else f"offs_n + {s} * EPI_N"
    flags = ", ".join(f if f != "EVEN_M" or rows == "M" else "False" for f in LAUNCH_FLAGS)
    return f"__EPILOGUE___prefetch(offs_m, {cols}, 0, {rows}, N, L, {flags}__PARAMS_CALL__)"


def _from_loader(slot: str, args: str, stores: int = 0, i: int | str = 0) -> list[str]:
    """EPI_TMA: the epilogue call on ``acc_e`` with its input's slice read from the loader's buffer ``slot`` (once
    the copy has landed; the buffer is released right after the read) instead of loaded from global memory. With
    ``stores`` TMA-stored outputs (slice ``i``), under TMA_STORE the buffer takes output 0 and is released later
    (``_release_c``)."""
    release = ["fence_async_shared()", f"mbarrier.arrive(c_empty.index({slot}), count=1)"]
    return ([f"mbarrier.wait(c_ready.index({slot}), j & 1)", f"pf_t = c_bufs.index({slot}).load(epi_layout)"]
            + _call("__EPILOGUE___pf", f"{args}, pf_t", stores, i, c_slot=slot, plain_first=release))


def _or_from_loader(slot: str, args: str, stores: int, i: int | str, plain: list[str]) -> list[str]:
    """Under EPI_TMA the epilogue call on the loader's buffer ``slot`` (``_from_loader``), else the lines
    ``plain`` (the call on inputs the consumer loads itself)."""
    return (["if EPI_TMA:"] + ["    " + c for c in _from_loader(slot, args, stores, i)]
            + ["else:"] + ["    " + c for c in plain])


def _epilogue_calls(prefetch: int, tma: bool, from_smem: bool = False, indent: int = 8, stores: int = 0) -> str:
    """The S-way split of the accumulator, each slice moved to the epilogue's layout and handed to the epilogue;
    with ``prefetch`` M x N inputs and PREFETCH = 1, slice i + 1's inputs are loaded before slice i runs (slice 0's
    before the main loop: ``_prefetch_top``); with ``tma`` and EPI_TMA, the one input's slice comes from the
    loader's buffer (consumer WHICH's slot set); with ``stores`` TMA-stored outputs and TMA_STORE, those are
    returned by the epilogue and stored by TMA (``_call``). ``from_smem``: the EPI_WG epilogue partition's calls,
    each slice read from the hand-off ring instead of split from registers."""
    def slice_lines(i: int, n: int) -> list[str]:
        args = _slice_args(str(i), str(n))
        body = _acc_slice(i, n, from_smem)
        if not prefetch:
            return body + _call("__EPILOGUE__", args, stores, i)
        plain = []
        if i + 1 < n:
            plain += ["if PREFETCH > 0:", f"    {_pf_names(i + 1, prefetch)} = {_prefetch_call(str(i + 1))}"]
        plain += (["if PREFETCH > 0:"]
                  + ["    " + c for c in _call("__EPILOGUE___pf", f"{args}, {_pf_names(i, prefetch)}", stores, i)]
                  + ["else:"] + ["    " + c for c in _call("__EPILOGUE__", args, stores, i)])
        if not tma:
            return body + plain
        return body + _or_from_loader(f"WHICH * EPILOGUE_SUBTILE + {i}", args, stores, i, plain)

    return _per_subtiling(slice_lines, split=not from_smem, indent=indent)


# EPILOGUE_SUBTILE values of the EPI_SMEM loop: 8 too (16 columns of a 128-wide tile, 16 values per thread). The
# loop runs one slice's code, so more slices cost no code size, and a slice that small is what makes ptxas keep
# the epilogue's per-element chains interleaved (an sm_90 compile of bce_loss: with 64 values per thread it
# schedules each element's 17-instruction chain back to back, ~17% issue; with 16 it interleaves eight).
_SMEM_COUNTS = (8, 4, 2, 1)


def _epi_smem_loop(prefetch: int) -> str:
    """EPI_SMEM: the consumer stores its accumulator, split into EPILOGUE_SUBTILE slices, into a shared-memory
    buffer and runs the epilogue in a loop over the slices, each loaded in the epilogue's layout: one slice's
    epilogue code instead of EPILOGUE_SUBTILE inlined copies per consumer (with both consumers' copies,
    bce_loss's kernel was ~8000 SASS instructions and its epilogue warps waited on instruction fetch for 24% of
    their stall samples: Nsight Compute, H200). EPI_SMEM == 1: a ring of CONSUMERS - 1 [BM, BN] buffers (one for
    two consumers) that the program's tiles take in order, each released (acc_empty) after the tile's last slice is
    read; EPI_SMEM == 2: a [BM, BN / 2] buffer per consumer that takes the accumulator's two halves in turn (the
    second half waits in registers). With
    PREFETCH = 1 slice s + 1's inputs are loaded before slice s runs (none after the last slice: its row bound is
    0); with an even slice count per buffer fill the loop takes two slices per iteration (no register copy of a
    load in flight)."""
    args = _slice_args("s", "EPILOGUE_SUBTILE")
    head = ["if EPI_SMEM == 1:  # this tile's buffer in the ring, once the tile CONSUMERS - 1 before has read it",
            "    q = CONSUMERS * j + WHICH",
            "    ebuf = q % (CONSUMERS - 1)",
            "    mbarrier.wait(acc_empty.index(ebuf), ((q // (CONSUMERS - 1)) & 1) ^ 1)",
            "    ebase = ebuf * EPILOGUE_SUBTILE",
            "else:",
            "    ebase = WHICH * (EPILOGUE_SUBTILE // 2)"]

    def stores(i: int, n: int) -> list[str]:  # slice i of n: into the whole-tile buffer, or in its half's turn
        whole = [f"acc_bufs.index(ebase + {i}).store(acc_s{i})"]
        if n == 1:  # EPI_SMEM == 2 needs two or more slices (GemmConfig)
            return whole
        return ["if EPI_SMEM == 1:", "    " + whole[0], f"elif h == {2 * i // n}:",
                f"    acc_bufs.index(ebase + {i % (n // 2)}).store(acc_s{i})"]

    def one_slice(sx: str, call: str) -> list[str]:  # slice s2 = sx of this half: read, release, epilogue
        return [f"s = h * (EPILOGUE_SUBTILE // EPI_SMEM) + {sx}",
                f"acc_e = acc_bufs.index(ebase + {sx}).load(epi_layout)",
                "if EPI_SMEM == 1:",
                "    if s == EPILOGUE_SUBTILE - 1:  # every warp has read every slice: the buffer is free",
                "        partition_barrier()",
                "        mbarrier.arrive(acc_empty.index(ebuf), count=1)"] + call

    def over_slices(body: list[str], step: str = "") -> list[str]:  # a loop over this half's slices
        return [f"for s2 in range({'0, ' if step else ''}EPILOGUE_SUBTILE // EPI_SMEM{step}):"] + _indent(
            "\n".join(body), 4).rstrip("\n").split("\n")

    def under(cond: str, body: list[str]) -> list[str]:
        return [f"    {cond}"] + ["        " + line for line in body]

    loop = ["for h in range(EPI_SMEM):",
            "    partition_barrier()  # this consumer's warps have read the buffer's previous slices",
            _per_subtiling(stores, split=False, indent=4, counts=_SMEM_COUNTS).rstrip("\n"),
            "    partition_barrier()"]
    unprefetched = over_slices(one_slice("s2", [f"__EPILOGUE__(acc_e, {args})"]))
    if prefetch:
        cur, nxt = _pf_names(0, prefetch), _pf_names(1, prefetch)
        ahead = _prefetch_call("(s + 1)", "M * (s + 1 < EPILOGUE_SUBTILE)")
        plain = over_slices(one_slice("s2", [f"{nxt} = {ahead}", f"__EPILOGUE___pf(acc_e, {args}, {cur})",
                                             f"{cur} = {nxt}"]))
        # Two slices per iteration, their inputs in two register sets: the plain loop's carried copy (cur = nxt)
        # is a register move of a load in flight, which waits for it (Nsight Compute, H200, lincomb_relu on
        # eighths: 26% of the kernel's stall samples on that move); here each set is refilled only after its
        # slice has used it, so the loads need no copy and stay in flight through the next slice.
        pairs = over_slices(one_slice("s2", [f"{nxt} = {ahead}", f"__EPILOGUE___pf(acc_e, {args}, {cur})"])
                            + one_slice("(s2 + 1)", [f"{cur} = {ahead}", f"__EPILOGUE___pf(acc_e, {args}, {nxt})"]),
                            step=", 2")
        loop += (under("if PREFETCH > 0 and (EPILOGUE_SUBTILE // EPI_SMEM) % 2 == 0:", pairs)
                 + under("elif PREFETCH > 0:", plain) + under("else:", unprefetched))
    else:
        loop += ["    " + line for line in unprefetched]
    split = _per_subtiling(lambda i, n: [], split=True, indent=0, counts=_SMEM_COUNTS)
    return _indent("\n".join(head) + "\n" + split + "\n".join(loop), 12)


def _epi_reg_loop(prefetch: int, tma: bool, stores: int = 0) -> str:
    """EPI_LOOP: the consumer's epilogue as a runtime loop over its accumulator's EPILOGUE_SUBTILE (2 or 4) slices,
    carried in registers: each iteration takes slice ``acc_s0`` and shifts the others down one place (register
    moves: 64 per iteration on halves, 96 on quarters, beside the slice's epilogue). One slice's epilogue code per
    consumer instead of S inlined copies, without EPI_SMEM's round trip through shared memory. (Built because a
    consumer waited on instruction fetch for 30% of bce_loss's epilogue stall samples; in the blocked layout the
    loop halved the code and ran no faster on the H200: docs/benchmarks-log.md, "Three epilogue schedules that did
    not pay". With EPI_MMA and the input through the loader, the tuner's configs since, instruction fetch is again
    the largest stall of one consumer's epilogue: "The epilogue loop in the wgmma layout".) With PREFETCH = 1 the
    next slice's inputs load before this slice's epilogue (none after the last: row bound 0) and are carried as the
    next iteration's; with ``tma`` and EPI_TMA the input's slice comes from the loader's buffer (``_from_loader``);
    with ``stores`` TMA-stored outputs and TMA_STORE, slice s's outputs are stored by TMA (``_call``); with EPI_MMA
    the slice is in the wgmma layout already (the layout conversion is a no-op)."""
    args = _slice_args("s", "EPILOGUE_SUBTILE")

    def body(n: int) -> list[str]:
        names = [f"acc_s{i}" for i in range(n)]
        rotate = f"{', '.join(names)} = {', '.join(names[1:] + names[-1:])}"
        lines = ["for s in range(EPILOGUE_SUBTILE):", "    acc_e = gl.convert_layout(acc_s0, epi_layout)"]
        call = _call("__EPILOGUE__", args, stores, "s")
        if prefetch:
            cur, nxt = _pf_names(0, prefetch), _pf_names(1, prefetch)
            ahead = _prefetch_call("(s + 1)", "M * (s + 1 < EPILOGUE_SUBTILE)")
            call = (["if PREFETCH > 0:", f"    {nxt} = {ahead}"]
                    + ["    " + c for c in _call("__EPILOGUE___pf", f"{args}, {cur}", stores, "s")]
                    + [f"    {cur} = {nxt}", "else:"] + ["    " + c for c in call])
            if tma:
                call = _or_from_loader("WHICH * EPILOGUE_SUBTILE + s", args, stores, "s", call)
        return _split_lines(n) + lines + ["    " + c for c in call] + ["    " + rotate]
    out = (["if EPILOGUE_SUBTILE == 4:"] + ["    " + line for line in body(4)]
           + ["else:"] + ["    " + line for line in body(2)])
    return _indent("\n".join(out), 12)


def _handoff_stores() -> str:
    """The EPI_WG MMA partition's end of a tile: the accumulator split as the epilogue will take it, each slice
    stored into the next slot of the hand-off ring once the epilogue partition has read what was there, and
    published after every warp's store (partition barrier, then one thread's arrive)."""
    return _per_subtiling(lambda i, n: [f"q = tseq * {n} + {i}",
                                        "mbarrier.wait(acc_empty.index(q % EPI_WG), ((q // EPI_WG) & 1) ^ 1)",
                                        f"acc_bufs.index(q % EPI_WG).store(acc_s{i})",
                                        "partition_barrier()",
                                        "mbarrier.arrive(acc_ready.index(q % EPI_WG), count=1)"], split=True)


def _prefetch_top(prefetch: int) -> str:
    """Before the consumer's main loop: slice 0's M x N inputs (in flight through the other consumer's main loop
    and this one's)."""
    if not prefetch:
        return ""
    return _indent(f"if PREFETCH > 0:\n    {_pf_names(0, prefetch)} = {_prefetch_call(None)}", 8)


def render_pingpong(kernel_name: str, epilogue_fn: str, epilogue_params: list[str], prefetch: int = 0,
                    tma_input: tuple[str, str] | None = None, unspecialized=(),
                    tma_outputs: tuple[tuple[str, str], ...] = ()) -> str:
    """Source of the Gluon ping-pong kernel ``kernel_name`` (and its partition functions ``<kernel_name>_*``)
    calling ``epilogue_fn``; the caller puts ``HEADER``, the Triton header and the epilogue into one module.
    ``prefetch``: how many M x N input tiles ``<epilogue_fn>_prefetch`` returns (as for ``render_gemm``).
    ``tma_input``: (pointer param, M-stride param) of the one prefetched input, which EPI_TMA then loads
    through the loader warp (the launcher sets EPI_TMA only for a unit N stride and 16-byte alignment).
    ``unspecialized``: parameters Triton must not specialise on their values (``gemm_template.jit_decorator``).
    ``tma_outputs``: (pointer param, M-stride param) of the M x N outputs ``<epilogue_fn>_st`` returns, which
    TMA_STORE then stores by TMA (the launcher sets TMA_STORE only for 16-bit outputs with a unit N stride and
    16-byte alignment)."""
    _check_identifier("kernel_name", kernel_name)
    _check_identifier("epilogue_fn", epilogue_fn)
    params = [_check_identifier("epilogue_params entry", p) for p in epilogue_params]
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be a non-negative int (M x N input tiles), got {prefetch!r}")
    if tma_input is not None:
        if prefetch != 1:
            raise ValueError(f"tma_input needs exactly one prefetched input tile, got prefetch={prefetch}")
        tma_input = (_check_identifier("tma_input pointer", tma_input[0]),
                     _check_identifier("tma_input stride", tma_input[1]))
    tma_outputs = tuple((_check_identifier("tma_outputs pointer", p), _check_identifier("tma_outputs stride", m))
                        for p, m in tma_outputs)
    stores = len(tma_outputs)
    tma_out_args = "".join(f", o_desc{k}, o_bufs{k}" for k in range(stores))
    text = (_PINGPONG.replace("__EPILOGUE_CALLS__", _epilogue_calls(prefetch, tma_input is not None, indent=12,
                                                                   stores=stores))
            .replace("__RELEASE_C__", _release_c(stores, tma_input))
            .replace("__STORE_DRAIN__", _store_drain(stores))
            .replace("__O_RING__", _o_ring(tma_outputs, tma_input))
            .replace("__TMA_OUT__", tma_out_args)
            .replace("__EPI_SMEM_LOOP__", _epi_smem_loop(prefetch))
            .replace("__EPI_REG_LOOP__", _epi_reg_loop(prefetch, tma_input is not None, stores))
            .replace("__EPI_WG_CALLS__", _epilogue_calls(prefetch, False, from_smem=True))
            .replace("__HANDOFF_STORES__", _handoff_stores())
            .replace("__PREFETCH_TOP__", _prefetch_top(prefetch))
            .replace("__C_RING__", _c_ring(tma_input))
            .replace("__LOADER_C__", _indent(_LOADER_C, 12) if tma_input else ""))
    text = text.replace("@gluon.jit\ndef __KERNEL__(\n",
                        jit_decorator(unspecialized, params, "gluon") + "\ndef __KERNEL__(\n")
    return (text.replace("__KERNEL__", kernel_name)
            .replace("__EPILOGUE__", epilogue_fn)
            .replace("__PARAMS_SIG__", "".join(f"    {p},\n" for p in params))
            .replace("__PARAMS_CALL__", "".join(f", {p}" for p in params))
            .replace("__LAUNCH_FLAGS_SIG__", launch_flags_signature("gl"))
            .replace("__LAUNCH_FLAGS__", ", ".join(LAUNCH_FLAGS)))


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the installed Triton has what the template uses (Gluon with Hopper TMA, wgmma, mbarriers and
    ``gl.warp_specialize`` taking a list of (partition, args); Triton 3.6 and 3.9 do)."""
    try:
        import inspect

        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma  # noqa: F401

        params = list(inspect.signature(gl.warp_specialize).parameters)
        has_load = hasattr(tma, "async_load") or hasattr(tma, "async_copy_global_to_shared")  # HEADER's tma_load
        return (params[:2] == ["functions_and_args", "worker_num_warps"] and hasattr(tma, "make_tensor_descriptor")
                and has_load)
    except Exception:  # noqa: BLE001 - any import or API mismatch means: not offered
        return False
