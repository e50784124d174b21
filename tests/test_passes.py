"""Passes: each pass's postcondition (``FACTS``) is false on a graph that needs the pass and true after it; the
pipeline in debug mode verifies after every pass and names the culprit; simplification rules, fma fusion, stage
split and pruning as observed in the IR; IR printing and Graphviz export."""
from __future__ import annotations

import re

import pytest
import torch

import evtorch as evt
from evtorch.ir.graph import Graph
from evtorch.ir.node import Node
from evtorch.ir.types import Stage
from evtorch.ir.verify import verify
from evtorch.passes.base import FACTS, Pass, PassError, check_facts
from evtorch.passes.cse import CSE
from evtorch.passes.fuse import FuseFMA
from evtorch.passes.pipeline import default_passes, run_pipeline
from evtorch.passes.prune import Prune
from evtorch.passes.simplify import Simplify
from evtorch.passes.stages import SplitStages

from helpers import check_gemm, check_reference, operands, ops_in, rand

M, N, K = 6, 5, 4


def traced(fn, **inputs):
    inputs.setdefault("acc", evt.spec((M, N)))
    return evt.trace(fn, debug=True, **inputs)


def test_every_pass_fact_has_a_checker_and_holds_after_the_pipeline():
    passes = default_passes()
    promised = set().union(*[p.ensures for p in passes])
    assert promised <= set(FACTS), f"facts without a checker: {promised - set(FACTS)}"
    assert {"cse", "no_dead", "simplified", "fused", "staged"} <= promised

    def fn(acc, C, v, alpha):
        z = alpha * acc + C * 1 + 0
        y = torch.sigmoid(z) * torch.sigmoid(z)
        unused = torch.exp(acc)  # noqa: F841
        return y, (y - -(-v[:, None])).sum(1) * alpha, torch.logsumexp(z, 0)

    ep = traced(fn, C=evt.spec((M, N)), v=evt.spec((M,)), alpha=1.0)
    check_facts(ep.graph, promised, "pipeline", [p.name for p in passes])  # raises on any broken promise
    assert verify(ep.graph) is None
    # the traced graph needs the passes: at least these facts are false before
    for name in ("cse", "no_dead", "simplified", "fused"):
        assert FACTS[name](ep.traced) is not None, f"{name} already held on the traced graph"


def _needs_and_gets(pass_, fact, graph):
    assert FACTS[fact](graph) is not None, f"{fact} held before {pass_.name}"
    out = pass_.run(graph.copy())
    assert FACTS[fact](out) is None, f"{pass_.name} did not establish {fact}: {FACTS[fact](out)}"
    assert verify(out) is None
    return out


def test_cse_postcondition():
    ep = traced(lambda acc, C: (acc * C + C * acc, torch.exp(acc) - torch.exp(acc)), C=evt.spec((M, N)))
    g = _needs_and_gets(CSE(), "cse", ep.traced)
    assert ops_in(g, "mul") == ["mul"] and ops_in(g, "exp") == ["exp"]  # commutative operands match too


def test_cse_keeps_distinct_computations_apart():
    """Same op, different attributes / dtypes / operand order of a non-commutative op: not merged."""
    fn = lambda acc, C: (acc - C, C - acc, torch.add(acc, C, alpha=2), acc + C, acc.half(), acc.bfloat16())  # noqa
    g = CSE().run(traced(fn, C=evt.spec((M, N))).traced.copy())
    assert len(ops_in(g, "sub")) == 2 and len(ops_in(g, "add")) == 2 and len(ops_in(g, "cast")) == 2


def test_cse_keeps_scaled_adds_in_their_order():
    """``add(a, b, alpha=k)`` is ``a + k * b``: its operands do not commute (CSE merged the two below, so the
    second output returned the first's values, found by a probe on 2026-11-29); unscaled adds still merge."""
    fn = lambda acc, C: (torch.add(acc, C, alpha=2), torch.add(C, acc, alpha=2), acc + C, C + acc)  # noqa: E731
    g = CSE().run(traced(fn, C=evt.spec((M, N))).traced.copy())
    assert len(ops_in(g, "add")) == 3
    A, B, C = torch.randn(M, 7), torch.randn(7, N), torch.randn(M, N)
    for got, want in zip(evt.gemm(A, B, fn, C=C), fn(A @ B, C)):
        torch.testing.assert_close(got, want)


def test_prune_postcondition_and_outputs():
    def fn(acc, C):
        dead = torch.exp(acc) + C  # noqa: F841
        return torch.relu(acc), torch.sigmoid(acc).sum(1), C * 2

    ep = traced(fn, C=evt.spec((M, N)))
    g = _needs_and_gets(Prune(), "no_dead", ep.traced)
    assert "exp" not in ops_in(g)
    only1 = Prune(keep=(1,)).run(ep.traced.copy())
    assert [o.target for o in only1.outputs] == [1]
    assert ops_in(only1) == ["sigmoid"] and not only1.find("input")


def test_simplify_rules_in_ir():
    def fn(acc, C, Ci):
        return ((acc * 1 + -0.0) / 1 - 0, 1 * acc, -0.0 + acc, -(-acc), acc ** 1, C * 1, Ci * 1 + 0, Ci * 1.0,
                torch.ones_like(acc) * 2 * acc, acc * 0, acc.float(), acc + 0, 0 + Ci, acc - (-0.0), Ci - 0)

    inputs = dict(C=evt.spec((M, N), torch.float16), Ci=evt.spec((M, N), torch.int32))
    ep = traced(fn, **inputs)
    g = _needs_and_gets(Simplify(), "simplified", ep.traced)
    outs = [o.args[0] for o in g.outputs]
    acc = g.find("acc")[0]
    assert all(o is acc for o in outs[:5]), "x*1, x+(-0.0), x/1, x-0, 1*x, -0.0+x, --x, x**1 all give x"
    assert outs[11].target == "add", "float x + 0 is not x: -0.0 + 0 is +0.0"
    assert outs[12].op == "input", "integer 0 + x is x"
    assert outs[13].target == "sub", "float x - (-0.0) is not x: -0.0 - -0.0 is +0.0 (found 2026-11-29)"
    assert outs[14].op == "input", "integer x - 0 is x"
    assert outs[5].op == "input" and outs[6].op == "input", "f16 * 1 and int * 1 + 0 keep the input (same dtype)"
    assert outs[7].op == "compute" and outs[7].dtype == torch.float32, "int * 1.0 promotes: not simplified"
    # ones_like(acc) * 2 is folded to a constant 2.0
    t = outs[8]
    assert t.target == "mul" and any(a.op == "const" and a.target == 2.0 for a in t.args)
    assert outs[9].target == "mul", "x*0 is not folded (x may be inf/NaN)"
    assert outs[10] is acc
    assert not [n for n in g.nodes if n.op == "compute" and all(a.op == "const" for a in n.args)]


def test_simplify_preserves_values_on_edge_values():
    """Bit for bit, signed zeros included (1 / x tells -0.0 from +0.0)."""
    def fn(acc, C, Ci):
        return (acc * 1 + 0) / 1, -(-acc), acc * 0, C * 1, Ci * 1.0, torch.ones_like(acc) * 2 * acc, 0 - acc, \
            1 / (acc + 0), 1 / (acc - 0), 1 / (acc + -0.0), 1 / (acc - -0.0), 1 / (acc * 1), 1 / acc.sum(1, keepdim=True).sum(1), \
            1 / acc.amax(1, keepdim=True).amax(1), 1 / torch.logsumexp(acc[:, None], 1)

    check_reference(fn, rand((M, N), seed=1, edge=True), C=rand((M, N), torch.float16, seed=2, edge=True),
                    Ci=torch.arange(M * N, dtype=torch.int32).reshape(M, N), sign_of_zero=True)


def test_constant_folding_of_constant_expressions():
    ep = traced(lambda acc: acc * (torch.ones_like(acc) * 3 - 1) + torch.zeros_like(acc).exp())
    consts = [n for n in ep.graph.nodes if n.op == "const"]
    assert {c.target for c in consts} >= {2.0, 1.0}
    assert "exp" not in ops_in(ep.graph)
    check_reference(ep.fn, rand((M, N), seed=3, edge=True))


def test_folded_constants_keep_eager_dtypes():
    """``ones_like`` constants are tensors in eager: they promote (``ones_like(acc) * 0.1 + C16`` is float32) and
    round to their dtype (``ones_like(C16) * 0.1`` is a float16 0.1)."""
    def fn(acc, C):
        return torch.ones_like(acc) * 0.1 + C, acc + torch.ones_like(C) * 0.1, torch.zeros_like(acc) + C, \
            torch.full_like(C, 0.3) * C

    A, B = operands(M, N, K, seed=14)
    check_gemm(fn, A, B, C=rand((M, N), torch.float16, seed=15), rtol=0, atol=0)
    ep = traced(fn, C=evt.spec((M, N), torch.float16))
    assert [o.dtype for o in ep.outputs] == [torch.float32, torch.float32, torch.float32, torch.float16]


def test_fma_fusion():
    def fn(acc, C, D, alpha, beta):
        return alpha * acc + beta * C, acc * C + D, 2 * acc + 1

    ep = traced(fn, C=evt.spec((M, N)), D=evt.spec((M, N)), alpha=1.0, beta=1.0)
    g = _needs_and_gets(FuseFMA(), "fused", CSE().run(ep.traced.copy()))
    assert len(ops_in(g, "fma")) == 3 and not ops_in(g, "add")
    A, B = operands(M, N, K, seed=4)
    check_gemm(fn, A, B, C=rand((M, N), seed=5), D=rand((M, N), seed=6), alpha=1.5, beta=-0.5)
    A64, B64 = operands(M, N, K, torch.float64, seed=4)
    ep64 = evt.trace(fn, acc=evt.spec((M, N), torch.float64), C=evt.spec((M, N), torch.float64),
                     D=evt.spec((M, N), torch.float64), alpha=1.0, beta=1.0)
    assert len(ops_in(ep64.graph, "fma")) == 3, "float64 epilogues fuse too (scalars adopt the compute dtype)"


def test_fma_fusion_is_not_applied_where_it_would_change_results_or_work():
    def fn(acc, C, H):
        p = acc * C
        return p + 1, p, torch.add(acc * C, H, alpha=2), H * H + H, (acc * 2 + C) * (acc * 2)

    ep = traced(fn, C=evt.spec((M, N)), H=evt.spec((M, N), torch.float16))
    g = ep.graph
    # the product is also an output: kept; alpha != 1: not an fma; f16 arithmetic: not an fma;
    # acc * 2 has two users (the +C and the last *): not fused away
    assert ops_in(g, "fma") == [], str(g)
    assert len(ops_in(g, "mul")) == 4 and len(ops_in(g, "add")) == 4, str(g)  # p+1, +alpha, H*H+H, *2+C
    A, B = operands(M, N, K, seed=7)
    check_gemm(fn, A, B, C=rand((M, N), seed=8), H=rand((M, N), torch.float16, seed=9))


def test_split_stages_gives_vector_stage_its_own_copies():
    def fn(acc, alpha, v):
        return alpha * acc, acc.sum(1) * alpha + v * 2, (acc * v[:, None]).amax(1) - v * 2

    ep = traced(fn, alpha=1.0, v=evt.spec((M,)))
    g = ep.graph
    assert FACTS["staged"](g) is None
    for n in g.nodes:
        if n.stage == Stage.VECTOR and n.op == "compute":
            assert all(a.stage == Stage.VECTOR for a in n.args), n.format()
    scal = [n for n in g.find("scalar", "alpha")]
    assert sorted(n.stage.value for n in scal) == ["tile", "vector"]
    ins = g.find("input", "v")
    assert sorted(n.stage.value for n in ins) == ["tile", "vector"]
    # before the split, the vector mul read the tile-stage scalar
    assert FACTS["staged"](ep.traced) is not None
    assert FACTS["staged"](SplitStages().run(ep.traced.copy())) is None
    A, B = operands(M, N, K, seed=10)
    check_gemm(fn, A, B, alpha=0.75, v=rand((M,), seed=11))


def test_pruning_via_gemm_outputs():
    def fn(acc, C):
        D = torch.relu(acc + C)
        return D, torch.exp(D).sum(1), torch.tanh(acc).amax(0)

    A, B = operands(M, N, K, seed=12)
    C = rand((M, N), seed=13)
    ep = evt.api.get_epilogue(fn, (M, N), torch.float32, {"C": C}, keep=(0,))
    assert ops_in(ep.graph) == ["add", "relu"] and not ep.graph.find("reduce")
    D, s, t = evt.gemm(A, B, fn, C=C, outputs=(0,))
    assert s is None and t is None
    check_gemm(fn, A, B, C=C, outputs=(2,))


# ------------------------------------------------------------------------------------------------ pipeline
class _Breaks(Pass):
    """A deliberately wrong pass: drops the first compute node although it is used."""
    name = "breaks"
    ensures = frozenset({"no_dead"})

    def run(self, graph):
        graph.remove([next(n for n in graph.nodes if n.op == "compute")])
        return graph


class _Lies(Pass):
    name = "lies"
    ensures = frozenset({"cse"})

    def run(self, graph):
        return graph


class _NeedsCSE(Pass):
    name = "needs_cse"
    requires = frozenset({"cse"})

    def run(self, graph):
        return graph


def test_pipeline_debug_names_the_broken_pass():
    ep = traced(lambda acc, C: (torch.relu(acc * C) + acc * C), C=evt.spec((M, N)))
    with pytest.raises(PassError, match=r"after pass 'breaks' \(passes so far: cse, breaks\)"):
        run_pipeline(ep.traced, passes=[CSE(), _Breaks()], debug=True)
    with pytest.raises(PassError, match=r"pass 'lies' promised 'cse'"):
        run_pipeline(ep.traced, passes=[_Lies()], debug=True)
    with pytest.raises(PassError, match=r"'needs_cse' requires \['cse'\]"):
        run_pipeline(ep.traced, passes=[_NeedsCSE()], debug=False)
    run_pipeline(ep.traced, passes=[_Lies()], debug=False)  # not checked without debug


def test_pipeline_debug_from_environment(monkeypatch):
    ep = traced(lambda acc: acc * 2 + acc * 2)
    monkeypatch.setenv("EVTORCH_DEBUG", "1")
    with pytest.raises(PassError):
        run_pipeline(ep.traced, passes=[_Lies()])
    monkeypatch.setenv("EVTORCH_DEBUG", "0")
    run_pipeline(ep.traced, passes=[_Lies()])


def test_stage_split_survives_later_passes():
    """The split's vector-stage copies are not merged back into the tile values by the CSE after it."""
    def fn(acc, alpha, v):
        return alpha * acc + v[:, None], acc.sum(1) * alpha - v

    ep = traced(fn, alpha=1.0, v=evt.spec((M,)))  # debug=True: every fact re-checked after every pass
    check_facts(ep.graph, FACTS.keys(), "pipeline", [])


def test_a_pass_undoing_an_earlier_fact_is_caught():
    class _Unstages(Pass):
        name = "unstages"

        def run(self, graph):
            for n in graph.nodes:
                if n.stage == Stage.VECTOR and n.op == "compute":
                    n.args = tuple(graph.find(a.op, a.target)[0] if a.op in ("scalar", "input") else a
                                   for a in n.args)
            return graph

    ep = traced(lambda acc, alpha: (alpha * acc, acc.sum(1) * alpha), alpha=1.0)
    with pytest.raises(PassError, match=r"after pass 'unstages'|'staged'"):
        run_pipeline(ep.traced, passes=[SplitStages(), _Unstages()], debug=True)


def test_pipeline_does_not_modify_the_traced_graph():
    ep = traced(lambda acc, C: (acc * 1 + C * acc) * 2, C=evt.spec((M, N)))
    before = str(ep.traced)
    run_pipeline(ep.traced, debug=True)
    assert str(ep.traced) == before
    assert [name for name, _ in ep.passes_log] == ["traced"] + [p.name for p in default_passes()]


def test_verifier_catches_broken_invariants():
    ep = traced(lambda acc, C: torch.relu(acc + C).sum(1), C=evt.spec((M, N)))
    g = ep.graph
    assert verify(g) is None

    def broken(mutate):
        h = g.copy()
        mutate(h)
        return verify(h)

    assert "before it is defined" in broken(lambda h: h.nodes.reverse())
    assert "used twice" in broken(lambda h: setattr(h.nodes[1], "name", h.nodes[0].name))
    assert "canonical order" in broken(lambda h: setattr(h.nodes[0], "axes", ("N", "M")))
    assert "varies along" in broken(lambda h: setattr(next(n for n in h.nodes if n.op == "compute"), "axes", ("M",)))
    assert "not in the vector stage" in broken(lambda h: setattr(h.find("reduce")[0], "stage", Stage.TILE))
    assert "keeps an axis" in broken(lambda h: setattr(h.find("reduce")[0], "axes", ("M", "N")))

    def tile_reads_vector(h):
        r = h.find("reduce")[0]
        c = Node("compute", "neg", (r,), {}, r.axes, r.dtype, Stage.TILE, name="bad")
        h.nodes.insert(h.nodes.index(r) + 1, c)
    assert "uses vector-stage" in broken(tile_reads_vector)

    def leaf_with_args(h):
        h.nodes[1].args = (h.nodes[0],)
    assert "leaf" in broken(leaf_with_args)


# ------------------------------------------------------------------------------------------------ printing
LINE = re.compile(r"^%\w+ : (f16|bf16|f32|f64|i64|i32|bool)\[(L?M?N?|-)\]( vec)? = "
                  r"(acc|input \w+( binding=\S+)?|scalar \w+|index [LMN]|const \S+|compute \w+\(.*\)|"
                  r"reduce \w+\(.*over=\([LMN,]+\)\)|output\[\d+\]\(.*\))$")


def test_ir_printing_one_line_per_node():
    def epi(acc, C, bias, alpha, beta):
        z = alpha * acc + beta * C + bias[:, None]
        D = torch.relu(z)
        return D, D.sum(dim=1), evt.col_index(acc).float().mean()

    ep = traced(epi, C=evt.spec((M, N), torch.float16), bias=evt.spec((M,)), alpha=1.5, beta=0.5)
    assert "%t1 : f16[MN] = compute mul(%beta, %C)" in str(ep.graph), "beta * C16 is float16, as in eager"
    ep = traced(epi, C=evt.spec((M, N)), bias=evt.spec((M,)), alpha=1.5, beta=0.5)
    text = str(ep.graph)
    lines = text.splitlines()
    assert len(lines) == len(ep.graph.nodes)
    for line in lines:
        assert LINE.match(line), line
    assert "%C : f32[MN] = input C binding=(M,N)" in text
    assert "%bias : f32[M] = input bias binding=(M)" in text
    assert re.search(r"= compute fma\(%alpha, %acc, %t\d+\)", text)
    assert re.search(r"f32\[M\] vec = reduce sum\(%t\d+, over=\(N\)\)", text)
    assert re.search(r"output\[1\]\(%t\d+, dims=\(M\), kind='vector'\)", text)
    assert "index N" in text
    assert repr(ep).startswith("<Epilogue epi acc(6, 5) outputs=3")
    shown = ep.show()
    for p in ["traced"] + [p.name for p in default_passes()]:
        assert f"== {p} ==" in shown


def test_to_dot():
    def fn(acc, C):
        z = torch.relu(acc + C)
        return z, z.sum(1) * 2

    ep = traced(fn, C=evt.spec((M, N)))
    dot = ep.to_dot()
    assert dot.startswith('digraph "fn" {') and dot.rstrip().endswith("}")
    nodes = re.findall(r"^  (\w+) \[label=", dot, re.M)
    edges = re.findall(r"^  (\w+) -> (\w+);", dot, re.M)
    assert sorted(nodes) == sorted(n.name for n in ep.graph.nodes)
    assert len(edges) == sum(len(n.args) for n in ep.graph.nodes)
    assert "shape=diamond" in dot and "sum over N" in dot and "fillcolor" in dot
    try:
        import graphviz
    except ImportError:
        return
    graphviz.Source(dot)  # parses as Graphviz source


def test_structural_hash_ignores_names_and_locations():
    f1 = lambda acc, C: torch.relu(acc + C)  # noqa: E731

    def f2(acc, D):
        t = acc + D
        return torch.relu(t)

    h1 = evt.trace(f1, acc=evt.spec((M, N)), C=evt.spec((M, N))).graph.structural_hash()
    g2 = evt.trace(f2, acc=evt.spec((M, N)), D=evt.spec((M, N))).graph
    for n in g2.nodes:  # same computation, other node names and source lines
        n.name = "x_" + n.name
    assert evt.trace(f1, acc=evt.spec((M, N)), C=evt.spec((M, N))).graph.structural_hash() == h1
    h3 = evt.trace(f1, acc=evt.spec((2 * M, 3 * N)), C=evt.spec((2 * M, 3 * N))).graph.structural_hash()
    assert h1 == h3
    h4 = evt.trace(lambda acc, C: torch.sigmoid(acc + C), acc=evt.spec((M, N)), C=evt.spec((M, N)))
    assert h4.graph.structural_hash() != h1


def test_graph_copy_is_independent():
    ep = traced(lambda acc: torch.relu(acc) * 2)
    g = ep.graph.copy()
    g.nodes[0].name = "renamed"
    assert ep.graph.nodes[0].name == "acc"
    assert isinstance(g, Graph) and len(g.nodes) == len(ep.graph.nodes)
