"""runtime/launcher.py: direct launches of compiled kernels.

CPU part: a stand-in for a JITFunction and its CompiledKernel records what DirectLaunch does (which path, which
arguments), so the key logic, the argument order Triton's launcher expects, the fallbacks and the eviction are
checked without a GPU. GPU part: real launches where the specialisation changes between calls of one signature
(an unaligned input view, an integer scalar that is 1, then 16, then 7), poisoned outputs against eager.
"""
import inspect

import pytest
import torch

import evtorch as evt
from evtorch.runtime import launcher
from evtorch.runtime.launcher import DirectLaunch, arg_key, make_launch


class _Param:
    def __init__(self, default):
        self.default = default


class FakeCompiled:
    def __init__(self, owner, spec):
        self.owner, self.spec = owner, spec
        self.function, self.packed_metadata = object(), object()

    def run(self, *args):
        self.owner.log.append(("direct", self.spec, args))


class FakeJIT:
    """``fn[grid](*args, **kwargs)`` records the call and returns a compiled kernel (as JITFunction.run)."""
    __name__ = "fake_kernel"

    def __init__(self, names, defaults=None):
        self.arg_names = names
        defaults = defaults or {}
        self.params = [_Param(defaults.get(n, inspect.Parameter.empty)) for n in names]
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeCompiled(self, len(self.log))
        return run


def _launch(fn=None, **kw):
    fn = fn or FakeJIT(["x", "n", "y", "BLOCK", "FLAG"], defaults={"FLAG": False})
    return fn, DirectLaunch(fn, (4, 2), 3, dict(BLOCK=64, num_warps=4, **kw), device_index=0,
                            stream=lambda i: 1000 + i)


def test_first_call_compiles_through_jit_then_launches_directly():
    fn, launch = _launch()
    x = torch.zeros(8)
    launch((arg_key(x),), x, 5, 2.0)
    assert fn.log == [("jit", (4, 2), (x, 5, 2.0), dict(BLOCK=64, num_warps=4))]
    launch((arg_key(x),), x, 6, 3.0)
    kind, spec, args = fn.log[-1]
    assert kind == "direct" and spec == 1
    # grid padded to 3 dims, the current stream of the launch's device, the compiled function and metadata, no
    # launch metadata or hooks, then every parameter in signature order (constexprs and defaults included)
    assert args[:4] == (4, 2, 1, 1000)
    assert args[6:9] == (None, None, None)
    assert args[9:] == (x, 6, 3.0, 64, False)


def test_new_key_goes_through_jit_and_is_remembered():
    fn, launch = _launch()
    x = torch.zeros(16, dtype=torch.bfloat16)
    launch((arg_key(x),), x, 5, 1.0)
    launch((arg_key(x[1:]),), x[1:], 5, 1.0)  # 2 bytes off: another specialisation
    assert [e[0] for e in fn.log] == ["jit", "jit"]
    launch((arg_key(x[1:]),), x[1:], 5, 1.0)
    launch((arg_key(x),), x, 5, 1.0)
    assert [(e[0], e[1]) for e in fn.log[2:]] == [("direct", 2), ("direct", 1)]


def test_unknown_argument_kind_never_caches():
    fn, launch = _launch()
    key = (arg_key([1, 2]),)
    for _ in range(3):
        launch(key, [1, 2], 5, 1.0)
    assert [e[0] for e in fn.log] == ["jit"] * 3


def test_installed_launch_hook_takes_the_jit_path(monkeypatch):
    import triton

    fn, launch = _launch()
    x = torch.zeros(8)
    launch((True,), x, 5, 1.0)
    monkeypatch.setattr(triton.knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    launch((True,), x, 5, 1.0)
    assert [e[0] for e in fn.log] == ["jit", "jit"]
    monkeypatch.undo()
    launch((True,), x, 5, 1.0)
    assert fn.log[-1][0] == "direct"


def test_keys_are_bounded(monkeypatch):
    monkeypatch.setattr(launcher, "MAX_KEYS", 3)
    fn, launch = _launch()
    for n in range(5):
        launch((n,), None, n, 1.0)
    assert list(launch.kernels) == [(2,), (3,), (4,)]


def test_missing_constexpr_is_named():
    fn = FakeJIT(["x", "BLOCK", "OTHER"])
    with pytest.raises(ValueError, match="OTHER"):
        DirectLaunch(fn, (1,), 1, dict(BLOCK=1), 0, stream=lambda i: 0)


def test_arg_key_follows_triton_specialisation():
    assert arg_key(1) != arg_key(2) != arg_key(16)
    assert arg_key(3) == arg_key(5)
    assert arg_key(32) == arg_key(48)
    assert arg_key(2 ** 40) != arg_key(3)           # i64, not i32
    assert arg_key(2 ** 40 + 8) != arg_key(2 ** 40)  # not 16-divisible
    assert arg_key(1.0) == arg_key(7.5)             # floats are not specialised
    assert arg_key(True) != arg_key(False)
    t = torch.zeros(8, dtype=torch.float16)
    assert arg_key(t) is True and arg_key(t[1:]) is False and arg_key(t[8:]) is True
    assert arg_key(object()) is launcher._UNKNOWN


def test_make_launch_without_a_device_is_the_jit_call(monkeypatch):
    fn = FakeJIT(["x", "BLOCK"])
    launch = make_launch(fn, (2,), 1, dict(BLOCK=8), None)
    launch((), 1)
    launch((), 2)
    assert [e[0] for e in fn.log] == ["jit", "jit"]
    monkeypatch.setenv("EVTORCH_DIRECT_LAUNCH", "0")
    assert not isinstance(make_launch(fn, (2,), 1, dict(BLOCK=8), 0), DirectLaunch)


def test_generated_run_keys_only_what_varies():
    """The generated ``run`` of a signature keys tensors and integer scalars, not floats or fresh outputs."""
    import evtorch.runtime.gemm as rg

    def fn(acc, C, alpha, n, flag):
        return torch.relu(alpha * acc + C * n * flag)

    A, B, C = torch.randn(32, 16), torch.randn(16, 24), torch.randn(32, 24)
    rg.clear_caches()
    evt.gemm(A, B, fn, C=C, alpha=2.0, n=3, flag=True, backend="triton")
    (launch,) = {id(v): v for v in rg._launches.values()}.values()  # (remembered under two keys)
    call = [line for line in launch.source.splitlines() if "_kernel(" in line][0]
    assert call.strip().startswith("_kernel((_ak(_cx1), _ak(_cx2), _ak(_cx3),), A, B,")


def test_generated_run_launches_split_k_directly():
    """Split-K's two kernels go through runtime.launcher too (Triton's JIT path cost ~30 us of host time per
    launch): a fresh workspace, the partials with an empty key (A's and B's alignment is the signature's), the
    reduce kernel keyed on the epilogue's varying arguments; repeated calls give the first call's results."""
    import evtorch.runtime.gemm as rg
    from evtorch.codegen.configs import GemmConfig

    def fn(acc, C, bias, alpha):
        D = torch.relu(alpha * acc + C + bias)
        return D, D.sum(dim=1)

    torch.manual_seed(0)
    A, B = torch.randn(40, 96, dtype=torch.float16) / 4, torch.randn(96, 72, dtype=torch.float16) / 4
    C, bias = torch.randn(40, 72, dtype=torch.float16), torch.randn(72)
    cfg = GemmConfig("splitk", 16, 16, 16, 8, 3, 4, 1)
    rg.clear_caches()
    first = evt.gemm(A, B, fn, C=C, bias=bias, alpha=0.7, config=cfg, backend="triton")
    (launch,) = {id(v): v for v in rg._launches.values()}.values()
    lines = [line.strip() for line in launch.source.splitlines()]
    assert any(line.startswith("w = _empty(_ws") for line in lines)
    assert any(line.startswith("_part((), A, B,") and line.endswith(", w)") for line in lines)
    assert any(line.startswith("_reduce((_ak(_cx1), _ak(_cx4),), w,") for line in lines), lines
    for _ in range(2):
        again = evt.gemm(A, B, fn, C=C, bias=bias, alpha=0.7, config=cfg, backend="triton")
        for f, a in zip(first, again):
            assert torch.equal(f, a)
    ref = fn(A.float() @ B.float(), C.float(), bias, 0.7)
    assert (first[0].float() - ref[0]).abs().max() < 4e-3 and (first[1] - ref[1]).abs().max() < 1e-3


def test_first_call_hooks_see_each_prepared_launch_once(monkeypatch):
    """FIRST_CALL_HOOKS get the config when a signature's launch is prepared; a repeated call takes the cached
    launch (hooks or not) and calls none; a knob in the launch key (poisoning) makes a new signature."""
    import evtorch.runtime.gemm as rg

    def relu(acc):
        return torch.relu(acc)

    A, B = torch.randn(32, 16), torch.randn(16, 24)
    rg.clear_caches()
    monkeypatch.delenv("EVTORCH_POISON", raising=False)  # (tests/helpers.py turns it on for the suite)
    seen = []
    monkeypatch.setattr(rg, "FIRST_CALL_HOOKS", [seen.append])
    first = evt.gemm(A, B, relu, backend="triton")
    assert len(seen) == 1 and seen[0].template == "portable"
    (launch,) = {id(v): v for v in rg._launches.values()}.values()
    calls = []
    monkeypatch.setattr(launch, "run_fast", lambda *a: calls.append(a) or first)
    evt.gemm(A, B, relu, backend="triton")
    assert len(seen) == 1 and len(calls) == 1
    monkeypatch.setenv("EVTORCH_POISON", "1")
    torch.testing.assert_close(evt.gemm(A, B, relu, backend="triton"), first)
    assert len(seen) == 2 and seen[1] == seen[0] and len(calls) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_specialisation_changes_between_calls(monkeypatch):
    """One call signature, launched with inputs whose Triton specialisation differs from the first call's (a
    2-byte misaligned input view; an integer scalar that is 1, 16 or neither), each case three times (the
    first launch of a key compiles through the JIT path, the later ones launch directly): every result matches
    eager, outputs poisoned with NaN before each launch."""
    import evtorch.runtime.gemm as rg

    monkeypatch.setenv("EVTORCH_POISON", "1")
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "0")

    def fn(acc, C, n):
        return torch.relu(acc + C * n), (acc * n).sum(dim=1)

    torch.manual_seed(0)
    M, N, K = 300, 264, 128
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    acc = A.float() @ B.float()
    store = torch.randn(M * N + 8, device="cuda", dtype=torch.bfloat16)
    rg.clear_caches()
    for offset, n in ((0, 3), (1, 3), (0, 1), (1, 16), (0, 7), (1, 1)):
        C = store[offset:offset + M * N].view(M, N)  # offset 1: a 2-byte misaligned base, same layout
        for rep in range(3):
            out, rows = evt.gemm(A, B, fn, C=C, n=n)
            case = f"C offset {offset}, n={n}, call {rep}"
            torch.testing.assert_close(out.float(), torch.relu(acc + C.float() * n), atol=0.1, rtol=2e-2,
                                       msg=lambda m: f"{case}: {m}")
            torch.testing.assert_close(rows, (acc * n).sum(dim=1), atol=0.5, rtol=1e-3,
                                       msg=lambda m: f"{case}: {m}")
    launches = {id(v): v for v in rg._launches.values()}
    assert len(launches) == 1, [v.source for v in launches.values()]
    (launch,) = launches.values()
    direct = launch.run_fast.__globals__["_kernel"]
    if isinstance(direct, DirectLaunch):  # keys: misaligned/aligned x n in {1, 16, other}, less (aligned, 16)
        assert len(direct.kernels) == 5, list(direct.kernels)


def test_prepared_launch_flags_replace_constexprs_for_one_launch():
    """``PreparedLaunch(A, B, args, flags)``: the flags replace prepared constexprs for that launch only; split-K
    (two kernels) takes none."""
    from evtorch.runtime.gemm_launch import PreparedLaunch

    calls = []
    launch = PreparedLaunch.__new__(PreparedLaunch)
    launch.mode, launch.device_index, launch.tail = "portable", None, (7,)
    launch.fn = lambda *args, **kw: calls.append((args, kw))
    launch.common = {"EPI_TMA": False, "PREFETCH": 1, "num_warps": 4}
    A, B = torch.zeros(2, 2), torch.zeros(2, 2)
    launch(A, B, [3], {"EPI_TMA": True, "PREFETCH": 0})
    launch(A, B, [3])
    assert calls[0] == ((A, B, 7, 3), {"EPI_TMA": True, "PREFETCH": 0, "num_warps": 4})
    assert calls[1] == ((A, B, 7, 3), {"EPI_TMA": False, "PREFETCH": 1, "num_warps": 4})
    launch.mode = "splitk"
    with pytest.raises(ValueError, match="split-K"):
        launch(A, B, [3], {"EPI_TMA": True})


@pytest.mark.parametrize("offset,expected", [(0, {"EPI_TMA": True, "PREFETCH": 0}), (1, None)])
def test_first_call_launches_the_kernel_later_calls_launch(offset, expected):
    """A signature's first call (``_Launch.run`` with its ``_Call``) picks the EPI_TMA variant exactly where the
    generated fast path does (the input's base 16-byte aligned): a one-call check (the selftest) must run what
    later calls run, and the tuner's threaded first calls must compile it."""
    import evtorch.runtime.gemm as rg

    seen = []
    launch = rg._Launch.__new__(rg._Launch)
    launch.gemm = lambda A, B, args, flags=None: seen.append(flags)
    launch.epi_tma, launch.args, launch.slots, launch.vec_fn = "C", [], [], None
    launch.views, launch.pack, launch.returns = [], [], "tuple"
    call = type("Call", (), {"outputs": {}, "buffers": {}})()
    C = torch.zeros(64, dtype=torch.bfloat16)[offset:offset + 32]
    launch.run(torch.zeros(1), torch.zeros(1), {"C": C}, call)
    assert seen == [expected]
    launch.epi_tma = None
    launch.run(torch.zeros(1), torch.zeros(1), {"C": C}, call)
    assert seen[-1] is None
