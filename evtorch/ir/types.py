"""Axes of the epilogue iteration space and the stage a value lives in.

Every epilogue runs over the iteration space (L, M, N) of the accumulator (L = 1 when unbatched). An IR value
is characterised by the set of axes it varies along: the accumulator varies along all three, a row
broadcast ``bias`` of shape (N,) only along N, a scalar along none. This set is the value's *shape class*;
together with its dtype it is everything codegen needs, and it contains no sizes, so a new M, N, K or L
never changes the IR (and never regenerates source).
"""
from __future__ import annotations

import enum

import torch

L, M, N = "L", "M", "N"
AXES: tuple[str, ...] = (L, M, N)  # canonical order, outermost first

#: an input load's binding entry for an input dim merged into the next one: the run of dims ending at the next
#: dim that walks axes is read as one flat dim (a view, as ``reshape`` makes one), which walks that dim's axes.
#: ``C3.reshape(8, 6)`` of a (8, 2, 3) input meeting an (8, 6) acc binds as ``((M,), MERGED, (N,))``: dims 1 and
#: 2 together walk N, which no per-dim binding can say (N would be split into parts of 2 and 3)
MERGED: tuple[str, ...] = ("*",)


def canonical(axes) -> tuple[str, ...]:
    """``axes`` sorted in canonical (L, M, N) order."""
    s = set(axes)
    return tuple(a for a in AXES if a in s)


def axes_str(axes) -> str:
    """A compact spelling of a shape class: 'LMN', 'MN', 'N', or '-' for a scalar."""
    return "".join(canonical(axes)) or "-"


class Stage(str, enum.Enum):
    """TILE values are computed per accumulator tile inside the GEMM kernel; VECTOR values are computed
    from finished reductions (row/column/scalar results) by a small kernel that runs after the GEMM."""

    TILE = "tile"
    VECTOR = "vector"


def role_of(axes) -> str:
    """The CUTLASS-style role of a load varying along ``axes``: aux (M and N), row (N only), col (M only),
    scalar (neither). The batch axis L only adds a per-batch stride and does not change the role."""
    s = set(axes)
    if M in s and N in s:
        return "aux"
    if N in s:
        return "row"
    if M in s:
        return "col"
    return "scalar"


#: the 16-bit float dtypes: eager rounds every op's result on them to 16 bits; kernels compute in float32
HALF_DTYPES = (torch.float16, torch.bfloat16)
FLOAT_DTYPES = HALF_DTYPES + (torch.float32, torch.float64)  # also the GEMM operands' and full-size outputs'
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
SUPPORTED_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)

DTYPE_NAMES = {
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES
