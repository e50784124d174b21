"""When ``evt.gemm`` goes through the ``torch.library`` operator instead of running directly.

It does when autograd needs to see it (an input requires grad), when ``torch.compile`` traces it (the operator
is opaque to Dynamo, so there is no graph break), and under ``torch.autocast`` (the operator casts A and B like
``F.linear``). Inside the operator's own implementation evt.gemm runs directly again.

This module is imported by ``evtorch.api`` and imports nothing heavy at import time.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_state = threading.local()


@contextlib.contextmanager
def running_op():
    """Marks the implementation of an evtorch operator: evt.gemm calls inside run directly."""
    previous = getattr(_state, "inside", False)
    _state.inside = True
    try:
        yield
    finally:
        _state.inside = previous


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The lower-precision dtype of an enabled ``torch.autocast`` on ``device_type`` (None when disabled)."""
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def wanted(A, B, inputs: dict) -> bool:
    """Whether evt.gemm should run as the differentiable, compilable ``torch.ops.evtorch.gemm``."""
    if torch.compiler.is_compiling():
        return True
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor) or getattr(_state, "inside", False):
        return False
    if torch.is_grad_enabled() and (A.requires_grad or B.requires_grad or any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in inputs.values())):
        return True
    return A.dtype == torch.float32 and autocast_dtype(A.device.type) is not None


def gemm(A, B, epilogue, /, **options):
    global gemm
    from .function import fused_gemm
    gemm = fused_gemm  # (an import per call costs a microsecond)
    return fused_gemm(A, B, epilogue, **options)
