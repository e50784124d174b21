"""Gradients that refuse to be differentiated again.

evtorch's backward passes (a fused GEMM's, a scan's) compute their gradients without an autograd graph. Under
``create_graph=True`` such gradients would look like constants to a second differentiation, and a gradient
penalty's second-order term would silently be dropped. So they are passed through ``_Refuse``, an identity whose
own backward raises, tied to an *anchor*: a tensor of the first backward that requires grad and leads back to the
forward's inputs (a saved output of the node, or the node's own empty anchor output), so that
``torch.autograd.grad(penalised_loss, [x])`` walks into ``_Refuse`` and raises instead of passing it by.
"""
from __future__ import annotations

import torch

from ..errors import EpilogueError


class _Refuse(torch.autograd.Function):
    """Identity on ``grads``; its backward raises ``message``. The anchors are inputs only for the graph's edges."""

    @staticmethod
    def forward(ctx, message, n_anchors, *tensors):
        ctx.message = message
        return tuple(g.view_as(g) for g in tensors[n_anchors:])

    @staticmethod
    def backward(ctx, *_):
        raise EpilogueError(ctx.message)


def refuse_double_backward(grads, anchors, message: str) -> list:
    """``grads`` (None entries kept) made to raise ``message`` when differentiated. ``anchors``: tensors of the
    backward; those that require grad tie the gradients to the forward's inputs (none: a fresh leaf keeps them in
    a graph, which ``.backward()`` still reaches)."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    tied = [a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad]
    if not tied:
        tied = [torch.empty(0, requires_grad=True)]
    wrapped = iter(_Refuse.apply(message, len(tied), *tied, *present))
    return [next(wrapped) if g is not None else None for g in grads]
