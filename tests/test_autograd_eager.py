"""evtorch gradients against torch autograd of the eager epilogue, in float32 (and 16-bit on the interpreter).

Each case runs ``evt.gemm`` forward and backward on the reference executor and, marked ``interpreter``, through
the generated Triton kernels on the CPU interpreter (forward kernel, epilogue-only backward kernels, dA/dB
GEMMs), and compares outputs and every gradient with ``fn(A @ B, **inputs)`` differentiated by torch.
Sizes are tiny and odd (masks, partial tiles) because the interpreter runs each program in NumPy.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.examples import EXAMPLES
from evtorch.testing import reference_device

# padded lanes of partial tiles divide 0 by 0 (masked out on store); NumPy warns about them in the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


def bias_gelu(acc, bias):
    return F.gelu(acc + bias)


def softmax_xent(acc, target):
    picked = torch.where(evt.col_index(acc) == target[:, None], acc, 0.0).sum(1)
    return (acc.logsumexp(1) - picked).mean()


def row_max_and_scale(acc, s, C):
    y = torch.tanh(acc * s) + C
    return y, y.amax(1), (y * y).mean(0)


def activations(acc, bias, s):
    """The composites with derivative rules of their own (gelu both ways, silu, softplus, elu, hardswish,
    hardsigmoid, leaky_relu), on a tile value, on a row reduction's result (the vector stage), on a value computed
    twice (one copy merged away by CSE) and on a keyword input alone."""
    pre = acc + bias
    row = F.gelu(acc.amax(1) * s, approximate="tanh") + F.elu(acc.amin(1))
    tile = F.gelu(pre) + F.silu(pre * s) * F.gelu(acc, approximate="tanh") + F.softplus(acc * 2.0, beta=1.5)
    tile = tile + F.hardswish(pre * 4.0) - F.hardsigmoid(acc * 4.0) + F.leaky_relu(acc - 0.1, 0.2) * F.elu(bias)
    return tile, F.silu(acc + bias), row


CASES = {name: ex for name, ex in EXAMPLES.items()}
CASES["activations"] = (activations, lambda M, N, device, dtype: dict(
    bias=torch.randn(N, device=device, dtype=dtype), s=torch.tensor(0.8, device=device, dtype=dtype)))
CASES["bias_gelu"] = (bias_gelu, lambda M, N, device, dtype: dict(bias=torch.randn(N, device=device, dtype=dtype)))
CASES["softmax_xent"] = (softmax_xent, lambda M, N, device, dtype: dict(
    target=torch.randint(0, N, (M,), device=device)))
CASES["row_max_and_scale"] = (row_max_and_scale, lambda M, N, device, dtype: dict(
    s=torch.tensor(0.7, device=device, dtype=dtype), C=torch.randn(M, N, device=device, dtype=dtype)))


def run_case(fn, make_inputs, backend, M=7, N=10, K=9, batch=None, dtype=torch.float32, tol=None, seed=0):
    torch.manual_seed(seed)
    lead = () if batch is None else (batch,)
    A = (torch.randn(*lead, M, K) * 0.5).to(dtype).requires_grad_()
    B = (torch.randn(*lead, K, N) * 0.5).to(dtype).requires_grad_()
    inputs = make_inputs(M, N, "cpu", dtype)
    for v in inputs.values():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            v.requires_grad_()
    out = evt.gemm(A, B, fn, backend=backend, **inputs)
    ref = fn(A.float() @ B.float(), **inputs)
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    rtol, atol = tol or ((1e-4, 1e-5) if dtype == torch.float32 else (3e-2, 3e-2))
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), rtol=rtol, atol=atol)
    ws = [torch.randn(r.shape) for r in ref]
    leaves = [A, B] + [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    got = torch.autograd.grad(sum((o.float() * w).sum() for o, w in zip(out, ws)), leaves, allow_unused=True)
    want = torch.autograd.grad(sum((r.float() * w).sum() for r, w in zip(ref, ws)), leaves, allow_unused=True)
    for g, r, leaf in zip(got, want, leaves):
        assert (g is None) == (r is None)
        if g is not None:
            assert g.dtype == leaf.dtype and g.shape == leaf.shape
            scale = max(1.0, r.abs().max().item())
            torch.testing.assert_close(g.float(), r.float(), rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_backend_fp32(name):
    run_case(*CASES[name], backend="reference")


@pytest.mark.parametrize("name", ["bias_gelu", "softmax_xent"])
def test_reference_backend_batched(name):
    run_case(*CASES[name], backend="reference", batch=3)


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["bias_gelu", "bce_loss", "mixed_dag", "row_max_and_scale", "softmax_xent",
                                  "activations"])
def test_triton_interpreter_fp32(name):
    run_case(*CASES[name], backend="triton")


def clamp_crossed(acc, lo, hi, lo_col, hi_row):
    return torch.clamp(acc, lo, hi), acc.clamp(lo_col, hi_row), acc.clamp(1.0, -1.0)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_hardsigmoid_gradient_is_eagers_bit_for_bit(backend, dtype):
    """torch's hardsigmoid backward multiplies by 1.0f / 6.0f in every dtype; the rule's g / 6 was 3e-8 off eager in
    float64 and an ulp off in float32 (found 2026-11-29 by the float64 activations case on an H200)."""
    torch.manual_seed(0)
    A, B = torch.randn(33, 9, dtype=dtype), torch.randn(9, 20, dtype=dtype)
    C = (torch.randn(33, 20, dtype=dtype) * 4.0).requires_grad_()
    g = torch.randn(33, 20, dtype=dtype)
    got, = torch.autograd.grad(evt.gemm(A, B, lambda acc, C: F.hardsigmoid(acc * 0.0 + C), backend=backend, C=C),
                               C, g)
    C2 = C.detach().clone().requires_grad_()
    want, = torch.autograd.grad(F.hardsigmoid(C2), C2, g)
    assert bool(((C.abs() < 3.0) & (want != 0)).any())
    assert torch.equal(got, want)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gradients_at_kinks_and_special_values_are_eagers(backend):
    """Found by a probe (2026-11-29), each bit for bit against eager's autograd now: hardswish at x = -3 and 3
    (its rule had eager's kinks the other way round: 1.5 and -0.5 against 1 and 0), relu at NaN (torch passes g
    where ``x <= 0`` is false; the rule gave 0), and ``x ** 0`` at 0 (``0 * x ** -1`` was NaN; torch gives 0)."""
    A, B = torch.eye(4, 3), torch.eye(3, 5)
    C = torch.tensor([[-3.0, 3.0, -3.5, 2.5, 0.0], [float("nan"), -0.0, 1.0, -1.0, 4.0],
                      [0.0, 2.0, -2.0, float("nan"), 3.0], [-3.0, 3.0, 0.5, -4.0, 1e-3]]).requires_grad_()
    g = torch.randn(4, 5)
    for fn in (lambda acc, C: F.hardswish(acc * 0.0 + C), lambda acc, C: torch.relu(acc * 0.0 + C),
               lambda acc, C: (acc * 0.0 + C) ** 0 + (acc * 0.0 + C) ** 1):
        got, = torch.autograd.grad(evt.gemm(A, B, fn, backend=backend, C=C), C, g)
        C2 = C.detach().clone().requires_grad_()
        want, = torch.autograd.grad(fn(A @ B, C2), C2, g)
        assert torch.equal(got, want), (got, want)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_tensor_constants_as_operands_of_tensor_only_ops(backend):
    """``torch.maximum(acc, torch.zeros_like(acc))`` ran without gradients and was refused with them: the backward's
    replay turned the ``zeros_like`` constant into a number, which maximum does not take (found by a probe,
    2026-11-29). Gradients of A against eager's."""
    torch.manual_seed(1)
    B, g = torch.randn(4, 5), torch.randn(6, 5)
    for fn in (lambda acc: torch.maximum(acc, torch.zeros_like(acc)),
               lambda acc: torch.minimum(acc, torch.ones_like(acc)) * 2,
               lambda acc: torch.maximum(torch.full_like(acc, 0.25), acc).sum(1)):
        A = torch.randn(6, 4, requires_grad=True)
        out = evt.gemm(A, B, fn, backend=backend)
        got, = torch.autograd.grad(out, A, g[:, 0] if out.dim() == 1 else g)
        want, = torch.autograd.grad(fn(A @ B), A, g[:, 0] if out.dim() == 1 else g)
        torch.testing.assert_close(got, want)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_clamp_with_min_above_max_gives_max_the_gradient(backend):
    """torch.clamp with min > max returns max everywhere, and max takes the gradient; evtorch gave it to min as well
    where x < min (2026-11-29). 0-d bounds (lo > hi), and a row / column pair that crosses where lo_col > hi_row."""
    run_case(clamp_crossed, lambda M, N, device, dtype: dict(
        lo=torch.tensor(0.5), hi=torch.tensor(-0.5), lo_col=torch.randn(M, 1), hi_row=torch.randn(N)),
        backend=backend)


@pytest.mark.interpreter
def test_triton_interpreter_batched_broadcast_B():
    """A (L, M, K) with a 2-D B: dB sums over the batch."""
    torch.manual_seed(3)
    A = torch.randn(2, 5, 6, requires_grad=True)
    B = torch.randn(6, 7, requires_grad=True)
    bias = torch.randn(7, requires_grad=True)
    out = evt.gemm(A, B, bias_gelu, backend="triton", bias=bias)
    ref = bias_gelu(A @ B, bias)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    got = torch.autograd.grad(out.square().sum(), (A, B, bias))
    want = torch.autograd.grad(ref.square().sum(), (A, B, bias))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_triton_interpreter_16bit(dtype):
    run_case(*CASES["bias_gelu"], backend="triton", dtype=dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["bias_gelu", "bce_loss", "mixed_dag", "row_max_and_scale", "softmax_xent",
                                  "activations"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "fp64"])
def test_gpu_gradients(name, dtype):
    """The generated kernels on a GPU (TF32 off), against torch autograd of the eager epilogue in fp32 (float64:
    in float64, which the forward and backward GEMMs run in; they failed to compile on Triton 3.6 until
    2026-11-29)."""
    rdt = torch.float64 if dtype == torch.float64 else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    fn, make = CASES[name]
    torch.manual_seed(0)
    M, N, K = 300, 200, 136
    A = (torch.randn(M, K, device="cuda") * 0.3).to(dtype).requires_grad_()
    B = (torch.randn(K, N, device="cuda") * 0.3).to(dtype).requires_grad_()
    inputs = make(M, N, "cuda", dtype)
    for v in inputs.values():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            v.requires_grad_()
    out = evt.gemm(A, B, fn, **inputs)
    out = out if isinstance(out, tuple) else (out,)
    # the contract's reference: fn(A.float() @ B.float(), **inputs) with the inputs in their own dtype (an
    # fp32 upcast of bf16 inputs would move amax's arg-max, and with it where the gradient goes)
    # the float64 reference computes on the CPU: torch's CUDA hardswish / hardsigmoid take float64 through the
    # float 1.0f / 6.0f (3e-8 off; evtorch.testing.reference_device)
    rdev = reference_device(dtype, "cuda")
    ref_inputs = {k: (v.detach().to(rdev).requires_grad_() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point
                      else v.to(rdev) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    Af, Bf = A.detach().to(rdev, rdt).requires_grad_(), B.detach().to(rdev, rdt).requires_grad_()
    ref = fn(Af @ Bf, **ref_inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    ws = [torch.randn(r.shape, dtype=rdt).to(rdev) for r in ref]
    leaves = [A, B] + [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    ref_leaves = [Af, Bf] + [v for v in ref_inputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    got = torch.autograd.grad(sum((o.to(rdt) * w.to(o.device)).sum() for o, w in zip(out, ws)), leaves,
                              allow_unused=True)
    want = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, ws)), ref_leaves, allow_unused=True)
    tol = {torch.float32: 1e-4, torch.float64: 1e-10}.get(dtype, 3e-2)
    for g, r in zip(got, want):
        if r is not None:
            err = ((g.to(rdev, rdt) - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            assert err <= tol, f"relative error {err}"


def _plain_gemms_of(out) -> tuple:
    """(dA's, dB's) identity epilogues of the backward that made ``out``'s gradients: None where the GEMM ran as
    ``torch.matmul`` (never prepared as an evtorch GEMM)."""
    node = out.grad_fn
    while not hasattr(node, "call"):  # evt.linear's (..., N) output is a view of the GEMM's (M, N)
        node = node.next_functions[0][0]
    (backward,) = node.call.backwards.values()
    return backward.ep_dA, backward.ep_dB


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", ["torch", "evtorch", "auto"])
@pytest.mark.parametrize("case", ["gemm_batched", "linear"])
def test_backward_plain_gemms_on_torch_or_evtorch(mode, case, monkeypatch):
    """EVTORCH_BACKWARD_GEMM: a backward's plain GEMMs (dA, dB) run as ``torch.matmul`` ("torch") or as evtorch's
    identity-epilogue kernel ("evtorch"; "auto" too on a CPU: the default takes cuBLAS only on a GPU); either way
    the gradients are torch autograd's (float16 through the interpreter), for batched operands and for
    evt.linear's transposed weight (its dB is made as its transpose)."""
    from evtorch.integration.function import _calls
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", mode)
    _calls.clear()
    torch.manual_seed(5)
    dtype = torch.float16
    if case == "linear":
        x = (torch.randn(2, 9, 12) * 0.5).to(dtype).requires_grad_()
        W = (torch.randn(10, 12) * 0.5).to(dtype).requires_grad_()
        b = torch.randn(10).to(dtype).requires_grad_()
        out = evt.linear(x, W, lambda y: F.gelu(y, approximate="tanh"), b, backend="triton")
        leaves = (x, W, b)
        ref = F.gelu(F.linear(x.float(), W.float(), b.float()), approximate="tanh")
    else:
        x = (torch.randn(3, 7, 9) * 0.5).to(dtype).requires_grad_()
        W = (torch.randn(3, 9, 10) * 0.5).to(dtype).requires_grad_()
        b = torch.randn(10).to(dtype).requires_grad_()
        out = evt.gemm(x, W, bias_gelu, backend="triton", bias=b)
        leaves = (x, W, b)
        ref = bias_gelu(x.float() @ W.float(), b.float())
    w = torch.randn(ref.shape)
    got = torch.autograd.grad((out.float() * w).sum(), leaves)
    want = torch.autograd.grad((ref * w).sum(), leaves)
    for g, r, leaf in zip(got, want, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        torch.testing.assert_close(g.float(), r.float(), rtol=3e-2, atol=3e-2 * max(1.0, r.abs().max().item()))
    ep_dA, ep_dB = _plain_gemms_of(out)
    assert (ep_dA is None and ep_dB is None) == (mode == "torch")


@pytest.mark.interpreter
def test_backward_plain_gemms_on_torch_inside_autocast(monkeypatch):
    """A backward run inside the caller's autocast region (here bfloat16 on the CPU, over float16 operands): the
    plain GEMMs on torch.matmul are not recast by it, the gradients keep their leaves' dtype and values."""
    from evtorch.integration import ops
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", "torch")
    made = []  # the products' dtypes (autograd would cast a bfloat16 gradient back to float16 silently)
    real = ops.EagerBackward._matmul
    monkeypatch.setattr(ops.EagerBackward, "_matmul", lambda *a: made.append(real(*a).dtype) or real(*a))
    torch.manual_seed(6)
    x = (torch.randn(9, 12) * 0.5).half().requires_grad_()
    W = (torch.randn(10, 12) * 0.5).half().requires_grad_()
    out = evt.linear(x, W, torch.tanh)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dx, dW = torch.autograd.grad(out.float().sum(), (x, W))
    assert made == [torch.float16, torch.float16] and dx.dtype == dW.dtype == torch.float16
    ref = torch.tanh(F.linear(x.float(), W.float()))
    rx, rW = torch.autograd.grad(ref.sum(), (x, W))
    torch.testing.assert_close(dx.float(), rx.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(dW.float(), rW.float(), rtol=3e-2, atol=3e-2)
    assert _plain_gemms_of(out) == (None, None)


@pytest.mark.interpreter
def test_backward_plain_gemms_on_torch_under_torch_compile(monkeypatch):
    """Under torch.compile (fullgraph, aot_eager) the backward operator's body runs the same plan: its plain GEMMs
    on torch.matmul, the gradients torch autograd's."""
    from evtorch.integration import ops
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", "torch")
    asked = []
    real = ops._on_torch
    monkeypatch.setattr(ops, "_on_torch", lambda *a: asked.append(real(*a)) or asked[-1])
    torch.manual_seed(8)
    x = (torch.randn(9, 12) * 0.5).half().requires_grad_()
    W = (torch.randn(10, 12) * 0.5).half().requires_grad_()
    b = torch.randn(10).half().requires_grad_()
    step = torch.compile(lambda x, W, b: evt.linear(x, W, torch.tanh, b), backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(step(x, W, b).float().sum(), (x, W, b))
    ref = torch.tanh(F.linear(x.float(), W.float(), b.float()))
    want = torch.autograd.grad(ref.sum(), (x, W, b))
    for g, r in zip(got, want):
        assert g.dtype == torch.float16
        torch.testing.assert_close(g.float(), r.float(), rtol=3e-2, atol=3e-2)
    assert asked == [True, True]  # dA and dB, each on torch.matmul


def test_backward_plain_gemm_rule(monkeypatch):
    """``_on_torch``: by default cuBLAS for 16-bit operands on a GPU unless deterministic; never for float32 or
    float64 (torch.matmul follows torch's global TF32 flag, not evtorch's allow_tf32); a bad value is refused
    with the variable's name."""
    from evtorch.integration.ops import _on_torch
    half, single = torch.empty(2, 2, dtype=torch.bfloat16), torch.empty(2, 2)
    monkeypatch.delenv("EVTORCH_BACKWARD_GEMM", raising=False)
    assert not _on_torch(half, False) and not _on_torch(single, False)  # a CPU tensor: evtorch's kernels
    half_cuda = torch.empty(2, 2, dtype=torch.float16, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type == "meta"))
    assert _on_torch(half_cuda, False) and not _on_torch(half_cuda, True)
    assert not _on_torch(torch.empty(2, 2, device="meta"), False)
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", "torch")
    assert _on_torch(half, False) and _on_torch(half, True) and not _on_torch(single, False)
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", "evtorch")
    assert not _on_torch(half_cuda, False)
    monkeypatch.setenv("EVTORCH_BACKWARD_GEMM", "cublas")
    with pytest.raises(ValueError, match="EVTORCH_BACKWARD_GEMM"):
        _on_torch(half, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("deterministic", [False, True])
def test_gpu_backward_plain_gemms_on_cublas(deterministic, monkeypatch):
    """On a GPU, by default, a bf16 layer's dA and dB run on cuBLAS (torch.matmul), evtorch's kernels under
    deterministic=True; the gradients against fp32 torch autograd of the same bf16 values either way, outputs
    poisoned so an unwritten element fails."""
    from evtorch.integration.function import _calls
    monkeypatch.delenv("EVTORCH_BACKWARD_GEMM", raising=False)
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "0")
    monkeypatch.setenv("EVTORCH_POISON", "1")
    _calls.clear()
    torch.manual_seed(7)
    x = (torch.randn(4, 130, 264, device="cuda") * 0.3).bfloat16().requires_grad_()
    W = (torch.randn(392, 264, device="cuda") * 0.3).bfloat16().requires_grad_()
    b = torch.randn(392, device="cuda").bfloat16().requires_grad_()
    out = evt.linear(x, W, lambda y: F.gelu(y, approximate="tanh"), b, deterministic=deterministic)
    ref = F.gelu(F.linear(x.float(), W.float(), b.float()), approximate="tanh")
    w = torch.randn(ref.shape, device="cuda")
    got = torch.autograd.grad((out.float() * w).sum(), (x, W, b))
    want = torch.autograd.grad((ref * w).sum(), (x, W, b))
    for g, r in zip(got, want):
        r = r.float()
        torch.testing.assert_close(g.float(), r, rtol=2e-2, atol=2e-2 * max(1.0, r.abs().max().item()))
    ep_dA, ep_dB = _plain_gemms_of(out)
    assert (ep_dA is None and ep_dB is None) == (not deterministic)


def test_a_composites_product_operand_is_not_fused_away():
    """hardsigmoid(s * acc) decomposes to clamp(s * acc + 3, 0, 6) / 6, whose mul + add the fma pass fused: the
    rule's operand was gone, the decomposition was differentiated and the float64 gradient lost eager's
    1.0f / 6.0f (found 2026-11-29 by the random-DAG gradient test); a product a composite's rule reads stays."""
    torch.manual_seed(0)
    A = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    B, s = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    fn = lambda acc, s: F.hardsigmoid(s * acc)  # noqa: E731
    got, = torch.autograd.grad(evt.gemm(A, B, fn, s=s, backend="reference").sum(), A)
    A2 = A.detach().clone().requires_grad_()
    want, = torch.autograd.grad(fn(A2 @ B, s).sum(), A2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
