"""The issue's "Bad input" list: every error is an ``EpilogueError`` (a ``ValueError``; type errors also a
``TypeError``), raised early, never a crash or a wrong answer, and its message names the offending thing."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.errors import (EpilogueError, EpilogueTypeError, ShapeError, TraceControlFlowError,
                            UnsupportedOpError)

from helpers import operands, rand, rand_int

M, N, K, L = 6, 5, 4, 3
A, B = operands(M, N, K, seed=1)
AL, BL = operands(M, N, K, L=L, seed=2)


def raises(cls, fn, *names, A=A, B=B, **inputs):
    """``evt.gemm(A, B, fn, **inputs)`` raises ``cls`` (an evtorch error, never a raw torch one) and the message
    contains every string in ``names``."""
    with pytest.raises(cls) as ei:
        evt.gemm(A, B, fn, **inputs)
    err = ei.value
    assert type(err).__module__ == "evtorch.errors", f"a raw {type(err).__name__} escaped: {err}"
    msg = str(err)
    for name in names:
        assert name in msg, f"message does not name {name!r}: {msg}"
    return err


def test_error_hierarchy():
    assert issubclass(EpilogueError, ValueError)
    for cls in (EpilogueTypeError, UnsupportedOpError, TraceControlFlowError):
        assert issubclass(cls, EpilogueError) and issubclass(cls, TypeError)
    assert issubclass(ShapeError, EpilogueError) and issubclass(ShapeError, ValueError)
    assert evt.EpilogueError is EpilogueError and evt.ShapeError is ShapeError


# ------------------------------------------------------------------------------------------------ broadcasting
@pytest.mark.parametrize("shape", [(N, M), (M + 1, N), (M,), (N + 2,), (2, M, N), (M, N, 1), (1, N + 1)],
                         ids=str)
def test_input_not_broadcastable(shape):
    err = raises(ShapeError, lambda acc, C: acc + C, "C", str(shape), str((M, N)), C=rand(shape))
    assert "test_errors.py" in (err.where or ""), "the error points at the user's line"


def test_input_not_broadcastable_batched():
    raises(ShapeError, lambda acc, C: acc * C, "C", str((L + 1, M, N)), str((L, M, N)), A=AL, B=BL,
           C=rand((L + 1, M, N)))
    raises(ShapeError, lambda acc, C: acc * C, "C", str((2, L, M, N)), A=AL, B=BL, C=rand((2, L, M, N)))
    raises(ShapeError, lambda acc, v: acc + v[:, None], "v", A=AL, B=BL, v=rand((N,)))


def test_input_bound_to_two_axes_at_once():
    """One input dim cannot walk both M and N in one expression (e.g. ``v + v[:, None]``): refused, naming it."""
    A5, B5 = operands(N, N, K, seed=3)
    raises(ShapeError, lambda acc, v: acc + (v + v[:, None]), "'v'", A=A5, B=B5, v=rand((N,)))


# ------------------------------------------------------------------------------------------------ unsupported ops
@pytest.mark.parametrize("fn, name", [
    (lambda acc: torch.cosh(acc), "torch.cosh"),
    (lambda acc: acc.cosh(), ".cosh()"),
    (lambda acc: F.mish(acc), "mish"),
    (lambda acc: torch.special.expit(acc), "torch.special.expit"),
    (lambda acc: acc.cumsum(1), "cumsum"),
    (lambda acc: torch.softmax(acc, 1), "softmax"),
    (lambda acc: acc @ acc, "matmul"),
    (lambda acc: acc // 2, "floordiv"),
    (lambda acc: acc % 2, "mod"),
    (lambda acc: torch.max(acc, 1), "torch.max"),
    (lambda acc: torch.min(acc), "torch.min"),
    (lambda acc: acc[0], "indexing with 0"),
    (lambda acc: acc[:, 1:3], "slice(1, 3"),
    (lambda acc: acc[acc > 0], "indexing with"),
    (lambda acc: 2 ** acc, "c ** x"),
    (lambda acc, C: acc ** C, "exponent must be a constant"),
    (lambda acc: acc.view(torch.int32), ".view(dtype)"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_op_is_named(fn, name):
    raises(UnsupportedOpError, fn, name, **({"C": rand((M, N))} if "C" in fn.__code__.co_varnames else {}))


def test_unsupported_op_suggests_close_names():
    raises(UnsupportedOpError, lambda acc: acc.sigmod(), ".sigmod()", "did you mean", "sigmoid")
    raises(UnsupportedOpError, lambda acc: torch.expm1(acc), "torch.expm1", "did you mean", "exp")
    raises(UnsupportedOpError, lambda acc: acc.max(), ".max()", "amax")


# ------------------------------------------------------------------------------------------------ control flow
@pytest.mark.parametrize("fn, what", [
    (lambda acc: acc if acc.sum() > 0 else -acc, "bool()"),
    (lambda acc: acc if acc else -acc, "bool()"),
    (lambda acc: acc * (acc > 0 and acc < 1), "bool()"),
    (lambda acc: acc * int(acc.sum()), "int()"),
    (lambda acc: acc * float(acc.amax()), "float()"),
    (lambda acc: acc * acc.sum().item(), ".item()"),
    (lambda acc: acc * acc.tolist()[0], ".tolist()"),
    (lambda acc: acc.reshape(acc.sum(), -1), "on a traced tensor"),
    (lambda acc: [x for x in acc][0], "iterating"),
    (lambda acc: acc.numpy(), ".numpy()"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_python_control_flow_on_traced_values(fn, what):
    raises(TraceControlFlowError, fn, what, "traced")


def test_static_metadata_is_allowed():
    """Shapes, dims and dtypes are known while tracing: branching on them is fine."""
    def fn(acc, C):
        if C.shape[-1] == acc.size(1) and acc.dim() == 2 and len(acc) == M and C.dtype == torch.float32:
            return acc + C
        return acc

    assert torch.allclose(evt.gemm(A, B, fn, C=torch.ones(M, N)), A @ B + 1)


# ------------------------------------------------------------------------------------------------ in-place
@pytest.mark.parametrize("fn, name", [
    (lambda acc: acc.add_(1), ".add_()"),
    (lambda acc: acc.clamp_(0), ".clamp_()"),
    (lambda acc, C: acc + C.mul_(2), ".mul_()"),
    (lambda acc: torch.relu_(acc), "relu_"),
    (lambda acc: F.relu(acc, inplace=True), "inplace=True"),
    (lambda acc: F.leaky_relu(acc, 0.1, True), "inplace=True"),
    (lambda acc, C: torch.add(acc, C, out=C), "out="),
    (lambda acc: torch.exp(acc, out=acc), "out="),
    (lambda acc: acc.__setitem__((0, 0), 1.0), "item assignment"),
    (lambda acc: acc.__iadd__(1), "+="),
    (lambda acc: acc.__imul__(2), "*="),
], ids=lambda x: x if isinstance(x, str) else "")
def test_in_place_ops_are_refused(fn, name):
    raises(EpilogueError, fn, name, "in", **({"C": rand((M, N))} if "C" in fn.__code__.co_varnames else {}))


def test_augmented_assignment_statement():
    def fn(acc):
        acc += 1
        return acc

    raises(EpilogueError, fn, "+=")


# ------------------------------------------------------------------------------------------------ operands A, B
def test_operand_errors():
    def gemm_raises(cls, a, b, *names, **kw):
        with pytest.raises(cls) as ei:
            evt.gemm(a, b, lambda acc: acc, **kw)
        for n in names:
            assert n in str(ei.value), str(ei.value)

    gemm_raises(ShapeError, rand((M, K)), rand((K + 1, N)), "inner dimensions", str((M, K)), str((K + 1, N)))
    gemm_raises(ShapeError, rand((L, M, K)), rand((L, K + 1, N)), "inner dimensions")
    gemm_raises(ShapeError, rand((L, M, K)), rand((L + 1, K, N)), "batch sizes", str((L + 1, K, N)))
    gemm_raises(ShapeError, rand((M, K)), rand((L, K, N)), "batched B")
    gemm_raises(ShapeError, rand((K,)), rand((K, N)), "A must have 2 or 3 dims", str((K,)))
    gemm_raises(ShapeError, rand((M, K)), rand((1, 1, K, N)), "B must have")
    gemm_raises(EpilogueTypeError, rand_int((M, K), 0, 3), rand_int((K, N), 0, 3), "A has dtype torch.int64")
    gemm_raises(EpilogueTypeError, rand((M, K)).to(torch.complex64), rand((K, N)).to(torch.complex64), "complex64")
    gemm_raises(EpilogueTypeError, rand((M, K)).half(), rand((K, N)), "same dtype", "float16", "float32")
    gemm_raises(EpilogueTypeError, [[1.0]], rand((K, N)), "A must be a torch.Tensor", "list")
    gemm_raises(EpilogueError, rand((M, K)), rand((K, N), ).to("meta"), "same device", "meta")
    gemm_raises(EpilogueTypeError, rand((M, K)), rand((K, N)), "out_dtype", "int32", out_dtype=torch.int32)
    gemm_raises(EpilogueError, rand((M, K)), rand((K, N)), "backend", "'cuda'", backend="cuda")


# ------------------------------------------------------------------------------------------------ dtypes, devices
def test_unsupported_dtypes():
    raises(EpilogueTypeError, lambda acc, C: acc + torch.exp(C), "torch.exp", "C", "torch.int64",
           C=rand_int((M, N), 0, 3))
    raises(EpilogueTypeError, lambda acc, C: acc * torch.sigmoid(C), "sigmoid", "C", "int32",
           C=rand_int((M, N), 0, 3, dtype=torch.int32))
    raises(EpilogueTypeError, lambda acc, C: acc * C ** 2, "**", "C", C=rand_int((M, N), 0, 3))
    raises(EpilogueTypeError, lambda acc, C: acc + C, "'C'", "complex64", C=rand((M, N)).to(torch.complex64))
    raises(EpilogueTypeError, lambda acc: acc.to(torch.complex64), "complex64")
    raises(EpilogueTypeError, lambda acc, C: acc * (C & 1), "logical_and", "booleans", C=rand_int((M, N), 0, 3))
    raises(EpilogueTypeError, lambda acc: acc | acc, "logical_or", "booleans")
    raises(EpilogueTypeError, lambda acc: torch.where(acc, acc, 0), "torch.where", "bool")
    raises(EpilogueTypeError, lambda acc: acc.sum(1, dtype=torch.int32), "dtype=torch.int32")


def test_device_mismatch():
    raises(EpilogueError, lambda acc, C: acc + C, "'C'", "meta", "cpu", C=torch.empty(M, N, device="meta"))
    raises(EpilogueError, lambda acc, v: acc + v, "'v'", "meta", v=torch.empty(N, device="meta"))


# ------------------------------------------------------------------------------------------------ reductions
@pytest.mark.parametrize("dim", [2, -3, (0, 2), 5])
def test_reduction_over_impossible_dims_2d(dim):
    raises(ShapeError, lambda acc: acc.sum(dim), f"dim {dim if isinstance(dim, int) else 2}", "out of range")


@pytest.mark.parametrize("dim", [3, -4])
def test_reduction_over_impossible_dims_batched(dim):
    raises(ShapeError, lambda acc: acc.amax(dim), f"dim {dim}", "out of range", A=AL, B=BL)


def test_reduction_over_expanded_dim():
    raises(ShapeError, lambda acc: acc.unsqueeze(0).expand(2, M, N).sum(0), "expanded")
    raises(ShapeError, lambda acc: acc[:, None].expand(M, 3, N).amax(1), "expanded")


def test_reduction_dim_must_be_static():
    raises(EpilogueTypeError, lambda acc, d: acc.sum(d), "dim must be an int", d=rand((1,)))


@pytest.mark.parametrize("fn", [
    lambda acc: acc - acc.amax(1, keepdim=True),
    lambda acc: acc / acc.sum(),
    lambda acc: torch.exp(acc - torch.logsumexp(acc, 1)[:, None]),
    lambda acc: torch.where(acc > acc.mean(0), acc, 0.0),
    lambda acc, C: C * acc.sum(1)[:, None],
    lambda acc: acc.sum(1)[:, None] + acc.sum(0),
], ids=["softmax-shift", "normalise", "log-softmax", "where-mean", "input-times-rowsum", "row-plus-col"])
def test_reduction_result_in_tile_computation(fn):
    kw = {"C": rand((M, N))} if "C" in fn.__code__.co_varnames else {}
    err = raises(EpilogueError, fn, "reduction result", **kw)
    assert "tile" in str(err)


# ------------------------------------------------------------------------------------------------ returns, keywords
@pytest.mark.parametrize("fn, what", [
    (lambda acc: 3, "int at position 0"),
    (lambda acc: None, "NoneType at position 0"),
    (lambda acc: (acc, None), "NoneType at position 1"),
    (lambda acc: [acc, 1.0], "float at position 1"),
    (lambda acc: {"D": acc}, "dict at position 0"),
    (lambda acc: (), "returned nothing"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_return_values_must_be_traced_tensors(fn, what):
    raises(EpilogueTypeError, fn, what)


def test_captured_real_tensor():
    outside = torch.ones(M, N)
    raises(EpilogueTypeError, lambda acc: acc + outside, "captured", str((M, N)), "keyword input")
    raises(EpilogueTypeError, lambda acc: torch.maximum(acc, outside), "captured")


def test_keyword_inputs():
    def epi(acc, C, bias):
        return acc + C + bias

    raises(EpilogueTypeError, epi, "missing", "'bias'", C=rand((M, N)))
    raises(EpilogueTypeError, epi, "unexpected", "'D'", C=rand((M, N)), bias=rand((N,)), D=rand((M, N)))
    raises(EpilogueTypeError, epi, "'bias'", "str", C=rand((M, N)), bias="zero")
    raises(EpilogueTypeError, epi, "'bias'", "list", C=rand((M, N)), bias=[1.0, 2.0])

    def with_default(acc, C, alpha=2.0):
        return alpha * acc + C

    assert torch.allclose(evt.gemm(A, B, with_default, C=torch.zeros(M, N)), 2 * (A @ B))


def test_epilogue_signature_errors():
    raises(EpilogueTypeError, lambda acc, *rest: acc, "*rest")
    raises(EpilogueTypeError, lambda acc, **kw: acc, "**kw", C=1.0)
    raises(EpilogueError, lambda acc, backend: acc, "'backend'", "clashes")
    raises(EpilogueTypeError, lambda: 1, "takes no parameters")
    with pytest.raises(EpilogueTypeError, match="must be a function"):
        evt.gemm(A, B, 42)


def test_trace_errors():
    fn = lambda acc, C: acc + C  # noqa: E731
    with pytest.raises(EpilogueTypeError, match="'acc'"):
        evt.trace(fn, C=rand((M, N)))
    with pytest.raises(EpilogueTypeError, match="missing.*'C'"):
        evt.trace(fn, acc=evt.spec((M, N)))
    with pytest.raises(EpilogueError, match=r"\(M, N\) or \(L, M, N\)"):
        evt.trace(lambda acc: acc, acc=evt.spec((M,)))
    with pytest.raises(EpilogueTypeError, match="'acc' must be a tensor"):
        evt.trace(lambda acc: acc, acc=3.0)
    ep = evt.trace(fn, acc=evt.spec((M, N)), C=evt.spec((M, N)))
    with pytest.raises(EpilogueError, match=r"acc has shape \(5, 5\).*\(6, 5\)"):
        ep.reference(torch.zeros(5, 5), C=torch.zeros(5, 5))
    with pytest.raises(EpilogueTypeError, match="missing"):
        ep.reference(torch.zeros(M, N))
    with pytest.raises(ShapeError, match="'C'"):
        ep.reference(torch.zeros(M, N), C=torch.zeros(M, N + 1))


def test_errors_carry_the_users_line():
    def epi(acc, C):
        z = acc * 2
        return torch.cosh(z) + C  # the offending line

    with pytest.raises(UnsupportedOpError) as ei:
        evt.gemm(A, B, epi, C=rand((M, N)))
    assert re.search(r"test_errors\.py:\d+ in epi: return torch\.cosh\(z\) \+ C", str(ei.value)), str(ei.value)


def test_bad_views():
    raises(ShapeError, lambda acc: acc.permute(0, 0), "permute")
    raises(ShapeError, lambda acc: acc.transpose(0, 2), "dim 2")
    raises(ShapeError, lambda acc: acc.unsqueeze(0).expand(2, M + 1, N), "cannot expand")
    raises(ShapeError, lambda acc: acc.reshape(-1, -1), "only one dim can be -1")
    raises(ShapeError, lambda acc: acc.expand(N), "fewer dims")


def test_outputs_selection_errors():
    fn = lambda acc: (acc, acc.sum(1))  # noqa: E731
    raises(EpilogueError, fn, "outputs=(5,)", "returns 2 output(s)", "no output 5", outputs=(5,))
    raises(EpilogueError, fn, "no output -3", outputs=(0, -3))
    raises(EpilogueTypeError, fn, "outputs=", "float", outputs=1.0)
    raises(EpilogueTypeError, fn, "outputs=", "'a'", outputs=("a",))


def test_forced_config_out_of_resources_names_the_config(monkeypatch):
    """A forced config whose kernels need more shared memory than the GPU has (Triton raises OutOfResources
    when it compiles them, on the first run) is reported as a ValueError naming the config and the dtype, with
    Triton's numbers; the broken launch is not cached, so the next call compiles again rather than reusing it."""
    from triton.runtime.errors import OutOfResources

    from evtorch.codegen.configs import GemmConfig
    from evtorch.runtime import gemm as rgemm

    cfg = GemmConfig("splitk", 16, 16, 16, SPLIT_K=2, num_stages=6)
    runs = []

    def out_of_smem(self, *args, **kw):
        runs.append(1)
        raise OutOfResources(294936, 232448, "shared memory")
    monkeypatch.setattr(rgemm._Launch, "run", out_of_smem)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"config=GemmConfig\(template='splitk'.*torch.float32.*"
                                             r"Required: 294936, Hardware limit: 232448.*fewer num_stages"):
            evt.gemm(A, B, lambda acc: acc * 2, config=cfg, backend="triton")
    assert len(runs) == 2 and not any(launch.config == cfg for launch in rgemm._launches.values())
    monkeypatch.undo()  # other failures pass through unchanged
    monkeypatch.setattr(rgemm._Launch, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        evt.gemm(A, B, lambda acc: acc * 3, config=cfg, backend="triton")


def test_an_int_input_outside_int64_names_the_input():
    with pytest.raises(evt.EpilogueTypeError, match=r"input 's' is the int 1180591620717411303424, outside int64"):
        evt.gemm(A, B, lambda acc, s: acc * s, s=2 ** 70)


def test_max_method_points_to_amax_not_to_itself():
    """x.max(dim) returns (values, indices) and is refused; the hint names amax, not the refused max."""
    with pytest.raises(UnsupportedOpError, match=r"use torch\.amax\(x, dim\) for the values") as e:
        evt.gemm(A, B, lambda acc: acc.max(dim=1).values)
    assert "did you mean" not in str(e.value)


def test_inputs_may_be_named_like_gemms_own_arguments():
    """evt.gemm's A, B and epilogue are positional-only, so keyword inputs of those names reach the epilogue (a
    TypeError from Python's argument binding before, found 2026-11-29)."""
    C = torch.randn(A.shape[0], B.shape[1])
    got = evt.gemm(A, B, lambda acc, A, B, epilogue: acc + A * B + epilogue, A=C, B=C, epilogue=1.0)
    torch.testing.assert_close(got, A @ B + C * C + 1.0)


def test_an_epilogue_traced_with_keep_keeps_its_pruning_in_gemm():
    """evt.trace(fn, keep=[1]) handed to evt.gemm returns None for the pruned output, at its own shape and at
    another (traced again); outputs= overrides it (before, gemm traced it again with every output, found
    2026-11-29)."""
    def two(acc, C):
        return torch.relu(acc + C), (acc * C).sum(dim=1)
    ep = evt.trace(two, keep=[1], acc=evt.spec((M, N)), C=evt.spec((M, N)))
    C = torch.randn(M, N)
    got = evt.gemm(A, B, ep, C=C)
    assert got[0] is None and torch.allclose(got[1], ((A @ B) * C).sum(1), atol=1e-5)
    A2, C2 = torch.randn(2 * M, A.shape[1]), torch.randn(2 * M, N)
    assert evt.gemm(A2, B, ep, C=C2)[0] is None
    assert evt.gemm(A, B, ep, C=C, outputs=[0])[1] is None


def test_linear_fn_not_callable():
    """evt.linear(x, w, "gelu") said "'str' object is not callable" from inside linear_epilogue."""
    with pytest.raises(EpilogueTypeError, match="fn"):
        evt.linear(torch.randn(3, 4), torch.randn(5, 4), "gelu")


def test_linear_bias_shape_and_dtypes_are_named_in_linear_terms():
    """A bias of the wrong length said "add on acc(3, 6), linear_bias(5,): Attempting to broadcast..." and mixed x /
    weight dtypes "A and B must have the same dtype"; F.linear's terms now (bias, out_features, x, weight). Shapes
    that broadcast to (out_features,), as F.linear takes, still run; autocast still takes mixed dtypes."""
    x, W = torch.randn(3, 4), torch.randn(6, 4)
    for bad in (torch.randn(5), torch.randn(2, 6)):
        with pytest.raises(ShapeError, match=r"bias has shape .*expected \(out_features,\) = \(6,\)"):
            evt.linear(x, W, None, bad)
    with pytest.raises(EpilogueTypeError, match="bias must be a tensor or None, got float"):
        evt.linear(x, W, None, 1.0)
    for ok in (torch.randn(1), torch.randn(()), torch.randn(1, 6)):
        torch.testing.assert_close(evt.linear(x, W, None, ok), torch.nn.functional.linear(x, W, ok))
    with pytest.raises(EpilogueTypeError, match=r"x is torch.float32 and weight torch.float16.*same dtype"):
        evt.linear(x, W.half())
    with pytest.raises(EpilogueTypeError, match=r"bias is torch.float64 and weight torch.float32.*same dtype"):
        evt.linear(x, W, None, torch.randn(6, dtype=torch.float64))  # F.linear refuses it; it ran before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert evt.linear(x, W.to(torch.bfloat16), torch.relu).dtype == torch.bfloat16


def test_linear_nd_precheck_evaluates_the_epilogue_once():
    """evt.linear's check of an N-D x's epilogue (written for x's own dims?) ran the function twice on meta tensors
    for every new call signature; once now where the flattened rows work, and it still names the flattening where
    only x's own dims do."""
    x, W = torch.randn(2, 3, 4), torch.randn(6, 4)
    calls = []

    def fn(y, s):
        calls.append(y.device.type)
        return y * s

    evt.linear(x, W, fn, s=torch.randn(6))
    assert calls.count("meta") == 1
    with pytest.raises(ShapeError, match=r"flattens its leading dims into 6 rows.*\(6, 6\) \(reshape them\)"):
        evt.linear(x, W, fn, s=torch.randn(2, 3, 6))


def test_epilogue_parameter_kinds_and_sparse_tensors_are_named():
    """A keyword-only acc raised Python's "takes 0 positional arguments"; a positional-only input could never be
    passed; a sparse input failed in aten::as_strided and a sparse operand inside the GEMM."""
    A, B = torch.randn(6, 4), torch.randn(4, 5)
    with pytest.raises(EpilogueTypeError, match="'acc' is keyword-only"):
        evt.gemm(A, B, lambda *, acc: acc)
    with pytest.raises(EpilogueTypeError, match="'C' is positional-only"):
        evt.gemm(A, B, eval("lambda acc, C, /: acc + C"), C=torch.randn(6, 5))  # noqa: S307 - a fixed lambda
    with pytest.raises(EpilogueTypeError, match="input 'C' is a torch.sparse_coo tensor.*C.to_dense"):
        evt.gemm(A, B, lambda acc, C: acc + C, C=torch.randn(6, 5).to_sparse())
    with pytest.raises(EpilogueTypeError, match="B is a torch.sparse_coo tensor"):
        evt.gemm(A, B.to_sparse())


def test_config_of_the_wrong_kind_on_the_reference_backend():
    """The reference backend has no kernel to configure, and took config="fast" silently; the triton backend
    refuses it."""
    with pytest.raises(EpilogueTypeError, match="config must be an evtorch GemmConfig or None, got str"):
        evt.gemm(torch.randn(6, 4), torch.randn(4, 5), config="fast", backend="reference")


def test_integer_constant_outside_the_tensor_dtype_is_named():
    """``C + 2**31`` on int32 C: eager wraps the constant (and a comparison refuses it); the triton backend failed
    inside Triton's compiler ("out of range"). Both backends now name the constant and the dtype."""
    A, B = torch.randn(6, 4), torch.randn(4, 5)
    C = torch.ones(6, 5, dtype=torch.int32)
    for backend in ("reference", "triton"):
        with pytest.raises(EpilogueTypeError, match=r"add: the constant 2147483648 does not fit torch.int32"):
            evt.gemm(A, B, lambda acc, C: C + 2 ** 31, C=C, backend=backend)
    got = evt.gemm(A, B, lambda acc, C: C.long() + 2 ** 31, C=C, backend="reference")
    assert torch.equal(got, C.long() + 2 ** 31)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain", "differentiable"])
def test_triton_backend_off_its_devices_is_named(requires_grad, monkeypatch):
    """backend='triton' on meta tensors failed inside the interpreter ("Cannot copy out of meta tensor"), and on CPU
    tensors without the interpreter through the differentiable path inside Triton ("0 active drivers"); both are
    named before anything runs, for evt.gemm and evt.linear (the reference backend still gives meta shapes)."""
    A, B = (t.to("meta").requires_grad_(requires_grad) for t in (torch.randn(6, 4), torch.randn(4, 5)))
    with pytest.raises(EpilogueError, match="backend='triton' runs on CUDA tensors .*got A and B on meta"):
        evt.gemm(A, B, lambda acc: acc.relu(), backend="triton")
    with pytest.raises(EpilogueError, match="backend='triton' runs on CUDA tensors .*got A and B on meta"):
        evt.linear(A, B.T, torch.relu, backend="triton")
    assert evt.gemm(A, B, lambda acc: acc.relu(), backend="reference").shape == (6, 5)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    A, B = (torch.randn(6, 4, requires_grad=requires_grad), torch.randn(4, 5))
    with pytest.raises(EpilogueError, match="backend='triton' on cpu tensors needs Triton's CPU interpreter"):
        evt.gemm(A, B, lambda acc: acc.sigmoid(), backend="triton")
    with pytest.raises(EpilogueError, match="backend='triton' on cpu tensors needs Triton's CPU interpreter"):
        evt.linear(A, B.T, torch.sigmoid, backend="triton")


def test_abs_of_a_bool_tensor_is_refused_like_eager():
    """Eager PyTorch has no abs for bool tensors; the reference backend failed in its kernel with a raw
    NotImplementedError while the triton backend returned the mask. Both refuse it at trace time now."""
    for backend in ("reference", "triton"):
        raises(EpilogueTypeError, lambda acc: (acc > 0).abs(), "abs is not defined on bool tensors", backend=backend)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["eager", "autograd"])
def test_misplaced_epilogue_inputs_and_flags_are_named(requires_grad):
    """The epilogue as ``epilogue=`` reached the tracer as an input of the identity epilogue (an internal name in
    the message), an input given positionally met Python's bare arity error, and a string flag was taken as true
    (found 2026-11-29)."""
    A, B, C = torch.randn(4, 3, requires_grad=requires_grad), torch.randn(3, 5), torch.randn(4, 5)
    with pytest.raises(EpilogueTypeError, match=r"epilogue positionally.*evt.gemm\(A, B, fn"):
        evt.gemm(A, B, epilogue=torch.relu)
    with pytest.raises(EpilogueTypeError, match=r"inputs as keywords.*1 more positional"):
        evt.gemm(A, B, lambda acc, C: acc + C, C)
    with pytest.raises(EpilogueTypeError, match=r"deterministic must be True, False or None.*got .yes."):
        evt.gemm(A, B, torch.relu, deterministic="yes")
    with pytest.raises(EpilogueTypeError, match=r"allow_tf32 must be True or False, got None"):
        evt.gemm(A, B, torch.relu, allow_tf32=None)


def test_linear_names_its_epilogues_inputs_not_its_bias():
    """evt.nn.Linear / evt.linear check the inputs against the user's epilogue: the GEMM's check listed the bias
    the wrapper passes (``linear_bias``) among the inputs to give."""
    x = torch.randn(3, 8)
    with pytest.raises(EpilogueTypeError, match=r"evt.linear: <lambda>\(\) is missing keyword input\(s\) 's'; "
                                                r"it takes s$"):
        evt.nn.Linear(8, 4, epilogue=lambda y, s: y * s)(x)
    with pytest.raises(EpilogueTypeError, match=r"unexpected keyword input\(s\) 's'; it takes no inputs"):
        evt.linear(x, torch.randn(4, 8), lambda y: y, torch.randn(4), s=2.0)
    assert evt.linear(x, torch.randn(4, 8), lambda y, s: y * s, torch.randn(4), s=2.0).shape == (3, 4)


def test_branching_on_a_number_input_says_numbers_are_runtime_values():
    def fn(acc, s):
        return acc if s > 0 else -acc
    with pytest.raises(TraceControlFlowError, match="a number input is a runtime value too"):
        evt.gemm(torch.randn(2, 3), torch.randn(3, 4), fn, s=1.0)
    with pytest.raises(TraceControlFlowError) as info:  # a tile value: no such hint
        evt.gemm(torch.randn(2, 3), torch.randn(3, 4), lambda acc: acc if acc > 0 else -acc)
    assert "number input" not in str(info.value)


def test_max_and_min_methods_of_a_tensor_are_elementwise_as_in_eager():
    """``x.max(other)`` is torch.maximum in eager; it was refused with a hint to amax (found 2026-11-29). The
    one-tensor spellings, which return indices, stay refused; suggestions never name operator dunders."""
    C = torch.randn(A.shape[0], B.shape[1])
    for fn in (lambda acc, C: acc.max(C), lambda acc, C: acc.min(C * 2.0)):
        assert torch.equal(evt.gemm(A, B, fn, C=C), fn(A @ B, C))
    with pytest.raises(UnsupportedOpError, match=r"use torch\.amax"):
        evt.gemm(A, B, lambda acc: acc.max())
    with pytest.raises(UnsupportedOpError) as e:
        evt.gemm(A, B, lambda acc: torch.rand_like(acc))
    assert "__" not in str(e.value)


def test_mean_of_an_integer_value_is_refused_like_eager():
    """torch.mean of an integer tensor raises ("could not infer output dtype"); the epilogue ran where its eager
    self does not (found 2026-11-29). With dtype= it runs, as in eager; logsumexp of integers is eager's float."""
    I = torch.randint(0, 5, (A.shape[0], B.shape[1]))
    with pytest.raises(EpilogueTypeError, match=r"mean\(\) of a torch.int64 value.*x.float\(\).mean"):
        evt.gemm(A, B, lambda acc, I: (acc, I.mean(1)), I=I)
    for fn in (lambda acc, I: I.mean(1, dtype=torch.float32), lambda acc, I: torch.logsumexp(I * 1, 1)):
        torch.testing.assert_close(evt.gemm(A, B, fn, I=I), fn(A @ B, I))


def test_numpy_numbers_and_captured_defaults_are_named():
    np = pytest.importorskip("numpy")
    with pytest.raises(EpilogueTypeError, match=r"'s' is a numpy.float32.*pass s=float\(\.\.\.\)"):
        evt.gemm(A, B, lambda acc, s: acc * s, s=np.float32(2))
    bias = torch.randn(B.shape[1])
    with pytest.raises(EpilogueTypeError, match="a parameter's default"):
        evt.gemm(A, B, lambda acc, b=bias: torch.add(acc, b))


def test_module_epilogues_and_unhashable_callables():
    """An nn.Module epilogue was refused for Module.__call__'s ``*args`` (its forward's signature is read now); an
    unhashable callable met a raw "unhashable type" on the differentiable path and in evt.linear (found
    2026-11-29)."""
    import dataclasses
    Ag = A.clone().requires_grad_()
    torch.testing.assert_close(evt.gemm(Ag, B, torch.nn.GELU()), F.gelu(A @ B))
    assert evt.nn.Linear(B.shape[0], 5, epilogue=torch.nn.Tanh())(torch.randn(2, B.shape[0])).shape == (2, 5)

    @dataclasses.dataclass
    class Scale:
        s: float = 2.0

        def __call__(self, acc):
            return acc * self.s
    torch.testing.assert_close(evt.gemm(A, B, Scale()), (A @ B) * 2.0)  # no grad: runs uncached
    with pytest.raises(EpilogueTypeError, match=r"unhashable Scale.*__hash__"):
        evt.gemm(Ag, B, Scale())
    with pytest.raises(EpilogueTypeError, match=r"evt.linear: fn is an unhashable Scale"):
        evt.linear(torch.randn(2, 3), torch.randn(4, 3), Scale())


def test_linear_names_x_and_weight_and_checks_its_options_at_construction():
    """evt.linear's sparse and dtype errors named the GEMM's A; evt.nn.Linear took policy='bogus' until its first
    forward and registered an nn.Module epilogue as a submodule, whose entries then kept its state_dict from
    loading into an nn.Linear (found 2026-11-29)."""
    x, W = torch.randn(3, 8), torch.randn(4, 8)
    with pytest.raises(EpilogueTypeError, match=r"evt.linear: x is a torch.sparse_coo tensor.*x.to_dense\(\)"):
        evt.linear(x.to_sparse(), W)
    with pytest.raises(EpilogueTypeError, match=r"evt.linear: weight has dtype torch.int32"):
        evt.linear(x, W.int())
    with pytest.raises(EpilogueError, match=r"policy must be one of \('save', 'recompute'\), got 'bogus'"):
        evt.nn.Linear(8, 4, policy="bogus")
    layer = evt.nn.Linear(8, 4, epilogue=torch.nn.PReLU())
    assert list(layer.state_dict()) == ["weight", "bias"]
    torch.nn.Linear(8, 4).load_state_dict(layer.state_dict())


def test_epilogue_reference_takes_the_traced_inputs():
    """``Epilogue.reference`` with a defaulted input given but not traced ignored its value (a constant of the
    trace), and one traced but left out met a raw KeyError (found by a probe, 2026-11-29): both are named."""
    def epi(acc, alpha=1.0):
        return acc * alpha

    acc = torch.randn(4, 3)
    with pytest.raises(evt.EpilogueError, match=r"traced with inputs none and is run with \['alpha'\]"):
        evt.trace(epi, acc=evt.spec((4, 3))).reference(acc, alpha=3.0)
    ep = evt.trace(epi, acc=evt.spec((4, 3)), alpha=2.0)
    with pytest.raises(evt.EpilogueError, match=r"traced with inputs \['alpha'\] and is run with none"):
        ep.reference(acc)
    torch.testing.assert_close(ep.reference(acc, alpha=3.0), acc * 3.0)


def test_unbound_tensor_methods_as_epilogues():
    """``torch.Tensor.exp`` as the epilogue met a raw TypeError (the descriptor refuses the tracer's proxy; found by
    a probe, 2026-11-29): it runs as the method of that name on acc, with and without gradients."""
    A, B = torch.randn(8, 4), torch.randn(4, 6)
    for f in (torch.Tensor.exp, torch.Tensor.relu, torch.Tensor.sigmoid):
        assert torch.equal(evt.gemm(A, B, f), f(A @ B))
    Ag = A.clone().requires_grad_()
    got, = torch.autograd.grad(evt.gemm(Ag, B, torch.Tensor.tanh).sum(), Ag)
    A2 = A.clone().requires_grad_()
    want, = torch.autograd.grad(torch.Tensor.tanh(A2 @ B).sum(), A2)
    torch.testing.assert_close(got, want)


def _raises_evtorch(cls, call, *names):
    """``call()`` raises ``cls`` (an evtorch error, never a raw one) whose message contains every string in ``names``."""
    with pytest.raises(cls) as ei:
        call()
    assert type(ei.value).__module__ == "evtorch.errors", f"a raw {type(ei.value).__name__} escaped: {ei.value}"
    for name in names:
        assert name in str(ei.value), f"message does not name {name!r}: {ei.value}"


@pytest.mark.parametrize("grad", [False, True], ids=["plain", "differentiable"])
def test_options_are_checked_alike_with_and_without_gradients(grad):
    """A probe (2026-11-29) found the differentiable path (an operand requiring grad) and the triton backend
    checking options differently from plain evt.gemm: ``outputs=0`` (one position) met a raw "'int' object is not
    iterable", ``outputs=[]`` returned None without gradients and said "the epilogue returned nothing" with them,
    ``config={...}`` failed "unhashable type: 'dict'" and ``config="fast"`` on the triton backend the launcher's
    bare TypeError, and a non-number input (list, str, None, complex, NumPy array) reached ``float()``."""
    fn = lambda acc, s: (acc * s, acc.sum(1))  # noqa: E731
    A2 = A.clone().requires_grad_(grad)
    call = lambda **kw: evt.gemm(A2, B, fn, **{"s": 2.0, **kw})  # noqa: E731
    got = call(outputs=0)
    assert got[1] is None and torch.allclose(got[0], (A @ B) * 2.0)
    assert got[0].requires_grad == grad
    _raises_evtorch(EpilogueError, lambda: call(outputs=[]), "outputs= selects no output")
    _raises_evtorch(EpilogueTypeError, lambda: call(outputs=[0.0]), "outputs=")
    for backend in ("reference", "triton"):
        for config, shown in (("fast", "str 'fast'"), ({"BLOCK_M": 16}, "dict {'BLOCK_M': 16}")):
            _raises_evtorch(EpilogueTypeError, lambda: call(config=config, backend=backend),
                            "config must be an evtorch GemmConfig or None", shown)
    for value, kind in (([1.0], "a list"), ("x", "a str"), (None, "a NoneType"), (1j, "a complex"),
                        (np.ones(3, dtype="float32"), "a numpy.ndarray"), (np.float32(2.0), "numpy.float32")):
        _raises_evtorch(EpilogueTypeError, lambda: call(s=value), "input 's'", kind, "expected a tensor")


def test_linear_policy_and_stray_inputs_are_named():
    """``evt.linear(x, w, None, scale=2.0)`` (or ``outputs=[0]``, an evt.gemm option evt.linear has not) ran and
    ignored the input, having no epilogue to give it to; ``policy="bogus"`` was a bare ValueError of the plan and
    ``policy=[...]`` "unhashable type: 'list'" (found by a probe, 2026-11-29)."""
    x, W = torch.randn(3, 8), torch.randn(4, 8)
    for kw in ({"scale": 2.0}, {"outputs": [0]}):
        for xx in (x, x.clone().requires_grad_()):
            _raises_evtorch(EpilogueTypeError, lambda: evt.linear(xx, W, None, **kw), f"'{next(iter(kw))}'",
                            "no epilogue (fn=None")
    for policy in ("bogus", ["save"]):
        _raises_evtorch(EpilogueError, lambda: evt.linear(x, W, torch.tanh, policy=policy),
                        "policy must be one of ('save', 'recompute')", repr(policy))
