"""Triton expressions for IR compute nodes and constants, shared by the epilogue and vector-stage emitters.

Dtype discipline mirrors eager PyTorch: every IR value is held in its IR dtype (so an fp16 intermediate is
rounded to fp16 exactly where eager rounds it); floating ops compute in the *compute dtype* (fp32, or fp64
for fp64 epilogues), so operands are converted on use and results rounded back when the IR dtype is narrower.
"""
from __future__ import annotations

import math
import struct

import torch

from ..ir.node import Node
from ..ops import REGISTRY
from ..ops.registry import BOOL_ONLY, CAST, COMPARE

TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}


def literal(value, compute: torch.dtype | None = None) -> str:
    """A Triton-source literal for a Python constant. In a float64 computation (``compute``) a float that float32
    cannot hold exactly is a float64 scalar, ``tl.full((), value, tl.float64)``: on an H200 with Triton 3.6 a
    float64 gelu (tanh form) came out 6e-10 off with bare literals and exact with typed ones (2026-11-29; the
    likely culprit is ``tl.fma``, which takes gelu's 0.044715, not isolated), where eager keeps the double and the
    interpreter's Triton 3.9 did too. Other literals stay bare, so float32 kernels read as written."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return repr(value)
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    if compute == torch.float64 and not _float32_exact(value):
        return f"tl.full((), {value!r}, tl.float64)"
    return repr(value)


def _float32_exact(value: float) -> bool:
    """Whether float32 holds ``value`` exactly (beyond its range Triton types a literal float64 itself)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:
        return True


def _convert(expr: str, node: Node, compute: torch.dtype) -> str:
    if node.op == "const":  # a number takes the op's compute dtype, as eager's scalars do (0.1 rounded to float32
        # for a float32 op in a float64 epilogue, whose own constants are float64 scalars)
        return literal(node.target, compute) if isinstance(node.target, float) else expr
    if node.dtype == compute:
        return expr
    return f"{expr}.to({TL_DTYPE[compute]})"


def compute_expr(node: Node, operands: list[str], compute: torch.dtype, emission: str | None = None) -> str:
    """Triton expression computing ``node`` from operand expressions (held in their IR dtypes). ``emission``:
    'fast' uses the op's hardware approximation (``OpDef.triton_fast``), 'exact' its exact GPU form
    (``OpDef.triton_gpu``), where it has one; the caller (``codegen/fastmath.py``'s rule) decides where either is
    acceptable."""
    op = REGISTRY[node.target]
    args = node.args
    compute = op_compute_dtype(node, compute)
    if (emission == "fast" and compute == torch.float64) or (emission == "exact" and not op.gpu_form_serves(compute)):
        emission = None  # approximations are float32's; a GPU form serves the computes its op names
    if op.has(CAST):
        target = node.attrs["dtype"]
        if target == torch.bool:
            return f"({operands[0]} != 0)"
        return f"{operands[0]}.to({TL_DTYPE[target]})"
    if op.has(BOOL_ONLY):
        # a 0-d boolean (a loaded scalar compared) as ``(b != 0)``: Triton's interpreter cannot combine the bare
        # comparison of a loaded scalar with a tile's mask ("ufunc 'bitwise_or' not supported", Triton 3.9); the
        # compiler folds the test away
        conv = [f"({e} != 0)" if not a.axes and a.op == "compute" and len(args) > 1 else e
                for e, a in zip(operands, args)]
    elif op.has(COMPARE):
        floating = any(a.dtype.is_floating_point for a in args)
        conv = [_convert(e, a, compute) if floating else e for e, a in zip(operands, args)]
    elif node.target == "where":
        conv = [operands[0]] + [_convert(e, a, compute) if node.dtype.is_floating_point else e
                                for e, a in zip(operands[1:], args[1:])]
    else:
        conv = [_convert(e, a, compute) if node.dtype.is_floating_point else e for e, a in zip(operands, args)]
    expr = format_op(op, node.attrs, conv, compute, emission)
    if node.dtype.is_floating_point and node.dtype != compute and not op.has(COMPARE):
        expr = f"({expr}).to({TL_DTYPE[node.dtype]})"
    elif node.dtype != torch.bool and not node.dtype.is_floating_point and not op.has(COMPARE) and \
            any(a.dtype != node.dtype or a.op == "const" for a in args):
        # an integer result wraps in its own width, as eager's: int8 + a Python int computed in int64 came back
        # unwrapped (227 for 127 + 100, found 2026-11-29)
        expr = f"({expr}).to({TL_DTYPE[node.dtype]})"
    return expr


def op_compute_dtype(node: Node, epilogue_compute: torch.dtype) -> torch.dtype:
    """The dtype a floating op computes in: eager's, the opmath type of the dtype its operands promote to (float64
    for float64, float32 for float32 and the 16-bit types, which eager computes in float32 and rounds), whatever
    the epilogue's own compute dtype. A float64 value in a float32 epilogue (``acc.double()``, a float64 input)
    computed in float32 lost what the upcast was for; a float32 op in a float64 epilogue computed in float64 took
    an int input or a constant at float64 where eager rounds it to float32 first (both found 2026-11-29)."""
    promoted = _promoted(node)
    if promoted is None or not promoted.is_floating_point:
        return epilogue_compute
    return torch.float64 if promoted == torch.float64 else torch.float32


def _promoted(node: Node) -> torch.dtype | None:
    """The dtype eager computes ``node``'s op in: its result's, but for a comparison its operands' common dtype
    (torch's promotion: a 0-d tensor or a number does not raise a dimensioned operand's dtype within its kind)."""
    op = REGISTRY[node.target]
    if not op.has(COMPARE):
        return node.dtype
    probes = []
    for a in node.args:
        if a.op == "const":
            probes.append(a.target if a.target is not None else 0.0)
        elif a.op == "scalar":  # a Python number input
            probes.append(True if a.dtype == torch.bool else 1.0 if a.dtype.is_floating_point else 1)
        else:
            probes.append(torch.empty((1,) * bool(a.axes), dtype=a.dtype, device="meta"))
    try:
        out = probes[0] if len(probes) == 1 else torch.result_type(probes[0], probes[1])
    except (TypeError, RuntimeError):
        return None
    return out if isinstance(out, torch.dtype) else None


def format_op(op, attrs: dict, operands: list[str], compute: torch.dtype, emission: str | None = None) -> str:
    """``op``'s Triton expression of ``operands`` (expressions already converted as the op needs) with attributes
    ``attrs``: its ``triton`` emission, or with ``emission`` 'fast' / 'exact' its ``triton_fast`` / ``triton_gpu``
    one where it has it. The epilogue's and the scans' emitters hold values differently but format ops here."""
    chosen = {"fast": op.triton_fast, "exact": op.triton_gpu}.get(emission) or op.triton
    template = chosen(**attrs) if callable(chosen) else chosen
    if template is None and chosen is not op.triton:  # a GPU form that has none for these attributes
        template = op.triton(**attrs) if callable(op.triton) else op.triton
    if template is None:
        raise NotImplementedError(f"op {op.name!r} has no Triton emission and no decomposition")
    return template.format(*operands, **{k: literal(v, compute) if isinstance(v, (int, float)) else v
                                         for k, v in attrs.items()})


def converted(expr: str, node: Node, dtype: str) -> str:
    """``expr`` (the value of ``node``) converted to the Triton dtype ``dtype``. A constant is a Python literal in the
    generated source, which has no ``.to`` (a constant output: a zero gradient, a sum of zeros): ``tl.cast``
    takes both."""
    return f"tl.cast({expr}, {dtype})" if node.op in ("const", "scalar") else f"{expr}.to({dtype})"
