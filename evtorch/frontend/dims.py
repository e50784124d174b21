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

import itertools
import math
from typing import NamedTuple

from ..errors import ShapeError
from ..ir.types import MERGED


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

#: ``TracedTensor.order`` of a pending value made ``.contiguous()``: row-major in its dims, whose axes are known
#: once it is bound (``memory_order``)
CONTIGUOUS_DIMS = "dims"


def memory_order(dims: tuple[Dim, ...]) -> tuple[str, ...]:
    """The axes of bound ``dims`` in the order a row-major layout of them puts them, outermost first."""
    return tuple(a for d in dims for a in d.axes)


def permute(dims: tuple[Dim, ...], order) -> tuple[Dim, ...]:
    return tuple(dims[d] for d in order)


def norm_dim(d: int, rank: int, what: str) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise ShapeError(f"{what}: dim {d} is out of range for a tensor of rank {rank} "
                         f"(expected -{rank} <= dim < {rank})")
    return d % max(rank, 1)


def transpose_order(args, kwargs, rank: int, what: str, norm=None) -> list[int]:
    """The permutation ``transpose``/``swapaxes``/``swapdims`` (dim0, dim1) make of ``rank`` dims (``norm``:
    the dim check, whose error class is the caller's)."""
    norm = norm or norm_dim
    d0, d1 = (list(args) + [kwargs.get("dim0"), kwargs.get("dim1")])[:2]
    d0, d1 = norm(d0, rank, what), norm(d1, rank, what)
    order = list(range(rank))
    order[d0], order[d1] = order[d1], order[d0]
    return order


def reshape(dims: tuple[Dim, ...], shape: tuple[int, ...], axis_sizes: dict, what: str) -> tuple[Dim, ...]:
    """New dims for ``reshape(shape)``: whole dims/axes may be merged or split apart again; splitting the
    inside of an axis would need index arithmetic per element and is refused. Dims of inputs that have not met
    acc yet may also be split (into parts, ``part_key``) or merged (``merged_key``): a load walks any such
    view of a strided tensor with per-axis strides."""
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
    atoms = []  # (size, axis or None, input keys or None)
    for d in dims:
        if d.axes:
            atoms += [(axis_sizes[a], a, None) for a in d.axes]
        elif d.inputs:
            atoms.append((d.size, None, d.inputs))
    out, i = [], 0
    for s in shape:
        group, prod = [], 1
        while i < len(atoms) and (prod < s or (atoms[i][0] == 1 and prod == s and s == 1 and not group)):
            size, axis, keys = atoms[i]
            if prod * size > s and keys is not None and s % prod == 0 and size % (s // prod) == 0:
                # split an input dim: its outer part completes this group, the inner part comes next
                outer = s // prod
                split = [split_key(k, size, outer, what) for k in keys]
                atoms[i:i + 1] = [(outer, None, frozenset(o for o, _ in split)),
                                  (size // outer, None, frozenset(n for _, n in split))]
                continue
            group.append(atoms[i])
            prod *= size
            i += 1
        if prod != s:
            raise ShapeError(f"{what}: reshape {tuple(d.size for d in dims)} -> {tuple(shape)} splits an axis "
                             "in the middle; only reshapes that merge whole dims or split merged dims back apart "
                             "map to strides")
        ins = [g for g in group if g[2] is not None]
        if ins and len(group) > 1:
            if len(ins) != len(group):
                raise ShapeError(f"{what}: merges dims of an input with dims of acc")
            keys = frozenset({merged_key([(g[2], g[0]) for g in group])})
        else:
            keys = frozenset(ins[0][2]) if ins else frozenset()
        out.append(Dim(s, tuple(g[1] for g in group if g[1] is not None), keys))
    while i < len(atoms):  # trailing size-1 axes (e.g. L == 1) stay attached to the last dim
        if atoms[i][0] != 1:
            raise ShapeError(f"{what}: reshape lost a dim")
        if out and atoms[i][1] is not None:
            last = out[-1]
            out[-1] = Dim(last.size, last.axes + (atoms[i][1],), last.inputs)
        i += 1
    return tuple(out)


# ---------------------------------------------------------------------------------------------- input keys
# A pending dim's ``inputs`` are keys naming what of an input it walks:
#   (name, j)                    all of dim j of input ``name``;
#   (name, j, inner, size)       a part of dim j: index (i_j // inner) % size, from a reshape that split dim j;
#   ("+", ((keys, size), ...))   a merge (outer first) of several such dims, from a reshape that merged them.
# Binding gives each key the acc axes it walks; a load's per-dim binding concatenates its parts' axes.

def split_key(key, size: int, outer: int, what: str):
    """(outer part, inner part) of ``key`` (of ``size`` elements) split as (outer, size // outer)."""
    inner = size // outer
    if key[0] == "+":
        raise ShapeError(f"{what}: splitting dims of an input that an earlier reshape merged is not supported "
                         "before the input meets acc; reshape the tensor before passing it in")
    if len(key) == 2:
        name, j = key
        return (name, j, inner, outer), (name, j, 1, inner)
    name, j, base, _ = key
    return (name, j, base * inner, outer), (name, j, base, inner)


def merged_key(parts) -> tuple:
    """The key of a dim merging ``parts`` ((keys, size) outer first); adjacent parts of one input dim recombine."""
    if all(len(k) == 1 for k, _ in parts):
        ks = [next(iter(k)) for k, _ in parts]
        if all(len(k) == 4 for k in ks) and len({k[:2] for k in ks}) == 1 and all(
                a[2] == b[2] * b[3] for a, b in zip(ks, ks[1:])):
            return (ks[0][0], ks[0][1], ks[-1][2], math.prod(k[3] for k in ks))
    return ("+", tuple((frozenset(k), s) for k, s in parts))


def key_text(key) -> str:
    """'C.dim0' style spelling of an input key for messages."""
    if key[0] == "+":
        return "*".join("/".join(sorted(key_text(k) for k in keys)) for keys, _ in key[1])
    if len(key) == 2:
        return f"{key[0]}.dim{key[1]}"
    return f"{key[0]}.dim{key[1]}[part of {key[3]}]"


def key_input(key) -> str:
    """The input name a key refers to (the first one, for a merge)."""
    while key[0] == "+":
        key = next(iter(key[1][0][0]))
    return key[0]


def expand_binding(binding: dict, axis_sizes: dict, what: str, shapes: dict | None = None) -> dict:
    """``binding`` with merged keys replaced by their parts' keys, each given its share of the merged axes.

    Parts and axes are matched up in segments of equal size (``_segments``). A part alone in its segment walks
    the segment's axes (several of them: a merged acc dim). Several parts sharing axes (``C3.reshape(8, 6)`` of an
    (8, 2, 3) input meeting acc's N = 6: dims 1 and 2 walk N together; no part walks an axis of its own) are read
    as one flat dim of their input (``_run_binding``), as the view ``reshape`` makes of them. ``shapes``: the
    inputs' shapes (name -> shape), to tell the size-1 dims a run may skip."""
    out: dict = {}
    todo = list(binding.items())
    while todo:
        key, axes = todo.pop()
        if key[0] != "+":
            _bind(out, key, axes, what)
            continue
        for parts, group in _segments(key, axes, axis_sizes, what):
            if len(parts) == 1:
                todo += [(sub, group) for sub in parts[0][0]]
            else:
                for sub, sub_axes in _run_binding(key, parts, group, shapes or {}, what).items():
                    _bind(out, sub, sub_axes, what)
    return out


def _bind(out: dict, key, axes, what: str) -> None:
    if out.get(key, axes) != axes:
        raise ShapeError(f"{what}: {key_text(key)} would walk both {_axes_text(out[key])} and {_axes_text(axes)}")
    out[key] = axes


def _axes_text(axes) -> str:
    return "a merged run" if axes == MERGED else "*".join(axes) or "nothing"


def _flat_parts(key) -> list:
    """The (keys, size) parts of merged ``key``, outer first, a part that is itself a merge of one input's dims
    (a reshape of a reshape) replaced by its own parts."""
    parts = []
    for keys, size in key[1]:
        sub = next(iter(keys))
        parts += _flat_parts(sub) if len(keys) == 1 and sub[0] == "+" else [(keys, size)]
    return parts


def _segments(key, axes, axis_sizes: dict, what: str) -> list:
    """[(parts, axes)]: merged ``key``'s parts and the acc ``axes`` it meets cut where their running sizes agree,
    outer first: one part to one or more axes, or several parts to one or more axes. Size-1 axes go with the
    segment they come before (trailing ones with the last)."""
    parts, axes = _flat_parts(key), list(axes)
    segments, i, k = [], 0, 0
    while i < len(parts):
        group_parts, group_axes, psize, asize = [parts[i]], [], parts[i][1], 1
        i += 1
        while True:
            while k < len(axes) and asize < psize:
                group_axes.append(axes[k])
                asize *= axis_sizes[axes[k]]
                k += 1
            if asize == psize:
                break
            if asize > psize and i < len(parts):
                group_parts.append(parts[i])
                psize *= parts[i][1]
                i += 1
                continue
            raise ShapeError(f"{what}: the merged input dims {key_text(key)} do not line up with the acc axes "
                             f"{'*'.join(axes)} they meet")
        segments.append((group_parts, group_axes))
    rest = axes[k:]
    if math.prod(axis_sizes[a] for a in rest) != 1 or not segments:
        raise ShapeError(f"{what}: the merged input dims {key_text(key)} do not line up with the acc axes "
                         f"{'*'.join(axes)} they meet")
    segments[-1][1].extend(rest)
    return [(p, tuple(a)) for p, a in segments]


def _run_binding(key, parts, axes, shapes: dict, what: str) -> dict:
    """The binding of ``parts`` (of merged ``key``) that walk ``axes`` together: per input, its dims in the parts
    are one run, all but the last ``MERGED`` into the next, the last walking ``axes``. That is a view of the input
    (``ir.layouts.run_stride``; a copy where its strides do not merge, as eager's reshape copies) only where each
    input has one whole dim per part, adjacent and in order (size-1 dims between them aside)."""
    per_input: dict = {}
    for n, (keys, _) in enumerate(parts):
        for k in keys:
            if k[0] == "+" or len(k) != 2:
                raise ShapeError(f"{what}: a reshape merges {key_text(k)}, a part of an input dim, with other dims "
                                 f"into one walking acc axes {'*'.join(axes)}; that needs index arithmetic per "
                                 "element; reshape the input before passing it in")
            per_input.setdefault(k[0], []).append((n, k[1]))
    out = {}
    for name, found in per_input.items():
        dims = [j for _, j in found]
        shape = shapes.get(name)
        if [n for n, _ in found] != list(range(len(parts))):
            raise ShapeError(f"{what}: merging {key_text(key)} into one dim walking acc axes {'*'.join(axes)} reads "
                             f"input {name!r} with index arithmetic (it is broadcast along some of the merged dims, "
                             "or appears in several); reshape or expand it before passing it in")
        if any(b <= a or (shape is not None and any(shape[g] != 1 for g in range(a + 1, b)))
               for a, b in itertools.pairwise(dims)):
            raise ShapeError(f"{what}: a reshape merges dims {', '.join(map(str, dims))} of input {name!r} (in that "
                             f"order) into one dim walking acc axes {'*'.join(axes)}; they are not adjacent dims in "
                             f"order (a transpose or permute came first), so this is no view of {name!r}. Reshape "
                             "the tensor before passing it in")
        out.update({(name, j): MERGED for j in dims[:-1]})
        out[(name, dims[-1])] = tuple(axes)
    return out


def describe(dims: tuple[Dim, ...]) -> str:
    """'(M, N)' style spelling of a traced value's dims for error messages."""
    parts = []
    for d in dims:
        if d.axes:
            parts.append("*".join(d.axes))
        elif d.inputs:
            parts.append("/".join(sorted(key_text(k) for k in d.inputs)))
        else:
            parts.append(str(d.size))
    return "(" + ", ".join(parts) + ")"
