"""The per-signature fast paths of evt.gemm, evt.linear and the runtime stay correct.

A call signature (shapes, strides, dtypes, devices, requires_grad, grad mode, autocast, options, input kinds) is
checked and prepared on its first call; later calls of the signature skip to a prepared launch. These tests call
the same signature several times and change one thing at a time (scalar values, shapes, requires_grad, strides,
devices, knobs, incoming gradients), comparing every result and gradient with eager PyTorch, through the
generated Triton kernels on the CPU interpreter. They also check that a repeated call really skips the checks.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.errors import EpilogueError, EpilogueTypeError

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")

TOL = dict(rtol=1e-4, atol=1e-5)


def bias_gelu(acc, bias):
    return F.gelu(acc + bias)


def scaled(acc, C, alpha, flag):
    return torch.tanh(acc * alpha) + C * flag


def axpby(acc, C, alpha, beta):
    return alpha * acc + beta * C


def rows(acc, v):
    y = torch.sigmoid(acc + v[:, None])
    return y, y.sum(1)


def grads(out, leaves, gy):
    leaves = [t for t in leaves if t.requires_grad]
    return torch.autograd.grad(out, leaves, gy, allow_unused=True)


def leaf(*shape, grad=True, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    return (torch.randn(*shape) * 0.5).requires_grad_(grad)


def check_linear(x, W, b, gy=None, **kw):
    y = evt.linear(x, W, F.gelu, b, backend="triton", **kw)
    ref = F.gelu(F.linear(x, W, b))
    torch.testing.assert_close(y, ref, **TOL)
    leaves = [t for t in (x, W, b) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in leaves):
        gy = torch.randn(ref.shape) if gy is None else gy
        for g, r in zip(grads(y, leaves, gy), grads(ref, leaves, gy)):
            torch.testing.assert_close(g, r, **TOL)
    return y


# ---------------------------------------------------------------------------------------------- repeated calls
def test_linear_repeated_calls_new_tensors():
    for seed in range(4):  # the same signature with new values: the prepared path gives new results
        check_linear(leaf(6, 5, seed=seed), leaf(7, 5), leaf(7))


def test_linear_new_shapes_and_back():
    for M in (6, 9, 6, 4, 9):
        check_linear(leaf(M, 5, seed=M), leaf(7, 5), leaf(7))
    for lead in ((2, 3), (6,), (3, 2)):  # leading dims: the same M, different output views and gradients
        check_linear(leaf(*lead, 5, seed=1), leaf(7, 5), leaf(7))


def test_linear_changed_requires_grad():
    x, W, b = leaf(6, 5, seed=0), leaf(7, 5), leaf(7)
    check_linear(x, W, b)
    for rg in ((True, True, False), (False, True, True), (True, False, False), (False, False, False),
               (True, True, True)):
        for t, r in zip((x, W, b), rg):
            t.requires_grad_(r)
        y = check_linear(x, W, b)
        assert y.requires_grad == any(rg)
    with torch.no_grad():
        assert not check_linear(x, W, b).requires_grad
    assert check_linear(x, W, b).requires_grad


def test_linear_changed_strides():
    torch.manual_seed(3)
    W = leaf(7, 5)
    Wt = leaf(5, 7)  # weight given as a transposed view: column-major, then row-major again
    check_linear(leaf(6, 5), W, leaf(7))
    check_linear(leaf(6, 5), Wt.t(), leaf(7))
    check_linear(leaf(6, 5), W, leaf(7))
    xt = leaf(5, 6)
    check_linear(xt.t(), W, leaf(7))          # x column-major
    big = leaf(6, 10)
    check_linear(big[:, ::2], W, leaf(7))     # x strided
    bb = leaf(14)
    check_linear(leaf(6, 5), W, bb[::2])      # bias strided
    check_linear(leaf(6, 5), W, leaf(7))


def test_linear_incoming_gradient_strides():
    x, W, b = leaf(6, 5, seed=2), leaf(7, 5), leaf(7)
    for gy in (torch.randn(6, 7), torch.randn(7, 6).t(), torch.randn(1, 7).expand(6, 7), torch.randn(6, 7)):
        check_linear(x, W, b, gy=gy)
    y = evt.linear(x, W, F.gelu, b, backend="triton")  # a scalar loss: the gradient arrives expanded
    ref = F.gelu(F.linear(x, W, b))
    for g, r in zip(torch.autograd.grad(y.sum(), (x, W, b)), torch.autograd.grad(ref.sum(), (x, W, b))):
        torch.testing.assert_close(g, r, **TOL)


def test_gemm_new_scalar_values_and_types():
    torch.manual_seed(4)
    A, B, C = leaf(6, 5), leaf(5, 7), leaf(6, 7)
    gy = torch.randn(6, 7)
    for alpha, beta in ((0.5, 2.0), (-1.5, 0.25), (3, 1), (2.5, True), (0.5, 2.0)):
        y = evt.gemm(A, B, axpby, C=C, alpha=alpha, beta=beta, backend="triton")
        ref = axpby(A @ B, C, alpha, beta)
        torch.testing.assert_close(y, ref, **TOL)
        for g, r in zip(grads(y, (A, B, C), gy), grads(ref, (A, B, C), gy)):
            torch.testing.assert_close(g, r, **TOL)
    with torch.no_grad():  # the direct (no autograd) path too
        for alpha in (0.5, -2.0, 7):
            torch.testing.assert_close(evt.gemm(A, B, axpby, C=C, alpha=alpha, beta=1.0, backend="triton"),
                                       axpby(A @ B, C, alpha, 1.0), **TOL)


def test_gemm_bool_scalar_changes():
    torch.manual_seed(5)
    A, B, C = leaf(4, 3, grad=False), leaf(3, 5, grad=False), leaf(4, 5, grad=False)
    for flag in (True, False, True):
        torch.testing.assert_close(evt.gemm(A, B, scaled, C=C, alpha=0.7, flag=flag, backend="triton"),
                                   scaled(A @ B, C, 0.7, flag), **TOL)


def test_gemm_views_and_reductions_repeated():
    torch.manual_seed(6)
    for M in (5, 8, 5):
        A, B, v = leaf(M, 4), leaf(4, 6), leaf(M)
        gy, gs = torch.randn(M, 6), torch.randn(M)
        for _ in range(2):
            y, s = evt.gemm(A, B, rows, v=v, backend="triton")
            ry, rs = rows(A @ B, v)
            torch.testing.assert_close(y, ry, **TOL)
            torch.testing.assert_close(s, rs, **TOL)
            got = torch.autograd.grad((y, s), (A, B, v), (gy, gs))
            want = torch.autograd.grad((ry, rs), (A, B, v), (gy, gs))
            for g, r in zip(got, want):
                torch.testing.assert_close(g, r, **TOL)


def test_gemm_only_one_output_gets_a_gradient():
    torch.manual_seed(7)
    A, B, v = leaf(5, 4), leaf(4, 6), leaf(5)
    for which in (0, 1, 0):
        y, s = evt.gemm(A, B, rows, v=v, backend="triton")
        ry, rs = rows(A @ B, v)
        out, ref = (y, ry) if which == 0 else (s, rs)
        for g, r in zip(torch.autograd.grad(out.sum(), (A, B, v)), torch.autograd.grad(ref.sum(), (A, B, v))):
            torch.testing.assert_close(g, r, **TOL)


def test_batched_linear_and_broadcast_weight_repeated():
    torch.manual_seed(8)
    W, b = leaf(6, 4), leaf(6)
    for _ in range(2):
        check_linear(leaf(3, 5, 4), W, b)
    A, B = leaf(3, 5, 4), leaf(4, 6)  # a batched A with a shared B: dB sums over the batch
    for _ in range(2):
        y = evt.gemm(A, B, bias_gelu, bias=b, backend="triton")
        ref = bias_gelu(A @ B, b)
        gy = torch.randn(ref.shape)
        for g, r in zip(grads(y, (A, B, b), gy), grads(ref, (A, B, b), gy)):
            torch.testing.assert_close(g, r, **TOL)


# ---------------------------------------------------------------------------------------------- errors
def test_wrong_device_still_errors_after_a_cached_call():
    A, B, b = leaf(4, 3, grad=False), leaf(3, 5, grad=False), leaf(5, grad=False)
    evt.gemm(A, B, bias_gelu, bias=b, backend="triton")
    meta = torch.empty(5, device="meta")
    with pytest.raises(EpilogueError, match="is on meta"):
        evt.gemm(A, B, bias_gelu, bias=meta, backend="triton")
    x, W, bl = leaf(4, 3), leaf(5, 3), leaf(5)
    evt.linear(x, W, F.gelu, bl, backend="triton")
    with pytest.raises(EpilogueError, match="is on meta"):
        evt.linear(x, W, F.gelu, meta.requires_grad_(), backend="triton")
    with pytest.raises(EpilogueError, match="same device"):
        evt.gemm(A, torch.empty(3, 5, device="meta"), bias_gelu, bias=b, backend="triton")


def test_bad_calls_still_error_after_a_cached_call():
    A, B, b = leaf(4, 3), leaf(3, 5), leaf(5)
    evt.gemm(A, B, bias_gelu, bias=b, backend="triton")
    with pytest.raises(Exception, match="inner dimensions"):
        evt.gemm(A, leaf(4, 5), bias_gelu, bias=b, backend="triton")
    with pytest.raises(EpilogueTypeError, match="missing"):
        evt.gemm(A, B, bias_gelu, backend="triton")
    evt.gemm(A.detach(), B.detach(), bias_gelu, bias=b.detach(), backend="triton")
    with pytest.raises(EpilogueTypeError, match="expected a tensor"):
        evt.gemm(A.detach(), B.detach(), bias_gelu, bias="nope", backend="triton")
    with pytest.raises(Exception):
        evt.gemm(A, B.double(), bias_gelu, bias=b, backend="triton")
    with pytest.raises(Exception, match="in_features"):
        evt.linear(leaf(4, 3), leaf(5, 4), F.gelu, leaf(5), backend="triton")


def test_double_backward_still_errors_on_a_repeated_call():
    A, B = leaf(4, 3), leaf(3, 5)
    for _ in range(2):
        y = evt.gemm(A, B, lambda acc: torch.tanh(acc), backend="triton")
        gA, = torch.autograd.grad(y.sum(), A, create_graph=True)
        with pytest.raises(EpilogueError, match="double backward"):
            gA.sum().backward()


def test_inplace_change_of_a_saved_input_is_detected():
    x, W, b = leaf(4, 3), leaf(5, 3), leaf(5)
    y = evt.linear(x, W, F.gelu, b, backend="triton")
    with torch.no_grad():
        W.add_(1.0)
    with pytest.raises(RuntimeError):
        y.sum().backward()


# ---------------------------------------------------------------------------------------------- knobs, autocast
def test_poison_knob_change_between_calls(monkeypatch):
    A, B, C = leaf(5, 4, grad=False), leaf(4, 6, grad=False), leaf(5, 6, grad=False)
    ref = axpby(A @ B, C, 0.5, 2.0)
    for poison in ("0", "1", "0"):
        monkeypatch.setenv("EVTORCH_POISON", poison)
        torch.testing.assert_close(evt.gemm(A, B, axpby, C=C, alpha=0.5, beta=2.0, backend="triton"), ref, **TOL)
    from evtorch.runtime import gemm as rg
    fills = {launch.news[0][2] is None for launch in rg._launches.values() if launch.ep.fn is axpby}
    assert fills == {True, False}  # one launch allocating, one poisoning


def test_autocast_repeated_linear():
    torch.manual_seed(9)
    x, W, b = leaf(6, 5), leaf(7, 5), leaf(7)
    gy = torch.randn(6, 7)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = evt.linear(x, W, F.gelu, b, backend="triton")
            ref = F.gelu(F.linear(x, W, b))
        assert y.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), ref.float(), rtol=3e-2, atol=3e-2)
        got, want = grads(y, (x, W, b), gy.bfloat16()), grads(ref, (x, W, b), gy.bfloat16())
        for g, r in zip(got, want):
            assert g.dtype == r.dtype == torch.float32
            torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)
    y = evt.linear(x, W, F.gelu, b, backend="triton")  # autocast off again: float32
    assert y.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- the fast path is taken
def test_repeated_calls_skip_checks_and_lookups(monkeypatch):
    """After the first call of a signature, evt.gemm / evt.linear neither re-check nor re-inspect the epilogue,
    and the runtime neither rebuilds layouts nor picks configs."""
    import evtorch.api as api
    import evtorch.integration.function as function
    from evtorch.runtime import gemm as rg
    x, W, b = leaf(6, 5), leaf(7, 5), leaf(7)
    A, B = leaf(6, 5, grad=False), leaf(5, 7, grad=False)
    gy = torch.randn(6, 7)

    def step():
        y = evt.linear(x, W, F.gelu, b, backend="triton")
        torch.autograd.grad(y, (x, W, b), gy)
        with torch.no_grad():
            evt.linear(x, W, F.gelu, b, backend="triton")
        evt.gemm(A, B, bias_gelu, bias=b.detach(), backend="triton")
        evt.gemm(A, B, backend="triton")
    step()
    calls = []
    for module, name in ((api, "get_epilogue"), (api, "check_operands"), (function, "prepare"),
                         (rg, "_Call"), (rg, "_choose_config"), (rg, "_program"), (rg, "prepare_launch")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or
                            _real(*a, **k))
    step()
    assert calls == []


def test_repeated_gemm_calls_skip_the_launch_key(monkeypatch):
    """From its third call a signature's evt.gemm goes to its launch through the call's ``LaunchSite`` (the call key
    fixes shapes and strides): no ``launch_key``. An input of the same shape with other strides is another
    signature, and its results are its own."""
    from evtorch.runtime import gemm as rg
    A, B, C = leaf(6, 5, grad=False), leaf(5, 7, grad=False), leaf(6, 7, grad=False)

    def call(c):
        return evt.gemm(A, B, axpby, C=c, alpha=0.5, beta=2.0, backend="triton")

    call(C), call(C)
    keys = []
    real = rg.launch_key
    monkeypatch.setattr(rg, "launch_key", lambda *a, **k: keys.append(1) or real(*a, **k))
    torch.testing.assert_close(call(C), 0.5 * (A @ B) + 2.0 * C, **TOL)
    assert keys == []
    Ct = leaf(7, 6, grad=False, seed=3).t()  # (6, 7) with strides (1, 6)
    for _ in range(3):
        torch.testing.assert_close(call(Ct), 0.5 * (A @ B) + 2.0 * Ct, **TOL)
    assert keys  # its first calls looked their launch up
    torch.testing.assert_close(call(C), 0.5 * (A @ B) + 2.0 * C, **TOL)


def test_generated_launch_source_is_readable():
    from evtorch.runtime import gemm as rg
    A, B, b = leaf(4, 3, grad=False), leaf(3, 5, grad=False), leaf(5, grad=False)
    evt.gemm(A, B, bias_gelu, bias=b, backend="triton")
    sources = [launch.source for launch in rg._launches.values() if launch.ep.fn is bias_gelu]
    assert sources and all(s.startswith("def run(A, B, inputs):") and "inputs['bias']" in s for s in sources)


def test_generated_launch_device_guard(monkeypatch):
    """On CUDA the generated launch checks the current device and, off A's, runs again under a device guard
    (Triton launches on the current device). Exercised here with torch.cuda's two functions stubbed."""
    from evtorch.runtime import gemm as rg
    A, B, b = leaf(4, 3, grad=False), leaf(3, 5, grad=False), leaf(5, grad=False)
    ref = bias_gelu(A @ B, b)
    evt.gemm(A, B, bias_gelu, bias=b, backend="triton")
    launch = next(launch for launch in rg._launches.values() if launch.ep.fn is bias_gelu)
    current, entered = [0], []

    class Guard:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.previous
            return False
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current[0], raising=False)  # (what CUDA builds call)
    monkeypatch.setattr(torch.cuda, "device", Guard)
    monkeypatch.setattr(launch.gemm, "device_index", 3)
    monkeypatch.setattr(launch, "source", launch.source)  # (restored after the test, like the device index)
    run = launch._generate()
    assert "_device() != 3" in launch.source
    torch.testing.assert_close(run(A, B, {"bias": b}), ref, **TOL)
    assert entered == [3] and current == [0]
    current[0] = 3
    torch.testing.assert_close(run(A, B, {"bias": b}), ref, **TOL)
    assert entered == [3]


def _operator_step(x, W, b, gy):
    """``evt.linear(x, W, gelu, b)`` forward and backward through the operators torch.compile calls (the outputs,
    then the gradients of x, W and b)."""
    from evtorch.integration import op_arguments
    args = op_arguments(x, W.t(), ("linear", F.gelu, True), backend="triton", linear_bias=b)
    outs = torch.ops.evtorch.gemm(*args)
    return outs[0], torch.autograd.grad(outs[0], (x, W, b), gy)


def test_operator_bodies_reuse_prepared_launches(monkeypatch):
    """torch.ops.evtorch.gemm / gemm_backward (what torch.compile calls) launch through a LaunchSite per full
    signature after the first call: no run_gemm, no config choice; results unchanged; a new stride or shape
    takes the checked path again."""
    import evtorch.integration.ops as ops
    from evtorch.runtime import gemm as rg
    ops._op_sites.clear()  # first calls of other tests' signatures went through the operator bodies too
    x, W, b = leaf(6, 5), leaf(7, 5), leaf(7)
    gy = torch.randn(6, 7)

    def step(x):
        return _operator_step(x, W, b, gy)
    first = step(x)
    calls = []
    for name in ("run_gemm", "_choose_config"):
        real = getattr(rg, name)
        monkeypatch.setattr(rg, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or
                            _real(*a, **k))
    built = []
    real_backward = ops.EagerBackward
    monkeypatch.setattr(ops, "EagerBackward", lambda *a: built.append(a) or real_backward(*a))
    again = step(x)
    assert calls == [] and built == []  # the backward operator's EagerBackward is reused too
    for a, b_ in zip((first[0], *first[1]), (again[0], *again[1])):
        torch.testing.assert_close(a, b_)
    ref = F.gelu(F.linear(x, W, b))
    torch.testing.assert_close(again[0], ref, **TOL)
    for g, r in zip(again[1], grads(ref, (x, W, b), gy)):
        torch.testing.assert_close(g, r, **TOL)
    xt = x.detach().t().contiguous().t().requires_grad_()  # column-major x: another signature
    step(xt)
    assert "run_gemm" in calls and len(ops._op_sites) >= 2


def test_operator_bodies_launch_prepared_signatures_outside_the_guards(monkeypatch):
    """A repeated signature in the operator bodies launches before ``running_op`` and the autocast guard (10-20 us
    of host time a call): under an enabled autocast its results are the guarded first call's, and neither guard
    is entered again."""
    import evtorch.integration.ops as ops
    ops._op_sites.clear()
    x, W, b = leaf(6, 5), leaf(7, 5), leaf(7)
    gy = torch.randn(6, 7)

    def step(x):
        return _operator_step(x, W, b, gy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = step(x)
        entered = []
        real = ops._no_autocast
        monkeypatch.setattr(ops, "_no_autocast", lambda d: entered.append(d) or real(d))
        again = step(x)
    assert entered == []
    for a, b_ in zip((first[0], *first[1]), (again[0], *again[1])):
        assert a.dtype == b_.dtype
        torch.testing.assert_close(a, b_, rtol=0, atol=0)
    assert again[0].dtype == torch.bfloat16  # autocast did apply (op_arguments casts the operands)
    torch.testing.assert_close(again[0].float(), F.gelu(F.linear(x, W, b)), rtol=2e-2, atol=2e-2)
