"""Pruning: drop outputs the caller does not want, then every node no output depends on.

``Prune(keep=(0, 2))`` keeps outputs 0 and 2 (their positions are unchanged). Ensures ``no_dead``.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import Pass, fact


def live_nodes(graph: Graph) -> set[int]:
    live: set[int] = set()
    for n in reversed(graph.nodes):
        if n.op == "output" or id(n) in live:
            live.add(id(n))
            live.update(id(a) for a in n.args)
    return live


class Prune(Pass):
    name = "prune"
    ensures = frozenset({"no_dead"})

    def __init__(self, keep=None):
        self.keep = None if keep is None else set(keep)

    def run(self, graph: Graph) -> Graph:
        if self.keep is not None:
            graph.remove([n for n in graph.nodes if n.op == "output" and n.target not in self.keep])
        live = live_nodes(graph)
        graph.remove([n for n in graph.nodes if id(n) not in live])
        return graph


@fact("no_dead")
def _no_dead(graph: Graph):
    live = live_nodes(graph)
    dead = [n.name for n in graph.nodes if id(n) not in live]
    return f"dead nodes remain: {dead}" if dead else None
