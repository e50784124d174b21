"""How each reduction crosses tiles: buffers, identities, key encodings, and the finalize step.

A reduction of a tile value is reduced per tile in registers, then combined across tiles either

- *atomically* into a buffer over the kept axes (``sum``/``mean``: ``atomic_add``; ``amax``/``amin``: the tile
  reduced as floats with NaN-propagating max/min, then integer atomics on an order-preserving integer key of the
  tile's result, which handles negative floats exactly and lets NaN win as torch's amax/amin do), or
- through a *partials* workspace ``[T, kept...]`` (one slot per tile along the reduced axes) combined in a
  fixed order by the vector-stage kernel: ``deterministic=True``, and always for ``logsumexp``, whose
  partials are online (max, sum of exp) pairs.

A ``sum``/``mean`` whose only user is an output is atomically accumulated straight into that output
(``direct``), so the common row/column/scalar-sum epilogues need no second kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ir.node import Node
from ..ir.types import AXES

IDENTITY = {"sum": 0.0, "mean": 0.0, "amax": -math.inf, "amin": math.inf, "logsumexp": -math.inf}


def key_params(dtype: torch.dtype):
    """(int dtype, Triton int type, shift, mask, min key, max key) of the order-preserving float key."""
    if dtype == torch.float64:
        return torch.int64, "tl.int64", 63, 0x7FFFFFFFFFFFFFFF, -(2 ** 63), 2 ** 63 - 1
    return torch.int32, "tl.int32", 31, 0x7FFFFFFF, -(2 ** 31), 2 ** 31 - 1


def float_key(value: float, dtype: torch.dtype) -> int:
    """The key of a float (host side, for buffer initialisation)."""
    itype, _, shift, mask, _, _ = key_params(dtype)
    b = torch.tensor([value], dtype=dtype).view(itype).item()
    return b ^ ((b >> shift) & mask)


@dataclass
class ReductionPlan:
    """One reduction whose input is a tile value (the tile → vector boundary)."""

    rid: int
    node: Node
    mode: str                      # "atomic" or "partials"
    direct_output: int | None      # output position accumulated into directly (atomic sum/mean only)

    @property
    def op(self) -> str:
        return self.node.target

    @property
    def over(self) -> tuple[str, ...]:
        return self.node.attrs["over"]

    @property
    def kept(self) -> tuple[str, ...]:
        return self.node.axes

    @property
    def dtype(self) -> torch.dtype:
        return self.node.dtype

    def buffer_dtype(self) -> torch.dtype:
        if self.op in ("amax", "amin") and self.mode == "atomic":
            return key_params(self.dtype)[0]
        return self.dtype

    def parts(self) -> tuple[str, ...]:
        return ("max", "sum") if self.op == "logsumexp" else ("val",)

    def init_value(self):
        """Fill of an atomic buffer before the GEMM (None: no fill needed)."""
        if self.mode != "atomic":
            return None
        if self.op in ("amax", "amin"):
            return float_key(IDENTITY[self.op], self.dtype)
        return 0.0


def tiles_along(axis: str, sizes: dict, block_m: int, block_n: int) -> int:
    return {"L": sizes["L"], "M": -(-sizes["M"] // block_m), "N": -(-sizes["N"] // block_n)}[axis]


def buffer_shape(plan: ReductionPlan, sizes: dict, block_m: int, block_n: int) -> list[int]:
    kept = [sizes[a] for a in AXES if a in plan.kept]
    if plan.mode == "partials":
        t = math.prod(tiles_along(a, sizes, block_m, block_n) for a in plan.over)
        return [t] + kept
    return kept
