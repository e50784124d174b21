"""Reassociation of float32 polynomial arithmetic rounded to 16 bits (passes/reassociate.py, codegen/fastmath.py).

The rewritten graphs are run by the IR's reference executor against the original graph and a float64 trace of the
same function; one test runs a reassociated program through the Triton interpreter (an epilogue with no hardware
approximation in it, which the interpreter could not run). The GPU runs of the fast programs are in
tests/test_fast_math.py and the GPU selftest."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, given, settings, strategies as st

import evtorch as evt
from evtorch.codegen import fastmath
from evtorch.codegen.program import build_program
from evtorch.ir.interpret import Interpreter
from evtorch.ir.verify import verify
from evtorch.passes.reassociate import ARITH, Poly, _mul, normal, Prod
from evtorch.runtime import gemm as rg

import helpers  # noqa: F401  (EVTORCH_POISON=1: outputs filled with NaN before each launch)

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
M, N = 32, 24
C1 = 0.7978845608028654


def gelu_derivative(acc, pre):
    """benchmarks/workloads.py's dgelu_bgrad: the tanh-GELU derivative as a user writes it, rounded to pre's dtype."""
    x = pre.float()
    t = torch.tanh(C1 * (x + 0.044715 * x * x * x))
    d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (C1 * (1.0 + 3.0 * 0.044715 * x * x))
    dpre = acc * d.to(pre.dtype)
    return dpre, dpre.sum(dim=0)


def gelu_aux(acc, bias):
    pre = acc + bias
    return F.gelu(pre, approximate="tanh"), pre


def _float_ops(graph) -> int:
    """Float operations as SASS counts them (a negation is an operand modifier, x**3 two multiplications)."""
    return sum(int(n.attrs["exponent"]) - 1 if n.target == "pow" else 1 for n in graph.nodes
               if n.op == "compute" and n.target in ARITH and n.target != "neg")


def _plan(fn, out_dtype=BF16, mode="auto", **inputs):
    ep = evt.trace(fn, acc=evt.spec((M, N), F32), **inputs)
    graph, _ = fastmath.plan(ep, out_dtype, mode)
    return ep, graph


def _run(graph, acc, inputs):
    return Interpreter(graph, {"M": M, "N": N}).run(acc, inputs)


# ------------------------------------------------------------------------------------------------ what it does
def test_gelu_derivative_takes_eight_float_ops_instead_of_fourteen():
    ep, graph = _plan(gelu_derivative, pre=evt.spec((M, N), BF16))
    assert graph is not ep.graph
    assert _float_ops(ep.graph) == 15 and _float_ops(graph) == 9  # 14 -> 8 in the derivative, acc * d outside it
    text = str(graph)
    assert "fma(" in text and text.count("tanh(") == 1
    # the argument of tanh is x * (c1 + c1*0.044715 x^2), one fma and one mul on the shared x^2
    assert f"const {C1 * 0.044715!r}" in text


def test_gelu_forward_takes_five_float_ops_instead_of_seven():
    ep, graph = _plan(gelu_aux, bias=evt.spec((N,), BF16))
    assert _float_ops(ep.graph) - _float_ops(graph) == 2


def gelu_as_users_write_it(acc, bias):
    x = acc + bias
    return (x * (1.0 + torch.tanh(C1 * (x + 0.044715 * x.pow(3)))) / 2).to(torch.bfloat16)


def test_pow_and_division_by_a_constant_are_read_as_arithmetic():
    ep, graph = _plan(gelu_as_users_write_it, bias=evt.spec((N,), BF16))
    assert "pow" in str(ep.graph) and "div" in str(ep.graph)
    assert "pow" not in str(graph) and "div" not in str(graph)
    # acc + bias in both; then x.pow(3) (2), fma(0.044715, ., x), C1 * ., 1 + ., x * ., / 2: 7 ->
    # x*x, fma, mul, fma(0.5, t, 0.5), mul: 5
    assert (_float_ops(ep.graph), _float_ops(graph)) == (8, 6)
    torch.manual_seed(2)
    acc, bias = torch.randn(1, M, N) * 3, torch.randn(N).to(BF16)
    got, want = _run(graph, acc, {"bias": bias})[0].float(), _run(ep.graph, acc, {"bias": bias})[0].float()
    assert ((got - want).abs() <= 2 ** -8 * want.abs() + 1e-6).all()
    # a division by zero (or by a tensor) stays a division
    ep, graph = _plan(lambda acc: (acc / 0.0 + acc * acc * 2.0 + acc * acc).to(torch.bfloat16))
    assert "div" in str(graph)


def test_not_where_a_float32_value_reaches_an_output_or_a_reduction():
    ep, graph = _plan(gelu_aux, out_dtype=F32, bias=evt.spec((N,), BF16))
    assert graph is ep.graph                                 # fp32 outputs: IEEE order kept
    ep, graph = _plan(lambda acc: (0.5 * acc * (1.0 + acc * acc)).sum(1), out_dtype=BF16)
    assert graph is ep.graph                                 # a reduction sums in float32
    ep, graph = _plan(gelu_aux, mode="never", bias=evt.spec((N,), BF16))
    assert graph is ep.graph
    ep, graph = _plan(gelu_aux, out_dtype=F32, mode="always", bias=evt.spec((N,), BF16))
    assert graph is not ep.graph                             # 'always': every float32 node


def test_always_mode_reaches_float32_outputs_and_sums_but_never_comparisons():
    poly = lambda acc: 0.5 * acc * (1.0 + 0.25 * acc * acc) * 3.0  # noqa: E731
    ep, graph = _plan(lambda acc: (poly(acc), poly(acc).sum(1)), out_dtype=F32, mode="always")
    assert graph is not ep.graph
    for fn in (lambda acc: poly(acc).amax(0),                     # the backward compares recomputed maxima
               lambda acc: torch.where(poly(acc) > 1.0, acc, 0.0 * acc).to(torch.bfloat16)):
        ep, graph = _plan(fn, out_dtype=F32, mode="always")
        assert graph is ep.graph


def test_two_many_term_polynomials_are_not_multiplied_out():
    # (x - 1)^3 expanded (x^3 - 3x^2 + 3x - 1) would cancel near x = 1
    assert _mul(Poly.make("x", {1: 1.0, 0: -1.0}), Poly.make("x", {1: 1.0, 0: -1.0})) is None
    ep, graph = _plan(lambda acc: (acc - 1.0) * (acc - 1.0) * (acc - 1.0))
    acc = 1.0 + torch.linspace(-1e-2, 1e-2, M * N).reshape(1, M, N)
    got = _run(graph, acc, {})[0].double()
    want = (acc.double() - 1.0) ** 3
    assert ((got - want).abs() <= 1e-6 * want.abs() + 1e-30).all()


def test_constants_fold_into_one_polynomial():
    x, t = object(), object()
    e = Prod(0.5, [Poly.make(x, {1: 1.0}), Poly.make(t, {0: 1.0, 2: -1.0}), Poly.make(x, {0: 1.0, 2: 0.25})])
    f = normal(e)
    by_atom = {p.atom: dict(p.coeffs) for p in f.factors}
    assert f.coef == 1.0 and len(f.factors) == 2             # x * (1 + x^2/4) is one polynomial, 1 - t^2 another
    # the 0.5 went into exactly one of them
    assert (by_atom[x], by_atom[t]) in (({1: 0.5, 3: 0.125}, {0: 1.0, 2: -1.0}), ({1: 1.0, 3: 0.25}, {0: 0.5, 2: -0.5}))


@pytest.mark.parametrize("fn", [lambda acc, C: acc * 2.0 + C - C,
                                lambda acc, C: (acc * 2.0 + C * C - C * C) * 0.5,   # C*C: one node, used twice
                                lambda acc, C: acc * 2.0 + (C - C) * 3.0])
def test_no_input_drops_out_of_the_kernel(fn):
    ep, graph = _plan(fn, C=evt.spec((M, N), BF16))
    assert any(n.op == "input" and n.target == "C" for n in graph.nodes)
    A = torch.randn(1, M, N)
    C = torch.randn(M, N).to(BF16)
    got, want = _run(graph, A, {"C": C})[0], _run(ep.graph, A, {"C": C})[0]
    torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=2 ** -8)


def test_same_values_as_the_original_graph():
    torch.manual_seed(0)
    pre = (torch.randn(M, N) * 3).to(BF16)
    acc = torch.randn(1, M, N)
    ep, graph = _plan(gelu_derivative, pre=evt.spec((M, N), BF16))
    got, want = _run(graph, acc, {"pre": pre}), _run(ep.graph, acc, {"pre": pre})
    # the derivative is rounded to bf16 before the product: at most one bf16 ulp apart (2^-8 relative), mostly equal
    d_got, d_want = got[0] / acc, want[0] / acc
    assert ((d_got - d_want).abs() <= 2 ** -8 * d_want.abs() + 1e-6).all()
    assert (d_got == d_want).float().mean() > 0.97


# ------------------------------------------------------------------------------------- random polynomial DAGs
@st.composite
def poly_dags(draw):
    """A random expression over atoms (acc, C, tanh(acc), an M-vector, a runtime scalar times acc) and constants, built from add / sub / mul / neg, rounded
    to bf16: as a program the rewrite must compute the same function as the original and the float64 trace."""
    # constant products and sums twice as likely as the rest; operands mostly the last few values (chains)
    ops = ["add", "sub", "mul", "neg", "cmul", "cadd", "cmul", "cadd", "mul", "cdiv", "pow2", "pow3"]
    steps = draw(st.lists(st.tuples(st.sampled_from(ops), st.integers(1, 4), st.integers(0, 50),
                                    st.sampled_from([0.5, -1.0, 3.0, 0.044715, 1.0, -0.25])),
                          min_size=2, max_size=12))

    def fn(acc, C, v, alpha):
        vals = [acc, C.to(acc.dtype), torch.tanh(acc), v[:, None].to(acc.dtype), alpha * acc]
        for op, i, j, c in steps:
            a, b = vals[-min(i, len(vals))], vals[j % len(vals)]
            vals.append({"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "neg": lambda: -a,
                         "cmul": lambda: c * a, "cadd": lambda: a + c, "cdiv": lambda: a / c,
                         "pow2": lambda: a ** 2, "pow3": lambda: torch.pow(a, 3)}[op]())
        return vals[-1].to(torch.bfloat16) if acc.dtype == torch.float32 else vals[-1]
    return fn, steps


@settings(max_examples=int(os.environ.get("EVT_REASSOC_EXAMPLES", 80)), deadline=None)
@given(poly_dags(), st.integers(0, 2 ** 16))
def test_random_polynomial_dags_match(case, seed):
    fn, _ = case
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn(1, M, N, generator=g)
    C = torch.randn(M, N, generator=g).to(BF16)
    v = torch.randn(M, generator=g).to(BF16)                      # an M-vector atom (axes M)
    inputs = {"C": C, "v": v, "alpha": 0.75}                      # alpha: a runtime scalar
    ep, graph = _plan(fn, C=evt.spec((M, N), BF16), v=evt.spec((M,), BF16), alpha=0.75)
    event("rewritten" if graph is not ep.graph else "unchanged")  # about half are rewritten (pytest --hypothesis-show-statistics)
    assert verify(graph) is None
    got = _run(graph, acc, inputs)[0].double()
    want = _run(ep.graph, acc, inputs)[0].double()
    exact = fn(acc.double(), C.double(), v.double(), 0.75)
    # reassociation moves float32 results by a few float32 ulps of the terms summed, which the bf16 rounding
    # turns into at most one bf16 ulp of the largest term's magnitude
    scale = 2 ** -7 * exact.abs().amax().clamp_min(1e-30)
    assert ((got - exact).abs() <= (want - exact).abs() + scale).all()
    assert _float_ops(graph) <= _float_ops(ep.graph)


# ------------------------------------------------------------------------------------- through Triton's interpreter
def poly_epilogue(acc, pre):
    x = pre.float()
    return (acc * (0.5 * x * (1.0 - 0.25 * x * x) * 2.0 + 3.0 * x * x)).to(pre.dtype)


def test_reassociated_program_runs_in_the_interpreter(monkeypatch):
    # the runtime asks for 'never' on CPU; 'auto' here makes it emit the reassociated graph, which (no tanh or
    # sigmoid in it) has no hardware approximation the interpreter could not run
    monkeypatch.setattr(rg, "fast_math_mode", lambda A: "auto")
    torch.manual_seed(1)
    A, B = torch.randn(48, 32).to(BF16), torch.randn(32, 40).to(BF16)
    pre = torch.randn(48, 40).to(BF16)
    ep = evt.trace(poly_epilogue, acc=evt.spec((48, 40), F32), pre=evt.spec((48, 40), BF16))
    prog = build_program(ep, out_dtype=BF16, fast_math="auto")
    assert "fast math: reassociated" in prog.source
    got = evt.gemm(A, B, poly_epilogue, pre=pre, backend="triton")  # outputs poisoned (EVTORCH_POISON, helpers)
    want = poly_epilogue(A.double() @ B.double(), pre.double()).float()
    assert torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1.6e-2)


def test_float64_epilogues_are_not_reassociated():
    ep = evt.trace(lambda acc: 0.5 * acc * (1.0 + acc * acc), acc=evt.spec((M, N), F64))
    graph, _ = fastmath.plan(ep, BF16, "always")
    assert graph is ep.graph


def test_knob_skips_it(monkeypatch):
    monkeypatch.setenv("EVTORCH_DISABLE_PASSES", "reassociate")   # read when the epilogue is traced
    ep, graph = _plan(gelu_aux, bias=evt.spec((N,), BF16))
    assert graph is ep.graph
    monkeypatch.delenv("EVTORCH_DISABLE_PASSES")
    assert fastmath.plan(ep, BF16, "auto")[0] is ep.graph          # the traced epilogue keeps its setting
    assert _plan(gelu_aux, bias=evt.spec((N,), BF16))[1] is not ep.graph
