"""Stable forms: rewrite a composite into one op that computes the same function with less rounding error.

Rules, each where every node involved is floating point of one dtype (float32 or float64: no rounding that eager
performs between the ops is skipped) and in one stage:

- ``log(clamp(x, lo, hi)) → clamp(log(x), log(lo), log(hi))`` for constant bounds ``0 <= lo <= hi`` (either may be
  None) where ``x`` is known to be >= 0 or NaN (``value_range``): log is increasing, so it commutes with the clamp,
  and the bounds fold to constants. This brings a clamped probability's log (``log(clamp(sigmoid(z), eps,
  1 - eps))``, the usual BCE) next to the sigmoid for the next rules. A possibly negative ``x`` is left alone
  (eager gives ``log(lo)`` there, the hoisted form NaN).
- ``log(sigmoid(x)) → logsigmoid(x)``.
- ``log(1 - sigmoid(x)) → logsigmoid(-x)`` (the other half of a binary cross-entropy).

Why: eager rounds sigmoid before the log (relative error up to ~1e-7 / |log p| in float32) and underflows below
x = -103.9 (sigmoid is 0 and its log -inf where logsigmoid is x; 1 - sigmoid(x) rounds to 0 above x = 17).
``logsigmoid`` is ``min(x, 0) - log1p(exp(-|x|))``, correct everywhere. It is also cheaper on the GPU: the
sigmoid's exp and reciprocal plus tl.log's ~20-instruction sequence against one exp, one divide and a 7-term
series (``tlmath.logsigmoid``). Unlike ``simplify`` these rules change results, always toward the exact value,
by less than eager's own rounding where eager does not underflow.
Requires nothing; ensures ``stable``; leaves the replaced nodes for ``prune`` and may create constants ``cse``
merges.
"""
from __future__ import annotations

import math

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from .base import Pass, fact, rewrite_until_fixed

_FLOATS = (torch.float32, torch.float64)
_NONNEGATIVE_OPS = frozenset({"sigmoid", "exp", "exp2", "relu", "abs", "sqrt"})


def value_range(n: Node) -> tuple[float, float]:
    """Bounds (lo, hi) on every non-NaN value ``n`` takes, from what its ops guarantee; (-inf, inf) if unknown."""
    v = _bound(n)
    if v is not None:
        return (v, v) if not math.isnan(v) else (-math.inf, math.inf)
    if n.op != "compute":
        return (-math.inf, math.inf)
    t, a = n.target, n.args
    if t == "sigmoid":
        return (0.0, 1.0)
    if t in _NONNEGATIVE_OPS:
        return (0.0, math.inf)
    if t == "neg":
        lo, hi = value_range(a[0])
        return (-hi, -lo)
    if t == "sub" and n.attrs.get("alpha", 1) == 1:
        (alo, ahi), (blo, bhi) = value_range(a[0]), value_range(a[1])
        return (alo - bhi, ahi - blo)
    if t == "clamp":
        lo, hi = value_range(a[0])
        blo, bhi = _bound(a[1]), _bound(a[2])
        if blo is not None:
            lo, hi = max(lo, blo), max(hi, blo)
        if bhi is not None:
            lo, hi = min(lo, bhi), min(hi, bhi)
        return (lo, hi)
    return (-math.inf, math.inf)


def _bound(n: Node) -> float | None:
    """A numeric constant's value (a clamp bound's); None for an absent bound (a None constant) or a non-constant."""
    if n.op == "const" and isinstance(n.target, (int, float)) and not isinstance(n.target, bool):
        return float(n.target)
    return None


def _absent(n: Node) -> bool:
    return n.op == "const" and n.target is None


def _same(n: Node, *others: Node) -> bool:
    return n.dtype in _FLOATS and all(o.dtype == n.dtype and o.stage == n.stage and o.axes == n.axes for o in others)


def _compute(n: Node, target: str) -> bool:
    return n.op == "compute" and n.target == target


def _match(n: Node):
    """The rule that applies at ``n`` (a log node): ('clamp', clamp node), ('sigmoid', x), ('one_minus', x), or None."""
    if not _compute(n, "log"):
        return None
    (x,) = n.args
    if _compute(x, "clamp") and _same(n, x, x.args[0]):
        lo, hi = x.args[1], x.args[2]
        blo, bhi = _bound(lo), _bound(hi)
        if ((blo is not None or _absent(lo)) and (bhi is not None or _absent(hi))
                and (blo is None or blo >= 0) and (blo is None or bhi is None or blo <= bhi)
                and value_range(x.args[0])[0] >= 0):
            return ("clamp", x)
    if _compute(x, "sigmoid") and _same(n, x, x.args[0]):
        return ("sigmoid", x.args[0])
    if (_compute(x, "sub") and x.attrs.get("alpha", 1) == 1 and _bound(x.args[0]) == 1
            and _compute(x.args[1], "sigmoid") and _same(n, x, x.args[1], x.args[1].args[0])):
        return ("one_minus", x.args[1].args[0])
    return None


def _log_const(graph: Graph, bound: Node, like: Node) -> Node:
    """The constant log(bound) in ``like``'s dtype (a None bound stays None), evaluated as eager would."""
    if _absent(bound):
        return bound
    value = torch.log(torch.tensor(float(bound.target), dtype=like.dtype)).item()
    return graph.add("const", value, (), {}, (), like.dtype, like.stage, name="c")


def _apply(graph: Graph, n: Node) -> Node | None:
    """``rewrite_until_fixed``'s rule: the node replacing ``n`` (a log) if a rule applies, built with ``graph.add``."""
    found = _match(n)
    if found is None:
        return None
    kind, x = found
    if kind == "clamp":
        log = graph.add("compute", "log", (x.args[0],), {}, n.axes, n.dtype, n.stage)
        lo, hi = _log_const(graph, x.args[1], n), _log_const(graph, x.args[2], n)
        return graph.add("compute", "clamp", (log, lo, hi), {}, n.axes, n.dtype, n.stage)
    if kind == "one_minus":
        x = x.args[0] if _compute(x, "neg") else graph.add("compute", "neg", (x,), {}, x.axes, x.dtype, x.stage)
    return graph.add("compute", "logsigmoid", (x,), {}, n.axes, n.dtype, n.stage)


class StableForms(Pass):
    name = "stable"
    ensures = frozenset({"stable"})
    invalidates = frozenset({"no_dead", "cse"})

    def run(self, graph: Graph) -> Graph:
        return rewrite_until_fixed(graph, _apply)


@fact("stable")
def _no_unstable_form(graph: Graph):
    for n in graph.nodes:
        found = _match(n)
        if found is not None:
            return f"%{n.name} is log of {found[0]}"
    return None
