"""Stage split: every node belongs to the tile stage (inside the GEMM) or the vector stage (after it).

The tracer already puts reductions and what is computed from them in the vector stage. Values that depend
on neither acc nor a reduction (scalars, input loads, constants and their arithmetic) can be used by both;
this pass gives the vector stage its own copy of each such value it uses, so that after it no vector node
reads a tile value except a reduction reading the tile value it reduces (the stage boundary).
Ensures ``staged``.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import Stage
from .base import Pass, fact


def _tile_dependent(graph: Graph) -> set[int]:
    dep: set[int] = set()
    for n in graph.nodes:
        if n.op in ("acc", "index") or (n.stage == Stage.TILE and any(id(a) in dep for a in n.args)):
            dep.add(id(n))
    return dep


def _copy_meta(meta: dict, renamed: dict[str, str]) -> dict:
    """A vector copy's meta: the aliases stay with the tile node, and a composite's mark names the copies of its
    operands (made before it: they are its ancestors), so the autodiff's rule still applies in the vector stage."""
    meta = {k: v for k, v in meta.items() if k != "aliases"}
    if "composite" in meta:
        name, operands, attrs = meta["composite"]
        meta["composite"] = (name, tuple((kind, renamed.get(v, v)) if kind == "node" else (kind, v)
                                         for kind, v in operands), attrs)
    return meta


class SplitStages(Pass):
    name = "split_stages"
    ensures = frozenset({"staged"})
    invalidates = frozenset({"no_dead"})  # a tile value only the vector stage used is left behind

    def run(self, graph: Graph) -> Graph:
        dep = _tile_dependent(graph)
        clones: dict[int, Node] = {}
        renamed: dict[str, str] = {}  # a tile node's names (its own, its aliases) -> its copy's

        def vector_copy(n: Node) -> Node:
            if n.stage == Stage.VECTOR:
                return n
            if id(n) in clones:
                return clones[id(n)]
            args = tuple(vector_copy(a) for a in n.args)
            c = graph.add(n.op, n.target, args, dict(n.attrs), n.axes, n.dtype, Stage.VECTOR,
                          name=f"{n.name}_v", meta=_copy_meta(n.meta, renamed))
            graph.insert_before(first_vector_user[id(n)], c)
            clones[id(n)] = c
            for name in (n.name, *n.meta.get("aliases", ())):
                renamed[name] = c.name
            return c

        first_vector_user: dict[int, Node] = {}
        for n in graph.nodes:
            if n.stage == Stage.VECTOR and n.op != "reduce":
                for a in n.args:
                    first_vector_user.setdefault(id(a), n)
        # propagate "first user" to ancestors so clones are inserted early enough
        for n in reversed(graph.nodes):
            if id(n) in first_vector_user:
                for a in n.args:
                    u = first_vector_user.get(id(a))
                    if u is None or graph.nodes.index(u) > graph.nodes.index(first_vector_user[id(n)]):
                        first_vector_user[id(a)] = first_vector_user[id(n)]
        for n in list(graph.nodes):
            if n.stage != Stage.VECTOR or n.op == "reduce" and n.args[0].stage == Stage.TILE:
                continue
            new_args = []
            for a in n.args:
                if a.stage == Stage.TILE:
                    assert id(a) not in dep, f"vector node %{n.name} reads tile value %{a.name}"
                    a = vector_copy(a)
                new_args.append(a)
            n.args = tuple(new_args)
        return graph


@fact("staged")
def _staged(graph: Graph):
    for n in graph.nodes:
        if n.stage != Stage.VECTOR:
            continue
        for a in n.args:
            if a.stage == Stage.TILE and not (n.op == "reduce" or n.op == "output"):
                return f"vector node %{n.name} reads tile value %{a.name}"
    return None
