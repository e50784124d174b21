"""From IR shape classes to memory: per-axis strides of inputs and the layout of outputs.

Shared by the reference executor and the Triton launcher, so both read and write exactly the same elements.
A load's ``binding`` says which axes each input dim walks; a merged dim (``('L', 'M')``) walks them with
row-major index arithmetic, which is linear, so every load is ``base + l*sL + m*sM + n*sN``; a run of input dims
merged by a reshape (``MERGED``) is read as the one flat dim it is a view of. Outputs are
stored contiguously over the axes they walk (canonical L, M, N order) and handed back as the strided view
the epilogue returned (``D.T`` comes back as a transposed view, as in eager).
"""
from __future__ import annotations

import itertools
import math

import torch

from ..errors import ShapeError
from .types import AXES, MERGED


def input_axis_strides(name: str, tensor: torch.Tensor, binding, sizes: dict) -> dict[str, int]:
    """Element strides per axis for loading ``tensor`` bound as ``binding`` (per dim: axes walked, or ``MERGED``
    into the next dim: see ``binding_runs``)."""
    if tensor.dim() != len(binding):
        raise ShapeError(f"input {name!r} has {tensor.dim()} dims, but the epilogue was traced with {len(binding)}")
    strides = {a: 0 for a in AXES}
    for run, axes in binding_runs(binding):
        size = math.prod(tensor.shape[j] for j in run)
        want = math.prod(sizes[a] for a in axes) if axes else 1
        if size != want and not (not axes and size == 1):
            dims = f"dim {run[0]}" if len(run) == 1 else f"dims {run[0]}..{run[-1]} (merged)"
            raise ShapeError(f"input {name!r} {dims} has size {size}, expected {want}")
        stride = run_stride(name, tensor, run)
        inner = 1
        for a in reversed(axes):
            strides[a] += stride * inner
            inner *= sizes[a]
    return strides


def binding_runs(binding):
    """(input dims, axes walked) per run of a load's ``binding``: a dim on its own, or dims ``MERGED`` into the
    next ones up to the first that walks axes (size-1 dims bound to nothing may sit inside a run), which the run
    walks as one flat dim."""
    run = []
    for j, axes in enumerate(binding):
        if axes == MERGED or (run and not axes):
            run.append(j)
            continue
        yield run + [j], axes
        run = []
    if run:
        raise AssertionError(f"internal: binding {binding} ends in a merged dim")


def merges_dims(binding) -> bool:
    """Whether ``binding`` reads some run of input dims as one flat dim (a ``MERGED`` entry)."""
    return MERGED in binding


def run_stride(name: str, tensor: torch.Tensor, run) -> int:
    """The stride of input dims ``run`` viewed as one flat dim (a dim's own stride when it is alone). Refused
    where they do not nest (``_nests``): ``Epilogue.viewable_inputs`` copies such an input first, as eager's
    ``reshape`` copies it."""
    if not _nests(tensor, run):
        raise ShapeError(f"input {name!r}: the epilogue reshapes dims {run[0]}..{run[-1]} (sizes "
                         f"{tuple(tensor.shape[j] for j in run)}) into one, but their strides "
                         f"{tuple(tensor.stride(j) for j in run)} do not merge without a copy; pass "
                         f"{name}.contiguous()")
    real = [j for j in run if tensor.shape[j] != 1]
    return tensor.stride(real[-1] if real else run[-1])


def runs_viewable(tensor: torch.Tensor, binding) -> bool:
    """Whether every merged run of ``binding`` is a view of ``tensor`` (``run_stride`` would not raise)."""
    return all(_nests(tensor, run) for run, _ in binding_runs(binding))


def _nests(tensor: torch.Tensor, run) -> bool:
    """Whether dims ``run`` of ``tensor`` merge into one strided dim, as ``view`` needs: dims of size 1 take no
    room, the others nest as row-major dims do (outer stride = inner stride * inner size); an empty tensor has
    no elements to place."""
    real = [j for j in run if tensor.shape[j] != 1]
    return not tensor.numel() or all(tensor.stride(o) == tensor.stride(i) * tensor.shape[i]
                                     for o, i in itertools.pairwise(real))


def output_base_axes(dims) -> tuple[str, ...]:
    """The axes an output is stored over (canonical order): every axis its returned view walks."""
    walked = {a for axes, _ in dims for a in axes}
    return tuple(a for a in AXES if a in walked)


def output_view(dims, sizes: dict, what: str = "output", order=None):
    """(base shape, base axes, view sizes, view strides) for an output returned with logical ``dims``.

    ``dims``: per returned dim, (axes walked, expanded size or None). ``order``: the axes of the base, outermost
    first, where the output is not stored in (L, M, N) order (``.contiguous()`` of a transposed value: the output
    node's ``order``); the kernels store through per-axis strides, so any order is one. Raises when the returned
    view is not a strided view of the contiguous base (it would need a copy)."""
    base_axes = tuple(order) if order else output_base_axes(dims)
    base_shape = [sizes[a] for a in base_axes]
    base_strides, acc = {}, 1
    for a in reversed(base_axes):
        base_strides[a] = acc
        acc *= sizes[a]
    view_sizes, view_strides = [], []
    for axes, expanded in dims:
        if axes:
            size = math.prod(sizes[a] for a in axes)
            # size-1 axes take no room in memory: only the order of the others decides whether the merged
            # dim is one stride (checking neighbours in the full list would skip pairs around a size-1 axis)
            real = [a for a in axes if sizes[a] != 1]
            for outer, inner in zip(real, real[1:]):
                if sizes[outer] > 1 and sizes[inner] > 1 and base_strides[outer] != base_strides[inner] * sizes[inner]:
                    raise ShapeError(f"{what}: the returned view merges axes {'*'.join(axes)} out of memory order; "
                                     "returning it would need a copy (reshape of a transposed value). Return the "
                                     "value without that reshape, or merge the dims in their original order")
            view_sizes.append(size)
            view_strides.append(base_strides[real[-1]] if real else 1)
        else:
            view_sizes.append(expanded if expanded is not None else 1)
            view_strides.append(0)
    return base_shape, base_axes, view_sizes, view_strides


def poison_value(dtype: torch.dtype):
    """What an output is filled with before it is written when poisoning is on (``EVTORCH_POISON``): an
    element nobody writes then shows up as NaN (or True / -1 for bool / integer outputs)."""
    if dtype.is_floating_point:
        return float("nan")
    return True if dtype == torch.bool else -1


def make_output(dims, sizes: dict, dtype: torch.dtype, device, fill=None, order=None):
    """Allocate an output's contiguous base (optionally poisoned; its axes in ``order``, see ``output_view``) and
    its returned view."""
    base_shape, base_axes, vs, vst = output_view(dims, sizes, order=order)
    base = torch.empty(base_shape, dtype=dtype, device=device) if fill is None else \
        torch.full(base_shape, fill, dtype=dtype, device=device)
    if list(vs) == list(base.shape) and tuple(vst) == base.stride():
        # the whole base as it is: return it rather than a view of it, so that the caller may modify it in
        # place (autograd refuses in-place ops on a view made inside a custom Function: ``h += x`` on a layer's
        # output would raise)
        return base, base_axes, base
    return base, base_axes, base.as_strided(vs, vst)
