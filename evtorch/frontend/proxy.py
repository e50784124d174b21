"""``TracedTensor``: the proxy the user's epilogue runs on.

Operators, Tensor methods and ``torch.*`` / ``torch.nn.functional.*`` calls (through ``__torch_function__``)
on a proxy are forwarded to its ``Tracer``, which looks the op up in the registry and records it. Views
(transpose, permute, reshape, unsqueeze, expand, ``[:, None]``) only change the proxy's dims. Anything that
needs a concrete value (``if x:``, ``int(x)``, ``x.item()``) raises ``TraceControlFlowError``.
"""
from __future__ import annotations

import torch

from ..errors import EpilogueError, TraceControlFlowError, UnsupportedOpError
from ..ir.types import Stage
from . import dims as D

_VIEW_METHODS = {"transpose", "swapaxes", "swapdims", "permute", "t", "unsqueeze", "squeeze", "reshape", "view",
                 "expand", "expand_as", "broadcast_to", "flatten", "contiguous", "clone", "view_as", "reshape_as"}
_CAST_METHODS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64,
                 "bool": torch.bool, "int": torch.int32, "long": torch.int64}


class TracedTensor:
    """A value of the epilogue being traced. ``node`` is its IR node once bound to the iteration axes;
    values computed from keyword inputs alone stay ``pending`` until they meet the accumulator.

    ``order``: the memory order of the value's axes, outermost first, where ``.contiguous()`` laid it out in
    another order than acc's (L, M, N) (``D.CONTIGUOUS_DIMS`` for a pending value: row-major in its dims, axes not
    known yet); None otherwise. An output returned with an order is stored in it (``ir.layouts.output_view``)."""

    __slots__ = ("tracer", "node", "pending", "dims", "dtype", "label", "order")

    def __init__(self, tracer, node, pending, dims, dtype, label=None, order=None):
        self.tracer = tracer
        self.node = node
        self.pending = pending
        self.dims = tuple(dims)
        self.dtype = dtype
        self.label = label
        self.order = order

    # ---------------------------------------------------------------- metadata (static, allowed)
    @property
    def shape(self) -> torch.Size:
        return torch.Size(d.size for d in self.dims)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[D.norm_dim(dim, len(self.dims), "size")]

    def dim(self) -> int:
        return len(self.dims)

    ndim = property(dim)

    def numel(self) -> int:
        return self.shape.numel()

    def __len__(self):
        if not self.dims:
            raise TypeError("len() of a 0-d tensor")
        return self.dims[0].size

    @property
    def device(self):
        return self.tracer.device

    @property
    def is_floating_point(self):
        return lambda: self.dtype.is_floating_point

    @property
    def stage(self) -> Stage | None:
        return self.node.stage if self.node is not None else None

    @property
    def T(self):
        return self.tracer.view(self, "permute", tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.tracer.view(self, "transpose", (-2, -1))

    def __repr__(self):
        return f"TracedTensor({self.label or (self.node.name if self.node else 'pending')}, " \
               f"shape={tuple(self.shape)}, dtype={self.dtype})"

    # ---------------------------------------------------------------- torch dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = _find_tracer(args, kwargs or {})
        return tracer.call_torch(func, args, kwargs or {})

    def __getattr__(self, name):
        tracer = object.__getattribute__(self, "tracer")
        if name in _VIEW_METHODS:
            return lambda *a, **k: tracer.view(self, name, a, k)
        if name in _CAST_METHODS:
            return lambda *a, **k: tracer.cast(self, _CAST_METHODS[name])
        if name == "to":
            return lambda *a, **k: tracer.cast(self, _to_dtype(a, k))
        if name == "type_as":
            return lambda other: tracer.cast(self, other.dtype)
        if name in ("item", "tolist", "numpy", "cpu", "cuda"):
            raise TraceControlFlowError(
                f".{name}() needs the concrete value of a traced tensor, which does not exist while the epilogue "
                "is traced; keep the computation in tensor ops (e.g. torch.where instead of branching)",
                where=tracer.user_frame())
        if name.endswith("_") and not name.startswith("_"):
            raise EpilogueError(f"in-place op .{name}() is not supported in an epilogue: every value is "
                                f"computed once into registers; use the out-of-place .{name[:-1]}()",
                                where=tracer.user_frame())
        op = tracer.registry.by_method.get(name)
        if op is None and name in ("max", "min"):
            return lambda *a, **k: self._max_min(name, a, k)
        if op is None:
            raise UnsupportedOpError(f"Tensor method .{name}() is not supported in an epilogue"
                                     f"{tracer.registry.suggest(name)}", where=tracer.user_frame())
        return lambda *a, **k: tracer.call_op(op, op.method_args(self, a), k, spelled=f".{name}()")

    def _max_min(self, name: str, args, kwargs):
        """``x.max(other)`` is torch.maximum, as in eager (an elementwise maximum was refused with a hint to amax,
        found 2026-11-29); ``x.max()`` / ``x.max(dim)`` return indices too and stay refused."""
        if len(args) == 1 and not kwargs and isinstance(args[0], (TracedTensor, torch.Tensor)):
            op = self.tracer.registry[name + "imum"]
            return self.tracer.call_op(op, (self, args[0]), {}, spelled=f".{name}()")
        raise UnsupportedOpError(f"Tensor method .{name}() is not supported in an epilogue"
                                 f"{self.tracer.registry.suggest(name)}", where=self.tracer.user_frame())

    def __getitem__(self, index):
        return self.tracer.getitem(self, index)

    def __setitem__(self, index, value):
        raise EpilogueError("item assignment (x[...] = v) is an in-place op and is not supported in an epilogue; "
                            "use torch.where", where=self.tracer.user_frame())

    # ---------------------------------------------------------------- Python control flow: refused
    def _no_value(self, what):
        # a 0-d value is most often a number input the user expected to see as a Python number
        scalar = ("; a number input is a runtime value too (one kernel serves every value of it), so branch on it "
                  "before calling evtorch" if not self.dims else "")
        raise TraceControlFlowError(
            f"{what} on a traced tensor: its value is unknown while the epilogue is traced, so Python control "
            f"flow cannot depend on it; use tensor ops such as torch.where(cond, a, b) instead{scalar}",
            where=self.tracer.user_frame())

    def __bool__(self):
        self._no_value("bool() (an `if`, `and`, `or`, `not` or assert)")

    def __int__(self):
        self._no_value("int()")

    def __float__(self):
        self._no_value("float()")

    def __index__(self):
        self._no_value("using it as an index or size")

    def __iter__(self):
        self._no_value("iterating over it")

    def __hash__(self):
        return id(self)


def _to_dtype(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, TracedTensor):
            return a.dtype
    raise EpilogueError(".to() in an epilogue takes a dtype (devices and layouts are decided by evtorch)")


def _binary_method(opname, reverse=False):
    def method(self, other):
        args = (other, self) if reverse else (self, other)
        return self.tracer.call_op(self.tracer.registry[opname], args, {}, spelled=opname)
    return method


def _unary_method(opname):
    return lambda self: self.tracer.call_op(self.tracer.registry[opname], (self,), {}, spelled=opname)


for _name, _op in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("and", "logical_and"),
                   ("or", "logical_or")]:
    setattr(TracedTensor, f"__{_name}__", _binary_method(_op))
    setattr(TracedTensor, f"__r{_name}__", _binary_method(_op, reverse=True))
for _name, _op in [("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne")]:
    setattr(TracedTensor, f"__{_name}__", _binary_method(_op))
for _name, _op in [("neg", "neg"), ("abs", "abs"), ("invert", "logical_not")]:
    setattr(TracedTensor, f"__{_name}__", _unary_method(_op))
TracedTensor.__pos__ = lambda self: self


def _pow(self, exponent):
    return self.tracer.call_op(self.tracer.registry["pow"], (self, exponent), {}, spelled="**")


def _rpow(self, base):
    raise UnsupportedOpError("a number raised to a traced tensor (c ** x) is not supported; write torch.exp(x * "
                             "math.log(c)) or torch.exp2(x) for c == 2", where=self.tracer.user_frame())


TracedTensor.__pow__ = _pow
TracedTensor.__rpow__ = _rpow
for _name in ("iadd", "isub", "imul", "itruediv", "ipow", "iand", "ior"):
    def _inplace(self, other, _n=_name):
        raise EpilogueError(f"in-place operator ({_n[1:]}=) on a traced tensor is not supported; write x = x "
                            "op y", where=self.tracer.user_frame())
    setattr(TracedTensor, f"__{_name}__", _inplace)
for _name in ("floordiv", "rfloordiv", "mod", "rmod", "matmul", "rmatmul", "xor", "rxor", "lshift", "rshift"):
    def _unsupported(self, *a, _n=_name):
        raise UnsupportedOpError(f"operator __{_n}__ is not supported in an epilogue{self.tracer.registry.suggest(_n)}",
                                 where=self.tracer.user_frame())
    setattr(TracedTensor, f"__{_name}__", _unsupported)


def _find_tracer(args, kwargs):
    stack = list(args) + list(kwargs.values())
    while stack:
        a = stack.pop()
        if isinstance(a, TracedTensor):
            return a.tracer
        if isinstance(a, (list, tuple)):
            stack.extend(a)
    raise RuntimeError("no traced tensor among the arguments")
