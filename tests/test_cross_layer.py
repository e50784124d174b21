"""Cross-layer backward fusion (``integration.deferred``): a layer's input gradient handed unmultiplied to the
evtorch layer that produced the input, which runs its backward epilogue inside that GEMM.

Every test compares gradients with torch autograd of the same model written with torch ops (fp64 on CPU, the
reference backend unless said otherwise), and checks through ``STATS`` that the hand-off was fused, or computed
because something else needed the value; whichever happens, results must not change.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.integration import deferred
from evtorch.integration.deferred import DeferredGrad

DT = torch.float64


def gelu(t):
    return F.gelu(t, approximate="tanh")


@pytest.fixture(autouse=True)
def fresh_stats():
    deferred.STATS.update(fused=0, materialized=0)
    yield


def params(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g, dtype=DT) / (s[-1] ** 0.5 if len(s) > 1 else 1)).requires_grad_()
            for s in shapes]


def mlp(x, layers, fused: bool, act=gelu, **options):
    h = x
    for i, (W, b) in enumerate(layers):
        act_i = act if i < len(layers) - 1 else None
        if fused:
            h = evt.linear(h, W, act_i, bias=b, **options)
        else:
            h = F.linear(h, W, b)
            h = act_i(h) if act_i is not None else h
    return h


def close(got, want, rtol=1e-9):
    for g, w in zip(got, want):
        assert type(g) is torch.Tensor or isinstance(g, DeferredGrad)
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("lead", [(24,), (3, 8)])
@pytest.mark.parametrize("depth", [2, 3])
def test_mlp_chain_fuses_every_hand_off(depth, lead):
    dims = [12, 16, 20, 10][:depth + 1]
    ws = params(*[s for a, b in zip(dims, dims[1:]) for s in ((b, a), (b,))], seed=depth)
    layers = list(zip(ws[::2], ws[1::2]))
    x = torch.randn(*lead, dims[0], dtype=DT, requires_grad=True)
    leaves = [x, *ws]
    want = torch.autograd.grad((mlp(x, layers, False) ** 2).sum(), leaves)
    got = torch.autograd.grad((mlp(x, layers, True) ** 2).sum(), leaves)
    close(got, want)
    assert deferred.STATS == {"fused": depth - 1, "materialized": 0}


def test_knob_off_means_plain_backward(monkeypatch):
    monkeypatch.setenv("EVTORCH_FUSE_BACKWARD", "0")
    W1, b1, W2, b2 = params((16, 12), (16,), (10, 16), (10,))
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    want = torch.autograd.grad((mlp(x, [(W1, b1), (W2, b2)], False) ** 2).sum(), [x, W1, b1])
    got = torch.autograd.grad((mlp(x, [(W1, b1), (W2, b2)], True) ** 2).sum(), [x, W1, b1])
    close(got, want)
    assert deferred.STATS == {"fused": 0, "materialized": 0}


def _two_layers(fused, x, W1, b1, W2, b2):
    h = evt.linear(x, W1, gelu, bias=b1) if fused else gelu(F.linear(x, W1, b1))
    y = evt.linear(h, W2, bias=b2) if fused else F.linear(h, W2, b2)
    return h, y


@pytest.mark.parametrize("use", ["second_consumer", "hook", "retain_grad", "grad_of_h", "grad_of_h_and_W1"])
def test_uses_of_the_gradient_outside_the_pair_see_its_value(use):
    """Another consumer of h (gradients summed), a hook or retain_grad on h, autograd.grad asked for h: each
    needs dh's value, so it is computed, and every gradient (and h.grad) is exact."""
    W1, b1, W2, b2 = params((16, 12), (16,), (10, 16), (10,), seed=3)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    results = []
    for fused in (False, True):
        h, y = _two_layers(fused, x, W1, b1, W2, b2)
        loss = (y ** 2).sum()
        seen = []
        if use == "second_consumer":
            loss = loss + (h.sin() * 0.5).sum()
        if use == "hook":
            h.register_hook(lambda g: seen.append(g * 1.0) or g * 2.0)
        if use == "retain_grad":
            h.retain_grad()
        wrt = {"grad_of_h": [h], "grad_of_h_and_W1": [h, W1]}.get(use, [x, W1, b1, W2])
        grads = [g * 1.0 for g in torch.autograd.grad(loss, wrt)]  # any op: a deferred value is computed
        if use == "retain_grad":
            grads.append(h.grad * 1.0)
        results.append(grads + seen)
    close(results[1], results[0])
    if use in ("grad_of_h",):  # layer 1 does not run: nothing is handed on
        assert deferred.STATS["fused"] == 0
    else:
        assert deferred.STATS["materialized"] >= 1 or deferred.STATS["fused"] == 1


def test_hand_off_fuses_with_backward_and_accumulated_leaf_grads():
    """loss.backward() twice: .grad accumulates over two fused backwards exactly as over two torch ones."""
    W1, b1, W2, b2 = params((16, 12), (16,), (10, 16), (10,), seed=4)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    leaves = (x, W1, b1, W2, b2)
    for fused in (False, True):
        for _ in range(2):
            _, y = _two_layers(fused, x, W1, b1, W2, b2)
            (y ** 2).sum().backward()
        if not fused:
            want = [t.grad.clone() for t in leaves]
            for t in leaves:
                t.grad = None
    close([t.grad for t in leaves], want)
    assert deferred.STATS == {"fused": 2, "materialized": 0}


def test_producer_that_cannot_fuse_gets_the_value():
    """A producer whose backward recomputes A @ B (policy="recompute") or needs a second pass (amax) cannot take
    the hand-off: the consumer hands a plain gradient (or it is computed), gradients exact."""
    W1, b1, W2, b2 = params((16, 12), (16,), (10, 16), (10,), seed=5)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    want = torch.autograd.grad((F.linear(gelu(F.linear(x, W1, b1)), W2, b2) ** 2).sum(), [x, W1, b1, W2])
    h = evt.linear(x, W1, gelu, bias=b1, policy="recompute")
    got = torch.autograd.grad((evt.linear(h, W2, bias=b2) ** 2).sum(), [x, W1, b1, W2])
    close(got, want)
    assert deferred.STATS["fused"] == 0

    def tanh_rowmax(acc):  # amax's rule needs the ties counted first: a second pass over the tile
        y = torch.tanh(acc)
        return y, y.amax(dim=1)
    y_t = torch.tanh(x @ W1.T)
    want = torch.autograd.grad((F.linear(y_t, W2) ** 2).sum() + y_t.amax(dim=1).sum(), [x, W1, W2])
    h, m = evt.gemm(x, W1.T, tanh_rowmax)
    got = torch.autograd.grad((evt.linear(h, W2) ** 2).sum() + m.sum(), [x, W1, W2])
    close(got, want)
    # handed on (h's gradient alone would fuse), then computed: with m's gradient too it cannot
    assert deferred.STATS == {"fused": 0, "materialized": 1}


def test_multi_output_producer():
    """bias_gelu_aux-style producer returning (gelu(pre), pre): h feeds the next layer, pre a loss term. The
    gradient of h is fused, pre's arrives as a tensor into the same pass."""
    W1, b1, W2 = params((16, 12), (16,), (10, 16), seed=6)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)

    def act_aux(y):
        return gelu(y), y
    pre_t = F.linear(x, W1, b1)
    want = torch.autograd.grad((F.linear(gelu(pre_t), W2) ** 2).sum() + pre_t.cos().sum(), [x, W1, b1, W2])
    h, pre = evt.linear(x, W1, act_aux, bias=b1)
    got = torch.autograd.grad((evt.linear(h, W2) ** 2).sum() + pre.cos().sum(), [x, W1, b1, W2])
    close(got, want)
    assert deferred.STATS == {"fused": 1, "materialized": 0}


def test_batched_gemm_chain():
    A = torch.randn(3, 8, 12, dtype=DT, requires_grad=True)
    B1, B2, v = params((12, 16), (3, 16, 10), (16,), seed=7)

    def ep(acc, v):
        return torch.tanh(acc * v)
    want = torch.autograd.grad((torch.tanh((A @ B1) * v) @ B2).square().sum(), [A, B1, B2, v])
    h = evt.gemm(A, B1, ep, v=v)
    got = torch.autograd.grad(evt.gemm(h, B2).square().sum(), [A, B1, B2, v])
    close(got, want)
    assert deferred.STATS == {"fused": 1, "materialized": 0}


def test_transposed_or_sliced_operands_are_not_handed_on():
    W1, b1, W2 = params((16, 12), (16,), (10, 8), seed=8)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    want = torch.autograd.grad((F.linear(gelu(F.linear(x, W1, b1)).T, W2) ** 2).sum(), [x, W1, b1])
    h = evt.linear(x, W1, gelu, bias=b1)
    got = torch.autograd.grad((evt.linear(h.T, W2) ** 2).sum(), [x, W1, b1])
    close(got, want)
    W3, = params((10, 6), seed=9)
    want = torch.autograd.grad((F.linear(gelu(F.linear(x, W1, b1))[:, 2:8], W3) ** 2).sum(), [x, W1, b1])
    h = evt.linear(x, W1, gelu, bias=b1)
    got = torch.autograd.grad((evt.linear(h[:, 2:8], W3) ** 2).sum(), [x, W1, b1])
    close(got, want)
    assert deferred.STATS["fused"] == 0


def test_create_graph_keeps_plain_gradients():
    W1, b1, W2 = params((16, 12), (16,), (10, 16), seed=10)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    h = evt.linear(x, W1, gelu, bias=b1)
    (gx,) = torch.autograd.grad((evt.linear(h, W2) ** 2).sum(), [x], create_graph=True)
    assert type(gx) is torch.Tensor and deferred.STATS["fused"] == 0
    with pytest.raises(Exception, match="double backward"):
        gx.sum().backward()


def test_modules_sequential_and_state_dict_training_step():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU("tanh"), torch.nn.Linear(16, 4)).double()
    model = torch.nn.Sequential(evt.nn.Linear(12, 16, epilogue=gelu), evt.nn.Linear(16, 4)).double()
    model[0].load_state_dict(ref[0].state_dict())
    model[1].load_state_dict(ref[2].state_dict())
    x = torch.randn(5, 7, 12, dtype=DT)
    ref(x).square().mean().backward()
    model(x).square().mean().backward()
    close([p.grad for p in model.parameters()], [p.grad for p in ref.parameters()])
    assert deferred.STATS == {"fused": 1, "materialized": 0}


def test_deferred_grad_behaves_like_its_value():
    X = torch.randn(6, 5, dtype=DT)
    Y = torch.randn(5, 4, dtype=DT)
    calls = []
    d = DeferredGrad.of_product(X, Y, lambda a, b: calls.append(1) or a @ b)
    v = d.view(2, 3, 4).reshape(-1, 4)  # reshapes stay deferred
    assert isinstance(v, DeferredGrad) and not calls and v.take((6, 4)) is not None
    torch.testing.assert_close(d + 1, X @ Y + 1)
    torch.testing.assert_close(v.view(3, 8).sum(0), (X @ Y).view(3, 8).sum(0))
    assert len(calls) == 1  # computed once, shared by every view
    assert v.take((6, 4)) is None  # computed: a consumer must use the value
    d.mul_(2)
    torch.testing.assert_close(v * 1, 2 * (X @ Y))
    assert "computed" in repr(d)


@pytest.mark.skipif(not __import__("evtorch.runtime.knobs", fromlist=["x"]).interpreter_active(),
                    reason="the Triton backend on CPU needs TRITON_INTERPRET=1")
def test_triton_backend_through_the_interpreter():
    """The fused backward epilogue generated as a Triton GEMM epilogue (interpreter), fp32."""
    torch.manual_seed(11)
    W1 = (torch.randn(32, 16) / 4).requires_grad_()
    b1 = torch.randn(32, requires_grad=True)
    W2 = (torch.randn(16, 32) / 6).requires_grad_()
    x = torch.randn(24, 16, requires_grad=True)
    want = torch.autograd.grad((F.linear(gelu(F.linear(x, W1, b1)), W2) ** 2).sum(), [x, W1, b1, W2])
    h = evt.linear(x, W1, gelu, bias=b1, backend="triton")
    got = torch.autograd.grad((evt.linear(h, W2, backend="triton") ** 2).sum(), [x, W1, b1, W2])
    close(got, want, rtol=2e-5)
    assert deferred.STATS == {"fused": 1, "materialized": 0}


def test_fusion_choice_knob(monkeypatch):
    """EVTORCH_FUSE_BACKWARD parses auto/always/never (and 1/0); on the CPU "auto" fuses, and the choice is
    remembered per operand signature."""
    from evtorch.integration.function import _calls
    from evtorch.runtime import knobs
    for text, want in (("auto", "auto"), ("1", "auto"), ("always", "always"), ("0", "never"), ("off", "never")):
        monkeypatch.setenv("EVTORCH_FUSE_BACKWARD", text)
        assert knobs.FUSE_BACKWARD.get() == want
    monkeypatch.setenv("EVTORCH_FUSE_BACKWARD", "sometimes")
    with pytest.raises(ValueError, match="EVTORCH_FUSE_BACKWARD"):
        knobs.FUSE_BACKWARD.get()
    monkeypatch.delenv("EVTORCH_FUSE_BACKWARD")
    W1, b1, W2 = params((16, 12), (16,), (10, 16), seed=13)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    _calls.clear()
    h = evt.linear(x, W1, torch.relu, bias=b1)
    evt.linear(h, W2).sum().backward()
    (backward,) = h.grad_fn.call.backwards.values()
    assert list(backward.choices.values()) == [True] and deferred.STATS["fused"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act, how, fused", [("relu", "auto", False), ("gelu", "auto", False),
                                             ("relu", "always", True), ("gelu", "always", True)])
def test_mlp_block_on_gpu(dtype, act, how, fused, monkeypatch):
    """Generated kernels on the GPU: a 3-layer MLP (two hand-offs, fused or computed as the knob says; without
    autotuning "auto" computes them), gradients against fp32 torch autograd of the same (rounded) inputs;
    outputs poisoned so an unwritten element fails."""
    monkeypatch.setenv("EVTORCH_POISON", "1")
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "0")
    monkeypatch.setenv("EVTORCH_FUSE_BACKWARD", how)
    activation = torch.relu if act == "relu" else gelu
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(12)
    dims = [256, 384, 320, 192]
    ws = []
    for a, b in zip(dims, dims[1:]):
        ws += [torch.randn(b, a, generator=g) / a ** 0.5, torch.randn(b, generator=g) * 0.1]
    x = torch.randn(3, 100, dims[0], generator=g)
    gy = torch.randn(3, 100, dims[-1], generator=g)
    leaves = [t.to("cuda", dtype).requires_grad_() for t in [x, *ws]]
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    layers = list(zip(leaves[1::2], leaves[2::2]))
    ref_layers = list(zip(ref_leaves[1::2], ref_leaves[2::2]))
    got = torch.autograd.grad(mlp(leaves[0], layers, True, act=activation), leaves, gy.to("cuda", dtype))
    want = torch.autograd.grad(mlp(ref_leaves[0], ref_layers, False, act=activation), ref_leaves, gy.to("cuda"))
    # torch itself in this dtype: ReLU's mask is discontinuous, so in bf16 a few elements near 0 take the other
    # side (torch: from the rounded pre-activation; evtorch: from the rounded saved accumulator), and gradients
    # summing them are off by several percent for both (H200: torch 4.2e-2, evtorch 9.6e-2 on dx); the bound is
    # 3x torch's error, or the dtype's tolerance
    eager = torch.autograd.grad(mlp(leaves[0], layers, False, act=activation), leaves, gy.to("cuda", dtype))
    tol = 2e-4 if dtype == torch.float32 else 3e-2

    def rel(a, b):
        return ((a.float() - b).abs().max() / b.abs().max()).item()
    for a, b, c in zip(got, want, eager):
        assert rel(a, b) <= max(tol, 3 * rel(c, b)), (rel(a, b), rel(c, b))
    assert deferred.STATS == ({"fused": 2, "materialized": 0} if fused else {"fused": 0, "materialized": 2})


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing(reentrant):
    """torch.utils.checkpoint recomputes the block in the backward (a fresh graph, reentrant or not): the
    hand-off still fuses and gradients are exact."""
    from torch.utils.checkpoint import checkpoint
    W1, b1, W2 = params((16, 12), (16,), (10, 16), seed=14)
    x = torch.randn(8, 12, dtype=DT, requires_grad=True)
    leaves = (x, W1, b1, W2)

    def block(x, fused):
        if fused:
            return evt.linear(evt.linear(x, W1, gelu, bias=b1), W2)
        return F.linear(gelu(F.linear(x, W1, b1)), W2)
    grads = []
    for fused in (False, True):
        for t in leaves:
            t.grad = None
        checkpoint(block, x, fused, use_reentrant=reentrant).square().sum().backward()
        grads.append([t.grad.clone() for t in leaves])
    close(grads[1], grads[0])
    assert deferred.STATS == {"fused": 1, "materialized": 0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fusion_choice_is_timed_with_autotuning(monkeypatch, tmp_path):
    """With autotuning on a GPU, the first backward of a signature times the fused GEMM against the product GEMM
    plus the epilogue-only pass, keeps the faster, and the gradients are right either way."""
    from evtorch.integration.function import _calls
    from evtorch.runtime import gemm as rg
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "1")
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rg, "MAX_TUNE_CANDIDATES", 2)
    _calls.clear()
    g = torch.Generator().manual_seed(15)
    x, W1, b1, W2 = (torch.randn(512, 256, generator=g), torch.randn(384, 256, generator=g) / 16,
                     torch.randn(384, generator=g) * 0.1, torch.randn(128, 384, generator=g) / 20)
    leaves = [t.to("cuda", torch.bfloat16).requires_grad_() for t in (x, W1, b1, W2)]
    ref = [t.detach().float().requires_grad_() for t in leaves]
    h = evt.linear(leaves[0], leaves[1], torch.relu, bias=leaves[2])
    got = torch.autograd.grad(evt.linear(h, leaves[3]).square().sum(), leaves)
    want = torch.autograd.grad(F.linear(torch.relu(F.linear(ref[0], ref[1], ref[2])), ref[3]).square().sum(), ref)
    eager = torch.autograd.grad(F.linear(torch.relu(F.linear(*leaves[:3])), leaves[3]).square().sum(), leaves)
    for a, b, c in zip(got, want, eager):
        rel = lambda u: ((u.float() - b).abs().max() / b.abs().max()).item()  # noqa: E731
        assert rel(a) <= max(3e-2, 3 * rel(c))
    (backward,) = h.grad_fn.call.backwards.values()
    ((key, (fused_ms, unfused_ms)),) = backward.timings.items()
    assert fused_ms > 0 and unfused_ms > 0 and backward.choices[key] == (fused_ms < unfused_ms)
    assert deferred.STATS == ({"fused": 1, "materialized": 0} if fused_ms < unfused_ms
                              else {"fused": 0, "materialized": 1})
