"""``Epilogue``: a traced, optimized epilogue for one input signature.

``evt.trace(fn, acc=..., **inputs)`` builds one; ``evt.gemm`` builds (and caches) one per signature. It holds the
graph as traced and after the pass pipeline (``ep.graph``), the IR after each pass (``ep.passes_log``), and runs
on the reference executor (``ep.reference(acc, **inputs)``) or, via codegen, as a Triton kernel (``ep.source()``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .errors import EpilogueError, EpilogueTypeError
from .frontend.signature import Spec, check_keywords, epilogue_params, input_spec
from .frontend.tracer import InputSpec, Tracer
from .ir.graph import Graph
from .ir.interpret import Interpreter
from .ir.layouts import make_output, merges_dims, output_view, poison_value, runs_viewable
from .ir.types import AXES, Stage
from .passes.pipeline import run_pipeline
from .runtime import knobs


@dataclass(frozen=True)
class OutputInfo:
    position: int
    dims: tuple          # per returned dim: (axes walked, expanded size or None)
    kind: str            # "tile" or "vector"
    dtype: torch.dtype   # the IR dtype of the value
    order: tuple | None = None  # the base's axes where not stored in (L, M, N) order (``.contiguous()``)


class Epilogue:
    def __init__(self, fn: Callable, acc_shape: tuple[int, ...], acc_dtype: torch.dtype, inputs: list[InputSpec],
                 keep=None, debug: bool | None = None, intermediates: str | None = None):
        if len(acc_shape) not in (2, 3):
            raise EpilogueError(f"acc must have shape (M, N) or (L, M, N), got {tuple(acc_shape)}")
        if acc_dtype not in (torch.float32, torch.float64):
            raise EpilogueTypeError(f"acc dtype must be float32 (or float64), got {acc_dtype}")
        self.fn = fn
        self.name = getattr(fn, "__name__", "epilogue")
        self.acc_shape = tuple(acc_shape)
        self.acc_dtype = acc_dtype
        self.input_specs = list(inputs)
        self.keep = normalize_keep(keep)
        tracer = Tracer(self.acc_shape, acc_dtype, self.input_specs)
        if getattr(fn, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase):
            # an unbound Tensor method (torch.Tensor.exp) refuses the tracer's proxy with a raw TypeError
            # ("descriptor 'exp' for 'torch._C.TensorBase' objects doesn't apply", found by a probe 2026-11-29): it
            # is the method of that name on acc
            name = fn.__name__
            result = getattr(tracer.acc, name)(**tracer.inputs)
        else:
            result = fn(tracer.acc, **tracer.inputs)
        #: the epilogue's return convention, which results keep: "tensor", "tuple" or "list" (``pack_results``)
        self.returns = returns_of(result)
        bound = tracer.finish(result)
        if self.keep is not None:  # positions as in Python indexing; anything else names no output: an error
            n = len(bound)
            bad = [k for k in self.keep if not -n <= k < n]
            if bad:
                raise EpilogueError(f"outputs={self.keep}: {self.name} returns {n} output(s) (positions 0..{n - 1}); "
                                    f"there is no output {', '.join(map(str, bad))}")
            self.keep = tuple(sorted({k % n for k in self.keep}))
        self.axis_sizes = dict(tracer.axis_sizes)
        self.batched = tracer.batched
        self.traced: Graph = tracer.graph
        self.passes_log: list[tuple[str, str]] = []
        #: 'eager' (16-bit intermediates rounded where eager rounds them) or 'float32' (kept in float32, as
        #: torch.compile keeps them: passes/intermediates.py); default EVTORCH_INTERMEDIATES, read at trace time.
        #: Epilogues that autograd builds by replaying an optimized graph pass 'eager': the replay already
        #: computes each node in the dtype the forward's graph gave it
        self.intermediates = knobs.intermediates_mode() if intermediates is None else intermediates
        self.graph: Graph = run_pipeline(self.traced, keep=self.keep, debug=debug, record=self.passes_log,
                                         intermediates=self.intermediates)
        #: whether programs built for this epilogue may reassociate (codegen/fastmath.py; read at trace time, as
        #: the pipeline reads EVTORCH_DISABLE_PASSES, so an A/B traces the epilogue once per setting)
        self.reassociate = "reassociate" not in knobs.disabled_passes()
        #: whether the autodiff applies composites' own derivative rules (autodiff/reverse.py; read likewise)
        self.composite_grads = "composite_grads" not in knobs.disabled_passes()
        self.outputs = [OutputInfo(n.target, n.attrs["dims"], n.attrs["kind"], n.dtype, n.attrs.get("order"))
                        for n in self.traced.outputs]
        for o in self.outputs:  # refuse views that need a copy now, at trace time, with the user's sizes
            output_view(o.dims, self.axis_sizes, what=f"output {o.position} of {self.name}", order=o.order)
        #: per input name, the bindings of its loads that read a run of its dims as one flat dim (a reshape merged
        #: them: ``ir.types.MERGED``); ``viewable_inputs`` copies such an input where its strides do not merge
        self.merging_loads: dict[str, list] = {}
        for n in self.graph.nodes:
            if n.op == "input" and merges_dims(n.attrs["binding"]):
                self.merging_loads.setdefault(n.target, []).append(n.attrs["binding"])
        self._kernels = {}
        #: per output position, a dtype that overrides the rule below (internal: the autograd forward keeps
        #: the accumulator it saves in fp32 where the backward compares recomputed values exactly)
        self.output_dtype_overrides: dict[int, torch.dtype] = {}

    # ------------------------------------------------------------------ signature
    @property
    def signature(self):
        return (self.acc_shape, self.acc_dtype, tuple(s.signature for s in self.input_specs), self.keep)

    @property
    def has_vector_stage(self) -> bool:
        return any(n.stage == Stage.VECTOR and n.op != "reduce" for n in self.graph.nodes)

    def __repr__(self):
        return f"<Epilogue {self.name} acc{self.acc_shape} outputs={len(self.outputs)} nodes={len(self.graph.nodes)}>"

    # ------------------------------------------------------------------ results
    def output_dtype(self, o: OutputInfo, out_dtype: torch.dtype) -> torch.dtype:
        """Full-size floating outputs take ``out_dtype``; reduction/vector outputs, and tile-stage outputs that
        are not full-size (``row * 2`` of an (N,) input, a sum over a size-1 dim), are float32 (float64 for
        float64 GEMMs); bool and integer outputs keep their dtype. (Non-full tile outputs took ``out_dtype``: a
        float16 GEMM rounded a float32 row input's ``row * 2`` to float16, found by a probe 2026-11-29.)"""
        if o.position in self.output_dtype_overrides:
            return self.output_dtype_overrides[o.position]
        if not o.dtype.is_floating_point:
            return o.dtype
        if o.kind == "tile" and self.full_size(o):
            return out_dtype
        return torch.float64 if self.acc_dtype == torch.float64 else torch.float32

    def full_size(self, o: OutputInfo) -> bool:
        """Whether output ``o`` walks every axis of the accumulator (M and N, and L when batched)."""
        walked = {a for axes, _ in o.dims for a in axes}
        return walked >= ({"L", "M", "N"} if self.batched else {"M", "N"})

    def pack(self, values: dict):
        """Results in the epilogue's own return convention (a tensor, a tuple or a list); unwanted outputs are
        None."""
        return pack_results([values.get(o.position) for o in self.outputs], self.returns)

    def viewable_inputs(self, inputs: dict) -> dict:
        """``inputs``, with a contiguous copy of each one whose dims a reshape in the epilogue merges into one
        (``merging_loads``) where its strides do not merge (a transposed or sliced tensor): a load reads such a run
        as one strided dim, and eager's ``reshape`` copies the tensor too. The others are passed as they are."""
        out = inputs
        for name, bindings in self.merging_loads.items():
            t = inputs.get(name)
            if isinstance(t, torch.Tensor) and not all(runs_viewable(t, b) for b in bindings):
                out = dict(out) if out is inputs else out
                out[name] = t.contiguous()
        return out

    def reference(self, acc: torch.Tensor, out_dtype: torch.dtype | None = None, **inputs):
        """Run the optimized IR with torch ops (the "reference" backend)."""
        if tuple(acc.shape) != self.acc_shape:
            raise EpilogueError(f"acc has shape {tuple(acc.shape)}, but {self.name} was traced for {self.acc_shape}")
        check_keywords(self.fn, inputs)
        traced = {s.name for s in self.input_specs}
        if set(inputs) != traced:
            # a defaulted input given here but not at the trace is a constant of the trace (its value was silently
            # ignored), and one traced but left out here had no value (a raw KeyError; found by a probe 2026-11-29)
            raise EpilogueError(f"{self.name} was traced with inputs {sorted(traced) or 'none'} and is run with "
                                f"{sorted(inputs) or 'none'}: give the inputs it was traced with, or trace it again "
                                "(evt.gemm does, per call signature)")
        sizes = {a: s for a, s in zip(("L", "M", "N") if self.batched else ("M", "N"), acc.shape)}
        sizes.setdefault("L", 1)
        if self.merging_loads:
            inputs = self.viewable_inputs(inputs)
        raw = Interpreter(self.graph, sizes).run(acc.to(self.acc_dtype), inputs)
        out_dtype = out_dtype or self.acc_dtype
        results = {}
        for o in self.outputs:
            if o.position not in raw:
                continue
            dtype = self.output_dtype(o, out_dtype)
            base, base_axes, view = make_output(o.dims, sizes, dtype, acc.device,
                                                poison_value(dtype) if knobs.poison_enabled() else None, o.order)
            # axes the output does not walk are size 1 in the raw value (or in the iteration space): take their
            # first element before expanding, so an empty axis (M, N or L == 0) elsewhere never gets indexed
            value = raw[o.position]
            value = value[tuple(slice(None) if a in base_axes else slice(0, 1) for a in AXES)]
            value = value.expand([sizes[a] if a in base_axes else 1 for a in AXES])
            # the base's axes in its order (L, M, N unless .contiguous() laid the output out otherwise)
            value = value.permute([AXES.index(a) for a in base_axes] + [i for i, a in enumerate(AXES)
                                                                        if a not in base_axes])
            base.copy_(value.reshape(base.shape))
            results[o.position] = view
        return self.pack(results)

    # ------------------------------------------------------------------ inspection
    def to_dot(self) -> str:
        return self.graph.to_dot(self.name)

    def show(self) -> str:
        """The IR after each pass, as ``evtorch show`` prints it."""
        return "\n\n".join(f"== {name} ==\n{text}" for name, text in self.passes_log)

    def source(self, dtype: torch.dtype = torch.float16, **options) -> str:
        """The generated Triton source for A and B of ``dtype`` (see ``evtorch.codegen``)."""
        from .codegen.program import build_program
        return build_program(self, dtype, **options).source


def returns_of(result) -> str:
    """The return convention of an epilogue's ``result``: "list", "tuple" (a tuple or a tuple subclass: a named
    tuple comes back as a plain tuple) or "tensor"."""
    if isinstance(result, list):
        return "list"
    return "tuple" if isinstance(result, tuple) else "tensor"


def pack_results(values, returns: str):
    """``values`` (one per output, in order) in the return convention ``returns`` (``returns_of``): eager returns
    what the function returns, so a list stays a list (it came back as a tuple, found by a probe)."""
    if returns == "list":
        return list(values)
    return tuple(values) if returns == "tuple" else values[0]


def normalize_keep(keep):
    """``outputs=`` as a sorted tuple of positions (an int is one position); None keeps every output."""
    if keep is None:
        return None
    if isinstance(keep, int) and not isinstance(keep, bool):
        keep = (keep,)
    try:
        keep = tuple(keep)
    except TypeError:
        raise EpilogueTypeError(f"outputs= takes output positions (an int or a tuple of ints), got "
                                f"{type(keep).__name__}") from None
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in keep):
        raise EpilogueTypeError(f"outputs= takes output positions (ints), got {keep!r}")
    if not keep:  # evt.gemm returned None, and the differentiable path said "the epilogue returned nothing"
        raise EpilogueError("outputs= selects no output (got an empty sequence); pass the positions of the outputs "
                            "wanted, at least one, or None for all of them")
    return tuple(sorted(set(keep)))


def trace(fn: Callable, *, keep=None, debug: bool | None = None, intermediates: str | None = None,
          **examples) -> Epilogue:
    """Trace ``fn`` with example tensors or ``evt.spec`` placeholders for every input, acc included by name.
    ``intermediates``: 'eager' or 'float32' (default: ``EVTORCH_INTERMEDIATES``; passes/intermediates.py)."""
    acc_name, names = epilogue_params(fn)
    if acc_name not in examples:
        raise EpilogueTypeError(f"evt.trace needs an example for the accumulator {acc_name!r} "
                                f"(e.g. {acc_name}=evt.spec((M, N))); got {', '.join(examples) or 'nothing'}")
    acc = examples.pop(acc_name)
    if not isinstance(acc, (torch.Tensor, Spec)):
        raise EpilogueTypeError(f"{acc_name!r} must be a tensor or evt.spec, got {type(acc).__name__}")
    check_keywords(fn, examples)
    specs = [input_spec(n, examples[n]) for n in names if n in examples]
    acc_dtype = torch.float64 if acc.dtype == torch.float64 else torch.float32
    return Epilogue(fn, tuple(acc.shape), acc_dtype, specs, keep=keep, debug=debug, intermediates=intermediates)
