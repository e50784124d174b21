"""Tracing a plain PyTorch epilogue into an IR graph.

The tracer calls the user's function once on ``TracedTensor`` proxies: ``acc`` (bound to the iteration axes
L, M, N), one proxy per keyword input, and records every op as an IR node. Roles follow eager broadcasting:
a keyword tensor stays *pending* until it meets an accumulator-derived value, and its dims bind to the axes
they align with there (so ``bias[:, None]`` becomes a column broadcast and ``bias`` a row broadcast, whatever
the sizes happen to be). Reductions end the tile stage: their results and everything computed from them
are vector-stage values, which may not flow back into a full-tile computation.
"""
from __future__ import annotations

import inspect
import linecache
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import (EpilogueError, EpilogueTypeError, ShapeError, UnsupportedOpError)
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import HALF_DTYPES, SUPPORTED_DTYPES, Stage, canonical, dtype_name, is_float
from ..ops import REGISTRY
from ..ops.registry import BOOL_ONLY, FLOAT_ONLY, REDUCTION, OpDef
from . import dims as D
from .proxy import TracedTensor

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


# integer dtypes narrower than a Python int's int64 (a constant outside them is refused in ``Tracer.apply``)
_NARROW_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32)


@dataclass(frozen=True)
class InputSpec:
    """What the tracer knows of one keyword input: a tensor's shape and dtype, or a Python number."""

    name: str
    kind: str  # "tensor" or "number"
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32

    @property
    def signature(self):
        if self.kind == "number":
            return (self.name, "number", self.dtype)
        return (self.name, "tensor", self.shape, self.dtype)


@dataclass
class _Pending:
    """An expression over keyword inputs only, waiting to learn which axes its dims walk."""

    kind: str                       # "input" or "op"
    name: str = ""                  # input name
    op: OpDef | None = None
    operands: tuple = ()            # TracedTensor | number | None
    attrs: dict | None = None
    dtype: torch.dtype = torch.float32
    meta: dict = field(default_factory=dict)  # copied onto the node it becomes (autodiff's replay marks some)


def _eager_exponent(x, exponent):
    """``x ** exponent``'s exponent as eager uses it: ATen converts it to a float16 / bfloat16 tensor's own dtype on
    every device (``exp_scalar.to<scalar_t>()``: ``x16 ** 2.7`` is ``x16 ** 2.703125`` in bfloat16, up to several
    percent away from the unrounded power), so a 16-bit operand's exponent is rounded here; other dtypes keep it."""
    if not (isinstance(x, TracedTensor) and x.dtype in HALF_DTYPES) or isinstance(exponent, bool):
        return exponent
    rounded = torch.tensor(exponent, dtype=torch.float64).to(x.dtype).item()
    return int(rounded) if isinstance(exponent, int) and float(rounded).is_integer() else rounded


class Tracer:
    def __init__(self, acc_shape: tuple[int, ...], acc_dtype: torch.dtype, inputs: list[InputSpec],
                 device: torch.device | str = "cpu"):
        self.registry = REGISTRY
        self.graph = Graph()
        self.device = torch.device(device)
        self.acc_dtype = acc_dtype
        self.batched = len(acc_shape) == 3
        names = ("L", "M", "N") if self.batched else ("M", "N")
        self.axis_sizes = dict(zip(names, acc_shape))
        self.axis_sizes.setdefault("L", 1)
        self._tile_dependent: set[int] = set()
        self._consts: dict[Any, Node] = {}
        #: id(pending value) -> (that value, the node it last became): a composite of keyword inputs names its
        #: operands by it; the value is held so that its id is not reused while tracing
        self._made: dict[int, tuple] = {}
        acc_node = self._add("acc", None, (), {}, names, acc_dtype, Stage.TILE, name="acc")
        self._tile_dependent.add(id(acc_node))
        self.acc = TracedTensor(self, acc_node, None, [D.Dim(s, (a,)) for a, s in zip(names, acc_shape)],
                                acc_dtype, label="acc")
        self.inputs = {spec.name: self._make_input(spec) for spec in inputs}

    # ------------------------------------------------------------------ setup
    def _make_input(self, spec: InputSpec) -> TracedTensor:
        if spec.kind == "number":
            # a Python float meets a float64 accumulator as a float64 (eager computes acc * 0.1 with the double
            # 0.1); float32 otherwise, as eager converts it to the float32 tensor's type
            dtype = torch.float64 if spec.dtype == torch.float32 and self.acc_dtype == torch.float64 else spec.dtype
            node = self._add("scalar", spec.name, (), {}, (), dtype, Stage.TILE, name=spec.name)
            return TracedTensor(self, node, None, (), dtype, label=spec.name)
        if len(spec.shape) == 0:
            node = self._add("input", spec.name, (), {"binding": ()}, (), spec.dtype, Stage.TILE, name=spec.name)
            return TracedTensor(self, node, None, (), spec.dtype, label=spec.name)
        dims = [D.Dim(s, (), frozenset({(spec.name, j)}) if s != 1 else frozenset())
                for j, s in enumerate(spec.shape)]
        return TracedTensor(self, None, _Pending("input", name=spec.name, dtype=spec.dtype), dims, spec.dtype,
                            label=spec.name)

    def _add(self, op, target, args, attrs, axes, dtype, stage, name=None) -> Node:
        return self.graph.add(op, target, args, attrs, axes, dtype, stage, name=name,
                              meta={"where": self.user_frame()})

    # ------------------------------------------------------------------ diagnostics
    @staticmethod
    def user_frame() -> str | None:
        """'file:line in fn: code' of the innermost frame outside evtorch and torch (the user's line)."""
        frame = inspect.currentframe()
        while frame is not None:
            fname = os.path.abspath(frame.f_code.co_filename)
            if not fname.startswith(_PKG_DIR) and not fname.startswith(_TORCH_DIR) and "<frozen" not in fname:
                # linecache directly: inspect.getframeinfo looks the module up through every loaded module,
                # milliseconds per call, and this runs for every traced node
                code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}: {code}"
            frame = frame.f_back
        return None

    def _err(self, cls, msg):
        return cls(msg, where=self.user_frame())

    # ------------------------------------------------------------------ torch entry points
    def call_torch(self, func, args, kwargs):
        name = getattr(func, "__name__", str(func))
        if "out" in kwargs and kwargs["out"] is not None:
            raise self._err(EpilogueError, f"{name}(..., out=...) writes in place; epilogue ops must be out-of-place "
                                           "(return the value instead)")
        if name.endswith("_") and not name.startswith("_"):  # torch.relu_, torch.nn.functional.relu_, ...
            raise self._err(EpilogueError, f"in-place op {_qualname(func)}() is not supported in an epilogue: every "
                                           f"value is computed once into registers; use the out-of-place "
                                           f"{name[:-1]}()")
        self._refuse_captured(name, args, kwargs)
        views = {torch.transpose: "transpose", torch.swapaxes: "transpose", torch.permute: "permute",
                 torch.unsqueeze: "unsqueeze", torch.squeeze: "squeeze", torch.reshape: "reshape",
                 torch.flatten: "flatten", torch.t: "t", torch.broadcast_to: "expand", torch.clone: "clone",
                 torch.Tensor.contiguous: "contiguous", torch.Tensor.clone: "clone"}
        if func in views:
            return self.view(args[0], views[func], args[1:], kwargs)
        if func in (torch.zeros_like, torch.ones_like, torch.full_like):
            return self.full_like(func, args, kwargs)
        if func in (torch.max, torch.min) and not (len(args) == 2 and isinstance(args[1], TracedTensor)):
            alt = "amax" if func is torch.max else "amin"
            raise self._err(UnsupportedOpError, f"torch.{name}(x[, dim]) is not supported (it also returns indices); "
                                                f"use x.{alt}(dim) for the values or torch.{name}imum(a, b)")
        op = self.registry.by_torch_fn.get(func)
        if op is None and getattr(func, "__name__", None) in self.registry.by_method and \
                getattr(func, "__qualname__", "").startswith(("Tensor.", "_TensorBase.", "TensorBase.")):
            op = self.registry.by_method[func.__name__]
            if args:  # an unbound Tensor method: its first argument is the tensor the method is called on
                args = op.method_args(args[0], args[1:])
        if op is None:
            raise self._err(UnsupportedOpError, f"{_qualname(func)} is not supported in an epilogue"
                                                f"{self.registry.suggest(name)}")
        return self.call_op(op, args, kwargs, spelled=_qualname(func))

    def _refuse_captured(self, name, args, kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                raise self._err(EpilogueTypeError,
                                f"{name}() got a real tensor of shape {tuple(a.shape)} captured from outside the "
                                "epilogue (a global, a closure variable or a parameter's default); pass every "
                                "tensor as a keyword input so evtorch can load it")

    def call_op(self, op: OpDef, args, kwargs, spelled=None) -> TracedTensor:
        spelled = spelled or op.name
        if kwargs.get("inplace"):
            raise self._err(EpilogueError, f"{spelled}(..., inplace=True) is not supported; use inplace=False")
        self._refuse_captured(spelled, args, kwargs)
        try:
            operands, attrs = op.bind(args, kwargs)
        except TypeError as e:
            raise self._err(EpilogueTypeError, f"{spelled}: bad arguments ({e}); expected {op.name}"
                                               f"{inspect.signature(op.signature)}") from None
        attrs.pop("inplace", None)  # refused above when true; not part of the op's meaning
        if not op.has(REDUCTION):  # attributes at their default are left out: the IR prints and hashes cleaner
            defaults = {k: p.default for k, p in inspect.signature(op.signature).parameters.items()}
            attrs = {k: v for k, v in attrs.items() if not (k in defaults and _same(defaults[k], v))}
        if op.has(REDUCTION):
            return self.reduce(op, operands[0], **attrs)
        for i, v in enumerate(operands):
            if not (isinstance(v, (TracedTensor, int, float, bool)) or v is None):
                raise self._err(EpilogueTypeError, f"{spelled}: operand {op.operands[i]!r} is a "
                                                   f"{type(v).__name__}; expected a tensor or a number")
        if op.decompose is not None:
            return self._decompose(op, operands, attrs)
        if op.name == "pow":
            if isinstance(attrs["exponent"], TracedTensor) or not isinstance(attrs["exponent"], (int, float)):
                raise self._err(UnsupportedOpError, f"{spelled}: the exponent must be a constant number, got "
                                                    f"{type(attrs['exponent']).__name__}; for a tensor exponent "
                                                    "write torch.exp(y * torch.log(x))")
            rounded = _eager_exponent(operands[0], attrs["exponent"])
            if rounded != attrs["exponent"]:  # eager's backward multiplies by the exponent as given
                attrs = dict(attrs, exponent=rounded, unrounded=attrs["exponent"])
        if op.name == "add" and all(isinstance(v, bool) or (isinstance(v, TracedTensor) and v.dtype == torch.bool)
                                    for v in operands) and attrs.get("alpha", 1) in (1, True):
            # torch's bool + bool is a logical or (True + True is True); a kernel's 1-bit add would wrap to False
            op, attrs = REGISTRY.ops["logical_or"], {}
        return self.apply(op, operands, attrs, spelled)

    def _decompose(self, op: OpDef, operands, attrs) -> TracedTensor:
        """A composite op traced as its decomposition. Eager evaluates a composite on float16/bfloat16 in float32
        and rounds once (``F.gelu(x16)``), so here too: upcast, decompose, round back; step-by-step rounding
        would be off by several ulps."""
        low = [v for v in operands if isinstance(v, TracedTensor) and v.dtype in HALF_DTYPES]
        if not low:
            return self._mark_composite(op, operands, attrs, op.decompose(*operands, **attrs))
        tensors = [v for v in operands if isinstance(v, TracedTensor)]
        self._check_dtypes(op, operands, op.name)
        out_dtype = tensors[0].dtype
        for v in tensors[1:]:
            out_dtype = torch.promote_types(out_dtype, v.dtype)
        up = [self.cast(v, torch.float32) if isinstance(v, TracedTensor) and v.dtype in (torch.float16,
              torch.bfloat16) else v for v in operands]
        out = self._mark_composite(op, operands, attrs, op.decompose(*up, **attrs))
        return self.cast(out, out_dtype) if out.dtype != out_dtype else out

    def _mark_composite(self, op: OpDef, operands, attrs, out: TracedTensor) -> TracedTensor:
        """Record on a composite's output node that it is ``op(operands)``, for an op with a derivative rule of its
        own (autodiff/reverse.py, "composites"). Operands are named, not referenced: passes copy graphs and replace
        nodes, and a name still denotes the value it was given, on its node or, once a pass replaced that node,
        among its replacement's aliases (``Graph.replace_uses``). The 16-bit operands, not their float32 casts, are
        named: the rule upcasts them as the decomposition did. A composite of keyword inputs alone is marked on its
        pending value with the operands themselves, and named when it becomes a node."""
        if op.derivative is None or not isinstance(out, TracedTensor):
            return out
        attrs = tuple(sorted(attrs.items()))
        if out.node is None:  # keyword inputs alone: named when materialized (_materialize_pending)
            if out.pending is not None and out.pending.kind == "op" and not any(
                    isinstance(v, TracedTensor) and v.pending is out.pending for v in operands):
                out.pending.meta["composite"] = (op.name, tuple(("node", v) if isinstance(v, TracedTensor)
                                                                else ("const", v) for v in operands), attrs)
            return out
        names = []
        for v in operands:
            if isinstance(v, TracedTensor):
                name = self._made_name(v)
                if name is None or v.node is out.node:
                    return out
                names.append(("node", name))
            else:
                names.append(("const", v))
        out.node.meta["composite"] = (op.name, tuple(names), attrs)
        return out

    # ------------------------------------------------------------------ elementwise
    def apply(self, op: OpDef, operands: list, attrs: dict, spelled: str) -> TracedTensor:
        proxies = [v for v in operands if isinstance(v, TracedTensor)]
        if not proxies:
            raise self._err(EpilogueTypeError, f"{spelled} got no traced tensor")
        self._check_dtypes(op, operands, spelled)
        meta = self._meta_eval(op, operands, attrs, spelled)
        out_dtype = meta.dtype if isinstance(meta, torch.Tensor) else _py_dtype(meta)
        if out_dtype in _NARROW_INTS:
            info = torch.iinfo(out_dtype)
            for v in operands:
                if isinstance(v, int) and not isinstance(v, bool) and not info.min <= v <= info.max:
                    # eager wraps such a constant modulo 2**bits (a comparison refuses it); a kernel's typed
                    # constant cannot hold it (Triton: "out of range" inside its compiler)
                    raise self._err(EpilogueTypeError, f"{spelled}: the constant {v} does not fit {out_dtype}, the "
                                                       f"dtype it meets ({info.min} to {info.max}; eager would wrap "
                                                       "it); widen the tensor first, e.g. .long()")
        out_shape = tuple(meta.shape) if isinstance(meta, torch.Tensor) else ()
        rank = len(out_shape)
        aligned = [(p, (None,) * (rank - p.ndim) + p.dims) for p in proxies]

        # which axes each output position walks, from the operands that are already bound
        pos_axes: list[tuple | None] = [None] * rank
        for p, dims in aligned:
            for i, d in enumerate(dims):
                if d is not None and d.axes:
                    if pos_axes[i] is not None and pos_axes[i] != d.axes:
                        raise self._err(ShapeError, f"{spelled}: combines values whose dim {i - rank} walks "
                                                    f"different axes ({'*'.join(pos_axes[i])} vs {'*'.join(d.axes)}), "
                                                    "e.g. acc with its own transpose; one fused epilogue visits "
                                                    "each (m, n) once, so this cannot be expressed")
                    pos_axes[i] = d.axes
        if any(p.node is not None and p.node.axes for p in proxies):
            # an input dim meeting only size-1 dims of bound values (a reduction result (L, 1) plus a row (N,))
            # walks the axis its input walks against acc, as eager broadcasting would put it
            for i in range(rank):
                if pos_axes[i] is not None:
                    continue
                keys = {k for _, dims in aligned if dims[i] is not None for k in dims[i].inputs}
                own = {self._own_axes(k) for k in keys}
                if len(own) == 1 and None not in own and not any(
                        set(own_axes) & set(a or ()) for own_axes in own for a in pos_axes):
                    pos_axes[i] = own.pop()
        binding: dict = {}
        can_bind = True
        for p, dims in aligned:
            for i, d in enumerate(dims):
                if d is None or not d.inputs:
                    continue
                if pos_axes[i] is None:
                    can_bind = False
                    continue
                for key in d.inputs:
                    if binding.get(key, pos_axes[i]) != pos_axes[i]:
                        raise self._err(ShapeError, f"{spelled}: input {D.key_input(key)!r} ({D.key_text(key)}) "
                                                    f"would walk both {'*'.join(binding[key])} and "
                                                    f"{'*'.join(pos_axes[i])}")
                    binding[key] = pos_axes[i]
        any_axes = any(a is not None for a in pos_axes) or any(p.node is not None and p.node.axes for p in proxies)
        if not can_bind:
            if any_axes:
                bad = next(p for p, dims in aligned if any(d is not None and d.inputs and pos_axes[i] is None
                                                         for i, d in enumerate(dims)))
                raise self._err(ShapeError, self._unbindable_msg(spelled, bad, proxies, out_shape))
            dims = []
            for i in range(rank):
                ins = frozenset().union(*[d.inputs for _, ds in aligned if ds[i] is not None for d in [ds[i]]])
                dims.append(D.Dim(out_shape[i], (), ins))
            pend = _Pending("op", op=op, operands=tuple(operands), attrs=attrs, dtype=out_dtype)
            return TracedTensor(self, None, pend, dims, out_dtype, order=_result_order(aligned, out_shape, None))

        nodes = [self.materialize(v, binding) if isinstance(v, TracedTensor) else self.const(v, op)
                 for v in operands]
        node = self._compute(op, nodes, attrs, out_dtype, spelled)
        dims = [D.Dim(out_shape[i], pos_axes[i] or ()) for i in range(rank)]
        return TracedTensor(self, node, None, dims, out_dtype, order=_result_order(aligned, out_shape, dims))

    def _unbindable_msg(self, spelled, bad, proxies, out_shape):
        vec = [p for p in proxies if p.node is not None and p.node.stage == Stage.VECTOR]
        if vec:
            return (f"{spelled}: a reduction result {D.describe(vec[0].dims)} is combined with input "
                    f"{bad.label or 'value'} {tuple(bad.shape)} into a full-size value; using a reduction result "
                    "inside a tile computation is not supported (it would need a second pass over the tile)")
        acc_shape = tuple(self.acc.shape)
        return (f"{spelled}: input {bad.label or 'value'} of shape {tuple(bad.shape)} does not broadcast against "
                f"acc of shape {acc_shape} (the result would have shape {out_shape}, larger than acc); expected "
                "(M, N), (N,), (1, N), (M, 1), a scalar, or batched (L, M, N), (L, 1, N), (L, M, 1), (L, 1, 1)")

    def _check_dtypes(self, op: OpDef, operands, spelled):
        for name, v in zip(op.operands, operands):
            if not isinstance(v, TracedTensor):
                continue
            if op.has(FLOAT_ONLY) and not is_float(v.dtype):
                raise self._err(EpilogueTypeError, f"{spelled} needs a floating-point input, but {name!r} "
                                                   f"({v.label or 'value'}) has dtype {v.dtype}; cast it first "
                                                   "with .float()")
            if op.has(BOOL_ONLY) and v.dtype != torch.bool:
                raise self._err(EpilogueTypeError, f"{spelled} is defined on booleans here, but {name!r} has dtype "
                                                   f"{v.dtype}; compare first (e.g. x > 0)")

    def _meta_eval(self, op: OpDef, operands, attrs, spelled):
        args = [self._meta(v) for v in operands]
        try:
            return op.torch_ref(*args, **attrs)
        except (RuntimeError, TypeError, ValueError) as e:
            shapes = ", ".join(f"{v.label or 'value'}{tuple(v.shape)}" for v in operands if isinstance(v, TracedTensor))
            msg = str(e).split("\n")[0]
            cls = ShapeError if "size" in msg or "shape" in msg or "broadcast" in msg else EpilogueTypeError
            raise self._err(cls, f"{spelled} on {shapes}: {msg}") from None

    def _meta(self, v):
        if isinstance(v, TracedTensor):
            if v.node is not None and v.node.op == "scalar":
                return 1.0 if v.dtype.is_floating_point else (True if v.dtype == torch.bool else 1)
            return torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
        return v

    def const(self, value, op: OpDef | None = None, dtype: torch.dtype | None = None) -> Node:
        """The constant ``value`` as a node: a Python number's dtype, or ``dtype`` (a value it holds exactly)."""
        # None is clamp's missing bound; _compute turns it into -inf / +inf by position
        tensor = dtype is not None  # a value standing for a tensor (full_like), not a Python number (simplify)
        dtype = dtype or (torch.float32 if value is None else _py_dtype(value))
        key = (type(value).__name__, repr(value), dtype, tensor)
        if key not in self._consts:
            self._consts[key] = self._add("const", value, (), {}, (), dtype, Stage.TILE, name="c")
            if tensor:
                self._consts[key].meta["tensor"] = True
        return self._consts[key]

    def _compute(self, op: OpDef, nodes: list[Node], attrs: dict, dtype, spelled) -> Node:
        if op.name == "clamp":  # None bounds are open: -inf below, +inf above
            nodes = list(nodes)
            for i, fill in ((1, -math.inf), (2, math.inf)):
                if nodes[i].op == "const" and nodes[i].target is None:
                    nodes[i] = self.const(fill)
        stage = Stage.VECTOR if any(n.stage == Stage.VECTOR for n in nodes) else Stage.TILE
        tile_dep = any(id(n) in self._tile_dependent for n in nodes)
        if stage == Stage.VECTOR and tile_dep:
            raise self._err(EpilogueError, f"{spelled}: a reduction result is used inside a full-tile computation "
                                           "(together with acc or values computed from it); this needs the finished "
                                           "reduction while the tile is still being computed, which is not "
                                           "supported yet. Compute it from the reduction results and inputs only")
        axes = canonical(set().union(*[n.axes for n in nodes]))
        if stage == Stage.VECTOR and "M" in axes and "N" in axes:
            raise self._err(EpilogueError, f"{spelled}: combining reduction results produces a full (M, N) value; "
                                           "a reduction result cannot be used in a full-tile computation")
        node = self._add("compute", op.name, nodes, attrs, axes, dtype, stage)
        if tile_dep:
            self._tile_dependent.add(id(node))
        return node

    # ------------------------------------------------------------------ binding pending input expressions
    def materialize(self, v: TracedTensor, binding: dict) -> Node:
        if v.node is not None:
            return v.node
        return self._materialize_pending(v.pending, binding)

    def _materialize_pending(self, p: _Pending, binding: dict) -> Node:
        if p.kind == "input":
            spec_shape = tuple(self.inputs[p.name].shape)
            # each dim walks the axes its parts are bound to, outer part first (a dim not split: one part)
            parts: dict[int, list] = {}
            merged = set()  # dims read as one flat dim with the next (D.MERGED): a reshape merged them
            shapes = {name: tuple(v.shape) for name, v in self.inputs.items()}
            for key, axes in D.expand_binding(binding, self.axis_sizes, f"input {p.name!r}", shapes).items():
                if key[0] == p.name:
                    j = key[1]
                    if axes == D.MERGED:
                        merged.add(j)
                        continue
                    inner, size = (1, spec_shape[j]) if len(key) == 2 else key[2:]
                    parts.setdefault(j, []).append((inner, size, axes))
            per_dim = []
            for j, s in enumerate(spec_shape):
                if j in merged:
                    per_dim.append(D.MERGED)
                    continue
                ps = sorted(set(parts.get(j, [])), key=lambda t: -t[0])
                covered = all(a[0] == b[0] * b[1] for a, b in zip(ps, ps[1:])) and \
                    math.prod(t[1] for t in ps) == s and (not ps or ps[-1][0] == 1)
                axes = tuple(a for t in ps for a in t[2])
                if s != 1 and (not axes or not covered):
                    raise self._err(ShapeError, f"input {p.name!r} dim {j} (size {s}) does not line up with any "
                                                f"axis of acc {tuple(self.acc.shape)}")
                per_dim.append(axes)
            axes = canonical(set().union(*[set(a) for a in per_dim if a != D.MERGED]) if per_dim else ())
            node = self._add("input", p.name, (), {"binding": tuple(per_dim)}, axes, p.dtype, Stage.TILE,
                             name=p.name)
            self._made[id(p)] = (p, node)
            return node
        nodes = []
        for v in p.operands:
            if isinstance(v, TracedTensor):
                nodes.append(self.materialize(v, binding))
            else:
                nodes.append(self.const(v))
        node = self._compute(p.op, nodes, p.attrs, p.dtype, p.op.name)
        node.meta.update({k: v for k, v in p.meta.items() if k != "composite"})
        if "composite" in p.meta:
            # a composite of keyword inputs alone, marked when it was traced: its operands were materialized
            # just now, in this node's subtree (depth first), so their latest nodes are this binding's
            name, operands, attrs = p.meta["composite"]
            named = [(kind, self._made_name(v)) if kind == "node" else (kind, v) for kind, v in operands]
            if all(v is not None for kind, v in named if kind == "node"):
                node.meta["composite"] = (name, tuple(named), attrs)
        self._made[id(p)] = (p, node)
        return node

    def _made_name(self, v: TracedTensor) -> str | None:
        """The name of the node ``v`` is, or last became (None: not materialized yet)."""
        if v.node is not None:
            return v.node.name
        p, node = self._made.get(id(v.pending), (None, None))
        return node.name if p is v.pending else None

    def bind_to_acc(self, v: TracedTensor, why: str) -> TracedTensor:
        """Bind a pending value by right-aligning it against acc, as eager broadcasting with acc would.

        A dim that does not line up that way (the value was transposed or unsqueezed after it was computed
        from inputs alone) falls back to its inputs' own roles: each input right-aligned against acc."""
        if v.node is not None:
            return v
        acc_dims = self.acc.dims
        binding, dims = {}, []
        for i, d in enumerate(v.dims):
            pos = len(acc_dims) - v.ndim + i
            a = acc_dims[pos] if pos >= 0 else None
            if d.inputs:
                if a is not None and d.size == a.size:
                    axes = a.axes
                else:
                    own = {self._own_axes(key) for key in d.inputs}
                    if len(own) != 1 or None in own:
                        raise self._err(ShapeError, f"{why}: input {v.label or 'value'} of shape {tuple(v.shape)} "
                                                    f"does not broadcast against acc of shape "
                                                    f"{tuple(self.acc.shape)}")
                    axes = own.pop()
                for key in d.inputs:
                    binding[key] = axes
                dims.append(D.Dim(d.size, axes))
            else:
                dims.append(D.Dim(d.size))
        node = self.materialize(v, binding)
        order = D.memory_order(dims) if v.order == D.CONTIGUOUS_DIMS else v.order
        return TracedTensor(self, node, None, dims, v.dtype, label=v.label, order=order)

    def _own_axes(self, key):
        """The axes input dim ``key`` walks when its input is right-aligned against acc (None if it does not fit)."""
        if len(key) != 2:  # parts and merges of input dims: only where they meet acc's dims
            return None
        name, j = key
        shape = tuple(self.inputs[name].shape)
        pos = len(self.acc.dims) - len(shape) + j
        if 0 <= pos < len(self.acc.dims) and self.acc.dims[pos].size == shape[j]:
            return self.acc.dims[pos].axes
        return None

    # ------------------------------------------------------------------ casts, constants, indices
    def cast(self, v: TracedTensor, dtype: torch.dtype) -> TracedTensor:
        if dtype not in SUPPORTED_DTYPES:
            raise self._err(EpilogueTypeError, f"cast to {dtype} is not supported; expected one of "
                                               f"{', '.join(dtype_name(d) for d in SUPPORTED_DTYPES)}")
        if dtype == v.dtype:
            return v
        return self.apply(self.registry["cast"], [v], {"dtype": dtype}, f".to({dtype})")

    def fill_constant(self, func, args, kwargs, error=EpilogueTypeError):
        """(constant node, dtype) of ``zeros_like``/``ones_like``/``full_like`` (``error``: the caller's class)."""
        x = args[0]
        value = {torch.zeros_like: 0.0, torch.ones_like: 1.0}.get(func)
        if value is None:
            value = args[1] if len(args) > 1 else kwargs.get("fill_value")
        if isinstance(value, TracedTensor):
            raise self._err(error, "full_like(x, v): v must be a number")
        dtype = kwargs.get("dtype") or x.dtype
        if dtype.is_floating_point:
            # rounded to the tensor's dtype once, as eager fills it: a float32 constant cast to float64 made
            # full_like(acc64, 0.1) 0.10000000149 (found 2026-11-29)
            value = float(torch.tensor(float(value), dtype=torch.float64).to(dtype))
            return self.const(value, dtype=dtype), dtype
        return self.const(value), dtype

    def full_like(self, func, args, kwargs):
        x = args[0]
        node, dtype = self.fill_constant(func, args, kwargs)
        if node.dtype != dtype:
            node = self._compute(self.registry["cast"], [node], {"dtype": dtype}, dtype, "full_like")
        x = self.bind_to_acc(x, func.__name__) if x.node is None else x
        return TracedTensor(self, node, None, x.dims, dtype, order=x.order)

    def index(self, v: TracedTensor, dim: int, what: str) -> TracedTensor:
        if not isinstance(v, TracedTensor):
            raise EpilogueTypeError(f"{what} takes the traced accumulator (or a value computed from it), got "
                                    f"{type(v).__name__}")
        v = self.bind_to_acc(v, what)
        d = v.dims[D.norm_dim(dim, v.ndim, what)]
        if len(d.axes) != 1:
            raise self._err(ShapeError, f"{what}: dim {dim} of {D.describe(v.dims)} is not a single axis")
        axis = d.axes[0]
        node = self._add("index", axis, (), {}, (axis,), torch.int64, Stage.TILE, name=f"idx_{axis}")
        self._tile_dependent.add(id(node))
        return TracedTensor(self, node, None, v.dims, torch.int64)

    # ------------------------------------------------------------------ views
    def view(self, v: TracedTensor, method: str, args=(), kwargs=None) -> TracedTensor:
        kwargs = kwargs or {}
        what = f".{method}()"
        dims, rank = v.dims, v.ndim
        if method in ("contiguous", "clone"):
            return self.contiguous(v, method, args, kwargs)
        if method in ("transpose", "swapaxes", "swapdims"):
            new = D.permute(dims, D.transpose_order(args, kwargs, rank, what))
        elif method == "t":
            new = D.permute(dims, list(reversed(range(rank))))
        elif method == "permute":
            order = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
            order = [D.norm_dim(d, rank, what) for d in (order or kwargs.get("dims"))]
            if sorted(order) != list(range(rank)):
                raise self._err(ShapeError, f".permute{tuple(order)} is not a permutation of {rank} dims")
            new = D.permute(dims, order)
        elif method == "unsqueeze":
            d = args[0] if args else kwargs["dim"]
            d = D.norm_dim(d, rank + 1, what)
            new = dims[:d] + (D.ONE,) + dims[d:]
        elif method == "squeeze":
            sel = args[0] if args else kwargs.get("dim")
            if sel is None:
                sel = [i for i, x in enumerate(dims) if x.size == 1]
            sel = {D.norm_dim(d, rank, what) for d in (sel if isinstance(sel, (tuple, list)) else [sel])}
            new = tuple(x for i, x in enumerate(dims) if not (i in sel and x.size == 1))
            if any(x.axes for i, x in enumerate(dims) if i in sel and x.size == 1):
                # a size-1 dim that walks an axis of acc (M = 1, N = 1): dropped as a reshape drops it, the axis
                # kept on a neighbouring dim (the bare drop lost it: the triton store met a [1, BN] address for a
                # [BM, BN] value, and the output was not seen as full-size; found by a probe 2026-11-29)
                try:
                    new = D.reshape(dims, tuple(x.size for x in new), self.axis_sizes, f"{what} on {D.describe(dims)}")
                except ShapeError as e:
                    raise self._err(ShapeError, str(e)) from None
        elif method in ("reshape", "view", "flatten", "view_as", "reshape_as"):
            if method == "flatten":
                start = D.norm_dim(args[0] if args else kwargs.get("start_dim", 0), rank, what)
                end = D.norm_dim(args[1] if len(args) > 1 else kwargs.get("end_dim", -1), rank, what)
                shape = [x.size for x in dims[:start]] + [math.prod(x.size for x in dims[start:end + 1])] + \
                        [x.size for x in dims[end + 1:]]
            elif method in ("view_as", "reshape_as"):
                shape = list(args[0].shape)
            else:
                shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
                if len(args) == 1 and isinstance(args[0], torch.dtype):
                    raise self._err(UnsupportedOpError, ".view(dtype) reinterprets bits and is not supported; use .to()")
            shape = tuple(int(s) for s in shape)
            if shape.count(-1) == 1:  # resolve -1 first: v.view(-1, 1) only adds a size-1 dim
                known = math.prod(s for s in shape if s != -1)
                total = math.prod(x.size for x in dims)
                shape = tuple((total // known if known else 0) if s == -1 else s for s in shape)
            try:
                new = D.reshape(dims, shape, self.axis_sizes, f"{what} on {D.describe(dims)}")
            except ShapeError as e:
                raise self._err(ShapeError, str(e)) from None
        elif method in ("expand", "broadcast_to", "expand_as"):
            if method == "expand_as":
                sizes = tuple(args[0].shape)
            else:
                sizes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            sizes = tuple(int(s) for s in sizes)
            if len(sizes) < rank:
                raise self._err(ShapeError, f"{what}: {sizes} has fewer dims than {tuple(v.shape)}")
            lead = len(sizes) - rank
            new = tuple(D.Dim(s) for s in sizes[:lead])
            for x, s in zip(dims, sizes[lead:]):
                if s == -1 or s == x.size:
                    new += (x,)
                elif x.size == 1:
                    new += (D.Dim(s),)
                else:
                    raise self._err(ShapeError, f"{what}: cannot expand dim of size {x.size} to {s}")
        else:
            raise self._err(UnsupportedOpError, f"view method .{method}() is not supported")
        if not new and any(x.axes for x in dims):
            # the one element of a 1 x 1 acc as a 0-d view: the tile store has no 0-d form (the triton backend
            # failed inside Triton, "Value argument cannot be block type", found by a probe 2026-11-29)
            raise self._err(UnsupportedOpError, f"{what} makes a 0-d view of {D.describe(dims)}, whose dims all have "
                                                "size 1; keep a dim (.reshape(1)) or reduce it (.sum())")
        return TracedTensor(self, v.node, v.pending, new, v.dtype, label=v.label, order=_view_order(v))

    def contiguous(self, v: TracedTensor, method: str, args, kwargs) -> TracedTensor:
        """``x.contiguous()`` / ``x.clone(memory_format=torch.contiguous_format)``: the value laid out row-major in
        its own dims (``order``), which an output keeps (``acc.T.contiguous()`` came back as a transposed view, found
        by a probe); ``clone()`` keeps the layout, as eager's does. Other memory formats are refused by name."""
        unknown = sorted(set(kwargs) - {"memory_format"})
        if args or unknown:  # as eager's: memory_format is keyword-only
            raise self._err(EpilogueTypeError, f".{method}() takes only the keyword memory_format=, got "
                                               f"{len(args)} positional argument(s) and keywords {unknown}")
        fmt = kwargs.get("memory_format", torch.contiguous_format if method == "contiguous" else torch.preserve_format)
        if fmt == torch.preserve_format:
            if method == "contiguous":  # as eager: "preserve memory format is unsupported by the contiguous operator"
                raise self._err(EpilogueTypeError, ".contiguous(memory_format=torch.preserve_format) is not "
                                                   "supported (nor in eager PyTorch); use torch.contiguous_format")
            return v
        if fmt != torch.contiguous_format:
            raise self._err(UnsupportedOpError, f".{method}(memory_format={fmt}) is not supported; expected "
                                                "torch.contiguous_format" + (" or torch.preserve_format"
                                                                            if method == "clone" else ""))
        if any(d.expanded for d in v.dims):
            raise self._err(UnsupportedOpError, f".{method}() of {D.describe(v.dims)}, an expanded value (a dim of "
                                                "stride 0), would store each element several times; make it "
                                                "contiguous before the expand (expand is a view)")
        order = D.CONTIGUOUS_DIMS if v.node is None else D.memory_order(v.dims)
        return TracedTensor(self, v.node, v.pending, v.dims, v.dtype, label=v.label, order=order)

    def getitem(self, v: TracedTensor, index) -> TracedTensor:
        index = index if isinstance(index, tuple) else (index,)
        for i in index:
            if not (i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None))):
                raise self._err(UnsupportedOpError,
                                f"indexing with {i!r} is not supported in an epilogue (only None, : and ... which are "
                                "views); to gather or mask, use evt.row_index/evt.col_index with torch.where")
        n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
        if index.count(Ellipsis) > 1:
            raise self._err(ShapeError, "an index can only have one ellipsis")
        if Ellipsis in index:
            e = index.index(Ellipsis)
            index = index[:e] + (slice(None),) * (v.ndim - n_real) + index[e + 1:]
        elif n_real < v.ndim:
            index = index + (slice(None),) * (v.ndim - n_real)
        if sum(1 for i in index if i is not None) > v.ndim:
            raise self._err(ShapeError, f"too many indices for a value of rank {v.ndim}")
        new, k = [], 0
        for i in index:
            if i is None:
                new.append(D.ONE)
            else:
                new.append(v.dims[k])
                k += 1
        return TracedTensor(self, v.node, v.pending, new, v.dtype, label=v.label, order=_view_order(v))

    # ------------------------------------------------------------------ reductions
    def reduce(self, op: OpDef, x, dim=None, keepdim=False, dtype=None) -> TracedTensor:
        what = f"{op.name}()"
        if not isinstance(x, TracedTensor):
            raise self._err(EpilogueTypeError, f"{what} needs a traced tensor, got {type(x).__name__}")
        red_dtype = torch.float64 if self.acc_dtype == torch.float64 else torch.float32
        if dtype is not None and dtype != red_dtype:
            # reductions run and return in the accumulator's dtype; another dtype= was accepted and ignored (a
            # float16 sum came back float32, found by a probe 2026-11-29)
            raise self._err(EpilogueTypeError, f"{what}: dtype={dtype} is not supported; reductions here run and "
                                                f"return {red_dtype} (cast the result: .to({dtype}))")
        if op.name == "mean" and dtype is None and not x.dtype.is_floating_point:
            # eager refuses these of integers ("could not infer output dtype"); a traced epilogue must not run
            # where its eager self does not (found 2026-11-29)
            raise self._err(EpilogueTypeError, f"{what} of a {x.dtype} value: torch takes the {op.name} of floating "
                                               f"values only; cast first, e.g. x.float().{op.name}(...)")
        x = self.bind_to_acc(x, what)
        rank = x.ndim
        if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
            sel = set(range(rank))
        else:
            if isinstance(dim, TracedTensor) or not isinstance(dim, (int, tuple, list)):
                raise self._err(EpilogueTypeError, f"{what}: dim must be an int or a tuple of ints, got {dim!r}")
            listed = [D.norm_dim(d, rank, f"{what} over dim {d} of {D.describe(x.dims)}")
                      for d in (dim if isinstance(dim, (tuple, list)) else [dim])]
            sel = set(listed)
            if len(sel) < len(listed):  # as eager: "dim 0 appears multiple times in the list of dims"
                raise self._err(ShapeError, f"{what}: dim {dim!r} names a dim more than once")
        over = set()
        for i in sel:
            if x.dims[i].expanded:
                raise self._err(ShapeError, f"{what}: reducing over an expanded dim is not supported")
            over |= set(x.dims[i].axes)
        out_dims = tuple(D.ONE if i in sel else d for i, d in enumerate(x.dims) if keepdim or i not in sel)
        node = x.node
        if node.dtype != red_dtype:
            node = self._compute(self.registry["cast"], [node], {"dtype": red_dtype}, red_dtype, what)
        if not over:  # only size-1 dims: one element each, the value itself, except that eager's sum (and
            # mean, logsumexp) of a single -0.0 is +0.0: x + 0.0 is exactly that
            if op.name in ("sum", "mean", "logsumexp"):
                node = self._compute(self.registry["add"], [node, self.const(0.0)], {}, red_dtype, what)
            return TracedTensor(self, node, None, out_dims, red_dtype)
        all_axes = set().union(*[set(d.axes) for d in x.dims]) | set(node.axes)
        remaining = canonical(all_axes - over)
        r = self._add("reduce", op.name, (node,), {"over": canonical(over)}, remaining, red_dtype, Stage.VECTOR)
        return TracedTensor(self, r, None, out_dims, red_dtype)

    # ------------------------------------------------------------------ outputs
    def finish(self, result) -> list[TracedTensor]:
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        if not outs:
            raise self._err(EpilogueTypeError, "the epilogue returned nothing; return a tensor or a tuple of tensors")
        bound = []
        for i, v in enumerate(outs):
            if not isinstance(v, TracedTensor):
                raise EpilogueTypeError(f"the epilogue returned a {type(v).__name__} at position {i}; expected traced "
                                        "tensors computed from acc and the inputs (a tensor or a tuple of tensors)")
            v = self.bind_to_acc(v, f"output {i}")
            kind = "vector" if v.node.stage == Stage.VECTOR else "tile"
            out_dims = tuple((d.axes, d.size if d.expanded else None) for d in v.dims)
            attrs = {"dims": out_dims, "kind": kind}
            order = _output_order(v)
            if order is not None:  # only where .contiguous() laid the value out otherwise than acc is
                attrs["order"] = order
            self.graph.add("output", i, (v.node,), attrs, v.node.axes, v.dtype, v.node.stage, name=f"out{i}",
                           meta={"where": None})
            bound.append(v)
        return bound


def _view_order(v: TracedTensor):
    """The memory order of a view of ``v``: its axes' (a view moves no data); a pending value's row-major layout in
    its dims is not that of the view's dims, so it is dropped (the view is laid out as its input is)."""
    return None if v.order == D.CONTIGUOUS_DIMS else v.order


def _result_order(aligned, out_shape, dims):
    """The memory order of an elementwise result, as eager's TensorIterator picks it: the layout of the first
    operand that is not broadcast along any dim of the result (``aligned``: (operand, its dims right-aligned));
    None (acc's layout) where that operand has none or there is no such operand. ``dims``: the result's bound
    dims (None while pending)."""
    for p, pdims in aligned:
        if all(d is not None and d.size == s for d, s in zip(pdims, out_shape)):
            if p.order == D.CONTIGUOUS_DIMS:
                return D.memory_order(dims) if dims is not None else D.CONTIGUOUS_DIMS
            return p.order
    return None


def _output_order(v: TracedTensor):
    """The order an output's base is stored in: ``v.order`` over the axes the output walks, or None where that is
    acc's (L, M, N) order anyway."""
    if not isinstance(v.order, tuple):
        return None
    walked = [a for d in v.dims for a in d.axes]
    order = tuple(a for a in v.order if a in walked)
    if sorted(order) != sorted(walked) or order == canonical(walked):
        return None
    return order


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                            and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _py_dtype(value) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.float32


def _qualname(func) -> str:
    mod = getattr(func, "__module__", None) or ""
    name = getattr(func, "__name__", str(func))
    if name.startswith("special_") and (mod.startswith("torch") or mod == ""):  # torch.special.expit
        return f"torch.special.{name[len('special_'):]}"
    if mod.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    if mod.startswith("torch") or mod == "":
        return f"torch.{name}"
    return f"{mod}.{name}"
