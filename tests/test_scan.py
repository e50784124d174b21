"""evt.scan on CPU: the reference executor and the generated kernels through Triton's interpreter.

Every check compares against a plain Python loop over time written with eager torch ops (the oracle), on
fresh random data; kernel outputs are fresh ``torch.empty`` tensors, so an element a kernel fails to write
holds garbage and fails the comparison.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py also sets it)

import pytest
import torch
import triton
import triton.language as tl

import evtorch as evt
from evtorch.scan import ScanConfig
from evtorch.scan.api import get_body
from evtorch.scan.body import RowSpec
from evtorch.scan.launch import kernel_for

pytestmark = pytest.mark.interpreter
BACKENDS = ["reference", "triton"]


def loop(body, inits, *xs, dim=0):
    """The oracle: Y[t] = body(Y[t-1]..., X[t]...) with eager torch, states kept in float64."""
    xs = [x.movedim(dim, 0) for x in xs]
    single = isinstance(inits, torch.Tensor)
    inits = [inits] if single else list(inits)
    inits = [i.movedim(dim, 0) for i in inits]
    k, T = inits[0].shape[0], xs[0].shape[0]
    hist = [[row.double() for row in init] for init in inits]
    for t in range(k, T):
        new = body(*[h[t - 1] for h in hist], *[x[t].double() for x in xs])
        new = [new] if single else list(new)
        for h, v, init in zip(hist, new, inits):
            h.append(torch.as_tensor(v).double().expand(init.shape[1:]))
    outs = [torch.stack(h).to(init.dtype).movedim(0, dim) for h, init in zip(hist, inits)]
    return outs[0] if single else tuple(outs)


def close(a, b, tol=1e-5):
    a, b = a.double(), b.double()
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.isfinite(a).all() == torch.isfinite(b).all()
    err = (a - b).norm() / b.norm().clamp_min(1e-30)
    assert err < tol, f"relative error {err:.3g}"


# ---------------------------------------------------------------------------------------------- recurrences
ASSOC = {
    "sum": (lambda h, x: h + x, "sum"),
    "prod": (lambda h, x: h * x, "prod"),
    "max": (lambda h, x: torch.maximum(h, x), "max"),
    "min": (lambda h, x: torch.min(x, h), "min"),
    "logaddexp": (lambda h, x: torch.logaddexp(h, x), "logaddexp"),
    "affine": (lambda h, x: 0.5 * (h - x) + 1.0, "linear"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ASSOC))
@pytest.mark.parametrize("T,n", [(37, 5), (3, 70), (100, 3)])
def test_associative(backend, name, T, n):
    fn, kind = ASSOC[name]
    X = torch.randn(T, n)
    if name == "prod":
        X = 1.0 + 0.05 * X
    Y = evt.scan(fn, X, backend=backend)
    close(Y, loop(fn, X[:1], X))
    body = get_body(fn, None, [RowSpec("s0", (n,), X.dtype)], [RowSpec("x0", (n,), X.dtype)], 1)
    assert body.groups[0].mode == "assoc" and body.groups[0].assoc.kind == kind


@pytest.mark.parametrize("cfg", [ScanConfig(strategy="lookback", window=1, block_t=8, block_n=4),
                                 ScanConfig(strategy="lookback", window=4, block_t=4, block_n=8),
                                 ScanConfig(strategy="lookback", window=2, block_t=16, block_n=4, sub=4),
                                 ScanConfig(strategy="packed", window=1, block_t=8, block_n=4),
                                 ScanConfig(strategy="packed", window=4, block_t=8, block_n=8, sub=2),
                                 ScanConfig(strategy="threepass", block_t=4, block_n=4, seg=8),
                                 ScanConfig(strategy="threepass", block_t=8, block_n=16, seg=8),
                                 ScanConfig(strategy="segmented", window=1, block_t=4, block_n=4, seg=8),
                                 ScanConfig(strategy="segmented", window=4, block_t=8, block_n=8, seg=16,
                                            l2hint=False)])
@pytest.mark.parametrize("name", ["sum", "max", "affine"])
def test_parallel_strategies(cfg, name):
    fn, _ = ASSOC[name]
    X = torch.randn(75, 10)  # many chunks, segments and lane tiles, none full at the end
    init = torch.randn(2, 10)
    close(evt.scan(fn, X, init=init, backend="triton", config=cfg), loop(fn, init, X))


@pytest.mark.parametrize("name", list(ASSOC))
@pytest.mark.parametrize("T,n,cfg", [
    (75, 10, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=12)),   # ragged T and lanes
    (130, 37, ScanConfig(strategy="segmented", window=8, block_t=8, block_n=16, seg=32)),
    (9, 5, ScanConfig(strategy="segmented", window=4, block_t=4, block_n=8, seg=16)),     # one partial segment
    (200, 3, ScanConfig(strategy="segmented", window=1, block_t=2, block_n=2, seg=2)),    # one tile a segment
    (150, 21, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=8, seg=8, persist=1)),  # 8 programs
    (77, 9, ScanConfig(strategy="segmented", window=4, block_t=8, block_n=4, seg=16, persist=3, l2hint=False)),
    (40, 6, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=8, maxnreg=96)),
    # the last tile kept in registers / the first re-read tile loaded before the look-back / both
    (75, 10, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=12, keep=True)),
    (75, 10, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=12, prefetch=True)),
    (75, 10, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=12, keep=True, prefetch=True)),
    (130, 37, ScanConfig(strategy="segmented", window=8, block_t=8, block_n=16, seg=16, keep=True, prefetch=True)),
    (9, 5, ScanConfig(strategy="segmented", window=4, block_t=4, block_n=8, seg=16, keep=True, prefetch=True)),
    (200, 3, ScanConfig(strategy="segmented", window=1, block_t=2, block_n=2, seg=2, keep=True, prefetch=True)),
    (150, 21, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=8, seg=8, persist=1, keep=True,
                         prefetch=True)),
    (77, 9, ScanConfig(strategy="segmented", window=4, block_t=8, block_n=4, seg=8, persist=3, prefetch=True))])
def test_segmented_strategy(name, T, n, cfg):
    """Each program reads a segment twice around one look-back over segments: every associative kind, T not
    a multiple of the segment, lanes not a multiple of the tile, k = 2 init rows."""
    fn, _ = ASSOC[name]
    X = torch.randn(T, n)
    if name == "prod":
        X = 1.0 + 0.05 * X
    init = torch.randn(2, n) if name != "prod" else 1.0 + 0.05 * torch.randn(2, n)
    close(evt.scan(fn, X, init=init, backend="triton", config=cfg), loop(fn, init, X))


@pytest.mark.parametrize("extra", [{}, {"keep": True}, {"prefetch": True}, {"keep": True, "prefetch": True}])
def test_segmented_post_and_broadcast_inputs(extra):
    T, n = 61, 11
    A, X, C = torch.rand(T, 1), torch.randn(T, n), torch.randn(T, n)
    cfg = ScanConfig(strategy="segmented", window=2, block_t=4, block_n=8, seg=8, **extra)
    fn = lambda h, a, x, c: a * h + x  # noqa: E731
    Z = evt.scan(fn, A, X, C, init=torch.zeros(1, n), post=lambda h, a, x, c: c * h, backend="triton", config=cfg)
    close(Z, C * loop(fn, torch.zeros(1, n), A.expand(T, n), X, C))


@pytest.mark.parametrize("strategy,persist,keep", [("lookback/nocarry", None, None), ("segmented/nocarry", None, None),
                                                   ("segmented/nocarry", 1, None), ("segmented/nocarry", None, True)])
def test_nocarry_controls_drop_the_carry(strategy, persist, keep):
    """The timing controls skip the look-back: right inside the first chunk / segment, wrong after it."""
    X = torch.rand(64, 8) + 0.5
    Y = evt.scan(lambda h, x: h + x, X, backend="triton",
                 config=ScanConfig(strategy=strategy, window=2, block_t=4, block_n=8, seg=8, persist=persist,
                                   keep=keep, prefetch=keep))
    ref = X.cumsum(0)
    close(Y[:5], ref[:5])
    assert (Y[-1] < ref[-1] - 1.0).all()


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy"):
        evt.scan(lambda h, x: h + x, torch.randn(9, 3), backend="triton",
                 config=ScanConfig(strategy="threepass/nocarry"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cumsum_matches_torch(backend):
    X = torch.randn(257, 19)
    close(evt.scan(lambda p, x: p + x, X, backend=backend), torch.cumsum(X, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_recurrence(backend):
    T, n = 77, 9
    A, X = torch.rand(T, n), torch.randn(T, n)
    fn = lambda h, a, x: a * h + x  # noqa: E731
    H = evt.scan(fn, A, X, init=X[:1], backend=backend)
    close(H, loop(fn, X[:1], A, X))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonlinear_recurrence_runs_sequentially(backend):
    T, n = 40, 70
    A, X = torch.rand(T, n), torch.randn(T, n)
    fn = lambda h, a, x: torch.tanh(a * h + x)  # noqa: E731
    close(evt.scan(fn, A, X, init=X[:1], backend=backend), loop(fn, X[:1], A, X))
    body = get_body(fn, None, [RowSpec("s0", (n,), X.dtype)], [RowSpec("x0", (n,), X.dtype)] * 2, 1)
    assert body.groups[0].mode == "lanes"


@pytest.mark.parametrize("backend", BACKENDS)
def test_multistage_body_and_broadcast_inputs(backend):
    T, n = 29, 6
    A = torch.rand(T, 1)           # one coefficient per step, broadcast over lanes
    B, X = torch.randn(T, n), torch.randn(T, n)

    def body(h, a, b, x):
        decay = torch.sigmoid(a) * 0.9      # stage 1: inputs only
        drive = b * x + 0.1                 # stage 2
        return h * decay + drive            # affine in h through the stages

    close(evt.scan(body, A, B, X, init=X[:1], backend=backend), loop(body, X[:1], A, B, X))
    g = get_body(body, None, [RowSpec("s0", (n,), X.dtype)],
                 [RowSpec("x0", (1,), X.dtype), RowSpec("x1", (n,), X.dtype), RowSpec("x2", (n,), X.dtype)],
                 1).groups[0]
    assert g.mode == "assoc" and g.assoc.kind == "linear"


@pytest.mark.parametrize("backend", BACKENDS)
def test_k2_init_reads_two_steps_back(backend):
    T, n = 31, 4
    X = torch.randn(T, n) * 0.1
    init = torch.randn(2, n)
    Y = evt.scan(lambda h, x: 0.5 * h + 0.3 * h.at(-2) + x, X, init=init, backend=backend)
    ref = [init[0], init[1]]
    for t in range(2, T):
        ref.append(0.5 * ref[t - 1] + 0.3 * ref[t - 2] + X[t])
    close(Y, torch.stack(ref))
    assert torch.equal(Y[:2], init)


@pytest.mark.parametrize("backend", BACKENDS)
def test_k3_init_first_order(backend):
    X = torch.randn(20, 3)
    init = torch.randn(3, 3)
    Y = evt.scan(lambda h, x: h + x, X, init=init, backend=backend)
    ref = torch.cat([init, init[2] + X[3:].cumsum(0)])
    close(Y, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_coupled_states_tvm_example(backend):
    T, n, m = 23, 5, 7
    X = torch.randn(T, n)
    init = (X[:1], torch.zeros(1, m))
    fn = lambda s1, s2, x: (s1 + x, s2 + s1[..., :1])  # noqa: E731
    S1, S2 = evt.scan(fn, X, init=init, backend=backend)
    R1, R2 = loop(fn, init, X)
    close(S1, R1)
    close(S2, R2)
    body = get_body(fn, None, [RowSpec("s0", (n,), X.dtype), RowSpec("s1", (m,), X.dtype)],
                    [RowSpec("x0", (n,), X.dtype)], 1)
    assert [g.mode for g in body.groups] == ["coupled"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_coupled_states_reading_shifted_lanes(backend):
    T, n = 17, 6
    X = torch.randn(T, n) * 0.3
    # u reads one lane of v; v reads u's last lane and every other lane of u (a strided slice)
    fn = lambda u, v, x: (torch.tanh(0.5 * u + x + 0.1 * v[..., 1:2]),  # noqa: E731
                          v * 0.5 + u[..., -1:] + u[..., ::2])
    init = (torch.randn(1, n), torch.randn(1, 3))
    A1, A2 = evt.scan(fn, X, init=init, backend=backend)
    R1, R2 = loop(fn, init, X)
    close(A1, R1)
    close(A2, R2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_independent_states_split_into_groups(backend):
    T, n = 26, 5
    X, A = torch.randn(T, n), torch.rand(T, n)
    fn = lambda s, p, m, x, a: (s + x, a * p + x, torch.maximum(m, x))  # noqa: E731
    init = (X[:1], X[:1], X[:1])
    outs = evt.scan(fn, X, A, init=init, backend=backend)
    for got, ref in zip(outs, loop(fn, init, X, A)):
        close(got, ref)
    body = get_body(fn, None, [RowSpec(f"s{j}", (n,), X.dtype) for j in range(3)],
                    [RowSpec("x0", (n,), X.dtype)] * 2, 1)
    assert [g.assoc.kind for g in body.groups] == ["sum", "linear", "max"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", [1, -1])
def test_scan_over_other_dim(backend, dim):
    X = torch.randn(4, 45, 3).transpose(1, 2) if dim == -1 else torch.randn(4, 45, 3)
    Y = evt.scan(lambda h, x: h * 0.9 + x, X, dim=dim, backend=backend)
    close(Y, loop(lambda h, x: h * 0.9 + x, X.narrow(dim, 0, 1), X, dim=dim))
    assert Y.shape == X.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_multidim_rows_and_slices(backend):
    T = 19
    X = torch.randn(T, 3, 4)
    fn = lambda h, x: torch.tanh(h * x[:, :1] + x)  # noqa: E731
    close(evt.scan(fn, X, backend=backend), loop(fn, X[:1], X))


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_fuses_an_output_map(backend):
    T, n = 33, 6
    A, B, C = torch.rand(T, n), torch.randn(T, n), torch.randn(T, n)
    Y = evt.scan(lambda h, a, b, c: a * h + b, A, B, C, init=torch.zeros(1, n),
                 post=lambda h, a, b, c: c * h, backend=backend)
    H = loop(lambda h, a, b, c: a * h + b, torch.zeros(1, n), A, B, C)
    close(Y, C * H)


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_keeps_its_return_container(backend):
    """A post function returning a list gives a list back (it came back as a tuple), a tuple a tuple."""
    X = torch.randn(9, 4)
    H = loop(lambda h, x: h + x, X[:1], X)
    for post, kind in ((lambda h, x: [h * 2, h - x], list), (lambda h, x: (h * 2, h - x), tuple)):
        got = evt.scan(lambda h, x: h + x, X, post=post, backend=backend)
        assert type(got) is kind
        close(got[0], 2 * H)
        close(got[1], H - X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_on_sequential_and_coupled(backend):
    T, n = 15, 4
    X = torch.randn(T, n)
    Y, Z = evt.scan(lambda h, x: torch.tanh(h + x), X, post=lambda h, x: (h * 2, torch.relu(h - x)),
                    backend=backend)
    H = loop(lambda h, x: torch.tanh(h + x), X[:1], X)
    close(Y, 2 * H)
    close(Z, torch.relu(H - X))
    init = (X[:1], torch.zeros(1, 2))
    P = evt.scan(lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), X, init=init,
                 post=lambda s1, s2, x: s2 * s1[..., :1], backend=backend)
    R1, R2 = loop(lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), init, X)
    close(P, R2 * R1[..., :1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_read_at_previous_step(backend):
    X = torch.randn(21, 3)
    Y = evt.scan(lambda h, x: 0.5 * h + x - x.at(-1), X, backend=backend)
    ref = [X[0]]
    for t in range(1, 21):
        ref.append(0.5 * ref[-1] + X[t] - X[t - 1])
    close(Y, torch.stack(ref))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_and_integer_states(backend):
    X = torch.randn(30, 4, dtype=torch.float64)
    close(evt.scan(lambda h, x: h * 0.5 + x, X, backend=backend),
          loop(lambda h, x: h * 0.5 + x, X[:1], X), 1e-12)
    I = torch.randint(-5, 5, (30, 4))
    got = evt.scan(lambda h, x: torch.where(x > 0, h + x, h), I, backend=backend)
    assert got.dtype == torch.int64
    assert torch.equal(got, loop(lambda h, x: torch.where(x > 0, h + x, h), I[:1], I))


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_equals_k_and_length_only(backend):
    X = torch.randn(1, 5)
    assert torch.equal(evt.scan(lambda h, x: h + x, X, backend=backend), X)
    init = torch.ones(1, 3)
    Y = evt.scan(lambda h: h * 2.0, init=init, length=5, backend=backend)
    close(Y, torch.stack([torch.full((3,), 2.0 ** t) for t in range(5)]))


def test_generated_sources_use_no_libdevice():
    fns = [ASSOC["logaddexp"][0], lambda h, x: torch.tanh(torch.erf(h) + torch.sigmoid(x)),
           lambda s1, s2, x: (s1 + x, s2 + s1[..., :1])]
    specs = [([RowSpec("s0", (8,), torch.float32)],), ([RowSpec("s0", (8,), torch.float32)],),
             ([RowSpec("s0", (8,), torch.float32), RowSpec("s1", (3,), torch.float32)],)]
    for fn, (states,) in zip(fns, specs):
        body = get_body(fn, None, states, [RowSpec("x0", (8,), torch.float32)], 1)
        for g in body.groups:
            kern, _ = kernel_for(body, g, ScanConfig())
            assert "libdevice" not in kern.source and "inline_asm" not in kern.source
            assert "@triton.jit" in kern.source


def test_exact_gpu_forms_only_in_the_gpus_kernels(monkeypatch):
    """A GPU's float32 scan kernels take the ops' exact GPU forms (tanh's ``tlmath.tanh_gpu``: the same values in
    fewer instructions, tests/test_scan_gpu.py), one kernel per choice; the interpreter's never (inline PTX does
    not run there), nor any under ``EVTORCH_FAST_MATH=never``. float64 kernels take only the forms that serve
    float64: pow's (libdevice), not tanh's (MUFU ops are float32 only)."""
    from evtorch.scan import launch
    fns = {"lanes": lambda h, x: torch.tanh(0.5 * h + x),
           "coupled": lambda h, x: torch.tanh(0.5 * h + x + h[..., :1]),
           "assoc": lambda h, x: h + torch.tanh(x)}
    for mode, fn in fns.items():
        body = get_body(fn, None, [RowSpec("s0", (8,), torch.float32)], [RowSpec("x0", (8,), torch.float32)], 1)
        g, = body.groups
        assert g.mode == mode
        gpu, portable = kernel_for(body, g, ScanConfig(), True)[0], kernel_for(body, g, ScanConfig())[0]
        assert "tlmath.tanh_gpu(" in gpu.source and "tlmath.tanh_gpu(" not in portable.source
        assert "tlmath.tanh(" in portable.source
    x = torch.randn(4, 8)
    assert not launch.gpu_forms(x, torch.float32)  # a CPU tensor: the interpreter
    monkeypatch.setattr(launch, "fast_math_mode", lambda t: "auto")  # as on a capable GPU
    assert launch.gpu_forms(x, torch.float32) and launch.gpu_forms(x, torch.float64)
    f64 = torch.float64
    body = get_body(lambda h, x: torch.tanh(0.5 * h + x) + x ** 2.5, None, [RowSpec("s0", (8,), f64)],
                    [RowSpec("x0", (8,), f64)], 1)
    g, = body.groups
    gpu = kernel_for(body, g, ScanConfig(), True)[0].source
    assert "tlmath.tanh(" in gpu and "tlmath.tanh_gpu(" not in gpu and "tlmath.pow_gpu(" in gpu
    monkeypatch.setattr(launch, "fast_math_mode", lambda t: "never")
    assert not launch.gpu_forms(x, torch.float32)


def test_explicit_config_is_honoured():
    X = torch.randn(50, 40)
    for cfg in (ScanConfig(block_t=4, block_n=8), ScanConfig(block_t=64, block_n=64)):
        close(evt.scan(lambda h, x: h + x, X, backend="triton", config=cfg), X.cumsum(0))
    close(evt.scan(lambda h, x: torch.tanh(h + x), X, backend="triton", config=ScanConfig(block_n=16, depth=2)),
          loop(lambda h, x: torch.tanh(h + x), X[:1], X))


SCALE = 0.5


def test_trace_cache_follows_code_closures_and_globals():
    from evtorch.scan import api
    global SCALE
    X = torch.randn(12, 3)
    api._CACHE.clear()
    for _ in range(3):  # an inline lambda is a new function object per call: traced once
        evt.scan(lambda h, x: h + x, X)
    assert len(api._CACHE) == 1
    for c in (0.5, 2.0):  # a captured constant is part of the trace
        close(evt.scan(lambda h, x: h * c + x, X), loop(lambda h, x: h * c + x, X[:1], X))
    for SCALE in (0.5, 2.0):  # so is a module global the body reads
        close(evt.scan(lambda h, x: h * SCALE + x, X), loop(lambda h, x: h * SCALE + x, X[:1], X))
    assert len(api._CACHE) == 5


def test_gpu_heuristic_picks_the_measured_configs():
    """The GPU defaults of docs/scan.md (H200 runs 3-6): segmented on long scans (float32 sums: 8-step tiles,
    last tile kept, first re-read tile prefetched; the linear recurrence: last tile kept), look-back on short
    ones."""
    from evtorch.scan.launch import heuristic

    class Cuda:
        type = "cuda"

    def pick(fn, n_inputs, dtype, T, n=1024):
        body = get_body(fn, None, [RowSpec("s0", (n,), dtype)], [RowSpec(f"x{i}", (n,), dtype)
                                                                 for i in range(n_inputs)], 1)
        c = heuristic(body, body.groups[0], T, Cuda(), ScanConfig())
        return c.strategy, c.block_t, c.block_n, c.seg if c.strategy in ("segmented", "threepass") else c.window

    def held(fn, n_inputs, dtype, T, n=1024):
        body = get_body(fn, None, [RowSpec("s0", (n,), dtype)], [RowSpec(f"x{i}", (n,), dtype)
                                                                 for i in range(n_inputs)], 1)
        c = heuristic(body, body.groups[0], T, Cuda(), ScanConfig())
        return c.keep, c.prefetch

    add, lin = (lambda h, x: h + x), (lambda h, a, x: a * h + x)
    lae = lambda h, x: torch.logaddexp(h, x)  # noqa: E731
    assert pick(add, 1, torch.float32, 65536) == ("segmented", 8, 512, 32)
    assert held(add, 1, torch.float32, 65536) == (True, True)
    assert held(lin, 2, torch.float32, 65536) == (True, False)
    assert held(add, 1, torch.bfloat16, 65536) == (False, False)  # keep spills with 16-bit tiles
    assert pick(add, 1, torch.float32, 4096, 8192) == ("lookback", 16, 512, 1)
    assert pick(add, 1, torch.bfloat16, 65536) == ("segmented", 16, 1024, 32)
    assert pick(add, 1, torch.bfloat16, 4096, 8192) == ("lookback", 16, 1024, 1)
    assert pick(lin, 2, torch.float32, 65536) == ("segmented", 16, 512, 32)
    assert pick(lin, 2, torch.float32, 4096, 8192) == ("lookback", 16, 512, 8)
    assert pick(lin, 2, torch.bfloat16, 65536) == ("segmented", 8, 1024, 32)
    assert pick(lae, 1, torch.float32, 65536) == ("segmented", 8, 512, 64)
    assert pick(add, 1, torch.float64, 65536) == ("lookback", 16, 512, 16)



def test_deterministic_scans_take_the_three_pass_strategy(monkeypatch):
    """``deterministic=True``, or None under ``torch.use_deterministic_algorithms(True)``, puts every associative
    group on the three-pass strategy (a fixed combination order; the look-backs fold whatever totals are published,
    which changed a gradient's bits between two runs on the H200), on GPU shapes and in the interpreter alike; a
    config that forces a look-back is refused by name; step-by-step scans keep their kernels. The results match
    the reference backend."""
    from evtorch.scan import launch
    from evtorch.scan.errors import ScanError

    class Cuda:
        type = "cuda"

    add, lin = (lambda h, x: h + x), (lambda h, a, x: a * h + x)
    lae = lambda h, x: torch.logaddexp(h, x)  # noqa: E731
    for fn, n_in, dtype, T in [(add, 1, torch.float32, 65536), (add, 1, torch.float32, 4096),
                               (lin, 2, torch.float32, 65536), (lin, 2, torch.bfloat16, 4096),
                               (lae, 1, torch.float32, 65536), (add, 1, torch.float64, 65536)]:
        body = get_body(fn, None, [RowSpec("s0", (1024,), dtype)],
                        [RowSpec(f"x{i}", (1024,), dtype) for i in range(n_in)], 1)
        c = launch.heuristic(body, body.groups[0], T, Cuda(), ScanConfig(), deterministic=True)
        assert (c.strategy, c.keep, c.prefetch, c.persist) == ("threepass", False, False, None), (fn, dtype, T)
        assert c.seg % c.block_t == 0
        with pytest.raises(ScanError, match=r"config.strategy='segmented'.*deterministic.*threepass"):
            launch.heuristic(body, body.groups[0], T, Cuda(), ScanConfig(strategy="segmented"), deterministic=True)

    strategies = []
    real = launch.heuristic

    def spy(*args, **kwargs):
        cfg = real(*args, **kwargs)
        strategies.append(cfg.strategy)
        return cfg
    monkeypatch.setattr(launch, "heuristic", spy)
    g = torch.Generator().manual_seed(3)
    A, X = 0.5 + 0.5 * torch.rand(70, 12, generator=g), torch.randn(70, 12, generator=g)
    ref = evt.scan(lin, A, X, backend="reference")
    for deterministic, flag, want in [(True, False, "threepass"), (None, True, "threepass"),
                                      (None, False, "lookback"), (False, True, "lookback")]:
        strategies.clear()
        torch.use_deterministic_algorithms(flag)
        try:
            out = evt.scan(lin, A, X, backend="triton", deterministic=deterministic)
        finally:
            torch.use_deterministic_algorithms(False)
        assert strategies == [want], (deterministic, flag, strategies)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    strategies.clear()
    out = evt.scan(lambda h, x: torch.tanh(h + x), X, backend="triton", deterministic=True)  # lanes: no strategy
    assert strategies == [None]
    torch.testing.assert_close(out, evt.scan(lambda h, x: torch.tanh(h + x), X), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match=r"evt.scan: deterministic must be True, False or None.*got 1"):
        evt.scan(lin, A, X, deterministic=1)


# ---------------------------------------------------------------------------------------------- one launch
INIT_ROW_CONFIGS = [ScanConfig(strategy="lookback", window=2, block_t=4, block_n=4),
                    ScanConfig(strategy="lookback", window=1, block_t=8, block_n=8, sub=2),
                    ScanConfig(strategy="lookback/nocarry", window=1, block_t=4, block_n=4),
                    ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=8),
                    ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=12, keep=True, prefetch=True),
                    ScanConfig(strategy="segmented", window=2, block_t=4, block_n=8, seg=8, persist=1),
                    ScanConfig(strategy="segmented", window=1, block_t=4, block_n=4, seg=8, persist=1, keep=True,
                               prefetch=True),
                    ScanConfig(strategy="segmented/nocarry", window=1, block_t=4, block_n=4, seg=8, persist=1),
                    ScanConfig(strategy="packed", window=2, block_t=4, block_n=4),
                    ScanConfig(strategy="threepass", block_t=4, block_n=4, seg=8)]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cfg", INIT_ROW_CONFIGS, ids=lambda c: f"{c.strategy}-p{c.persist}-k{c.keep}")
@pytest.mark.parametrize("name", ["sum", "affine"])
def test_assoc_kernels_write_the_init_rows(name, cfg, k):
    """The kernel launch alone (``run_group``, outputs NaN-filled) writes every row, init rows [0, k) included:
    the caller no longer copies them."""
    from evtorch.scan.launch import run_group
    fn, _ = ASSOC[name]
    T, n = 41, 10
    X, init = torch.randn(T, n), torch.randn(k, n)
    body = get_body(fn, None, [RowSpec("s0", (n,), X.dtype)], [RowSpec("x0", (n,), X.dtype)], k)
    Y = torch.full((T, n), float("nan"))
    run_group(body, body.groups[0], [init], [X], [Y], [], T, cfg)
    assert torch.equal(Y[:k], init)
    if "nocarry" in cfg.strategy:  # right up to the first chunk's end only
        close(Y[:k + 4], loop(fn, init, X)[:k + 4])
    else:
        close(Y, loop(fn, init, X))


def test_host_copies_init_rows_only_where_no_kernel_does(monkeypatch):
    """``run_forward`` leaves rows [0, k) of associative states to their kernels and still writes them for
    sequential and coupled groups, post outputs, and T == k (no kernel runs)."""
    from evtorch.scan import launch
    real = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(launch, "run_group", lambda *a, **kw: None)  # no kernels: what the host writes alone
    X, init = torch.randn(9, 4), torch.randn(2, 4)
    S, H = evt.scan(lambda s, h, x: (s + x, torch.tanh(h + x)), X, init=(init, init), backend="triton")
    assert S[:2].isnan().all() and torch.equal(H[:2], init)
    assert torch.equal(evt.scan(lambda s, x: s + x, X[:2], init=init, backend="triton"), init)  # T == k
    P = evt.scan(lambda s, x: s + x, X, init=init, post=lambda s, x: 2 * s, backend="triton")
    assert torch.equal(P[:2], 2 * init)
    monkeypatch.undo()
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real(*a, **kw).fill_(float("nan")))  # with kernels
    S, H = evt.scan(lambda s, h, x: (s + x, torch.tanh(h + x)), X, init=(init, init), backend="triton")
    R1, R2 = loop(lambda s, h, x: (s + x, torch.tanh(h + x)), (init, init), X)
    close(S, R1)
    close(H, R2)


def _sync(device=torch.device("cpu")):
    """(buffer, tickets taken, epoch of the last launch) of the cached look-back buffer."""
    from evtorch.scan import launch
    return tuple(launch._SYNC[(device, None)])


SYNC_CASES = [  # (T, n, config, flags a launch uses, tickets it takes): growing, so the cached buffer is replaced
    (20, 4, ScanConfig(strategy="lookback", window=1, block_t=4, block_n=4), 5, 5),
    (21, 9, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=8, keep=True, prefetch=True), 9, 9),
    (40, 6, ScanConfig(strategy="lookback", window=2, block_t=4, block_n=4, sub=2), 20, 20),
    # persistent: 1 program per "SM" (8 under the interpreter) takes the 54 segments, then one ticket each to stop
    (70, 10, ScanConfig(strategy="segmented", window=2, block_t=4, block_n=4, seg=4, persist=1), 3 * 18, 54 + 8),
    (45, 6, ScanConfig(strategy="lookback", window=4, block_t=2, block_n=8), 22, 22)]


def test_sync_buffer_reused_without_clearing(monkeypatch):
    """Look-back launches reuse one cached sync buffer that nobody clears: the host's ticket count matches the
    device counter after each launch (so the next launch's TBASE is right), the epoch grows by one, and this
    launch's flags read ``epoch * 4 + 2`` (inclusive prefix published) over the previous launch's. (The
    interpreter runs programs one after another, so a look-back never meets an earlier launch's flag here:
    that it reads as unpublished is argued in ``assoc.py`` and exercised by tests/test_scan_gpu.py.)"""
    from evtorch.scan import launch
    monkeypatch.setattr(launch, "_SYNC", {})
    fn = lambda h, x: 0.5 * h + x  # noqa: E731
    last = None
    for T, n, cfg, nflags, tickets in SYNC_CASES:
        X = torch.randn(T, n)
        for _ in range(5):
            close(evt.scan(fn, X, backend="triton", config=cfg), loop(fn, X[:1], X))
            buf, taken, epoch = _sync()
            fresh = buf is not last
            assert taken == int(buf[0]) == (0 if fresh else before_taken) + tickets
            assert epoch == (1 if fresh else before_epoch + 1)
            assert buf.numel() >= 1 + nflags and (buf[1:1 + nflags] == epoch * 4 + 2).all()
            last, before_taken, before_epoch = buf, taken, epoch
    assert last.numel() == 64  # grew to the next power of two of 1 + 54 flags
    X = torch.randn(20, 4)
    outs = evt.scan(lambda s, m, x: (s + x, torch.maximum(m, x)), X, init=(X[:1], X[:1]), backend="triton",
                    config=SYNC_CASES[0][2])  # two groups: two launches on the same buffer
    for got, ref in zip(outs, loop(lambda s, m, x: (s + x, torch.maximum(m, x)), (X[:1], X[:1]), X)):
        close(got, ref)
    buf, taken, epoch = _sync()
    assert buf is last and epoch == before_epoch + 2 and taken == int(buf[0]) == before_taken + 2 * 5


def test_sync_buffer_replaced_before_int32_overflow(monkeypatch):
    """A buffer whose ticket count or epoch flag would pass int32 is replaced by a fresh zeroed one; results
    stay right up to the limits and after; a launch that raises drops the buffer (the interpreter's programs
    take tickets until one raises: every later look-back scan waited forever, found 2026-11-29)."""
    from evtorch.scan import launch
    monkeypatch.setattr(launch, "_SYNC", {})
    T, n, cfg, nflags, tickets = SYNC_CASES[1]
    X = torch.randn(T, n)
    fn = lambda h, x: h + x  # noqa: E731
    close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
    hit = launch._SYNC[(torch.device("cpu"), None)]
    old = hit[0]
    start = launch.INT32_MAX - 2 * tickets
    old[0], hit[1] = start, start  # device counter and host agree, two launches short of the ticket limit
    for _ in range(2):
        close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
        assert hit[0] is old and hit[1] == int(old[0])
    assert hit[1] == launch.INT32_MAX
    close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
    buf, taken, epoch = _sync()
    assert buf is not old and taken == tickets and epoch == 1
    hit = launch._SYNC[(torch.device("cpu"), None)]
    hit[2] = (launch.INT32_MAX - 2) // 4 - 1  # the next epoch's flag, epoch * 4 + 2, is the last that fits
    close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
    assert _sync()[0] is buf and (buf[1:1 + nflags] == launch.INT32_MAX - 1).all()
    close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
    assert _sync()[0] is not buf and _sync()[2] == 1
    before = list(_sync()[1:])
    real = launch.kernel_for

    class Failing:  # a launch that raises, as Triton does before queuing anything
        def __getitem__(self, grid):
            def launch_(*args, **kwargs):
                raise RuntimeError("launch failed")
            return launch_
    monkeypatch.setattr(launch, "kernel_for", lambda body, g, c, exact=False: (real(body, g, c, exact)[0], [Failing()]))
    with pytest.raises(RuntimeError, match="launch failed"):
        evt.scan(fn, X, backend="triton", config=cfg)
    assert (torch.device("cpu"), None) not in launch._SYNC and before[0] > 0
    monkeypatch.setattr(launch, "kernel_for", real)
    close(evt.scan(fn, X, backend="triton", config=cfg), X.cumsum(0))
    assert list(_sync()[1:]) == [tickets, 1]


def test_scan_config_fields_are_checked():
    """A non-power-of-two tile failed inside Triton after a look-back program took its ticket (and hung every later
    look-back scan); depth=0 generated a kernel that did not parse (found 2026-11-29)."""
    for kw in (dict(block_n=3), dict(block_t=6), dict(window=3), dict(num_warps=0), dict(sub=5)):
        with pytest.raises(evt.EpilogueError, match=rf"ScanConfig.{next(iter(kw))}=.*power of two"):
            ScanConfig(**kw)
    for kw in (dict(depth=0), dict(seg=-1), dict(persist=-1), dict(block_n=2.0)):
        with pytest.raises(evt.EpilogueError, match=rf"ScanConfig.{next(iter(kw))}="):
            ScanConfig(**kw)

def test_bool_state_plus_bool_is_a_logical_or():
    """A bool state updated with ``p + x`` is torch's logical or (a running "any"), not a 1-bit add that wraps."""
    X = torch.rand(12, 4, generator=torch.Generator().manual_seed(5)) > 0.6
    want = X.int().cummax(0).values.bool()
    for backend in ("reference", "triton"):
        got = evt.scan(lambda p, x: p + x, X, backend=backend)
        assert got.dtype == torch.bool and torch.equal(got, want), backend


_SOFTSIGN: list = []


@triton.jit
def _softsign_for_scan(x):
    return x / (1 + tl.abs(x))


def test_registered_op_in_a_scan_body_on_the_triton_backend():
    """A register_op op in a scan body: the generated scan kernels call it by name, so the module gets it as
    evt.gemm's does (a NameError inside Triton before, found 2026-11-29); sequential and associative kernels."""
    if not _SOFTSIGN:  # once per process (the registry refuses a second op of that name)
        _SOFTSIGN.append(evt.register_op("softsign_in_scan_test", lambda x: x / (1 + x.abs()), _softsign_for_scan))
    softsign = _SOFTSIGN[0]
    X = torch.randn(9, 5, generator=torch.Generator().manual_seed(3))
    for body in (lambda h, x: softsign(h) + x, lambda h, x: h + softsign(x)):
        want = evt.scan(body, X, backend="reference")
        torch.testing.assert_close(evt.scan(body, X, backend="triton"), want, rtol=1e-5, atol=1e-5)


def test_bound_method_bodies_of_different_instances_are_traced_apart():
    """A bound method's __code__ is every instance's: the body cache keys on its __self__ too (Cell(2.0).step
    returned Cell(0.5).step's scan before)."""
    class Cell:
        def __init__(self, a):
            self.a = a

        def step(self, h, x):
            return self.a * h + x

    X = torch.randn(5, 3, dtype=torch.float64)
    for a in (0.5, 2.0):
        h = [X[0]]
        for t in range(1, X.shape[0]):
            h.append(a * h[-1] + X[t])
        torch.testing.assert_close(evt.scan(Cell(a).step, X, backend="reference"), torch.stack(h))


def test_scan_inside_torch_compile():
    """A compiled function calling evt.scan: Dynamo traced into the body's tracing and raised an
    InternalTorchDynamoError (even without fullgraph); evt.scan now runs eagerly from compiled code."""
    X = torch.randn(6, 3, requires_grad=True)
    fn = lambda X: evt.scan(lambda h, x: torch.tanh(h * 0.5 + x), X, backend="reference").sum() * 2  # noqa: E731
    torch.compile(fn, backend="aot_eager")(X).backward()
    got, X.grad = X.grad, None
    fn(X).backward()
    torch.testing.assert_close(got, X.grad)


def test_integer_states_of_a_coupled_group_stay_exact():
    """A coupled group's int64 state near 2**41 came back off by 4e11 on the triton backend (its float32 workspace
    is exact below 2**24; found 2026-11-29): such a scan runs on the reference executor, with a warning."""
    X = torch.randint(2 ** 40, 2 ** 41, (20, 3), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"couples integer state\(s\) s0 \(torch.int64\).*reference executor"):
        got = evt.scan(lambda h, x: h + h[..., :1] + x, X, backend="triton")
    h, want = X[0], [X[0]]
    for t in range(1, len(X)):
        h = h + h[..., :1] + X[t]
        want.append(h)
    assert torch.equal(got, torch.stack(want))
    # lane-wise integer states keep their kernels (no workspace), and so do float coupled ones: no warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(evt.scan(lambda h, x: h + x, X, backend="triton"), X.cumsum(0))
        Xf = X.double() / 2 ** 40
        evt.scan(lambda h, x: h + h[..., :1] + x, Xf, backend="triton")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float64_upcast_in_a_float32_body_computes_in_float64(backend):
    """The kernels hold every value in the body's compute dtype, chosen from the states and inputs: a
    ``.double()`` inside a float32 body was a no-op on the triton backend (found 2026-11-29); the body's float64
    values now make the compute dtype float64."""
    X, Bg = torch.randn(6, 4), torch.full((6, 4), 1e8)
    fn = lambda h, b, x: torch.tanh(((h.double() + b.double()) - b.double()).float() + x)  # noqa: E731
    out = evt.scan(fn, Bg, X, init=X[:1], backend=backend)
    close(out, loop(fn, X[:1], Bg, X))
    assert get_body(fn, None, [RowSpec("s0", (4,), torch.float32)],
                    [RowSpec("x0", (4,), torch.float32), RowSpec("x1", (4,), torch.float32)], 1).compute_dtype \
        == torch.float64


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_outputs_place_the_scan_dim_as_the_inputs_do(backend):
    """A post output with fewer dims than the inputs: ``dim=1`` and ``dim=-2`` of a 3-d input gave transposed
    results, since a negative dim was counted on the post output's rank (found 2026-11-29). Counted on the inputs'
    rank, clamped to the output's last dim."""
    X = torch.randn(4, 5, 3)
    for d in (1, -2):
        close(evt.scan(lambda h, x: h + x, X, dim=d, post=lambda h, x: h[:, 0], backend=backend),
              X.cumsum(1)[:, :, 0])
    Y = torch.randn(4, 3, 5)
    for d in (2, -1):
        close(evt.scan(lambda h, x: h + x, Y, dim=d, post=lambda h, x: h[:, 0], backend=backend),
              Y.cumsum(2)[:, 0, :])


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_outputs_never_alias_the_inputs(backend):
    """``post=lambda h, x: x`` on the reference backend returned the caller's input itself, so writing to the
    result wrote to the input (found 2026-11-29); a broadcast row came back with stride 0."""
    X = torch.randn(5, 3)
    X0 = X.clone()
    P = evt.scan(lambda h, x: h + x, X, post=lambda h, x: x, backend=backend)
    P.add_(100.0)
    assert torch.equal(X, X0)
    Q = evt.scan(lambda h, x: h + x, X, post=lambda h, x: x[..., :1].expand(3), backend=backend)
    assert 0 not in Q.stride()
    close(Q, X[:, :1].expand(5, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_16bit_states_post_does_not_depend_on_requires_grad(backend):
    """The kernels hold a bfloat16 state in float32 and post reads it there; with gradients on, post read the
    bfloat16-rounded history instead, 0.015 away (found 2026-11-29)."""
    torch.manual_seed(0)
    X, A = torch.randn(50, 8).bfloat16(), torch.rand(50, 8).bfloat16()
    body, post = (lambda h, a, x: a * h + x), (lambda h, a, x: h.float() * 1.001)  # noqa: E731
    plain = evt.scan(body, A, X, init=X[:1], post=post, backend=backend)
    A2 = A.clone().requires_grad_()
    tracked = evt.scan(body, A2, X, init=X[:1], post=post, backend=backend)
    assert torch.equal(plain, tracked.detach())
    g, = torch.autograd.grad(tracked.sum(), A2)
    A3 = A.float().requires_grad_()
    want, = torch.autograd.grad(post(loop(body, X[:1].float(), A3, X.float()), None, None).sum(), A3)
    close(g.float(), want, tol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_func_grad_differentiates_step_by_step(backend):
    """torch.func.grad met torch's "must override the setup_context staticmethod" from the parallel backward's
    autograd.Function (found 2026-11-29); under it the scan differentiates through the reference executor."""
    X, A = torch.randn(9, 4, dtype=torch.float64), torch.rand(9, 4, dtype=torch.float64)

    def f(A):
        return evt.scan(lambda h, a, x: torch.tanh(a * h + x), A, X, init=X[:1], backend=backend).sum()
    A2 = A.clone().requires_grad_()
    want, = torch.autograd.grad(f(A2), A2)
    torch.testing.assert_close(torch.func.grad(f)(A), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_histories_come_back_in_inits_container(backend):
    """A list init came back as a tuple, where the eager loop it replaces keeps one history per element of the
    list (found by a probe, 2026-11-29); a tuple init still gives a tuple, a tensor init a tensor."""
    X = torch.randn(9, 3)
    body = lambda a, b, x: (a + x, 0.5 * b + a)  # noqa: E731
    want = loop(body, (X[:1], torch.zeros(1, 3)), X)
    got = evt.scan(body, X, init=[X[:1], torch.zeros(1, 3)], backend=backend)
    assert type(got) is list and len(got) == 2
    for g, w in zip(got, want):
        close(g, w)
    assert type(evt.scan(body, X, init=(X[:1], torch.zeros(1, 3)), backend=backend)) is tuple
    one = evt.scan(lambda a, x: a + x, X, init=[X[:1]], backend=backend)
    assert type(one) is list and len(one) == 1
    close(one[0], X.cumsum(0))
    X2 = X.clone().requires_grad_()  # through the autograd path too
    got = evt.scan(lambda a, x: a * 0.5 + x, X2, init=[X2[:1]], backend=backend)
    assert type(got) is list
    got[0].sum().backward()
    assert X2.grad is not None


def _wrapping_loop(fn, X):
    """Eager, in the state's own integer dtype (the float64 ``loop`` oracle cannot wrap)."""
    hist = [X[0]]
    for t in range(1, X.shape[0]):
        hist.append(fn(hist[-1], X[t]).to(X.dtype))
    return torch.stack(hist)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,fn", [
    (torch.uint8, lambda h, x: h + x + (-1)),                 # lane-wise
    (torch.uint8, lambda h, x: h - 300 + x),
    (torch.int8, lambda h, x: h * 300 + x),
    (torch.int32, lambda h, x: h + x + 2 ** 40),              # associative sum (the constant in the coefficients)
    (torch.int32, lambda h, x: torch.maximum(h, x - 2 ** 33)),
    (torch.int32, lambda h, x: h + (x > 2 ** 32 + 1).int()),  # a comparison: eager compares with 1
])
def test_python_ints_wrap_into_integer_states_as_in_eager(backend, dtype, fn):
    """Eager converts a Python int meeting an integer tensor to its dtype, wrapping (``uint8 + -1`` adds 255);
    the kernels handed Triton the bare constant, which it refused ('Scalar 1099511627776 is out of range for
    type int32', 'Cannot perform a binary operation between an unsigned tensor and a negative scalar'; found by a
    probe, 2026-11-29)."""
    info = torch.iinfo(dtype)
    X = torch.randint(max(info.min, -100), min(info.max, 250), (9, 3), dtype=dtype)
    got = evt.scan(fn, X, backend=backend)
    assert got.dtype == dtype
    assert torch.equal(got, _wrapping_loop(fn, X))
