"""Launch a rendered GEMM kernel: strides, grid, split-K workspace, TMA eligibility and fallback.

Why here and not in the template: the template text is shape- and layout-agnostic (all sizes and strides
are runtime arguments, layout choices are constexprs), so one compiled kernel per config serves every
(M, N, K, L) and every stride pattern. This module turns concrete tensors into those arguments.

Operand shapes: A is (M, K) or (L, M, K); B is (K, N) or (L, K, N). A 2-D operand, or a 3-D one with a
batch of 1, is broadcast over the other's batch (batch stride 0). Any strides are accepted by the portable
and split-K templates; persistent_tma needs TMA-compatible layouts (see ``tma_eligible``) and otherwise
falls back to the portable kernel (``resolve_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from evtorch.codegen.configs import DTYPE_BYTES, PINGPONG_ONLY_FLAGS, TMA_DTYPES, GemmConfig, cdiv, device_info
from evtorch.codegen.gemm_template import kernel_symbol
from evtorch.runtime import knobs

MAX_GRID_YZ = 65535  # CUDA limit on grid dimensions 1 and 2


@dataclass(frozen=True)
class GemmProblem:
    """Sizes and element strides of ``A @ B`` (batch strides are 0 for broadcast operands)."""

    M: int
    N: int
    K: int
    L: int
    a_strides: tuple[int, int, int]  # (s_al, s_am, s_ak)
    b_strides: tuple[int, int, int]  # (s_bl, s_bk, s_bn)
    dtype: torch.dtype
    a_batched: bool
    b_batched: bool


def gemm_problem(A: torch.Tensor, B: torch.Tensor) -> GemmProblem:
    """Validate operands and extract sizes/strides; errors name the offending argument."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"A must be a torch.Tensor, got {type(A).__name__}")
    if not isinstance(B, torch.Tensor):
        raise TypeError(f"B must be a torch.Tensor, got {type(B).__name__}")
    if A.dim() not in (2, 3):
        raise ValueError(f"A must be (M, K) or (L, M, K), got shape {tuple(A.shape)}")
    if B.dim() not in (2, 3):
        raise ValueError(f"B must be (K, N) or (L, K, N), got shape {tuple(B.shape)}")
    if A.dtype != B.dtype:
        raise ValueError(f"A and B must have the same dtype, got A {A.dtype} and B {B.dtype}")
    if A.dtype not in DTYPE_BYTES:
        raise ValueError(f"A.dtype must be one of {list(DTYPE_BYTES)}, got {A.dtype}")
    if A.device != B.device:
        raise ValueError(f"A and B must be on one device, got A on {A.device} and B on {B.device}")
    M, K = A.shape[-2], A.shape[-1]
    Kb, N = B.shape[-2], B.shape[-1]
    if K != Kb:
        raise ValueError(f"inner dimensions differ: A {tuple(A.shape)} has K={K}, B {tuple(B.shape)} has K={Kb}")
    la = A.shape[0] if A.dim() == 3 else 1
    lb = B.shape[0] if B.dim() == 3 else 1
    if la != lb and 1 not in (la, lb):
        raise ValueError(f"batch sizes differ: A has L={la}, B has L={lb} (only 1 broadcasts)")
    L = max(la, lb)
    a_batched = la > 1
    b_batched = lb > 1
    s_al = A.stride(0) if a_batched else 0
    s_bl = B.stride(0) if b_batched else 0
    return GemmProblem(
        M, N, K, L,
        (s_al, A.stride(-2), A.stride(-1)),
        (s_bl, B.stride(-2), B.stride(-1)),
        A.dtype, a_batched, b_batched,
    )


def _operand_major(rows: int, cols: int, s_row: int, s_col: int) -> str | None:
    """'row' if the column stride is 1, 'col' if the row stride is 1, else None (TMA needs one unit stride)."""
    if s_col == 1:
        return "row"
    if s_row == 1:
        return "col"
    return None


def _tma_operand_ok(t: torch.Tensor, batched: bool, s_batch: int, s_row: int, s_col: int) -> tuple[bool, bool]:
    """(ok, col_major) for one operand under TMA rules: last stride 1, other strides and base 16-byte aligned."""
    major = _operand_major(t.shape[-2], t.shape[-1], s_row, s_col)
    if major is None:
        return False, False
    elem = t.element_size()
    outer = s_row if major == "row" else s_col
    strides = [outer] + ([s_batch] if batched else [])
    ok = t.data_ptr() % 16 == 0 and all(s > 0 and (s * elem) % 16 == 0 for s in strides)
    return ok, major == "col"


def tma_layout(A: torch.Tensor, B: torch.Tensor) -> tuple[bool, bool, bool]:
    """(eligible, a_col_major, b_col_major) ignoring the device: dtype fp16/bf16/fp32, non-empty, each
    operand row- or column-major with 16-byte aligned base and non-unit strides."""
    p = gemm_problem(A, B)
    if p.dtype not in TMA_DTYPES or min(p.M, p.N, p.K) == 0:
        return False, False, False
    a_ok, a_col = _tma_operand_ok(A, p.a_batched, p.a_strides[0], p.a_strides[1], p.a_strides[2])
    b_ok, b_col = _tma_operand_ok(B, p.b_batched, p.b_strides[0], p.b_strides[1], p.b_strides[2])
    return a_ok and b_ok, a_col, b_col


def tma_eligible(A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether persistent_tma (or split-K's TMA_LOADS) may run: TMA-compatible layout, on a Hopper GPU (capability 9.x) or under
    the Triton interpreter (which emulates descriptors and checks the same alignment rules)."""
    info = device_info(A.device)
    if not (info.is_hopper or info.kind == "interpreter"):
        return False
    return tma_layout(A, B)[0]


def layout_class(A: torch.Tensor, B: torch.Tensor) -> str:
    """Short layout signature for tuning keys, e.g. 'A:row,B:col,bat:AB,tma'."""
    p = gemm_problem(A, B)

    def major(t: torch.Tensor, s_row: int, s_col: int) -> str:
        return _operand_major(t.shape[-2], t.shape[-1], s_row, s_col) or "strided"

    bat = ("A" if p.a_batched else "") + ("B" if p.b_batched else "")
    text = f"A:{major(A, *p.a_strides[1:])},B:{major(B, *p.b_strides[1:])},bat:{bat or '-'}"
    return text + (",tma" if tma_layout(A, B)[0] else "")


def resolve_config(A: torch.Tensor, B: torch.Tensor, config: GemmConfig) -> GemmConfig:
    """The config that will actually run: pingpong becomes persistent_tma (same tiles, sub-tiling up to 4 slices,
    8 warps) outside its scope (``pingpong_eligible``), and persistent_tma becomes portable (same tile sizes) when
    the operands or the device don't allow TMA. Call it before ``grid_tiles`` to size per-tile workspaces."""
    if not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    if config.template == "pingpong" and not pingpong_eligible(A, B):
        # the persistent template's slices: at most 4 (EPILOGUE_SUBTILE=8 is the EPI_SMEM loop's)
        extra = tuple((k, min(v, 4) if k == "EPILOGUE_SUBTILE" else v) for k, v in config.extra
                      if k not in PINGPONG_ONLY_FLAGS)
        config = GemmConfig("persistent_tma", config.BLOCK_M, config.BLOCK_N, config.BLOCK_K, config.GROUP_M, 1, 8,
                            min(config.num_stages, 3), extra)
    if config.template == "persistent_tma" and not tma_eligible(A, B):
        return dataclasses.replace(config, template="portable", extra=())
    if config.flag("TMA_LOADS") and not tma_eligible(A, B):  # split-K's pointer loop, same tiles and splits
        return dataclasses.replace(config, extra=())
    return config


def pingpong_eligible(A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether the Gluon ping-pong template takes these operands: TMA-able on a Hopper GPU, fp16/bf16, A
    row-major, no batch, K > 0 (``gluon_template`` scope), and the installed Triton has Gluon's Hopper API."""
    from evtorch.codegen.gluon_template import available

    if not device_info(A.device).is_hopper or A.dtype not in (torch.float16, torch.bfloat16):
        return False
    p = gemm_problem(A, B)
    ok, a_col, _ = tma_layout(A, B)
    return ok and not a_col and p.L == 1 and p.K > 0 and available()


def grid_tiles(M: int, N: int, config: GemmConfig, *, L: int = 1, num_sms: int | None = None) -> tuple[int, int]:
    """(tiles_m, tiles_n) of the tile grid the epilogue sees: the range of its pid_m and pid_n
    (``GemmConfig.epilogue_tile``).

    With EPILOGUE_SUBTILE = S the epilogue is called on [BM, BN/S] slices with pid_n = S*tile_n + slice, so
    tiles_n is S times larger; split-K's epilogue runs on its reduce kernel's tile, which depends on the batch
    count ``L`` and the device's ``num_sms`` (required for a splitk config). Pass a config already through
    ``resolve_config``.
    """
    if not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    if config.template == "splitk" and num_sms is None:
        raise ValueError("num_sms is required for a splitk config (its reduce tile depends on it), got None")
    bm, bn = config.epilogue_tile(M, N, L, num_sms or 1)
    return cdiv(M, bm), cdiv(N, bn)


def _acc_dtype(dtype: torch.dtype) -> Any:
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _index_dtype(bits: int) -> Any:
    import triton.language as tl

    return tl.int32 if bits == 32 else tl.int64


def narrow_index(launch: "PreparedLaunch") -> None:
    """Let ``launch``'s epilogue compute element offsets along M and N in int32 (INDEX_DTYPE): for a caller that
    has checked that every offset of every epilogue tensor, over the tiles' index range, is below 2^31."""
    for kw in (launch.common, launch.reduce_kwargs):
        if kw and "INDEX_DTYPE" in kw:
            kw["INDEX_DTYPE"] = _index_dtype(32)


def _tma_allocator(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """Global scratch for device-side TMA descriptors (128 bytes per descriptor per program), a fresh allocation
    per launch. Not a buffer kept per stream, although that would save the ``torch.empty``: tried on 2026-11-28,
    a kept buffer first allocated while torch.compile's CUDA-graph trees warm a graph up (``mode="reduce-overhead"``:
    allocations then come from the graph's private pool, with no capture under way to detect) stays alive in that
    pool, and the trees refuse it ("Detected 1 tensor(s) in the cudagraph pool not tracked as outputs"; an H200,
    torch 2.11: an ``evt.linear`` step compiled that way failed with the kept buffer and ran with this function).
    ``tests/test_integration.py::test_gpu_reduce_overhead_step`` holds that case."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def install_tma_allocator() -> None:
    # Triton keeps the allocator in a ContextVar, so a value set in another thread or context is not seen
    # here; setting it on every persistent launch is cheap and always correct.
    import triton

    triton.set_allocator(_tma_allocator)


_install_tma_allocator = install_tma_allocator


def _kernel(module: ModuleType, base: str, template: str):
    name = kernel_symbol(base, template)
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(
            f"module {getattr(module, '__name__', module)!r} has no kernel {name!r} for kernel_name={base!r}, "
            f"template={template!r}; render it with render_gemm_kernels(..., templates=(..., {template!r}))"
        )
    return fn


def default_workspace(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Split-K partials buffer; uninitialised is fine because every slot is written before it is read."""
    return torch.empty(shape, dtype=dtype, device=device)


def launch_gemm(
    module: ModuleType,
    kernel_name: str,
    A: torch.Tensor,
    B: torch.Tensor,
    epilogue_args: Sequence[Any],
    config: GemmConfig,
    allow_tf32: bool,
    workspace_fn: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] | None = None,
) -> None:
    """Run ``epilogue(A @ B)`` with the kernels ``render_gemm_kernels(kernel_name, ...)`` put in ``module``.

    ``epilogue_args`` are the epilogue's runtime parameters in ``EpilogueKernelSpec.params`` order.
    ``allow_tf32`` only affects fp32 operands. ``workspace_fn(shape, dtype, device)`` allocates the split-K
    partials buffer (default: ``torch.empty``); pass one to reuse buffers. Empty outputs (M, N or L = 0)
    launch nothing; K = 0 runs the epilogue on a zero accumulator.

    ``prepare_launch`` does the same work once for a call signature; this is ``prepare_launch(...)(A, B,
    epilogue_args)`` with the checks in their usual order.
    """
    gemm_problem(A, B)
    resolve_config(A, B, config)
    if isinstance(epilogue_args, (str, bytes)) or not hasattr(epilogue_args, "__iter__"):
        raise TypeError(f"epilogue_args must be a list, got {type(epilogue_args).__name__}")
    prepare_launch(module, kernel_name, A, B, config, allow_tf32, workspace_fn)(A, B, list(epilogue_args))


class PreparedLaunch:
    """The launch of one GEMM signature (operand shapes, strides, dtype, device; config; kernels), worked out
    once by ``prepare_launch``: kernel objects bound to their grids, sizes and strides, constexpr arguments.
    ``launch(A, B, epilogue_args)`` launches for operands of that signature (new tensors, same layout); it does
    not re-check them: callers key their caches on everything ``prepare_launch`` read."""

    __slots__ = ("mode", "fn", "jit", "grid", "tail", "common", "device_index", "reduce_fn", "reduce_kwargs",
                 "work_shape", "work_dtype", "workspace_fn", "config", "splitk_kernels")

    def __call__(self, A: torch.Tensor, B: torch.Tensor, epilogue_args: Sequence[Any],
                 flags: dict | None = None) -> None:
        """``flags``: constexprs that replace the prepared ones for this launch (a one-kernel template's variant
        chosen per call, e.g. the ping-pong kernel's EPI_TMA where the input allows it)."""
        if self.mode is None:
            return
        index = self.device_index
        if index is not None and torch.cuda.current_device() != index:
            # Triton launches on the current device; make it A's so multi-GPU callers need not switch.
            with torch.cuda.device(index):
                self._launch(A, B, epilogue_args, flags)
        else:
            self._launch(A, B, epilogue_args, flags)

    def _launch(self, A, B, epilogue_args, flags=None) -> None:
        mode = self.mode
        common = self.common if not flags else {**self.common, **flags}
        if flags and mode == "splitk":
            raise ValueError(f"flags {sorted(flags)} apply to one-kernel templates, not split-K's two kernels")
        if mode == "portable":
            self.fn(A, B, *self.tail, *epilogue_args, **common)
        elif mode in ("persistent_tma", "pingpong"):
            if self.device_index is not None:
                install_tma_allocator()
            self.fn(A, B, *self.tail, *epilogue_args, **common)
        else:  # splitk
            shape, acc_torch = self.work_shape, self.work_dtype
            work = (self.workspace_fn or default_workspace)(shape, acc_torch, A.device)
            if tuple(work.shape) != shape or work.dtype != acc_torch or not work.is_contiguous():
                raise ValueError(
                    f"workspace_fn returned {tuple(work.shape)} {work.dtype} contiguous={work.is_contiguous()}; "
                    f"need contiguous {shape} {acc_torch}"
                )
            if self.device_index is not None and self.common["TMA_LOADS"]:
                install_tma_allocator()
            self.fn(A, B, *self.tail, work, **self.common)
            tail = self.tail
            self.reduce_fn(work, tail[0], tail[1], tail[3], *epilogue_args, **self.reduce_kwargs)


def prepare_launch(
    module: ModuleType,
    kernel_name: str,
    A: torch.Tensor,
    B: torch.Tensor,
    config: GemmConfig,
    allow_tf32: bool,
    workspace_fn: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] | None = None,
) -> PreparedLaunch:
    """Validate A and B and work out the launch of ``config`` for them (see ``launch_gemm``): the returned
    ``PreparedLaunch`` launches for any operands with A's and B's shapes, strides, dtype, device and 16-byte
    alignment (the TMA choice depends on it)."""
    p = gemm_problem(A, B)
    config = resolve_config(A, B, config)
    out = PreparedLaunch()
    out.config = config
    out.mode = None
    out.fn = out.jit = out.grid = out.reduce_fn = out.reduce_kwargs = out.work_shape = out.work_dtype = None
    out.splitk_kernels = None
    out.workspace_fn = workspace_fn
    out.device_index = (A.device.index if A.device.index is not None else torch.cuda.current_device()) \
        if A.device.type == "cuda" else None
    out.tail = (p.M, p.N, p.K, p.L, *p.a_strides, *p.b_strides)
    out.common = {}
    if p.M == 0 or p.N == 0 or p.L == 0:
        return out
    if p.L > MAX_GRID_YZ:
        raise ValueError(f"batch size L={p.L} exceeds the grid limit {MAX_GRID_YZ}; fold batches into M")
    tiles = config.tiles(p.M, p.N)
    common = dict(
        BLOCK_M=config.BLOCK_M,
        BLOCK_N=config.BLOCK_N,
        BLOCK_K=config.BLOCK_K,
        GROUP_M=config.GROUP_M,
        ALLOW_TF32=bool(allow_tf32) and p.dtype == torch.float32,
        ACC_DTYPE=_acc_dtype(p.dtype),
        # The interpreter's tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584): upcast there.
        DOT_UPCAST=p.dtype == torch.bfloat16 and knobs.interpreter_active(),
        # every tile (and sub-tile) whole along M / N: the epilogue's bounds masks fold away (codegen.epilogue)
        EVEN_M=p.M % config.BLOCK_M == 0,
        EVEN_N=p.N % config.BLOCK_N == 0,
        # the epilogue's element offsets along M and N: int64 unless the caller, who knows the epilogue's tensors,
        # narrows it (runtime.gemm: int32 where every offset fits)
        INDEX_DTYPE=_index_dtype(64),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if config.template in ("portable", "splitk"):
        # the pointer templates' own K loop: every step's run of K whole, its K mask folds away
        common["EVEN_K"] = p.K % config.BLOCK_K == 0
    if config.template == "portable":
        out.jit, out.grid = _kernel(module, kernel_name, "portable"), (tiles, p.L)
    elif config.template == "splitk":
        split = config.SPLIT_K
        if split > MAX_GRID_YZ:
            raise ValueError(f"config.SPLIT_K={split} exceeds the grid limit {MAX_GRID_YZ}")
        out.work_dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
        out.work_shape = (split, p.L, p.M, p.N)
        # the reduce kernel (partials summed, then the epilogue) on its own, smaller tile where GEMM tiles are few
        rm, rn = config.reduce_tile(p.M, p.N, p.L, device_info(A.device).num_sms)
        reduce_tiles = cdiv(p.M, rm) * cdiv(p.N, rn)
        # (partials kernel, its grid, reduce kernel, its grid), for runtime.launcher's direct launches
        out.splitk_kernels = (_kernel(module, kernel_name, "splitk"), (tiles, split, p.L),
                              _kernel(module, kernel_name, "splitk_reduce"), (reduce_tiles, p.L))
        out.fn = out.splitk_kernels[0][out.splitk_kernels[1]]
        out.reduce_fn = out.splitk_kernels[2][out.splitk_kernels[3]]
        out.reduce_kwargs = dict(BLOCK_M=rm, BLOCK_N=rn, GROUP_M=config.GROUP_M,
                                 SPLIT_K=split, ACC_DTYPE=common["ACC_DTYPE"], EVEN_M=p.M % rm == 0,
                                 EVEN_N=p.N % rn == 0, INDEX_DTYPE=common["INDEX_DTYPE"],
                                 num_warps=config.reduce_warps((rm, rn)),
                                 num_stages=1)
        _, a_col, b_col = tma_layout(A, B)
        tma = bool(config.flag("TMA_LOADS"))  # (resolve_config dropped it where the operands don't allow TMA)
        common.update(SPLIT_K=split, TMA_LOADS=tma, A_COL_MAJOR=tma and a_col, B_COL_MAJOR=tma and b_col,
                      A_BATCHED=tma and p.a_batched, B_BATCHED=tma and p.b_batched)
    elif config.template == "persistent_tma":
        _, a_col, b_col = tma_layout(A, B)
        num_sms = device_info(A.device).num_sms
        out.jit = _kernel(module, kernel_name, "persistent_tma")
        out.grid = (config.persistent_grid(num_sms, tiles * p.L),)
        common.update(
            NUM_PROGRAMS=config.persistent_programs(num_sms),
            A_COL_MAJOR=a_col, B_COL_MAJOR=b_col,
            A_BATCHED=p.a_batched, B_BATCHED=p.b_batched,
            EPILOGUE_SUBTILE=config.epilogue_subtiles,
            WARP_SPECIALIZE=bool(config.flag("WARP_SPECIALIZE")),
            FLATTEN=bool(config.flag("FLATTEN")),
            PREFETCH=config.prefetch_slices(getattr(module, "EPILOGUE_PREFETCH", 0), A.element_size()),
        )
    elif config.template == "pingpong":
        from evtorch.codegen.gluon_template import launch_maxnreg

        num_sms = device_info(A.device).num_sms
        out.jit, out.grid = _kernel(module, kernel_name, "pingpong"), (config.persistent_grid(num_sms, tiles),)
        del common["num_stages"]  # the ring depth is the STAGES constexpr; Gluon does no software pipelining
        flags = config.pingpong_flags()  # configs.PINGPONG_KERNEL_DEFAULTS' schedule constexprs
        common.update(NUM_PROGRAMS=config.persistent_programs(num_sms), STAGES=config.num_stages,
                      B_COL_MAJOR=tma_layout(A, B)[2], EPILOGUE_SUBTILE=config.epilogue_subtiles, **flags,
                      maxnreg=launch_maxnreg(flags["EPI_WG"], flags["CONSUMERS"], config.num_warps),
                      PREFETCH=config.prefetch_slices(getattr(module, "EPILOGUE_PREFETCH", 0), A.element_size()),
                      EPI_TMA=False)  # runtime.gemm turns it on per call where the input allows (see there)
    else:  # GemmConfig validates templates; this guards future additions
        raise ValueError(f"config.template {config.template!r} has no launcher")
    if out.jit is not None:  # one kernel launch (not split-K's two): ``jit`` and ``grid`` for runtime.launcher
        out.fn = out.jit[out.grid]
    out.common = common
    out.mode = config.template
    return out
