"""The op registry: one record per op, read by every layer.

An ``OpDef`` says everything evtorch knows about an op, in one place:

- ``name`` and how user code reaches it (``torch_fns``: torch/functional callables; ``methods``: Tensor method
  and operator names);
- ``signature``: a Python function with the op's torch signature, used only to bind call arguments, so
  ``F.leaky_relu(x, 0.2)`` and ``F.leaky_relu(x, negative_slope=0.2)`` normalise to the same node;
  ``operands`` names the parameters that are values (tensors or numbers), every other parameter is a
  compile-time attribute;
- ``torch_ref``: the eager meaning, ``torch_ref(*operands, **attrs)``; it is also the type rule (run on meta
  tensors it gives the result dtype exactly as eager promotion would) and the reference executor;
- ``triton``: the emission, a format string over operands ``{0}``, ``{1}`` and attributes ``{name}`` whose
  operands arrive already in the compute dtype (fp32, or fp64 for fp64 epilogues); only Triton primitives and
  ``evtorch.codegen.tlmath`` helpers, never libdevice, so the CPU interpreter runs every kernel;
- ``triton_fast``: optional second emission (same format) used instead of ``triton`` only where the emitter was
  told to approximate this node (``codegen/fastmath.py``: 16-bit outputs, a real GPU, ``EVTORCH_FAST_MATH``): it
  may use inline PTX (``tanh.approx.f32``), so it never runs under the interpreter; ``fast_exact`` says it measured
  as accurate as ``triton`` on a GPU, so the rule may use it whatever the output precision;
- ``triton_gpu``: optional exact GPU form (same format, or a callable of the attributes that returns None where
  ``triton`` is already what eager computes): an accurate computation that only a GPU runs (inline PTX, libdevice),
  at least as accurate as ``triton``: ``tanh``'s bits in fewer instructions, or eager's own libdevice function
  (pow). Used on a GPU wherever fast math is on and the node does not take ``triton_fast``
  (``codegen/fastmath.py``), in the compute dtypes ``triton_gpu_computes`` names (float32 by default);
- ``decompose``: instead of an emission, a composite written in other ops (few primitives, many composites);
- ``derivative``: reverse-mode rule ``(ctx, grad, *operands, out, **attrs) -> tuple of grads`` written with
  ctx's builder ops (see ``evtorch.autodiff``); a composite's, where given, replaces differentiating its
  decomposition (torch's own backward formula: shorter, eager's roundings, no NaN from an untaken branch);
- ``traits``: facts passes ask about instead of listing ops (commutative, float_only, bool_only, ...);
- ``method_self``: the operand the tensor fills when the op is called as a Tensor method, where that is not the
  first one (``x.where(cond, y)``).

Adding an op touches one ``define(...)`` call in ``ops/elementwise.py`` or ``ops/reductions.py``.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

COMMUTATIVE = "commutative"
FLOAT_ONLY = "float_only"      # integer operands are an error (torch would silently promote)
BOOL_ONLY = "bool_only"        # & | ~ on booleans only
COMPARE = "compare"            # result is bool
CAST = "cast"
REDUCTION = "reduction"


@dataclass(frozen=True, eq=False)
class OpDef:
    name: str
    signature: Callable
    operands: tuple[str, ...]
    torch_ref: Callable | None = None
    triton: str | Callable | None = None
    triton_fast: str | Callable | None = None  # hardware approximation (fast-math path; see codegen/fastmath.py)
    fast_exact: bool = False   # triton_fast measured as accurate as triton (then not limited to 16-bit outputs)
    triton_gpu: str | Callable | None = None  # accurate GPU-only form: tanh's bits in PTX, eager's libdevice pow
    triton_gpu_computes: tuple[str, ...] = ("float32",)  # the compute dtypes triton_gpu serves (gpu_form_serves)
    decompose: Callable | None = None
    derivative: Callable | None = None
    torch_fns: tuple = ()
    methods: tuple[str, ...] = ()
    traits: frozenset = frozenset()
    user_defined: Any = None   # the @triton.jit function of a user-registered op
    doc: str = ""
    method_self: str | None = None  # the operand ``x`` fills in ``x.method(...)`` (default: the first)

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(p for p in inspect.signature(self.signature).parameters if p not in self.operands)

    def has(self, trait: str) -> bool:
        return trait in self.traits

    def gpu_form_serves(self, compute) -> bool:
        """Whether ``triton_gpu`` is used for this op computing in ``compute`` (a torch dtype): only where it was
        checked against eager on a GPU (``triton_gpu_computes``)."""
        return str(compute).rsplit(".", 1)[-1] in self.triton_gpu_computes

    def bind(self, args: tuple, kwargs: dict) -> tuple[list, dict]:
        """Normalise a call to (operand values, attribute dict), applying the signature's defaults."""
        bound = inspect.signature(self.signature).bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        return [values.pop(p) for p in self.operands], values

    def method_args(self, self_value, args: tuple) -> tuple:
        """Positional arguments of the op for the Tensor-method call ``self_value.method(*args)``
        (``x.where(cond, y)`` is ``torch.where(cond, x, y)``)."""
        i = self.operands.index(self.method_self) if self.method_self else 0
        return tuple(args[:i]) + (self_value,) + tuple(args[i:])

    def __repr__(self):
        return f"OpDef({self.name})"


@dataclass
class Registry:
    """Name → OpDef, plus the lookups the tracer needs (torch callable → op, method name → op)."""

    ops: dict[str, OpDef] = field(default_factory=dict)
    by_torch_fn: dict[Any, OpDef] = field(default_factory=dict)
    by_method: dict[str, OpDef] = field(default_factory=dict)

    def add(self, op: OpDef) -> OpDef:
        if op.name in self.ops:
            raise ValueError(f"op {op.name!r} is already registered")
        self.ops[op.name] = op
        for fn in op.torch_fns:
            self.by_torch_fn[fn] = op
        for m in op.methods:
            self.by_method[m] = op
        return op

    def __getitem__(self, name: str) -> OpDef:
        try:
            return self.ops[name]
        except KeyError:
            raise KeyError(f"no op named {name!r}; known ops: {', '.join(sorted(self.ops))}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.ops

    def suggest(self, name: str) -> str:
        """A hint listing close supported names (for 'unsupported op' errors)."""
        names = {n for n in set(self.ops) | set(self.by_method) | {_fn_name(f) for f in self.by_torch_fn}
                 if not n.startswith("_")}  # operators' dunders are no spelling to suggest (rand_like: __and__)
        short = name.rsplit(".", 1)[-1]
        if short in ("max", "min"):  # the spelling that is refused here returns (values, indices) with a dim
            return f"; use torch.a{short}(x, dim) for the values (x.{short}(dim) also returns indices)"
        close = difflib.get_close_matches(short, sorted(names - {short}), n=5, cutoff=0.5)
        return f"; did you mean {', '.join(close)}?" if close else ""


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", str(fn))


REGISTRY = Registry()


def define(name: str, signature: Callable, *, operands: tuple[str, ...] | None = None, **fields) -> OpDef:
    """Declare an op. ``operands`` defaults to the signature's first parameter (unary ops)."""
    if operands is None:
        operands = (next(iter(inspect.signature(signature).parameters)),)
    return REGISTRY.add(OpDef(name=name, signature=signature, operands=operands, **fields))
