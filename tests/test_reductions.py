"""Reductions (every registry reduction, every dim set, keepdim, negative dims, batched over L), the vector
stage, multi-output epilogues, DAG reuse and zero-size problems."""
from __future__ import annotations

import math

import pytest
import torch

import evtorch as evt
from evtorch.api import get_epilogue
from evtorch.ir.types import Stage
from evtorch.ops import REGISTRY
from evtorch.ops.registry import REDUCTION

from helpers import check_gemm, check_reference, eager_acc, operands, ops_in, rand, rand_int

M, N, K, L = 9, 7, 5, 3
REDUCTIONS = sorted(n for n, op in REGISTRY.ops.items() if op.has(REDUCTION))

DIMS_2D = [0, 1, -1, -2, (0, 1), (1, 0), (-1, -2), (), None]
DIMS_3D = [0, 1, 2, -1, -3, (0, 1), (0, 2), (1, 2), (0, 1, 2), (-3, -1), None]


def reducer(name, dim, keepdim, spelling="method"):
    """``z.<name>(dim, keepdim)`` (or ``torch.<name>(z, ...)``) as eager spells it."""
    def red(z):
        kw = {} if dim is None else {"dim": dim}
        if keepdim:
            kw["keepdim"] = True
        if spelling == "method":
            return getattr(z, name)(**kw)
        return getattr(torch, name)(z, **kw)
    return red


def _eager_accepts(red, shape):
    try:
        red(torch.zeros(shape))
        return True
    except (TypeError, RuntimeError):
        return False


def _cases(dims, shape):
    """(name, dim, keepdim) eager accepts (logsumexp without a dim is refused by eager: not in the contract)."""
    return [(n, d, k) for n in REDUCTIONS for d in dims for k in (False, True)
            if _eager_accepts(reducer(n, d, k), shape)]


@pytest.mark.parametrize("name, dim, keepdim", _cases(DIMS_2D, (2, 3)), ids=str)
def test_reduction_2d(name, dim, keepdim):
    for spelling in ("method", "torch"):
        red = reducer(name, dim, keepdim, spelling)

        def fn(acc, C, v):
            z = acc * C + v
            return z, red(z), red(torch.relu(acc))

        A, B = operands(M, N, K, seed=1)
        check_gemm(fn, A, B, C=rand((M, N), seed=2), v=rand((N,), seed=3), rtol=1e-5, atol=1e-5)
        check_reference(fn, rand((M, N), seed=4, edge=True), C=rand((M, N), seed=5, edge=True),
                        v=rand((N,), seed=6, edge=True))
        ep = get_epilogue(fn, (M, N), torch.float32, dict(C=rand((M, N)), v=rand((N,))))
        reds = ep.graph.find("reduce")
        assert reds and all(r.target == name and r.stage == Stage.VECTOR for r in reds)


@pytest.mark.parametrize("name, dim, keepdim", _cases(DIMS_3D, (2, 3, 4)), ids=str)
def test_reduction_batched(name, dim, keepdim):
    red = reducer(name, dim, keepdim)

    def fn(acc, C):
        return red(acc - C)

    A, B = operands(M, N, K, L=L, seed=7)
    check_gemm(fn, A, B, C=rand((L, 1, N), seed=8), rtol=1e-5, atol=1e-5)
    check_reference(fn, rand((L, M, N), seed=9, edge=True), C=rand((L, 1, N), seed=10, edge=True))


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduced_axes_in_ir(name):
    """Over N gives a per-row (M) result, over M per-column (N), over both a scalar; batched keeps L."""
    expect = {1: ("M",), 0: ("N",), (0, 1): ()}
    for dim, axes in expect.items():
        ep = evt.trace(lambda acc: getattr(torch, name)(acc, dim), acc=evt.spec((M, N)))
        (r,) = ep.graph.find("reduce")
        assert r.axes == axes and set(r.attrs["over"]) == {"M", "N"} - set(axes)
    ep = evt.trace(lambda acc: getattr(torch, name)(acc, (1, 2)), acc=evt.spec((L, M, N)))
    assert ep.graph.find("reduce")[0].axes == ("L",)


def test_reductions_of_views_and_merged_dims():
    def fn(acc):
        return acc.mT.sum(0), acc.reshape(L * M, N).amax(0), acc.reshape(L, M * N).mean(1), \
            torch.logsumexp(acc.permute(2, 0, 1), 0), acc.unsqueeze(0).sum(0), acc.sum(0, keepdim=True).mT

    A, B = operands(M, N, K, L=L, seed=11)
    check_gemm(fn, A, B)


def test_reduction_outputs_are_float32_for_any_input_dtype():
    def fn(acc, C, Ci):
        return (acc > 0).sum(1), Ci.sum(0), (acc * Ci).amax(), C.sum(1), acc.sum(1, dtype=acc.dtype)

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        A, B = operands(M, N, K, dtype, seed=12)
        got = check_gemm(fn, A, B, C=rand((M, N), dtype, seed=13), Ci=rand_int((M, N), -4, 4, seed=14))
        assert all(g.dtype == torch.float32 for g in got)
    A, B = operands(M, N, K, torch.float64, seed=12)
    got = check_gemm(fn, A, B, C=rand((M, N), torch.float64, seed=13), Ci=rand_int((M, N), -4, 4, seed=14))
    assert all(g.dtype == torch.float64 for g in got)



def test_reduction_dtype_and_repeated_dims_are_refused():
    """A reduction's ``dtype=`` other than the accumulator's was accepted and ignored (``acc.sum(1,
    dtype=torch.float16)`` came back float32), and ``sum((0, 0))`` ran where eager refuses a repeated dim (found by
    a probe, 2026-11-29). Both are named errors now; ``dtype=`` equal to the accumulator's still runs."""
    A, B = operands(M, N, K, seed=15)
    for fn, match in [(lambda acc: acc.sum(1, dtype=torch.float16), r"dtype=torch.float16 is not supported.*float32"),
                      (lambda acc: acc.mean(1, dtype=torch.float64), r"dtype=torch.float64 is not supported"),
                      (lambda acc: acc.sum((0, 0)), r"names a dim more than once"),
                      (lambda acc: acc.amax((1, -1)), r"names a dim more than once")]:
        with pytest.raises(evt.EpilogueError, match=match):
            evt.gemm(A, B, fn)


def test_reduction_edge_cases():
    """inf - inf in a sum is NaN, NaN propagates through amax/amin, a row of -inf has logsumexp -inf."""
    acc = torch.tensor([[1.0, math.inf, -math.inf, 2.0],
                        [math.nan, 1.0, 2.0, 3.0],
                        [-math.inf, -math.inf, -math.inf, -math.inf],
                        [math.inf, 1.0, 0.0, -1.0],
                        [1e30, 1e30, -1e30, 3.0]])

    def fn(acc):
        return [f(acc, d) for f in (torch.sum, torch.amax, torch.amin, torch.mean, torch.logsumexp) for d in (0, 1)]

    check_reference(fn, acc)
    check_reference(fn, acc.double())


def _check_min_max_propagate_nan(deterministic, device, Mr=37, Nr=45, Kr=19, dtype=torch.float32, config=None):
    C = rand((Mr, Nr), torch.float32, seed=31)
    C[3, 5] = math.nan       # row 3 and column 5 see a NaN
    C[20, :] = -math.inf     # a row that is -inf everywhere except where acc makes it NaN
    C[:, 40] = math.inf

    def fn(acc, C):
        z = acc + C
        return (z.amax(0), z.amax(1), z.amin(0), z.amin(1), z.amax(), torch.logsumexp(z, 1), torch.relu(z),
                torch.relu(-z).amax(0))

    A, B = operands(Mr, Nr, Kr, dtype, seed=32)
    A, B, C = A.to(device), B.to(device), C.to(device)
    extra = {} if config is None else {"config": config}
    runner = lambda A, B, fn, **kw: evt.gemm(A, B, fn, backend="triton", deterministic=deterministic,  # noqa
                                             **extra, **kw)
    got = check_gemm(fn, A, B, runner=runner, C=C)
    assert got[0][5].isnan() and got[1][3].isnan() and got[4].isnan() and not got[0][4].isnan()


@pytest.mark.parametrize("deterministic", [False, True])
def test_generated_min_max_propagate_nan(deterministic):
    """The generated kernel (not only the reference) lets NaN win in amax / amin / logsumexp over every axis set
    and keeps it through relu, in both combine modes and on ragged tiles: the tile reduction runs as floats with
    NaN-propagating max / min, and only its result becomes the atomics' integer key. A +inf element makes
    logsumexp +inf (not inf - inf = NaN), and a NaN stays NaN whichever tile holds it."""
    _check_min_max_propagate_nan(deterministic, "cpu")


@pytest.mark.parametrize("deterministic", [False, True])
def test_vector_stage_logsumexp_of_inf(deterministic):
    """A logsumexp inside the vector stage (over a reduced vector): +inf in it gives +inf, -inf everywhere -inf."""
    Mr, Nr = 33, 20
    r = rand((Mr,), torch.float32, seed=33)
    r[7] = math.inf
    A, B = operands(Mr, Nr, 11, seed=34)

    def fn(acc, r, q):
        return torch.logsumexp(acc.amax(1) + r, 0), torch.logsumexp(acc.sum(1) * 0 + q, 0)

    q = torch.full((Mr,), -math.inf)
    runner = lambda A, B, fn, **kw: evt.gemm(A, B, fn, backend="triton", deterministic=deterministic, **kw)  # noqa
    got = check_gemm(fn, A, B, runner=runner, r=r, q=q)
    assert got[0].item() == math.inf and got[1].item() == -math.inf


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype,template", [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.bfloat16, "pingpong")])
def test_gpu_min_max_propagate_nan(deterministic, dtype, template):
    """The same on the GPU (max.NaN / min.NaN, integer-key atomics) over several ragged tiles: the heuristic's
    template, and the Gluon ping-pong kernel (persistent_tma where it does not apply)."""
    from evtorch.codegen.configs import GemmConfig

    config = None if template is None else GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4,
                                                      (("EPILOGUE_SUBTILE", 2),))
    _check_min_max_propagate_nan(deterministic, "cuda", 300, 520, 72, dtype, config)


def test_reductions_are_deterministic():
    fn = lambda acc: (acc.sum(0), torch.logsumexp(acc, 1), acc.mean())  # noqa: E731
    A, B = operands(129, 65, 33, seed=15)
    first = evt.gemm(A, B, fn)
    for _ in range(2):
        again = evt.gemm(A, B, fn)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# ------------------------------------------------------------------------------------------------ vector stage
def test_vector_stage_cross_entropy():
    """``(lse - target_logit).mean()`` with the target gathered by col_index and an integer target."""
    def ce(acc, target):
        lse = torch.logsumexp(acc, dim=1)
        target_logit = torch.where(evt.col_index(acc) == target[:, None], acc, 0).sum(1)
        return (lse - target_logit).mean()

    A, B = operands(M, N, K, seed=16)
    target = rand_int((M,), 0, N, seed=17)
    got = check_gemm(ce, A, B, target=target)
    torch.testing.assert_close(got, torch.nn.functional.cross_entropy(eager_acc(A, B), target), rtol=1e-5,
                               atol=1e-6)
    ep = evt.trace(ce, acc=evt.spec((M, N)), target=target)
    assert ep.has_vector_stage
    vec = [n for n in ep.graph.nodes if n.stage == Stage.VECTOR and n.op == "compute"]
    assert [n.target for n in vec] == ["sub"]
    assert {n.target for n in ep.graph.find("reduce")} == {"logsumexp", "sum", "mean"}


def test_vector_stage_values():
    def fn(acc, alpha, v, w, C):
        s = acc.sum(1)
        m = acc.amax(1)
        return s * alpha + v, s / m, torch.exp(acc.amax(0) - acc.amin(0)) * w + 1, (s * 2).sum(), \
            acc.sum(1, keepdim=True) * 2, (C * acc).mean(0) - w.mean()

    A, B = operands(M, N, K, seed=18)
    kw = dict(alpha=0.5, v=rand((M,), seed=19), w=rand((N,), seed=20), C=rand((M, N), seed=21))
    check_gemm(fn, A, B, **kw)
    ep = get_epilogue(fn, (M, N), torch.float32, kw)
    assert ep.has_vector_stage
    assert [o.kind for o in ep.outputs] == ["vector"] * 6


def test_vector_stage_batched():
    def fn(acc, v):
        per_batch = acc.sum((1, 2))
        return per_batch * v, (acc.sum(2) - acc.mean(2)).mean(0), torch.logsumexp(acc, 0).amax()

    A, B = operands(M, N, K, L=L, seed=22)
    check_gemm(fn, A, B, v=rand((L,), seed=23))


def test_bce_loss_dag():
    """The issue's BCE-loss DAG: one scalar, computed once per use of z (a DAG, not a tree)."""
    def bce(acc, C, b):
        z = acc + b[:, None]
        return ((C - 1) * z + torch.log(torch.clamp(torch.sigmoid(z), 1e-3, 0.999))).sum()

    A, B = operands(M, N, K, seed=24)
    kw = dict(C=(rand((M, N), seed=25) > 0).float(), b=rand((M,), seed=26))
    check_gemm(bce, A, B, **kw)
    ep = get_epilogue(bce, (M, N), torch.float32, kw)
    adds = [n for n in ep.traced.nodes if n.op == "compute" and n.target == "add" and ep.traced.nodes[0] in n.args]
    assert len(adds) == 1, "z = acc + b[:, None] is one node used twice"


# ------------------------------------------------------------------------------------------------ multi-output, reuse
def test_multi_output_issue_example():
    def epi(acc, C, bias, alpha, beta):
        z = alpha * acc + beta * C + bias[:, None]
        D = torch.relu(z)
        return D, D.sum(dim=1)

    for dtype in (torch.float16, torch.float32):
        A, B = operands(M, N, K, dtype, seed=27)
        C, bias = rand((M, N), dtype, seed=28), rand((M,), dtype, seed=29)
        D, rowsum = check_gemm(epi, A, B, C=C, bias=bias, alpha=1.5, beta=0.5)
        assert D.dtype == dtype and rowsum.dtype == torch.float32 and rowsum.shape == (M,)


def test_single_and_list_returns_keep_their_convention():
    A, B = operands(M, N, K, seed=30)
    assert isinstance(evt.gemm(A, B, lambda acc: acc), torch.Tensor)
    assert isinstance(evt.gemm(A, B, lambda acc: (acc,)), tuple)
    got = evt.gemm(A, B, lambda acc: [acc, acc.sum()])
    assert isinstance(got, list) and len(got) == 2  # as eager returns it (a tuple before 2026-11-29)
    check_gemm(lambda acc: (acc, acc, acc.sum(1), acc.sum(1)), A, B)  # the same value returned twice


def test_dag_reuse_one_node_per_computation():
    def fn(acc, C):
        z = acc * 2 + C
        y = torch.sigmoid(z)
        return z, y * z, torch.sigmoid(z) + torch.sigmoid(acc * 2 + C), y.sum(1), z.sum(1), (acc * 2 + C).sum(dim=1)

    A, B = operands(M, N, K, seed=31)
    C = rand((M, N), seed=32)
    check_gemm(fn, A, B, C=C)
    ep = evt.trace(fn, acc=evt.spec((M, N)), C=C)
    g = ep.graph
    assert len(g.find("acc")) == 1 and len(g.find("input", "C")) == 1
    assert sum(1 for n in g.nodes if n.op == "compute" and n.target == "sigmoid") == 1
    assert ops_in(g, "fma") == ["fma"] and ops_in(g, "add") == ["add"]  # z (fused), sigmoid(z) + sigmoid(z)
    sums = [n for n in g.find("reduce") if n.target == "sum" and n.args[0] is g.outputs[0].args[0]]
    assert len(sums) == 1, "z.sum(1) and (acc * 2 + C).sum(dim=1) are one reduction"
    assert g.outputs[4].args[0] is g.outputs[5].args[0]


# ------------------------------------------------------------------------------------------------ zero sizes
ZERO_FN = lambda acc, C, v: (acc + C + v, (acc * v).sum(-1), acc.sum(-2), acc.mean(), acc.mT)  # noqa: E731


@pytest.mark.parametrize("m, n, k", [(0, N, K), (M, 0, K), (M, N, 0), (0, 0, 0), (0, N, 0)])
@pytest.mark.parametrize("batched", [False, True])
def test_zero_size_problems(m, n, k, batched):
    A, B = operands(m, n, k, L=L if batched else None, seed=33)
    lead = (L,) if batched else ()
    got = check_gemm(ZERO_FN, A, B, C=rand(lead + (m, n), seed=34), v=rand((n,), seed=35))
    full = lead + (m, n)
    assert got[0].shape == full and got[1].shape == lead + (m,) and got[2].shape == lead + (n,)
    assert got[3].shape == () and got[4].shape == lead + (n, m)
    if k == 0:
        assert torch.equal(got[0], (rand(full, seed=34) + rand((n,), seed=35)))
    if m == 0 or k == 0:
        assert torch.all(got[2] == 0)  # column sums over no rows / of zero products


def test_zero_size_amax_is_its_identity():
    """torch refuses amax over an empty dim; a fused reduction returns the identity (-inf / +inf)."""
    A, B = operands(0, N, K, seed=36)
    mx, mn, s = evt.gemm(A, B, lambda acc: (acc.amax(0), acc.amin(0), acc.sum(0)))
    assert torch.all(mx == -math.inf) and torch.all(mn == math.inf) and torch.all(s == 0)
    A, B = operands(0, 0, K, L=0, seed=36)
    assert evt.gemm(A, B, lambda acc: acc.sum(0)).shape == (0, 0)


def test_empty_batch():
    A, B = operands(M, N, K, L=0, seed=37)
    got = check_gemm(lambda acc, C: (acc + C, acc.sum((0, 2))), A, B, C=rand((M, N), seed=38))
    assert got[0].shape == (0, M, N) and torch.all(got[1] == 0)


def test_outputs_pruning_returns_none_for_unwanted():
    def fn(acc, C):
        D = torch.relu(acc + C)
        return D, D.sum(1), torch.exp(acc).amax(0)

    A, B = operands(M, N, K, seed=39)
    C = rand((M, N), seed=40)
    for keep in ((0,), (1,), (2,), (0, 2), (1, 2)):
        got = check_gemm(fn, A, B, C=C, outputs=keep)
        assert [g is not None for g in got] == [i in keep for i in range(3)]
    assert [g is not None for g in evt.gemm(A, B, fn, C=C, outputs=-1)] == [False, False, True]  # Python-style
    assert [g is not None for g in evt.gemm(A, B, fn, C=C, outputs=[0, -2])] == [True, True, False]
    ep = get_epilogue(fn, (M, N), torch.float32, {"C": C}, keep=(1,))
    assert not any(n.target == "exp" for n in ep.graph.nodes if n.op == "compute")
    assert [o.target for o in ep.graph.outputs] == [1]
