"""GEMM tile configurations: the record (``GemmConfig``), the device it runs on, and the resource checks.

Why a separate module: the templates (``gemm_template``) only know constexpr *names*; a ``GemmConfig`` holds the
values they take, checked once here (which flags apply to which template, which combinations the kernels run),
so that the launcher, the autotuner and tests agree on one ``GemmConfig`` type. Beside the record: what the device
offers (``DeviceInfo``: shared memory, SM count, capability) and whether a config fits it (``fits_smem``,
``fits_registers``, ``fits_shape``). Which configs are worth offering and which to pick without tuning is policy,
revised with every measurement while the record stays put: it lives in ``policy``, which imports this module
(never the reverse).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from evtorch.runtime import knobs

TEMPLATES: tuple[str, ...] = ("portable", "splitk", "persistent_tma", "pingpong")

# Flags a config may carry in ``extra``; all apply to persistent_tma, EPILOGUE_SUBTILE and PREFETCH (0 / 1) also to
# pingpong.
EXTRA_FLAGS: dict[str, type | tuple[type, ...]] = {
    # call the epilogue on S [BM, BN/S] slices (less register/smem pressure): True (= 2), 4 or 8 (pingpong with
    # EPI_SMEM only); False / 1: whole tile
    "EPILOGUE_SUBTILE": (bool, int),
    "WARP_SPECIALIZE": bool,  # tl.range(warp_specialize=...) on the persistent tile loop
    "FLATTEN": bool,  # tl.range(flatten=...) on the persistent tile loop
    # persistent programs per SM (default 1). 2 = "ping-pong": two co-resident programs, each owning its own output
    # tiles, so one's epilogue overlaps the other's TMA/wgmma main loop (needs 2x registers and shared memory)
    "PROGRAMS_PER_SM": int,
    # epilogue slices whose M x N inputs are loaded before the K loop, 0 .. EPILOGUE_SUBTILE (slice i + P is then
    # loaded before slice i runs); absent: GemmConfig.prefetch_slices' rule
    "PREFETCH": int,
    # pingpong only: the epilogue's one M x N input comes through the loader warp by TMA into shared memory (two
    # slot sets of EPILOGUE_SUBTILE slices), where the input allows it (unit N stride, 16-byte aligned)
    "EPI_TMA": bool,
    # pingpong only: the "epilogue warpgroup" schedule instead of ping-pong (gluon_template): two warpgroups run
    # the main loop of every tile and hand its accumulator, slice by slice, to a third warpgroup that runs the
    # epilogue, through a ring of this many fp32 slice buffers in shared memory (0: ping-pong)
    "EPI_WG": int,
    # pingpong only: each consumer stores its accumulator into shared memory and runs the epilogue as a loop over
    # its EPILOGUE_SUBTILE slices read back from there (one slice's code instead of S inlined copies per consumer):
    # 1: through a ring of CONSUMERS - 1 fp32 [BM, BN] buffers the tiles take in order (one buffer for two
    # consumers); 2: through a [BM, BN / 2] buffer each,
    # one half of the accumulator after the other; 0: the slices straight from registers
    "EPI_SMEM": int,
    # pingpong only: each consumer runs the epilogue as a runtime loop over its accumulator's EPILOGUE_SUBTILE (2 or
    # 4) slices carried in registers (one slice's code per consumer, no shared-memory round trip)
    "EPI_LOOP": bool,
    # pingpong only: the consumers' epilogue in the accumulator's wgmma layout (no layout conversion through shared
    # memory; 4-byte loads and stores instead of 16-byte vectors)
    "EPI_MMA": bool,
    # pingpong only: consumer warpgroups taking the program's tiles in turn (2: CUTLASS's ping-pong; 3: while one
    # runs its main loop, two epilogues run, so an epilogue up to twice a tile's main loop hides; each consumer then
    # has 160 registers instead of 240, and EPI_SMEM = 1 gives CONSUMERS - 1 whole-tile buffers)
    "CONSUMERS": int,
    # pingpong only: how many of the epilogue's M x N tile outputs the consumers store by TMA (each slice's value
    # written into a shared buffer and copied out by the TMA unit: 16-byte writes whatever the epilogue's layout,
    # so EPI_MMA pays for tile-storing epilogues too); ``policy.for_epilogue`` sets it to the epilogue's count, the
    # launcher runs 0 for outputs TMA cannot take (not 16-bit, N stride not 1, not 16-byte aligned)
    "TMA_STORE": int,
    # splitk only: each split's K loop loads A and B through TMA descriptors (the persistent template's K step:
    # Hopper, TMA-able operands; wgmma where BLOCK_M is a multiple of 64), else through masked pointers
    "TMA_LOADS": bool,
}
# Values allowed for the int flags, and the value each flag takes when absent (dropped from ``extra``).
_FLAG_VALUES: dict[str, tuple[Any, ...]] = {"EPILOGUE_SUBTILE": (False, True, 1, 2, 4, 8),
                                           "PROGRAMS_PER_SM": (1, 2, 3, 4), "PREFETCH": (0, 1, 2, 3, 4),
                                           "EPI_WG": (0, 2, 3, 4), "EPI_SMEM": (0, 1, 2), "CONSUMERS": (2, 3),
                                           "TMA_STORE": tuple(range(9))}


def consumers_from_registers(extra: dict[str, Any]) -> bool:
    """Whether a ping-pong config's consumers run the epilogue on slices straight from their registers, inlined or
    in a runtime loop over the register-carried slices (EPI_LOOP), rather than in one of the schedules that move the
    accumulator first (EPI_SMEM: through shared memory, EPI_WG: to epilogue warpgroups). EPI_MMA and TMA_STORE
    apply only then."""
    return not (extra.get("EPI_SMEM") or extra.get("EPI_WG"))


# flags of the Gluon template alone (a fallback to persistent_tma drops them: gemm_launch.resolve_config)
PINGPONG_ONLY_FLAGS = frozenset({"EPI_TMA", "EPI_WG", "EPI_SMEM", "EPI_LOOP", "EPI_MMA", "CONSUMERS", "TMA_STORE"})
_PINGPONG_FLAGS = PINGPONG_ONLY_FLAGS | {"EPILOGUE_SUBTILE", "PREFETCH"}
_FLAG_DEFAULTS: dict[str, Any] = {"EPILOGUE_SUBTILE": False, "WARP_SPECIALIZE": False, "FLATTEN": False,
                                  "PROGRAMS_PER_SM": 1, "PREFETCH": None, "EPI_TMA": False, "EPI_WG": 0,
                                  "EPI_SMEM": 0, "EPI_LOOP": False, "EPI_MMA": False,
                                  "CONSUMERS": 2, "TMA_STORE": 0, "TMA_LOADS": False}
# The Gluon kernel's schedule constexprs and their values when a config does not set them (every Gluon-only flag but
# EPI_TMA, which runtime.gemm sets per call where the input allows it): ``GemmConfig.pingpong_flags``. TMA_STORE
# is among them as the config's count; runtime.gemm sets it to 0 for a call whose outputs TMA cannot take.
PINGPONG_KERNEL_DEFAULTS: dict[str, Any] = {f: _FLAG_DEFAULTS[f] for f in sorted(PINGPONG_ONLY_FLAGS - {"EPI_TMA"})}

# Registers per SM (every NVIDIA GPU since Kepler) and the most one thread can hold: a program of w warps is
# guaranteed co-resident with (programs_per_sm - 1) others whatever its epilogue needs only if
# programs_per_sm * w * 32 * 256 <= REGISTERS_PER_SM (255 registers allocate as 256).
REGISTERS_PER_SM = 65536

# Bytes per thread of prefetched epilogue inputs held in registers through the K loop (64 registers: a 128 x 256
# bf16 tile over 8 warps; the 128 x 256 fp32 accumulator takes 128 registers of the 255)
PREFETCH_BUDGET = 256

DTYPE_BYTES: dict[torch.dtype, int] = {
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.float32: 4,
    torch.float64: 8,
}

TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Tile edge of the few-tile regime: a problem with fewer FEW_TILE_EDGE-square output tiles than the GPU has SMs
# cannot fill it with the 128x256 / 128x128 kernels, so the policy offers small tiles and split-K there, and the
# tuner's keys count such tiles instead of rounding sizes to powers of two (``policy``, ``autotune.problem_buckets``).
FEW_TILE_EDGE = 128


def tiles_128(M: int, N: int, L: int = 1) -> int:
    """How many FEW_TILE_EDGE x FEW_TILE_EDGE output tiles the problem has (every batch's)."""
    return cdiv(M, FEW_TILE_EDGE) * cdiv(N, FEW_TILE_EDGE) * max(L, 1)


# Split-K's reduce kernel (``GemmConfig.reduce_tile``): programs per SM it aims for, and the smallest tile it halves
# the GEMM's tile down to (rows, columns; 16 elements a thread on 4 warps, 16-byte loads of 4 fp32 partials).
REDUCE_PROGRAMS_PER_SM = 2
REDUCE_MIN_TILE = (32, 64)


@dataclass(frozen=True)
class GemmConfig:
    """One point of the tuning space. Frozen and hashable so it can key caches and be stored as JSON.

    ``extra`` is a sorted tuple of (flag, value) pairs (a dict is unhashable); read it with ``flag()``.
    """

    template: str = "portable"
    BLOCK_M: int = 64
    BLOCK_N: int = 64
    BLOCK_K: int = 32
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"GemmConfig.template must be one of {TEMPLATES}, got {self.template!r}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            value = getattr(self, name)
            if not isinstance(value, int) or not _is_pow2(value) or value < 16:
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16 (tl.dot minimum), got {value!r}")
        if not isinstance(self.GROUP_M, int) or self.GROUP_M < 1:
            raise ValueError(f"GemmConfig.GROUP_M must be a positive int, got {self.GROUP_M!r}")
        if not isinstance(self.SPLIT_K, int) or self.SPLIT_K < 1:
            raise ValueError(f"GemmConfig.SPLIT_K must be a positive int, got {self.SPLIT_K!r}")
        if self.SPLIT_K != 1 and self.template != "splitk":
            raise ValueError(f"GemmConfig.SPLIT_K={self.SPLIT_K} needs template='splitk', got {self.template!r}")
        if not isinstance(self.num_warps, int) or not _is_pow2(self.num_warps) or self.num_warps > 32:
            raise ValueError(f"GemmConfig.num_warps must be a power of two <= 32, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be a positive int, got {self.num_stages!r}")
        extra = dict(self.extra)
        for key, value in extra.items():
            if key not in EXTRA_FLAGS:
                raise ValueError(f"GemmConfig.extra has unknown flag {key!r}; known: {sorted(EXTRA_FLAGS)}")
            kind = EXTRA_FLAGS[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                names = "/".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
                raise ValueError(f"GemmConfig.extra[{key!r}] must be {names}, got {value!r}")
            if key in _FLAG_VALUES and value not in _FLAG_VALUES[key]:
                raise ValueError(f"GemmConfig.extra[{key!r}] must be one of {_FLAG_VALUES[key]}, got {value!r}")
        # Canonical spellings (default values dropped, halves as True) make equal configs compare and hash equal.
        canon: dict[str, Any] = {}
        for key, value in extra.items():
            if key == "EPILOGUE_SUBTILE":
                count = _subtile_count(value)
                if count > 1:
                    canon[key] = True if count == 2 else count
            elif value != _FLAG_DEFAULTS[key]:
                canon[key] = value
        extra = canon
        if self.template == "pingpong":
            if set(extra) - _PINGPONG_FLAGS:
                raise ValueError(f"GemmConfig.extra flags {sorted(set(extra) - _PINGPONG_FLAGS)} do not apply to "
                                 f"template='pingpong' ({sorted(_PINGPONG_FLAGS)} do)")
            if extra.get("PREFETCH", 0) > 1:
                raise ValueError(f"GemmConfig.extra PREFETCH={extra['PREFETCH']}: template='pingpong' prefetches one "
                                 "slice ahead at most (0 or 1)")
            if self.num_warps not in (4, 8):
                raise ValueError(f"GemmConfig.num_warps must be 4 or 8 for template='pingpong' (one or two "
                                 f"warpgroups per consumer), got {self.num_warps}")
            if self.num_warps == 8 and (extra.get("EPI_WG") or extra.get("CONSUMERS", 2) != 2
                                        or self.BLOCK_M != 128):
                raise ValueError(f"GemmConfig.num_warps=8 for template='pingpong' (two consumers of two warpgroups "
                                 f"each) needs BLOCK_M == 128, CONSUMERS 2 and no EPI_WG, got BLOCK_M={self.BLOCK_M}, "
                                 f"CONSUMERS={extra.get('CONSUMERS', 2)}, EPI_WG={extra.get('EPI_WG', 0)}")
            if self.BLOCK_M % 64 or self.BLOCK_N > 256:
                raise ValueError(f"template='pingpong' needs BLOCK_M a multiple of 64 (wgmma rows per warpgroup) and "
                                 f"BLOCK_N <= 256 (wgmma width), got {self.BLOCK_M}x{self.BLOCK_N}")
            if self.BLOCK_K < 64 or self.BLOCK_N < 64:
                raise ValueError(f"template='pingpong' needs BLOCK_K >= 64 and BLOCK_N >= 64 (its TMA tiles of 16-bit "
                                 f"operands are 128-byte swizzled: rows of at least 128 bytes), got BLOCK_K="
                                 f"{self.BLOCK_K}, BLOCK_N={self.BLOCK_N}")
            if extra.get("EPI_WG") and (self.BLOCK_M != 128 or extra.get("EPI_TMA")):
                raise ValueError(f"GemmConfig.extra EPI_WG={extra['EPI_WG']} needs BLOCK_M == 128 (two MMA warpgroups "
                                 f"of 64 rows) and no EPI_TMA, got BLOCK_M={self.BLOCK_M}, "
                                 f"EPI_TMA={extra.get('EPI_TMA', False)}")
            if extra.get("EPI_SMEM") == 2 and _subtile_count(extra.get("EPILOGUE_SUBTILE", False)) < 2:
                raise ValueError("GemmConfig.extra EPI_SMEM=2 (a half-tile buffer per consumer) needs EPILOGUE_SUBTILE "
                                 f"2, 4 or 8, got {extra.get('EPILOGUE_SUBTILE', False)!r}")
            if extra.get("CONSUMERS", 2) != 2 and extra.get("EPI_TMA"):
                # Three consumers with the loader's input ring leave output elements unwritten and others wrong on
                # an H100 (2026-11-26: on quarters at every shape with two or more tiles per program; halves passed
                # the six shapes of benchmarks/c3_epi_tma_probe.py, with the cause unknown, so both are refused);
                # the tuner never offered the combination, and three consumers are slower anyway
                # (docs/benchmarks.md).
                raise ValueError(f"GemmConfig.extra EPI_TMA (the epilogue input through the loader) runs with two "
                                 f"consumers only, got CONSUMERS={extra['CONSUMERS']}")
            if extra.get("CONSUMERS", 2) != 2 and extra.get("EPI_WG"):
                raise ValueError(f"GemmConfig.extra CONSUMERS={extra['CONSUMERS']} is the ping-pong schedule's; EPI_WG="
                                 f"{extra['EPI_WG']} is the epilogue-warpgroup schedule (two MMA warpgroups)")
            if extra.get("EPI_SMEM") and (extra.get("EPI_TMA") or extra.get("EPI_WG")):
                raise ValueError(f"GemmConfig.extra EPI_SMEM={extra['EPI_SMEM']} is a ping-pong consumer's epilogue "
                                 f"loop: not with EPI_TMA or EPI_WG, got EPI_TMA={extra.get('EPI_TMA', False)}, "
                                 f"EPI_WG={extra.get('EPI_WG', 0)}")
            if extra.get("EPI_LOOP") and (_subtile_count(extra.get("EPILOGUE_SUBTILE", False)) not in (2, 4)
                                          or extra.get("EPI_SMEM") or extra.get("EPI_WG")):
                raise ValueError("GemmConfig.extra EPI_LOOP (the consumers' epilogue looped over slices in registers) "
                                 "needs EPILOGUE_SUBTILE 2 or 4 and no EPI_SMEM or EPI_WG, got EPILOGUE_SUBTILE="
                                 f"{extra.get('EPILOGUE_SUBTILE', False)!r}, EPI_SMEM={extra.get('EPI_SMEM', 0)}, "
                                 f"EPI_WG={extra.get('EPI_WG', 0)}")
            if not consumers_from_registers(extra):
                for flag, what in (("EPI_MMA", "EPI_MMA (the consumers' epilogue in the wgmma layout)"),
                                   ("TMA_STORE", f"TMA_STORE={extra.get('TMA_STORE')} (the consumers' tile outputs "
                                                 "stored by TMA)")):
                    if extra.get(flag):
                        raise ValueError(f"GemmConfig.extra {what} applies to slices from registers: not with "
                                         f"EPI_SMEM or EPI_WG, got EPI_SMEM={extra.get('EPI_SMEM', 0)}, "
                                         f"EPI_WG={extra.get('EPI_WG', 0)}")
        elif self.template == "splitk":
            if set(extra) - {"TMA_LOADS"}:
                raise ValueError(f"GemmConfig.extra flags {sorted(set(extra) - {'TMA_LOADS'})} do not apply to "
                                 "template='splitk' (TMA_LOADS does)")
        elif "TMA_LOADS" in extra:
            raise ValueError(f"GemmConfig.extra TMA_LOADS only applies to template='splitk', got {self.template!r}")
        elif extra and self.template != "persistent_tma":
            raise ValueError(f"GemmConfig.extra flags {sorted(extra)} only apply to template='persistent_tma'")
        elif PINGPONG_ONLY_FLAGS & set(extra):
            raise ValueError(f"GemmConfig.extra {'/'.join(sorted(PINGPONG_ONLY_FLAGS & set(extra)))} "
                             "only applies to template='pingpong'")
        subtiles = _subtile_count(extra.get("EPILOGUE_SUBTILE", False))
        if subtiles == 8 and not (self.template == "pingpong" and extra.get("EPI_SMEM")):
            raise ValueError("GemmConfig.extra EPILOGUE_SUBTILE=8 needs template='pingpong' with EPI_SMEM (the "
                             "slices looped from shared memory; eight inlined copies of the epilogue would crowd the "
                             f"instruction cache), got template={self.template!r}, EPI_SMEM={extra.get('EPI_SMEM', 0)}")
        if subtiles > 1 and self.BLOCK_N // subtiles < 16:
            raise ValueError(f"GemmConfig.extra EPILOGUE_SUBTILE={subtiles} needs BLOCK_N >= {16 * subtiles} "
                             f"(slices of >= 16 columns), got BLOCK_N={self.BLOCK_N}")
        if extra.get("PREFETCH", 0) > subtiles:
            raise ValueError(f"GemmConfig.extra PREFETCH={extra['PREFETCH']} exceeds the epilogue's slices "
                             f"(EPILOGUE_SUBTILE gives {subtiles}); PREFETCH counts slices, 0 .. {subtiles}")
        object.__setattr__(self, "extra", tuple(sorted(extra.items())))

    def flag(self, name: str, default: Any = False) -> Any:
        """Value of an ``extra`` flag, or ``default``."""
        if name not in EXTRA_FLAGS:
            raise KeyError(f"unknown GemmConfig flag {name!r}; known: {sorted(EXTRA_FLAGS)}")
        return dict(self.extra).get(name, default)

    def pingpong_flags(self) -> dict[str, Any]:
        """The Gluon kernel's schedule constexprs for this config (``PINGPONG_KERNEL_DEFAULTS`` where unset)."""
        return {name: self.flag(name, default) for name, default in PINGPONG_KERNEL_DEFAULTS.items()}

    @property
    def epilogue_subtiles(self) -> int:
        """How many [BM, BN/S] slices the epilogue is called on per tile: 1, 2, 4 or 8 (EPILOGUE_SUBTILE)."""
        return _subtile_count(self.flag("EPILOGUE_SUBTILE"))

    @property
    def epilogue_block_n(self) -> int:
        """Width of the tile the epilogue sees (BLOCK_N / epilogue_subtiles)."""
        return self.BLOCK_N // self.epilogue_subtiles

    @property
    def programs_per_sm(self) -> int:
        """Persistent programs per SM (PROGRAMS_PER_SM; 1 for every template but persistent_tma)."""
        return int(self.flag("PROGRAMS_PER_SM", 1))

    def prefetch_slices(self, tiles: int, elem_bytes: int) -> int:
        """PREFETCH for an epilogue with ``tiles`` M x N inputs of ``elem_bytes`` each (persistent_tma): the flag
        when given, else, for one input, as many slices as fit PREFETCH_BUDGET bytes per thread (at least the
        first, the later ones then follow that many slices ahead); under FLATTEN only the first. None for
        several inputs or under warp specialization. On the H200 (docs/benchmarks.md, prefetch run) two
        prefetched inputs spilled (mixed_dag 1.27 -> 1.35-1.52 x cuBLAS), flattened loops with two or more
        slices prefetched ran 4.5-60 x slower, and with one slice they were the best configs of three rows.)"""
        given = self.flag("PREFETCH", None)
        if given is not None:
            return given
        if self.template == "pingpong":
            return 1 if tiles == 1 else 0
        if tiles != 1 or self.template != "persistent_tma" or self.flag("WARP_SPECIALIZE"):
            return 0
        if self.flag("FLATTEN"):
            return 1
        per_slice = elem_bytes * self.BLOCK_M * self.epilogue_block_n // (32 * self.num_warps)
        return max(1, min(self.epilogue_subtiles, PREFETCH_BUDGET // max(1, per_slice)))

    @property
    def is_persistent(self) -> bool:
        """One program per SM looping over tiles (persistent_tma, pingpong): grid from ``persistent_grid``."""
        return self.template in ("persistent_tma", "pingpong")

    def persistent_programs(self, num_sms: int) -> int:
        """Program count the persistent template strides its tile loop by (constexpr NUM_PROGRAMS)."""
        return max(1, int(num_sms)) * self.programs_per_sm

    def tiles(self, M: int, N: int, L: int = 1) -> int:
        """Output tiles of an (L x) M x N problem: the programs of a non-persistent launch without split-K."""
        return cdiv(M, self.BLOCK_M) * cdiv(N, self.BLOCK_N) * max(L, 1)

    def persistent_grid(self, num_sms: int, work_items: int) -> int:
        """Launch grid of the persistent template: one program per work item, at most ``persistent_programs``."""
        return max(1, min(self.persistent_programs(num_sms), int(work_items)))

    def epilogue_tile(self, M: int, N: int, L: int, num_sms: int) -> tuple[int, int]:
        """[rows, columns] of the tile the epilogue is called on: the grid its ``pid_m`` / ``pid_n`` range over and
        per-tile workspaces are sized by. The persistent templates' S slices: (BLOCK_M, BLOCK_N / S); split-K: its
        reduce kernel's tile (``reduce_tile``); elsewhere the GEMM's tile."""
        if self.template == "splitk":
            return self.reduce_tile(M, N, L, num_sms)
        return self.BLOCK_M, self.epilogue_block_n

    def reduce_tile(self, M: int, N: int, L: int, num_sms: int) -> tuple[int, int]:
        """The tile of split-K's reduce kernel (which sums the partials and runs the epilogue): the GEMM's tile,
        its rows halved down to ``REDUCE_MIN_TILE[0]``, then its columns down to ``REDUCE_MIN_TILE[1]``, until the
        kernel has ``REDUCE_PROGRAMS_PER_SM`` programs per SM.

        Why not the GEMM's tile: split-K runs where output tiles are few, and the reduce moves SPLIT_K fp32
        partials per output element; on one program per GEMM tile a few SMs move all of it. On an H200 at
        512x512x32768 (16 tiles of 128x128, 8 splits) the reduce kernel took 6.7 us (identity) and 12.9 us
        (dgelu_bgrad) against cuBLAS's 2.7 us for its own split-K reduce; on 32x64 tiles (128 programs) 4.5 and 4.8
        us (docs/benchmarks.md, "Split-K's main loop and reduce tile")."""
        bm, bn = self.BLOCK_M, self.BLOCK_N
        target = REDUCE_PROGRAMS_PER_SM * max(1, int(num_sms))
        while cdiv(M, bm) * cdiv(N, bn) * max(1, L) < target:
            if bm > REDUCE_MIN_TILE[0]:
                bm //= 2
            elif bn > REDUCE_MIN_TILE[1]:
                bn //= 2
            else:
                break
        return bm, bn

    def launch_geometry(self, M: int, N: int, K: int, L: int, num_sms: int) -> dict[str, Any]:
        """How this config lays a problem out on a GPU of ``num_sms`` SMs, for people reading a plan (``evtorch
        configs``): output ``tiles`` (x L), the ``programs`` of the main kernel (persistent templates: at most
        their resident count), K ``blocks`` per program, and for split-K its ``splits``, the ``reduce_tile``, the
        ``reduce_programs`` and their ``reduce_warps``."""
        tiles = self.tiles(M, N, L)
        blocks = cdiv(K, self.BLOCK_K)
        out: dict[str, Any] = {"tiles": tiles, "blocks": blocks}
        if self.template == "splitk":
            tile = self.reduce_tile(M, N, L, num_sms)
            out.update(programs=tiles * self.SPLIT_K, splits=self.SPLIT_K, blocks=cdiv(blocks, self.SPLIT_K),
                       reduce_tile=tile, reduce_programs=cdiv(M, tile[0]) * cdiv(N, tile[1]) * max(L, 1),
                       reduce_warps=self.reduce_warps(tile))
        elif self.is_persistent:
            out["programs"] = self.persistent_grid(num_sms, tiles)
        else:
            out["programs"] = tiles
        return out

    def reduce_warps(self, tile: tuple[int, int]) -> int:
        """Warps of split-K's reduce kernel on ``tile``: the config's ``num_warps`` on its own tile; on a smaller
        one 16 elements a thread (a 32 x 64 tile takes 4), at most ``num_warps``. (16 a thread on the 16 x 64 tile,
        2 warps instead of its config's 4, ran its identity reduce at 2.3 us against 1.6, H200.)"""
        if tile == (self.BLOCK_M, self.BLOCK_N):
            return self.num_warps
        return max(1, min(self.num_warps, tile[0] * tile[1] // (32 * 16)))

    def smem_bytes(self, elem_bytes: int) -> int:
        """Pipelined operand buffers in shared memory: (BM*BK + BK*BN) * bytes * stages; with EPI_TMA also the
        ping-pong loader's epilogue-input buffers (two [BM, BN] tiles of 16-bit values), with EPI_WG = R the
        accumulator hand-off ring (R fp32 [BM, BN / EPILOGUE_SUBTILE] slices), with EPI_SMEM the consumers'
        accumulator buffers (CONSUMERS - 1 fp32 [BM, BN] tiles, or a half tile per consumer), with TMA_STORE = T a
        16-bit [BM, BN / EPILOGUE_SUBTILE] buffer per consumer for each output but the one that takes the EPI_TMA
        input's slice buffer."""
        ring = (self.BLOCK_M * self.BLOCK_K + self.BLOCK_K * self.BLOCK_N) * elem_bytes * self.num_stages
        consumers, epi_smem = self.flag("CONSUMERS", 2), self.flag("EPI_SMEM", 0)
        tile_columns = {0: 0, 1: (consumers - 1) * self.BLOCK_N, 2: consumers * self.BLOCK_N // 2}[epi_smem]
        handoff = (self.flag("EPI_WG", 0) * self.epilogue_block_n + tile_columns) * self.BLOCK_M * 4
        stored = max(0, self.flag("TMA_STORE", 0) - (1 if self.flag("EPI_TMA") else 0))
        out_bufs = consumers * stored * self.BLOCK_M * self.epilogue_block_n * 2
        return ring + handoff + out_bufs + (consumers * self.BLOCK_M * self.BLOCK_N * 2 if self.flag("EPI_TMA") else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "GROUP_M": self.GROUP_M,
            "SPLIT_K": self.SPLIT_K,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GemmConfig":
        data = dict(data)
        data["extra"] = tuple(sorted(dict(data.get("extra", {})).items()))
        return cls(**data)

    def short(self) -> str:
        """Compact human-readable name, e.g. 'portable_128x128x32_g8_w4_s4'."""
        text = f"{self.template}_{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}_g{self.GROUP_M}"
        if self.SPLIT_K > 1:
            text += f"_sk{self.SPLIT_K}"
        text += f"_w{self.num_warps}_s{self.num_stages}"
        for key, value in self.extra:
            if value is True:
                text += f"_{key.lower()}"
            elif value or key == "PREFETCH":  # PREFETCH=0 differs from no flag (the rule)
                text += f"_{key.lower()}{value}"
        return text


def _subtile_count(value: Any) -> int:
    """EPILOGUE_SUBTILE's value as a slice count: False/1 -> 1, True/2 -> 2, 4 -> 4, 8 -> 8."""
    if value is True:
        return 2
    return int(value) if value else 1


@dataclass(frozen=True)
class DeviceInfo:
    """What config selection needs to know about where the kernel runs."""

    kind: str  # "cuda", "interpreter" (TRITON_INTERPRET=1) or "cpu" (no Triton execution possible)
    name: str
    capability: tuple[int, int] = (0, 0)
    num_sms: int = 1
    smem_bytes: int = 0  # opt-in max dynamic shared memory per block
    #: Device-to-device copy bandwidth in GB/s, the rate at which a kernel can stream its operands in at best:
    #: the floor under ``policy.cost_steps`` for memory-bound GEMMs (128 rows, a long K). 0: unknown, no floor.
    copy_gbps: float = 0.0

    @property
    def is_hopper(self) -> bool:
        return self.kind == "cuda" and self.capability[0] == 9


# Max opt-in shared memory per block by compute capability, used only if the runtime cannot tell us.
_SMEM_BY_CAPABILITY = {(9, 0): 232448, (8, 0): 166912, (8, 7): 166912, (8, 6): 101376, (8, 9): 101376}
#: Device-to-device copy bandwidth (GB/s) measured by ``evtorch bench``'s ceilings on the boards it ran on (H200
#: 4226-4228, 2026-11-28; H100 SXM 3002, 2026-11-27): 0.88-0.90 of the HBM's peak. Other boards take
#: ``COPY_OF_PEAK`` of the peak the runtime reports, where it reports one.
_COPY_GBPS = {"NVIDIA H200": 4226.0, "NVIDIA H100 80GB HBM3": 3002.0}
COPY_OF_PEAK = 0.88
# The device a Hopper-only choice is sized for where none is given (``policy.for_epilogue``): an H100 SXM.
HOPPER = DeviceInfo("cuda", "Hopper", (9, 0), 132, _SMEM_BY_CAPABILITY[(9, 0)], _COPY_GBPS["NVIDIA H100 80GB HBM3"])
#: Devices to plan configs for off the GPU (``evtorch configs --device NAME``): the SXM boards' SM counts, shared
#: memory and copy bandwidth (H100 and H200: 132 SMs, 227 KiB a block; 3.0 and 4.2 TB/s).
NAMED_DEVICES: dict[str, DeviceInfo] = {
    "hopper": HOPPER,
    "h100": replace(HOPPER, name="NVIDIA H100 80GB HBM3"),
    "h200": replace(HOPPER, name="NVIDIA H200", copy_gbps=_COPY_GBPS["NVIDIA H200"]),
    "a100": DeviceInfo("cuda", "A100", (8, 0), 108, _SMEM_BY_CAPABILITY[(8, 0)]),
}


def _copy_gbps(props: Any) -> float:
    """The board's measured copy bandwidth, else ``COPY_OF_PEAK`` of its HBM peak (double data rate over the bus)
    where torch reports the memory clock (kHz) and bus width (bits), else 0 (unknown)."""
    if props.name in _COPY_GBPS:
        return _COPY_GBPS[props.name]
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0) or 0, getattr(props, "memory_bus_width", 0) or 0
    return COPY_OF_PEAK * 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else 0.0


@functools.lru_cache(maxsize=None)
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    cap = (props.major, props.minor)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    if smem <= 0:
        try:
            import triton

            smem = int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
        except Exception:  # noqa: BLE001 - fall back to the table below
            smem = _SMEM_BY_CAPABILITY.get(cap, 49152)
    return DeviceInfo("cuda", props.name, cap, int(props.multi_processor_count), smem, _copy_gbps(props))


def device_info(device: "torch.device | str | int | DeviceInfo | None" = None) -> DeviceInfo:
    """DeviceInfo for ``device``; the interpreter wins whenever TRITON_INTERPRET=1.

    A DeviceInfo passed in is returned as is (plan configs for a GPU you are not on, or test pruning)."""
    if isinstance(device, DeviceInfo):
        return device
    if knobs.interpreter_active():
        return DeviceInfo("interpreter", "triton-interpreter", (0, 0), 4, 1 << 20)
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceInfo("cpu", "cpu", (0, 0), 1, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_info(index)


def elem_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of a GEMM operand dtype; a ValueError naming the dtypes a GEMM takes otherwise."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {list(DTYPE_BYTES)} for a GEMM, got {dtype}") from None


def check_sizes(M: int, N: int, K: int, L: int) -> None:
    """A ValueError naming the size that is not a non-negative int (the policy's entry points check first)."""
    for name, value in (("M", M), ("N", N), ("K", K), ("L", L)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def interpreter_config(M: int, N: int, K: int) -> GemmConfig:
    """Small tiles for the CPU interpreter, which runs each program in NumPy: few large ops per program
    are faster than many, but tiles past the problem size only waste work."""
    bm = min(32, max(16, next_pow2(M)))
    bn = min(32, max(16, next_pow2(N)))
    bk = min(32, max(16, next_pow2(K)))
    return GemmConfig("portable", bm, bn, bk, GROUP_M=8, num_warps=4, num_stages=1)


# Shared memory a kernel needs beyond ``GemmConfig.smem_bytes``: layout conversions' scratch (an fp32 accumulator
# slice on its way to the epilogue's layout), barriers, cross-warp reductions. A ping-pong config whose epilogue
# runs in the accumulator's wgmma layout (EPI_MMA) converts nothing: its barriers and reduction scratch took
# 360-700 bytes in sm_90 compiles of the bench's epilogues (Triton 3.9, 2026-11-27: bce_loss, rowreduce_tanh,
# lincomb_relu 360 / 392, dgelu_bgrad's column sum 664 / 696 on 4 / 5 ring stages), so 2 KiB is kept for it.
SMEM_HEADROOM = 8192
SMEM_HEADROOM_MMA = 2048


def fits_smem(config: GemmConfig, dtype: torch.dtype, info: DeviceInfo) -> bool:
    """Operand pipeline buffers fit, keeping ``SMEM_HEADROOM`` for Triton's barriers and layout conversions
    (``SMEM_HEADROOM_MMA`` for a ping-pong epilogue in the wgmma layout, which converts nothing); with
    PROGRAMS_PER_SM = p, p programs (each with that headroom and the 1 KiB the hardware reserves per block)
    fit in one SM's shared memory (the per-block opt-in limit + 1 KiB: 228 KiB on Hopper). A kernel that still
    needs more (an epilogue with unusually large reduction scratch) fails to compile: the tuner skips it."""
    if info.kind != "cuda":
        return True
    return config.programs_per_sm <= resident_programs(config, dtype, info)


def resident_programs(config: GemmConfig, dtype: torch.dtype, info: DeviceInfo) -> int:
    """How many programs of ``config`` one SM's shared memory holds at once: each takes its buffers, the headroom
    ``fits_smem`` keeps and the 1 KiB the hardware reserves per block, within the per-block opt-in limit + 1 KiB
    (228 KiB on Hopper). 0 where even one does not fit."""
    mma = config.template == "pingpong" and config.flag("EPI_MMA")
    need = config.smem_bytes(elem_bytes(dtype)) + (SMEM_HEADROOM_MMA if mma else SMEM_HEADROOM)
    return (info.smem_bytes + 1024) // (need + 1024)


def fits_registers(config: GemmConfig) -> bool:
    """PROGRAMS_PER_SM programs of num_warps warps stay co-resident even at 255 registers per thread (the
    kernels set no register cap, and heavy epilogues reach 255): programs * warps <= 8."""
    pps = config.programs_per_sm
    return pps == 1 or pps * config.num_warps * 32 * 256 <= REGISTERS_PER_SM


def fits_shape(config: GemmConfig, M: int, N: int, K: int) -> bool:
    """Reject tiles much larger than the problem (e.g. 256-wide tiles for M=8): they waste MMA work."""
    return (
        config.BLOCK_M <= max(16, next_pow2(M))
        and config.BLOCK_N <= max(16, next_pow2(N))
        and config.BLOCK_K <= max(16, next_pow2(K))
    )
