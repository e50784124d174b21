"""Generated Triton kernels, run through the Triton interpreter on CPU (TRITON_INTERPRET=1, see conftest.py).

Every case of ``evtorch.testing`` (each registry op, every input role, views, reductions, the vector stage, the
source documents' examples) runs in fp32 and fp16 with outputs poisoned, in both reduction modes, and must
match eager PyTorch on the float64 product. bf16 runs on the GPU only (the interpreter's bf16 dot and casts
are wrong).
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl  # noqa: F401  (Triton wants it visible to @triton.jit functions here)

import evtorch as evt
from evtorch.codegen.configs import GemmConfig
from evtorch.runtime.gemm_launch import resolve_config
from evtorch.testing import all_cases, check

CASES = [c for c in all_cases() if not c.gpu_only]


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_through_interpreter(case, dtype):
    check(case, M=19, N=21, K=13, L=2, dtype=dtype)


DETERMINISTIC = [c for c in CASES if c.name.startswith(("reduce_", "vector_stage", "example_", "amax"))]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", DETERMINISTIC, ids=[c.name for c in DETERMINISTIC])
def test_deterministic_reductions(case):
    check(case, M=19, N=21, K=13, L=2, deterministic=True)


@pytest.mark.interpreter
@pytest.mark.parametrize("template,tile", [("portable", (16, 32)), ("splitk", (16, 32)), ("splitk", (64, 64)),
                                           ("persistent_tma", (16, 32))])
def test_every_template_takes_every_epilogue_kind(template, tile):
    """Fusion never enlarges the tuning space: the same epilogue runs under each template's config. Split-K on
    64 x 64 tiles: one GEMM tile, so its reduce kernel (and the epilogue, amax over M and over N included) runs
    on 32 x 64 tiles (``GemmConfig.reduce_tile``)."""
    from evtorch.examples import EXAMPLES, eager_reference
    extra = (("EPILOGUE_SUBTILE", True),) if template == "persistent_tma" else ()
    cfg = GemmConfig(template, *tile, 16, 2, 2 if template == "splitk" else 1, 4, 1, extra)
    ex = EXAMPLES["mixed_dag"]
    A, B = torch.randn(35, 24), torch.randn(24, 41)
    kw = ex.make_inputs(35, 41, "cpu", torch.float32)
    for det in (False, True):
        out = evt.gemm(A, B, ex.fn, backend="triton", config=cfg, deterministic=det, **kw)
        ref = eager_reference(ex.fn, A, B, **kw)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
def test_deterministic_is_bit_identical():
    A, B = torch.randn(40, 24), torch.randn(24, 50)
    fn = lambda acc: (acc.sum(1), acc.amax(0), acc.logsumexp(1), (acc * acc).mean())  # noqa: E731
    first = evt.gemm(A, B, fn, backend="triton", deterministic=True)
    for _ in range(2):
        again = evt.gemm(A, B, fn, backend="triton", deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.interpreter
def test_deterministic_follows_torchs_flag(monkeypatch):
    """``deterministic=None`` (the default of evt.gemm, evt.linear and the differentiable path) follows
    ``torch.use_deterministic_algorithms``: the program is built with fixed-order reductions under the flag and
    with atomics without it; an explicit value wins either way."""
    from evtorch.runtime import gemm as rt
    seen = []
    real = rt.build_program

    def spy(ep, *args, **kwargs):
        seen.append(kwargs["deterministic"])
        return real(ep, *args, **kwargs)
    monkeypatch.setattr(rt, "build_program", spy)
    A, B, bias = torch.randn(20, 12), torch.randn(12, 18), torch.randn(18)
    W = B.T.contiguous()
    calls = [lambda **kw: evt.gemm(A, B, lambda acc: (acc, acc.sum(0)), backend="triton", **kw),
             lambda **kw: evt.gemm(A.requires_grad_(), B, lambda acc: acc.sum(1), backend="triton", **kw),
             lambda **kw: evt.linear(A, W, lambda y: y.sum(0), bias, backend="triton", **kw)]
    for flag, kwargs, want in [(True, {}, True), (False, {}, False), (True, {"deterministic": False}, False),
                               (False, {"deterministic": True}, True)]:
        torch.use_deterministic_algorithms(flag)
        try:
            for i, call in enumerate(calls):
                seen.clear()
                rt._prog_memo.clear()  # built again, so the spy sees each call's program
                call(**kwargs)
                assert seen and set(seen) == {want}, (flag, kwargs, i, seen)
        finally:
            torch.use_deterministic_algorithms(False)


@pytest.mark.interpreter
def test_strided_and_transposed_operands_and_outputs():
    A = torch.randn(30, 20).T  # (20, 30) column-major
    B = torch.randn(45, 30)[::2].T  # (30, 23) with a row stride of 2
    C = torch.randn(23, 20).T
    fn = lambda acc, C: (torch.relu(acc + C).T, acc * 2)  # noqa: E731
    out = evt.gemm(A, B, fn, backend="triton", C=C)
    ref = fn(A @ B, C=C)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    assert out[0].shape == (23, 20) and out[0].stride() == (1, 23)


@pytest.mark.interpreter
def test_zero_sizes():
    fn = lambda acc: (acc + 1, acc.sum(1), acc.amax(0))  # noqa: E731
    for M, N, K in [(0, 5, 3), (4, 0, 3), (4, 5, 0)]:
        out = evt.gemm(torch.randn(M, K), torch.randn(K, N), fn, backend="triton")
        ref = evt.gemm(torch.randn(M, K), torch.randn(K, N), fn, backend="reference")
        for o, r in zip(out, ref):
            assert o.shape == r.shape
        if K == 0:
            torch.testing.assert_close(out[0], torch.ones(M, N))


@pytest.mark.interpreter
@pytest.mark.parametrize("fn", [lambda acc: (acc, torch.zeros_like(acc).sum(0)),
                                lambda acc: (acc, torch.ones_like(acc).sum(1)),
                                lambda acc: (acc, torch.zeros_like(acc).sum()),
                                lambda acc: (acc, torch.zeros_like(acc))],
                         ids=["col_sum_of_zeros", "row_sum_of_ones", "total_of_zeros", "zeros_output"])
def test_constant_outputs_and_reductions_of_constants(fn):
    """A constant reaching an output or a reduction is a Python literal in the generated source, which has no
    .to: stores and reductions convert it with tl.cast (these crashed the kernel, found 2026-11-29)."""
    A, B = torch.randn(8, 5), torch.randn(5, 6)
    for got, want in zip(evt.gemm(A, B, fn, backend="triton"), fn(A @ B)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=["f32", "f16", "f64"])
def test_scalar_input_returned_as_an_output(dtype):
    """A Python-number input returned as is (``return D, scale``) is stored like a constant, through tl.cast: a
    scalar argument is a bare Python float in the interpreter, which has no .to (an InterpreterError before)."""
    A, B = torch.randn(8, 5, dtype=dtype), torch.randn(5, 6, dtype=dtype)
    fn = lambda acc, s, i: (acc * s, s, i)  # noqa: E731
    got = evt.gemm(A, B, fn, s=2.5, i=3, backend="triton")
    want = evt.gemm(A, B, fn, s=2.5, i=3, backend="reference")
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


@pytest.mark.interpreter
def test_float64_epilogue_takes_python_float_scalars_as_float64():
    """A Python float meets a float64 accumulator as a float64, as in eager (acc * 0.1 with the double 0.1): the IR
    types the scalar f64 and the kernel signature declares it tl.float64, where Triton would pass a Python float as
    fp32 (a silent 1e-8 relative error on a GPU; the interpreter failed on the f32 scalar's .to, found
    2026-11-29). Float32 epilogues keep plain fp32 scalars."""
    from evtorch.codegen import program
    A, B = torch.randn(8, 5, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    C = torch.randn(8, 6, dtype=torch.float64)
    fn = lambda acc, C, s, t: (acc * s + C * t, (acc * s).sum(0))  # noqa: E731
    got = evt.gemm(A, B, fn, C=C, s=0.1, t=1 / 3, backend="triton")
    for g, w in zip(got, fn(A @ B, C, 0.1, 1 / 3)):
        torch.testing.assert_close(g, w, rtol=1e-14, atol=1e-14)
    for dtype, annotated in ((torch.float64, True), (torch.float32, False)):
        ep = evt.trace(fn, acc=evt.spec((8, 6), dtype), C=C.to(dtype), s=0.1, t=0.2)
        assert {str(n.dtype) for n in ep.graph.nodes if n.op == "scalar"} == {str(dtype)}
        source = program.build_program(ep, out_dtype=dtype).source
        assert ("sc_s: tl.float64," in source) is annotated and ("sc_t: tl.float64," in source) is annotated


SCALAR_VALUES = {"float": -0.3, "int": 3, "bool": True, "0-d f64": torch.tensor(0.7, dtype=torch.float64),
                 "0-d f32": torch.tensor(-1.5), "0-d int": torch.tensor(2)}


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16], ids=["f64", "f32", "f16"])
@pytest.mark.parametrize("itype", [torch.int64, torch.int32, torch.bool], ids=["i64", "i32", "bool"])
def test_integer_tiles_times_scalars_in_the_interpreter(dtype, itype):
    """An integer or boolean tile times a float scalar computes in float32 (eager's promotion), so a float64
    epilogue's float64 scalar argument is cast: the interpreter handed the kernel the Python float itself, and
    ``.to`` on it failed ("'float' object has no attribute 'to'"; ``-s`` in ``tlmath.neg`` failed in float32
    kernels too, found by a probe 2026-11-29). ``runtime.interpreter_fixes`` types float arguments as a compiled
    kernel does. Every kind of scalar (Python float, int, bool, 0-d tensors) against eager, with the constant form
    and a float scalar meeting a float64 value in a float32 GEMM."""
    import helpers
    A, B = helpers.operands(7, 6, 5, dtype, seed=3)
    I = helpers.rand_int((7, 6), -4, 5, seed=4, dtype=itype if itype != torch.bool else torch.int64)  # noqa: E741
    I = I > 0 if itype == torch.bool else I  # noqa: E741
    D = helpers.rand((7, 6), torch.float64, seed=5)
    run = lambda A, B, fn, **kw: evt.gemm(A, B, fn, backend="triton", **kw)  # noqa: E731
    for s in SCALAR_VALUES.values():
        helpers.check_gemm(lambda acc, I, s: acc + I * s, A, B, runner=run, I=I, s=s)
        helpers.check_gemm(lambda acc, I, s: acc * (I * -s + 1), A, B, runner=run, I=I, s=s)
    helpers.check_gemm(lambda acc, I: acc + I * 0.5, A, B, runner=run, I=I)
    helpers.check_gemm(lambda acc, D, s: (acc + D * s, acc.double() * s, acc.float() - s), A, B, runner=run,
                       D=D, s=0.1)


@pytest.mark.interpreter
def test_float_arguments_are_typed_as_compiled_kernels_type_them():
    """``interpreter_fixes.typed_float_arguments``: a Python float for a ``tl.float64`` parameter becomes a float64
    value, one for an unannotated parameter fp32 (``triton.runtime.jit.mangle_type``'s type; beyond its range
    inf), and constexprs, ints and parameters of other types take it as given."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    from evtorch.runtime.interpreter_fixes import typed_float_arguments

    def kernel(x, a: tl.float64, b, c: tl.constexpr, d: tl.int64):
        pass
    third = 1 / 3
    (x, a, b), kw = typed_float_arguments(kernel, (7, third, 1e300), {"c": 0.5, "d": 2.5}, tl, TensorHandle)
    assert x == 7 and kw["c"] == 0.5 and kw["d"] == 2.5
    assert a.dtype == tl.float64 and a.handle.data.tolist() == [third]
    assert b.dtype == tl.float32 and np.isinf(b.handle.data).all()


@pytest.mark.interpreter
def test_float64_kernels_type_their_inexact_constants_float64():
    """A float64 kernel's constants that float32 cannot hold (gelu's 0.044715 and sqrt(2/pi), a mean's 1/n) reach
    Triton as float64: the literal as ``tl.full((), c, tl.float64)``, the mean's reciprocal count argument
    annotated ``tl.float64``. Triton 3.6 rounded the bare forms to float32 on an H200 (gelu_tanh 6e-10, the row
    mean 2.5e-8 relative, found 2026-11-29), which the interpreter's Triton does not, so this reads the source;
    the GPU selftest checks the values. Float32 kernels keep bare literals and an unannotated count."""
    from evtorch.codegen import program
    fn = lambda acc, C: (F.gelu(acc + C, approximate="tanh"), acc.mean(1), acc * 0.5 + 0.1)  # noqa: E731
    for dtype, typed in ((torch.float64, True), (torch.float32, False)):
        ep = evt.trace(fn, acc=evt.spec((8, 6), dtype), C=evt.spec((8, 6), dtype))
        source = program.build_program(ep, out_dtype=dtype).source
        for c in ("0.044715", "0.7978845608028654", "0.1"):
            assert (f"tl.full((), {c}, tl.float64)" in source) is typed, (dtype, c)
        assert "tl.full((), 0.5, tl.float64)" not in source  # float32 holds 0.5: left bare
        assert ("inv_count0: tl.float64," in source) is typed
    A, B = torch.randn(9, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    C = torch.randn(9, 7, dtype=torch.float64)
    for got, want in zip(evt.gemm(A, B, fn, C=C, backend="triton"), fn(A @ B, C)):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)


@pytest.mark.interpreter
def test_float64_check_holds_float32_inputs_to_float32_tolerance():
    """testing.check's float64 reference computes in float64 throughout, but an epilogue's float32 inputs keep
    float32 arithmetic as in eager (roles_2d's ``v[:, None] * s``, 2e-8 off), so a float64 run with narrower
    inputs is held to float32's tolerance (it failed at 1e-10 before, GPU selftest 2026-11-29); one without them
    keeps float64's."""
    from evtorch.testing import all_cases, check, tolerance
    cases = {c.name: c for c in all_cases()}
    assert check(cases["roles_2d"], M=20, N=12, K=9, L=2, dtype=torch.float64)[0] < 1e-5
    f64, f32, bf16 = (torch.empty(2, dtype=d) for d in (torch.float64, torch.float32, torch.bfloat16))
    assert tolerance(torch.float64, dict(C=f64, s=0.5)) == 1e-10
    assert tolerance(torch.float64, dict(C=f64, v=f32)) == 1e-5
    assert tolerance(torch.float32, dict(C=f32, b=bf16)) == pytest.approx(1e-4)
    assert tolerance(torch.float32, dict(C=f32)) == 1e-5 and tolerance(torch.bfloat16, dict(C=bf16)) == 1e-2


@pytest.mark.interpreter
def test_scalars_are_runtime_values_and_sizes_never_regenerate_source():
    from evtorch.codegen import program
    fn = lambda acc, C, alpha: torch.relu(alpha * acc + C)  # noqa: E731
    before = set(program._programs)
    for alpha, (M, N, K) in [(0.5, (17, 19, 8)), (1.75, (17, 19, 8)), (-2.0, (33, 9, 20))]:
        A, B, C = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
        out = evt.gemm(A, B, fn, backend="triton", C=C, alpha=alpha)
        torch.testing.assert_close(out, fn(A @ B, C, alpha), rtol=1e-5, atol=1e-5)
    assert len(set(program._programs) - before) == 1


@pytest.mark.interpreter
def test_source_and_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    ep = evt.trace(lambda acc, bias: torch.tanh(acc + bias), acc=evt.spec((8, 8)), bias=evt.spec((8,)))
    src = ep.source()
    assert "def epilogue(acc, offs_m, offs_n" in src and "tlmath.tanh" in src and "libdevice" not in src
    A, B, bias = torch.randn(8, 4), torch.randn(4, 8), torch.randn(8)
    evt.gemm(A, B, ep, backend="triton", bias=bias)
    files = list((tmp_path / "kernels").glob("*.py"))
    assert files and any((tmp_path / "kernels").glob("*.ir.txt"))


@pytest.mark.interpreter
def test_cache_dir_that_cannot_be_written_still_runs(tmp_path, monkeypatch):
    """EVTORCH_CACHE_DIR naming a file (or a read-only place) failed the first call with a raw NotADirectoryError
    from writing the kernel's source (2026-11-29); the kernel is written to a private directory instead, once with
    a warning naming the variable."""
    from evtorch.runtime import source_cache

    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path / "a_file"))
    monkeypatch.setattr(source_cache, "_private_dir", None)  # the warning comes once a process: a fresh one
    source_cache.clear_memory_cache()
    A, B, C = torch.randn(8, 4), torch.randn(4, 8), torch.randn(8, 8)
    fn = lambda acc, C: torch.sigmoid(acc * 0.25 - C)  # noqa: E731  (a kernel no other test loads)
    with pytest.warns(UserWarning, match="EVTORCH_CACHE_DIR=.*a_file: cannot write generated kernels there"):
        got = evt.gemm(A, B, fn, C=C, backend="triton")
    torch.testing.assert_close(got, fn(A @ B, C))


@triton.jit
def _cube_plus_one(x):
    return x * x * x + 1.0


def test_user_defined_op_through_interpreter():
    name = "cube_plus_one_" + str(os.getpid())
    cube = evt.register_op(name, lambda x: x ** 3 + 1.0, _cube_plus_one,
                           derivative=lambda g, x, out: (g * 3 * x * x,))
    fn = lambda acc, C: cube(acc) * C  # noqa: E731
    A, B, C = torch.randn(20, 12), torch.randn(12, 18), torch.randn(20, 18)
    for backend in ("reference", "triton"):
        out = evt.gemm(A, B, fn, backend=backend, C=C)
        torch.testing.assert_close(out, fn(A @ B, C), rtol=1e-5, atol=1e-5)
    assert cube(torch.tensor(2.0)).item() == 9.0
    with pytest.raises(evt.EpilogueError, match="already exists"):
        evt.register_op(name, lambda x: x, _cube_plus_one)


# ------------------------------------------------------------------------------------------ random DAGs
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_random_dags import dag_cases  # noqa: E402  (tests/ is on sys.path under pytest's rootdir)


def _check_generated(case, **options):
    """The generated epilogue against eager on the *same* accumulator: the identity epilogue through the same
    template and config gives the kernel's own A @ B (its summation order differs from torch.matmul's, which
    a random DAG like ``1 / acc`` can amplify without bound); GEMM accuracy itself is tested elsewhere."""
    from helpers import compare_outputs, eager_hi, eager_with_precision

    acc_dtype = torch.float64 if case.A.dtype == torch.float64 else torch.float32
    acc = evt.gemm(case.A, case.B, backend="triton", out_dtype=acc_dtype, **options)
    got = evt.gemm(case.A, case.B, case.fn, backend="triton", **options, **case.inputs)
    want, lowest = eager_with_precision(case.fn, acc, **case.inputs)
    hi = eager_hi(case.fn, acc, **case.inputs)
    ep = evt.api.get_epilogue(case.fn, tuple(acc.shape), acc_dtype, case.inputs)
    compare_outputs(ep, got, want, hi, out_dtype=case.A.dtype, lowest=lowest)


@pytest.mark.interpreter
@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float32, torch.float16, torch.float64), exclude_ops=frozenset({"cast"})))
def test_random_dags_through_generated_kernels(case):
    """The random epilogue DAGs of test_random_dags, run as generated Triton kernels (poisoned outputs).

    Casts are left out here only because the interpreter converts fp32 -> bf16 by truncation; the op cases
    cover casts (bf16 ones on the GPU). Derandomized, so CI sees the same examples every run: a random DAG can
    chain a discontinuous op (ceil, a comparison) after a transcendental one and turn a last-bit difference
    from eager into a different value; run with ``--hypothesis-seed=N`` and derandomize off to explore."""
    os.environ["EVTORCH_POISON"] = "1"
    note(repr(case))
    _check_generated(case)


@pytest.mark.interpreter
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float32,), exclude_ops=frozenset({"cast"})))
def test_random_dags_deterministic_reductions(case):
    os.environ["EVTORCH_POISON"] = "1"
    note(repr(case))
    _check_generated(case, deterministic=True)


PREFETCH_GRID = [(s, p) for s in (1, 2, 4) for p in range(s + 1)]


@pytest.mark.interpreter
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float32, torch.float16), exclude_ops=frozenset({"cast"}), n_range=(17, 70)),
       schedule=st.sampled_from(PREFETCH_GRID))
def test_random_dags_through_the_persistent_template(case, schedule):
    """Random DAGs through persistent_tma with every epilogue split and prefetch schedule (M x N inputs taken
    by ``epilogue_pf`` from loads issued before the K loop or slices ahead), poisoned outputs. The random
    cases' odd sizes would send the operands to the portable template (TMA needs 16-byte row strides), so A
    and B are redrawn with K = 16 and B column-major, which TMA takes whatever M and N are; N spans 17..70, so
    the 64-wide tile's halves and quarters hold real columns."""
    import types
    os.environ["EVTORCH_POISON"] = "1"
    subtile, prefetch = schedule
    note(f"{case!r} EPILOGUE_SUBTILE={subtile} PREFETCH={prefetch}")
    A = torch.randn(*case.A.shape[:-1], 16, dtype=case.A.dtype) / 4
    N = case.B.shape[-1]
    B = torch.randn(*case.B.shape[:-2], N, 16, dtype=case.B.dtype).transpose(-1, -2) / 4
    cfg = GemmConfig("persistent_tma", 16, 64, 16, 2, 1, 4, 1, (("EPILOGUE_SUBTILE", subtile), ("PREFETCH", prefetch)))
    assert resolve_config(A, B, cfg).template == "persistent_tma"
    _check_generated(types.SimpleNamespace(A=A, B=B, fn=case.fn, inputs=case.inputs), config=cfg)


@pytest.mark.interpreter
@settings(max_examples=24, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float32, torch.float16), exclude_ops=frozenset({"cast"})),
       split=st.sampled_from([2, 3, 5]), tma_loads=st.booleans(), tile=st.sampled_from([(16, 16), (64, 64)]))
def test_random_dags_through_split_k(case, split, tma_loads, tile):
    """Random DAGs through split-K: the partial kernel over 2, 3 or 5 runs of K blocks (uneven, some empty), on
    pointer loads or TMA loads, then the reduce kernel's one epilogue call on the summed tile, reductions and the
    vector stage included; poisoned outputs. On 64 x 64 GEMM tiles the reduce kernel runs on smaller tiles of its
    own (``GemmConfig.reduce_tile``: fewer GEMM tiles than the interpreter's two programs per "SM"), so the
    epilogue's tile grid differs from the partial kernel's. With TMA loads A and B are redrawn with K = 48
    (three 16-deep K blocks) and B column-major, which TMA takes whatever M and N are."""
    import types
    os.environ["EVTORCH_POISON"] = "1"
    note(f"{case!r} SPLIT_K={split} TMA_LOADS={tma_loads} tile={tile}")
    A, B = case.A, case.B
    extra = ()
    if tma_loads:
        A = torch.randn(*case.A.shape[:-1], 48, dtype=case.A.dtype) / 4
        N = case.B.shape[-1]
        B = torch.randn(*case.B.shape[:-2], N, 48, dtype=case.B.dtype).transpose(-1, -2) / 4
        extra = (("TMA_LOADS", True),)
    cfg = GemmConfig("splitk", *tile, 16, 2, split, 4, 1, extra)
    assert resolve_config(A, B, cfg) == cfg  # the TMA kernel where asked for, not the pointer fallback
    # the split product itself (``_check_generated`` compares the epilogue against the kernel's own product)
    acc = evt.gemm(A, B, backend="triton", out_dtype=torch.float32, config=cfg)
    torch.testing.assert_close(acc.double(), A.double() @ B.double(), rtol=1e-3, atol=1e-3)
    _check_generated(types.SimpleNamespace(A=A, B=B, fn=case.fn, inputs=case.inputs), config=cfg)


@pytest.mark.interpreter
@pytest.mark.parametrize("subtile,prefetch", PREFETCH_GRID, ids=[f"S{s}-P{p}" for s, p in PREFETCH_GRID])
def test_persistent_prefetch_schedules(subtile, prefetch, monkeypatch):
    """Every PREFETCH schedule (slices loaded before the K loop, the rest P slices ahead) gives the same
    results: two M x N inputs (one batched), a row and a column reduction, ragged tiles, several tiles per
    persistent program, outputs poisoned."""
    monkeypatch.setenv("EVTORCH_POISON", "1")
    extra = (("EPILOGUE_SUBTILE", subtile), ("PREFETCH", prefetch))
    cfg = GemmConfig("persistent_tma", 16, 64, 16, 2, 1, 4, 1, extra)
    L, M, N, K = 2, 37, 152, 24  # B rows 16-byte aligned: the TMA template runs (no portable fallback)
    A, B = torch.randn(L, M, K), torch.randn(K, N)
    C, D = torch.randn(L, M, N), torch.randn(M, N)

    def fn(acc, C, D):
        z = torch.tanh(acc + C) * D
        return z, z.sum(dim=-1), (acc - D).amax(dim=-2)
    out = evt.gemm(A, B, fn, backend="triton", config=cfg, C=C, D=D)
    ref = fn((A.double() @ B.double()), C=C.double(), D=D.double())
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
def test_prefetch_source_and_rule():
    """The generated module carries the prefetch pair only for M x N inputs; the rule fills PREFETCH_BUDGET."""
    both = evt.trace(lambda acc, C, b: acc + C + b, acc=evt.spec((8, 16)), C=evt.spec((8, 16)), b=evt.spec((16,)))
    src = both.source()
    assert "def epilogue_prefetch(" in src and "def epilogue_pf(" in src and "EPILOGUE_PREFETCH = 1" in src
    assert src.count("epilogue_prefetch(") > 4  # defined, and called by the persistent template
    vec_only = evt.trace(lambda acc, b: acc + b, acc=evt.spec((8, 16)), b=evt.spec((16,))).source()
    assert "epilogue_prefetch" not in vec_only and "EPILOGUE_PREFETCH = 0" in vec_only
    cfg = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 4),))
    assert cfg.prefetch_slices(0, 2) == 0
    assert cfg.prefetch_slices(1, 2) == 4      # 64 B a slice and input: all four quarters in 256 B
    assert cfg.prefetch_slices(1, 8) == 1      # 256 B a slice: one fills the budget
    assert cfg.prefetch_slices(2, 2) == 0      # several inputs: none (they spilled on the H200)
    whole = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 1),))
    assert whole.prefetch_slices(1, 4) == 1    # 512 B, over budget: still the (only) slice
    flat = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 4), ("FLATTEN", True)))
    assert flat.prefetch_slices(1, 2) == 1      # flattened loops: the first slice only
    assert flat.prefetch_slices(2, 2) == 0
    ws = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 4), ("WARP_SPECIALIZE", True)))
    assert ws.prefetch_slices(1, 2) == 0
    fixed = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 2), ("PREFETCH", 0)))
    assert fixed.prefetch_slices(3, 2) == 0
    with pytest.raises(ValueError, match="PREFETCH=4 exceeds"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 2), ("PREFETCH", 4)))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=dag_cases(dtypes=(torch.float16, torch.bfloat16), batched=False,
                      input_dtypes=(torch.float16, torch.bfloat16)),
       shape=st.sampled_from([(8192, 8192, 4096), (8192, 4096, 1024), (4096, 4096, 2048)]))
def test_random_dags_untuned_config_is_a_tuner_candidate(case, shape):
    """For any epilogue (random DAGs) on a Hopper GPU with a wave of 128x128 tiles, the untuned config
    (``runtime.gemm.heuristic_for_program``) is one the tuner would time for that epilogue, fits shared memory, takes
    the loader's M x N input exactly where the epilogue has one the loader can bring, and is the 128x256 persistent
    kernel only for a store-only epilogue at K >= 2048. The epilogue is traced at a small size: the program does not
    depend on sizes. (Random DAGs seldom keep exactly one 16-bit M x N input: the loader's case is the bench
    workloads', ``test_gemm_template.test_full_wave_heuristic_is_among_the_tuners_candidates``.)"""
    from evtorch.codegen import policy
    from evtorch.codegen.configs import DeviceInfo, fits_smem
    from evtorch.codegen.program import build_program
    from evtorch.runtime.gemm import candidates_for_program, heuristic_for_program

    note(repr(case))
    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448)
    dtype = case.A.dtype
    ep = evt.api.get_epilogue(case.fn, (case.A.shape[-2], case.B.shape[-1]), torch.float32, case.inputs)
    prog = build_program(ep, out_dtype=dtype, fast_math="auto")
    M, N, K = shape
    heur = policy.heuristic_config(M, N, K, dtype, h200, tma_ok=True)
    pick = heuristic_for_program(prog, heur, N, K, dtype, h200)
    listed = candidates_for_program(prog, policy.candidate_configs(M, N, K, dtype, h200, tma_ok=True), dtype, h200)
    assert pick in listed and fits_smem(pick, dtype, h200)
    code = prog.epilogue
    assert pick.flag("EPI_TMA") == (code.tma_input() is not None)
    store_only = code.tile_ops == 0 and code.prefetch == 0 and not code.reductions
    assert (pick.template == "persistent_tma") == (store_only and K >= policy._SHORT_K)


# ------------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_probe_fixes_float64_scalars_bool_add_constant_outputs():
    """The generated-kernel fixes of 2026-11-29 on the device's Triton (float64 tanh too): a float64 epilogue's
    Python-float scalar arrives as a double (the tl.float64 annotation: within 1e-14 of eager, where an fp32 0.1
    is 1.5e-9 off), bool + bool is a logical or, constant outputs and sums of constants store."""
    torch.manual_seed(0)
    A, B = torch.randn(64, 48, device="cuda", dtype=torch.float64), torch.randn(48, 40, device="cuda",
                                                                                  dtype=torch.float64)
    got = evt.gemm(A, B, lambda acc, s: acc * s, s=0.1)
    torch.testing.assert_close(got, (A @ B) * 0.1, rtol=1e-14, atol=1e-14)
    x = torch.cat([torch.linspace(-20, 20, 801, device="cuda", dtype=torch.float64),
                   torch.logspace(-12, 1, 200, device="cuda", dtype=torch.float64)])
    t = evt.gemm(x[:, None], torch.ones(1, 1, device="cuda", dtype=torch.float64), torch.tanh)[:, 0]
    assert ((t - torch.tanh(x)).abs() / torch.tanh(x).abs()).max() < 1e-14  # the device's float64 exp included
    Af, Bf = A.float(), B.float()
    m = torch.rand(64, 40, device="cuda") > 0.5
    out = evt.gemm(Af, Bf, lambda acc, m: (m + m, (acc > 0) + m, torch.zeros_like(acc).sum(0), acc * 0 + 1), m=m)
    assert torch.equal(out[0], m) and torch.equal(out[1], (Af @ Bf > 0) | m)
    assert not out[2].any() and torch.equal(out[3], torch.ones_like(out[3]))
    # a float scalar meets float64 ops unrounded in a float32 GEMM (a float64 argument there): exact at K = 1
    X, ones = torch.randn(64, 1, device="cuda"), torch.ones(1, 40, device="cuda")
    got = evt.gemm(X, ones, lambda acc, s: (acc.double() * s, acc * s), s=0.1, out_dtype=torch.float64)
    assert torch.equal(got[0], X.double().expand(64, 40) * 0.1)
    assert torch.equal(got[1], (X.expand(64, 40) * 0.1).double())


@pytest.mark.interpreter
def test_float64_tanh_is_float64_accurate():
    """tlmath.tanh's Taylor branch (|x| < 0.1) stopped at x^7: 2e-10 relative in float64 (found 2026-11-29); float64
    takes the series to x^15. Over [-20, 20] and 1e-12..10 the triton backend is within 1e-15 of torch.tanh."""
    x = torch.cat([torch.linspace(-20, 20, 801, dtype=torch.float64), torch.logspace(-12, 1, 200, dtype=torch.float64)])
    got = evt.gemm(x[:, None], torch.ones(1, 1, dtype=torch.float64), lambda acc: torch.tanh(acc),
                   backend="triton")[:, 0]
    want = torch.tanh(x)
    assert ((got - want).abs() / want.abs()).max() < 1e-15



_EDGES = [-3.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 2.0, math.inf, -math.inf, math.nan]


def _edge_gemm(fn, dtype, **inputs):
    """fn's outputs through the generated kernel and eagerly, on x = _EDGES broadcast along the rows."""
    x = torch.tensor(_EDGES, dtype=dtype)
    ones = torch.ones(len(x), 1, dtype=dtype)
    got = evt.gemm(ones, ones.T, fn, x=x, backend="triton", **inputs)
    return got, fn(ones @ ones.T, x, **inputs)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_integer_exponents_keep_negative_bases(dtype):
    """Found 2026-11-29 on the triton backend: x ** 5 (every integer exponent outside -4..4) was NaN for every
    negative x, and so the gradient of x ** 6, which computes x ** 5 (tlmath.powf took every such exponent for a
    non-integer), and (-inf) ** 2.5 NaN instead of inf. torch.pow's values, the sign of zero included."""
    def fn(acc, x):
        return x ** 5, x ** 6, x ** -5, x ** -6, x ** 2.5, x ** -1.5, x ** 7.0, torch.pow(x, 12), acc, -x, -(x * 0.0)

    for i, (g, w) in enumerate(zip(*_edge_gemm(fn, dtype))):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-6, atol=0, msg=lambda m, i=i: f"output {i}: {m}")
        assert torch.equal(torch.signbit(g[g == 0]), torch.signbit(w[g == 0])), f"output {i}: sign of zero"


@pytest.mark.interpreter
def test_boolean_ops_with_a_compared_0d_input():
    """(acc > 0) | (s > 0) with a 0-d tensor s failed in Triton's interpreter ("ufunc 'bitwise_or' not supported",
    found 2026-11-29): a 0-d boolean operand of | & ~ is emitted as (b != 0)."""
    torch.manual_seed(0)
    A, B = torch.randn(8, 4), torch.randn(4, 8)
    fns = (lambda acc, s: (acc > 0) | (s > 0), lambda acc, s: (s > 0) & (acc > 0),
           lambda acc, s: ~((s > 0) | (acc > 1)), lambda acc, s: torch.where((s > 0) | (acc > 0.5), acc, 0.0))
    for fn in fns:
        for sv in (1.0, -1.0):
            s = torch.tensor(sv)
            assert torch.equal(evt.gemm(A, B, fn, s=s, backend="triton"), fn(A @ B, s))


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_signs_of_zero_follow_eager(dtype):
    """Found 2026-11-29 (a probe of every unary op at edge values): tanh(-0.0) and round(-0.5) gave +0.0; eager
    gives -0.0 (tanh is odd, round keeps the sign). relu / maximum / minimum at -0.0 are left as they are: which
    zero they return differs between torch's own CPU and CUDA kernels."""
    def fn(acc, x):
        return torch.tanh(x), torch.round(x), torch.round(x * 0.25), -x, x ** 3, torch.sigmoid(x) * x, acc

    for i, (g, w) in enumerate(zip(*_edge_gemm(fn, dtype))):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=2e-6, atol=0, msg=lambda m, i=i: f"output {i}: {m}")
        assert torch.equal(torch.signbit(g[g == 0]), torch.signbit(w[g == 0])), f"output {i}: sign of zero"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_gpu_integer_exponents_and_nan_bounds(dtype):
    """The two tests around this one on CUDA, against CPU eager (the semantics the interpreter is held to), every
    difference collected so that one run reports them all; zeros' signs are compared for the powers, and
    ``torch.clamp(x, nan)`` must be NaN everywhere, as torch 2.13 returns it (torch 2.11's CPU and CUDA kernels
    return x unclamped, so that value is written out instead of taken from eager).

    Its first GPU runs (H200, Triton 3.6, 2026-11-29) found (-0.0) ** 5, (-inf) ** -5 and (-0.0) ** 7.0 = +0.0:
    Triton 3.6 lowers a float's unary minus to ``0 - x``, which turns +0.0 into +0.0, so powf's sign select and the
    ``neg`` op lost -0.0 there; both now negate through ``tlmath.neg`` (``x * -1.0``)."""
    lo = torch.tensor([math.nan, -1.0, 0.0, math.nan, -2.0, 1.0, 0.0, math.nan, 0.0, 0.0, 0.0], dtype=dtype)[:, None]

    def powers(acc, x):
        return x ** 5, x ** 6, x ** -5, x ** -6, x ** 2.5, x ** -1.5, x ** 7.0, torch.pow(x, 12), -x, -(x * 0.0)

    def bounds(acc, x, lo, s):
        return (torch.clamp(x, lo), torch.clamp(x, max=lo), torch.clamp(x, s), torch.clamp(x, -1.0, s),
                torch.log1p(x))

    x = torch.tensor(_EDGES, dtype=dtype)
    ones = torch.ones(len(x), 1, dtype=dtype)
    failures = []
    for fn, inputs in ((powers, {}), (bounds, dict(lo=lo, s=math.nan))):
        on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        got = evt.gemm(ones.cuda(), ones.T.cuda(), fn, x=x.cuda(), **on_gpu)
        want = list(fn(ones @ ones.T, x, **inputs))
        if fn is bounds:
            want[2] = torch.full_like(want[2], math.nan)
        for i, (g, w) in enumerate(zip(got, want)):
            g = g.cpu()
            same = torch.isclose(g, w, rtol=1e-6, atol=0, equal_nan=True)
            if fn is powers:
                same &= (torch.signbit(g) == torch.signbit(w)) | g.isnan()
            if not bool(same.all()):
                bad = (~same).flatten().nonzero().flatten().tolist()
                failures.append(f"{fn.__name__} output {i} at x = {[x[j % len(x)].item() for j in bad]}: "
                                f"got {g.flatten()[bad].tolist()}, CPU eager {w.flatten()[bad].tolist()}")
    assert not failures, "\n".join(failures)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_clamp_nan_bounds_and_log1p_of_inf(dtype):
    """Found 2026-11-29 on the triton backend: clamp ignored a NaN bound (torch.clamp(x, nan) is NaN, a tensor
    bound's NaN elements too) and log1p(inf) was NaN (Goldberg's correction inf / inf)."""
    lo = torch.tensor([math.nan, -1.0, 0.0, math.nan, -2.0, 1.0, 0.0, math.nan, 0.0, 0.0, 0.0], dtype=dtype)[:, None]

    def fn(acc, x, lo, s):
        return (torch.clamp(x, lo), torch.clamp(x, max=lo), torch.clamp(x, s), torch.clamp(x, -1.0, s),
                torch.log1p(x))

    for i, (g, w) in enumerate(zip(*_edge_gemm(fn, dtype, lo=lo, s=math.nan))):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-6, atol=0, msg=lambda m, i=i: f"output {i}: {m}")


@pytest.mark.interpreter
def test_float64_and_bfloat16_convert_exactly_in_the_interpreter():
    """Triton 3.9's interpreter converted float64 <-> bfloat16 between float values and bfloat16's uint16 bit
    patterns (NaN out of a float64 GEMM stored as bfloat16, found 2026-11-29); ``runtime.interpreter_fixes``
    converts them as torch does, bit for bit against eager."""
    torch.manual_seed(0)
    A, B = torch.randn(9, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    assert torch.equal(evt.gemm(A, B, lambda acc: acc, out_dtype=torch.bfloat16, backend="triton"),
                       (A @ B).bfloat16())
    A32, B32, C = A.float(), B.float(), torch.randn(9, 7).bfloat16()
    got = evt.gemm(A32, B32, lambda acc, C: (acc.double().bfloat16(), C.double() + 1e-3), C=C, backend="triton")
    want = ((A32 @ B32).double().bfloat16(), C.double() + 1e-3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1].float())


@pytest.mark.interpreter
def test_integers_and_bools_convert_to_bfloat16_in_the_interpreter():
    """The interpreter also cast integers and bools to bfloat16 as bit patterns (1 became 9.2e-41, found by a
    probe 2026-11-29); through ``runtime.interpreter_fixes`` they convert as eager's ``.to(torch.bfloat16)``,
    rounded to nearest even (257 -> 256, 259 -> 260)."""
    A, B = torch.eye(2, 4), torch.zeros(4, 3)
    I = torch.tensor([[1, -2, 259], [257, 7, -9]], dtype=torch.int32)  # noqa: E741
    fn = lambda acc, I: (I.to(torch.bfloat16) + acc, (I > 2).to(torch.bfloat16), I.to(torch.int8).bfloat16())  # noqa
    for got, want in zip(evt.gemm(A, B, fn, I=I, backend="triton"), fn(A @ B, I)):
        assert torch.equal(got, want.to(got.dtype)), (got, want)


@pytest.mark.interpreter
def test_zero_d_inputs_in_nan_tests_in_the_interpreter():
    """``tlmath.maximum``'s NaN test of a loaded 0-d value (``b != b``) came out of the interpreter as float data
    and its ``|`` with a boolean tile failed in numpy (found by the random-DAG gradient test, 2026-11-29, on
    ``logaddexp(acc, s)`` with a 0-d float64 s); ``runtime.interpreter_fixes`` reads it as the boolean. Values and
    the 0-d input's gradient against eager, NaN included."""
    for dtype in (torch.float32, torch.float64):
        A, B = torch.randn(2, 3, dtype=dtype), torch.randn(3, 4, dtype=dtype)
        for value in (0.3923, float("nan")):
            s = torch.tensor(value, dtype=dtype, requires_grad=True)
            fn = lambda acc, s: (torch.logaddexp(acc, s).mT, torch.maximum(acc, s), torch.minimum(s, acc))  # noqa
            got = evt.gemm(A, B, fn, s=s, backend="triton")
            want = fn(A @ B, s)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, equal_nan=True)
            gs, = torch.autograd.grad(sum(o.sum() for o in got), s)
            ws, = torch.autograd.grad(sum(o.sum() for o in want), s)
            torch.testing.assert_close(gs, ws, equal_nan=True)
