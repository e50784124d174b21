"""The epilogues ``evtorch bench`` measures (issue 4), each a plain PyTorch function of the accumulator.

``WORKLOADS`` maps a name to ``Workload(fn, make_inputs, note)``. ``fn(acc, **inputs)`` is what every contender
computes: evtorch fuses it into the GEMM (``evt.gemm(A, B, fn, **inputs)``, acc in fp32), eager and
torch.compile run ``fn(A @ B, **inputs)`` (acc is then the bf16 product, as a user would write it).
``make_inputs(M, N, device, dtype)`` returns fresh random keyword inputs for an (M, N) accumulator.

Five come from ``evtorch.examples`` (CUTLASS's EVT examples and a BCE loss); ``bias_gelu_aux`` and
``dgelu_bgrad`` are the forward and backward halves of a GELU MLP layer.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from evtorch.examples import bce_loss, column_broadcast, lincomb_relu, mixed_dag, row_reduction

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_C = 0.044715


class Workload(NamedTuple):
    fn: Callable
    make_inputs: Callable  # (M, N, device, dtype) -> dict
    note: str


def identity(acc):
    """Plain GEMM: the epilogue stores acc (in A.dtype)."""
    return acc


def bias_gelu_aux(acc, bias):
    """MLP forward: ``pre = acc + bias`` (bias (N,)); returns ``gelu_tanh(pre)`` and ``pre`` (kept for backward)."""
    pre = acc + bias
    return F.gelu(pre, approximate="tanh"), pre


def gelu_tanh_derivative(x):
    """d/dx of ``gelu(x, approximate="tanh")``, computed in float32 and rounded once to ``x.dtype``.

    gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), so
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    """
    xf = x.float()
    t = torch.tanh(_SQRT_2_OVER_PI * (xf + _GELU_C * xf * xf * xf))
    d = 0.5 * (1.0 + t) + 0.5 * xf * (1.0 - t * t) * (_SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * xf * xf))
    return d.to(x.dtype)


def dgelu_bgrad(acc, pre):
    """MLP backward: ``acc`` = dY @ W2^T; ``dpre = acc * gelu'(pre)`` and the bias gradient ``dpre.sum(0)``."""
    dpre = acc * gelu_tanh_derivative(pre)
    return dpre, dpre.sum(dim=0)


def _randn(*shape, device, dtype):
    return torch.randn(*shape, device=device, dtype=dtype)


WORKLOADS: dict[str, Workload] = {
    "lincomb_relu": Workload(lincomb_relu, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), alpha=1.5, beta=0.5),
        "relu(alpha*acc + beta*C)"),
    "bias_gelu_aux": Workload(bias_gelu_aux, lambda M, N, device, dtype: dict(
        bias=_randn(N, device=device, dtype=dtype)),
        "pre = acc + bias[N]; gelu_tanh(pre), pre"),
    "colbcast_leaky": Workload(column_broadcast, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), v=_randn(M, device=device, dtype=dtype), alpha=0.75, beta=2.0),
        "T = acc + v[:,None]; leaky_relu(alpha*T) + beta*C, T"),
    "rowreduce_tanh": Workload(row_reduction, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), alpha=0.5, beta=1.25),
        "D = alpha*acc + tanh(beta*C); D, D.sum(1)"),
    "bce_loss": Workload(bce_loss, lambda M, N, device, dtype: dict(
        C=torch.randint(0, 2, (M, N), device=device).to(dtype), b=_randn(M, device=device, dtype=dtype)),
        "BCE of acc + b[:,None] vs 0/1 labels C, summed to a scalar"),
    "dgelu_bgrad": Workload(dgelu_bgrad, lambda M, N, device, dtype: dict(
        pre=_randn(M, N, device=device, dtype=dtype)),
        "dpre = acc * gelu'(pre); dpre, dpre.sum(0)"),
    "mixed_dag": Workload(mixed_dag, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), aux=_randn(M, N, device=device, dtype=dtype),
        cbias=_randn(M, device=device, dtype=dtype), rbias=_randn(N, device=device, dtype=dtype),
        alpha=1.5, beta=-0.5),
        "CUTLASS EVT DAG: aux load, row/col broadcasts, amax over M and N, 4 outputs"),
}


def bench_workload(name: str) -> tuple[Callable, Callable]:
    """(epilogue function, make_inputs) of a bench row's workload: one of WORKLOADS, or ``identity`` (the plain
    GEMM, no inputs)."""
    if name == "identity":
        return identity, lambda M, N, device, dtype: {}
    return WORKLOADS[name].fn, WORKLOADS[name].make_inputs


SHAPES: tuple[tuple[int, int, int], ...] = ((8192, 8192, 4096), (8192, 4096, 1024))
IDENTITY_SIZES: tuple[int, ...] = (8192, 4096, 2048, 1024)


def tensor_bytes(*values) -> int:
    """Bytes of every tensor among ``values`` (nested tuples/lists/dicts allowed; numbers count 0)."""
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, (tuple, list)):
            total += tensor_bytes(*v)
        elif isinstance(v, dict):
            total += tensor_bytes(*v.values())
    return total
