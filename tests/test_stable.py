"""The stable-forms pass (passes/stable.py) and the op it introduces, logsigmoid: which graphs it rewrites and which
it must leave alone, and that the rewritten kernels (Triton interpreter) match float64 where eager fp32 does not."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import evtorch as evt
from evtorch.codegen import tlmath
from evtorch.examples import bce_loss
from evtorch.passes.base import FACTS
from evtorch.passes.stable import StableForms, value_range

from helpers import ops_in

M, N = 6, 5
BF16 = torch.bfloat16


def optimized(fn, **inputs):
    inputs.setdefault("acc", evt.spec((M, N)))
    return evt.trace(fn, debug=True, **inputs).graph


def traced(fn, **inputs):
    inputs.setdefault("acc", evt.spec((M, N)))
    return evt.trace(fn, **inputs).traced


def const_values(graph):
    return sorted(n.target for n in graph.nodes if n.op == "const" and isinstance(n.target, float))


# -------------------------------------------------------------------------------------------------- rewrites
def test_bce_loss_becomes_clamped_logsigmoid():
    g = optimized(bce_loss, C=evt.spec((M, N), BF16), b=evt.spec((M,), BF16))
    ops = ops_in(g)
    assert "logsigmoid" in ops and "log" not in ops and "sigmoid" not in ops
    (clamp,) = [n for n in g.nodes if n.op == "compute" and n.target == "clamp"]
    assert clamp.args[0].target == "logsigmoid"
    # the logs of the float32 bounds, as eager's log(clamp(...)) computes them
    lo, hi = clamp.args[1].target, clamp.args[2].target
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    assert lo == pytest.approx(math.log(f32(1e-3)), rel=1e-7) and hi == pytest.approx(math.log(f32(0.999)), rel=1e-6)


def test_log_one_minus_sigmoid_is_logsigmoid_of_negation():
    g = optimized(lambda acc: torch.log(1 - torch.sigmoid(acc)))
    (ls,) = [n for n in g.nodes if n.op == "compute" and n.target == "logsigmoid"]
    assert ls.args[0].target == "neg" and ls.args[0].args[0].op == "acc"
    # of an already negated value: no double negation
    g = optimized(lambda acc: torch.log(1 - torch.sigmoid(-acc)))
    (ls,) = [n for n in g.nodes if n.op == "compute" and n.target == "logsigmoid"]
    assert ls.args[0].op == "acc"


def test_binary_cross_entropy_both_halves_clamped():
    def bce(acc, y):
        p = torch.clamp(torch.sigmoid(acc), 1e-4, 1 - 1e-4)
        q = torch.clamp(1 - torch.sigmoid(acc), min=1e-4)
        return -(y * torch.log(p) + (1 - y) * torch.log(q)).mean()
    g = optimized(bce, y=evt.spec((M, N)))
    assert ops_in(g).count("logsigmoid") == 2 and "log" not in ops_in(g) and "sigmoid" not in ops_in(g)


@pytest.mark.parametrize("name, fn, inputs", [
    # x may be negative: eager's log(clamp(x, lo, hi)) is log(lo) there, the hoisted form would be NaN
    ("maybe_negative", lambda acc: torch.log(torch.clamp(acc, 0.1, 2.0)), {}),
    # a negative lower bound: log(lo) is NaN
    ("negative_bound", lambda acc: torch.log(torch.clamp(torch.sigmoid(acc), -1.0, 0.5)), {}),
    # tensor bounds are not folded
    ("tensor_bound", lambda acc, C: torch.log(torch.clamp(torch.sigmoid(acc), C)), {"C": evt.spec((M, N))}),
    # eager rounds sigmoid(C) to bf16 before the log: fusing would skip that rounding
    ("bf16_between", lambda acc, C: acc * torch.log(torch.sigmoid(C)), {"C": evt.spec((M, N), BF16)}),
    # 2 - sigmoid is not 1 - sigmoid
    ("two_minus", lambda acc: torch.log(2 - torch.sigmoid(acc)), {}),
])
def test_left_alone(name, fn, inputs):
    before, after = traced(fn, **inputs), optimized(fn, **inputs)
    assert "logsigmoid" not in ops_in(after)
    assert ops_in(after).count("log") == ops_in(before).count("log")


def test_stable_fact_names_the_node():
    g = traced(lambda acc: torch.log(torch.sigmoid(acc)))
    assert "log of sigmoid" in FACTS["stable"](g)
    g = StableForms().run(g)
    assert FACTS["stable"](g) is None


def test_value_range():
    g = traced(lambda acc: (torch.sigmoid(acc), 1 - torch.sigmoid(acc), torch.clamp(torch.exp(acc), 0.5, 3.0),
                            torch.clamp(acc, max=2.0), -torch.relu(acc)))
    outs = [o.args[0] for o in g.outputs]
    assert [value_range(n) for n in outs] == [(0.0, 1.0), (0.0, 1.0), (0.5, 3.0), (-math.inf, 2.0),
                                              (-math.inf, -0.0)]


# -------------------------------------------------------------------------------------------------- numerics
@triton.jit
def _apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tlmath.logsigmoid(x), mask=offs < n)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 6e-7), (torch.float64, 1e-14)], ids=["f32", "f64"])
def test_logsigmoid_emission_against_float64(dtype, rtol):
    x = torch.cat([torch.linspace(-120, 60, 4001, dtype=torch.float64), torch.randn(2000, dtype=torch.float64) * 4,
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.0, 103.0, -103.0, -1e4])]).to(dtype)
    y = torch.full_like(x, float("nan"))
    _apply[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    want = F.logsigmoid(x.double())
    # relative to max(|want|, smallest normal): results below it may flush to zero (ex2.approx.ftz on the GPU)
    rel = ((y.double() - want).abs() / want.abs().clamp_min(torch.finfo(dtype).tiny)).max().item()
    assert rel < rtol, rel
    special = torch.tensor([-math.inf, math.inf, math.nan], dtype=dtype)
    y = torch.full_like(special, 7.0)
    _apply[(1,)](special, y, 3, BLOCK=4)
    assert y[0] == -math.inf and y[1] == 0 and math.isnan(y[2])


@pytest.mark.interpreter
def test_fused_kernel_is_exact_where_eager_fp32_underflows():
    """log(sigmoid(z)) for z down to -150: eager fp32 gives -inf below z = -103.9; the fused kernel (Triton
    interpreter) gives logsigmoid. Tolerance: the fp32 rounding of z itself (~4e-6 relative in exp(-z) at z = 33)."""
    torch.manual_seed(0)
    A = torch.randn(24, 16)
    B = torch.randn(16, 20)
    shift = torch.linspace(-150, 40, 24)
    fn = lambda acc, s: torch.log(torch.sigmoid(acc + s[:, None]))  # noqa: E731
    got = evt.gemm(A, B, fn, s=shift, backend="triton")
    want = F.logsigmoid(A.double() @ B.double() + shift.double()[:, None])
    assert torch.isinf(fn(A @ B, shift)).any()          # eager underflows
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


@pytest.mark.interpreter
def test_clamped_bce_matches_float64():
    torch.manual_seed(1)
    A, B = torch.randn(40, 32), torch.randn(32, 24)
    C = (torch.rand(40, 24) > 0.5).float()
    b = torch.randn(40)
    got = evt.gemm(A, B, bce_loss, C=C, b=b, backend="triton")
    want = bce_loss(A.double() @ B.double(), C.double(), b.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


# -------------------------------------------------------------------------------------------------- GPU
@triton.jit
def _apply_both(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tlmath.logsigmoid(x), mask=offs < n)
    tl.store(z_ptr + offs, tlmath.logsigmoid_approx(x), mask=offs < n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_logsigmoid_emissions_against_float64():
    """Both emissions on the GPU (tl.exp and the divide; ex2.approx and rcp.approx): as accurate as the fp32 exp of
    x's rounding allows (|x| <= 30: ~2.6e-6 relative where the result is -exp(-x)), and the approximation within a
    few ulp of the accurate one (why it is fast_exact)."""
    x = torch.cat([torch.linspace(-120, 90, 1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda") * 4])
    y, z = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    _apply_both[(triton.cdiv(x.numel(), 1024),)](x, y, z, x.numel(), BLOCK=1024)
    want = F.logsigmoid(x.double())
    # results near and below fp32's smallest normal (x > 87) may flush to zero (ex2 / divide with ftz): an absolute
    # error below 2^-120 there
    normal = want.abs() > 2.0 ** -120
    small = x.abs() <= 30
    for got in (y, z):
        err = (got.double() - want).abs()
        rel = err / want.abs()
        assert rel[small].max().item() < 4e-6 and rel[normal].max().item() < 1.5e-5, rel[normal].max().item()
        assert err[~normal].max().item() < 2.0 ** -120
    assert ((z.double() - y.double()).abs() / y.double().abs())[small].max().item() < 2e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fast_math", ["never", "auto"])
def test_gpu_bce_loss_against_float64(fast_math, monkeypatch):
    monkeypatch.setenv("EVTORCH_FAST_MATH", fast_math)
    monkeypatch.setenv("EVTORCH_POISON", "1")
    torch.manual_seed(0)
    M, N, K = 1024, 768, 512
    A = (torch.randn(M, K, device="cuda") / K ** 0.25).to(BF16)
    B = (torch.randn(K, N, device="cuda") / K ** 0.25).to(BF16)
    C = (torch.rand(M, N, device="cuda") > 0.5).to(BF16)
    b = torch.randn(M, device="cuda", dtype=BF16)
    got = evt.gemm(A, B, bce_loss, C=C, b=b)
    want = bce_loss(A.double() @ B.double(), C.double(), b.double())
    assert abs(got.double().item() - want.item()) / abs(want.item()) < 1e-5


# -------------------------------------------------------------------------------------------------- the knob
def test_disable_passes_knob(monkeypatch):
    """EVTORCH_DISABLE_PASSES skips optional passes (A/B measurements: benchmarks/ab_check.py); the traced-epilogue
    and call caches key on it, so switching it in one process switches the program."""
    from evtorch.api import get_epilogue
    from evtorch.passes.pipeline import default_passes

    assert "stable" not in [p.name for p in default_passes(disabled={"stable"})]
    with pytest.raises(ValueError, match=r"cannot skip cse; the passes that can be skipped are stable, fuse_fma"):
        default_passes(disabled={"cse", "stable"})
    inputs = dict(C=torch.rand(M, N), b=torch.randn(M))
    assert "logsigmoid" in ops_in(get_epilogue(bce_loss, (M, N), torch.float32, inputs).graph)
    monkeypatch.setenv("EVTORCH_DISABLE_PASSES", " stable ")
    ops = ops_in(get_epilogue(bce_loss, (M, N), torch.float32, inputs).graph)
    assert "logsigmoid" not in ops and "log" in ops and "sigmoid" in ops
    A, B = torch.randn(M, 3), torch.randn(3, N)
    want = bce_loss(A.double() @ B.double(), inputs["C"].double(), inputs["b"].double())
    off = evt.gemm(A, B, bce_loss, backend="reference", **inputs)
    monkeypatch.delenv("EVTORCH_DISABLE_PASSES")
    on = evt.gemm(A, B, bce_loss, backend="reference", **inputs)
    torch.testing.assert_close(off.double(), want, rtol=1e-5, atol=0)
    torch.testing.assert_close(on.double(), want, rtol=1e-5, atol=0)
    from evtorch.api import _calls
    eps = [hit[0] for key, hit in _calls.items() if key[0] is bce_loss and key[7] == A.shape]
    assert sorted("logsigmoid" in ops_in(ep.graph) for ep in eps) == [False, True]
    monkeypatch.setenv("EVTORCH_DISABLE_PASSES", "split_stages")
    with pytest.raises(ValueError, match="cannot skip split_stages"):
        evt.gemm(A, B, bce_loss, backend="reference", **inputs)
