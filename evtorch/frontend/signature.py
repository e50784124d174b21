"""Reading an epilogue's signature and classifying call arguments into input specs.

The first parameter is the accumulator; the others are keyword inputs. Their values decide their specs:
a tensor (shape, dtype) or a Python number (a runtime scalar: a new value never recompiles).
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from ..errors import EpilogueError, EpilogueTypeError
from ..ir.types import SUPPORTED_DTYPES
from .tracer import InputSpec

#: keyword names ``evt.gemm`` uses for itself; an epilogue parameter may not be called so
RESERVED = frozenset({"out_dtype", "backend", "deterministic", "allow_tf32", "outputs", "config"})


class Spec:
    """A placeholder for ``evt.trace``: ``evt.spec((M, N), torch.float16)`` stands for a tensor of that shape."""

    def __init__(self, shape, dtype=torch.float32):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype

    def __repr__(self):
        return f"spec({self.shape}, {self.dtype})"


def spec(shape, dtype=torch.float32) -> Spec:
    return Spec(shape, dtype)


def signature_of(fn: Callable) -> inspect.Signature:
    """An epilogue's signature: an ``nn.Module``'s is its ``forward``'s (``Module.__call__`` reads ``*args,
    **kwargs``, which was refused as such, found 2026-11-29)."""
    if isinstance(fn, torch.nn.Module):
        return inspect.signature(fn.forward)
    return inspect.signature(fn)


def check_hashable(fn, what: str) -> None:
    """Refuse an unhashable epilogue ``fn`` by name (``what``: the caller's spelling of it): the differentiable and
    compiled paths key their plans by the epilogue object, and evt.linear its wrapper epilogue (a raw
    "unhashable type" before, found 2026-11-29). Not while Dynamo traces: torch 2.11's Dynamo cannot trace
    ``hash`` of a function (a fullgraph ``torch.compile`` of ``evt.linear`` failed on it, found on the H200
    2026-11-29; 2.13's can), nor construct this error. Under ``torch.compile`` an unhashable epilogue is refused
    by Dynamo (torch 2.13: "unhashable type", or an Unsupported from the plan's constant folding with
    ``fullgraph=True``)."""
    if torch.compiler.is_compiling():
        return
    try:
        hash(fn)
    except TypeError:
        raise EpilogueTypeError(f"{what} is an unhashable {type(fn).__name__}; evtorch keys its plans by the epilogue "
                                "object: pass a function, a bound method, or an object that defines __hash__ (e.g. "
                                "@dataclass(frozen=True))") from None


def epilogue_params(fn: Callable) -> tuple[str, list[str]]:
    """(accumulator parameter name, keyword input names) of an epilogue function."""
    try:
        params = list(signature_of(fn).parameters.values())
    except (TypeError, ValueError):
        if callable(fn):  # a builtin such as torch.tanh: unary, as evt.linear and nn.Linear take it
            return "acc", []
        raise EpilogueTypeError(f"epilogue {fn!r} is not callable; pass a Python function") from None
    if not params:
        raise EpilogueTypeError(f"epilogue {getattr(fn, '__name__', fn)} takes no parameters; its first parameter "
                                "receives the accumulator acc = A @ B")
    fname = getattr(fn, "__name__", "epilogue")
    if params[0].kind == params[0].KEYWORD_ONLY:
        raise EpilogueTypeError(f"epilogue {fname}'s first parameter {params[0].name!r} is keyword-only; it receives "
                                f"the accumulator acc = A @ B positionally: def {fname}({params[0].name}, ...)")
    for p in params[1:]:
        if p.kind == p.POSITIONAL_ONLY:
            raise EpilogueTypeError(f"epilogue {fname}'s input {p.name!r} is positional-only; inputs are passed by "
                                    "keyword (evt.gemm(A, B, fn, name=value)): drop the '/'")
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise EpilogueTypeError(f"epilogue parameter *{p.name} / **{p.name} is not supported; name every input")
        if p.name in RESERVED:
            raise EpilogueError(f"epilogue parameter {p.name!r} clashes with an evt.gemm option "
                                f"({', '.join(sorted(RESERVED))}); rename it")
    return params[0].name, [p.name for p in params[1:]]


def check_keywords(fn: Callable, given: dict) -> list[str]:
    """The input names, after checking ``given`` names exactly the epilogue's keyword parameters (or their
    defaults cover the rest)."""
    _, names = epilogue_params(fn)
    params = signature_of(fn).parameters if names else {}  # a builtin (no signature) takes no inputs
    missing = [n for n in names if n not in given and params[n].default is inspect.Parameter.empty]
    unexpected = [n for n in given if n not in names]
    fname = getattr(fn, "__name__", "epilogue")
    if missing:
        raise EpilogueTypeError(f"{fname}() is missing keyword input(s) {', '.join(map(repr, missing))}; "
                                f"it takes {', '.join(names) or 'no inputs'}")
    if unexpected:
        raise EpilogueTypeError(f"{fname}() got unexpected keyword input(s) {', '.join(map(repr, unexpected))}; "
                                f"it takes {', '.join(names) or 'no inputs'}")
    return names


def check_dense(value, what: str, expr: str) -> None:
    """Refuse a sparse (or other non-strided) tensor ``value``, named ``what``, suggesting ``expr.to_dense()``: a
    kernel's pointer arithmetic and torch's row views need strides (a sparse input failed in ``aten::as_strided``,
    a sparse operand inside the GEMM). For evt.gemm's operands and inputs and evt.scan's."""
    if isinstance(value, torch.Tensor) and value.layout != torch.strided:
        raise EpilogueTypeError(f"{what} is a {value.layout} tensor; expected a dense (torch.strided) one: pass "
                                f"{expr}.to_dense()")


def input_spec(name: str, value) -> InputSpec:
    if isinstance(value, int) and not isinstance(value, bool) and not -2 ** 63 <= value < 2 ** 63:
        raise EpilogueTypeError(f"input {name!r} is the int {value}, outside int64 (the kernel's integer scalars); "
                                "pass a float or a value in [-2**63, 2**63)")
    if isinstance(value, bool) or isinstance(value, int) and not isinstance(value, bool):
        return InputSpec(name, "number", dtype=torch.bool if isinstance(value, bool) else torch.int64)
    if isinstance(value, float):
        return InputSpec(name, "number", dtype=torch.float32)
    check_dense(value, f"input {name!r}", name)
    if isinstance(value, (torch.Tensor, Spec)):
        dtype = value.dtype
        if dtype.is_complex or dtype not in SUPPORTED_DTYPES:
            raise EpilogueTypeError(f"input {name!r} has dtype {dtype}, which is not supported; expected a float "
                                    "(float16, bfloat16, float32, float64), integer or bool tensor")
        return InputSpec(name, "tensor", tuple(value.shape), dtype)
    kind = type(value).__name__ if type(value).__module__ == "builtins" else \
        f"{type(value).__module__}.{type(value).__qualname__}"
    hint = f" (a NumPy number: pass {name}={'float' if 'float' in kind else 'int'}(...))" \
        if type(value).__module__ == "numpy" else ""
    raise EpilogueTypeError(f"input {name!r} is a {kind}; expected a tensor, an evt.spec(...) placeholder or a "
                            f"Python number{hint}")
