"""Pass infrastructure: a pass states the facts it needs and the facts it guarantees.

Facts are names with a checker each (``FACTS``); after a pass runs, in debug mode (``EVTORCH_DEBUG=1`` or
``debug=True``) the verifier and the checkers of every fact established so far run (its ``ensures`` and the
earlier passes' facts it does not declare in ``invalidates``), and a failure names the pass and the passes
before it. Checkers are real postconditions and never change the graph.
"""
from __future__ import annotations

from typing import Callable

from ..ir.graph import Graph
from ..ir.verify import verify


class PassError(AssertionError):
    pass


class Pass:
    name: str = "pass"
    requires: frozenset = frozenset()
    ensures: frozenset = frozenset()
    invalidates: frozenset = frozenset()  # facts this pass may break (they no longer hold after it)

    def run(self, graph: Graph) -> Graph:
        raise NotImplementedError

    def __repr__(self):
        return f"<pass {self.name}>"


def rewrite_until_fixed(graph: Graph, rewrite: Callable) -> Graph:
    """Replace nodes until no rule applies anywhere. ``rewrite(graph, n)`` returns None to keep ``n``, or the node
    that replaces it: an existing one, or the last of the nodes it created with ``graph.add`` (created nodes are
    moved in front of ``n`` in creation order). ``n``'s users take the replacement and ``n`` is removed; nodes that
    become unused stay for ``prune``."""
    changed = True
    while changed:
        changed = False
        for n in list(graph.nodes):
            mark = len(graph.nodes)
            r = rewrite(graph, n)
            if r is None:
                continue
            for m in graph.nodes[mark:]:
                graph.insert_before(n, m)
            graph.replace_uses(n, r)
            graph.remove([n])
            changed = True
    return graph


FACTS: dict[str, Callable[[Graph], str | None]] = {}


def fact(name: str):
    """Register the checker of a fact; it returns None when the fact holds, else a description."""
    def deco(fn):
        FACTS[name] = fn
        return fn
    return deco


def check_facts(graph: Graph, names, after: str, history: list[str]) -> None:
    problem = verify(graph)
    if problem:
        raise PassError(f"IR invalid after pass {after!r} (passes so far: {', '.join(history)}): {problem}")
    for name in names:
        problem = FACTS[name](graph)
        if problem:
            raise PassError(f"pass {after!r} promised {name!r} but: {problem} (passes so far: {', '.join(history)})")
