"""Splitting a backward epilogue into passes when it needs a finished reduction inside the tile.

A forward epilogue may never use a reduction result in a full-tile computation (it would need a second pass
over the tile). A backward can: ``amax``'s rule divides each tile element's gradient by the number of ties,
which is a reduction over the same tile. ``StagingTracer`` traces such a backward anyway: where a reduction
result meets a tile computation it substitutes a new input ``_d<k>`` (a *deferred* value) and records which
reduction it stands for. ``passes`` then turns the traced graph into a sequence of epilogues over the same
accumulator: the deferred values, level by level, then the main pass, which loads them like any vector input.

Each pass is built by replaying part of the traced graph (``autodiff.replay``) inside a fresh epilogue, so a pass
is an ordinary evtorch epilogue: traced, optimized, cached and code-generated like any other.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ..frontend.tracer import Tracer
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import Stage, canonical
from .replay import Space, Values

DEFERRED = "_d"


class StagingTracer(Tracer):
    """A tracer that defers a reduction result used in a tile computation instead of refusing it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order = ("L", "M", "N") if self.batched else ("M", "N")
        self.deferred: dict[str, Node] = {}
        self._deferred_of: dict[int, Node] = {}

    def _compute(self, op, nodes, attrs, dtype, spelled):
        if any(n.stage == Stage.VECTOR for n in nodes):
            tile_dependent = any(id(n) in self._tile_dependent for n in nodes)
            axes = set().union(*[set(n.axes) for n in nodes])
            if tile_dependent or {"M", "N"} <= axes:
                nodes = [self._defer(n) if n.stage == Stage.VECTOR else n for n in nodes]
        return super()._compute(op, nodes, attrs, dtype, spelled)

    def _defer(self, node: Node) -> Node:
        if id(node) not in self._deferred_of:
            name = f"{DEFERRED}{len(self.deferred)}"
            binding = tuple((a,) if a in node.axes else () for a in self.order)
            load = self._add("input", name, (), {"binding": binding}, node.axes, node.dtype, Stage.TILE, name=name)
            self.deferred[name] = node
            self._deferred_of[id(node)] = load
        return self._deferred_of[id(node)]


def signature_fn(name: str, params: list[str], body: Callable) -> Callable:
    """A function ``name(acc, <params>)`` calling ``body(acc, {param: value})`` (an epilogue to trace)."""
    def fn(acc, **kw):
        return body(acc, kw)
    P = inspect.Parameter
    fn.__signature__ = inspect.Signature([P("acc", P.POSITIONAL_OR_KEYWORD)] +
                                         [P(p, P.POSITIONAL_OR_KEYWORD) for p in params])
    fn.__name__ = fn.__qualname__ = name
    return fn


@dataclass
class Pass:
    """One epilogue of a staged backward: ``fn`` (to trace) reading ``params``, producing ``outputs``."""

    fn: Callable
    params: list[str]
    outputs: list[str]   # names: deferred values (``_d<k>``) or the main pass' result names


def _reachable(roots: list[Node]) -> list[Node]:
    seen, stack, order = set(), list(roots), []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        order.append(n)
        stack.extend(n.args)
    return order


def _leaf_params(nodes: list[Node]) -> list[str]:
    return sorted({n.target for n in nodes if n.op in ("input", "scalar")})


def replay_fn(name: str, graph: Graph, outputs: list[tuple[Node, tuple]], params: list[str], order, sizes):
    """An epilogue function recomputing ``outputs`` (node, axes each walks) of ``graph`` from ``params``."""
    def body(acc, kw):
        space = Space(order, sizes, acc)

        def leaf(n: Node):
            if n.op == "acc":
                return acc
            if n.op == "input":
                return space.bind(kw[n.target])
            if n.op == "scalar":
                return kw[n.target]
            return None
        values = Values(graph, leaf, space)
        return tuple(space.walk(values(node), axes) for node, axes in outputs)
    return signature_fn(name, params, body)


def passes(tracer: StagingTracer, name: str, results: list[str], sizes) -> list[Pass]:
    """The passes of a traced (and finished) backward: deferred values level by level, then the main pass,
    whose outputs are named ``results`` (one per output of the traced function, in order)."""
    graph, order = tracer.graph, tracer.order
    main_outputs = [(o.args[0], canonical(a for axes, _ in o.attrs["dims"] for a in axes)) for o in graph.outputs]
    # deferred values the main pass (transitively) needs, with their level (0: needs no other deferred value)
    level: dict[str, int] = {}

    def visit(dname: str) -> int:
        if dname not in level:
            deps = [n.target for n in _reachable([tracer.deferred[dname]])
                    if n.op == "input" and n.target in tracer.deferred]
            level[dname] = 1 + max((visit(d) for d in deps), default=-1)
        return level[dname]

    for n in _reachable([node for node, _ in main_outputs]):
        if n.op == "input" and n.target in tracer.deferred:
            visit(n.target)
    result = []
    for lv in range(max(level.values(), default=-1) + 1):
        names = sorted(d for d, v in level.items() if v == lv)
        outs = [(tracer.deferred[d], tracer.deferred[d].axes) for d in names]
        params = _leaf_params(_reachable([node for node, _ in outs]))
        result.append(Pass(replay_fn(f"{name}_pre{lv}", graph, outs, params, order, sizes), params, names))
    params = _leaf_params(_reachable([node for node, _ in main_outputs]))
    result.append(Pass(replay_fn(name, graph, main_outputs, params, order, sizes), params, list(results)))
    return result
