"""Cross-layer backward fusion: an operand gradient handed to the layer that produced the operand, unmultiplied.

In ``y2 = evt.linear(h, W2, ...)`` with ``h = evt.linear(x, W1, gelu, bias=b1)``, the plain backward computes
``dh = d(acc2) @ W2`` (a GEMM writing an (M, N1) tensor) and then, in layer 1's backward epilogue, reads ``dh``
back to make ``d(acc1) = dh * gelu'(pre1)`` and ``db1 = d(acc1).sum(0)``. Layer 1's backward epilogue only
needs ``dh`` tile by tile, next to values it loads anyway (the saved accumulator, the bias), so it can run as the
epilogue of the GEMM that makes ``dh``: one kernel, and ``dh`` never exists in memory.

The two layers are separate autograd nodes, so the hand-off goes through autograd itself: layer 2's backward
returns, as the gradient of ``h``, a ``DeferredGrad`` — a tensor standing for the product ``X @ Y`` (here
``d(acc2) @ W2``) that has not been computed. Layer 1's backward, receiving it untouched, runs ``X @ Y`` with
its own backward epilogue fused (``EagerBackward``). Anything else that touches the gradient on the way (a hook,
``retain_grad``, a second consumer's gradient being added, ``torch.autograd.grad(..., inputs=h)`` returning it,
a view other than a reshape) gets the product computed on first use through ``__torch_dispatch__``, and layer 1
then sees a computed gradient and takes the unfused path: the hand-off changes where work happens, never a
result. Views by reshape (``evt.linear`` flattening leading dims and restoring them) stay deferred.

Layer 2 hands a deferred gradient only when the operand's producer, through reshapes, is an evtorch node the
engine will run (``producer``), whose backward can take it (``EagerCall.can_fuse``); eager mode only (under
torch.compile the operators' autograd formulas run instead and Inductor schedules the backward).
Fusing is not always faster: the epilogue joins the GEMM after its main loop, not overlapped with it, which can
cost more than the separate memory-bound pass (measured on an H200 for GELU and ReLU MLP blocks). The consumer
decides per signature (``EagerBackward.choose``): on a GPU with autotuning it times both (fused GEMM; product GEMM
+ epilogue-only pass) once; without timing it computes the product; on the CPU it fuses.
``EVTORCH_FUSE_BACKWARD`` = auto (default) / always / never (0).
``STATS`` counts fused and materialized hand-offs.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils._pytree import tree_map_only

from ..runtime import knobs

aten = torch.ops.aten
_environ_get, (_FUSE_KEY,) = knobs.raw_reader(knobs.FUSE_BACKWARD)

#: hand-offs fused into the producer's backward GEMM / computed because something else needed the value
STATS = {"fused": 0, "materialized": 0}

# autograd nodes of reshapes between a producer's output and the consumer's operand
_RESHAPE_NODES = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0"})
# ops on a deferred gradient that stay deferred (the product's shape changes, nothing is computed)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.alias.default, aten.detach.default)


class _Product:
    """``X @ Y``, computed at most once by ``run(X, Y)``."""

    __slots__ = ("X", "Y", "run", "value", "shape")

    def __init__(self, X: torch.Tensor, Y: torch.Tensor, run: Callable):
        self.X, self.Y, self.run, self.value = X, Y, run, None
        self.shape = tuple(X.shape[:-1]) + (Y.shape[-1],)

    def compute(self) -> torch.Tensor:
        if self.value is None:
            STATS["materialized"] += 1
            self.value = self.run(self.X, self.Y)
            self.X = self.Y = None
        return self.value


class DeferredGrad(torch.Tensor):
    """A gradient equal to ``(X @ Y).reshape(shape)`` whose product has not been computed yet.

    Any torch operation on it (other than a reshape) computes the product and operates on the result, so it
    behaves like the plain tensor everywhere; ``take(shape)`` hands the factors to a consumer that fuses the
    product into its own kernel instead."""

    _product: _Product

    @staticmethod
    def __new__(cls, product: _Product, shape):
        X = product.X
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=X.dtype, device=X.device,
                                                requires_grad=False)
        t._product = product
        return t

    @classmethod
    def of_product(cls, X: torch.Tensor, Y: torch.Tensor, run: Callable) -> "DeferredGrad":
        """The deferred ``X @ Y``, computed by ``run(X, Y)`` if anything needs its value."""
        product = _Product(X, Y, run)
        return cls(product, product.shape)

    def materialize(self) -> torch.Tensor:
        """The value, as a plain tensor (computing the product on first use)."""
        value = self._product.compute()
        return value if tuple(value.shape) == tuple(self.shape) else value.view(self.shape)

    def factors(self, shape) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(X, Y)`` when the product is still deferred and this gradient is exactly it in ``shape``."""
        p = self._product
        if p.value is not None or tuple(self.shape) != tuple(shape) or p.shape != tuple(shape):
            return None
        return p.X, p.Y

    def take(self, shape) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The factors ``(X, Y)`` for a consumer that computes ``X @ Y`` itself, when the product is still
        deferred and this gradient is exactly it in ``shape`` (else None: use ``materialize()``)."""
        factors = self.factors(shape)
        if factors is None:
            return None
        # the product now lives in the consumer's kernel; a later use of this tensor (a hook that kept it)
        # still computes it
        STATS["fused"] += 1
        return factors

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RESHAPES and isinstance(args[0], DeferredGrad) and args[0]._product.value is None:
            shape = args[1] if len(args) > 1 else args[0].shape
            shape = _resolve(shape, args[0].numel())
            if shape is not None:
                return DeferredGrad(args[0]._product, shape)
        plain_args, plain_kwargs = tree_map_only(DeferredGrad, DeferredGrad.materialize, (args, kwargs))
        out = func(*plain_args, **plain_kwargs)
        if func._schema.is_mutable and args and isinstance(args[0], DeferredGrad):
            return args[0]  # in place: the (materialized) value changed; the wrapper is the result
        return out

    def __repr__(self):
        state = "computed" if self._product.value is not None else "deferred"
        return f"DeferredGrad({state}, shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def _resolve(shape, numel: int):
    """A view's target shape with -1 resolved (None when it does not describe ``numel`` elements)."""
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 or numel % known:
            return None
        shape[shape.index(-1)] = numel // known
    total = 1
    for s in shape:
        total *= s
    return tuple(shape) if total == numel and all(s >= 0 for s in shape) else None


def mode() -> str:
    """EVTORCH_FUSE_BACKWARD: "auto", "always" or "never". Read on every backward, so an unset variable (the
    common case) is one dict lookup (``knobs.raw_reader``), not a parse."""
    if _environ_get(_FUSE_KEY) is None:
        return "auto"
    return knobs.FUSE_BACKWARD.get()


def enabled() -> bool:
    return mode() != "never"


def producer(ctx) -> tuple[object, int] | None:
    """(autograd node, output index) of the evtorch node that made the consumer's first input (A), looking
    through reshapes; None when it is something else or the engine will not run it in this backward (then a
    deferred gradient could only be materialized, or would be captured unfinished)."""
    from .ops import FusedGemm
    node, index = ctx.next_functions[0]
    while node is not None and type(node).__name__ in _RESHAPE_NODES:
        node, index = node.next_functions[0]
    if node is None or not isinstance(node, FusedGemm._backward_cls):
        return None
    try:
        if not torch._C._will_engine_execute_node(node):
            return None
    except RuntimeError:  # not inside a backward the engine runs (e.g. a custom call of .backward)
        return None
    return node, index
