"""evt.scan's generated kernels on a GPU: what the interpreter cannot show.

The interpreter runs programs one after another, so a decoupled look-back never waits on a running chunk and
never meets a flag left by an earlier launch. Here every look-back strategy runs many times in a row on one
cached sync buffer (each launch must find it reset by the one before, older epochs' flags reading as
unpublished) and under CUDA-graph replays (a fresh buffer per capture, reset by the captured memset), on
fresh random data each time, against float64 references. Run: ``TRITON_INTERPRET=0 pytest -m gpu tests``.
"""
import pytest
import torch

import evtorch as evt
from evtorch.scan import ScanConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ADD = lambda p, x: p + x  # noqa: E731
LIN = lambda h, a, x: a * h + x  # noqa: E731

CASES = [  # (T, lanes, config): the defaults on the shapes, then each look-back strategy forced
    (4096, 8192, None),
    (65536, 1024, None),
    (5001, 777, ScanConfig(strategy="lookback", window=4)),
    (20000, 700, ScanConfig(strategy="segmented", seg=64, persist=2, keep=True, prefetch=True)),
    (3001, 1500, ScanConfig(strategy="segmented/nocarry")),  # timing control: resets the buffer all the same
]


def rel_err(got, ref) -> float:
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _data(T, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(T, n, device="cuda", generator=g)
    A = 0.5 + 0.5 * torch.rand(T, n, device="cuda", generator=g)
    return X, A


def _refs(X, A):
    """float64 references: cumsum, and a * h + x by a float64 scan (float64 runs the look-back, checked
    against a Python loop in the interpreter tests; a closed form of the recurrence is unstable)."""
    return X.double().cumsum(0), evt.scan(LIN, A.double(), X.double(), init=X[:1].double())


@pytest.mark.parametrize("T,n,cfg", CASES, ids=["default-short", "default-long", "lookback", "segmented-persist",
                                                "nocarry"])
def test_repeated_launches_share_one_sync_buffer(T, n, cfg):
    for rep in range(4):
        X, A = _data(T, n, 100 + rep)
        Y = evt.scan(ADD, X, config=cfg)
        if cfg is not None and cfg.strategy.endswith("nocarry"):
            assert torch.equal(Y[0], X[0])  # init row written by the kernel; the rest is a timing control
            continue
        ref_sum, ref_lin = _refs(X, A)
        assert rel_err(Y, ref_sum) < 1e-4, (rep, rel_err(Y, ref_sum))
        H = evt.scan(LIN, A, X, init=X[:1], config=cfg)
        assert rel_err(H, ref_lin) < 1e-4, (rep, rel_err(H, ref_lin))
        M = evt.scan(lambda p, x: torch.maximum(p, x), X, config=cfg)
        assert torch.equal(M, X.cummax(0).values)


@pytest.mark.parametrize("T,n,cfg", CASES[:4], ids=["default-short", "default-long", "lookback",
                                                     "segmented-persist"])
def test_graph_replays(T, n, cfg):
    X, _ = _data(T, n, 7)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) off the capture, as torch.cuda.graph asks
        evt.scan(ADD, X, config=cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        Y = evt.scan(ADD, X, config=cfg)
    for rep in range(4):
        X.copy_(_data(T, n, 200 + rep)[0])
        Y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(Y, X.double().cumsum(0)) < 1e-4, rep
    # eager launches after the replays still find their cached buffer reset
    Z = evt.scan(ADD, X, config=cfg)
    assert rel_err(Z, X.double().cumsum(0)) < 1e-4


TANH = lambda h, a, x: torch.tanh(a * h + x)  # noqa: E731


@pytest.mark.parametrize("shape,coupled", [((2000, 3000), False), ((500, 64), True)], ids=["lanes", "coupled"])
def test_exact_gpu_forms_give_the_portable_bits(monkeypatch, shape, coupled):
    """On a GPU a float32 scan's tanh is ``tlmath.tanh_gpu`` (bare MUFU ops, fewer instructions on the step's
    dependent chain), the portable ``tlmath.tanh``'s values: the states and their gradients bit for bit against
    ``EVTORCH_FAST_MATH=never``, and within float32 rounding of a float64 loop. ``coupled``: every lane reads
    lane 0, the one-program kernel. The gradient's reverse scan is associative: ``deterministic=True``, or its
    look-back's roundings differ between any two runs (which failed this test once, H200 2026-11-29)."""
    T, n = shape
    g = torch.Generator(device="cuda").manual_seed(5)
    X = torch.randn(T, n, device="cuda", generator=g)
    A = (0.5 + 0.5 * torch.rand(T, n, device="cuda", generator=g)).requires_grad_(not coupled)
    fn = (lambda h, a, x: torch.tanh(a * h + x + 0.25 * h[..., :1])) if coupled else TANH
    runs = {}
    for mode in ("never", "auto"):
        monkeypatch.setenv("EVTORCH_FAST_MATH", mode)
        out = evt.scan(fn, A, X, init=X[:1], deterministic=True)
        grad = None if coupled else torch.autograd.grad(out, A, torch.ones_like(out))[0]  # (lane-wise autograd)
        runs[mode] = (out.detach(), grad)
    assert torch.equal(runs["never"][0], runs["auto"][0])
    assert coupled or torch.equal(runs["never"][1], runs["auto"][1])
    h, ref = X[0].double(), [X[0].double()]
    for t in range(1, T):
        h = fn(h, A[t].detach().double(), X[t].double())
        ref.append(h)
    assert rel_err(runs["auto"][0], torch.stack(ref)) < 1e-5


DET_CASES = [(2000, 3000, torch.float32), (65536, 1024, torch.float32), (20000, 4096, torch.bfloat16),
             (6000, 2048, torch.float64)]


@pytest.mark.parametrize("T,n,dtype", DET_CASES, ids=["short-fp32", "long-fp32", "long-bf16", "fp64"])
def test_deterministic_scans_are_bit_identical_between_runs(T, n, dtype):
    """``deterministic=True`` (and ``torch.use_deterministic_algorithms``) runs associative scans on the
    three-pass strategy: five runs of ``a * h + x``, of a sum and of a logaddexp give the same bits, and so do the
    gradients of ``a * h + x``, whose backward is itself an associative scan; each within rounding of a float64
    reference. (The look-back's results differ between runs in the last bits: the failure that led to this.)"""
    X, A = _data(T, n, seed=11)
    X, A = X.to(dtype), A.to(dtype)
    ref_sum, ref_lin = _refs(X, A)
    for fn, args, ref in ((ADD, (X,), ref_sum), (LIN, (A, X), ref_lin), (lambda p, x: torch.logaddexp(p, x), (X,), None)):
        runs = [evt.scan(fn, *args, init=X[:1], deterministic=True) for _ in range(5)]
        assert all(torch.equal(runs[0], r) for r in runs[1:]), fn
        if ref is not None:
            assert rel_err(runs[0], ref) < {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float64: 1e-10}[dtype]
    a = A.clone().requires_grad_()
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(3):
            out = evt.scan(LIN, a, X, init=X[:1])
            grads.append(torch.autograd.grad(out, a, torch.ones_like(out))[0])
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(grads[0], g) for g in grads[1:])
