"""Corrections to Triton's CPU interpreter that the generated kernels need, applied once when it runs them.

Two of them, both where the GPU compiles the kernels correctly, so only the interpreter is corrected:

- **Casts to and from bfloat16.** Triton 3.9's interpreter holds bfloat16 as uint16 bit patterns and converts
  float64 <-> bfloat16 with numpy's ``astype``, i.e. between float values and those integers (a float64 epilogue
  value stored to a bfloat16 output came back NaN); it truncates float32 to bfloat16 instead of rounding to
  nearest (0.1 became 0.099609375, an ulp under eager's); and integers and bools went to bfloat16 as their values'
  bit patterns too (1 became 9.2e-41); all found 2026-11-29. Conversions to bfloat16 from float32, float64,
  integers and bool, and from bfloat16 to float32 and float64, go through torch's (rounded to nearest even, as
  eager's ``x.to(torch.bfloat16)``).
- **``&``, ``|``, ``^`` of a boolean tile with a loaded 0-d value's comparison**, which the interpreter hands over
  as float data (``apply``, at the fix).

Where the interpreter's classes are not as expected (another Triton), nothing is changed.
"""
from __future__ import annotations

import numpy as np
import torch

_applied = False


def apply() -> None:
    """Install the corrections (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - no interpreter in this Triton
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    cast_impl = getattr(builder, "cast_impl", None)
    if builder is None or handle is None or cast_impl is None:  # pragma: no cover - another interpreter
        return

    wide = {tl.float32: torch.float32, tl.float64: torch.float64}

    def fixed_cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if d == tl.bfloat16 and (s in wide or s.is_int() or s.is_bool()):
            data = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.uint16).numpy()
            return handle(data, tl.bfloat16)
        if s == tl.bfloat16 and d in wide:
            bits = torch.from_numpy(np.ascontiguousarray(src.data).view(np.int16))
            return handle(bits.view(torch.bfloat16).to(wide[d]).numpy(), d)
        return cast_impl(self, src, dst_type)

    builder.cast_impl = fixed_cast_impl
    # create_fp_trunc / create_fp_ext are lambdas calling self.cast_impl, so they take the fixed one

    # A comparison of a loaded 0-d value with itself (``b != b``, NaN tests in ``tlmath.maximum``) comes out of the
    # interpreter as float data when broadcast against a tile, and ``|`` with a real boolean tile then failed in
    # numpy ("ufunc 'bitwise_or' not supported", found by the random-DAG gradient test 2026-11-29 on a 0-d float64
    # input of logaddexp). Triton types ``&``, ``|``, ``^`` on integers and booleans only, so float data there is
    # such a comparison: it is read as the boolean it stands for.
    binary_op = getattr(builder, "binary_op", None)
    if binary_op is None:  # pragma: no cover - another interpreter
        return
    logic = (np.bitwise_and, np.bitwise_or, np.bitwise_xor)

    def as_bool(h):
        if h.data.dtype.kind == "f":
            return handle(h.data != 0, tl.int1)
        return h

    def fixed_binary_op(self, lhs, rhs, op):
        if op in logic and np.bool_ in (lhs.data.dtype, rhs.data.dtype):
            lhs, rhs = as_bool(lhs), as_bool(rhs)
        return binary_op(self, lhs, rhs, op)

    builder.binary_op = fixed_binary_op
