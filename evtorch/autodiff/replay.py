"""Replaying an epilogue graph on canonical values: real tensors or traced proxies alike.

``Values(graph, leaf, space)`` computes the value of any node of a graph on demand (memoized), from the values
``leaf(node)`` gives for its leaves (acc, inputs, scalars; saved values may stand in for any node). Every value
is canonical (``autodiff.canonical``). The same code runs

- on real tensors: the reference meaning of the graph, exactly as ``ir.Interpreter`` computes it, and
- on ``TracedTensor`` proxies inside an epilogue being traced: the replayed ops are recorded again, which is how
  a backward or forward-with-saves epilogue is built from an existing graph (the derivative rules are plain
  torch too, so they are traced along).

Only nodes something asks for are computed, so a replay never builds what nobody uses.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import EpilogueError
from ..frontend import dims as D
from ..frontend.proxy import TracedTensor
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import HALF_DTYPES
from ..ops import REGISTRY
from ..ops.registry import OpDef
from .canonical import canonical_shape


def is_proxy(v) -> bool:
    return isinstance(v, TracedTensor)


def apply_op(op: OpDef, operands, attrs: dict):
    """``op`` on ``operands``: recorded if any operand is traced, else evaluated with its torch reference."""
    proxy = next((v for v in operands if is_proxy(v)), None)
    if proxy is not None:
        return proxy.tracer.call_op(op, tuple(operands), dict(attrs), spelled=op.name)
    return op.torch_ref(*operands, **attrs)


def _number_dtype(v, float_dtype):
    return torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else float_dtype


class Space:
    """The iteration space values are canonical in: axis order, sizes, and the accumulator (real or traced)."""

    def __init__(self, order: tuple[str, ...], sizes: dict, acc):
        self.order = tuple(order)
        self.sizes = {"L": 1, **sizes}
        self.acc = acc

    @property
    def rank(self) -> int:
        return len(self.order)

    def bind(self, v):
        """An input arriving in canonical form, bound to the axes its dims line up with."""
        if is_proxy(v) and v.node is None:
            return v.tracer.bind_to_acc(v, "canonical input")
        return v

    def walk(self, v, axes):
        """``v`` seen as walking exactly ``axes`` (it may vary along fewer: it is broadcast).

        On a proxy this is a view (only its dims change, as ``expand`` of a broadcast dim does in the tracer,
        but walking the axes); on a real tensor an ``expand``."""
        shape = canonical_shape(axes, self.order, self.sizes)
        if not is_proxy(v) and not isinstance(v, torch.Tensor) and is_proxy(self.acc):  # a number
            v = torch.full_like(self.acc, v, dtype=_number_dtype(v, self.acc.dtype))
        if is_proxy(v):
            v = self.bind(v)
            missing = set(v.node.axes) - set(axes)
            if missing:
                raise EpilogueError(f"internal: cannot walk {tuple(axes)} with a value varying along "
                                    f"{v.node.axes}")
            dims = [D.Dim(self.sizes[a], (a,)) if a in axes else D.ONE for a in self.order]
            return TracedTensor(v.tracer, v.node, None, dims, v.dtype, label=v.label)
        if not isinstance(v, torch.Tensor):
            return torch.full(shape, v, dtype=_number_dtype(v, self.acc.dtype), device=self.acc.device)
        if v.dim() < self.rank:
            v = v.reshape([1] * (self.rank - v.dim()) + list(v.shape))
        return v.expand(shape)

    def walked(self, v) -> tuple[str, ...]:
        """The axes a canonical value walks (for a proxy: its dims; for a tensor: its non-1 dims)."""
        if is_proxy(v):
            return tuple(a for d in v.dims for a in d.axes)
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            return ()
        shape = [1] * (self.rank - v.dim()) + list(v.shape)
        return tuple(a for a, s in zip(self.order, shape) if s != 1 or self.sizes[a] == 1)

    def dims_of(self, axes) -> tuple[int, ...]:
        return tuple(self.order.index(a) for a in self.order if a in axes)

    def index(self, axis: str):
        if is_proxy(self.acc):
            return self.acc.tracer.index(self.acc, self.order.index(axis), f"index {axis}")
        shape = [1] * self.rank
        shape[self.order.index(axis)] = self.sizes[axis]
        return torch.arange(self.sizes[axis], device=self.acc.device).view(shape)

    def reduce(self, op: OpDef, x, over, keep, dtype):
        """``op`` over axes ``over`` of ``x`` seen as walking ``keep`` (keepdim: the result stays canonical)."""
        x = self.walk(x, keep)
        if not is_proxy(x):
            x = x.to(dtype)
        return x, apply_op(op, [x], {"dim": self.dims_of(over), "keepdim": True})

    def sum_to(self, g, axes):
        """The gradient ``g`` (per element of what it walks) summed over every axis not in ``axes``."""
        extra = [a for a in self.walked(g) if a not in axes]
        if not extra:
            return g
        if not is_proxy(g):
            g = self.walk(g, self.walked(g))
        return g.sum(dim=self.dims_of(extra), keepdim=True)


class Values:
    """Node values of ``graph`` in canonical form, computed on demand.

    ``leaf(node)`` returns the value of an acc/input/scalar node, or of any node it has a saved value for
    (None: compute it)."""

    def __init__(self, graph: Graph, leaf: Callable[[Node], object], space: Space):
        self.graph = graph
        self.leaf = leaf
        self.space = space
        self._env: dict[int, object] = {}
        self._walked_operand: dict[int, object] = {}

    def __call__(self, node: Node):
        key = id(node)
        if key not in self._env:
            self._env[key] = self._compute(node)
        return self._env[key]

    def reduce_operand(self, node: Node):
        """The operand of reduction ``node`` as it was reduced (walking the reduced axes)."""
        self(node)
        if id(node) not in self._walked_operand:  # a saved value stood in for the reduction
            keep = set(node.axes) | set(node.attrs["over"])
            self._walked_operand[id(node)] = self.space.walk(self(node.args[0]), keep)
        return self._walked_operand[id(node)]

    def _constant(self, value, dtype):
        """A folded constant of a dtype a Python number does not carry (``zeros_like(x, dtype=f16)``, a float64
        zero): traced where the space is, so it stays a value of the replayed graph."""
        if is_proxy(self.space.acc):
            return self.space.walk(torch.full_like(self.space.acc, value, dtype=dtype), ())
        return torch.tensor(value, dtype=dtype, device=self.space.acc.device)

    def _compute(self, n: Node):
        given = self.leaf(n)
        if given is not None:
            return given
        if n.op in ("acc", "input", "scalar"):
            raise EpilogueError(f"internal: no value for leaf %{n.name} ({n.op} {n.target})")
        if n.op == "const":
            # a constant standing for a tensor (``zeros_like(acc)``) stays one: as a number it reached ops that take
            # only tensors (``torch.maximum(acc, torch.zeros_like(acc))`` was refused under autograd, found by a
            # probe 2026-11-29)
            if n.target is None or _number_dtype(n.target, torch.float32) == n.dtype and not n.meta.get("tensor"):
                return n.target
            return self._constant(n.target, n.dtype)
        if n.op == "index":
            return self.space.index(n.target)
        if n.op == "compute":
            args = [self(a) for a in n.args]
            if n.target == "cast" and isinstance(args[0], (bool, int, float)):
                # a number widened (a folded zero gradient cast to float64): a constant of that dtype
                return self._constant(args[0], n.attrs["dtype"])
            if "eager_dtype" not in n.meta:
                return apply_op(REGISTRY[n.target], args, n.attrs)
            # kept in float32 where eager rounds to 16 bits (passes/intermediates.py): widen the 16-bit operands
            # (exactly) so the replay computes what the forward computed, and mark the result as the pass did
            args = [a.to(n.dtype) if isinstance(a, (torch.Tensor, TracedTensor)) and a.dtype in HALF_DTYPES else a
                    for a in args]
            out = apply_op(REGISTRY[n.target], args, n.attrs)
            if isinstance(out, TracedTensor) and out.dtype == n.dtype:
                (out.node.meta if out.node is not None else out.pending.meta)["eager_dtype"] = n.meta["eager_dtype"]
            return out
        if n.op == "reduce":
            keep = set(n.axes) | set(n.attrs["over"])
            x, out = self.space.reduce(REGISTRY[n.target], self(n.args[0]), n.attrs["over"], keep, n.dtype)
            self._walked_operand[id(n)] = x
            return out
        if n.op == "output":
            return self(n.args[0])
        raise AssertionError(n.op)
