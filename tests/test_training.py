"""A small MLP trained with evtorch.nn.Linear (bias + GELU epilogues) follows nn.Linear's loss curve.

Both models are built from the same seed (evtorch.nn.Linear initialises exactly like nn.Linear), trained on the
same batches with Adam; the losses must agree step by step within ``RTOL`` (float32: the fused path adds the
bias after the matmul instead of inside addmm, so values differ by rounding, which training then carries).
The same holds under torch.compile(fullgraph=True), through the Triton interpreter, and on a GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt

RTOL = 1e-5      # per-step relative difference of the losses (float32; observed: 1.5e-7 over 40 steps)
RTOL_GPU = 2e-3  # TF32 is off, but GPU reductions (atomics) and fma contraction differ more


def mlp(fused: bool, sizes=(16, 32, 32, 4), device="cpu"):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        last = i == len(sizes) - 2
        if fused:
            layers.append(evt.nn.Linear(a, b, epilogue=None if last else F.gelu, device=device))
        else:
            layers.append(torch.nn.Linear(a, b, device=device))
            if not last:
                layers.append(torch.nn.GELU())
    return torch.nn.Sequential(*layers)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls gain nothing from threads, and OpenMP's spinning threads slow them down 1000x on a busy
    2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def train(model, steps, device="cpu", batch=32, compile_backend=None, seed=1):
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(16, 4, generator=gen)
    xs = [torch.randn(batch, 16, generator=gen) for _ in range(steps)]
    data = [(x, torch.tanh(x @ teacher)) for x in xs]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step_model = torch.compile(model, fullgraph=True, backend=compile_backend) if compile_backend else model
    losses = []
    for x, y in data:
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(step_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def curves(steps, device="cpu", compile_backend=None, sizes=(16, 32, 32, 4)):
    torch.manual_seed(0)
    fused = mlp(True, sizes, device)
    torch.manual_seed(0)
    plain = mlp(False, sizes, device)
    for (k, a), b in zip(fused.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), f"{k}: evtorch.nn.Linear must initialise like nn.Linear"
    return train(fused, steps, device, compile_backend=compile_backend), train(plain, steps, device)


def assert_same_curve(got, want, rtol):
    assert want[-1] < want[0] * 0.8, "the reference did not learn; the comparison would be vacuous"
    for step, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= rtol * abs(b), f"step {step}: evtorch loss {a} vs nn.Linear {b}"


def test_mlp_loss_curve_matches_nn_linear():
    got, want = curves(steps=40)
    assert_same_curve(got, want, RTOL)


def test_mlp_loss_curve_under_torch_compile():
    torch._dynamo.reset()
    got, want = curves(steps=25, compile_backend="inductor")
    assert_same_curve(got, want, RTOL)


@pytest.mark.interpreter
def test_mlp_loss_curve_through_triton_interpreter(monkeypatch):
    """The generated kernels (forward, epilogue-only backward, dA/dB GEMMs) on the CPU interpreter."""
    real = evt.linear

    def on_triton(*args, **kwargs):
        return real(*args, backend="triton", **kwargs)
    monkeypatch.setattr("evtorch.integration.modules.linear", on_triton)
    got, want = curves(steps=12, sizes=(16, 24, 4))
    assert_same_curve(got, want, RTOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile_backend", [None, "inductor"])
def test_mlp_loss_curve_on_gpu(compile_backend):
    torch._dynamo.reset()
    torch.backends.cuda.matmul.allow_tf32 = False
    got, want = curves(steps=40, device="cuda", compile_backend=compile_backend)
    assert_same_curve(got, want, RTOL_GPU)
