"""The optimization pipeline, readable top to bottom.

    prune → cse → simplify → cse → fuse_fma → split_stages → cse → prune

``run_pipeline`` copies the graph, runs each pass, checks its promises in debug mode and, when asked,
records the IR after each pass (``evtorch show`` prints that record).
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..runtime import knobs
from .base import PassError, check_facts
from .cse import CSE
from .fuse import FuseFMA
from .prune import Prune
from .simplify import Simplify
from .stages import SplitStages


def default_passes(keep=None) -> list:
    return [Prune(keep), CSE(), Simplify(), CSE(), FuseFMA(), SplitStages(), CSE(), Prune()]


def run_pipeline(graph: Graph, keep=None, debug: bool | None = None, record: list | None = None,
                 passes=None) -> Graph:
    debug = knobs.debug_enabled() if debug is None else debug
    graph = graph.copy()
    facts: set[str] = set()
    history: list[str] = []
    if record is not None:
        record.append(("traced", str(graph)))
    for p in passes or default_passes(keep):
        missing = p.requires - facts
        if missing:
            raise PassError(f"pass {p.name!r} requires {sorted(missing)}, which no earlier pass ensured "
                            f"(passes so far: {', '.join(history) or 'none'})")
        graph = p.run(graph)
        history.append(p.name)
        facts = (facts - p.invalidates) | p.ensures
        if debug:  # every fact established so far must still hold: a pass may not silently undo another's work
            check_facts(graph, sorted(facts), p.name, history)
        if record is not None:
            record.append((p.name, str(graph)))
    return graph
