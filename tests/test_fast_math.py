"""The fast-math path (codegen/fastmath.py): where tanh / sigmoid are emitted as hardware approximations.

Everything here inspects generated source or keys, so it runs on CPU without running the approximations (the
interpreter cannot run inline PTX); the GPU test at the end checks numbers on CUDA (`TRITON_INTERPRET=0 pytest -m
gpu`)."""
from __future__ import annotations

import hashlib
import os

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.codegen import fastmath
from evtorch.examples import bce_loss as bce
from evtorch.examples import row_reduction as row_tanh
from evtorch.codegen.program import build_program
from evtorch.ops import REGISTRY
from evtorch.runtime import gemm as rg
from evtorch.runtime import knobs

from helpers import ops_in

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def _ep(fn, M=64, N=48, acc_dtype=F32, **inputs):
    return evt.trace(fn, acc=evt.spec((M, N), acc_dtype), **inputs)


def _fast_targets(ep, out_dtype, mode="auto"):
    return sorted(ep.graph.nodes[i].target for i in fastmath.select_for(ep, out_dtype, mode))


def _epilogue_src(prog) -> str:
    src = prog.source
    return src[src.index("def epilogue("):src.index("\n\n", src.index("def epilogue("))]


def gelu_aux(acc, bias):
    pre = acc + bias
    return F.gelu(pre, approximate="tanh"), pre


def dgelu(acc, pre):
    x = pre.float()
    t = torch.tanh(0.79788456 * (x + 0.044715 * x * x * x))
    d = (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t)).to(pre.dtype)
    dpre = acc * d
    return dpre, dpre.sum(0)


def _gelu_ep():
    return _ep(gelu_aux, bias=evt.spec((48,), BF16))


# ------------------------------------------------------------------------------------------------ the registry
def test_registry_declares_fast_emissions():
    assert REGISTRY["tanh"].triton_fast == "tlmath.tanh_approx({0})" and not REGISTRY["tanh"].fast_exact
    assert REGISTRY["tanh"].triton_gpu == "tlmath.tanh_gpu({0})" and REGISTRY["sigmoid"].triton_gpu is None
    assert REGISTRY["sigmoid"].triton_fast == "tlmath.sigmoid_approx({0})" and REGISTRY["sigmoid"].fast_exact
    assert REGISTRY["exp"].triton_fast is None and REGISTRY["erf"].triton_fast is None


# ------------------------------------------------------------------------------------------------ the rule
def test_rule_16bit_tile_outputs():
    ep = _gelu_ep()
    assert _fast_targets(ep, BF16) == ["tanh"]
    assert _fast_targets(ep, F16) == ["tanh"]
    assert _fast_targets(ep, F32) == []               # fp32 outputs keep the accurate tanh
    assert _fast_targets(ep, F32, "always") == ["tanh"]
    assert _fast_targets(ep, BF16, "never") == []


def test_rule_reductions_keep_accurate_unless_value_is_16bit():
    # sigmoid -> mul -> sum to a fp32 scalar: no 16-bit rounding on the way, but sigmoid's fast emission is
    # fast_exact (as accurate as the accurate one, measured): used anyway
    ep = _ep(lambda acc, C, b: (torch.sigmoid(acc + b[:, None]) * C).sum(), C=evt.spec((64, 48), BF16),
             b=evt.spec((64,), BF16))
    assert _fast_targets(ep, BF16) == ["sigmoid"]
    assert _fast_targets(ep, F32) == ["sigmoid"]
    assert _fast_targets(ep, BF16, "never") == []
    # bce_loss: its log(clamp(sigmoid(z), ...)) is clamp(logsigmoid(z), ...) after passes/stable.py, and
    # logsigmoid's fast emission (ex2.approx and rcp.approx for tl.exp and the divide) is fast_exact too
    ep = _ep(bce, C=evt.spec((64, 48), BF16), b=evt.spec((64,), BF16))
    assert "logsigmoid" in ops_in(ep.graph) and "sigmoid" not in ops_in(ep.graph)
    assert _fast_targets(ep, BF16) == ["logsigmoid"]
    assert _fast_targets(ep, F32) == ["logsigmoid"]
    assert _fast_targets(ep, BF16, "never") == []
    # the same with tanh (not fast_exact): accurate
    ep = _ep(lambda acc: torch.log(torch.tanh(acc).abs() + 1).sum())
    assert _fast_targets(ep, BF16) == []
    assert _fast_targets(ep, BF16, "always") == ["tanh"]
    # tanh(beta * C) with a bf16 C is a bf16 value (eager rounds it): the sum adds bf16-precision values
    ep = _ep(row_tanh, C=evt.spec((64, 48), BF16), alpha=0.5, beta=1.25)
    assert _fast_targets(ep, BF16) == ["tanh"]
    assert _fast_targets(ep, F32) == ["tanh"]
    # the same with an fp32 C: the fp32 tanh reaches the fp32 row sum unrounded
    ep = _ep(row_tanh, C=evt.spec((64, 48), F32), alpha=0.5, beta=1.25)
    assert _fast_targets(ep, BF16) == []
    # gelu' in fp32 rounded once to bf16 (dgelu_bgrad): the cast is the rounding
    ep = _ep(dgelu, pre=evt.spec((64, 48), BF16))
    assert _fast_targets(ep, BF16) == ["tanh"]
    ep = _ep(dgelu, pre=evt.spec((64, 48), F32))
    assert _fast_targets(ep, BF16) == []


def test_rule_is_per_node():
    ep = _ep(lambda acc: (torch.tanh(acc), torch.tanh(2 * acc).sum(1)))
    assert _fast_targets(ep, BF16) == ["tanh"]
    ep = _ep(lambda acc: (torch.tanh(acc), torch.sigmoid(2 * acc).sum(1)))
    assert _fast_targets(ep, F32) == ["sigmoid"]
    ep = _ep(lambda acc: (torch.tanh(acc), torch.tanh(acc).amax(0)))   # one tanh (CSE) feeding both
    assert _fast_targets(ep, BF16) == []


@pytest.mark.parametrize("fn", [
    lambda acc: torch.where(torch.tanh(acc) > 0.5, acc, 0.0),          # comparison
    lambda acc: torch.floor(8 * torch.tanh(acc)),                       # rounding to integers
    lambda acc: (torch.tanh(acc) * 4).to(torch.int32),                  # integer cast
])
def test_rule_discontinuous_consumers_keep_accurate(fn):
    assert _fast_targets(_ep(fn), BF16) == []


def test_rule_continuous_chain_to_16bit_output():
    ep = _ep(lambda acc, r: F.silu(acc) * r + torch.tanh(acc).clamp(-0.5, 0.5), r=evt.spec((48,), F32))
    assert _fast_targets(ep, F16) == ["sigmoid", "tanh"]


def test_rule_fp64_never():
    """float64 epilogues are never approximated, and tanh's exact GPU form (MUFU ops, float32 only) leaves them as
    they are: the portable program, its hash included."""
    ep = _ep(lambda acc: torch.tanh(acc), acc_dtype=torch.float64)
    assert _fast_targets(ep, BF16, "always") == []
    assert not fastmath.plan(ep, BF16, "always")[1]


def _plan_targets(ep, out_dtype, mode):
    graph, emissions = fastmath.plan(ep, out_dtype, mode)
    return ([graph.nodes[i].target for i in sorted(emissions.fast)],
            [graph.nodes[i].target for i in sorted(emissions.exact)])


def test_rule_exact_gpu_forms_where_no_approximation_is_allowed():
    """A tanh kept accurate (a float32 output, a sum, a comparison) takes its exact GPU form, which computes the
    accurate bits; an approximated one does not; 'never' and float64 keep the portable emission."""
    ep = _gelu_ep()
    assert _plan_targets(ep, BF16, "auto") == (["tanh"], [])
    assert _plan_targets(ep, F32, "auto") == ([], ["tanh"])
    assert _plan_targets(ep, F32, "always") == (["tanh"], [])
    assert _plan_targets(ep, F32, "never") == ([], [])
    # GELU's derivative ahead of the bias gradient's float32 sum (the backward's epilogue-only pass), beside a tanh
    # rounded to bf16: one of each
    ep = _ep(lambda acc, pre: dgelu(acc, pre) + (torch.tanh(acc),), pre=evt.spec((64, 48), F32))
    assert _plan_targets(ep, BF16, "auto") == (["tanh"], ["tanh"])
    # a comparison downstream: the exact form gives the same bits, so it may feed one
    ep = _ep(lambda acc: torch.where(torch.tanh(acc) > 0.5, acc, 0.0))
    assert _plan_targets(ep, BF16, "auto") == ([], ["tanh"])
    assert _plan_targets(_ep(lambda acc: torch.tanh(acc), acc_dtype=torch.float64), F32, "auto") == ([], [])


def test_pow_takes_eagers_libdevice_pow_on_a_gpu_in_float64(monkeypatch):
    """On a GPU, a float64 ``x ** p`` is libdevice's pow (eager's own function there) for every exponent that eager's
    pow kernel does not compute another way; those (0, 1, 2, 3, -1, -2, 0.5, -0.5) keep the portable emission,
    which is what eager computes for them, and the program keeps its hash. float32 keeps the portable float64
    route (libdevice's powf is not eager's float32 pow: docs/epilogues.md, "Dtypes")."""
    assert REGISTRY["pow"].gpu_form_serves(torch.float64) and not REGISTRY["pow"].gpu_form_serves(F32)
    assert REGISTRY["tanh"].gpu_form_serves(F32) and not REGISTRY["tanh"].gpu_form_serves(torch.float64)
    powers = lambda acc: (acc ** 2.7, acc ** 4, acc ** -3, acc ** 33)  # noqa: E731
    assert _plan_targets(_ep(powers, acc_dtype=torch.float64), F32, "auto") == ([], ["pow"] * 4)
    assert _plan_targets(_ep(powers, acc_dtype=torch.float64), F32, "never") == ([], [])
    assert _plan_targets(_ep(powers), F32, "auto") == ([], [])
    # a float32 value's power in a float64 epilogue is a float32 computation: portable
    ep = _ep(lambda acc, C: (acc ** 2.7, C ** 2.7), acc_dtype=torch.float64, C=evt.spec((64, 48), F32))
    monkeypatch.setenv("TRITON_INTERPRET", "0")               # what a GPU process would generate
    src = _epilogue_src(build_program(ep, out_dtype=F32, fast_math="auto"))
    assert src.count("tlmath.pow_gpu(") == 1 and src.count("tlmath.powf(") == 1
    ep = _ep(lambda acc: (acc ** 2, acc ** 3, acc ** -1, acc ** -2, acc ** 0.5, acc ** -0.5), acc_dtype=torch.float64)
    graph, emissions = fastmath.plan(ep, F32, "auto")
    assert not emissions and graph is ep.graph
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "tlmath.pow_gpu(" not in _ep(lambda acc: acc ** 2.7, acc_dtype=torch.float64).source(F32)


def test_issue_workloads_take_no_exact_forms():
    """Every tanh of the benchmark's workloads is approximated (each is rounded to bf16 first), so the exact GPU
    forms leave their programs, hashes and tuning keys as they were (docs/benchmarks.md: "Last run" stands)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.workloads import WORKLOADS

    for name, w in WORKLOADS.items():
        inputs = w.make_inputs(64, 48, "cpu", BF16)
        specs = {k: evt.spec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        ep = _ep(w.fn, **specs)
        graph, emissions = fastmath.plan(ep, BF16, "auto")
        assert not emissions.exact, name
        # and a program without exact forms keeps the hash it had before they existed
        h = graph.structural_hash()
        tag = hashlib.sha256(",".join(map(str, sorted(emissions.fast))).encode()).hexdigest()[:6]
        assert fastmath.program_hash(h, emissions) == (f"{h}fm{tag}" if emissions.fast else h), name


# ------------------------------------------------------------------------------------------------ the source
def test_source_shows_fast_emission_exactly_when_the_rule_says():
    ep = _gelu_ep()
    fast = build_program(ep, out_dtype=BF16, fast_math="auto")
    body = _epilogue_src(fast)
    assert "tlmath.tanh_approx(" in body and "tlmath.tanh(" not in body
    assert "fast math: hardware approximation (tlmath.*_approx) at %" in fast.source
    acc = build_program(ep, out_dtype=BF16, fast_math="never")
    assert "_approx(" not in _epilogue_src(acc) and "tlmath.tanh(" in _epilogue_src(acc)
    assert "fast math: none" in acc.source
    assert acc.key[0] == ep.graph.structural_hash()       # the portable program keeps its hash
    # a float32 output keeps tanh accurate: on a GPU in its exact form (the same bits, fewer instructions), a program
    # of its own
    exact = build_program(ep, out_dtype=F32, fast_math="auto")
    body = _epilogue_src(exact)
    assert "_approx(" not in body and "tlmath.tanh(" not in body and "tlmath.tanh_gpu(" in body
    assert "fast math: exact GPU form (tlmath.*_gpu, the accurate values) at %" in exact.source
    assert "hardware approximation" not in exact.source
    assert exact.key[0] not in (acc.key[0], fast.key[0]) and exact.key[0].startswith(ep.graph.structural_hash())
    # the fast program: its own hash, that of the graph it is emitted from (reassociated: passes/reassociate.py)
    graph, nodes = fastmath.plan(ep, BF16, "auto")
    assert graph is not ep.graph and "reassociated" in fast.source
    assert fast.key[0] != ep.graph.structural_hash() and fast.key[0].startswith(graph.structural_hash())


def test_never_under_the_interpreter(monkeypatch):
    ep = _gelu_ep()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("EVTORCH_FAST_MATH", "always")
    assert fastmath.resolve_mode(None) == "never"
    assert "_approx(" not in _epilogue_src(build_program(ep, out_dtype=BF16))
    assert "_approx(" not in ep.source(BF16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")                 # what a GPU process would generate
    assert "tlmath.tanh_approx(" in ep.source(F32)              # always: fp32 outputs too
    monkeypatch.setenv("EVTORCH_FAST_MATH", "auto")
    assert "tlmath.tanh_approx(" in ep.source(BF16)
    assert "_approx(" not in ep.source(F32)                     # fp32 outputs: accurate (auto needs 16-bit)
    assert "tlmath.tanh_gpu(" in ep.source(F32)                 # in its exact GPU form
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "_gpu(" not in ep.source(F32)                        # which the interpreter cannot run either
    monkeypatch.setenv("EVTORCH_FAST_MATH", "0")
    assert "_approx(" not in ep.source(BF16)


def test_runtime_mode():
    A = torch.randn(4, 4)
    assert rg.fast_math_mode(A) == "never"                      # CPU tensors


def test_interpreter_run_is_accurate_whatever_the_knob(monkeypatch):
    # the interpreter cannot run inline PTX: a fast emission here would raise
    monkeypatch.setenv("EVTORCH_FAST_MATH", "always")
    torch.manual_seed(0)
    A, B = torch.randn(32, 16).half(), torch.randn(16, 24).half()
    bias = torch.randn(24).half()
    g, pre = evt.gemm(A, B, gelu_aux, bias=bias, backend="triton")
    rg_, pre_ = gelu_aux(A.float() @ B.float(), bias)
    torch.testing.assert_close(g.float(), rg_.half().float(), atol=2e-3, rtol=2e-3)


# ------------------------------------------------------------------------------------------------ knob and keys
@pytest.mark.parametrize("text,mode", [("auto", "auto"), ("ALWAYS", "always"), ("never", "never"), ("1", "auto"),
                                       ("0", "never"), ("off", "never"), ("on", "auto")])
def test_knob_parses(monkeypatch, text, mode):
    monkeypatch.setenv("EVTORCH_FAST_MATH", text)
    assert knobs.fast_math_mode() == mode


def test_knob_default_and_errors(monkeypatch):
    monkeypatch.delenv("EVTORCH_FAST_MATH", raising=False)
    assert knobs.fast_math_mode() == "auto"
    assert "EVTORCH_FAST_MATH" in knobs.describe()
    monkeypatch.setenv("EVTORCH_FAST_MATH", "sometimes")
    with pytest.raises(ValueError, match="EVTORCH_FAST_MATH"):
        knobs.fast_math_mode()
    with pytest.raises(ValueError):
        build_program(_gelu_ep(), fast_math="sometimes")


def test_launch_key_and_program_memo_depend_on_the_mode(monkeypatch):
    ep = _gelu_ep()
    A, B = torch.randn(64, 32).half(), torch.randn(32, 48).half()
    inputs = {"bias": torch.randn(48).half()}
    monkeypatch.setenv("EVTORCH_FAST_MATH", "auto")
    k1 = rg.launch_key(ep, A, B, inputs, F16, False, False, None)
    monkeypatch.setenv("EVTORCH_FAST_MATH", "never")
    k2 = rg.launch_key(ep, A, B, inputs, F16, False, False, None)
    assert k1 != k2
    p_fast = rg._program(ep, False, F16, "auto")
    p_acc = rg._program(ep, False, F16, "never")
    assert p_fast is not p_acc and p_fast.key != p_acc.key
    assert rg._program(ep, False, F16, "auto") is p_fast
    # no approximable node: one program for every mode
    ep2 = _ep(lambda acc, C: torch.relu(acc + C), C=evt.spec((64, 48), F16))
    assert rg._program(ep2, False, F16, "auto").key == rg._program(ep2, False, F16, "never").key


def test_module_files_differ():
    from evtorch.runtime.source_cache import kernel_path
    ep = _gelu_ep()
    fast = build_program(ep, out_dtype=BF16, fast_math="auto")
    acc = build_program(ep, out_dtype=BF16, fast_math="never")
    assert fast.source != acc.source
    assert kernel_path(fast.source, f"evt_{fast.key[0]}") != kernel_path(acc.source, f"evt_{acc.key[0]}")


# ------------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fast_math_matches_reference():
    torch.manual_seed(0)
    M, N, K = 512, 384, 256
    A = (torch.randn(M, K, device="cuda") / K ** 0.25).to(BF16)
    B = (torch.randn(K, N, device="cuda") / K ** 0.25).to(BF16)
    bias = torch.randn(N, device="cuda", dtype=BF16)
    errs = {}
    for mode in ("never", "auto"):
        os.environ["EVTORCH_FAST_MATH"] = mode
        try:
            g, pre = evt.gemm(A, B, gelu_aux, bias=bias)
        finally:
            os.environ.pop("EVTORCH_FAST_MATH", None)
        ref = gelu_aux(A.float() @ B.float(), bias)[0]
        errs[mode] = ((g.float() - ref).abs().max() / ref.abs().max()).item()
    assert errs["auto"] < 8e-3 and errs["never"] < 8e-3, errs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tanh_exact_form_gives_the_accurate_bits():
    """tlmath.tanh_gpu leaves out range fix-ups its operands never need, so it must return tlmath.tanh's bits: on a
    dense grid over every branch (the series, the two quotients, saturation past |x| = 43.6 where exp(-2|x|)
    flushes to 0), the extremes, infinities and NaN."""
    import triton
    import triton.language as tl

    from evtorch.codegen import tlmath

    @triton.jit
    def _both(x_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(a_ptr + offs, tlmath.tanh(x), mask=offs < n)
        tl.store(b_ptr + offs, tlmath.tanh_gpu(x), mask=offs < n)

    grid = torch.linspace(-60, 60, 1 << 22, device="cuda")
    f32 = torch.finfo(torch.float32)
    special = torch.tensor([0.0, -0.0, 0.1, -0.1, 0.55, -0.55, 43.6, 43.7, f32.tiny, -f32.tiny, f32.max, -f32.max,
                            1e-40, float("inf"), float("-inf"), float("nan")], device="cuda")
    x = torch.cat([grid, torch.randn(1 << 20, device="cuda") * 0.5, special])
    a, b = torch.full_like(x, 7.0), torch.full_like(x, -7.0)
    _both[(triton.cdiv(x.numel(), 1024),)](x, a, b, x.numel(), BLOCK=1024)
    same = (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())
    assert bool(same.all()), x[~same][:8].tolist()
    ref = torch.tanh(x.double())
    assert ((b.double() - ref).abs() / ref.abs().clamp_min(1e-30))[x.abs() < 60].max().item() < 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [F32, BF16, torch.float64])
def test_gpu_pow_gives_eagers_bits(dtype, monkeypatch):
    """On a GPU a float64 ``x ** p`` is libdevice's pow, the function ATen's CUDA kernel calls: eager's bits. float32
    and 16-bit values take the portable float64 route, rounded once, where eager's powf is up to two ulps off:
    within two ulps (one bf16 ulp after rounding). The special-cased exponents through the portable products,
    sqrt and reciprocals; NaN and infinities where eager has them. (A first version expected libdevice's powf to
    give eager's float32 bits: 40% differed by one or two ulps, H200, 2026-11-29.)"""
    g = torch.Generator(device="cuda").manual_seed(0)
    N = 1 << 16
    X = torch.cat([torch.rand(1, N, device="cuda", generator=g) * 20,
                   torch.rand(1, N, device="cuda", generator=g) * 1e-3,
                   torch.tensor([[0.0, -0.0, float("inf"), float("-inf"), float("nan"), -2.0, -0.5, 1.0, -1.0]],
                                device="cuda")], 1).to(dtype)
    A, B = torch.ones(1, 1, device="cuda", dtype=dtype), torch.ones(1, X.shape[1], device="cuda", dtype=dtype)
    # -0.5 is eager's rsqrt, whose float64 bits differ from 1 / sqrt (26% by an ulp, H200): not compared exactly
    exps = (2.7, -1.3, 0.33, 1.5, 4, -3, -4, 5, 33, -35, 2, -1, 0.5)
    if dtype != BF16:  # eager's 16-bit x ** 3 and x ** -2 round x * x to 16 bits first (docs/epilogues.md, "Dtypes")
        exps += (3, -2)
    fn = lambda acc, C: tuple(C ** p for p in exps)  # noqa: E731
    want = fn(None, X)
    for mode in ("auto", "never"):
        monkeypatch.setenv("EVTORCH_FAST_MATH", mode)
        got = evt.gemm(A, B, fn, C=X)
        for p, a, b in zip(exps, got, want):
            b = b.to(a.dtype)
            assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.isinf(a), torch.isinf(b)), p
            if dtype == torch.float64 and mode == "auto":
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m, p=p: f"x ** {p}: {m}")
                continue
            real = torch.isfinite(b) & (b != 0)
            step = (b.nextafter(torch.full_like(b, float("inf"))) - b).abs()
            ulps = ((a - b).abs() / step)[real].max().item()
            assert ulps <= {F32: 2, BF16: 1, torch.float64: 2000}[dtype], (mode, p, ulps)
