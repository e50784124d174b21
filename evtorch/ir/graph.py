"""The epilogue DAG: nodes in topological order, with printing, hashing and Graphviz export.

Printing a traced ``relu(alpha * acc + beta * C)`` gives::

    %acc : f32[MN] = acc
    %alpha : f32[-] = scalar alpha
    %t0 : f32[MN] = compute mul(%alpha, %acc)
    %beta : f32[-] = scalar beta
    %C : f16[MN] = input C binding=(M,N)
    %t1 : f32[MN] = compute mul(%beta, %C)
    %t2 : f32[MN] = compute add(%t0, %t1)
    %t3 : f32[MN] = compute relu(%t2)
    %out0 : f32[MN] = output[0](%t3, ...)

``structural_hash`` ignores names and source locations, so two traces of the same computation (for new
sizes, say) hash equal and share generated kernels.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

import torch

from .node import Node, freeze
from .types import Stage, axes_str, dtype_name


class Graph:
    def __init__(self):
        self.nodes: list[Node] = []
        self._names: set[str] = set()

    # ------------------------------------------------------------------ construction
    def add(self, op: str, target: Any, args: Iterable[Node], attrs: dict, axes, dtype: torch.dtype,
            stage: Stage, name: str | None = None, meta: dict | None = None) -> Node:
        node = Node(op, target, tuple(args), attrs, axes, dtype, stage, meta=meta)
        node.name = self._unique(name or ("t" if op in ("compute", "reduce") else op))
        self.nodes.append(node)
        return node

    def _unique(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "t"
        if base not in self._names and base != "t":
            self._names.add(base)
            return base
        i = 0
        while f"{base}{i}" in self._names:
            i += 1
        self._names.add(f"{base}{i}")
        return f"{base}{i}"

    # ------------------------------------------------------------------ queries
    @property
    def outputs(self) -> list[Node]:
        return sorted((n for n in self.nodes if n.op == "output"), key=lambda n: n.target)

    def users(self) -> dict[int, list[Node]]:
        """id(node) -> the nodes that take it as an argument."""
        users: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            for a in n.args:
                users[id(a)].append(n)
        return users

    def find(self, op: str, target: Any = None) -> list[Node]:
        return [n for n in self.nodes if n.op == op and (target is None or n.target == target)]

    # ------------------------------------------------------------------ rewriting
    def replace_uses(self, old: Node, new: Node) -> None:
        """Make every user of ``old`` use ``new`` instead (``old`` stays until pruned).

        Passes call this only with a ``new`` of ``old``'s value, so ``new`` also answers to ``old``'s name
        (``meta['aliases']``) and takes its composite mark: a composite's mark names its operands, and the
        autodiff applies its derivative rule where those names still lead to an ancestor (autodiff/reverse.py)."""
        for n in self.nodes:
            if any(a is old for a in n.args):
                n.args = tuple(new if a is old else a for a in n.args)
        if new is not old:
            new.meta["aliases"] = new.meta.get("aliases", ()) + (old.name,) + old.meta.get("aliases", ())
            if "composite" in old.meta:
                new.meta.setdefault("composite", old.meta["composite"])

    def insert_before(self, anchor: Node, node: Node) -> None:
        self.nodes.remove(node)
        self.nodes.insert(self.nodes.index(anchor), node)

    def remove(self, nodes: Iterable[Node]) -> None:
        drop = {id(n) for n in nodes}
        self.nodes = [n for n in self.nodes if id(n) not in drop]

    def copy(self) -> "Graph":
        g = Graph()
        mapping: dict[int, Node] = {}
        for n in self.nodes:
            c = Node(n.op, n.target, tuple(mapping[id(a)] for a in n.args), dict(n.attrs), n.axes, n.dtype,
                     n.stage, n.name, dict(n.meta))
            mapping[id(n)] = c
            g.nodes.append(c)
        g._names = set(self._names)
        return g

    # ------------------------------------------------------------------ views
    def __str__(self) -> str:
        return "\n".join(n.format() for n in self.nodes)

    def structural_hash(self) -> str:
        """A hash of the computation: opcodes, targets, attributes, dtypes, shape classes and edges."""
        index = {id(n): i for i, n in enumerate(self.nodes)}
        h = hashlib.sha256()
        for n in self.nodes:
            target = n.target
            if n.op == "compute" and hasattr(target, "cache_key"):
                target = target.cache_key
            h.update(repr((n.op, target, freeze(n.attrs), str(n.dtype), n.axes, n.stage.value,
                           tuple(index[id(a)] for a in n.args))).encode())
        return h.hexdigest()[:16]

    def to_dot(self, title: str = "epilogue") -> str:
        """Graphviz source: loads are boxes, computes ellipses, reductions diamonds, outputs double boxes."""
        shapes = {"acc": "box", "input": "box", "scalar": "box", "index": "box", "const": "plaintext",
                  "compute": "ellipse", "reduce": "diamond", "output": "doubleoctagon"}
        lines = [f'digraph "{title}" {{', "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
        for n in self.nodes:
            label = n.target if n.op in ("compute", "reduce", "input", "scalar") else n.op
            if n.op == "const":
                label = repr(n.target)
            elif n.op == "output":
                label = f"out{n.target}"
            elif n.op == "reduce":
                label = f"{n.target} over {''.join(n.attrs['over'])}"
            elif n.op == "index":
                label = f"index {n.target}"
            label = f"{label}\\n{dtype_name(n.dtype)}[{axes_str(n.axes)}]"
            style = ', style=filled, fillcolor="#e8f0ff"' if n.stage == Stage.VECTOR else ""
            lines.append(f'  {n.name} [label="{label}", shape={shapes[n.op]}{style}];')
        for n in self.nodes:
            for a in n.args:
                lines.append(f"  {a.name} -> {n.name};")
        lines.append("}")
        return "\n".join(lines)
