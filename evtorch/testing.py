"""Correctness cases and the checker shared by the interpreter test suite and the GPU selftest.

A ``Case`` builds an epilogue and fresh random inputs for a problem size; ``check`` runs ``evt.gemm`` on the
chosen backend with outputs poisoned (NaN; ``EVTORCH_POISON``) and compares every output with the eager
function on the float64 product: relative Frobenius error within the dtype's tolerance and NaN exactly where
eager has NaN (NaN never passes by accident). The op cases are generated from the registry, so a newly
registered op is covered without touching this file.
"""
from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import evtorch as evt

from .examples import EXAMPLES
from .ops import REGISTRY
from .ops.registry import BOOL_ONLY, COMPARE, REDUCTION

# The smallest epilogue the template contract admits: the accumulator stored, in the output's dtype, into
# out[L, M, N]. The template tests and benchmarks/template_check.py check and time the GEMM templates through it,
# without the epilogue compiler in the way.
STORE_EPILOGUE = '''
@triton.jit
def epi_store(acc, offs_m, offs_n, pid_m, pid_n, pid_l, M, N, L, EVEN_M, EVEN_N, INDEX_DTYPE,
              out_ptr, s_ol, s_om, s_on):
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = (out_ptr + pid_l.to(tl.int64) * s_ol + offs_m.to(tl.int64)[:, None] * s_om
            + offs_n.to(tl.int64)[None, :] * s_on)
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
'''


def store_module_source(prefix: str = "g") -> str:
    """Source of a module with every GEMM template's kernels (names prefixed ``prefix``) around ``STORE_EPILOGUE``;
    launched with ``out_ptr`` and its three strides as the epilogue's parameters."""
    from .codegen.gemm_template import HEADER, render_gemm_kernels

    params = ["out_ptr", "s_ol", "s_om", "s_on"]
    return HEADER + STORE_EPILOGUE + "\n\n" + render_gemm_kernels(prefix, "epi_store", params)


#: relative Frobenius tolerance per A/B dtype (fp32 with TF32 off)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-10}


@dataclass
class Case:
    name: str
    fn: Callable
    make_inputs: Callable   # (M, N, L, device, dtype) -> dict
    batched: bool = False
    broadcast_b: bool = False
    gpu_only: str = ""      # why the Triton interpreter cannot check this case (it still runs on the GPU)
    tol: float | None = None  # for cases whose values pass through a low-precision rounding
    # a discontinuous function of acc (rounding to integers, sign, comparisons) whose pieces have slope at most 1
    # in acc: ``check`` accepts, element by element, any value the function takes within the kernel's
    # accumulation error of the float64 accumulator (``_step_bounds``)
    step: bool = False


def _r(*shape, device, dtype=torch.float32, scale=1.0):
    return torch.randn(*shape, device=device, dtype=dtype) * scale


# ----------------------------------------------------------------------------------------------- op cases
_POSITIVE = {"log", "log2", "sqrt", "rsqrt", "log1p"}
_STEP = {"ceil", "floor", "round", "sign"}


def _unary_case(name: str) -> Case:
    torch_fn = {"relu": torch.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "gelu": F.gelu,
                "silu": F.silu, "softplus": F.softplus, "logsigmoid": F.logsigmoid, "hardswish": F.hardswish,
                "hardsigmoid": F.hardsigmoid,
                "elu": F.elu, "square": torch.square, "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5),
                "neg": torch.neg, "abs": torch.abs, "sign": torch.sign}.get(name) or getattr(torch, name)
    if name in _POSITIVE:
        def fn(acc, C):
            return torch_fn(acc.abs() + C.abs() + 0.25)
    else:
        def fn(acc, C):
            return torch_fn(acc + C)
    return Case(f"op_{name}", fn, lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t)), step=name in _STEP)


def op_cases() -> list[Case]:
    cases = []
    for op in REGISTRY.ops.values():
        if op.user_defined is not None or op.has(REDUCTION) or op.name in ("fma", "cast", "where", "clamp",
                                                                            "pow") or op.has(BOOL_ONLY):
            continue
        if len(op.operands) == 1:
            cases.append(_unary_case(op.name))
        elif op.has(COMPARE):
            torch_fn = op.torch_ref
            cases.append(Case(f"op_{op.name}", lambda acc, C, f=torch_fn: torch.where(f(acc, C), acc, -acc),
                              lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t)), step=True))
        else:
            torch_fn = op.torch_ref
            if op.name == "div":
                cases.append(Case("op_div", lambda acc, C: acc / (C.abs() + 0.5),
                                  lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t))))
            else:
                cases.append(Case(f"op_{op.name}", lambda acc, C, f=torch_fn: f(acc, C),
                                  lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t))))
    cases += [
        Case("op_where_bool_logic", lambda acc, C: torch.where((acc > 0) & ~(C < -0.5) | (C > 1), acc, C * 2),
             lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t)), step=True),
        Case("op_clamp", lambda acc, lo: (torch.clamp(acc, -0.5, 0.7), acc.clip(min=lo), acc.clamp(max=0.1)),
             lambda M, N, L, d, t: dict(lo=_r(N, device=d, dtype=t) * 0.3)),
        Case("op_pow", lambda acc: (acc ** 2, acc ** 3, acc.abs() ** 0.5, (acc.abs() + 1) ** -1, acc.abs() ** 1.7,
                                    torch.pow(acc, 4)), lambda M, N, L, d, t: {}),
        Case("op_casts", lambda acc, C: (acc.half().float() + C, (acc > 0).float() * C, acc.to(torch.float16),
                                         (acc > 0.5).to(torch.int32) + 1),
             lambda M, N, L, d, t: dict(C=_r(M, N, device=d)),
             # fp16-rounded values against a reference rounded from fp64: 1-ulp differences
             tol=1e-3, step=True),
        Case("op_cast_bf16", lambda acc, C: (acc.bfloat16(), acc.bfloat16().float() * C),
             lambda M, N, L, d, t: dict(C=_r(M, N, device=d)), tol=1e-2,
             gpu_only="the interpreter's fp32->bf16 conversion truncates instead of rounding to nearest even"),
        Case("op_gelu_tanh", lambda acc: F.gelu(acc, approximate="tanh"), lambda M, N, L, d, t: {}),
        Case("op_fma_chain", lambda acc, a, b: acc * a + b * acc + 1.5,
             lambda M, N, L, d, t: dict(a=_r(M, 1, device=d), b=_r(N, device=d))),
    ]
    return cases


# ----------------------------------------------------------------------------------------------- roles & views
def role_cases() -> list[Case]:
    def rows(M, N, L, d, t):
        return dict(aux=_r(M, N, device=d, dtype=t), row=_r(N, device=d, dtype=t), row2=_r(1, N, device=d),
                    col=_r(M, 1, device=d, dtype=t), v=_r(M, device=d), s=_r((), device=d), alpha=0.75, k=3)

    def batched(M, N, L, d, t):
        return dict(X=_r(L, M, N, device=d, dtype=t), Y=_r(M, N, device=d, dtype=t), r=_r(L, 1, N, device=d),
                    c=_r(L, M, 1, device=d), s=_r(L, 1, 1, device=d))
    return [
        Case("roles_2d", lambda acc, aux, row, row2, col, v, s, alpha, k:
             alpha * acc + aux * row + row2 - col + v[:, None] * s + v.unsqueeze(1) * k, rows),
        Case("roles_batched", lambda acc, X, Y, r, c, s: (acc * X + Y - r) * c + s, batched, batched=True),
        Case("roles_batched_bcast_b", lambda acc, X, Y, r, c, s: torch.tanh(acc * X + Y - r) * c + s, batched,
             batched=True, broadcast_b=True),
        Case("views_out", lambda acc, C: ((acc + C).T, (acc * C).mT.unsqueeze(0), acc.unsqueeze(-1)),
             lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t))),
        Case("views_in", lambda acc, C, v: acc + C.T.T + v.view(-1, 1) + v.reshape(-1, 1).expand(-1, acc.shape[1]),
             lambda M, N, L, d, t: dict(C=_r(N, M, device=d, dtype=t).T, v=_r(M, device=d))),
        Case("views_batched", lambda acc, X: ((acc + X).permute(2, 0, 1), (acc * 2).reshape(-1, acc.shape[-1]),
                                              acc.transpose(0, 1)),
             lambda M, N, L, d, t: dict(X=_r(L, M, N, device=d, dtype=t)), batched=True),
        Case("index_gather", lambda acc, target: (
            torch.where(evt.col_index(acc) == target[:, None], acc, 0).sum(1),
            torch.where(evt.row_index(acc) > evt.col_index(acc), acc, 0.0)),
             lambda M, N, L, d, t: dict(target=torch.randint(0, N, (M,), device=d))),
    ]


def reduction_cases() -> list[Case]:
    cases = []
    # sums and means of values with a nonzero mean: a sum that cancels to ~0 has no meaningful relative error
    for op in ("sum", "mean", "amax", "amin", "logsumexp"):
        cases.append(Case(f"reduce_{op}", lambda acc, C, op=op: (
            getattr(torch, op)(acc + C + 2, dim=1), getattr(torch, op)(acc * C + 2, dim=0, keepdim=True),
            getattr(torch, op)(torch.tanh(acc) + 2, dim=(0, 1)), getattr(torch, op)(acc, dim=-1, keepdim=True)),
            lambda M, N, L, d, t: dict(C=_r(M, N, device=d, dtype=t))))
        cases.append(Case(f"reduce_{op}_batched", lambda acc, op=op: (
            getattr(torch, op)(acc + 2, dim=0), getattr(torch, op)(acc + 2, dim=(1, 2)),
            getattr(torch, op)(acc + 2, dim=(0, 2)), getattr(torch, op)(acc + 2, dim=(0, 1, 2))),
            lambda M, N, L, d, t: {}, batched=True))
    cases += [
        Case("vector_stage_ce", lambda acc, target: (
            (torch.logsumexp(acc, 1) - torch.where(evt.col_index(acc) == target[:, None], acc, 0).sum(1)).mean(),
            torch.logsumexp(acc, 1)), lambda M, N, L, d, t: dict(target=torch.randint(0, N, (M,), device=d))),
        Case("vector_stage_chain", lambda acc, w: (
            (acc.amax(0) - acc.amin(0)) * w, ((acc.sum(1) * 0.5).exp() + 1).log().amax(), acc.mean(0).logsumexp(0)),
             lambda M, N, L, d, t: dict(w=_r(N, device=d))),
        Case("amax_nan_negative", lambda acc, C: ((acc + C).amax(1), (acc + C).amin(0), (acc - 1e30).amax()),
             lambda M, N, L, d, t: dict(C=_nan_at(_r(M, N, device=d), 1, 2))),
        Case("dag_reuse_multi_out", lambda acc, b: _dag(acc, b), lambda M, N, L, d, t: dict(b=_r(N, device=d))),
    ]
    return cases


def _nan_at(x, i, j):
    x = x.clone()
    x[min(i, x.shape[0] - 1), min(j, x.shape[1] - 1)] = float("nan")
    return x


def _dag(acc, b):
    z = acc + b
    s = torch.sigmoid(z)
    return z * s, s.sum(0), (z * s).amax(1), z


def example_cases() -> list[Case]:
    out = []
    for name, ex in EXAMPLES.items():
        out.append(Case(f"example_{name}", ex.fn, lambda M, N, L, d, t, ex=ex: ex.make_inputs(M, N, d, t)))
    return out


def all_cases() -> list[Case]:
    return op_cases() + role_cases() + reduction_cases() + example_cases()


# ----------------------------------------------------------------------------------------------- checking
def operands(case: Case, M, N, K, L, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(zlib.crc32(f"{case.name}/{M}/{N}/{K}".encode()))
    shape_a = (L, M, K) if case.batched else (M, K)
    shape_b = (K, N) if (case.broadcast_b or not case.batched) else (L, K, N)
    A = (torch.randn(shape_a, generator=g) / math.sqrt(max(K, 1))).to(device=device, dtype=dtype)
    B = torch.randn(shape_b, generator=g).to(device=device, dtype=dtype)
    return A, B


def _step_bounds(case: Case, A, B, acc, ref_inputs, dtype, allow_tf32) -> list:
    """Per output of a step case, (lo, hi): bounds on the values the reference takes for accumulators within
    d = 2 K u (|A| @ |B|) of the float64 one, which bounds the kernel's accumulation error (u: the unit roundoff of
    its products and sums: fp32's, TF32's inputs, or fp64's). Where the float64 accumulator lies within d of one of
    the function's discontinuities, the kernel's float32 sum may land on either side, and either value is right.

    The reference runs at acc - d, acc and acc + d; their elementwise min and max, widened by 2 d (floating outputs;
    an integer output's pieces are constant), hold every value of a function whose pieces have slope at most 1
    (``Case.step``). The widening matters at a discontinuity c:
    the kernel's accumulator may land just past c, where the function's value is its one-sided limit at c, which
    none of the three runs samples (``where(acc <= C, acc, -acc)`` at acc = C < 0 takes values up to -C, the runs
    only up to -C - d)."""
    K = A.shape[-1]
    u = 2.0 ** -53 if dtype == torch.float64 else 2.0 ** -11 if allow_tf32 and dtype == torch.float32 else 2.0 ** -24
    d = 2 * K * u * (A.double().abs() @ B.double().abs())
    runs = []
    for shift in (-d, None, d):
        r = case.fn(acc if shift is None else acc + shift, **ref_inputs)
        runs.append(tuple(r) if isinstance(r, (tuple, list)) else (r,))
    bounds = []
    for values in zip(*runs):
        if values[0].dtype == torch.bool:
            bounds.append(None)
            continue
        stacked = torch.stack([v.double() for v in values])
        widen = 2 * d if values[0].dtype.is_floating_point and d.shape == values[0].shape else 0.0
        bounds.append(((stacked.amin(0) - widen).to(values[0].dtype), (stacked.amax(0) + widen).to(values[0].dtype)))
    return bounds


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; inf when NaN positions differ or shapes differ."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    if out.dtype == torch.bool or ref.dtype == torch.bool:
        return 0.0 if torch.equal(out.cpu(), ref.cpu()) else math.inf
    o, r = out.double().cpu(), ref.double().cpu()
    if not torch.equal(o.isnan(), r.isnan()):
        return math.inf
    finite = r.isfinite() & o.isfinite()
    if not torch.equal(o.isinf(), r.isinf()) or not torch.equal(o[o.isinf()], r[r.isinf()]):
        return math.inf
    o, r = o[finite], r[finite]
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item() if r.numel() else 0.0


def reference_device(dtype: torch.dtype, device):
    """Where the float64 reference of a run on ``dtype`` operands computes: a float64 run's on the CPU, since some
    of torch's CUDA kernels compute float64 with float constants (hardswish's and hardsigmoid's 1/6 is
    1.0f / 6.0f: 3e-8 off, where a float64 run's tolerance is 1e-10); others beside the operands."""
    return "cpu" if dtype == torch.float64 else device


def tolerance(dtype: torch.dtype, inputs: dict) -> float:
    """The relative error allowed a run on ``dtype`` operands with epilogue ``inputs``. Inputs narrower than the
    operands keep their own precision, as in eager (a float64 run's float32 ``v * s`` is rounded to float32
    there), which the float64 reference does not: a float64 run with narrower inputs is held to float32's
    tolerance, and a float32 one with 16-bit inputs to ten times float32's."""
    narrow = [v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point
              and v.dtype.itemsize < dtype.itemsize]
    base = torch.float32 if dtype == torch.float64 and narrow else dtype
    return TOLERANCE[base] * (10 if base == torch.float32 and any(d.itemsize == 2 for d in narrow) else 1)


def check(case: Case, *, M=37, N=45, K=29, L=3, device="cpu", dtype=torch.float32, backend="triton",
          deterministic=False, allow_tf32=False) -> list[float]:
    """Relative error of each output of ``case`` (raises AssertionError on a mismatch beyond tolerance)."""
    os.environ["EVTORCH_POISON"] = "1"
    A, B = operands(case, M, N, K, L, device, dtype)
    inputs = case.make_inputs(M, N, L, device, dtype)
    out = evt.gemm(A, B, case.fn, backend=backend, deterministic=deterministic, allow_tf32=allow_tf32, **inputs)
    ref_device = reference_device(dtype, A.device)
    A, B = A.to(ref_device), B.to(ref_device)
    ref_inputs = {k: (v.double() if v.dtype == torch.float32 else v).to(ref_device) if isinstance(v, torch.Tensor)
                  else v for k, v in inputs.items()}
    acc = A.double() @ B.double()
    ref = case.fn(acc, **ref_inputs)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    ref = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    bounds = _step_bounds(case, A, B, acc, ref_inputs, dtype, allow_tf32) if case.step else [None] * len(ref)
    tol = tolerance(dtype, inputs)
    errors = []
    for i, (o, r, lohi) in enumerate(zip(out, ref, bounds)):
        if r.dtype.is_floating_point and o.dtype in (torch.float16, torch.bfloat16):
            r = r.to(o.dtype)
            lohi = lohi and tuple(b.to(o.dtype) for b in lohi)
        if lohi is not None and o.dtype != torch.bool and o.shape == r.shape:
            lo, hi = (b.double().cpu() for b in lohi)
            od = o.double().cpu()
            r = torch.where((od >= lo) & (od <= hi), od, r.double().cpu())
        e = rel_error(o, r)
        errors.append(e)
        limit = max(tol, 1e-2) if o.dtype in (torch.float16, torch.bfloat16) else (case.tol or tol)
        assert e <= limit, \
            f"{case.name} output {i}: relative error {e:.3g} > {limit:g} (dtype {dtype}, {backend})"
    return errors
