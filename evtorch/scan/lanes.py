"""Lane maps: how a leaf of a scan body reads the row of its source.

A scan body computes *rows*: the values of one time step. Every traced value has a row shape (its lanes).
Every leaf (a read of a state or an input row) carries a ``LaneMap`` from the lane multi-index of the value
it produces to the multi-index of its source row, one entry per source dim::

    (out_dim, offset, step)    source index = offset + step * index[out_dim]
    (-1, offset, 0)            source index = offset            (a broadcast or integer-indexed dim)

Views never become IR nodes. A view is a ``View``: one entry per dim of the viewed value saying how that
dim's index follows from the view's own multi-index (same form as a map entry). Applying a view to a leaf
composes it into the leaf's map; applying it to a computed value re-derives the computation from viewed
operands (elementwise ops commute with views). So ``s1[..., :1]`` becomes a leaf reading ``s1`` with map
``((-1, 0, 0),)`` and ``x[:, None] + y`` broadcasts by composing maps, exactly as eager indexing would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import ScanShapeError, ScanTraceError

View = tuple  # per dim of the viewed value: (new dim or -1, offset, step)


@dataclass(frozen=True)
class LaneMap:
    """Per source dim: (out_dim, offset, step). Hashable (CSE compares leaves by it); prints compactly."""

    entries: tuple

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    def __repr__(self):
        parts = []
        for e, off, st in self.entries:
            if e < 0:
                parts.append(str(off))
            else:
                term = f"i{e}" if st == 1 else f"{st}*i{e}"
                parts.append(f"{off}+{term}" if off else term)
        return "[" + ",".join(parts) + "]"


def identity(rank: int) -> LaneMap:
    return LaneMap(tuple((d, 0, 1) for d in range(rank)))


def normalize(m, out_shape: Sequence[int]) -> LaneMap:
    """Entries reading a size-1 output dim always read index ``offset``: spell them as constants."""
    return LaneMap(tuple((-1, off, 0) if e >= 0 and out_shape[e] == 1 else (e, off, st) for e, off, st in m))


def is_identity(m: LaneMap, src_shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether the map reads source lane i for output lane i (same shape, no slice or broadcast)."""
    if tuple(src_shape) != tuple(out_shape):
        return False
    return normalize(m, out_shape) == normalize(identity(len(out_shape)), out_shape)


def compose(m: LaneMap, view: View, new_shape: Sequence[int]) -> LaneMap:
    """The map of a leaf after ``view``: source index in terms of the view's index."""
    out = []
    for e, off, st in m:
        if e < 0:
            out.append((-1, off, 0))
            continue
        ve, voff, vst = view[e]
        if ve < 0:
            out.append((-1, off + st * voff, 0))
        else:
            out.append((ve, off + st * voff, st * vst))
    return normalize(tuple(out), new_shape)


# ---------------------------------------------------------------------------------------------- view makers
# Each returns (view, new_shape) for a value of shape ``shape``.

def expand(shape: Sequence[int], new_shape: Sequence[int], what: str) -> tuple[View, tuple]:
    """Broadcast ``shape`` to ``new_shape`` (right-aligned, size-1 dims stretch), as eager broadcasting."""
    shape, new_shape = tuple(shape), tuple(int(s) for s in new_shape)
    lead = len(new_shape) - len(shape)
    if lead < 0:
        raise ScanShapeError(f"{what}: cannot broadcast a value of shape {shape} to {new_shape} (fewer dims)")
    view = []
    for d, s in enumerate(shape):
        t = new_shape[lead + d]
        if t == -1:
            t = s
        if s == t:
            view.append((lead + d, 0, 1))
        elif s == 1:
            view.append((-1, 0, 0))
        else:
            raise ScanShapeError(f"{what}: cannot broadcast a value of shape {shape} to {new_shape}")
    resolved = tuple(new_shape[:lead]) + tuple(s if t == -1 else t for s, t in zip(shape, new_shape[lead:]))
    return tuple(view), resolved


def permute(shape: Sequence[int], order: Sequence[int]) -> tuple[View, tuple]:
    inverse = {old: new for new, old in enumerate(order)}
    return tuple((inverse[d], 0, 1) for d in range(len(shape))), tuple(shape[d] for d in order)


def unsqueeze(shape: Sequence[int], d: int) -> tuple[View, tuple]:
    return tuple((e if e < d else e + 1, 0, 1) for e in range(len(shape))), tuple(shape[:d]) + (1,) + tuple(shape[d:])


def squeeze(shape: Sequence[int], dims: set) -> tuple[View, tuple]:
    view, new, k = [], [], 0
    for d, s in enumerate(shape):
        if d in dims and s == 1:
            view.append((-1, 0, 0))
        else:
            view.append((k, 0, 1))
            new.append(s)
            k += 1
    return tuple(view), tuple(new)


def reshape(shape: Sequence[int], new_shape: Sequence[int], what: str) -> tuple[View, tuple]:
    """Only reshapes that add or remove size-1 dims map lanes to lanes without index arithmetic."""
    shape = tuple(shape)
    new_shape = [int(s) for s in new_shape]
    total = 1
    for s in shape:
        total *= s
    if new_shape.count(-1) == 1:
        known = 1
        for s in new_shape:
            if s != -1:
                known *= s
        new_shape[new_shape.index(-1)] = total // known if known else 0
    new_shape = tuple(new_shape)
    if [s for s in shape if s != 1] != [s for s in new_shape if s != 1]:
        raise ScanTraceError(f"{what}: reshaping rows of shape {shape} to {new_shape} is not supported in a scan "
                             "body (only adding or removing size-1 dims is); reshape the inputs before the scan")
    view, j = [], 0
    for s in shape:
        if s == 1:
            view.append((-1, 0, 0))
            continue
        while new_shape[j] == 1:
            j += 1
        view.append((j, 0, 1))
        j += 1
    return tuple(view), new_shape


def index(shape: Sequence[int], idx, what: str) -> tuple[View, tuple]:
    """``x[idx]`` for ``idx`` made of ints, slices with positive steps, ``None`` and one ``...``."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    for i in idx:
        if not (i is None or i is Ellipsis or isinstance(i, (int, slice)) and not isinstance(i, bool)):
            raise ScanTraceError(f"{what}: indexing with {type(i).__name__} {i!r} is not supported in a scan body "
                                 "(ints, slices, None and ... are)")
    if idx.count(Ellipsis) > 1:
        raise ScanShapeError(f"{what}: an index can only have one ellipsis")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise ScanShapeError(f"{what}: too many indices ({n_real}) for rows of shape {tuple(shape)}")
    if Ellipsis in idx:
        e = idx.index(Ellipsis)
        idx = idx[:e] + (slice(None),) * (len(shape) - n_real) + idx[e + 1:]
    else:
        idx = idx + (slice(None),) * (len(shape) - n_real)
    view, new, d = [None] * len(shape), [], 0
    for i in idx:
        if i is None:
            new.append(1)
            continue
        size = shape[d]
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step <= 0:
                raise ScanTraceError(f"{what}: slice steps must be positive, got {step}")
            n = len(range(start, stop, step))
            view[d] = (len(new), start, step)
            new.append(n)
        else:
            if not -size <= i < size:
                raise ScanShapeError(f"{what}: index {i} is out of range for dim {d} of size {size}")
            view[d] = (-1, i % size, 0)
        d += 1
    return tuple(view), tuple(new)


def narrow(shape: Sequence[int], dim: int, start: int, length: int, what: str) -> tuple[View, tuple]:
    if start < 0:
        start += shape[dim]
    if not (0 <= start and length >= 0 and start + length <= shape[dim]):
        raise ScanShapeError(f"{what}: narrow(dim={dim}, start={start}, length={length}) is out of range for "
                             f"size {shape[dim]}")
    idx = [slice(None)] * len(shape)
    idx[dim] = slice(start, start + length)
    return index(shape, tuple(idx), what)


def norm_dim(d: int, rank: int, what: str) -> int:
    if not isinstance(d, int) or not -max(rank, 1) <= d < max(rank, 1):
        raise ScanShapeError(f"{what}: dim {d!r} is out of range for rows of rank {rank}")
    return d % max(rank, 1)
