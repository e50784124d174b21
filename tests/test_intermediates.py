"""16-bit intermediates kept in float32 (EVTORCH_INTERMEDIATES=float32, passes/intermediates.py).

The mode's contract: the epilogue computes what eager computes with every implicit 16-bit intermediate kept in
float32 (``Float32Intermediates`` below; for a function without explicit casts, the function run on its 16-bit
inputs widened), except explicit casts and values that reach a comparison or a min/max, which round where eager
rounds. Checked on the IR, on the reference executor, through the Triton interpreter, through autograd (whose
forward and backward replay the forward's graph), on every call path and on random DAGs.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from torch.overrides import TorchFunctionMode

import evtorch as evt
from evtorch.codegen import fastmath
from evtorch.examples import lincomb_relu, row_reduction
from evtorch.passes.intermediates import reaching_discontinuities

from helpers import assert_matches, as_tuple, expected_dtype
from test_random_dags import dag_cases

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
M, N, K = 48, 40, 32


class Float32Intermediates(TorchFunctionMode):
    """Eager PyTorch with float32 intermediates: an op whose result would be a 16-bit float (other than an
    explicit cast) runs again on its 16-bit operands widened to float32 (exactly), as torch.compile computes it."""

    CASTS = frozenset({torch.Tensor.to, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.float,
                       torch.Tensor.double, torch.Tensor.type})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in self.CASTS or not isinstance(out, torch.Tensor) or out.dtype not in (BF16, F16):
            return out

        def widen(a):
            return a.float() if isinstance(a, torch.Tensor) and a.dtype in (BF16, F16) else a
        return func(*[widen(a) for a in args], **{k: widen(v) for k, v in kwargs.items()})


def float32_eager(fn, acc, **kw):
    with Float32Intermediates():
        return fn(acc, **kw)


def widened(fn):
    """``fn`` with its 16-bit tensor inputs widened to float32 (exactly): eager with float32 intermediates, for a
    function without explicit casts to 16 bits."""
    def run(acc, **kw):
        return fn(acc, **{k: v.float() if isinstance(v, torch.Tensor) and v.dtype in (BF16, F16) else v
                          for k, v in kw.items()})
    return run


def _nodes(ep):
    return {n.name: n for n in ep.graph.nodes}


def test_relabels_the_implicit_intermediates():
    ep = evt.trace(row_reduction, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=0.5, beta=1.25,
                   intermediates="float32")
    nodes = _nodes(ep)
    assert nodes["t1"].dtype == F32 and nodes["t1"].meta["eager_dtype"] == BF16  # beta * C
    assert nodes["t2"].dtype == F32 and nodes["t2"].meta["eager_dtype"] == BF16  # tanh of it
    assert "# eager: bf16" in str(ep.graph)
    assert any(name == "float32_intermediates" for name, _ in ep.passes_log)
    eager = evt.trace(row_reduction, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=0.5, beta=1.25,
                      intermediates="eager")
    assert _nodes(eager)["t1"].dtype == BF16 and not any("eager_dtype" in n.meta for n in eager.graph.nodes)
    assert all(name != "float32_intermediates" for name, _ in eager.passes_log)


def test_keeps_explicit_casts_comparisons_and_minmax():
    def fn(acc, C):
        cast = (acc * 3.0).to(torch.bfloat16)        # explicit: the user asked for this rounding
        z = C * 2.5                                  # reaches a comparison: rounds as eager
        w = torch.where(z > 0.5, z, acc)
        m = (C * 0.75).amax(dim=1)                   # reaches a min/max: rounds as eager
        free = torch.sigmoid(C * 1.5)                # reaches only arithmetic and an output: float32
        return cast + w, m, free * acc
    ep = evt.trace(fn, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), intermediates="float32")
    by_target = {}
    for n in ep.graph.nodes:
        if n.op == "compute":
            by_target.setdefault(n.target, []).append(n)
    assert [n.dtype for n in by_target["cast"] if n.attrs["dtype"] == BF16] == [BF16]
    muls = {n.args[0].target if n.args[0].op == "const" else n.args[1].target: n for n in by_target["mul"]
            if any(a.op == "const" for a in n.args)}
    assert muls[2.5].dtype == BF16 and "eager_dtype" not in muls[2.5].meta
    assert muls[0.75].dtype == BF16
    assert muls[1.5].dtype == F32 and muls[1.5].meta["eager_dtype"] == BF16
    assert by_target["sigmoid"][0].dtype == F32
    unsafe = reaching_discontinuities(ep.graph)
    assert id(muls[2.5]) in unsafe and id(muls[0.75]) in unsafe and id(muls[1.5]) not in unsafe


def test_rejects_an_unknown_mode(monkeypatch):
    with pytest.raises(ValueError, match="intermediates must be one of eager, float32, got 'fp32'"):
        evt.trace(row_reduction, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=0.5, beta=1.25,
                  intermediates="fp32")
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "fp32")
    with pytest.raises(ValueError, match="EVTORCH_INTERMEDIATES='fp32' is not one of eager, float32"):
        evt.trace(row_reduction, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=0.5, beta=1.25)


def _operands(seed=0, dtype=BF16):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=g).to(dtype)
    B = torch.randn(K, N, generator=g).to(dtype)
    C = torch.randn(M, N, generator=g).to(dtype)
    return A, B, C


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_values_are_eager_on_widened_inputs(monkeypatch, backend):
    """Under float32 the row sum equals eager's on the widened C to float32 accuracy, and differs from the
    eager-rounding result by about an fp16 rounding: the mode is what runs (outputs poisoned: helpers)."""
    A, B, C = _operands(dtype=F16)  # (the interpreter's tl.dot is wrong on bf16)
    acc = A.float() @ B.float()
    want_d, want_sum = widened(row_reduction)(acc, C=C, alpha=0.5, beta=1.25)
    eager_d, eager_sum = row_reduction(acc, C=C, alpha=0.5, beta=1.25)
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "float32")  # read at trace time; the trace cache keys on it
    d, s = evt.gemm(A, B, row_reduction, C=C, alpha=0.5, beta=1.25, backend=backend)
    torch.testing.assert_close(s, want_sum, rtol=2e-6, atol=2e-5)
    torch.testing.assert_close(d, want_d.to(F16), rtol=1e-3, atol=0.0)  # one fp16 rounding, at the store
    assert (s - eager_sum).abs().max() > 2e-4  # eager's roundings of beta*C and tanh, summed over 40 columns
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "eager")
    _, s_eager = evt.gemm(A, B, row_reduction, C=C, alpha=0.5, beta=1.25, backend=backend)
    torch.testing.assert_close(s_eager, eager_sum, rtol=2e-6, atol=2e-5)


def test_fast_math_still_counts_eager_roundings():
    """tanh(beta * C) is rounded by eager: an approximation stays allowed when float32 keeps it unrounded."""
    for mode in ("eager", "float32"):
        ep = evt.trace(row_reduction, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=0.5, beta=1.25,
                       intermediates=mode)
        graph, emissions = fastmath.plan(ep, BF16, "auto")
        assert [graph.nodes[i].target for i in emissions.fast] == ["tanh"], mode


def test_products_of_16_bit_values_fuse_into_fma():
    """alpha * acc + beta * C: one product enters an fma, in both modes (a bf16 value widens exactly); only
    its rounding differs."""
    for mode, product in (("float32", F32), ("eager", BF16)):
        ep = evt.trace(lincomb_relu, acc=evt.spec((M, N)), C=evt.spec((M, N), BF16), alpha=1.5, beta=0.5,
                       intermediates=mode)
        computes = [n for n in ep.graph.nodes if n.op == "compute"]
        assert [n.target for n in computes] == ["mul", "fma", "relu"], mode
        assert computes[0].dtype == product and computes[0].args[1].target == "C", mode


def _gelu_mix(acc, C, s):
    h = torch.relu(acc * 0.5 + C * 1.25) * torch.tanh(C * 0.75)
    return h, h.sum(dim=1), (acc + C * 2.0).amax(dim=0) + s


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_autograd_replays_the_forwards_dtypes(monkeypatch, backend):
    """The autograd forward (an epilogue replaying the optimized graph) returns bit for bit what the plain
    forward returns, and the gradients are those of the widened function (amax's recomputed maxima included)."""
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "float32")
    A32, B32, C = _operands(3, dtype=F16)
    A32, B32 = A32.float(), B32.float()
    s = torch.randn(N)
    plain = evt.gemm(A32, B32, _gelu_mix, C=C, s=s, backend=backend)
    A, B = A32.clone().requires_grad_(), B32.clone().requires_grad_()
    out = evt.gemm(A, B, _gelu_mix, C=C, s=s, backend=backend)
    for p, o in zip(plain, out):
        assert torch.equal(p, o.detach())
    Ar, Br = A32.double().requires_grad_(), B32.double().requires_grad_()
    ref = widened(_gelu_mix)(Ar @ Br, C=C, s=s.double())
    ws = [torch.randn_like(r) for r in ref]
    got = torch.autograd.grad(sum((o.double() * w).sum() for o, w in zip(out, ws)), (A, B))
    want = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, ws)), (Ar, Br))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


def test_the_knob_is_honoured_by_every_call_path(monkeypatch):
    """Switching EVTORCH_INTERMEDIATES between calls of one signature retraces, on the plain call, the autograd
    call (whose plans are registered per signature) and evt.linear."""
    A, B, C = _operands(5, dtype=F16)
    A, B = A.float(), B.float()
    acc = A @ B
    want = {"float32": widened(row_reduction)(acc, C=C, alpha=0.5, beta=1.25)[1],
            "eager": row_reduction(acc, C=C, alpha=0.5, beta=1.25)[1]}
    assert (want["float32"] - want["eager"]).abs().max() > 2e-4
    x, w = A.clone().requires_grad_(), B.t().contiguous().requires_grad_()
    for mode in ("eager", "float32", "eager"):
        monkeypatch.setenv("EVTORCH_INTERMEDIATES", mode)
        for got in (evt.gemm(A, B, row_reduction, C=C, alpha=0.5, beta=1.25)[1],
                    evt.gemm(x, B, row_reduction, C=C, alpha=0.5, beta=1.25)[1],
                    evt.linear(x, w, row_reduction, C=C, alpha=0.5, beta=1.25)[1]):
            torch.testing.assert_close(got.detach(), want[mode], rtol=2e-6, atol=2e-5, msg=mode)


def test_a_traced_epilogue_keeps_its_setting_at_other_shapes(monkeypatch):
    """evt.trace(..., intermediates='float32') passed to evt.gemm for another shape is traced again in float32,
    whatever the environment says."""
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "eager")
    ep = evt.trace(row_reduction, acc=evt.spec((8, 8)), C=evt.spec((8, 8), F16), alpha=0.5, beta=1.25,
                   intermediates="float32")
    A, B, C = _operands(9, dtype=F16)
    acc = A.float() @ B.float()
    got = evt.gemm(A, B, ep, C=C, alpha=0.5, beta=1.25)[1]
    torch.testing.assert_close(got, widened(row_reduction)(acc, C=C, alpha=0.5, beta=1.25)[1], rtol=2e-6, atol=2e-5)
    assert (got - row_reduction(acc, C=C, alpha=0.5, beta=1.25)[1]).abs().max() > 2e-4


def test_compiled_calls_trace_in_float32(monkeypatch):
    """torch.compile(fullgraph=True) of a function calling evt.gemm: the plan it registers at compile time is the
    float32 one (the knob is read while Dynamo traces), with gradients."""
    torch._dynamo.reset()
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "float32")
    A, B, C = _operands(11, dtype=F16)
    A, B = A.float().requires_grad_(), B.float().requires_grad_()

    def f(A, B, C):
        d, s = evt.gemm(A, B, row_reduction, C=C, alpha=0.5, beta=1.25)
        return s
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(A, B, C)
    want = widened(row_reduction)(A @ B, C=C, alpha=0.5, beta=1.25)[1]
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-5)
    g_got = torch.autograd.grad(got.sum(), (A, B))
    g_want = torch.autograd.grad(want.sum(), (A, B))
    for g, w in zip(g_got, g_want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float16, torch.bfloat16), input_dtypes=(torch.float16, torch.bfloat16)))
def test_random_dags_match_eager_on_widened_inputs(case):
    note(repr(case))
    _matches_eager_on_widened_inputs(case)


def _matches_eager_on_widened_inputs(case):
    """Every element equals eager with float32 intermediates, eager itself (where a comparison or a min/max kept
    eager's rounding) or eager in float64, to the output dtype's tolerance; against eager itself to the precision
    eager computed in (its least precise intermediate, as ``helpers.compare_outputs`` compares): a value kept at
    eager's 16-bit rounding because it reaches a comparison can feed float32 arithmetic after it, which neither
    all-float32 nor all-16-bit eager computes (hypothesis found ``v4 = bf16(|acc|) ** 2`` compared with acc and
    squared again: 5.640625 against eager's 5.625 and float32 eager's 5.609375)."""
    from helpers import eager_with_precision
    acc = case.A.float() @ case.B.float() if case.A.dtype != torch.float64 else case.A @ case.B
    ep32 = _float32_epilogue(case, tuple(acc.shape))
    got = as_tuple(evt.gemm(case.A, case.B, ep32, backend="reference", **case.inputs))
    ties: list = []
    eager, lowest = eager_with_precision(case.fn, acc, ties=ties, **case.inputs)
    refs = [as_tuple(float32_eager(case.fn, acc, **case.inputs)), eager]
    try:
        _match_some_reference(got, refs, ep32, case, acc, lowest)
    except AssertionError:
        # a max / min of +0 and -0: eager's winner depends on torch's kernel path (helpers.EagerIllDefined)
        assume(not ties[0])
        raise


def _match_some_reference(got, refs, ep32, case, acc, lowest):
    from helpers import TOLERANCES, eager_hi, upcast
    eager = refs[1]
    hi = eager_hi(case.fn, acc, **{k: upcast(v) for k, v in case.inputs.items()})
    if hi is not None:
        refs.append(hi)
    for i, g in enumerate(got):
        dtype = expected_dtype(ep32, i, refs[0][i], case.A.dtype)
        failures = []
        for ref in refs:
            try:
                assert_matches(g, ref[i].to(dtype), dtype=dtype, what=f"output {i}")
                break
            except AssertionError as e:
                failures.append(str(e))
        else:
            # elementwise: each element may match a different reference (a comparison kept eager's rounding)
            coarse = max((d for d in (dtype, lowest) if d in TOLERANCES), key=lambda d: TOLERANCES[d][0])
            ok = torch.zeros(g.shape, dtype=torch.bool)
            for ref in refs:
                tol = coarse if ref is eager else dtype
                ok |= _elementwise_close(g.double(), ref[i].to(dtype).double(), tol)
            assert bool(ok.all()), "\n".join(failures)


def test_kept_rounding_feeding_float32_arithmetic():
    """The example hypothesis found (CI, 2026-11-27): ``v4 = bf16(|acc|) ** 2`` reaches a comparison with acc, so
    it keeps eager's bf16 rounding, and is squared again in float32 after it; the result (5.640625) is neither
    eager's (5.625) nor float32 eager's (5.609375) within float16's tolerance, and agrees with eager to bfloat16's,
    the precision eager computed it in."""
    import test_random_dags
    from test_random_dags import DagCase

    source = ("def epi(acc):\n    v1 = op['abs'](acc)\n    v2 = op['abs'](v1)\n    v3 = v2.bfloat16()\n"
              "    v4 = v3 ** 2\n    v5 = op['eq'](v4, acc)\n    v6 = op['abs'](v4)\n    v7 = op['abs'](v6)\n"
              "    v8 = op['abs'](v7)\n    v9 = v8 ** 2\n    return (v9.mT, v5.mT,)")
    scope = {"op": test_random_dags.OPS}
    exec(source, scope)  # noqa: S102 - the test's own fixed source
    A = torch.tensor([[[-0.1008], [0.0531]], [[1.0781], [0.0123]], [[0.2432], [1.6045]]], dtype=F16)
    B = torch.tensor([[0.4902, 0.3459, 0.9653, -0.4263, 0.9609]], dtype=F16)
    case = DagCase(source=source, fn=scope["epi"], A=A, B=B, inputs={}, sizes={"L": 3, "M": 2, "N": 5, "K": 1})
    got = evt.gemm(A, B, _float32_epilogue(case, (3, 2, 5)), backend="reference")[0]
    assert got[2, 4, 1].item() == 5.640625  # the kept rounding, then float32: what the contract computes
    _matches_eager_on_widened_inputs(case)


def test_signed_zero_tie_in_eager_rejects_the_example():
    """The example hypothesis found (2026-11-29): ``maximum(-0 + -0, row_index)`` meets +0 against -0, and torch
    picks the winner by kernel path (here +0, so ``1 / ceil(...)`` is +inf, where the contract's -0 gives -inf):
    eager is not defined there, so the widened-inputs check rejects the example (``assume``, as
    ``helpers.EagerIllDefined`` does for the other random-DAG tests) instead of failing on it."""
    from hypothesis.errors import UnsatisfiedAssumption
    import test_random_dags
    from test_random_dags import DagCase

    source = ("def epi(acc, in0, in1, in2, in3):\n    v5 = evt.row_index(acc)\n    v6 = op['add'](in1, in1)\n"
              "    v7 = op['maximum'](v6, v5)\n    v8 = op['ceil'](v7)\n    v9 = op['reciprocal'](v8)\n"
              "    return (v9.mT,)")
    scope = {"op": test_random_dags.OPS, "evt": evt}
    exec(source, scope)  # noqa: S102 - the test's own fixed source
    A = torch.tensor([[[0.1803], [-0.1429], [-0.1969], [0.1215]], [[-0.6919], [-1.1562], [-0.1586], [-0.4331]]],
                     dtype=F16)
    B = torch.tensor([[-0.6953, -0.4077, -0.1603, 0.3689, -0.8765, 0.3018, -0.1260, -0.2186]], dtype=F16)
    col = torch.tensor([[[0.0], [0.5], [-2.5], [-0.0]], [[1.0], [2.5], [-1.0], [-0.5]]], dtype=F16)
    inputs = dict(in0=col, in1=torch.tensor([[[-0.0]], [[0.0]]], dtype=F16), in2=col.flip(1), in3=-col)
    case = DagCase(source=source, fn=scope["epi"], A=A, B=B, inputs=inputs, sizes={"L": 2, "M": 4, "N": 8, "K": 1})
    with pytest.raises(UnsatisfiedAssumption):
        _matches_eager_on_widened_inputs(case)


def _float32_epilogue(case, acc_shape):
    """The case's epilogue traced with float32 intermediates; only DAGs where the pass relabels something count
    (most random DAGs compute on the float32 accumulator, where there is nothing to relabel)."""
    ep = evt.api.get_epilogue(case.fn, acc_shape, torch.float32, case.inputs)
    ep32 = evt.Epilogue(case.fn, ep.acc_shape, ep.acc_dtype, ep.input_specs, intermediates="float32")
    assume(any("eager_dtype" in n.meta for n in ep32.graph.nodes))
    return ep32


def _elementwise_close(g, w, dtype):
    from helpers import TOLERANCES
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    same = (g == w) | (g.isnan() & w.isnan())
    return same | (g.isfinite() & w.isfinite() & ((g - w).abs() <= atol + rtol * w.abs()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", ["lincomb_relu", "colbcast_leaky", "rowreduce_tanh", "bce_loss", "mixed_dag"])
def test_gpu_workloads_match_the_widened_function(monkeypatch, name):
    """bf16 on the GPU (the interpreter's tl.dot is wrong on bf16), every template the tuner may pick, outputs
    poisoned: float32 intermediates against the widened function in float64, as tight as eager mode is."""
    from benchmarks.workloads import WORKLOADS
    w = WORKLOADS[name]
    torch.manual_seed(7)
    M_, N_, K_ = 512, 384, 256
    A = (torch.randn(M_, K_, device="cuda") / K_ ** 0.25).to(BF16)
    B = (torch.randn(K_, N_, device="cuda") / K_ ** 0.25).to(BF16)
    kw = w.make_inputs(M_, N_, "cuda", BF16)
    acc64 = A.double() @ B.double()
    hi = as_tuple(widened(w.fn)(acc64, **{k: v.double() if isinstance(v, torch.Tensor) else v
                                        for k, v in kw.items()}))
    errs = {}
    for mode in ("eager", "float32"):
        monkeypatch.setenv("EVTORCH_INTERMEDIATES", mode)
        got = as_tuple(evt.gemm(A, B, w.fn, **kw))
        errs[mode] = max(((g.double() - h).abs().max() / h.abs().max().clamp_min(1e-30)).item()
                         for g, h in zip(got, hi))
    assert errs["float32"] <= max(errs["eager"] * 1.05, 8e-3), errs


@pytest.mark.interpreter
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float16,), exclude_ops=frozenset({"cast"}), input_dtypes=(torch.float16,)))
def test_random_dags_generated_kernels_follow_the_float32_graph(case):
    """The generated kernels (Triton interpreter, poisoned outputs) compute the float32-intermediates graph as the
    reference executor does, on the kernel's own accumulator, to float32's tolerance (fp16 operands: the
    interpreter's tl.dot is wrong on bf16).
    Derandomized, as test_codegen_interp's random DAGs are, so CI sees the same examples every run."""
    note(repr(case))
    ep32 = _float32_epilogue(case, tuple(case.A.shape[:-1]) + (case.B.shape[-1],))
    acc = evt.gemm(case.A, case.B, backend="triton", out_dtype=torch.float32)
    # float32 outputs: an fp16 rounding the kernel should not do would hide under an fp16 output's tolerance
    got = as_tuple(evt.gemm(case.A, case.B, ep32, backend="triton", out_dtype=torch.float32, **case.inputs))
    want = as_tuple(ep32.reference(acc, out_dtype=torch.float32, **case.inputs))
    for i, (g, w) in enumerate(zip(got, want)):
        assert_matches(g, w, dtype=w.dtype, what=f"output {i}")


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_float64_values_in_a_float32_epilogue_compute_in_float64(backend):
    """``acc.double()`` or a float64 input in a float32 epilogue: eager computes those ops in float64. The triton
    backend converted every operand to the epilogue's float32 compute dtype, so ``(x.double() + 1e8) - 1e8`` came
    back as float32's rounding of it, 4 off (found 2026-11-29 by a probe of the scans, which had the same fault)."""
    torch.manual_seed(0)
    A, B = torch.randn(33, 7), torch.randn(7, 21)
    b64 = torch.randn(33, 21, dtype=torch.float64) * 1e8

    def fn(acc, b64):
        up = (acc.double() + 1e8) - 1e8
        return up.float(), ((acc + b64) - b64).float(), torch.where(up > acc.double() - 1e-9, up, b64).float()
    for got, want in zip(evt.gemm(A, B, fn, b64=b64, backend=backend), fn(A @ B, b64)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert (got - want).abs().max() < 1e-5  # float32's rounding of the sum would be off by up to 4
