"""``GradPlan``: the forward and backward of one epilogue, and what the forward keeps for the backward.

For ``evt.gemm(A, B, fn, **inputs)`` with some of A, B and the tensor inputs requiring grad, the plan holds

- ``forward_fn``: the epilogue replayed on canonical inputs, returning the user's outputs (canonical) followed by
  the values saved for the backward;
- ``backward(seeds)``: the backward for gradients arriving on output positions ``seeds``, as a list of passes
  (``autodiff.staging``). Each pass is an epilogue over the same accumulator; the last one outputs
  ``d(acc)`` (full-size, for ``dA = d(acc) @ Bᵀ`` and ``dB = Aᵀ @ d(acc)``) and the gradient of every tensor
  input needing one, reduced over the axes it is broadcast along (a row bias gets one fused sum over M);
- ``saved_for_backward``: what the forward keeps, decided as follows. Every value of the forward can be
  recomputed in the backward's epilogue from the accumulator, the inputs and the finished reductions. So

  * reduction results (and vector values computed from them) that the backward uses are saved: they are
    small (one value per row, column or batch) and a tile computation cannot recompute them;
  * the accumulator is saved (as an extra output, in the output dtype) when the backward uses any value
    depending on it (GELU's input, a ReLU mask, ...); recomputing it would cost another GEMM. With
    ``policy="recompute"`` the backward recomputes ``A @ B`` instead and nothing full-size is kept;
  * inputs are kept only if the backward reads them, A only if B needs a gradient, B only if A does;
  * everything else (tile values: biases added, activations, masks) is recomputed in the backward epilogue.

The decision is made by building the backward once with every candidate available and keeping what its
optimized epilogues actually load.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..epilogue import Epilogue
from ..errors import EpilogueError
from ..frontend.tracer import InputSpec
from ..ir.node import Node
from ..ir.types import axes_str, dtype_name
from .canonical import canonical_shape, space, walked_axes
from .replay import Space, Values
from .reverse import reverse
from .staging import Pass, StagingTracer, passes, signature_fn

POLICIES = ("save", "recompute")


def _summed(space_: Space, frames: dict, axes):
    """A leaf's gradient from its gradients per frame (autodiff/reverse.py): each summed down to ``axes``."""
    total = None
    for g in frames.values():
        g = space_.sum_to(g, axes)
        total = g if total is None else total + g
    return total


@dataclass(frozen=True)
class InputKey:
    """One way a keyword input is loaded (an input bound twice, as ``v[:, None]`` and ``v``, has two keys)."""

    param: str          # the canonical tensor's parameter name in generated epilogues: x0, x1, ...
    name: str           # the user's keyword
    binding: tuple      # per dim of the user's tensor: axes walked
    axes: tuple         # shape class
    dtype: torch.dtype


@dataclass(frozen=True)
class OutputInfo:
    position: int
    node: Node          # the value returned
    dims: tuple         # the returned view
    walked: tuple       # axes of its canonical form
    kind: str
    differentiable: bool
    layout: tuple | None = None  # the output node's ``order`` (``.contiguous()``): see canonical.layout_steps


@dataclass(frozen=True)
class Saved:
    """One thing the forward keeps for the backward (``ep.saved_for_backward`` lists these)."""

    name: str
    what: str
    axes: tuple
    dtype: torch.dtype | None

    def __str__(self):
        dt = f"{dtype_name(self.dtype)}" if self.dtype is not None else "-"
        return f"{self.name:<8} {dt}[{axes_str(self.axes)}]  {self.what}"


@dataclass
class BackwardProgram:
    """The passes of one backward and the names of the main pass' results."""

    passes: list[Pass]
    epilogues: list[Epilogue]
    d_acc: bool                 # the main pass' first result is d(acc)
    grads: list[str]            # then the gradient of each of these input params, in order
    mode: str                   # "recompute": acc = A @ B; "saved": acc_s loaded; "none": acc unused
    d_acc_from: str | None = None  # d(acc) is this output gradient itself (g<pos>): not computed by a pass

    def show(self) -> str:
        parts = []
        for p, ep in zip(self.passes, self.epilogues):
            parts.append(f"== {ep.name}: {', '.join(p.outputs)} ==\n{ep.graph}")
        return "\n\n".join(parts)


def _save_candidates(graph) -> list[Node]:
    """Vector values (reduction results and what is computed from them) the forward could keep.

    amax/amin results are left out: their rule compares them with the recomputed operand, and they are
    recomputed from the same accumulator as that operand (an earlier backward pass), so the two agree bit for
    bit even when the accumulator is kept in a 16-bit output dtype."""
    derived: set[int] = set()
    for n in graph.nodes:
        if n.op == "reduce" or (n.op == "compute" and any(id(a) in derived for a in n.args)):
            derived.add(id(n))
    return [n for n in graph.nodes if id(n) in derived and n.dtype.is_floating_point
            and not (n.op == "reduce" and n.target in ("amax", "amin"))]


def _compares_acc(epilogues) -> bool:
    """Whether a backward compares (``>``, ``==``, ``sign``...) a value that depends on the accumulator."""
    from ..ops import REGISTRY
    from ..ops.registry import COMPARE
    for ep in epilogues:
        dependent: set[int] = set()
        for n in ep.graph.nodes:  # topological order
            if n.op == "acc" or any(id(a) in dependent for a in n.args):
                dependent.add(id(n))
                if n.op == "compute" and n.target in REGISTRY and (REGISTRY[n.target].has(COMPARE)
                                                                   or n.target == "sign"):
                    return True
    return False


def check_policy(policy) -> None:
    """``policy=``: one of ``POLICIES`` (a list or another unhashable value is refused here, before it meets a
    cache key as "unhashable type")."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise EpilogueError(f"policy must be one of {POLICIES}, got {policy!r}")


class GradPlan:
    """Forward-with-saves and backward epilogues of ``ep`` for the given differentiable leaves."""

    def __init__(self, ep: Epilogue, *, wrt_acc: bool, wrt_inputs, out_dtype: torch.dtype, policy: str = "save"):
        check_policy(policy)
        self.ep = ep
        self.name = ep.name
        self.order = space(ep.batched)
        self.sizes = dict(ep.axis_sizes)
        self.out_dtype = out_dtype
        # the optimized graph: replaying it keeps the forward's fma decisions, so values recomputed by the
        # backward are bit-identical to the forward's (amax/amin's rule compares them for equality)
        self.graph = ep.graph
        kept = None if ep.keep is None else set(ep.keep)
        self.keys: list[InputKey] = []
        key_of: dict[tuple, InputKey] = {}
        for n in self.graph.nodes:
            if n.op == "input" and (n.target, n.attrs["binding"]) not in key_of:
                k = InputKey(f"x{len(self.keys)}", n.target, n.attrs["binding"], n.axes, n.dtype)
                key_of[(n.target, n.attrs["binding"])] = k
                self.keys.append(k)
        self._key_of = key_of
        self.scalars = [(f"s{i}", s) for i, s in enumerate(s for s in ep.input_specs if s.kind == "number")]
        self.outputs: list[OutputInfo] = []
        for o in self.graph.outputs:
            if kept is not None and o.target not in kept:
                continue
            self.outputs.append(OutputInfo(o.target, o.args[0], o.attrs["dims"], walked_axes(o.attrs["dims"]),
                                           o.attrs["kind"], o.dtype.is_floating_point, o.attrs.get("order")))
        self.vectors = _save_candidates(self.graph)
        self.wrt_acc = bool(wrt_acc)
        self.wrt_inputs = frozenset(wrt_inputs)
        self.wrt_keys = [k for k in self.keys if k.name in self.wrt_inputs and k.dtype.is_floating_point]
        self.requires_grad = self.wrt_acc or bool(self.wrt_keys)
        self.policy = policy
        self._analyse()

    # ------------------------------------------------------------------ shapes and dtypes
    @functools.cached_property
    def independent(self) -> tuple[int, ...]:
        """Indexes (in ``outputs``) of the outputs that no leaf needing a gradient reaches (``v * 2`` of an input
        without one, beside ``acc + v`` with A needing one): eager returns them with ``requires_grad`` False, so
        the forward marks them non-differentiable. They came back requiring a gradient, and a backward through one
        gave zeros where eager raises (found by a probe, 2026-11-29)."""
        wrt = {(k.name, k.binding) for k in self.wrt_keys}
        reached: set[int] = set()
        for n in self.graph.nodes:
            if (n.op == "acc" and self.wrt_acc) or (n.op == "input" and (n.target, n.attrs["binding"]) in wrt) \
                    or any(id(a) in reached for a in n.args):
                reached.add(id(n))
        return tuple(i for i, o in enumerate(self.outputs) if id(o.node) not in reached)

    def output_dtype(self, o: OutputInfo) -> torch.dtype:
        return self.ep.output_dtype(next(x for x in self.ep.outputs if x.position == o.position), self.out_dtype)

    def vector_dtype(self) -> torch.dtype:
        return torch.float64 if self.ep.acc_dtype == torch.float64 else torch.float32

    def canonical_shape(self, axes, sizes=None) -> list:
        return canonical_shape(axes, self.order, sizes or self.sizes)

    def key_shape(self, k: InputKey, sizes=None) -> tuple:
        """Shape of an input in canonical form (a 0-d tensor stays 0-d)."""
        return () if k.binding == () else tuple(self.canonical_shape(k.axes, sizes))

    def forward_layout(self) -> list[tuple[tuple, torch.dtype]]:
        """(axes, dtype) of every output of the forward-with-saves epilogue, in order."""
        layout = [(o.walked, self.output_dtype(o)) for o in self.outputs]
        layout += [(n.axes, self.vector_dtype()) for n in self.saved_vectors]
        if self.mode == "saved":
            layout.append((self.order, self.acc_save_dtype))
        return layout

    # ------------------------------------------------------------------ the forward
    @functools.cached_property
    def forward_fn(self):
        """The epilogue returning the user's outputs (canonical) and then the saved values."""
        saved, save_acc = list(self.saved_vectors), self.mode == "saved"

        def body(acc, kw):
            space_ = Space(self.order, self.sizes, acc)
            values = Values(self.graph, self._leaf(space_, kw, acc_value=acc), space_)
            outs = [space_.walk(values(o.node), o.walked) for o in self.outputs]
            outs += [values(n) for n in saved]
            if save_acc:
                outs.append(acc)
            return tuple(outs)
        return signature_fn(f"{self.name}_fwd", self.forward_params(), body)

    def forward_params(self) -> list[str]:
        return [k.param for k in self.keys] + [p for p, _ in self.scalars]

    @functools.cached_property
    def forward_epilogue(self) -> Epilogue:
        specs = [InputSpec(k.param, "tensor", self.key_shape(k), k.dtype) for k in self.keys]
        specs += [InputSpec(p, "number", dtype=s.dtype) for p, s in self.scalars]
        ep = Epilogue(self.forward_fn, self.ep.acc_shape, self.ep.acc_dtype, specs, intermediates="eager")
        if self.mode == "saved":
            ep.output_dtype_overrides[len(ep.outputs) - 1] = self.acc_save_dtype
        return ep

    def _leaf(self, space_: Space, kw: dict, acc_value, saved: dict | None = None):
        scalar_param = {s.name: p for p, s in self.scalars}

        def leaf(n: Node):
            if saved and id(n) in saved:
                return space_.bind(kw[saved[id(n)]])
            if n.op == "acc":
                return acc_value
            if n.op == "input":
                return space_.bind(kw[self._key_of[(n.target, n.attrs["binding"])].param])
            if n.op == "scalar":
                return kw[scalar_param[n.target]]
            return None
        return leaf

    # ------------------------------------------------------------------ the backward
    def backward_fn(self, seeds: tuple[int, ...], mode: str, saved_vectors: list[Node]):
        """The backward as one function of (acc, canonical inputs, scalars, output gradients ``g<pos>``,
        saved values ``v<k>``/``acc_s``); returns (d(acc) if A or B needs it, then each input gradient)."""
        vparam = {id(n): f"v{i}" for i, n in enumerate(saved_vectors)}
        wrt_keys = self.wrt_keys
        acc_dtype = self.ep.acc_dtype

        def body(acc, kw, produced: list):
            space_ = Space(self.order, self.sizes, acc)
            acc_value = acc if mode != "saved" else space_.bind(kw["acc_s"]).to(acc_dtype)
            values = Values(self.graph, self._leaf(space_, kw, acc_value, vparam), space_)
            # an epilogue that never reads acc has no acc node (its outputs depend on the inputs only): d(acc) = 0
            acc_node = next(iter(self.graph.find("acc")), None)
            wrt = {id(n) for n in self.graph.nodes if n.op == "input"
                   and self._key_of[(n.target, n.attrs["binding"])] in wrt_keys}
            if self.wrt_acc and acc_node is not None:
                wrt.add(id(acc_node))
            grads = reverse(self.graph, values, {p: space_.bind(kw[f"g{p}"]) for p in seeds}, wrt,
                            composites=self.ep.composite_grads)
            # a key's gradients come per frame (reverse's docstring), from each of its nodes (its tile load and
            # the stage split's vector copy, say): (M, N) for acc * s, (M,) for acc.sum(1) * s. Those of one frame
            # are added per element (one fused sum for them all); each frame is then summed down to the key (added
            # per element, the (M,) one was broadcast over N and counted N times: found 2026-11-29)
            frames: dict[str, dict[frozenset, object]] = {}
            for n in self.graph.nodes:
                if id(n) in grads and n.op == "input":
                    by_frame = frames.setdefault(self._key_of[(n.target, n.attrs["binding"])].param, {})
                    for f, g in grads[id(n)].items():
                        by_frame[f] = g if f not in by_frame else by_frame[f] + g
            per_key = {k.param: _summed(space_, frames[k.param], k.axes) for k in wrt_keys if k.param in frames}
            outs = []
            if self.wrt_acc:
                # no output depends on acc: d(acc) = 0
                g = _summed(space_, grads[id(acc_node)], self.order) if id(acc_node) in grads else torch.zeros_like(acc)
                outs.append(space_.walk(g, self.order))
                produced.append("d_acc")
            for k in wrt_keys:
                if k.param in per_key:  # else no seeded output depends on it: its gradient is None
                    outs.append(space_.walk(per_key[k.param], k.axes))
                    produced.append(k.param)
            return tuple(outs)
        return body

    def backward_specs(self, seeds, mode, saved_vectors) -> list[InputSpec]:
        specs = [InputSpec(k.param, "tensor", self.key_shape(k), k.dtype) for k in self.keys]
        specs += [InputSpec(p, "number", dtype=s.dtype) for p, s in self.scalars]
        for o in self.outputs:
            if o.position in seeds:
                specs.append(InputSpec(f"g{o.position}", "tensor", tuple(self.canonical_shape(o.walked)),
                                       self.output_dtype(o)))
        specs += [InputSpec(f"v{i}", "tensor", tuple(self.canonical_shape(n.axes)), self.vector_dtype())
                  for i, n in enumerate(saved_vectors)]
        if mode == "saved":
            specs.append(InputSpec("acc_s", "tensor", tuple(self.ep.acc_shape), self.acc_save_dtype))
        return specs

    def _build_backward(self, seeds, mode, saved_vectors) -> BackwardProgram:
        specs = self.backward_specs(seeds, mode, saved_vectors)
        body = self.backward_fn(seeds, mode, saved_vectors)
        tracer = StagingTracer(self.ep.acc_shape, self.ep.acc_dtype, specs)
        names: list[str] = []
        result = body(tracer.acc, dict(tracer.inputs), names)
        if not result:
            return BackwardProgram([], [], False, [], mode)
        tracer.finish(result)
        stages = passes(tracer, f"{self.name}_bwd", names, self.sizes)
        spec_of = {s.name: s for s in specs}
        epilogues = []
        for p in stages:
            pass_specs = [spec_of[x] if x in spec_of else self._deferred_spec(tracer, x) for x in p.params]
            epilogues.append(Epilogue(p.fn, self.ep.acc_shape, self.ep.acc_dtype, pass_specs, intermediates="eager"))
        program = BackwardProgram(stages, epilogues, names[:1] == ["d_acc"], [n for n in names if n != "d_acc"],
                                  mode)
        return self._passthrough(program)

    def _passthrough(self, program: BackwardProgram) -> BackwardProgram:
        """When d(acc) is an output gradient unchanged (``acc + bias``, a plain GEMM), use that tensor instead of
        copying it: the main pass keeps only the input gradients, or disappears."""
        if not program.d_acc:
            return program
        main = program.epilogues[-1]
        out = next(o for o in main.graph.outputs if o.target == 0)
        src = out.args[0]
        if not (src.op == "input" and src.target.startswith("g") and set(src.axes) == set(self.order)
                and src.attrs["binding"] == tuple((a,) for a in self.order)):
            return program
        program.d_acc_from = src.target
        rest = tuple(range(1, len(program.passes[-1].outputs)))
        if not rest:
            program.passes, program.epilogues = [], []
        else:
            program.epilogues[-1] = Epilogue(main.fn, main.acc_shape, main.acc_dtype, main.input_specs, keep=rest,
                                              intermediates="eager")
        return program

    @staticmethod
    def _deferred_spec(tracer, name) -> InputSpec:
        node = tracer.deferred[name]
        shape = tuple(tracer.axis_sizes[a] if a in node.axes else 1 for a in tracer.order)
        return InputSpec(name, "tensor", shape, node.dtype)

    @functools.lru_cache(maxsize=None)
    def backward(self, seeds: tuple[int, ...]) -> BackwardProgram:
        """The backward for gradients arriving on output positions ``seeds`` (sorted)."""
        program = self._build_backward(tuple(seeds), self.mode, self.saved_vectors)
        if self.mode == "none" and any(ep.graph.find("acc") for ep in program.epilogues):
            raise AssertionError(f"internal: the backward of {self.name} reads acc, which was not kept")
        return program

    # ------------------------------------------------------------------ what to save
    def _analyse(self) -> None:
        self.seeds_all = tuple(o.position for o in self.outputs if o.differentiable)
        if not self.requires_grad or not self.seeds_all:
            self.mode, self.saved_vectors, self.used_params = "none", [], set()
            self.requires_grad = False
            return
        probe = self._build_backward(self.seeds_all, "recompute", self.vectors)
        used, acc_used = set(), False
        for ep in probe.epilogues:
            used |= {n.target for n in ep.graph.nodes if n.op in ("input", "scalar")}
            acc_used = acc_used or bool(ep.graph.find("acc"))
        self.saved_vectors = [n for i, n in enumerate(self.vectors) if f"v{i}" in used]
        self.used_params = {k.param for k in self.keys if k.param in used}
        # recomputing acc runs a GEMM whose tiling (so rounding) may differ from the forward's: with amax/amin,
        # whose gradient goes to the elements equal to the maximum, only the saved accumulator is exact
        minmax = any(n.op == "reduce" and n.target in ("amax", "amin") for n in self.graph.nodes)
        self.mode = "none" if not acc_used else ("recompute" if self.policy == "recompute" and not minmax
                                                 else "saved")
        # likewise a saved accumulator rounded to a 16-bit output dtype would not reproduce the values the
        # forward's amax/amin compared, so it is kept in the accumulator's own dtype then; the same holds for
        # any comparison the backward makes on values recomputed from it (ReLU's mask ``acc + b > 0``: with
        # acc rounded before the bias is added, ~0.3% of the signs flip, and a bf16 MLP's input gradient was
        # off by 6% where torch's own was 0.5%, on an H200)
        wide = minmax or _compares_acc(probe.epilogues)
        self.acc_save_dtype = self.vector_dtype() if wide else self.out_dtype

    @property
    def saved_for_backward(self) -> list[Saved]:
        """What the forward keeps for the backward (besides A and B, listed when kept)."""
        out = []
        if self.mode == "saved":
            out.append(Saved("acc", "the accumulator A @ B, saved by the forward (recomputing it costs a GEMM)",
                             self.order, self.acc_save_dtype))
        if self.mode == "recompute":
            out.append(Saved("A, B", "to recompute the accumulator A @ B in the backward", (), None))
        for n in self.saved_vectors:
            out.append(Saved(n.name, f"{n.op} {n.target}: a reduction result the backward uses", n.axes,
                             self.vector_dtype()))
        for k in self.keys:
            if k.param in self.used_params:
                out.append(Saved(k.name, "input read by the backward", k.axes, k.dtype))
        return out

    def summary(self) -> str:
        lines = [f"forward of {self.name}: saves for the backward"]
        lines += [f"  {s}" for s in self.saved_for_backward] or ["  nothing"]
        lines.append("  (plus A if B needs a gradient, B if A does)" if self.wrt_acc else "")
        return "\n".join(line for line in lines if line)
