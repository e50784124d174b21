"""Structural invariants of an epilogue graph (torch.fx's ``Graph.lint``), checked after every pass in debug mode.

Returns a description of the first broken invariant, or None.
"""
from __future__ import annotations

from .graph import Graph
from .node import LEAF_OPS, OPCODES
from .types import Stage, canonical


def verify(graph: Graph) -> str | None:
    seen: set[int] = set()
    names: set[str] = set()
    for n in graph.nodes:
        if n.op not in OPCODES:
            return f"%{n.name} has unknown opcode {n.op!r}"
        if n.name in names:
            return f"name %{n.name} is used twice"
        names.add(n.name)
        for a in n.args:
            if id(a) not in seen:
                return f"%{n.name} uses %{a.name} before it is defined (or %{a.name} is not in the graph)"
        if n.op in LEAF_OPS and n.args:
            return f"leaf %{n.name} has arguments"
        if n.axes != canonical(n.axes):
            return f"%{n.name} axes {n.axes} not in canonical order"
        if n.op == "compute":
            union = set().union(*[set(a.axes) for a in n.args]) if n.args else set()
            if set(n.axes) != union:
                return f"%{n.name} varies along {n.axes} but its operands along {canonical(union)}"
        if n.op == "reduce":
            if n.stage != Stage.VECTOR:
                return f"reduction %{n.name} is not in the vector stage"
            if set(n.attrs["over"]) & set(n.axes):
                return f"reduction %{n.name} keeps an axis it reduces"
        if n.stage == Stage.TILE and any(a.stage == Stage.VECTOR for a in n.args) and n.op != "output":
            return f"tile-stage %{n.name} uses vector-stage %{[a.name for a in n.args if a.stage == Stage.VECTOR][0]}"
        if n.stage == Stage.VECTOR and n.op == "compute" and "M" in n.axes and "N" in n.axes:
            return f"vector-stage %{n.name} is full-size"
        if n.op == "output" and len(n.args) != 1:
            return f"output %{n.name} must have exactly one argument"
        seen.add(id(n))
    positions = sorted(n.target for n in graph.nodes if n.op == "output")
    if len(positions) != len(set(positions)):
        return f"output positions repeat: {positions}"
    return None
