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
import torch.autograd.forward_ad as _fwad

from ..errors import EpilogueTypeError

try:  # torch-private (2.0 to 2.13 at least): without them the transform checks below are skipped, never errors
    from torch._C._functorch import TransformType as _Transform
    from torch._C._functorch import get_unwrapped as _unwrap
    from torch._C._functorch import is_batchedtensor as _is_batched
    from torch._C._functorch import is_functorch_wrapped_tensor as _is_wrapped
    from torch._C._functorch import peek_interpreter_stack as _peek_transform
except ImportError:  # pragma: no cover - a torch that moved them
    _Transform = None

    def _peek_transform():
        return None


def _vmapped(t) -> bool:
    """Whether tensor ``t`` is batched by a ``torch.vmap`` at any level under the transforms wrapping it: a vmap
    outside another transform (``vmap(jvp(f))``) is not the innermost one, and went unnoticed (torch's raw "vmap:
    inplace arithmetic" error from the reference executor, found by a probe 2026-11-29). ``jacfwd``'s vmap batches
    the tangents only, not the primal this sees."""
    while isinstance(t, torch.Tensor):
        if _is_batched(t):
            return True
        if not _is_wrapped(t):
            return False
        t = _unwrap(t)
    return False

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


def resolve_deterministic(value, what: str = "deterministic") -> bool:
    """A call's ``deterministic`` option: ``None`` (every entry point's default) follows
    ``torch.use_deterministic_algorithms``, as torch's own kernels do, so a user who asks torch for bit-identical
    runs gets them from evtorch's atomic reductions and parallel scans too (they combined in arrival order whatever
    the flag said until 2026-11-29, when a scan's gradient differed between two runs on the H200). ``what``: the
    parameter's name in the caller's error."""
    if value is None:
        return torch.are_deterministic_algorithms_enabled()
    if not isinstance(value, bool):
        raise EpilogueTypeError(f"{what} must be True, False or None (None follows "
                                f"torch.use_deterministic_algorithms), got {value!r}")
    return value


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The lower-precision dtype of an enabled ``torch.autocast`` on ``device_type`` (None when disabled)."""
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


_AUTOCAST_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


def autocast_target(dtype: torch.dtype, low: torch.dtype | None) -> torch.dtype | None:
    """The dtype a GEMM operand of ``dtype`` is cast to under an autocast to ``low`` (None: left as it is). As
    ``torch.autocast`` casts ``torch.matmul``'s and ``F.linear``'s operands: every float32, float16 and bfloat16
    operand goes to the autocast dtype, float64 (and anything else) is left alone. (Casting only float32 operands
    refused a bfloat16 x with a float32 weight, or a float16 A with a bfloat16 B, that eager autocast runs.)"""
    return low if low is not None and dtype != low and dtype in _AUTOCAST_ELIGIBLE else None


def transforms_active() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp), a forward-mode AD level or ``torch.jit.trace`` is active
    (cheap: checked on every call before ``check_transforms``)."""
    return getattr(_fwad, "_current_level", -1) >= 0 or _peek_transform() is not None or torch._C._is_tracing()


def func_grad_active() -> bool:
    """Whether the innermost torch.func transform is grad / vjp / jacrev (whose autograd.Functions need a
    ``setup_context``; evt.scan then differentiates through its step-by-step torch ops instead)."""
    top = _peek_transform()
    return top is not None and top.key() == _Transform.Grad


def check_transforms(what: str, tensors, backend: str | None, vmap_on_reference: bool = False,
                     grad: bool = True) -> None:
    """Refuse the transforms a call cannot honour with a clear error, instead of a crash inside torch or, worse,
    results without their tangents: ``torch.jit.trace`` (on the reference backend evt.scan's torch ops trace),
    ``torch.vmap`` (the kernels take real storage), ``torch.func.grad`` / ``vjp``
    / ``jacrev`` (the autograd Functions have no ``setup_context``), and on the Triton backend forward-mode AD
    (``torch.func.jvp``, dual tensors: the kernel's outputs would come back without tangents). The reference
    backend runs torch ops, which carry forward-mode tangents (and, for evt.scan, vmap's batch dim). ``backend``
    as the caller was given it: None is the device's default, triton for CUDA ``tensors[0]``."""
    from ..errors import EpilogueError
    triton = backend == "triton" or (backend is None and getattr(tensors[0], "is_cuda", False))
    if torch._C._is_tracing() and (triton or not vmap_on_reference):
        # sizes arrive as traced tensors (the runtime's size checks, the reference executor's output strides
        # failed deep inside with 'must be a non-negative int' or a setStorage out-of-bounds error) and a kernel
        # launch is not recorded (the traced program would return its buffers unwritten)
        raise EpilogueError(f"{what} does not support torch.jit.trace" + (
            " on the triton backend: use backend='reference' (its torch ops trace) or torch.compile"
            if vmap_on_reference else ": use torch.compile or torch.export.export, which record the evtorch "
            "operators"))
    top = _peek_transform()  # None where torch has no such stack (then _Transform is None too)
    kind = None if top is None else top.key()
    if kind is not None and (triton or not vmap_on_reference) and (
            kind == _Transform.Vmap or any(_vmapped(t) for t in tensors)):
        raise EpilogueError(f"{what} does not support torch.vmap"
                            + ("; batch the GEMM instead: A of shape (L, M, K) with B (L, K, N) or (K, N)"
                               if what == "evt.gemm" else "") + (" on the triton backend (backend='reference' runs "
                                                                 "under vmap)" if vmap_on_reference else ""))
    if kind is not None and kind == _Transform.Grad and grad:
        raise EpilogueError(f"{what} does not support torch.func.grad / vjp / jacrev: its backward is a torch.autograd"
                            ".Function without setup_context; use torch.autograd.grad or .backward()")
    if triton and ((kind is not None and kind == _Transform.Jvp) or (getattr(_fwad, "_current_level", -1) >= 0 and any(
            isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None for t in tensors))):
        raise EpilogueError(f"{what} does not support forward-mode AD (torch.func.jvp / jacfwd, "
                            "torch.autograd.forward_ad dual tensors) on the triton backend: the kernel's outputs "
                            "would have no tangents. Use backend='reference' or reverse mode")


def wanted(A, B, inputs: dict) -> bool:
    """Whether evt.gemm should run as the differentiable, compilable ``torch.ops.evtorch.gemm``."""
    if torch.compiler.is_compiling():
        return True
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor) or getattr(_state, "inside", False):
        return False
    if torch.is_grad_enabled() and (A.requires_grad or B.requires_grad or any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in inputs.values())):
        return True
    low = autocast_dtype(A.device.type)
    return low is not None and (autocast_target(A.dtype, low) is not None or
                                autocast_target(B.dtype, low) is not None)


def gemm(A, B, epilogue, /, **options):
    global gemm
    from .function import fused_gemm
    gemm = fused_gemm  # (an import per call costs a microsecond)
    return fused_gemm(A, B, epilogue, **options)
