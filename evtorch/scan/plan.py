"""Planning a scan: which states run together, and how.

States that read each other (or that one ``post`` output reads together) form a *group*; each group becomes
one kernel. A group runs in one of three modes:

``assoc``    one floating state whose update is an associative first-order recurrence per lane:
             ``h + b``, ``h * a``, ``a * h + b`` (found by an affine analysis through any stages),
             ``maximum(h, b)``, ``minimum(h, b)``, ``logaddexp(h, b)``, with ``a``, ``b`` computed from inputs
             only. Runs as a parallel scan over time (``tl.associative_scan`` per time chunk plus a decoupled
             look-back across chunks). The coefficients ``a``/``b`` are a small graph of their own.
``lanes``    every state read in the group is lane i of a state of the same shape (no slice, no broadcast):
             lanes are independent, so a sequential time loop runs parallel over lane tiles, states in
             registers (TVM's schedule).
``coupled``  a state reads other lanes (``s1[..., :1]``): one program runs every lane of the group, states
             in a float32 workspace, a barrier between steps, so every lane sees the whole previous step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import FLOAT_DTYPES, Stage
from . import lanes as LN
from .trace import optimize


@dataclass
class Assoc:
    kind: str      # "sum" | "prod" | "max" | "min" | "logaddexp" | "linear"
    graph: Graph   # coefficients from inputs: outputs 0 = a, 1 = b (linear); output 0 = the operand (others)

    @property
    def ncomp(self) -> int:
        return 2 if self.kind == "linear" else 1


@dataclass
class Group:
    states: tuple            # state indices
    posts: tuple             # post output indices
    mode: str                # "assoc" | "lanes" | "coupled"
    shape: tuple | None      # the shared row shape (assoc, lanes)
    update: Graph            # the update restricted to this group's states
    post: Graph | None       # post restricted to this group's outputs
    lags: dict = field(default_factory=dict)   # state -> deepest step read (0: never read)
    assoc: Assoc | None = None

    def describe(self) -> str:
        kind = f"{self.mode}:{self.assoc.kind}" if self.assoc else self.mode
        return f"{kind}(states={list(self.states)}, posts={list(self.posts)})"


def leaves(graph: Graph | None) -> list[Node]:
    return [] if graph is None else [n for n in graph.nodes if n.op == "input"]


def state_of(node: Node) -> int | None:
    return int(node.target[1:]) if node.op == "input" and node.target.startswith("s") else None


def _reads(graph: Graph) -> dict:
    """output position -> set of states its value reads."""
    below: dict[int, set] = {}
    for n in graph.nodes:
        s = state_of(n)
        below[id(n)] = {s} if s is not None else set().union(*[below[id(a)] for a in n.args]) if n.args else set()
    return {n.target: below[id(n)] for n in graph.outputs}


def _restrict(graph: Graph | None, keep) -> Graph | None:
    if graph is None:
        return None
    from ..passes.prune import Prune
    return Prune(keep).run(graph.copy())


def plan_groups(body) -> list[Group]:
    n = len(body.states)
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i, j):
        parent[find(i)] = find(j)

    for j, reads in _reads(body.update).items():
        for m in reads:
            union(j, m)
    post_reads = _reads(body.post) if body.post is not None else {}
    for p, reads in post_reads.items():
        reads = sorted(reads)
        for m in reads[1:]:
            union(reads[0], m)
    roots = sorted({find(j) for j in range(n)}, key=lambda r: min(j for j in range(n) if find(j) == r))
    groups = []
    for r in roots:
        states = tuple(j for j in range(n) if find(j) == r)
        posts = tuple(p for p, reads in sorted(post_reads.items())
                      if (reads and find(min(reads)) == r) or (not reads and r == roots[0]))
        groups.append(_make_group(body, states, posts))
    return groups


def _make_group(body, states, posts) -> Group:
    update = _restrict(body.update, states)
    post = _restrict(body.post, posts) if posts else None
    lags = {j: 0 for j in states}
    for leaf in leaves(update):
        j = state_of(leaf)
        if j is not None:
            lags[j] = max(lags[j], leaf.attrs["lag"])
    shapes = {body.states[j].shape for j in states}
    separable = len(shapes) == 1
    if separable:
        shape = next(iter(shapes))
        for graph in (update, post):
            for leaf in leaves(graph):
                j = state_of(leaf)
                if j is not None and not LN.is_identity(leaf.attrs["map"], body.states[j].shape, leaf.attrs["shape"]):
                    separable = False
        separable = separable and all(body.post_specs[p].shape == shape for p in posts)
    if not separable:
        return Group(states, posts, "coupled", None, update, post, lags)
    group = Group(states, posts, "lanes", shape, update, post, lags)
    if len(states) == 1 and lags[states[0]] == 1 and body.states[states[0]].dtype in FLOAT_DTYPES:
        group.assoc = classify(update, states[0], body.compute_dtype, shape)
        if group.assoc is not None:
            group.mode = "assoc"
    return group


# ---------------------------------------------------------------------------------------------- classification
class _Builder:
    """Builds the coefficient graph; symbolic values are Python numbers 0.0/1.0 or nodes of that graph."""

    def __init__(self, dtype, shape):
        self.graph, self.dtype, self.shape, self.copies = Graph(), dtype, tuple(shape), {}

    def node(self, x) -> Node:
        if isinstance(x, Node):
            return x
        return self.graph.add("const", float(x), (), {}, (), self.dtype, Stage.TILE, name="c")

    def op(self, target, *args, **attrs) -> Node:
        return self.graph.add("compute", target, [self.node(a) for a in args], attrs, (), self.dtype, Stage.TILE,
                              meta={"shape": self.shape})

    def copy(self, n: Node) -> Node:
        hit = self.copies.get(id(n))
        if hit is None:
            args = [self.copy(a) for a in n.args]
            hit = self.graph.add(n.op, n.target, args, dict(n.attrs), (), n.dtype, n.stage, name=n.name,
                                 meta=dict(n.meta))
            self.copies[id(n)] = hit
        return hit

    def add(self, x, y):
        if _num(x) and _num(y):
            return x + y
        if _num(x) and x == 0:
            return y
        if _num(y) and y == 0:
            return x
        return self.op("add", x, y)

    def sub(self, x, y):
        if _num(x) and _num(y):
            return x - y
        if _num(y) and y == 0:
            return x
        if _num(x) and x == 0:
            return self.neg(y)
        return self.op("sub", x, y)

    def neg(self, x):
        return -x if _num(x) else self.op("neg", x)

    def mul(self, x, y):
        if _num(x) and _num(y):
            return x * y
        for p, q in ((x, y), (y, x)):
            if _num(p) and p == 0:
                return 0.0
            if _num(p) and p == 1:
                return q
        return self.op("mul", x, y)

    def div(self, x, y):
        if _num(x) and x == 0:
            return 0.0
        if _num(y) and y == 1:
            return x
        return self.op("div", x, y)


def _num(x) -> bool:
    return isinstance(x, (int, float))


def classify(graph: Graph, j: int, compute_dtype, shape) -> Assoc | None:
    """The associative form of state j's update, or None (then it runs as a sequential time loop)."""
    out = next(n for n in graph.outputs if n.target == j)
    root = out.args[0]
    dep: set[int] = set()
    for n in graph.nodes:
        if state_of(n) == j or any(id(a) in dep for a in n.args):
            dep.add(id(n))
    if id(root) not in dep:
        return None
    B = _Builder(compute_dtype, shape)

    def finish(kind, *values):
        for i, v in enumerate(values):
            B.graph.add("output", i, (B.node(v),), {}, (), compute_dtype, Stage.TILE, name=f"out{i}")
        return Assoc(kind, optimize(B.graph))

    is_h = lambda n: state_of(n) == j  # noqa: E731  (identity maps and lag 1 are checked by the caller)
    if root.op == "compute" and root.target in ("maximum", "minimum", "logaddexp") and len(root.args) == 2:
        a, b = root.args
        for p, q in ((a, b), (b, a)):
            if is_h(p) and id(q) not in dep:
                return finish({"maximum": "max", "minimum": "min"}.get(root.target, root.target), B.copy(q))
        return None

    memo: dict[int, tuple | None] = {}

    def affine(n: Node):
        """(A, B) with n = A * h + B, A and B free of h; None when n is not affine in h."""
        if id(n) in memo:
            return memo[id(n)]
        memo[id(n)] = r = _affine(n)
        return r

    def _affine(n: Node):
        if is_h(n):
            return (1.0, 0.0)
        if id(n) not in dep:
            return (0.0, B.copy(n))
        if n.op != "compute":
            return None
        args = [affine(a) for a in n.args]
        if any(a is None for a in args):
            return None
        t = n.target
        if t in ("add", "sub") and set(n.attrs) <= {"alpha"}:
            (au, bu), (av, bv) = args
            alpha = n.attrs.get("alpha", 1)
            if alpha != 1:
                av, bv = B.mul(av, float(alpha)), B.mul(bv, float(alpha))
            f = B.add if t == "add" else B.sub
            return (f(au, av), f(bu, bv))
        if t == "mul":
            (au, bu), (av, bv) = args
            if _num(au) and au == 0:
                return (B.mul(av, bu), B.mul(bv, bu))
            if _num(av) and av == 0:
                return (B.mul(au, bv), B.mul(bu, bv))
            return None
        if t == "div":
            (au, bu), (av, bv) = args
            if _num(av) and av == 0:
                return (B.div(au, bv), B.div(bu, bv))
            return None
        if t == "neg":
            (au, bu), = args
            return (B.neg(au), B.neg(bu))
        if t == "cast" and n.attrs.get("dtype") in (torch.float32, torch.float64) and \
                torch.finfo(n.attrs["dtype"]).bits >= torch.finfo(compute_dtype).bits:
            return args[0]
        return None

    form = affine(root)
    if form is None:
        return None
    a, b = form
    if _num(a) and a == 0:
        return None
    if _num(a) and a == 1:
        return finish("sum", b)
    if _num(b) and b == 0:
        return finish("prod", a)
    return finish("linear", a, b)
