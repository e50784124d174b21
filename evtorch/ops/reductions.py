"""Reductions: sum, mean, amax, amin, logsumexp over any of the iteration axes.

A reduction is declared once here: its torch reference, its identity (the value an empty or masked-out
element contributes), how partial results combine across tiles, and its derivative. Codegen reduces each
tile in registers, then combines tiles with atomics (or a deterministic workspace pass); ``mean`` is a
``sum`` followed by a division by the element count; ``logsumexp`` carries an online (max, sum-of-exp) pair.
"""
from __future__ import annotations

import math

import torch

from .registry import REDUCTION, define


def _reduce_sig(input, dim=None, keepdim=False, *, dtype=None): ...


def _torch_reduce(fn):
    def ref(x, dim=None, keepdim=False, dtype=None):
        if dim is None or dim == ():
            dim = tuple(range(x.dim()))
        if x.numel() == 0 and fn in (torch.amax, torch.amin):
            # torch refuses empty amax/amin; the identity is the only sensible answer for a fused reduction
            shape = [1 if d in _norm_dims(dim, x.dim()) else s for d, s in enumerate(x.shape)]
            fill = -math.inf if fn is torch.amax else math.inf
            out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
            return out if keepdim else out.squeeze(_norm_dims(dim, x.dim()))
        return fn(x, dim=dim, keepdim=keepdim)
    return ref


def _norm_dims(dim, rank):
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted(d % rank for d in dims))


def _expand_back(g, x, dim, keepdim):
    if dim is None or dim == ():
        dim = tuple(range(x.dim()))
    if not keepdim:
        for d in _norm_dims(dim, x.dim()):
            g = g.unsqueeze(d)
    return g


def _lse_grad(g, x, out, dim=None, keepdim=False, dtype=None):
    return (_expand_back(g, x, dim, keepdim) * torch.exp(x - _expand_back(out, x, dim, keepdim)),)


def _minmax_grad(g, x, out, dim=None, keepdim=False, dtype=None):
    # ties share the gradient equally, as torch's amax/amin backward does
    o = _expand_back(out, x, dim, keepdim)
    mask = (x == o).to(g.dtype)
    count = mask.sum(dim=dim if dim not in (None, ()) else tuple(range(x.dim())), keepdim=True)
    return (_expand_back(g, x, dim, keepdim) * mask / count,)


def _mean_grad(g, x, out, dim=None, keepdim=False, dtype=None):
    dims = _norm_dims(dim if dim not in (None, ()) else tuple(range(x.dim())), x.dim())
    count = math.prod(x.shape[d] for d in dims)
    return (_expand_back(g, x, dim, keepdim) / count,)


REDUCE_TRAITS = frozenset({REDUCTION})

define("sum", _reduce_sig, torch_ref=_torch_reduce(torch.sum),
       derivative=lambda g, x, out, dim=None, keepdim=False, dtype=None: (_expand_back(g, x, dim, keepdim),),
       torch_fns=(torch.sum,), methods=("sum",), traits=REDUCE_TRAITS)
define("mean", _reduce_sig, torch_ref=_torch_reduce(torch.mean), derivative=_mean_grad,
       torch_fns=(torch.mean,), methods=("mean",), traits=REDUCE_TRAITS)
define("amax", _reduce_sig, torch_ref=_torch_reduce(torch.amax), derivative=_minmax_grad,
       torch_fns=(torch.amax,), methods=("amax",), traits=REDUCE_TRAITS)
define("amin", _reduce_sig, torch_ref=_torch_reduce(torch.amin), derivative=_minmax_grad,
       torch_fns=(torch.amin,), methods=("amin",), traits=REDUCE_TRAITS)
define("logsumexp", _reduce_sig, torch_ref=_torch_reduce(torch.logsumexp), derivative=_lse_grad,
       torch_fns=(torch.logsumexp,), methods=("logsumexp",), traits=REDUCE_TRAITS)

#: how each reduction's per-tile partials combine and what an absent element contributes
IDENTITY = {"sum": 0.0, "mean": 0.0, "amax": -math.inf, "amin": math.inf, "logsumexp": -math.inf}
