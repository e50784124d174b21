"""16-bit intermediates kept in float32 (``EVTORCH_INTERMEDIATES=float32``), as torch.compile keeps them.

Eager PyTorch rounds the result of every op on 16-bit tensors to 16 bits: ``beta * C`` with a bf16 ``C`` is a bf16
tensor, and ``tanh`` of it another. evtorch computes in float32 and, by default, rounds where eager rounds, so a
fused epilogue returns what the user's function returns eagerly; each such rounding costs the kernel a
conversion and a shift per element. torch.compile (Inductor) keeps those intermediates in float32 by default
(``torch._inductor.config.emulate_precision_casts = False``), which is closer to a float64 reference and cheaper.
This pass does the same when asked: it relabels the implicit 16-bit intermediates float32.

What it keeps 16-bit:

- explicit casts (``x.to(torch.bfloat16)``, ``x.half()``): the user asked for that rounding;
- values that reach, through any chain of ops, a comparison or another discontinuous op (floor/round/sign,
  casts to integer or bool, user ops) or a min/max reduction: a last-bit change can flip a comparison, and
  autograd's backward compares recomputed values with the saved maxima (a PyTorch pull request,
  pytorch/pytorch#195223, proposed the same exception for comparisons in Inductor, for the first reason);
- anything outside the tile stage (the vector stage computes on float32 reductions anyway).

A relabeled node remembers the dtype eager gives it in ``meta['eager_dtype']``: the fast-math rule
(``codegen/fastmath.py``) still counts it as a 16-bit rounding point, since an approximation there is far more
accurate than the rounding eager itself applies, so float32 intermediates do not cost the hardware tanh. Outputs
are unchanged: full-size outputs are stored in ``out_dtype`` and reductions in float32 as always.
"""
from __future__ import annotations

import torch

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import HALF_DTYPES, Stage
from ..ops import REGISTRY
from ..ops.registry import BOOL_ONLY, CAST, COMPARE
from .base import Pass

# float ops whose result does not move continuously with their operands: a last-bit change can flip them
DISCONTINUOUS = frozenset({"floor", "ceil", "round", "sign"})
MINMAX_REDUCTIONS = frozenset({"amax", "amin"})


def continuous(u: Node) -> bool:
    """Whether a small relative change of an operand moves ``u``'s value only a little: a tile-stage float op
    that is no comparison, rounding to an integer, cast to a non-float or user op."""
    if u.op != "compute" or u.stage != Stage.TILE or not u.dtype.is_floating_point:
        return False
    if u.target not in REGISTRY:
        return False
    op = REGISTRY[u.target]
    if op.user_defined is not None or op.has(COMPARE) or op.has(BOOL_ONLY) or u.target in DISCONTINUOUS:
        return False
    if op.has(CAST):
        return u.attrs["dtype"].is_floating_point
    return True


def reaching_discontinuities(graph: Graph) -> frozenset:
    """ids of the nodes whose value reaches, along any chain of uses, a user that is neither continuous nor an
    output nor a sum-like reduction: a comparison, a discontinuous op, a min/max reduction, a vector-stage op."""
    users = graph.users()
    found: set[int] = set()
    for n in reversed(graph.nodes):  # users come after their operands
        for u in users[id(n)]:
            if u.op == "output" or (u.op == "reduce" and u.target not in MINMAX_REDUCTIONS):
                continue
            if not continuous(u) or id(u) in found:
                found.add(id(n))
                break
    return frozenset(found)


def eager_dtype(n: Node) -> torch.dtype:
    """The dtype eager PyTorch computes ``n`` in: its IR dtype, or the 16-bit one this pass relabeled."""
    return n.meta.get("eager_dtype", n.dtype)


def relabel(n: Node) -> None:
    """Mark ``n`` as computed in float32 where eager computes it in ``n.dtype`` (16 bits)."""
    n.meta["eager_dtype"] = n.dtype
    n.dtype = torch.float32


class Float32Intermediates(Pass):
    """Relabel the implicit 16-bit tile-stage intermediates float32, except those the module docstring keeps."""
    name = "float32_intermediates"
    requires = frozenset({"cse"})
    invalidates = frozenset({"cse", "fused"})  # equal keys may now merge; mul+add pairs may now fuse

    def run(self, graph: Graph) -> Graph:
        keep = reaching_discontinuities(graph)
        for n in graph.nodes:
            if (n.op == "compute" and n.stage == Stage.TILE and n.dtype in HALF_DTYPES and id(n) not in keep
                    and n.target in REGISTRY and not REGISTRY[n.target].has(CAST)
                    and REGISTRY[n.target].user_defined is None):
                relabel(n)
        return graph


__all__ = ["Float32Intermediates", "continuous", "reaching_discontinuities", "eager_dtype", "relabel",
           "DISCONTINUOUS"]
