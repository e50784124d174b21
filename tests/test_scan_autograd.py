"""Backward of evt.scan: gradcheck in float64 on CPU (reference and Triton-interpreter backends)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch.autograd import gradcheck

import evtorch as evt
from evtorch.scan.autograd import parallel_backward_ok
from evtorch.scan.api import get_body
from evtorch.scan.body import RowSpec

pytestmark = pytest.mark.interpreter
D = torch.float64


def rand(*shape, low=None):
    x = torch.randn(*shape, dtype=D)
    if low is not None:
        x = low + torch.rand(*shape, dtype=D)
    return x.requires_grad_()


CASES = {
    "sum": (lambda h, x: h + x, 1),
    "linear": (lambda h, a, x: a * h + x, 2),
    "max": (lambda h, x: torch.maximum(h, x), 1),
    "logaddexp": (lambda h, x: torch.logaddexp(h, x), 1),
    "tanh": (lambda h, a, x: torch.tanh(a * h + x), 2),
}


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_first_order(backend, name):
    fn, n_in = CASES[name]
    T, n = 7, 2
    xs = [rand(T, n, low=0.3) if n_in == 2 and i == 0 else rand(T, n) for i in range(n_in)]
    init = rand(1, n)
    body = get_body(fn, None, [RowSpec("s0", (n,), D)], [RowSpec(f"x{i}", (n,), D) for i in range(n_in)], 1)
    assert parallel_backward_ok(body)
    assert gradcheck(lambda i, *x: evt.scan(fn, *x, init=i, backend=backend), (init, *xs), atol=1e-7)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gradcheck_k2_dim1_broadcast_post(backend):
    A = rand(1, 6, low=0.2)            # rows of shape (1,): broadcast over lanes
    X = rand(3, 6)                     # scanned over dim 1
    init = rand(3, 2)                  # k = 2
    fn = lambda h, a, x: a * h + x     # noqa: E731
    assert gradcheck(lambda i, a, x: evt.scan(fn, a, x, init=i, dim=1, backend=backend,
                                              post=lambda h, a, x: torch.sigmoid(h) * x),
                     (init, A, X), atol=1e-7)


def test_gradcheck_fallbacks_coupled_and_second_order():
    X = rand(6, 3)
    init = (rand(1, 3), rand(1, 2))
    fn = lambda s1, s2, x: (s1 + x, s2 * 0.5 + s1[..., :1])  # noqa: E731
    assert gradcheck(lambda a, b, x: evt.scan(fn, x, init=(a, b)), (*init, X), atol=1e-7)
    fib = lambda h, x: 0.5 * h + 0.25 * h.at(-2) + x  # noqa: E731
    assert gradcheck(lambda i, x: evt.scan(fib, x, init=i), (rand(2, 3), X), atol=1e-7)


def test_backward_matches_loop_in_float32():
    T, n = 50, 5
    A = (0.5 + 0.5 * torch.rand(T, n)).requires_grad_()
    X = torch.randn(T, n, requires_grad=True)
    H = evt.scan(lambda h, a, x: a * h + x, A, X, init=X[:1], backend="triton")
    (H * torch.linspace(0, 1, n)).sum().backward()
    ga, gx = A.grad.clone(), X.grad.clone()
    A.grad = X.grad = None
    h, hs = X[0], [X[0]]
    for t in range(1, T):
        h = A[t] * h + X[t]
        hs.append(h)
    (torch.stack(hs) * torch.linspace(0, 1, n)).sum().backward()
    assert torch.allclose(ga, A.grad, atol=1e-5) and torch.allclose(gx, X.grad, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_double_backward_is_a_clear_error(backend):
    """A gradient taken with create_graph=True (a gradient penalty) must not be a silent constant: the parallel
    backward has no derivative, so differentiating its result raises, also through torch.autograd.grad with
    respect to the input alone (before, once_differentiable let the gradient through as a constant and the
    penalty's second-order term was dropped without a word)."""
    x = rand(6, 3)
    y = evt.scan(lambda h, x: torch.tanh(h + x), x, backend=backend)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(evt.EpilogueError, match="double backward"):
        torch.autograd.grad(y.sum() + g.square().sum(), x)
    # first-order gradients with create_graph=True are unchanged
    (g1,) = torch.autograd.grad(evt.scan(lambda h, x: torch.tanh(h + x), x, backend=backend).sum(), x)
    torch.testing.assert_close(g.detach(), g1)
