"""Backward of a scan: a reverse linear scan, so training runs as parallel as the forward.

For one state with a first-order, lane-wise update ``y_t = F(y_{t-1}, x_t)`` (every associative case, and
also non-associative ones such as ``tanh(a * h + x)``), the gradient ``lam_t = dL/dy_t`` obeys::

    lam_{T-1} = g_{T-1}        lam_t = g_t + D_{t+1} * lam_{t+1}        D_t = dF/dy (y_{t-1}, x_t)

a first-order *linear* recurrence running backwards in time, i.e. ``evt.scan(lambda l, d, g: d * l + g)``
on reversed rows: the parallel linear kernel on CUDA. ``D`` and the input gradients come from evaluating
the update vectorized over all steps at once (``reference.evaluate``) under torch autograd; the forward
history is saved, so nothing is recomputed step by step. Other recurrences (several coupled states, reads
of earlier steps than t-1) differentiate through the reference executor, step by step.
"""
from __future__ import annotations

import torch

from ..integration.nodouble import refuse_double_backward
from .reference import as_rows, evaluate, run_post, run_reference
from .plan import state_of


def parallel_backward_ok(body) -> bool:
    if len(body.states) != 1 or len(body.groups) != 1:
        return False
    g = body.groups[0]
    return g.mode in ("assoc", "lanes") and g.lags[0] == 1 and body.states[0].dtype.is_floating_point


_DOUBLE_BACKWARD = ("double backward through evt.scan is not supported for this recurrence (a single first-order "
                    "lane-wise state, whose backward is itself a scan): compute higher-order gradients with an "
                    "eager loop over the steps instead")


class _ScanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, body, run, T, init, *inputs):
        y = run(body, [init], list(inputs), T)[0]
        ctx.body, ctx.run, ctx.T = body, run, T
        ctx.save_for_backward(y, init, *inputs)
        return y

    @staticmethod
    def backward(ctx, grad):
        if not torch.is_grad_enabled():
            return _ScanFunction._backward(ctx, grad)
        # create_graph=True: the gradients are computed without a graph, so they must refuse to be differentiated
        # (once_differentiable only does so when an incoming gradient requires grad: a gradient penalty on
        # torch.autograd.grad(y.sum(), x, create_graph=True) silently lost its second-order term)
        with torch.no_grad():
            res = _ScanFunction._backward(ctx, grad)
        y = ctx.saved_tensors[0]  # this node's output: its graph leads back to init and the inputs
        return tuple(refuse_double_backward(res, (y,), _DOUBLE_BACKWARD))

    @staticmethod
    def _backward(ctx, grad):
        body, T = ctx.body, ctx.T
        y, init, *inputs = ctx.saved_tensors
        k, cd, shape = body.k, body.compute_dtype, body.states[0].shape
        grad = grad.to(cd)
        g_init = grad[:k].clone()
        wants = ctx.needs_input_grad[3:]  # (init, *inputs)
        if T <= k:
            return (None, None, None, g_init.to(init.dtype) if wants[0] else None) + (None,) * len(inputs)
        with torch.enable_grad():
            prev = y[k - 1:T - 1].to(cd).detach().requires_grad_()
            xs = [x.detach().requires_grad_() if w and x.dtype.is_floating_point else x.detach()
                  for x, w in zip(inputs, wants[1:])]

            def read(node):
                lag = node.attrs["lag"]
                if state_of(node) is not None:
                    return prev
                return xs[int(node.target[1:])][k - lag:T - lag]

            out = as_rows(evaluate(body.update, read, cd, T - k)[0], T - k, shape, cd, y.device)
            (d,) = torch.autograd.grad(out, prev, torch.ones_like(out), retain_graph=True, allow_unused=True)
        d = torch.zeros_like(prev) if d is None else d
        lam = _reverse_linear(d.detach(), grad[k - 1:], ctx.run)
        g_init[k - 1] = lam[0]
        need = [x for x, w in zip(xs, wants[1:]) if w and x.requires_grad]
        g_need = iter(torch.autograd.grad(out, need, lam[1:], allow_unused=True) if need else ())
        g_inputs = []
        for x, w in zip(xs, wants[1:]):
            if w and x.requires_grad:
                gx = next(g_need)
                g_inputs.append(torch.zeros_like(x) if gx is None else gx)
            else:
                g_inputs.append(None)
        return (None, None, None, g_init.to(init.dtype) if wants[0] else None, *g_inputs)


def _reverse_linear(d: torch.Tensor, g_tail: torch.Tensor, run) -> torch.Tensor:
    """lam for steps k-1 .. T-1 from D (steps k .. T-1) and g (steps k-1 .. T-1)."""
    from .api import scan
    g_rev = g_tail.flip(0).contiguous()
    d_rev = torch.cat([torch.ones_like(d[:1]), d.flip(0)]).contiguous()
    lam_rev = scan(_adjoint_step, d_rev, g_rev, init=g_rev[:1], backend=run.backend, deterministic=run.deterministic)
    return lam_rev.flip(0)


def _adjoint_step(lam, d, g):
    return d * lam + g


def differentiable(body, body_nopost, inits, inputs, T, run, step_by_step: bool = False) -> list:
    """Results of a scan whose inputs require grad. ``step_by_step``: through the reference executor's torch ops
    whatever the recurrence (under torch.func.grad / vjp / jacrev, which cannot run ``_ScanFunction``: it has no
    ``setup_context``; torch's own error said so before, found 2026-11-29)."""
    if parallel_backward_ok(body_nopost) and not step_by_step:
        y = _ScanFunction.apply(body_nopost, run, T, inits[0], *inputs)
        if body.post is None:
            return [y]
        return run_post(body, [y.to(body.compute_dtype) if y.dtype.is_floating_point else y], inputs, 0, T)
    states, posts = run_reference(body, inits, inputs, T, want_states=body.post is None)
    return posts if body.post is not None else states
