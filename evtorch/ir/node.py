"""IR nodes: one typed value of the epilogue DAG.

Opcodes (``Node.op``):

=========  ==========================================  ============================================
op         target                                      attrs
=========  ==========================================  ============================================
acc        -                                           -                 (the fp32 accumulator tile)
input      keyword input name                          binding: per input dim, the axes it walks (or
                                                       MERGED: merged with the next dim)
scalar     keyword input name (a Python number)        -                 (runtime kernel argument)
index      axis name ('M', 'N' or 'L')                 -
const      the Python value                            -
compute    registry op name                            the op's attributes (e.g. negative_slope)
reduce     registry reduction name                     over: the axes reduced
output     output position                             dims: the returned view, kind: tile/vector
=========  ==========================================  ============================================

A node knows its shape class (``axes``: the iteration axes it varies along), ``dtype`` and ``stage``.
Nodes are compared structurally by ``key`` (op, target, attrs, dtype and argument identities), which is
what common-subexpression elimination merges on.
"""
from __future__ import annotations

from typing import Any

import torch

from .types import Stage, axes_str, canonical, dtype_name

OPCODES = ("acc", "input", "scalar", "index", "const", "compute", "reduce", "output")
LEAF_OPS = ("acc", "input", "scalar", "index", "const")


def freeze(value: Any):
    """A hashable, order-stable version of attribute values (dicts, lists, dtypes)."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


class Node:
    __slots__ = ("op", "target", "args", "attrs", "axes", "dtype", "stage", "name", "meta")

    def __init__(self, op: str, target: Any, args: tuple["Node", ...], attrs: dict, axes, dtype: torch.dtype,
                 stage: Stage, name: str = "", meta: dict | None = None):
        assert op in OPCODES, op
        self.op = op
        self.target = target
        self.args = tuple(args)
        self.attrs = dict(attrs)
        self.axes = canonical(axes)
        self.dtype = dtype
        self.stage = stage
        self.name = name
        self.meta = meta or {}

    @property
    def key(self):
        # floats by repr: NaN equals itself, and -0.0 differs from 0.0 (x + 0.0 and x + -0.0 differ)
        target = ("float", repr(self.target)) if isinstance(self.target, float) else self.target
        return (self.op, target, type(self.target).__name__, freeze(self.attrs), self.dtype,
                tuple(id(a) for a in self.args))

    def is_leaf(self) -> bool:
        return self.op in LEAF_OPS

    def format(self) -> str:
        """One line, torch.fx style: ``%t3 : f32[MN] = compute mul(%acc, %alpha)``."""
        head = f"%{self.name} : {dtype_name(self.dtype)}[{axes_str(self.axes)}]"
        if self.stage == Stage.VECTOR:
            head += " vec"
        args = ", ".join(f"%{a.name}" for a in self.args)
        attrs = "".join(f", {k}={_fmt_dims(v) if k == 'dims' else _fmt(v)}" for k, v in self.attrs.items())
        if self.op == "const":
            body = f"const {self.target!r}"
        elif self.op in ("input", "scalar"):
            body = f"{self.op} {self.target}{attrs.replace(', ', ' ', 1) if attrs else ''}"
        elif self.op == "index":
            body = f"index {self.target}"
        elif self.op == "acc":
            body = "acc"
        elif self.op == "output":
            body = f"output[{self.target}]({args}{attrs})"
        else:
            body = f"{self.op} {self.target}({args}{attrs})"
        if "eager_dtype" in self.meta:  # kept in float32 where eager rounds (passes/intermediates.py)
            body += f"  # eager: {dtype_name(self.meta['eager_dtype'])}"
        return f"{head} = {body}"

    def __repr__(self):
        return f"Node({self.format()})"


def _fmt_dims(dims):
    """An output's returned view: '(M,N)', '(N,M)' for a transpose, '(L*M,N)', '1' for size-1 dims."""
    return "(" + ",".join("*".join(axes) or (str(size) if size else "1") for axes, size in dims) + ")"


def _fmt(v):
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, tuple) and all(isinstance(x, tuple) for x in v):
        return "(" + ",".join("".join(x) or "1" for x in v) + ")"
    if isinstance(v, tuple):
        return "(" + ",".join(str(x) for x in v) + ")"
    return repr(v)
