"""The reference executor: a plain loop over time running the IR with the registry's torch references.

It is the CPU backend ("reference"), the oracle for the generated kernels, and, because it is made of
differentiable torch ops, the autograd fallback for recurrences without a parallel backward. Floating leaves
are read in the compute dtype (float32, float64 for float64 scans) and states are carried in it, exactly as
the kernels keep them in registers; histories are rounded to the state dtype once, at the end.

``evaluate`` runs a graph for a batch of steps at once (rows stacked on a leading dim), which is also how
``post`` and the backward's local derivatives are computed, vectorized over time.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ops import REGISTRY
from .plan import state_of


def apply_map(x: torch.Tensor, lane_map, out_shape) -> torch.Tensor:
    """``x`` (B, *source row) read through a lane map: a view of shape (B, *out_shape) up to size-1 dims."""
    idx, mapped = [slice(None)], {}
    for e, off, st in lane_map:
        if e < 0:
            idx.append(off)
        else:
            n = out_shape[e]
            idx.append(slice(off, off + st * (n - 1) + 1, st) if n > 0 else slice(off, off))
            mapped[e] = len(mapped) + 1
    y = x[tuple(idx)]
    y = y.permute([0] + [mapped[e] for e in sorted(mapped)])
    for e in range(len(out_shape)):
        if e not in mapped:
            y = y.unsqueeze(1 + e)
    return y


def evaluate(graph: Graph, read: Callable[[Node], torch.Tensor], compute_dtype, batch: int) -> dict:
    """Run ``graph``; ``read(leaf)`` gives the leaf's source rows (B, *source row). Returns output -> value."""
    env, outs = {}, {}
    for n in graph.nodes:
        if n.op == "input":
            x = read(n)
            if x.dtype.is_floating_point and x.dtype != compute_dtype:
                x = x.to(compute_dtype)
            v = apply_map(x, n.attrs["map"], n.attrs["shape"])
        elif n.op == "const":
            v = n.target
        elif n.op == "compute":
            v = REGISTRY[n.target].torch_ref(*[env[id(a)] for a in n.args], **n.attrs)
        elif n.op == "output":
            v = env[id(n.args[0])]
            outs[n.target] = v
        else:
            raise AssertionError(f"unexpected node {n.format()} in a scan graph")
        env[id(n)] = v
    return outs


def as_rows(value, batch: int, shape, dtype, device) -> torch.Tensor:
    """A result (tensor or number) broadcast to (batch, *shape) in ``dtype``."""
    if not isinstance(value, torch.Tensor):
        return torch.full((batch, *shape), value, dtype=dtype, device=device)
    if value.dim() < len(shape) + 1:
        value = value.reshape((1,) * (len(shape) + 1 - value.dim()) + tuple(value.shape))
    return value.to(dtype).expand(batch, *shape)


def held_dtype(dtype, compute_dtype):
    return compute_dtype if dtype.is_floating_point else dtype


def run_reference(body, inits: list[torch.Tensor], inputs: list[torch.Tensor], T: int,
                  want_states: bool = True) -> tuple[list, list]:
    """(state histories (T, *S) in state dtypes, post outputs (T, *P)) for time-major inits and inputs."""
    k, cd = body.k, body.compute_dtype
    device = inits[0].device
    held = [held_dtype(s.dtype, cd) for s in body.states]
    hist = [[init[r:r + 1].to(h) for r in range(k)] for init, h in zip(inits, held)]

    def read_step(t):
        def read(node):
            lag = node.attrs["lag"]
            j = state_of(node)
            if j is not None:
                return hist[j][t - lag]
            x = inputs[int(node.target[1:])]
            return x[t - lag:t - lag + 1]
        return read

    for t in range(k, T):
        values = evaluate(body.update, read_step(t), cd, 1)
        for j, spec in enumerate(body.states):
            hist[j].append(as_rows(values[j], 1, spec.shape, held[j], device))
    full = [torch.cat(h) if h else inits[j][:0].to(held[j]) for j, h in enumerate(hist)]
    states = [f.to(s.dtype) for f, s in zip(full, body.states)] if want_states else []
    return states, run_post(body, full, inputs, 0, T)


def run_post(body, states_full: list[torch.Tensor], inputs: list[torch.Tensor], t0: int, t1: int) -> list:
    """Post outputs for steps [t0, t1), vectorized; ``states_full`` hold (at least) those rows."""
    if body.post is None:
        return []

    def read(node):
        j = state_of(node)
        src = states_full[j] if j is not None else inputs[int(node.target[1:])]
        return src[t0:t1]

    values = evaluate(body.post, read, body.compute_dtype, t1 - t0)
    device = (states_full + inputs)[0].device
    return [_owned(as_rows(values[p], t1 - t0, spec.shape, spec.dtype, device), inputs)
            for p, spec in enumerate(body.post_specs)]


def _owned(v: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """``v`` as a tensor of its own: a copy where it is a view of an input (``post=lambda h, x: x`` handed the
    caller's input back, so writing to the result wrote to it, found 2026-11-29) or repeats elements (a broadcast
    row, stride 0), as the kernels' results never are."""
    ptr = v.untyped_storage().data_ptr()
    if any(st == 0 and n > 1 for st, n in zip(v.stride(), v.shape)) or \
            any(x.untyped_storage().data_ptr() == ptr for x in inputs):
        return v.clone(memory_format=torch.contiguous_format)
    return v
