"""Constant folding and algebraic simplification.

Rules (each only where it changes neither dtype nor shape class, so eager promotion is preserved, and only
where it is exact in IEEE arithmetic):
``x*1 → x``, ``1*x → x``, ``x+0``, ``0+x``, ``x-0``, ``x/1``, ``x**1 → x``, ``--x → x``, ``cast(x, x.dtype) → x``;
compute nodes whose operands are all constants are evaluated now. ``x*0`` is *not* folded (NaN/inf inputs), and
for floating x neither is ``x + 0.0`` (``-0.0 + 0.0`` is ``+0.0``; ``x + -0.0`` and ``x - 0.0`` are exact).
Ensures ``simplified``: no rule applies anywhere.
"""
from __future__ import annotations

import math

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ops import REGISTRY
from .base import Pass, fact, rewrite_until_fixed


def _is_const(n: Node, value) -> bool:
    return n.op == "const" and not isinstance(n.target, bool) and n.target is not None and n.target == value


def _adds_exactly(zero: Node, x: Node) -> bool:
    """``x + zero == x`` bit for bit: always for integers; for floats only with -0.0 (+0.0 turns -0.0 into +0.0)."""
    if not x.dtype.is_floating_point:
        return True
    return isinstance(zero.target, float) and math.copysign(1.0, zero.target) < 0


def _subtracts_exactly(zero: Node, x: Node) -> bool:
    """``x - zero == x`` bit for bit: always for integers; for floats only with +0.0 (``-0.0 - -0.0`` is +0.0)."""
    if not x.dtype.is_floating_point:
        return True
    return math.copysign(1.0, zero.target) > 0


def _rewrite(n: Node) -> Node | tuple | None:
    """The node ``n`` can be replaced by (an existing node), or ('const', value), or None."""
    if n.op != "compute":
        return None
    a = n.args
    same = lambda x: x.dtype == n.dtype and x.axes == n.axes  # noqa: E731
    t = n.target
    if t == "mul" and n.attrs == {}:
        if _is_const(a[1], 1) and same(a[0]):
            return a[0]
        if _is_const(a[0], 1) and same(a[1]):
            return a[1]
    if t == "add" and n.attrs.get("alpha", 1) == 1:
        if _is_const(a[1], 0) and same(a[0]) and _adds_exactly(a[1], a[0]):
            return a[0]
        if _is_const(a[0], 0) and same(a[1]) and _adds_exactly(a[0], a[1]):
            return a[1]
    if t == "sub" and n.attrs.get("alpha", 1) == 1 and _is_const(a[1], 0) and same(a[0]) and \
            _subtracts_exactly(a[1], a[0]):
        return a[0]
    if t == "div" and _is_const(a[1], 1) and same(a[0]):
        return a[0]
    if t == "pow" and n.attrs.get("exponent") == 1 and same(a[0]):
        return a[0]
    if t == "neg" and a[0].op == "compute" and a[0].target == "neg" and same(a[0].args[0]):
        return a[0].args[0]
    if t == "cast" and a[0].dtype == n.dtype:
        return a[0]
    if a and all(x.op == "const" and x.target is not None for x in a):
        return _fold(n)
    return None


def _fold(n: Node):
    """('const', value) of a compute node whose operands are all constants, or None if it cannot be folded.

    Evaluated as eager would evaluate it: a constant standing for a tensor (``meta['tensor']``: ``ones_like``, a
    folded value) as a 0-d tensor of its IR dtype, a Python number as itself (``ones_like(acc64) * 0.1`` is the
    double 0.1: as a float32 tensor it was 0.10000000149, found 2026-11-29), all as tensors where the op takes no
    Python number (``torch.exp``); the result rounded to the node's dtype (``ones_like(C16) * 0.1`` is a float16
    0.1)."""
    ref = REGISTRY[n.target].torch_ref
    tensors = [torch.tensor(x.target, dtype=x.dtype) for x in n.args]
    mixed = [t if x.meta.get("tensor") or not isinstance(x.target, (bool, int, float)) else x.target
             for t, x in zip(tensors, n.args)]
    value = None
    for args in ((mixed, tensors) if any(isinstance(a, torch.Tensor) for a in mixed) else (tensors,)):
        try:
            value = torch.as_tensor(ref(*args, **n.attrs))
            break
        except (TypeError, RuntimeError, ValueError, OverflowError):
            continue
    if value is None:
        return None
    if value.dim() != 0:
        return None
    return ("const", value.to(n.dtype).item())


def _apply(graph: Graph, n: Node) -> Node | None:
    """``rewrite_until_fixed``'s rule: ``_rewrite``'s replacement, a folded value as a new constant."""
    r = _rewrite(n)
    if not isinstance(r, tuple):
        return r
    value = r[1]
    if n.dtype.is_floating_point:
        value = float(value)
    elif n.dtype == torch.bool:
        value = bool(value)
    else:
        value = int(value)
    return graph.add("const", value, (), {}, (), n.dtype, n.stage, name="c", meta={"tensor": True})


class Simplify(Pass):
    name = "simplify"
    ensures = frozenset({"simplified"})
    invalidates = frozenset({"no_dead", "cse"})  # operands of removed nodes, equal folded constants

    def run(self, graph: Graph) -> Graph:
        return rewrite_until_fixed(graph, _apply)


@fact("simplified")
def _nothing_to_simplify(graph: Graph):
    for n in graph.nodes:
        if _rewrite(n) is not None:
            return f"%{n.name} ({n.target}) can still be simplified"
    return None
