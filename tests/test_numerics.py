"""Eager's numerics where a rewrite or an emission could change them: promotion and the dtype an op computes in,
integer wrapping, constants' rounding, rounding-sensitive decompositions. Each case was found wrong by a probe of
the passes and code generation on 2026-11-29 and is compared with eager bit for bit, on both backends (the
accumulator is exact: K = 1 and ones)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt

pytestmark = pytest.mark.interpreter
BACKENDS = ["reference", "triton"]
t = torch.tensor


def _check(fn, A, B, backend, **inputs):
    got, want = evt.gemm(A, B, fn, backend=backend, **inputs), fn(A @ B, **inputs)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for g, w in zip(got, want):
        w = w.to(g.dtype)  # full-size outputs take A.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        if g.dtype.is_floating_point:
            real = ~torch.isnan(w)
            assert torch.equal(torch.signbit(g[real]), torch.signbit(w[real])), (g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ops_compute_in_the_dtype_eager_promotes_to(backend):
    """A float32 op in a float64 epilogue computed in float64: an int input and a constant entered unrounded
    (16777219 - 16777216.0 gave 3, eager 4; C32 * 0.1 used the double 0.1); a 0-d float64 tensor, which does not
    promote a float32 one, made a float32 comparison float64 (acc == s false for s = 0.1)."""
    one64 = torch.ones(1, 1, dtype=torch.float64)
    _check(lambda acc, I, C: (I - 16777216.0, I == 16777220.0, C * 0.1), one64, one64, backend,
           I=t([[16777219]]), C=t([[3.3]]))
    _check(lambda acc, s: (acc == s, acc + s, acc * s > 0.1), t([[1.0]]), t([[0.1]]), backend,
           s=t(0.1, dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_results_wrap_in_their_own_width(backend):
    """int8 + a Python int and int8 * a 0-d int64 computed in int64 came back unwrapped on the triton backend;
    add / sub with an integer alpha computed in float."""
    one = torch.ones(1, 1)
    _check(lambda acc, I, k, s: ((I + k).float(), (I * s) > 0, (I - 3 * k).float()), one, one, backend,
           I=t([[127]], dtype=torch.int8), k=100, s=t(2))
    _check(lambda acc, J: (torch.add(J, J, alpha=2), torch.sub(J, J, alpha=3)), one, one, backend,
           J=t([[2 ** 31 - 1]], dtype=torch.int32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_constants_are_rounded_once_to_their_dtype(backend):
    """full_like(acc64, 0.1) went through a float32 constant (1.1000000015 for 1 + 0.1)."""
    one64 = torch.ones(1, 1, dtype=torch.float64)
    _check(lambda acc: (acc + torch.full_like(acc, 0.1), acc + torch.ones_like(acc) * 0.1), one64, one64, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_sensitive_forms_follow_eager(backend):
    """round() of odd integers from 2^23 (x + 0.5 rounds there); hardsigmoid near -3 (x / 6 + 0.5 cancelled, 25%
    off); a 16-bit value times a 0-d float32 tensor (the reference rounded the scalar to 16 bits first)."""
    one = torch.ones(1, 6)
    _check(lambda acc, C: torch.round(C), torch.ones(1, 1), one, backend,
           C=t([[8388609., -8388611., 16777215., 2.5, -0.5, 1e30]]))
    _check(lambda acc, C: F.hardsigmoid(C), torch.ones(1, 1), one, backend,
           C=t([[-2.9999998, -2.5, 2.9999998, 0.3, -7.0, 3.0]]))
    _check(lambda acc, C, s: (C * s).float(), torch.ones(1, 1), torch.ones(1, 1), backend, C=t([[3.0]]).half(),
           s=t(0.1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sub_with_alpha_is_not_simplified_as_plain_sub(backend):
    """torch.sub(x, 0.0, alpha=-1) is x + 0.0, +0.0 for x = -0.0; simplify folded it to x."""
    _check(lambda acc, C: torch.sub(C, 0.0, alpha=-1), torch.ones(1, 1), torch.ones(1, 2), backend,
           C=t([[-0.0, 1.5]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float_scalar_meets_float64_ops_unrounded(backend):
    """``acc.double() * s`` in a float32 GEMM: eager multiplies by the Python float's double; the kernel took the
    argument as float32 (1.5e-9 off for s = 0.1, found by a probe). It is now a float64 argument where float64 ops
    read it, and float32 ops still take it rounded to float32, as eager's do."""
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(8, 5, generator=g), torch.randn(5, 6, generator=g)
    D = torch.randn(8, 6, generator=g, dtype=torch.float64)
    fn = lambda acc, s, D: (acc.double() * s, D * s, acc * s, acc.double() > s, acc + s)  # noqa: E731
    got = evt.gemm(A, B, fn, s=0.1, D=D, backend=backend, out_dtype=torch.float64)
    want = fn(A @ B, 0.1, D)
    for i, (a, w) in enumerate(zip(got, want)):
        assert torch.equal(a, w.to(a.dtype)), i


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_powers_from_five_are_products(backend):
    """x ** 5 .. x ** 32 went through exp2(p * log2|x|): 3.0 ** 5 was 242.99997, up to 14 ulps off; now repeated
    squares in float64, rounded once: exact where the power is, the signs of negative bases and zeros and the
    infinities as eager's, and within an ulp of eager's powf elsewhere."""
    C = t([[3.0, -2.0, -0.0, float("inf"), 1.5, -1.25, 0.5, float("-inf")]])
    _check(lambda acc, C: (C ** 5, C ** 6, C ** 7, C ** 13, torch.pow(C, 32)), torch.ones(1, 1),
           torch.ones(1, 8), backend, C=C)
    R = torch.rand(1, 500, generator=torch.Generator().manual_seed(0)) * 4 - 2
    for p in (5, 11, 32):
        got = evt.gemm(torch.ones(1, 1), torch.ones(1, 500), lambda acc, C: C ** p, backend=backend, C=R)
        assert ((got - R ** p).abs() / (R ** p).abs().clamp_min(1e-30)).max() < 1.2e-7


def _ulps(got, want):
    """|got - want| in units of want's last place (finite, non-zero wants)."""
    step = (want.nextafter(torch.full_like(want, float("inf"))) - want).abs()
    return ((got - want).abs() / step).max().item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_general_powers_are_within_an_ulp_of_eagers_pow(backend):
    """x ** p for the exponents eager computes with pow (non-integers, 4, -3, and integers beyond 32): exp2(p *
    log2|x|) in float32 was up to 100 ulps off (x ** 40) and 35 at x ** 2.7; float32 values now go through float64
    and are rounded once, and integers up to 32 in magnitude are float64 squares (a reciprocal for negative ones).
    The edge values (signed zeros, infinities, NaN, negative bases) are eager's bit for bit."""
    g = torch.Generator().manual_seed(0)
    # 1024 values: eager's CPU pow takes its vectorized path for all of them, which rounds the exponent to float32
    # as the CUDA kernel does (a scalar tail would use the double exponent: x ** 2.7 up to 8 ulps away)
    R = torch.cat([torch.rand(1, 624, generator=g) * 20, torch.rand(1, 200, generator=g) * 1e-3,
                   torch.rand(1, 200, generator=g) * 1e4], 1)
    for p in (2.7, -1.3, 0.33, 1.5, -2.5, 0.1, 4, -3, -4, -7, 33, 40, -35):
        got = evt.gemm(torch.ones(1, 1), torch.ones(1, R.shape[1]), lambda acc, C: C ** p, backend=backend, C=R)
        want = R ** p
        real = torch.isfinite(want) & (want != 0)
        assert _ulps(got[real], want[real]) <= 1, p
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got == 0, want == 0), p
        if backend == "triton":   # and correctly rounded but for ties: within half an ulp and a little
            exact = (R.double() ** torch.tensor(p, dtype=torch.float32).item()).float()
            assert _ulps(got[real], exact[real]) <= 1 and (got == exact).float().mean() > 0.999, p
    C = t([[0.0, -0.0, float("inf"), float("-inf"), float("nan"), -2.0, -0.5, 1.0, -1.0, 3e38, 1e-45]])
    _check(lambda acc, C: (C ** 2.5, C ** -2.5, C ** 33, C ** 34, C ** -33, C ** -4, C ** 4, C ** -3),
           torch.ones(1, 1), torch.ones(1, C.shape[1]), backend, C=C)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16bit_powers_exponent_is_rounded_to_its_dtype_as_eagers(backend, dtype):
    """Eager converts the exponent to a 16-bit tensor's dtype on every device: bf16 ``x ** 2.7`` is ``x ** 2.703125``
    (2.5% above the unrounded power at x = 5937) and ``x ** 257`` is ``x ** 256``; the triton backend used the
    unrounded exponent. Bit for bit against eager (1024 values: eager's vectorized path)."""
    g = torch.Generator().manual_seed(1)
    C = (torch.rand(1, 1024, generator=g) * (60 if dtype == torch.float16 else 6000)).to(dtype)
    _check(lambda acc, C: (C ** 2.7, C ** -1.3, C ** 0.33), torch.ones(1, 1), torch.ones(1, 1024), backend, C=C)
    _check(lambda acc, C: C ** 257, torch.ones(1, 1), torch.ones(1, 1024), backend, C=1 + C / 6000)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [2.7, -1.3, 1.001, 3])
def test_a_16bit_powers_gradient_is_eagers(backend, p):
    """torch's pow_backward is ``grad * (p * x.pow(p - 1))`` with ``p`` as given, which a bfloat16 ``x`` rounds
    only inside ``pow``: the rule multiplied by the rounded exponent (2.703125 for 2.7, 1 for 1.001: the gradient
    then passed ``g`` unchanged) and in another order, a bf16 ulp off in about a quarter of the values. Bit for
    bit against eager's autograd (1024 values: eager's vectorized path)."""
    g = torch.Generator().manual_seed(2)
    C = (torch.rand(1, 1024, generator=g) * 8 + 0.5).bfloat16()
    G = torch.randn(1, 1024, generator=g).bfloat16()
    X = C.clone().requires_grad_()
    evt.gemm(torch.ones(1, 1), torch.ones(1, 1024), lambda acc, C: C ** p, backend=backend, C=X).backward(G.float())
    Y = C.clone().requires_grad_()
    (Y ** p).float().backward(G.float())
    assert torch.equal(X.grad, Y.grad), (X.grad - Y.grad).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_maximum_and_minimum_return_the_first_operand_on_a_tie(backend):
    """Eager's maximum / minimum return the first operand on a tie (-0.0 against 0.0); the triton backend returned
    the second, and CSE merged maximum(X, Y) with maximum(Y, X) as commutative."""
    X, Y = t([[0.0, -0.0, 1.0, float("nan")]]), t([[-0.0, 0.0, 1.0, 2.0]])
    _check(lambda acc, X, Y: (torch.maximum(X, Y), torch.maximum(Y, X), torch.minimum(X, Y), torch.minimum(Y, X)),
           torch.ones(1, 1), torch.ones(1, 4), backend, X=X, Y=Y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_that_are_not_full_size_are_float32(backend):
    """A tile-stage output that does not walk both M and N (``row * 2`` of an (N,) input, ``col * 2``, a 0-d
    input's ``s * 2``, a sum or amax over a size-1 dim) is stored in float32 like a reduction's, not in A's dtype:
    a float16 GEMM rounded them to float16 (found by a probe, 2026-11-29). Full-size outputs keep A's dtype. Also
    under autograd (the operator's layouts read the same rule)."""
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(6, 5, generator=g).half(), torch.randn(5, 7, generator=g).half()
    row, col, s = torch.randn(7, generator=g) + 1e-4, torch.randn(6, 1, generator=g) + 1e-4, torch.tensor(1.0001)

    def fn(acc, row, col, s):
        return row * 2, col * 2, s * 2, col.sum(1), col.amax(1, keepdim=True), acc.sum(1), acc * row

    want = fn(A.float() @ B.float(), row, col, s)
    for grad in (False, True):
        r = row.clone().requires_grad_(grad)
        got = evt.gemm(A, B, fn, row=r, col=col, s=s, backend=backend)
        for i, (o, w) in enumerate(zip(got, want)):
            dtype = torch.float16 if i == 6 else torch.float32
            assert o.dtype == dtype and o.shape == w.shape, (i, grad, o.dtype, o.shape)
            torch.testing.assert_close(o, w.to(dtype), rtol=0 if i < 5 else 2e-3, atol=0 if i < 5 else 2e-3)
        if grad:
            (dr,) = torch.autograd.grad(got[0].sum() + got[6].float().sum(), r)
            r64 = row.double().requires_grad_()
            (want_dr,) = torch.autograd.grad((r64 * 2).sum() + ((A.double() @ B.double()) * r64).sum(), r64)
            torch.testing.assert_close(dr.double(), want_dr, rtol=2e-3, atol=2e-3)
