"""Triton source text for GEMM kernels that hand each accumulator tile to a generated epilogue.

The contract (docs/ARCHITECTURE.md): a template computes ``acc = A @ B`` for one [BLOCK_M, BLOCK_N] tile and
calls ``epilogue(acc, offs_m, offs_n, pid_m, pid_n, pid_l, M, N, L, EVEN_M, EVEN_N, INDEX_DTYPE, *params)`` once
per (sub-)tile, knowing nothing about what the epilogue does (the three launch flags are the launcher's
constexprs, forwarded as they are: ``codegen.epilogue``). The epilogue's runtime parameters are appended to the kernel
signature and forwarded verbatim, so a single epilogue function serves every template.

Why render text instead of writing the kernels once: the epilogue is a different Python function for
every fused graph and Triton resolves callees by name from the kernel's module globals, so each
(epilogue, template) pair needs its own kernel definition in the generated module. The templates are
plain strings with ``__MARKERS__`` (not ``str.format``: kernel bodies contain braces-free code today, but
markers make accidental substitution impossible).

Templates
---------
- ``portable``: one program per output tile, grid ``(cdiv(M,BM)*cdiv(N,BN), L)``, GROUP_M swizzle, pointer
  loads with masks on M/N/K, arbitrary strides, int64 offset math. Works on every GPU and the interpreter.
- ``splitk``: like portable, but grid axis 1 splits the K loop into SPLIT_K slices, each writing an
  unreduced tile to a workspace ``W[SPLIT_K, L, M, N]`` (ACC_DTYPE). No epilogue call.
- ``splitk_reduce``: sums the SPLIT_K partials of one tile in a fixed order (deterministic), then calls the
  epilogue exactly once per tile (so epilogue reductions and multiple outputs are not duplicated).
- ``persistent_tma``: Hopper; NUM_PROGRAMS persistent programs (PROGRAMS_PER_SM per SM: with 2, one program's
  epilogue runs while the other's main loop keeps the tensor cores busy, "ping-pong" by co-residency) loop over
  (batch, tile) work items in grouped order, strided by NUM_PROGRAMS; the launch grid is
  min(NUM_PROGRAMS, work items). A/B tiles come from device-side TMA descriptors (``tl.make_tensor_descriptor``,
  needs ``triton.set_allocator``), the K loop is software-pipelined by the launch's ``num_stages``, and with
  EPILOGUE_SUBTILE = S (1, 2 or 4) the accumulator is split into S [BM, BN/S] slices, each handed to the
  epilogue with its own ``offs_n`` and ``pid_n`` (``S*pid_n + slice``), so per-tile workspaces indexed by
  pid_n never collide.

Both Triton 3.6 and 3.9 accept ``tl.dot(..., input_precision="tf32"|"ieee")`` (``allow_tf32`` is
deprecated), ``tl.make_tensor_descriptor`` and ``tl.range(..., flatten=, warp_specialize=)``.
"""

from __future__ import annotations

import keyword

from .epilogue import LAUNCH_FLAGS, launch_flags_signature

RENDERABLE: tuple[str, ...] = ("portable", "splitk", "splitk_reduce", "persistent_tma")

HEADER = "import triton\nimport triton.language as tl\n"

# ---------------------------------------------------------------------------------------------------
# Shared snippets
# ---------------------------------------------------------------------------------------------------

def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


# Grouped ("super-tile") ordering of a linear tile index ``__T__`` so that GROUP_M row-tiles reuse the same
# B columns from L2. Needs num_pid_m and num_pid_in_group; produces pid_m, pid_n. Unindented: the persistent
# templates (this one and gluon_template's, as Gluon) place it inside their tile loops.
GROUP_ORDER = """\
group_id = __T__ // num_pid_in_group
first_pid_m = group_id * GROUP_M
group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
pid_m = first_pid_m + (__T__ % num_pid_in_group) % group_size_m
pid_n = (__T__ % num_pid_in_group) // group_size_m
"""
_SWIZZLE = """\
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
""" + _indent(GROUP_ORDER, 4)

# acc += a @ b. fp32 operands use TF32 tensor cores only when allowed (torch's allow_tf32 semantics), else
# IEEE fp32. DOT_UPCAST (set by the launcher only under the CPU interpreter, whose tl.dot multiplies bf16 bit
# patterns: triton-lang/triton#11584) computes the product in fp32 instead. out_dtype is the accumulator's: tl.dot's
# default is fp32, and Triton 3.6 asserts that a given acc has out_dtype's type, so fp64 operands (ACC_DTYPE fp64)
# failed to compile on the GPU without it (the interpreter's Triton 3.9 accepted them: found 2026-11-29, H200).
_DOT = """\
if DOT_UPCAST:
    a = a.to(tl.float32)
    b = b.to(tl.float32)
if ALLOW_TF32:
    acc = tl.dot(a, b, acc, input_precision="tf32", out_dtype=ACC_DTYPE)
else:
    acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=ACC_DTYPE)
"""


# One K step of a pointer-based loop: masked loads (ragged M, N, K), dot with the requested precision. With EVEN_K
# (K a multiple of BLOCK_K, so every step's run of K is whole) the K mask is constant true and folds away.
_POINTER_K_STEP = (
    """\
        k_mask = (offs_k < k_hi - k0) | EVEN_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & mask_n[None, :], other=0.0)
"""
    + _indent(_DOT, 8)
    + """\
        a_ptrs += a_step
        b_ptrs += b_step
"""
)

# Tile coordinates and int64 operand pointers at K offset ``k_lo``. Products like row * stride_am can exceed
# int32 for large L*M*K, so rows/cols/k are widened before the multiply; the K advance per step is int64 too.
_POINTER_SETUP = """\
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = (offs_m < M) | EVEN_M  # constant true (folded away) when every tile is whole along M
    mask_n = (offs_n < N) | EVEN_N
    rm = offs_m.to(tl.int64)
    rn = offs_n.to(tl.int64)
    rk = offs_k.to(tl.int64) + k_lo
    batch = pid_l.to(tl.int64)
    a_ptrs = A_ptr + batch * stride_al + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B_ptr + batch * stride_bl + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
"""

# TMA descriptors for A and B (device-side: ``tl.make_tensor_descriptor`` needs ``triton.set_allocator``). The
# launcher guarantees: each operand is row-major (last stride 1) or column-major (*_COL_MAJOR: the M/N stride is
# 1), non-unit strides and the base are 16-byte aligned. *_BATCHED operands use 3-D descriptors [L, rows, cols]
# so that TMA's zero padding stops at batch boundaries (a 2-D view of L*K rows would leak the next batch's K rows
# into the reduction). Unindented, like the K step after it: the persistent template and split-K's TMA loop
# place them.
_TMA_DESCRIPTORS = """\
if A_BATCHED:
    if A_COL_MAJOR:
        a_desc = tl.make_tensor_descriptor(A_ptr, shape=[L, K, M], strides=[stride_al, stride_ak, 1],
                                           block_shape=[1, BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(A_ptr, shape=[L, M, K], strides=[stride_al, stride_am, 1],
                                           block_shape=[1, BLOCK_M, BLOCK_K])
else:
    if A_COL_MAJOR:
        a_desc = tl.make_tensor_descriptor(A_ptr, shape=[K, M], strides=[stride_ak, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(A_ptr, shape=[M, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
if B_BATCHED:
    if B_COL_MAJOR:
        b_desc = tl.make_tensor_descriptor(B_ptr, shape=[L, N, K], strides=[stride_bl, stride_bn, 1],
                                           block_shape=[1, BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B_ptr, shape=[L, K, N], strides=[stride_bl, stride_bk, 1],
                                           block_shape=[1, BLOCK_K, BLOCK_N])
else:
    if B_COL_MAJOR:
        b_desc = tl.make_tensor_descriptor(B_ptr, shape=[N, K], strides=[stride_bn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B_ptr, shape=[K, N], strides=[stride_bk, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
"""

# One K step's A and B tiles at K offset ``off_k`` through those descriptors (out-of-bounds rows, columns and K
# are TMA's zero padding), then the dot.
_TMA_K_STEP = """\
if A_BATCHED:
    if A_COL_MAJOR:
        a = tl.trans(tl.reshape(a_desc.load([pid_l, off_k, off_m]), (BLOCK_K, BLOCK_M)))
    else:
        a = tl.reshape(a_desc.load([pid_l, off_m, off_k]), (BLOCK_M, BLOCK_K))
else:
    if A_COL_MAJOR:
        a = tl.trans(a_desc.load([off_k, off_m]))
    else:
        a = a_desc.load([off_m, off_k])
if B_BATCHED:
    if B_COL_MAJOR:
        b = tl.trans(tl.reshape(b_desc.load([pid_l, off_n, off_k]), (BLOCK_N, BLOCK_K)))
    else:
        b = tl.reshape(b_desc.load([pid_l, off_k, off_n]), (BLOCK_K, BLOCK_N))
else:
    if B_COL_MAJOR:
        b = tl.trans(b_desc.load([off_n, off_k]))
    else:
        b = b_desc.load([off_k, off_n])
""" + _DOT


_OPERAND_ARGS = """\
    A_ptr, B_ptr,
    M, N, K, L,
    stride_al, stride_am, stride_ak,
    stride_bl, stride_bk, stride_bn,
"""

_TILE_CONSTEXPRS = """\
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ALLOW_TF32: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_UPCAST: tl.constexpr,
    __LAUNCH_FLAGS_SIG__,
"""

# ---------------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------------

_PORTABLE = (
    '''\
@triton.jit
def __KERNEL__(
'''
    + _OPERAND_ARGS
    + "__PARAMS_SIG__"
    + _TILE_CONSTEXPRS
    + '''\
    EVEN_K: tl.constexpr,
):
    """Portable tiled GEMM + epilogue; grid (cdiv(M,BM)*cdiv(N,BN), L)."""
    pid = tl.program_id(0)
    pid_l = tl.program_id(1)
'''
    + _SWIZZLE.replace("__T__", "pid")
    + "    k_lo = 0\n    k_hi = K\n"
    + _POINTER_SETUP
    + "    for k0 in range(0, K, BLOCK_K):\n"
    + _POINTER_K_STEP
    + "    __EPILOGUE__(acc, offs_m, offs_n, pid_m, pid_n, pid_l, M, N, L, __LAUNCH_FLAGS____PARAMS_CALL__)\n"
)

_SPLITK = (
    '''\
@triton.jit
def __KERNEL__(
'''
    + _OPERAND_ARGS
    + "    W_ptr,\n"
    + _TILE_CONSTEXPRS
    + '''\
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, TMA_LOADS: tl.constexpr,
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr, A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr,
):
    """Split-K partial GEMM; grid (cdiv(M,BM)*cdiv(N,BN), SPLIT_K, L). Writes W[pid_k, pid_l, :M, :N]. TMA_LOADS:
    A and B through TMA descriptors (Hopper; the persistent template's K step and its layout flags), else masked
    pointer loads."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_l = tl.program_id(2)
'''
    + _SWIZZLE.replace("__T__", "pid")
    + '''\
    # K blocks are dealt out in contiguous runs; trailing splits may get an empty run and store zeros.
    blocks_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_lo = pid_k * blocks_per_split * BLOCK_K
    k_hi = tl.minimum(k_lo + blocks_per_split * BLOCK_K, K)
    if TMA_LOADS:
'''
    + _indent(_TMA_DESCRIPTORS, 8)
    + '''\
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask_m = (offs_m < M) | EVEN_M
        mask_n = (offs_n < N) | EVEN_N
        rm = offs_m.to(tl.int64)
        rn = offs_n.to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
        for off_k in range(k_lo, k_hi, BLOCK_K):
'''
    + _indent(_TMA_K_STEP, 12)
    + "    else:\n"
    + _indent(_POINTER_SETUP, 4)
    + "        for k0 in range(k_lo, k_hi, BLOCK_K):\n"
    + _indent(_POINTER_K_STEP, 4)
    + '''\
    slot = (pid_k * L + pid_l).to(tl.int64)
    w_ptrs = W_ptr + (slot * M + rm[:, None]) * N + rn[None, :]
    tl.store(w_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])
'''
)

_SPLITK_REDUCE = (
    '''\
@triton.jit
def __KERNEL__(
    W_ptr,
    M, N, L,
__PARAMS_SIG__\
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, ACC_DTYPE: tl.constexpr,
    __LAUNCH_FLAGS_SIG__,
):
    """Sums SPLIT_K partial tiles in index order (bitwise deterministic), then runs the epilogue once.
    Grid (cdiv(M,BM)*cdiv(N,BN), L)."""
    pid = tl.program_id(0)
    pid_l = tl.program_id(1)
'''
    + _SWIZZLE.replace("__T__", "pid")
    + '''\
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    rm = offs_m.to(tl.int64)
    rn = offs_n.to(tl.int64)
    w_ptrs = W_ptr + (pid_l.to(tl.int64) * M + rm[:, None]) * N + rn[None, :]
    split_stride = tl.cast(L, tl.int64) * M * N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for s in range(SPLIT_K):
        acc += tl.load(w_ptrs + s * split_stride, mask=mask, other=0.0)
    __EPILOGUE__(acc, offs_m, offs_n, pid_m, pid_n, pid_l, M, N, L, __LAUNCH_FLAGS____PARAMS_CALL__)
'''
)

# The launcher guarantees: each operand is row-major (last stride 1) or column-major (*_COL_MAJOR: the
# M/N stride is 1), non-unit strides and the base are 16-byte aligned. *_BATCHED operands use 3-D
# descriptors [L, rows, cols] so that TMA's zero padding stops at batch boundaries (a 2-D view of
# L*K rows would leak the next batch's K rows into the reduction).
_PERSISTENT_TMA = (
    '''\
@triton.jit
def __KERNEL__(
'''
    + _OPERAND_ARGS
    + "__PARAMS_SIG__"
    + _TILE_CONSTEXPRS
    + '''\
    NUM_PROGRAMS: tl.constexpr,
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Persistent TMA GEMM + epilogue (Hopper); grid (min(NUM_PROGRAMS, L*tiles),), EPILOGUE_SUBTILE in 1, 2, 4;
    PREFETCH in 0 .. EPILOGUE_SUBTILE: epilogue slices whose M x N inputs are loaded before the K loop."""
__TMA_DESCRIPTORS__
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    num_tiles = tiles_per_batch * L
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_pid_in_group = GROUP_M * num_pid_n
    # A second tile counter for the epilogue keeps the K loop's index math independent of it, which lets
    # the compiler overlap the next tile's loads with this tile's epilogue when FLATTEN is on.
    tile_id_c = start_pid - NUM_PROGRAMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_l = tile_id // tiles_per_batch
        t = tile_id % tiles_per_batch
__GROUP_ORDER__        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
__PREFETCH_TOP__        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
__DOT_TMA__
        tile_id_c += NUM_PROGRAMS
        pid_l_c = tile_id_c // tiles_per_batch
        t_c = tile_id_c % tiles_per_batch
        group_id_c = t_c // num_pid_in_group
        first_pid_m_c = group_id_c * GROUP_M
        group_size_m_c = tl.minimum(num_pid_m - first_pid_m_c, GROUP_M)
        pid_m_c = first_pid_m_c + (t_c % num_pid_in_group) % group_size_m_c
        pid_n_c = (t_c % num_pid_in_group) // group_size_m_c
        offs_m = pid_m_c * BLOCK_M + tl.arange(0, BLOCK_M)
__EPILOGUE_CALLS__'''
)

_PERSISTENT_TMA = (_PERSISTENT_TMA.replace("__TMA_DESCRIPTORS__", _indent(_TMA_DESCRIPTORS, 4))
                   .replace("__DOT_TMA__", _indent(_TMA_K_STEP, 12))
                   .replace("__GROUP_ORDER__", _indent(GROUP_ORDER.replace("__T__", "t"), 8)))

# The persistent template's epilogue part, rendered per program: EPILOGUE_SUBTILE = S splits the accumulator
# into S slices (quarters: the halves split again after the first two slices ran, so at most three
# quarter-sized pieces are live at once) and calls the epilogue on each. With ``prefetch`` > 0 M x N input
# tiles, PREFETCH = P > 0 calls ``<epi>_prefetch`` for slices 0 .. P-1 before the K loop (their loads fly
# while the tensor cores work; the values wait in registers) and, at slice i, for slice i + P before
# computing slice i (its latency hides behind slice i's math), then ``<epi>_pf`` takes the loaded tiles.
_SPLITS = {
    1: [(None, "acc_s0 = acc")],
    2: [(None, "acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))\n"
               "acc_s0, acc_s1 = tl.split(acc3)")],
    4: [(None, "acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))\n"
               "acc_lo, acc_hi = tl.split(acc3)\n"
               "q3 = tl.permute(tl.reshape(acc_lo, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1))\n"
               "acc_s0, acc_s1 = tl.split(q3)"),
        (2, "q3 = tl.permute(tl.reshape(acc_hi, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1))\n"
            "acc_s2, acc_s3 = tl.split(q3)")],
}


def _pf_names(slice_: int, count: int) -> str:
    return ", ".join(f"pf{slice_}_{k}" for k in range(count))


def _prefetch_top(prefetch: int) -> str:
    """Before the K loop: the M x N inputs of the first PREFETCH slices (tile coordinates of the main loop)."""
    if not prefetch:
        return ""
    lines = ["if PREFETCH > 0:",
             "    offs_m_f = off_m + tl.arange(0, BLOCK_M)",
             "    offs_n_f = off_n + tl.arange(0, BLOCK_N // EPILOGUE_SUBTILE)"]
    for i in range(4):
        pad = "    " * (1 + (i > 0))
        if i:
            lines.append(f"    if PREFETCH > {i}:")
        shift = f" + {i} * (BLOCK_N // EPILOGUE_SUBTILE)" if i else ""
        lines.append(f"{pad}{_pf_names(i, prefetch)} = __EPILOGUE___prefetch(offs_m_f, offs_n_f{shift}, pid_l, M, N, "
                     "L, __LAUNCH_FLAGS____PARAMS_CALL__)")
    return _indent("\n".join(lines), 8)


def _epilogue_calls(prefetch: int) -> str:
    """The S-way split and the epilogue calls for S = 4, 2, 1 (constexpr branches on EPILOGUE_SUBTILE)."""
    out = []
    for n, kw in ((4, "if"), (2, "elif"), (1, "else")):
        out.append(f"{kw} EPILOGUE_SUBTILE == {n}:" if n != 1 else "else:")
        body = []
        for i in range(n):
            width = f"(BLOCK_N // {n})" if n > 1 else "BLOCK_N"
            body.append(f"offs_n_s{i} = pid_n_c * BLOCK_N + {i} * {width} + tl.arange(0, {width})")
        for i in range(n):
            body += [code for at, code in _SPLITS[n] if (at or 0) == i]
            args = (f"offs_m, offs_n_s{i}, pid_m_c, {n} * pid_n_c + {i}, pid_l_c, M, N, L, "
                    "__LAUNCH_FLAGS____PARAMS_CALL__")
            if not prefetch:
                body.append(f"__EPILOGUE__(acc_s{i}, {args})")
                continue
            for ahead in range(1, n - i):
                body.append(f"if PREFETCH == {ahead}:")
                body.append(f"    {_pf_names(i + ahead, prefetch)} = __EPILOGUE___prefetch(offs_m, offs_n_s{i + ahead}, "
                            "pid_l_c, M, N, L, __LAUNCH_FLAGS____PARAMS_CALL__)")
            body += ["if PREFETCH > 0:",
                     f"    __EPILOGUE___pf(acc_s{i}, {args}, {_pf_names(i, prefetch)})",
                     "else:",
                     f"    __EPILOGUE__(acc_s{i}, {args})"]
        out += ["    " + line for code in body for line in code.split("\n")]
    return _indent("\n".join(out), 8)


_TEMPLATES = {
    "portable": _PORTABLE,
    "splitk": _SPLITK,
    "splitk_reduce": _SPLITK_REDUCE,
    "persistent_tma": _PERSISTENT_TMA,
}

# Names each template defines as arguments or locals; epilogue params must not shadow them.
_RESERVED = frozenset(
    """A_ptr B_ptr W_ptr M N K L stride_al stride_am stride_ak stride_bl stride_bk stride_bn
    BLOCK_M BLOCK_N BLOCK_K GROUP_M ALLOW_TF32 ACC_DTYPE DOT_UPCAST SPLIT_K NUM_SMS NUM_PROGRAMS A_COL_MAJOR B_COL_MAJOR
    A_BATCHED B_BATCHED EPILOGUE_SUBTILE WARP_SPECIALIZE FLATTEN PROGRAMS_PER_SM PREFETCH triton tl""".split()
)


def _check_identifier(what: str, name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"{what} must be a Python identifier, got {name!r}")
    return name


def reserved_names() -> frozenset[str]:
    """Argument names owned by the templates (epilogue params must avoid them)."""
    return _RESERVED


def jit_decorator(unspecialized=(), params=(), lang: str = "triton") -> str:
    """The decorator line of a generated kernel: ``@triton.jit`` (or ``@gluon.jit``), with
    ``do_not_specialize`` naming ``unspecialized`` parameters, each of which must be in ``params``. Scalar epilogue
    inputs go there: Triton would otherwise compile a separate kernel for a value of 1 (as a constexpr, where
    ``x.to(...)`` does not exist) and for multiples of 16, for values that are plain runtime data."""
    names = [_check_identifier("unspecialized entry", n) for n in unspecialized]
    missing = sorted(set(names) - set(params))
    if missing:
        raise ValueError(f"unspecialized names {missing} are not in epilogue_params")
    return f"@{lang}.jit(do_not_specialize={names!r})" if names else f"@{lang}.jit"


def render_gemm(kernel_name: str, epilogue_fn: str, epilogue_params: list[str], template: str,
                prefetch: int = 0, unspecialized=(), annotations: dict[str, str] | None = None) -> str:
    """Source of one ``@triton.jit`` kernel named ``kernel_name`` for ``template``.

    ``template`` is one of ``RENDERABLE``: 'portable', 'splitk' (partial products only; it takes no
    epilogue params), 'splitk_reduce' (sum of partials + epilogue) or 'persistent_tma'. The caller puts
    ``HEADER``, the epilogue function ``epilogue_fn`` and this text into one module. ``prefetch``: how many
    M x N input tiles ``<epilogue_fn>_prefetch`` returns (persistent_tma then calls it and ``<epilogue_fn>_pf``
    when launched with PREFETCH > 0; both must be in the module); 0: the epilogue loads its own inputs.
    ``unspecialized``: parameters Triton must not specialise on their values (``jit_decorator``).
    ``annotations``: {parameter: type} the signature declares (``params.Param.annotation``).
    """
    _check_identifier("kernel_name", kernel_name)
    _check_identifier("epilogue_fn", epilogue_fn)
    if template not in _TEMPLATES:
        raise ValueError(f"template must be one of {RENDERABLE}, got {template!r}")
    if isinstance(epilogue_params, str) or not hasattr(epilogue_params, "__iter__"):
        raise TypeError(f"epilogue_params must be a list of names, got {type(epilogue_params).__name__}")
    params = [_check_identifier("epilogue_params entry", p) for p in epilogue_params]
    dupes = sorted({p for p in params if params.count(p) > 1})
    if dupes:
        raise ValueError(f"epilogue_params has duplicate names {dupes}")
    clash = sorted(set(params) & (_RESERVED | {kernel_name, epilogue_fn}))
    if clash:
        raise ValueError(f"epilogue_params {clash} clash with template/kernel/epilogue names; rename them")
    if kernel_name == epilogue_fn or kernel_name in _RESERVED or epilogue_fn in _RESERVED:
        raise ValueError(
            f"kernel_name {kernel_name!r} and epilogue_fn {epilogue_fn!r} must differ and avoid template names"
        )
    annotations = annotations or {}
    params_sig = "".join(f"    {p}: {annotations[p]},\n" if p in annotations else f"    {p},\n" for p in params)
    params_call = "".join(f", {p}" for p in params)
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be a non-negative int (M x N input tiles), got {prefetch!r}")
    text = _TEMPLATES[template]
    if template == "persistent_tma":
        text = text.replace("__PREFETCH_TOP__", _prefetch_top(prefetch)).replace("__EPILOGUE_CALLS__",
                                                                                 _epilogue_calls(prefetch))
    return (
        text.replace("@triton.jit\ndef __KERNEL__(", jit_decorator(unspecialized, params) + "\ndef __KERNEL__(")
        .replace("__KERNEL__", kernel_name)
        .replace("__EPILOGUE__", epilogue_fn)
        .replace("__PARAMS_SIG__", params_sig)
        .replace("__PARAMS_CALL__", params_call)
        .replace("__LAUNCH_FLAGS_SIG__", launch_flags_signature("tl"))
        .replace("__LAUNCH_FLAGS__", ", ".join(LAUNCH_FLAGS))
    )


def kernel_symbol(base: str, template: str) -> str:
    """Name ``render_gemm_kernels`` gives the kernel of ``template`` (e.g. 'fused3_portable',
    'fused3_splitk', 'fused3_splitk_reduce'; 'pingpong' for ``gluon_template.render_pingpong``);
    ``gemm_launch.launch_gemm`` looks kernels up by it."""
    if template not in _TEMPLATES and template != "pingpong":
        raise ValueError(f"template must be one of {RENDERABLE + ('pingpong',)}, got {template!r}")
    return f"{_check_identifier('base', base)}_{template}"


def render_gemm_kernels(
    base: str,
    epilogue_fn: str,
    epilogue_params: list[str],
    templates: tuple[str, ...] = ("portable", "splitk", "persistent_tma"),
    prefetch: int = 0,
    unspecialized=(),
    annotations: dict[str, str] | None = None,
) -> str:
    """All kernels needed to launch ``templates`` (splitk brings its reduce kernel), named by
    ``kernel_symbol(base, template)``, separated by blank lines. Without HEADER or the epilogue."""
    chunks = []
    for template in templates:
        if template not in ("portable", "splitk", "persistent_tma"):
            raise ValueError(f"templates entries must be 'portable', 'splitk' or 'persistent_tma', got {template!r}")
        parts = ("splitk", "splitk_reduce") if template == "splitk" else (template,)
        for part in parts:
            chunks.append(render_gemm(kernel_symbol(base, part), epilogue_fn, epilogue_params, part, prefetch,
                                      unspecialized if part != "splitk" else (), annotations))
    return "\n\n".join(chunks)
