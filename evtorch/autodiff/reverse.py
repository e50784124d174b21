"""Reverse mode over an epilogue graph, with the op registry's derivative rules.

``reverse(graph, values, seeds, wrt)`` walks ``graph`` backwards from the output gradients ``seeds`` and applies,
for every node on a path from a ``wrt`` leaf to a seeded output, its op's rule::

    derivative(grad, *operands, out=value, **attrs) -> one gradient per operand (None: not differentiable)

Reductions are called with ``dim`` = the reduced canonical dims and ``keepdim=True`` on their operand as it was
reduced, so ``sum`` broadcasts back, ``mean`` divides by the count, ``amax``/``amin`` share the gradient among
ties and ``logsumexp`` becomes a softmax, exactly as their rules (and torch) say.

Gradients are accumulated per element of the broadcast value they arrive on (a rule's result is seen as
walking at least the axes of the value it differentiates) and only summed down to a leaf's shape class at the
leaf (``Space.sum_to``): a row bias receives ``sum over M`` of one full-size expression, which
becomes a single fused reduction, and no partial sum ever has to flow back into a full-tile computation.
"""
from __future__ import annotations

from ..errors import EpilogueError
from ..ir.graph import Graph
from ..ir.node import Node
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


def reverse(graph: Graph, values: Values, seeds: dict[int, object], wrt: set[int]) -> dict[int, object]:
    """Gradients of the leaves in ``wrt`` (ids) given ``seeds`` (output position -> gradient of that output).

    Returns {id(leaf): gradient per element of what it walks} for the leaves that receive one."""
    dep = depends_on(graph, wrt)
    grads: dict[int, object] = {}

    def add(node: Node, g):
        if g is None or id(node) not in dep:
            return
        grads[id(node)] = g if id(node) not in grads else grads[id(node)] + g

    for out in graph.outputs:
        if out.target in seeds:
            add(out.args[0], seeds[out.target])
    for n in reversed(graph.nodes):
        if id(n) not in grads or n.op not in ("compute", "reduce"):
            continue
        op = REGISTRY[n.target]
        if op.derivative is None:
            raise EpilogueError(f"op {n.target!r} has no derivative rule, so evt.gemm cannot differentiate "
                                f"through it (node %{n.name}); give it one in the op registry (register_op("
                                "..., derivative=...)) or detach the inputs that reach it",
                                where=n.meta.get("where"))
        g = grads[id(n)]
        out = values(n)
        space = values.space
        if n.op == "reduce":
            frame = set(n.axes) | set(n.attrs["over"])
            result = op.derivative(g, values.reduce_operand(n), out=out, dim=space.dims_of(n.attrs["over"]),
                                   keepdim=True)
        else:
            frame = set(n.axes)
            result = op.derivative(g, *[values(a) for a in n.args], out=out, **n.attrs)
        if len(result) != len(n.args):
            raise EpilogueError(f"the derivative rule of {n.target!r} returned {len(result)} gradients for "
                                f"{len(n.args)} operands")
        for a, ga in zip(n.args, result):
            if ga is not None and id(a) in dep:
                # per element of the value differentiated (a rule may return it broadcast: mean's g / count)
                ga = space.walk(ga, frame | set(space.walked(ga)))
            add(a, ga)
    return {k: v for k, v in grads.items() if k in wrt}
