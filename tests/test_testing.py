"""The correctness harness's own rules (``evtorch.testing.check``, which the interpreter tests and the GPU selftest
share): a step case (rounding, sign, comparisons) accepts the value on either side of a discontinuity that the
float64 accumulator lies within accumulation error of, and nothing else."""
from __future__ import annotations

import pytest
import torch

import evtorch
from evtorch import testing
from evtorch.testing import Case, check, operands

M, N, K = 24, 20, 16


def _fake_gemm(monkeypatch, result):
    """``evt.gemm`` as ``check`` calls it, returning ``result(A, B, inputs)`` instead of running a kernel."""
    monkeypatch.setattr(evtorch, "gemm", lambda A, B, fn, **kw: result(A, B, {
        k: v for k, v in kw.items() if k not in ("backend", "deterministic", "allow_tf32")}))


def test_step_case_accepts_either_side_of_a_discontinuity(monkeypatch):
    """C puts acc + C on an integer at every element, so the kernel's float32 sum may round either way: ceil one
    step above the float64 reference everywhere is right, within the accumulation bound."""
    case = Case("ceil_at_steps", lambda acc, C: torch.ceil(acc + C), lambda *a: {}, step=True)
    A, B = operands(case, M, N, K, 1, "cpu", torch.float32)
    acc = A.double() @ B.double()
    C = (torch.round(acc) - acc).float()
    case.make_inputs = lambda *a: {"C": C}
    exact = (acc + C.double())
    assert (exact - exact.round()).abs().max() < 1e-6  # every element within float32 error of a step
    _fake_gemm(monkeypatch, lambda A, B, kw: torch.ceil(acc + kw["C"].double() + 1e-7).float())
    check(case, M=M, N=N, K=K, L=1)
    _fake_gemm(monkeypatch, lambda A, B, kw: torch.ceil(acc + kw["C"].double() - 1e-7).float())
    check(case, M=M, N=N, K=K, L=1)


def test_step_case_rejects_a_wrong_step_away_from_discontinuities(monkeypatch):
    case = Case("ceil_generic", lambda acc, C: torch.ceil(acc + C), lambda *a: {}, step=True)
    A, B = operands(case, M, N, K, 1, "cpu", torch.float32)
    acc = A.double() @ B.double()
    C = torch.randn(M, N, generator=torch.Generator().manual_seed(0))
    case.make_inputs = lambda *a: {"C": C}
    frac = (acc + C.double()) - (acc + C.double()).floor()
    i, j = divmod(int((frac - 0.5).abs().argmin()), N)  # the element farthest from a step

    def wrong(A, B, kw):
        out = torch.ceil(acc + kw["C"].double()).float()
        out[i, j] += 1
        return out
    _fake_gemm(monkeypatch, wrong)
    with pytest.raises(AssertionError, match="relative error"):
        check(case, M=M, N=N, K=K, L=1)


def test_step_flag_marks_the_discontinuous_registry_cases():
    names = {c.name for c in testing.all_cases() if c.step}
    assert {"op_ceil", "op_floor", "op_round", "op_sign", "op_lt", "op_where_bool_logic"} <= names
    assert not {"op_relu", "op_tanh", "op_add"} & names
