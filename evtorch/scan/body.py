"""``ScanBody``: a scan's update (and optional post) traced for one signature, plus its execution plan.

The signature is what tracing depends on: the row shape and dtype of every state and input, and the number
k of init steps. The time length T never enters, so one trace (and one generated kernel) serves every T.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..epilogue import returns_of
from ..ir.graph import Graph
from ..ir.types import FLOAT_DTYPES
from . import trace as TR
from .plan import Group, plan_groups


@dataclass(frozen=True)
class RowSpec:
    """One state or input as the body sees it: the row (one time step) shape and dtype."""

    name: str
    shape: tuple
    dtype: torch.dtype


class ScanBody:
    def __init__(self, fn, states: list[RowSpec], inputs: list[RowSpec], k: int, post=None):
        self.fn, self.post_fn, self.k = fn, post, k
        self.name = getattr(fn, "__name__", "body")
        self.states, self.inputs = list(states), list(inputs)
        floats = [s.dtype for s in self.states + self.inputs if s.dtype in FLOAT_DTYPES]
        self.compute_dtype = torch.float64 if torch.float64 in floats else torch.float32

        state_names, input_names = TR.param_names(fn, len(states), len(inputs), "scan body")
        specs_s = [(n, s.shape, s.dtype) for n, s in zip(state_names, self.states)]
        specs_x = [(n, s.shape, s.dtype) for n, s in zip(input_names, self.inputs)]
        for n, s in zip(state_names, self.states):
            TR.check_dtype(f"state {n!r}", s.dtype)
        for n, s in zip(input_names, self.inputs):
            TR.check_dtype(f"input {n!r}", s.dtype)
        self.state_names = state_names

        tracer = TR.ScanTracer(k, specs_s, specs_x)
        result = TR.call_traced(fn, tracer.states + tracer.inputs, "scan body")
        tracer.finish(result, [s.shape for s in self.states], state_names, "scan body")
        self.traced: Graph = tracer.graph
        self.update: Graph = TR.optimize(tracer.graph)

        self.post: Graph | None = None
        self.post_specs: list[RowSpec] = []
        self.post_returns = "tensor"  # the post function's return convention (epilogue.returns_of)
        if post is not None:
            p_states, p_inputs = TR.param_names(post, len(states), len(inputs), "post function")
            ptracer = TR.ScanTracer(k, [(n, s.shape, s.dtype) for n, s in zip(p_states, self.states)],
                                    [(n, s.shape, s.dtype) for n, s in zip(p_inputs, self.inputs)], post=True)
            presult = TR.call_traced(post, ptracer.states + ptracer.inputs, "post function")
            self.post_returns = returns_of(presult)
            outs = ptracer.finish(presult, None, None, "post function")
            self.post_specs = [RowSpec(f"post{p}", tuple(v.shape), v.dtype) for p, v in enumerate(outs)]
            self.post = TR.optimize(ptracer.graph)
        if any(n.dtype == torch.float64 for gr in (self.update, self.post) if gr is not None for n in gr.nodes):
            # a float64 value in a float32 body (``h.double()``): the kernels hold every value in the compute dtype,
            # so the upcast is kept only by computing in float64 (in float32 it was a no-op, found 2026-11-29)
            self.compute_dtype = torch.float64
        self.groups: list[Group] = plan_groups(self)

    @property
    def signature(self):
        return (tuple((s.shape, s.dtype) for s in self.states), tuple((s.shape, s.dtype) for s in self.inputs),
                self.k)

    def __repr__(self):
        modes = ", ".join(g.describe() for g in self.groups)
        return f"<ScanBody {self.name} states={len(self.states)} inputs={len(self.inputs)} k={self.k}: {modes}>"

    def show(self) -> str:
        """The optimized update (and post) IR and the plan, for debugging and docs."""
        parts = [f"== update ==\n{self.update}"]
        if self.post is not None:
            parts.append(f"== post ==\n{self.post}")
        for g in self.groups:
            parts.append(f"== group {g.describe()} ==")
            if g.assoc is not None:
                parts.append(f"coefficients ({g.assoc.kind}):\n{g.assoc.graph}")
        return "\n".join(parts)
