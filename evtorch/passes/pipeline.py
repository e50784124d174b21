"""The optimization pipeline, readable top to bottom.

    prune → cse → simplify → stable → cse → [float32_intermediates → cse] → fuse_fma → split_stages → cse → prune

``float32_intermediates`` runs only where the epilogue keeps 16-bit intermediates in float32
(``EVTORCH_INTERMEDIATES=float32``, passes/intermediates.py); fma fusion after it then also fuses the products
it relabeled.

``run_pipeline`` copies the graph, runs each pass, checks its promises in debug mode and, when asked,
records the IR after each pass (``evtorch show`` prints that record).
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..runtime import knobs
from .base import PassError, check_facts
from .cse import CSE
from .fuse import FuseFMA
from .intermediates import Float32Intermediates
from .prune import Prune
from .simplify import Simplify
from .stable import StableForms
from .stages import SplitStages


#: passes that only optimize: nothing after them requires their facts, so EVTORCH_DISABLE_PASSES may skip them
#: ("reassociate" runs at code generation, where the fast-math rule allows it: codegen/fastmath.py;
#: "composite_grads" in the autodiff, composites' own derivative rules: autodiff/reverse.py)
OPTIONAL = ("stable", "fuse_fma", "reassociate", "composite_grads")


def default_passes(keep=None, disabled=None, intermediates: str = "eager") -> list:
    """The pipeline, without the OPTIONAL passes named in ``disabled`` (default: EVTORCH_DISABLE_PASSES), with
    ``float32_intermediates`` when ``intermediates`` is 'float32'."""
    disabled = knobs.disabled_passes() if disabled is None else frozenset(disabled)
    unknown = disabled - set(OPTIONAL)
    if unknown:
        raise ValueError(f"EVTORCH_DISABLE_PASSES: cannot skip {', '.join(sorted(unknown))}; the passes that can be "
                         f"skipped are {', '.join(OPTIONAL)}")
    if intermediates not in knobs.INTERMEDIATE_MODES:
        raise ValueError(f"intermediates must be one of {', '.join(knobs.INTERMEDIATE_MODES)}, got {intermediates!r}")
    widen = [Float32Intermediates(), CSE()] if intermediates == "float32" else []
    passes = [Prune(keep), CSE(), Simplify(), StableForms(), CSE(), *widen, FuseFMA(), SplitStages(), CSE(), Prune()]
    return [p for p in passes if p.name not in disabled]


def run_pipeline(graph: Graph, keep=None, debug: bool | None = None, record: list | None = None,
                 passes=None, intermediates: str = "eager") -> Graph:
    debug = knobs.debug_enabled() if debug is None else debug
    graph = graph.copy()
    facts: set[str] = set()
    history: list[str] = []
    if record is not None:
        record.append(("traced", str(graph)))
    for p in passes or default_passes(keep, intermediates=intermediates):
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
