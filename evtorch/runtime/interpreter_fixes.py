"""Corrections to Triton's CPU interpreter that the generated kernels need, applied once when it runs them.

Three of them, all where the GPU compiles the kernels correctly, so only the interpreter is corrected:

- **Casts to and from bfloat16.** Triton 3.9's interpreter holds bfloat16 as uint16 bit patterns and converts
  float64 <-> bfloat16 with numpy's ``astype``, i.e. between float values and those integers (a float64 epilogue
  value stored to a bfloat16 output came back NaN); it truncates float32 to bfloat16 instead of rounding to
  nearest (0.1 became 0.099609375, an ulp under eager's); and integers and bools went to bfloat16 as their values'
  bit patterns too (1 became 9.2e-41); all found 2026-11-29. Conversions to bfloat16 from float32, float64,
  integers and bool, and from bfloat16 to float32 and float64, go through torch's (rounded to nearest even, as
  eager's ``x.to(torch.bfloat16)``).
- **``&``, ``|``, ``^`` of a boolean tile with a loaded 0-d value's comparison**, which the interpreter hands over
  as float data (``apply``, at the fix).
- **Python float arguments.** A compiled kernel receives a float argument as a typed scalar (fp64 where the
  signature says ``tl.float64``, fp32 otherwise); the interpreter handed the kernel the Python float itself, which
  has no ``.to`` and no ``.dtype``: a float64 epilogue's float scalar in a float32 op (``acc + I * s``, I an
  integer tile) failed with "'float' object has no attribute 'to'" (found by a probe 2026-11-29). They are typed
  as the compiled kernel types them (``typed_float_arguments``).

Where the interpreter's classes are not as expected (another Triton), nothing is changed.
"""
from __future__ import annotations

import inspect
import weakref

import numpy as np
import torch

_applied = False
# the numpy dtype a float argument takes in a compiled kernel, by its parameter's normalised annotation (Triton's
# ``_normalize_ty``); an unannotated one is fp32, as ``triton.runtime.jit.mangle_type`` types a Python float
_FLOAT_ARGUMENT = {"fp64": np.float64, "fp32": np.float32, "fp16": np.float16}
_float_types: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    _type_float_arguments(interpreter, tl, handle)


def _type_float_arguments(interpreter, tl, handle) -> None:
    """Make the interpreter's kernel calls pass Python floats as the typed scalars a compiled kernel gets
    (``typed_float_arguments``): ``GridExecutor.__call__`` converts ints, bools and tensors to Triton values but
    leaves a float as it is."""
    executor = getattr(interpreter, "GridExecutor", None)
    call = vars(executor).get("__call__") if executor is not None else None
    if call is None:  # pragma: no cover - another interpreter
        return

    def typed_call(self, *args, **kwargs):
        args, kwargs = typed_float_arguments(self.fn, args, kwargs, tl, handle)
        return call(self, *args, **kwargs)

    executor.__call__ = typed_call


def typed_float_arguments(fn, args: tuple, kwargs: dict, tl, handle) -> tuple[tuple, dict]:
    """``fn``'s arguments with each Python float for a parameter that is not a constexpr made a 0-d Triton value of
    the type a compiled kernel gives it: the parameter's annotation where it is a float type (a float64 epilogue's
    scalars are ``tl.float64``), else fp32 (a value beyond fp32's range becomes inf there, as compiled)."""
    types = _parameter_float_types(fn)
    names = list(types)

    def typed(name, value):
        type_name = types.get(name)
        if type(value) is not float or type_name is None:
            return value
        with np.errstate(over="ignore"):
            data = np.array([value], dtype=np.float64).astype(_FLOAT_ARGUMENT[type_name])
        ty = tl.str_to_ty(type_name, None)
        return tl.tensor(handle(data, ty), ty)

    args = tuple(typed(names[i] if i < len(names) else None, v) for i, v in enumerate(args))
    return args, {k: typed(k, v) for k, v in kwargs.items()}


def _parameter_float_types(fn) -> dict:
    """{parameter: the Triton type a float argument for it takes ('fp64', 'fp32', 'fp16'), None for a constexpr or
    a non-float annotation}, in signature order (cached per function)."""
    hit = _float_types.get(fn)
    if hit is not None:
        return hit
    from triton.runtime.jit import _normalize_ty
    annotations = inspect.get_annotations(fn)
    types = {}
    for name in inspect.signature(fn).parameters:
        ann = annotations.get(name)
        ty = _normalize_ty(ann) if ann is not None else "fp32"
        types[name] = ty if ty in _FLOAT_ARGUMENT else None
    _float_types[fn] = types
    return types
