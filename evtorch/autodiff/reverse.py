"""Reverse mode over an epilogue graph, with the op registry's derivative rules.

``reverse(graph, values, seeds, wrt)`` walks ``graph`` backwards from the output gradients ``seeds`` and applies,
for every node on a path from a ``wrt`` leaf to a seeded output, its op's rule::

    derivative(grad, *operands, out=value, **attrs) -> one gradient per operand (None: not differentiable)

Reductions are called with ``dim`` = the reduced canonical dims and ``keepdim=True`` on their operand as it was
reduced, so ``sum`` broadcasts back, ``mean`` divides by the count, ``amax``/``amin`` share the gradient among
ties and ``logsumexp`` becomes a softmax, exactly as their rules (and torch) say.

Composites: an op that the tracer decomposes (gelu, silu, softplus, elu, hardswish, hardsigmoid, leaky_relu) may
have a derivative rule of its own. The tracer names its operands on the decomposition's output node
(``meta['composite']``), and where those nodes are still in the graph, ancestors of that output in its stage, the
rule is applied there and the decomposition is not walked: one compact expression (torch's own backward formula)
instead of the primitives' product rules. A node a pass replaced answers through its replacement
(``Graph.replace_uses`` keeps the old name among the new node's ``aliases`` and moves the mark), and the stage
split's vector copies name their operands' copies. Where the names do not lead to ancestors in the output's stage,
the decomposition is differentiated: the same derivative, longer. ``composites=False``
(``EVTORCH_DISABLE_PASSES=composite_grads``) always walks it.

Gradients are accumulated per element of the broadcast value they arrive on (a rule's result is seen as
walking at least the axes of the value it differentiates), one gradient per frame (the axes walked: a node read
by an (M, N) value and by an (N,) one gets one of each, as adding them per element would count the (N,) one M
times), and only summed down to a leaf's shape class at the leaf (``Space.sum_to``): a row bias receives ``sum
over M`` of one full-size expression, which becomes a single fused reduction, and no partial sum ever has to flow
back into a full-tile computation. A reduction's own gradient is first summed over the reduced axes a user
broadcast it back along.
"""
from __future__ import annotations

import torch

from ..errors import EpilogueError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import HALF_DTYPES
from ..ops import REGISTRY
from .replay import Values


def _differentiable(n: Node) -> bool:
    return n.dtype.is_floating_point


def depends_on(graph: Graph, wrt: set[int]) -> set[int]:
    """ids of the floating-point nodes whose value depends on a node in ``wrt``."""
    dep = set()
    for n in graph.nodes:
        if _differentiable(n) and (id(n) in wrt or any(id(a) in dep for a in n.args)):
            dep.add(id(n))
    return dep


def composite_operands(graph: Graph, composites: bool = True) -> dict[int, tuple]:
    """{id(output node): (op, operands, attrs)} for the composites whose derivative rule applies (module docstring):
    operands are nodes, or the numbers the composite was called with."""
    if not composites:
        return {}
    by_name = {n.name: n for n in graph.nodes}
    for n in graph.nodes:  # a name a pass retired: the node that took its place (the first, should two claim it)
        for alias in n.meta.get("aliases", ()):
            by_name.setdefault(alias, n)
    found = {}
    for n in graph.nodes:
        mark = n.meta.get("composite")
        if mark is None or n.op != "compute":
            continue
        name, operands, attrs = mark
        args = [by_name.get(v) if kind == "node" else v for kind, v in operands]
        nodes = [a for (kind, _), a in zip(operands, args) if kind == "node"]
        if all(a is not None and a.stage == n.stage for a in nodes) and _ancestors(n, nodes):
            found[id(n)] = (REGISTRY[name], args, dict(attrs))
    return found


def _ancestors(node: Node, candidates: list[Node]) -> bool:
    """Whether every candidate is an ancestor of ``node``."""
    want = {id(c) for c in candidates}
    seen, stack = set(), list(node.args)
    while stack and want - seen:
        a = stack.pop()
        if id(a) not in seen:
            seen.add(id(a))
            stack.extend(a.args)
    return want <= seen


def reverse(graph: Graph, values: Values, seeds: dict[int, object], wrt: set[int],
            composites: bool = True) -> dict[int, dict[frozenset, object]]:
    """Gradients of the leaves in ``wrt`` (ids) given ``seeds`` (output position -> gradient of that output).

    Returns {id(leaf): {frame: gradient per element of that frame}} for the leaves that receive one: a leaf's
    gradient is the sum over frames of each one summed down to the leaf's axes (``Space.sum_to``)."""
    dep = depends_on(graph, wrt)
    grads: dict[int, dict[frozenset, object]] = {}
    rules = composite_operands(graph, composites)
    space = values.space

    def add(node: Node, g):
        # per frame (the axes the gradient walks): a node used by an (M, N) value and by an (N,) one gets one
        # gradient per element of each, and adding them per element would count the (N,) one M times
        if g is None or id(node) not in dep:
            return
        frames = grads.setdefault(id(node), {})
        f = frozenset(space.walked(g))
        frames[f] = g if f not in frames else frames[f] + g

    for out in graph.outputs:
        if out.target in seeds:
            add(out.args[0], seeds[out.target])
    for n in reversed(graph.nodes):
        if id(n) not in grads or n.op not in ("compute", "reduce"):
            continue
        for g in grads[id(n)].values():
            if id(n) in rules:
                _apply_composite(n, rules[id(n)], g, values, dep, add)
            else:
                _apply_rule(n, g, values, dep, add)
    return {k: v for k, v in grads.items() if k in wrt}


def _apply_rule(n: Node, g, values: Values, dep: set[int], add) -> None:
    """The op's own derivative rule at ``n`` for the gradient ``g`` (per element of one frame)."""
    op = REGISTRY[n.target]
    if op.derivative is None:
        raise EpilogueError(f"op {n.target!r} has no derivative rule, so evt.gemm cannot differentiate "
                            f"through it (node %{n.name}); give it one in the op registry (register_op("
                            "..., derivative=...)) or detach the inputs that reach it",
                            where=n.meta.get("where"))
    out = values(n)
    space = values.space
    if n.op == "reduce":
        over = set(n.attrs["over"])
        frame = set(n.axes) | over
        # a user that broadcast the result back along a reduced axis (amax(x) + x of an (N,) input) made g walk
        # it: those are copies of the one result, so their gradients add up before the rule spreads them over
        # the operand (per element, amax's rule picked the arg-max's own copy only: found 2026-11-29)
        if over & set(space.walked(g)):
            g = space.sum_to(g, set(space.walked(g)) - over)
        result = op.derivative(g, values.reduce_operand(n), out=out, dim=space.dims_of(n.attrs["over"]),
                               keepdim=True)
    else:
        frame = set(n.axes)
        result = op.derivative(g, *[values(a) for a in n.args], out=out, **n.attrs)
    if len(result) != len(n.args):
        raise EpilogueError(f"the derivative rule of {n.target!r} returned {len(result)} gradients for "
                            f"{len(n.args)} operands")
    _pass_on(n.args, result, frame, space, dep, add)


def _apply_composite(n: Node, rule: tuple, g, values: Values, dep: set[int], add) -> None:
    """The composite's own rule at its output ``n``: gradients go straight to its operands. 16-bit operands are
    upcast first, as the tracer's decomposition upcast them."""
    op, args, attrs = rule
    operands = []
    for a in args:
        v = values(a) if isinstance(a, Node) else a
        if isinstance(a, Node) and a.dtype in HALF_DTYPES:
            v = v.to(torch.float32)
        operands.append(v)
    result = op.derivative(g, *operands, out=values(n), **attrs)
    _pass_on(args, result, set(n.axes), values.space, dep, add)


def _pass_on(args, result, frame: set, space, dep: set[int], add) -> None:
    """Hand each operand node its gradient from ``result``, per element of the value differentiated: walking at
    least ``frame``, the axes of that value (a rule may return it broadcast: mean's g / count)."""
    for a, ga in zip(args, result):
        if isinstance(a, Node) and ga is not None and id(a) in dep:
            add(a, space.walk(ga, frame | set(space.walked(ga))))
