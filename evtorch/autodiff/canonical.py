"""The canonical form: every value lives in the iteration space, one dim per axis.

Differentiating an epilogue means moving values between the user's shapes and the IR's shape classes. Autodiff
does all of its work in one convention, the *canonical form*: a value of shape class ``axes`` is a tensor of
rank R (2 for an (M, N) accumulator, 3 for (L, M, N)) whose dim for axis ``a`` has the axis' size if ``a`` is in
``axes`` and 1 otherwise. The accumulator is canonical already; a row bias ``b`` (N,) is ``b.view(1, N)``; a
column vector walking M is ``(M, 1)``; a 0-d tensor stays 0-d.

``to_canonical`` and ``from_canonical`` are made of reshape/permute/expand only, so they are views that autograd
differentiates by itself: the fused operator takes and returns canonical tensors, and the user's shapes (a
transposed output ``D.T``, ``bias[:, None]``, ``v.view(-1, 1)``) are recovered outside it. Both run inside
torch.compile'd code, so they are written in the subset of Python Dynamo traces (no generators into builtins).
"""
from __future__ import annotations

import torch

from ..ir.types import AXES


def space(batched: bool) -> tuple[str, ...]:
    """The axes of the canonical form, outermost first: ('L', 'M', 'N') or ('M', 'N')."""
    return AXES if batched else AXES[1:]


def canonical_shape(axes, order, sizes) -> list[int]:
    """Shape of a canonical value of shape class ``axes``."""
    return [sizes[a] if a in axes else 1 for a in order]


def to_canonical(x: torch.Tensor, binding, order, sizes) -> torch.Tensor:
    """View input ``x`` bound as ``binding`` (per dim: the axes it walks) in canonical form."""
    if x.dim() == 0:
        return x
    owners = [a for axes in binding for a in axes]
    t = x.reshape([sizes[a] for a in owners])      # splits merged dims, drops unbound size-1 dims
    t = t.permute([owners.index(a) for a in order if a in owners])
    return t.reshape(canonical_shape(owners, order, sizes))


def walked_axes(dims) -> tuple[str, ...]:
    """The axes an output's returned view walks (its ``dims`` attribute: per dim, (axes, expanded size))."""
    walked = {a for axes, _ in dims for a in axes}
    return tuple(a for a in AXES if a in walked)


def from_canonical(t: torch.Tensor, dims, order, sizes) -> torch.Tensor:
    """The view an epilogue returned (``dims``, as recorded by the tracer) of canonical value ``t``."""
    walked = [a for axes, _ in dims for a in axes]                 # in the order the user returned them
    full = canonical_shape(walked, order, sizes)
    if list(t.shape) != full:
        t = t.expand(full)
    rest = [a for a in order if a not in walked]
    t = t.permute([order.index(a) for a in walked + rest])
    t = t.reshape([_prod([sizes[a] for a in axes]) for axes, _ in dims])
    if any(not axes and size for axes, size in dims):
        t = t.expand([size if (not axes and size) else -1 for axes, size in dims])
    return t


def _prod(values) -> int:
    out = 1
    for v in values:  # not math.prod(generator): torch.compile traces this function
        out = out * v
    return out


def sizes_of(A: torch.Tensor, B: torch.Tensor) -> dict:
    """Axis sizes of ``A @ B``."""
    return {"L": A.shape[0] if A.dim() == 3 else 1, "M": A.shape[-2], "N": B.shape[-1]}
