"""``evt.linear``: ``F.linear`` with a fused epilogue.

    y = evt.linear(x, weight, F.gelu, bias)      # == F.gelu(F.linear(x, weight, bias)), one fused kernel

x may have any leading dims (flattened to M), weight is (N, K) as in ``F.linear`` (passed as the GEMM's
column-major B, so its gradient comes back row-major without a copy). The epilogue receives
``acc + bias`` (the accumulator already biased, in fp32) and any extra keyword ``inputs``; outputs that walk the
rows (M) get x's leading dims back. Differentiable, compilable and autocast-aware like ``evt.gemm`` (it always
runs as ``torch.ops.evtorch.gemm``).
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Callable

import torch

from ..errors import EpilogueTypeError, ShapeError
from ..frontend.signature import check_dense, check_hashable, check_keywords, epilogue_params, signature_of
from ..ir.types import FLOAT_DTYPES
from ..runtime import knobs
from .dispatch import autocast_dtype, check_transforms, resolve_deterministic, transforms_active

BIAS = "linear_bias"


@functools.lru_cache(maxsize=256)
def linear_epilogue(fn: Callable | None, has_bias: bool) -> Callable:
    """The GEMM epilogue of ``linear(x, w, fn, bias)``: ``fn(acc + bias, **inputs)`` (one object per (fn, bias))."""
    extra = _extra_params(fn)
    if BIAS in [p.name for p in extra]:
        raise EpilogueTypeError(f"evt.linear: the epilogue may not have a parameter named {BIAS!r}")

    def epilogue(acc, **kw):
        bias = kw.pop(BIAS, None)
        x = acc + bias if bias is not None else acc
        return fn(x, **kw) if fn is not None else x

    P = inspect.Parameter
    params = [P("acc", P.POSITIONAL_OR_KEYWORD)] + ([P(BIAS, P.POSITIONAL_OR_KEYWORD)] if has_bias else [])
    params += extra
    epilogue.__signature__ = inspect.Signature(params)
    epilogue.__name__ = epilogue.__qualname__ = f"linear_{getattr(fn, '__name__', 'epilogue')}" if fn else "linear"
    return epilogue


def _extra_params(fn) -> list:
    """The keyword inputs of an epilogue after its first parameter; builtins such as F.gelu or torch.tanh,
    which have no inspectable signature, are taken as unary."""
    if fn is None:
        return []
    try:
        signature_of(fn)
    except (TypeError, ValueError):
        return []
    epilogue_params(fn)  # the usual checks (no *args, no reserved names)
    return list(signature_of(fn).parameters.values())[1:]


def linear(x: torch.Tensor, weight: torch.Tensor, fn: Callable | None = None, bias: torch.Tensor | None = None,
           *, out_dtype=None, backend=None, deterministic=None, allow_tf32=False, policy="save", **inputs):
    """``fn(F.linear(x, weight, bias), **inputs)`` as one fused GEMM, for x of any leading dims flattened into rows.

    Args:
        x: (..., K). weight: (N, K). bias: (N,) or None.
        fn: an epilogue ``fn(y, **inputs)`` receiving the biased fp32 accumulator, or None (plain linear). y is the
            (rows, N) matrix, rows the product of x's leading dims: outputs whose first dim walks the rows get
            x's leading dims back; ``y.sum(dim=0)`` sums every row (all tokens of a (batch, tokens, K) x) and
            ``dim=-1`` the features; inputs shaped like the output are (rows, N). For a 2-D x this is exactly
            ``fn(F.linear(x, weight, bias))``; for a 3-D x whose epilogue must see (batch, tokens, N), use
            ``evt.gemm(x, weight.T, ...)`` (the batched GEMM).
        policy: "save" (keep what the backward needs) or "recompute" (recompute ``x @ weight.T`` in the backward).
        Other options as in ``evt.gemm``.
    """
    from .function import _calls, _eager_call, fused_gemm
    if fn is not None and not callable(fn):
        raise EpilogueTypeError(f"evt.linear: fn (the epilogue) must be a function or None, got {type(fn).__name__}")
    check_hashable(fn, "evt.linear: fn")
    deterministic = resolve_deterministic(deterministic, "evt.linear: deterministic")
    if transforms_active() and not torch.compiler.is_compiling():
        check_transforms("evt.linear", (x, weight, bias, *inputs.values()), backend)
    if bias is not None:
        inputs[BIAS] = bias
    if not torch.compiler.is_compiling():
        # eager: prepared once per call signature (see function.fused_gemm); x and weight go into the fused
        # operator as they are (the reshape and transpose happen inside it: no view nodes in the autograd graph)
        try:
            key = ("linear", fn, bias is not None, torch.is_grad_enabled(), autocast_dtype(x.device.type),
                   x.shape, x.stride(), x.dtype, x.device, x.requires_grad,
                   weight.shape, weight.stride(), weight.dtype, weight.device, weight.requires_grad,
                   out_dtype, backend, deterministic, allow_tf32, policy, knobs.trace_knobs_text(),
                   *[(name, v.shape, v.stride(), v.dtype, v.device, v.requires_grad) if isinstance(v, torch.Tensor)
                     else (name, type(v)) for name, v in inputs.items()])
            call = _calls.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks below say so
            key = call = None
        if call is None:
            _check(x, weight, bias)
            _check_inputs(fn, inputs)  # (eager: here; compiled: in function._plan)
            _check_flattening(fn, x, weight, bias, inputs)
            lead = tuple(x.shape[:-1])
            M = math.prod(lead)
            a_steps = () if x.dim() == 2 else (("reshape", (M, x.shape[-1])),)
            call = _eager_call(key, _apply(x, a_steps), weight.t(), ("linear", fn, bias is not None), lead,
                               inputs, raw=((x, a_steps), (weight, (("permute", (1, 0)),))), out_dtype=out_dtype,
                               backend=backend, deterministic=deterministic, allow_tf32=allow_tf32, policy=policy)
        return call(x, weight, inputs)
    # compiled: the keyword inputs are checked in the plan's construction (function._plan, out of Dynamo's sight:
    # torch 2.11's Dynamo cannot trace inspect.signature of a builtin such as F.gelu, found on the H200 2026-11-29)
    _check(x, weight, bias)
    _check_flattening(fn, x, weight, bias, inputs)
    lead = tuple(x.shape[:-1])
    A = x.reshape(-1, x.shape[-1])
    return fused_gemm(A, weight.t(), ("linear", fn, bias is not None), out_dtype=out_dtype, backend=backend,
                      deterministic=deterministic, allow_tf32=allow_tf32, policy=policy, _lead_dims=lead, **inputs)


def _check(x, weight, bias) -> None:
    """F.linear's own rules, named in its terms (x, weight, bias, in/out_features) before the GEMM's checks would
    name A, B and an epilogue input."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise EpilogueTypeError("evt.linear: x and weight must be tensors")
    for name, t in (("x", x), ("weight", weight)):  # in F.linear's names, not the GEMM's A and B
        check_dense(t, f"evt.linear: {name}", name)
        if t.dtype not in FLOAT_DTYPES:
            raise EpilogueTypeError(f"evt.linear: {name} has dtype {t.dtype}; expected float16, bfloat16, float32 "
                                    "or float64")
    if weight.dim() != 2:
        raise ShapeError(f"evt.linear: weight must be (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"evt.linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}: the last dim "
                         f"of x must be in_features = {weight.shape[1]}")
    if x.dtype != weight.dtype and autocast_dtype(x.device.type) is None:
        raise EpilogueTypeError(f"evt.linear: x is {x.dtype} and weight {weight.dtype}; they must have the same "
                                f"dtype, as in F.linear (cast one, e.g. x.to({weight.dtype}), or run under "
                                "torch.autocast)")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise EpilogueTypeError(f"evt.linear: bias must be a tensor or None, got {type(bias).__name__}")
        if bias.dtype != weight.dtype and autocast_dtype(x.device.type) is None:
            # F.linear refuses it; the fused call ran and returned weight's dtype (found 2026-11-29)
            raise EpilogueTypeError(f"evt.linear: bias is {bias.dtype} and weight {weight.dtype}; they must have the "
                                    f"same dtype, as in F.linear (cast one, e.g. bias.to({weight.dtype}))")
        out = (*x.shape[:-1], weight.shape[0])
        try:
            fits = tuple(torch.broadcast_shapes(bias.shape, out)) == out
        except RuntimeError:
            fits = False
        if not fits:
            raise ShapeError(f"evt.linear: bias has shape {tuple(bias.shape)}; expected (out_features,) = "
                             f"({weight.shape[0]},), weight's first dim (or a shape that broadcasts to the output "
                             f"{out}, as F.linear takes)")


def _check_inputs(fn, names) -> None:
    """The keyword inputs' ``names`` against the user's epilogue, in its own names: the GEMM's check would list the
    bias the wrapper passes (``linear_bias``) among the inputs to give. Without an epilogue (``fn=None``, the
    plain linear) there is nothing to take them: ``evt.linear(x, w, None, scale=2.0)`` (or ``outputs=[0]``, an
    evt.gemm option evt.linear has not) ran and ignored them (found by a probe 2026-11-29)."""
    extra = [k for k in names if k != BIAS]
    if fn is None:
        if extra:
            raise EpilogueTypeError(f"evt.linear: got keyword input(s) {', '.join(map(repr, extra))} but no epilogue "
                                    "(fn=None, the plain linear) to take them; pass fn, e.g. "
                                    "evt.linear(x, weight, fn, bias, **inputs) with fn(y, **inputs)")
        return
    try:
        check_keywords(fn, {k: None for k in extra})
    except EpilogueTypeError as e:
        raise EpilogueTypeError(f"evt.linear: {e}") from None


def _check_flattening(fn, x, weight, bias, inputs) -> None:
    """A clear error for an epilogue written for x's own dims, which the flattened rows cannot take.

    The fused GEMM runs on x as a (rows, K) matrix, rows the product of x's leading dims, and the epilogue sees y
    as that (rows, N) matrix: outputs whose first dim walks the rows get x's leading dims back, a reduction with
    ``dim=0`` runs over every row (``tests/test_integration.py::test_linear_epilogue_with_inputs_and_row_outputs``),
    ``dim=-1`` over the features. An input shaped like the N-D output, (..., N), does not broadcast against the
    (rows, N) matrix; evaluated on meta tensors (shapes only, once per call signature), such an epilogue gets an
    error that says why instead of the tracer's shape mismatch. The flattened call is evaluated first and, where it
    runs, alone (one meta evaluation per call signature); x's own dims only where it fails. An epilogue that
    cannot run on meta tensors either way is left to the trace."""
    if fn is None or x.dim() == 2:
        return
    lead, n = tuple(x.shape[:-1]), weight.shape[0]
    rows = math.prod(lead)

    def meta(v):
        return torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v

    kw = {k: meta(v) for k, v in inputs.items() if k != BIAS}
    b = meta(bias) if bias is not None else 0.0
    try:  # what the trace will see: nothing to say where it runs (one evaluation in the common case)
        fn(torch.empty(rows, n, device="meta") + b, **kw)
        return
    except Exception as e:  # noqa: BLE001
        flat_error = e
    try:  # written for x's own dims?
        fn(torch.empty(*lead, n, device="meta") + b, **kw)
    except Exception:  # noqa: BLE001 - evtorch-only helpers (evt.row_index) or a bad call: the trace reports it
        return
    raise ShapeError(f"evt.linear: x has {x.dim()} dims {tuple(x.shape)}; the fused GEMM flattens its leading "
                     f"dims into {rows} rows and the epilogue sees y as ({rows}, {n}), where it fails "
                     f"({type(flat_error).__name__}: {str(flat_error).splitlines()[0][:200]}): inputs shaped like "
                     f"the output must be ({rows}, {n}) (reshape them)") from None


def _apply(t, steps):
    for method, arg in steps:
        t = getattr(t, method)(arg)
    return t
