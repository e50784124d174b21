"""Reassociation of float32 polynomial arithmetic, where the result is rounded to 16 bits anyway.

Written-out activations spend most of their instructions on constant arithmetic. tanh-GELU's argument
``sqrt(2/pi) * (x + 0.044715 * x*x*x)`` is four float ops as written (three after fma fusion) and two as
``x * (a + b * x^2)`` once ``x^2`` exists; its derivative's ``0.5*x * (1 - t*t) * sqrt(2/pi) * (1 + 0.134145*x*x)``
is seven and four as ``(1 - t*t) * (x * (h + g * x^2))``. IEEE arithmetic does not allow those rewrites (they round
differently in the last bits), so this pass only runs where the fast-math rule (``codegen/fastmath.py``) already
allows hardware approximations: on nodes whose every path to an output meets a 16-bit rounding, whose unit
roundoff (2^-9 for bfloat16) is four orders of magnitude above what reassociating float32 arithmetic changes.

**What it does.** Nodes of ``allowed`` (float32 tile-stage ``add``/``sub``/``mul``/``neg``/``fma``, ``div`` by a
constant, small integer ``pow``: ``arithmetic``) form trees: a
node used once, by another allowed node, belongs to its user's tree. Each tree is read as sums of products of
*univariate polynomials*: a polynomial in one atom (any other node: a cast input, a tanh, the accumulator) with
float coefficients, built through adds and through products with a monomial. Then

- factors of a product that are polynomials in the same atom are multiplied together, and the product's
  constants folded into one polynomial's coefficients (``0.5 * x * c * (1 + k x^2)`` is ``x * (0.5c + 0.5ck x^2)``);
- terms of a sum that are polynomials in the same atom are added, and constants folded in;
- each polynomial is emitted in Horner form, in ``x^2`` when it is even (``x^2`` computed once per atom), with a
  power of ``x`` factored out; a sum's last product becomes an fma with the rest of the sum.

**What it never does**, because it would cost accuracy rather than rounding in the last bits: multiply two
polynomials that both have several terms (``(x - 1)^3`` expanded cancels near 1), or touch a node whose value can
reach a float32 output, a reduction or a comparison (``allowed`` excludes it). A tree is only replaced when the
new form has fewer float operations; every atom of the tree stays in use (no input drops out of the kernel).

**Non-finite values.** Like any fast-math reassociation it takes values to be finite: a term whose coefficients
cancel or are zero is dropped (``acc*0.0 + 6*acc`` is ``6*acc``: inf for an infinite acc, where eager's
``0 * inf`` gives NaN), and constants folded in double can keep finite a product that overflows in eager's order
(``acc*1e38*1e-38``). Only nodes rounded to 16 bits are rewritten; ``EVTORCH_FAST_MATH=never`` (or
``EVTORCH_DISABLE_PASSES=reassociate``) keeps eager's order everywhere.

Requires ``cse`` (so "used once" is meaningful). Ensures nothing the later passes rely on; ``cse``, ``fuse_fma``
and ``prune`` run after it (``reassociate`` below runs them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import Stage, canonical
from .base import Pass
from .cse import CSE
from .fuse import FuseFMA
from .prune import Prune

#: the ops whose trees are rewritten
ARITH = frozenset({"add", "sub", "mul", "neg", "fma", "div", "pow"})
MAX_DEGREE = 8
MAX_POW = 4  # pow emits x*x*x*x up to here (ops/elementwise.py); beyond, a libdevice call: left alone
F32 = torch.float32


def arithmetic(n: Node) -> bool:
    """A float32 tile-stage node this pass can read as arithmetic: ``add``/``sub`` with any constant alpha,
    ``mul``, ``neg``, ``fma``, ``div`` by a finite non-zero constant (a product with its reciprocal) and ``pow``
    with an integer exponent 2..MAX_POW."""
    if not (n.op == "compute" and n.stage == Stage.TILE and n.dtype == F32 and n.target in ARITH
            and all(a.dtype == F32 or _const(a) is not None for a in n.args)):
        return False
    if n.target == "div":
        c = _const(n.args[1])
        return not n.attrs and c is not None and c != 0.0 and math.isfinite(c)
    if n.target == "pow":
        k = n.attrs.get("exponent")
        return set(n.attrs) == {"exponent"} and isinstance(k, (int, float)) and float(k).is_integer() \
            and 2 <= k <= MAX_POW
    return set(n.attrs) <= {"alpha"} and isinstance(n.attrs.get("alpha", 1), (int, float))


def _const(n: Node) -> float | None:
    if n.op == "const" and isinstance(n.target, (int, float)) and not isinstance(n.target, bool):
        return float(n.target)
    return None


# ------------------------------------------------------------------------------------------- univariate polys
@dataclass(frozen=True)
class Poly:
    """``sum(c * atom^k for k, c in coeffs)``; ``atom`` None for a constant."""
    atom: Node | None
    coeffs: tuple  # ((degree, coefficient), ...) sorted by degree, no zero coefficients

    @staticmethod
    def make(atom, coeffs: dict) -> "Poly":
        items = tuple(sorted((k, c) for k, c in coeffs.items() if c != 0.0))
        if all(k == 0 for k, _ in items):
            atom = None
        return Poly(atom, items)

    @property
    def degree(self) -> int:
        return max((k for k, _ in self.coeffs), default=0)

    @property
    def terms(self) -> int:
        return len(self.coeffs)

    def scaled(self, c: float) -> "Poly":
        return Poly.make(self.atom, {k: v * c for k, v in self.coeffs})

    def value(self) -> float:
        return dict(self.coeffs).get(0, 0.0)


def _same_atom(p: Poly, q: Poly):
    """The atom both are polynomials in (None for two constants), or False when they differ."""
    if p.atom is None or q.atom is None or p.atom is q.atom:
        return p.atom if p.atom is not None else q.atom
    return False


def _add(p: Poly, q: Poly) -> Poly | None:
    atom = _same_atom(p, q)
    if atom is False:
        return None
    out = dict(p.coeffs)
    for k, c in q.coeffs:
        out[k] = out.get(k, 0.0) + c
    return Poly.make(atom, out)


def _mul(p: Poly, q: Poly) -> Poly | None:
    """The product, only when one side is a monomial (so nothing is expanded that could cancel)."""
    atom = _same_atom(p, q)
    if atom is False or (p.terms > 1 and q.terms > 1):
        return None
    out: dict = {}
    for k1, c1 in p.coeffs:
        for k2, c2 in q.coeffs:
            out[k1 + k2] = out.get(k1 + k2, 0.0) + c1 * c2
    r = Poly.make(atom, out)
    return r if r.degree <= MAX_DEGREE else None


# --------------------------------------------------------------------------------------- trees as expressions
@dataclass
class Prod:
    coef: float = 1.0
    factors: list = field(default_factory=list)  # Poly | Sum


@dataclass
class Sum:
    terms: list = field(default_factory=list)  # Poly | Prod


class _Reader:
    """Reads the trees of ``allowed`` nodes as Poly / Prod / Sum expressions."""

    def __init__(self, graph: Graph, allowed: set):
        self.allowed = allowed
        self.users = graph.users()

    def absorbed(self, n: Node) -> bool:
        """``n`` belongs to its only user's tree."""
        us = self.users.get(id(n), ())  # nodes made by an earlier tree's rewrite are atoms
        return id(n) in self.allowed and len(us) == 1 and id(us[0]) in self.allowed

    def operand(self, a: Node):
        c = _const(a)
        if c is not None:
            return Poly.make(None, {0: c})
        if self.absorbed(a):
            return self.read(a)
        return Poly.make(a, {1: 1.0})

    def read(self, n: Node):
        ops = [self.operand(a) for a in n.args]
        alpha = float(n.attrs.get("alpha", 1))
        t = n.target
        if t == "neg":
            return _scale(ops[0], -1.0)
        if t == "div":
            return _scale(ops[0], 1.0 / ops[1].value())
        if t == "pow":
            out = ops[0]
            for _ in range(int(n.attrs["exponent"]) - 1):
                out = _product(out, ops[0])
            return out
        if t in ("add", "sub"):
            return _sum(ops[0], _scale(ops[1], alpha if t == "add" else -alpha))
        product = _product(ops[0], ops[1])
        return product if t == "mul" else _sum(product, ops[2])  # fma: a * b + c


def _scale(e, c: float):
    if c == 1.0:
        return e
    if isinstance(e, Poly):
        return e.scaled(c)
    if isinstance(e, Prod):
        return Prod(e.coef * c, e.factors)
    return Sum([_scale(t, c) for t in e.terms])


def _terms(e) -> list:
    return e.terms if isinstance(e, Sum) else [e]


def _sum(a, b):
    """``a + b``: one polynomial where both are polynomials in the same atom, else a Sum of their terms."""
    if isinstance(a, Poly) and isinstance(b, Poly):
        s = _add(a, b)
        if s is not None:
            return s
    return Sum(_terms(a) + _terms(b))


def _product(a, b):
    if isinstance(a, Poly) and isinstance(b, Poly):
        p = _mul(a, b)
        if p is not None:
            return p
    out = Prod()
    for e in (a, b):
        if isinstance(e, Prod):
            out.coef *= e.coef
            out.factors += e.factors
        elif isinstance(e, Poly) and e.atom is None:
            out.coef *= e.value()
        else:
            out.factors.append(e)
    return out


# --------------------------------------------------------------------------------------------- normal form
def _group(polys: list, combine) -> list:
    """Polys merged per atom with ``combine`` (which may refuse: then they stay apart), atoms in first-seen order."""
    out: list = []
    for p in polys:
        for i, q in enumerate(out):
            if q.atom is p.atom or q.atom is None or p.atom is None:
                r = combine(q, p)
                if r is not None:
                    out[i] = r
                    break
        else:
            out.append(p)
    return out


def normal(e):
    """The expression with same-atom polynomials merged and constants folded into coefficients."""
    if isinstance(e, Poly):
        return e
    if isinstance(e, Sum):
        polys, rest = [], []
        for t in e.terms:
            t = normal(t)
            if isinstance(t, Poly):
                polys.append(t)
            elif isinstance(t, Prod) and not t.factors:
                polys.append(Poly.make(None, {0: t.coef}))
            else:
                rest.extend(_terms(t))
        polys = _group(polys, _add)
        polys = [p for p in polys if p.coeffs] or ([] if rest else [Poly.make(None, {0: 0.0})])
        if not rest and len(polys) == 1:
            return polys[0]
        return Sum(polys + rest)
    coef, polys, rest = e.coef, [], []
    for f in e.factors:
        f = normal(f)
        if isinstance(f, Poly) and f.atom is None:
            coef *= f.value()
        elif isinstance(f, Poly):
            polys.append(f)
        elif isinstance(f, Prod):
            coef *= f.coef
            rest.extend(f.factors)
        else:
            rest.append(f)
    # many-term polynomials first, so that each monomial joins one of its atom (a shift and a scaling)
    # before two monomials of that atom are multiplied into one
    polys.sort(key=lambda p: p.terms > 1, reverse=True)
    polys = _group(polys, _mul)
    for i, p in enumerate(polys):  # monomials' coefficients join the product's, to be folded in once below
        if p.terms == 1:
            (k, c), = p.coeffs
            coef, polys[i] = coef * c, Poly.make(p.atom, {k: 1.0})
    if coef != 1.0 and polys:  # into the polynomial with most terms: its coefficients take it for free
        i = max(range(len(polys)), key=lambda j: polys[j].terms)
        polys[i], coef = polys[i].scaled(coef), 1.0
    if not rest and len(polys) == 1 and coef == 1.0:
        return polys[0]
    return Prod(coef, polys + rest)


# ------------------------------------------------------------------------------------------------- emission
class _Emitter:
    """Appends the nodes of a normal form to the graph and counts the float operations it spends."""

    def __init__(self, graph: Graph, squares: dict):
        self.graph = graph
        self.squares = squares  # id(atom) -> x*x, shared by every tree
        self.ops = 0

    def node(self, target, args):
        axes = canonical(set().union(*(a.axes for a in args)))
        if target != "neg":
            self.ops += 1
        return self.graph.add("compute", target, args, {}, axes, F32, Stage.TILE)

    def const(self, c: float) -> Node:
        return self.graph.add("const", float(c), (), {}, (), F32, Stage.TILE, name="c")

    def square(self, x: Node) -> Node:
        sq = self.squares.get(id(x))
        if sq is None:
            sq = self.squares[id(x)] = self.node("mul", (x, x))
        return sq

    def power(self, x: Node, k: int) -> Node:
        if k == 1:
            return x
        out = self.square(x)
        for _ in range(k - 2):
            out = self.node("mul", (out, x))
        return out

    def scaled(self, c: float, x: Node) -> Node:
        if c == 1.0:
            return x
        if c == -1.0:
            return self.node("neg", (x,))
        return self.node("mul", (self.const(c), x))

    def poly(self, p: Poly) -> Node:
        if p.atom is None:
            return self.const(p.value())
        x, coeffs = p.atom, dict(p.coeffs)
        low = min(coeffs)
        q = {k - low: c for k, c in coeffs.items()}
        base, step = x, 1
        # in x^2 when even, unless a two-term 1 - x^2 is one fma in x (fma(-x, x, 1)) and x^2 is not at hand
        if (len(q) > 1 and all(k % 2 == 0 for k in q)
                and (id(x) in self.squares or len(q) > 2 or abs(q[max(q)]) != 1.0)):
            base, step = self.square(x), 2
        top = max(q)
        acc: Node | float = q[top]  # Horner; a float while the value is still a constant
        for k in range(top - step, -1, -step):
            c = q.get(k, 0.0)
            if isinstance(acc, float):
                acc = self.scaled(acc, base) if c == 0.0 else self.node("fma", (self.const(acc), base, self.const(c)))
            else:
                acc = self.node("mul", (acc, base)) if c == 0.0 else self.node("fma", (acc, base, self.const(c)))
        if low == 0:
            return acc if isinstance(acc, Node) else self.const(acc)
        xl = self.power(x, low)
        return self.scaled(acc, xl) if isinstance(acc, float) else self.node("mul", (acc, xl))

    def factors(self, e: Prod) -> list[Node]:
        nodes = [self.poly(f) if isinstance(f, Poly) else self.sum(f) for f in e.factors]
        if e.coef != 1.0:
            nodes[0] = self.scaled(e.coef, nodes[0]) if nodes else self.const(e.coef)
        return nodes or [self.const(e.coef)]

    def product(self, nodes: list[Node]) -> Node:
        out = nodes[0]
        for f in nodes[1:]:
            out = self.node("mul", (out, f))
        return out

    def sum(self, e: Sum) -> Node:
        acc = None
        prods = [t for t in e.terms if isinstance(t, Prod)]
        for t in e.terms:  # polynomials first, products last: each product becomes an fma with what precedes it
            if isinstance(t, Poly):
                v = self.poly(t)
                acc = v if acc is None else self.node("add", (acc, v))
        for t in prods:
            fs = self.factors(t)
            if acc is None:
                acc = self.product(fs)
            elif len(fs) == 1:
                acc = self.node("add", (acc, fs[0]))
            else:
                acc = self.node("fma", (self.product(fs[:-1]), fs[-1], acc))
        return acc

    def emit(self, e) -> Node:
        if isinstance(e, Poly):
            return self.poly(e)
        if isinstance(e, Sum):
            return self.sum(e)
        return self.product(self.factors(e))


def _atoms(e, out: set) -> set:
    if isinstance(e, Poly):
        if e.atom is not None:
            out.add(id(e.atom))
    else:
        for t in (e.terms if isinstance(e, Sum) else e.factors):
            _atoms(t, out)
    return out


def _tree_atoms(n: Node, reader: _Reader, out: set) -> set:
    """ids of the non-constant values ``n``'s tree reads (what the rewrite must keep reading: an atom whose terms
    cancel in the expression would otherwise drop out, and with it maybe a kernel argument)."""
    for a in n.args:
        if reader.absorbed(a):
            _tree_atoms(a, reader, out)
        elif _const(a) is None:
            out.add(id(a))
    return out


def _tree_ops(n: Node, reader: _Reader) -> int:
    """Float operations of ``n``'s tree as it stands (negations are free: an operand modifier in SASS)."""
    own = {"neg": 0, "pow": int(n.attrs.get("exponent", 2)) - 1}.get(n.target, 1)
    return own + sum(_tree_ops(a, reader) for a in n.args if reader.absorbed(a))


class Reassociate(Pass):
    """Rewrite the trees rooted at nodes of ``allowed`` (ids of nodes in the graph it runs on)."""
    name = "reassociate"
    requires = frozenset({"cse"})
    invalidates = frozenset({"no_dead", "cse", "fused", "simplified"})

    def __init__(self, allowed):
        self.allowed = set(allowed)

    def run(self, graph: Graph) -> Graph:
        allowed = self.allowed & {id(n) for n in graph.nodes if arithmetic(n)}
        reader = _Reader(graph, allowed)
        squares: dict = {}
        for n in list(graph.nodes):
            if id(n) not in allowed or reader.absorbed(n):
                continue
            before = reader.read(n)
            form = normal(before)
            mark = len(graph.nodes)
            em = _Emitter(graph, dict(squares))
            new = em.emit(form)
            created = graph.nodes[mark:]
            if (em.ops >= _tree_ops(n, reader) or _atoms(form, set()) != _tree_atoms(n, reader, set())
                    or canonical(new.axes) != canonical(n.axes)):
                graph.remove(created)
                continue
            squares.update(em.squares)
            for m in created:
                graph.insert_before(n, m)
            graph.replace_uses(n, new)
            graph.remove([n])
        return graph


def reassociate(graph: Graph, allowed) -> Graph:
    """``Reassociate(allowed)`` on ``graph`` (in place), then CSE, fma fusion and pruning of what it left dead."""
    if not allowed:
        return graph
    for p in (Reassociate(allowed), CSE(), FuseFMA(), Prune()):
        graph = p.run(graph)
    return graph


__all__ = ["Reassociate", "reassociate", "arithmetic", "Poly", "normal"]
