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
    owners = _owners(binding)
    t = x.reshape([sizes[a] for a in owners])      # splits merged dims, merges MERGED runs, drops size-1 dims
    t = t.permute([owners.index(a) for a in order if a in owners])
    return t.reshape(canonical_shape(owners, order, sizes))


def _owners(binding) -> list:
    """The axes an input bound as ``binding`` walks, in the order of its dims (a ``MERGED`` dim walks its run's
    axes, which the run's last dim names)."""
    # a membership test of strings, not ``axes != MERGED``: torch 2.11's Dynamo cannot guard the tuple comparison
    # of a constant binding (InternalTorchDynamoError in every compiled call, H200, 2026-11-29)
    return [a for axes in binding for a in axes if a in AXES]


def walked_axes(dims) -> tuple[str, ...]:
    """The axes an output's returned view walks (its ``dims`` attribute: per dim, (axes, expanded size))."""
    walked = {a for axes, _ in dims for a in axes}
    return tuple(a for a in AXES if a in walked)


def from_canonical(t: torch.Tensor, dims, order, sizes, layout=None) -> torch.Tensor:
    """The view an epilogue returned (``dims``, as recorded by the tracer) of canonical value ``t``; ``layout``: the
    output's memory order where ``.contiguous()`` gave it one (its node's ``order``), laid out so first."""
    walked = [a for axes, _ in dims for a in axes]                 # in the order the user returned them
    full = canonical_shape(walked, order, sizes)
    if list(t.shape) != full:
        t = t.expand(full)
    for method, arg in layout_steps(layout, order):
        t = apply_step(t, method, arg)
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


# ------------------------------------------------------------------------------------------------ eager steps
# ``to_canonical`` / ``from_canonical`` as lists of view steps for one signature (shapes known), without the steps
# that change nothing (a reshape to the same shape, an identity permute): each step is a view node in the autograd
# graph, so eager calls of evt.gemm replay only the ones that matter. Same values and gradients.
def canonical_steps(shape, binding, order, sizes) -> tuple:
    """The steps of ``to_canonical`` for an input of ``shape`` bound as ``binding``: ((method, argument), ...)."""
    if len(shape) == 0:
        return ()
    owners = _owners(binding)
    steps = []
    cur = [sizes[a] for a in owners]
    if cur != list(shape):
        steps.append(("reshape", tuple(cur)))
    perm = [owners.index(a) for a in order if a in owners]
    if perm != list(range(len(cur))):
        steps.append(("permute", tuple(perm)))
        cur = [cur[i] for i in perm]
    final = canonical_shape(owners, order, sizes)
    if final != cur:
        steps.append(("reshape", tuple(final)))
    return tuple(steps)


def output_steps(shape, dims, order, sizes, lead=None, layout=None) -> tuple:
    """The steps of ``from_canonical`` for a canonical value of ``shape`` (``layout``: as there), then (``lead``,
    for evt.linear) the reshape giving an output whose first dim walks the rows the leading dims ``lead``."""
    walked = [a for axes, _ in dims for a in axes]
    steps = []
    cur = list(shape)
    full = canonical_shape(walked, order, sizes)
    if cur != full:
        steps.append(("expand", tuple(full)))
        cur = full
    steps += layout_steps(layout, order)
    rest = [a for a in order if a not in walked]
    perm = [order.index(a) for a in walked + rest]
    if perm != list(range(len(cur))):
        steps.append(("permute", tuple(perm)))
        cur = [cur[i] for i in perm]
    target = [_prod([sizes[a] for a in axes]) for axes, _ in dims]
    if target != cur:
        steps.append(("reshape", tuple(target)))
    cur = target
    if any(not axes and size for axes, size in dims):
        cur = [size if (not axes and size) else c for (axes, size), c in zip(dims, cur)]
        steps.append(("expand", tuple(cur)))
    if lead is not None and dims and dims[0][0] == ("M",):
        target = list(lead) + cur[1:]
        if target != cur:
            steps.append(("reshape", tuple(target)))
    return tuple(steps)


def layout_steps(layout, order) -> list:
    """Steps laying a canonical value out in memory order ``layout`` (axes, outermost first; None: as it is)
    without changing its shape: into that order, a contiguous copy, and back. The views taken of it afterwards
    then have the strides eager gives them (``acc.T.contiguous()`` is a contiguous (N, M) tensor)."""
    if not layout:
        return []
    perm = [order.index(a) for a in layout] + [i for i, a in enumerate(order) if a not in layout]
    back = [perm.index(i) for i in range(len(perm))]
    return [("permute", tuple(perm)), ("contiguous", None), ("permute", tuple(back))]


def apply_step(t: torch.Tensor, method: str, arg) -> torch.Tensor:
    """One view step (``contiguous`` takes no argument)."""
    return t.contiguous() if method == "contiguous" else getattr(t, method)(arg)


def apply_steps(t: torch.Tensor, steps) -> torch.Tensor:
    for method, arg in steps:
        t = apply_step(t, method, arg)
    return t


def inverse_steps(shape, steps) -> tuple:
    """The steps taking a gradient of the result of ``steps`` (applied to a value of ``shape``) back to ``shape``:
    reshapes in reverse, inverse permutations (the backward of each view)."""
    shapes, cur = [], list(shape)
    for method, arg in steps:
        shapes.append(tuple(cur))
        if method == "reshape":
            cur = list(arg)
        elif method == "permute":
            cur = [cur[i] for i in arg]
        else:
            raise AssertionError(f"internal: no inverse for {method}")
    out = []
    for (method, arg), before in zip(reversed(steps), reversed(shapes)):
        if method == "reshape":
            out.append(("reshape", before))
        else:
            out.append(("permute", tuple(sorted(range(len(arg)), key=lambda i: arg[i]))))
    return tuple(out)
