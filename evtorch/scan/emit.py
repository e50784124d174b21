"""Shared pieces of scan code generation: Triton expressions for IR nodes, and lane addressing.

Values are held in the *compute dtype* (float32, float64 for float64 scans) from the moment they are loaded:
a scan accumulates in float32 where eager would round each step to bf16 (the issue's "accumulate fp32 where
the op allows"); only explicit casts in the body (``.to(torch.bfloat16)``) and stores round. Integer and bool
values keep their dtype. Emissions come from the op registry (``tl.*`` and ``tlmath.*`` only, never
libdevice), so every generated kernel also runs in the Triton interpreter.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ops import REGISTRY
from ..ops.registry import BOOL_ONLY, CAST, COMPARE
# one spelling of dtypes, constants and ops in generated code
from ..codegen.expr import TL_DTYPE as TL, format_op, literal
from . import lanes as LN

HEADER = '''import triton
import triton.language as tl

from evtorch.codegen import tlmath
'''


class Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = ""):
        self.lines.append(("    " * self.depth + line) if line else "")

    @contextmanager
    def indent(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def held(dtype, compute):
    return compute if dtype.is_floating_point else dtype


def convert(value, compute) -> str:
    expr, dtype = value
    if dtype == "const" or dtype == compute:
        return expr
    return f"{expr}.to({TL[compute]})"


def compute_expr(n: Node, operands: list, compute, exact: bool = False) -> tuple[str, object]:
    """(expression, held dtype) of compute node ``n`` from operand (expression, held dtype) pairs. ``exact``: ops
    with an exact GPU form (``OpDef.triton_gpu``: tanh's values in fewer instructions, eager's pow) use it where it
    serves ``compute`` (``OpDef.gpu_form_serves``)."""
    op = REGISTRY[n.target]
    if op.has(CAST):
        target = n.attrs["dtype"]
        expr, dtype = operands[0]
        if target == torch.bool:
            return f"({expr} != 0)", torch.bool
        if dtype == target or (target.is_floating_point and dtype == compute and
                               torch.finfo(target).bits >= torch.finfo(compute).bits):
            return expr, dtype
        return f"{expr}.to({TL[target]})", target
    floating = n.dtype.is_floating_point
    operands = wrap_int_constants(n, operands)
    if op.has(BOOL_ONLY):
        conv = [e for e, _ in operands]
    elif op.has(COMPARE):
        any_float = any(d == "const" or (d != "const" and d.is_floating_point) for _, d in operands)
        conv = [convert(v, compute) if any_float and v[1] != "const" and v[1].is_floating_point else v[0]
                for v in operands]
    elif n.target == "where":
        conv = [operands[0][0]] + [convert(v, compute) if floating else v[0] for v in operands[1:]]
    else:
        conv = [convert(v, compute) if floating else v[0] for v in operands]
    emission = "exact" if exact and op.gpu_form_serves(compute) else None
    return format_op(op, n.attrs, conv, compute, emission), (compute if floating else n.dtype)


def wrap_int_constants(n: Node, operands: list) -> list:
    """``operands`` with each Python-int constant of an integer op wrapped into the op's integer dtype, as eager
    converts the scalar (``uint8 + -1`` adds 255, ``int32 + 2**40`` adds 0, ``int32 > 2**32 + 1`` compares with 1).
    Bare, Triton refused them on the scan's tiles: ``Scalar 1099511627776 is out of range for type int32``,
    ``Cannot perform a binary operation between an unsigned tensor and a negative scalar`` (an InterpreterError on
    the CPU, a compile error on a GPU; found by a probe, 2026-11-29), where the reference backend ran. The dtype is
    the op's result (arithmetic, ``where``) or, for a comparison, its operands' promoted integer dtype."""
    held_types = [d for _, d in operands if d != "const"]
    if not held_types or any(d.is_floating_point for d in held_types):
        return operands
    dtype = n.dtype
    if dtype == torch.bool:  # a comparison: eager converts the scalar to the tensor operands' dtype
        dtype = held_types[0]
        for d in held_types[1:]:
            dtype = torch.promote_types(dtype, d)
    if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
        return operands
    bits = torch.iinfo(dtype).bits
    out = []
    for a, v in zip(n.args, operands):
        if v[1] == "const" and isinstance(a.target, int) and not isinstance(a.target, bool):
            w = a.target % (1 << bits)
            if dtype.is_signed and w >= 1 << (bits - 1):
                w -= 1 << bits
            v = (repr(w), "const")
        out.append(v)
    return out


def emit_graph(w: Writer, graph: Graph, leaf_value, compute, prefix: str, exact: bool = False) -> dict:
    """Assign every compute node of ``graph`` to a variable; returns id(node) -> (expression, held dtype).
    ``exact``: the exact GPU forms (``compute_expr``), for a kernel that runs on a GPU."""
    values, count = {}, 0
    for n in graph.nodes:
        if n.op == "input":
            values[id(n)] = leaf_value(n)
        elif n.op == "const":
            values[id(n)] = (literal(n.target, compute), "const")
        elif n.op == "compute":
            expr, dtype = compute_expr(n, [values[id(a)] for a in n.args], compute, exact)
            name = f"{prefix}{count}"
            count += 1
            w(f"{name} = {expr}")
            values[id(n)] = (name, dtype)
    return values


def as_held(value, dtype, compute, shape_expr: str) -> str:
    """An output value as a full tile of its register dtype (constants are broadcast)."""
    expr, have = value
    want = held(dtype, compute)
    if have == "const":
        return f"tl.full({shape_expr}, {expr}, {TL[want]})"
    return expr if have == want else f"{expr}.to({TL[want]})"


# ---------------------------------------------------------------------------------------------- addressing
def row_size(shape) -> int:
    return math.prod(shape)


def strides(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))


def lane_offset(lane_map, src_shape, out_shape, idx_names: set, lanes: str = "lanes") -> str:
    """Element offset inside a source row (contiguous) read by a leaf, in terms of the out multi-index."""
    if LN.is_identity(lane_map, src_shape, out_shape):
        return lanes
    st = strides(src_shape)
    const, terms = 0, []
    for d, (e, off, step) in enumerate(lane_map):
        const += st[d] * off
        if e >= 0 and step != 0:
            idx_names.add(e)
            coef = st[d] * step
            terms.append(f"i{e}" if coef == 1 else f"{coef} * i{e}")
    if not terms:
        return f"({lanes} * 0 + {const})"  # every lane reads one element: still a vector of addresses
    return " + ".join(terms + ([str(const)] if const else []))


def emit_lane_index(w: Writer, idx_names: set, shape, lanes: str = "lanes"):
    """i<e> = the out multi-index of flat lane ``lanes`` over row ``shape``."""
    st = strides(shape)
    for e in sorted(idx_names):
        expr = lanes if st[e] == 1 else f"({lanes} // {st[e]})"
        if e > 0:
            expr = f"{expr} % {shape[e]}"
        w(f"i{e} = {expr}")
