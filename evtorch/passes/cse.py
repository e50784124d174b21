"""Common-subexpression elimination: one node per distinct computation.

Requires: nothing. Ensures ``cse``: no two non-output nodes compute the same thing (same op, target,
attributes, dtype, stage and arguments; arguments of commutative ops compared as a multiset).
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops import REGISTRY
from ..ops.registry import COMMUTATIVE
from .base import Pass, fact


def _key(node, position):
    # the stage is part of the computation: a vector-stage copy of a tile-stage load (made by the stage split)
    # is computed in another kernel and must not be merged back into the tile value
    # add(a, b, alpha=k) is a + k * b: commutative only without a scale (CSE merged add(acc, C, alpha=2) with
    # add(C, acc, alpha=2), returning one output's values for the other, found by a probe 2026-11-29)
    if node.op == "compute" and node.target in REGISTRY and REGISTRY[node.target].has(COMMUTATIVE) and \
            node.attrs.get("alpha", 1) == 1:
        args = tuple(sorted(node.args, key=lambda a: position[id(a)]))
        return (node.op, node.target, node.key[2:5], tuple(id(a) for a in args), node.stage)
    return node.key + (node.stage,)


class CSE(Pass):
    name = "cse"
    ensures = frozenset({"cse"})

    def run(self, graph: Graph) -> Graph:
        seen, dead = {}, []
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        for n in graph.nodes:
            if n.op == "output":
                continue
            k = _key(n, position)
            if k in seen:
                graph.replace_uses(n, seen[k])
                dead.append(n)
            else:
                seen[k] = n
        graph.remove(dead)
        return graph


@fact("cse")
def _no_duplicates(graph: Graph):
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    seen = {}
    for n in graph.nodes:
        if n.op == "output":
            continue
        k = _key(n, position)
        if k in seen:
            return f"%{n.name} duplicates %{seen[k].name}"
        seen[k] = n
    return None
