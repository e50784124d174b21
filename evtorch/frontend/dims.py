"""Logical dims of traced values and how they map onto the iteration axes.

A traced value has the logical shape the user sees (after transposes, reshapes, unsqueezes). Each logical
dim is a ``Dim``:

- ``axes``: the iteration axes it walks, outermost first (``('M',)``; ``('L', 'M')`` after merging L and M);
- ``inputs``: for values computed only from keyword inputs and not yet combined with the accumulator, the
  input dims it walks (``{('C', 0)}``); these are *bound* to axes when the value meets an accumulator value,
  exactly where eager broadcasting would align them;
- neither, with size 1 (broadcast) or size > 1 (an ``expand``ed dim: stride 0).

Views never become IR nodes: they only change dims. Loads bind input dims to axes, reductions turn dims
into reduced axes, and outputs record their dims so the runtime can hand back the same (strided) view.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ..errors import ShapeError


class Dim(NamedTuple):
    size: int
    axes: tuple[str, ...] = ()
    inputs: frozenset = frozenset()

    @property
    def bound(self) -> bool:
        return bool(self.axes)

    @property
    def pending(self) -> bool:
        return bool(self.inputs)

    @property
    def expanded(self) -> bool:
        return self.size != 1 and not self.axes and not self.inputs


ONE = Dim(1)


def permute(dims: tuple[Dim, ...], order) -> tuple[Dim, ...]:
    return tuple(dims[d] for d in order)


def norm_dim(d: int, rank: int, what: str) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise ShapeError(f"{what}: dim {d} is out of range for a tensor of rank {rank} "
                         f"(expected -{rank} <= dim < {rank})")
    return d % max(rank, 1)


def reshape(dims: tuple[Dim, ...], shape: tuple[int, ...], axis_sizes: dict, what: str) -> tuple[Dim, ...]:
    """New dims for ``reshape(shape)``: whole dims/axes may be merged or split apart again; splitting the
    inside of an axis (or of an input dim) would need index arithmetic per element and is refused."""
    total = math.prod(d.size for d in dims)
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"{what}: only one dim can be -1, got {tuple(shape)}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = total // known if known else 0
    if math.prod(shape) != total:
        raise ShapeError(f"{what}: shape {tuple(shape)} is invalid for a value of {total} elements "
                         f"(shape {tuple(d.size for d in dims)})")
    if any(d.expanded for d in dims):
        raise ShapeError(f"{what}: reshaping an expanded value would need a copy; reshape before expand")
    atoms = []  # (size, axis or None, input or None)
    for d in dims:
        if d.axes:
            atoms += [(axis_sizes[a], a, None) for a in d.axes]
        elif d.inputs:
            if len(d.inputs) > 1:
                raise ShapeError(f"{what}: cannot reshape a dim shared by several inputs before it meets acc")
            atoms.append((d.size, None, next(iter(d.inputs))))
    out, i = [], 0
    for s in shape:
        group, prod = [], 1
        while i < len(atoms) and (prod < s or (atoms[i][0] == 1 and prod == s and s == 1 and not group)):
            group.append(atoms[i])
            prod *= atoms[i][0]
            i += 1
        if prod != s:
            raise ShapeError(f"{what}: reshape {tuple(d.size for d in dims)} -> {tuple(shape)} splits an axis "
                             "or input dim in the middle; only reshapes that merge whole dims or split merged "
                             "dims back apart map to strides")
        ins = [g[2] for g in group if g[2] is not None]
        if ins and len(group) > 1:
            raise ShapeError(f"{what}: merging the dims of an input before it meets acc is not supported; "
                             "reshape the tensor before passing it in")
        out.append(Dim(s, tuple(g[1] for g in group if g[1] is not None), frozenset(ins)))
    while i < len(atoms):  # trailing size-1 axes (e.g. L == 1) stay attached to the last dim
        if atoms[i][0] != 1:
            raise ShapeError(f"{what}: reshape lost a dim")
        if out and atoms[i][1] is not None:
            last = out[-1]
            out[-1] = Dim(last.size, last.axes + (atoms[i][1],), last.inputs)
        i += 1
    return tuple(out)


def describe(dims: tuple[Dim, ...]) -> str:
    """'(M, N)' style spelling of a traced value's dims for error messages."""
    parts = []
    for d in dims:
        if d.axes:
            parts.append("*".join(d.axes))
        elif d.inputs:
            parts.append("/".join(f"{n}.dim{j}" for n, j in sorted(d.inputs)))
        else:
            parts.append(str(d.size))
    return "(" + ", ".join(parts) + ")"
