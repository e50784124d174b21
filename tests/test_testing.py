"""The correctness harness's own rules (``evtorch.testing.check``, which the interpreter tests and the GPU selftest
share): a step case (rounding, sign, comparisons) accepts the value on either side of a discontinuity that the
float64 accumulator lies within accumulation error of, and nothing else."""
from __future__ import annotations

import pytest
import torch

import evtorch
from evtorch import testing
from evtorch.codegen.configs import GemmConfig
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


def test_step_case_accepts_the_one_sided_limit_past_a_discontinuity(monkeypatch):
    """``where(acc <= C, acc, -acc)`` with C a hair above a negative float64 accumulator: a kernel whose float32 sum
    lands past C returns -acc32, up to -C, a value none of the reference runs at acc - d, acc, acc + d takes (they
    reach -C - d): the GPU selftest's op_le failure of 2026-11-29 (1024x768x512, float32)."""
    case = Case("le_at_negative_steps", lambda acc, C: torch.where(acc <= C, acc, -acc), lambda *a: {}, step=True)
    A, B = operands(case, M, N, K, 1, "cpu", torch.float32)
    acc = A.double() @ B.double()
    d = 2 * K * 2.0 ** -24 * (A.double().abs() @ B.double().abs())
    C = -(acc.abs() + 0.5)  # every element negative: shift acc down so it sits on C
    acc_neg = C - d / 8  # the float64 accumulator a hair under C ...
    shift = (acc_neg - acc).float()
    case.fn = lambda acc, C, s=shift.double(): torch.where(acc + s <= C, acc + s, -(acc + s))
    case.make_inputs = lambda *a: {"C": C.float()}
    kernel_acc = acc + shift.double() + d / 4  # ... the kernel's float32 sum a hair over it, within d
    _fake_gemm(monkeypatch, lambda A, B, kw: torch.where(kernel_acc <= kw["C"].double(), kernel_acc,
                                                         -kernel_acc).float())
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


# ---------------------------------------------------------------------------- the selftest's template checks
@pytest.mark.interpreter
@pytest.mark.parametrize("config", [
    GemmConfig("persistent_tma", 16, 32, 16, num_stages=1, extra=(("EPILOGUE_SUBTILE", True),)),
    GemmConfig("splitk", 16, 16, 16, SPLIT_K=2, num_stages=1, extra=(("TMA_LOADS", True),)),
    GemmConfig("splitk", 64, 64, 16, SPLIT_K=3, num_stages=1, extra=(("TMA_LOADS", True),)),  # its own reduce tile
], ids=lambda c: c.short())
@pytest.mark.parametrize("a_col, b_col", [(True, False), (False, True)])
def test_selftest_template_check_on_column_major_operands(config, a_col, b_col):
    """``selftest.template_check`` with column-major operands through the interpreter's TMA emulation: the
    config's own template runs (not the pointer fallback) and matches the float64 reference; the storage really
    is column-major."""
    from evtorch.examples import EXAMPLES
    from evtorch.selftest import template_check

    ex = EXAMPLES["row_reduction"]
    case = Case("layout", ex.fn, lambda M, N, L, d, t: ex.make_inputs(M, N, d, t))
    seen = []
    real = evtorch.gemm

    def spy(A, B, fn, **kw):
        seen.append((A.stride(), B.stride()))
        return real(A, B, fn, **kw)
    import unittest.mock
    with unittest.mock.patch.object(evtorch, "gemm", spy):
        errs = template_check(case, config, 40, 48, 64, "cpu", torch.float16, a_col=a_col, b_col=b_col,
                              backend="triton")
    assert len(errs) == 2 and max(errs) <= 1e-2
    (sa, sb), = seen
    assert (sa == (1, 40)) == a_col and (sb == (1, 64)) == b_col


def test_selftest_lists_the_column_major_checks(monkeypatch):
    """The selftest runs each TMA template config (persistent_tma, split-K over TMA loads) on two examples with A
    and then B column-major, and no other config that way."""
    from evtorch import selftest

    names = []
    monkeypatch.setattr(selftest, "template_check", lambda case, cfg, *a, **kw: names.append(
        (case.name, kw.get("a_col"), kw.get("b_col"))) or [0.0])
    res = selftest.run(sizes=(), dtypes=("bfloat16",), deterministic=(False,), only="layout_")
    tma = {name.split("_lincomb_relu")[0] for name, _, _ in names if "_lincomb_relu" in name}
    assert res["failed"] == 0 and res["passed"] == len(names) == 4 * len(tma) and len(tma) >= 6
    assert all("tma_loads" in n or n.startswith("layout_persistent_tma") for n in tma)
    assert {(a, b) for _, a, b in names} == {(True, False), (False, True)}
