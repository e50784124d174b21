"""The source documents' example epilogues, importable by the demo, tests, benchmarks and the selftest.

``EXAMPLES`` maps a name to ``Example(fn, make_inputs)``: ``fn`` is the plain PyTorch epilogue and
``make_inputs(M, N, device, dtype)`` returns fresh random keyword inputs for an (M, N) accumulator::

    import torch, evtorch as evt
    from evtorch.examples import EXAMPLES, operands, eager_reference

    fn, make_inputs = EXAMPLES["column_broadcast"]
    A, B = operands(64, 48, 32, "cpu", torch.float32)
    kw = make_inputs(64, 48, "cpu", torch.float32)
    Z, T = evt.gemm(A, B, fn, **kw)
    Z_ref, T_ref = eager_reference(fn, A, B, **kw)

The first three are CUTLASS's EVT examples (``LinearCombinationEltAct`` with ReLU, ColumnBroadcast,
RowReduction), ``bce_loss`` is a binary cross-entropy loss reduced to a scalar, and ``mixed_dag`` is the DAG
from CUTLASS's Python EVT example (aux load, row and column broadcasts, reductions over both dims, four outputs).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


class Example(NamedTuple):
    fn: Callable
    make_inputs: Callable  # (M, N, device, dtype) -> dict of keyword inputs


def lincomb_relu(acc, C, alpha, beta):
    """CUTLASS LinearCombinationEltAct with ReLU: ``D = relu(alpha * acc + beta * C)``."""
    return torch.relu(alpha * acc + beta * C)


def column_broadcast(acc, C, v, alpha, beta):
    """CUTLASS ColumnBroadcast: a per-row bias ``v`` (M,) broadcast along N, two outputs."""
    T = acc + v[:, None]
    Z = F.leaky_relu(alpha * T, 0.2) + beta * C
    return Z, T


def row_reduction(acc, C, alpha, beta):
    """CUTLASS RowReduction: ``D = alpha * acc + tanh(beta * C)`` and its per-row sum (M,)."""
    D = alpha * acc + torch.tanh(beta * C)
    return D, D.sum(1)


def bce_loss(acc, C, b):
    """Binary cross-entropy of logits ``acc + b[:, None]`` against 0/1 labels ``C``, summed to a scalar."""
    z = acc + b[:, None]
    return ((C - 1) * z + torch.log(torch.clamp(torch.sigmoid(z), 1e-3, 0.999))).sum()


def mixed_dag(acc, C, aux, cbias, rbias, alpha, beta):
    """CUTLASS Python EVT's example DAG: F is used three times, reductions over M and over N."""
    F_ = alpha * acc + (beta * C + aux)
    F_row_max = F_.amax(dim=0)
    E = torch.relu(F_ + 1) + cbias[:, None] + rbias
    E_col_max = E.amax(dim=1)
    D = E + F_
    return D, F_, F_row_max, E_col_max


def _randn(*shape, device, dtype):
    return torch.randn(*shape, device=device, dtype=dtype)


EXAMPLES: dict[str, Example] = {
    "lincomb_relu": Example(lincomb_relu, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), alpha=1.5, beta=0.5)),
    "column_broadcast": Example(column_broadcast, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), v=_randn(M, device=device, dtype=dtype), alpha=0.75, beta=2.0)),
    "row_reduction": Example(row_reduction, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), alpha=0.5, beta=1.25)),
    "bce_loss": Example(bce_loss, lambda M, N, device, dtype: dict(
        C=torch.randint(0, 2, (M, N), device=device).to(dtype), b=_randn(M, device=device, dtype=dtype))),
    "mixed_dag": Example(mixed_dag, lambda M, N, device, dtype: dict(
        C=_randn(M, N, device=device, dtype=dtype), aux=_randn(M, N, device=device, dtype=dtype),
        cbias=_randn(M, device=device, dtype=dtype), rbias=_randn(N, device=device, dtype=dtype),
        alpha=1.5, beta=-0.5)),
}


def operands(M: int, N: int, K: int, device, dtype: torch.dtype, batch: int | None = None):
    """Random GEMM operands A (M, K) and B (K, N), or (batch, M, K) and (batch, K, N), scaled so that acc is O(1)."""
    lead = () if batch is None else (batch,)
    scale = max(K, 1) ** -0.25
    A = (torch.randn(*lead, M, K, device=device) * scale).to(dtype)
    B = (torch.randn(*lead, K, N, device=device) * scale).to(dtype)
    return A, B


def eager_reference(fn: Callable, A: torch.Tensor, B: torch.Tensor, **inputs):
    """What ``evt.gemm(A, B, fn, **inputs)`` must equal: ``fn`` run eagerly on the float32 (float64) product."""
    acc_dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    return fn(torch.matmul(A.to(acc_dtype), B.to(acc_dtype)), **inputs)
