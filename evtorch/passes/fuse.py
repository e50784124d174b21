"""Fusion into compound ops where codegen has a better primitive: ``a*b + c → fma(a, b, c)``.

Only when the product has no other user (otherwise it is computed anyway), both nodes are floating point
of the same dtype and so are the operands, Python numbers aside (so rounding differs from eager only by the
one rounding fma saves) and neither is an output by itself. Requires ``cse`` (so "no other user" is meaningful). Ensures ``fused``.

What the saved rounding changes, as in every fused kernel (torch.compile's and cuBLAS's epilogues too, and the
GPU's own contraction of ``a*b + c``): a product that overflows by itself no longer does when ``c`` brings the sum
back (``2 * 3e38 - 3e38`` is 3e38, eager's separate kernels give inf, and with ``c = -inf`` -inf where eager gives
NaN), and a sum that cancels exactly keeps the product's rounding error (2^-24 where eager gives 0). Turn it off
with ``EVTORCH_DISABLE_PASSES=fuse_fma`` where those cases matter.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.types import HALF_DTYPES
from .base import Pass, fact


def _composite_operands(graph: Graph) -> set[str]:
    """Names of the values composites' derivative rules read (``meta['composite']``, autodiff/reverse.py)."""
    return {v for n in graph.nodes if n.meta.get("composite") for kind, v in n.meta["composite"][1] if kind == "node"}


def _candidates(graph: Graph):
    users = graph.users()
    keep = _composite_operands(graph)
    for n in graph.nodes:
        if n.op != "compute" or n.target != "add" or n.attrs.get("alpha", 1) != 1:
            continue
        if n.dtype not in _FUSABLE:
            continue
        for i, m in enumerate(n.args):
            other = n.args[1 - i]
            # a product a composite's rule reads stays a node: fused away, the rule found no operand and the
            # decomposition was differentiated instead (hardsigmoid(s * acc) as clamp(s * acc + 3): its float64
            # gradient lost eager's 1.0f / 6.0f, found 2026-11-29)
            named = {m.name, *m.meta.get("aliases", ())} & keep
            if (m.op == "compute" and m.target == "mul" and m.dtype == n.dtype and len(users[id(m)]) == 1
                    and not named and _matches(other, n.dtype) and all(_matches(x, n.dtype) for x in m.args)):
                yield n, m, other
                break


import torch  # noqa: E402

_FUSABLE = (torch.float32, torch.float64)


def _matches(x, dtype) -> bool:
    """``x`` enters the fused op in ``dtype`` exactly as it entered the mul/add: a value of that dtype, a 16-bit
    value entering a float32 op (widened exactly: ``alpha * acc + beta * C``'s bf16 ``beta * C``, or a bf16 ``C``
    once ``passes/intermediates.py`` keeps the product in float32), or a Python number (a constant or a scalar
    input: eager's wrapped scalars take the tensor's dtype, so ``2 * acc`` and ``alpha * acc`` in a float64
    epilogue fuse like ``C * acc``)."""
    if x.dtype == dtype:
        return True
    if dtype == torch.float32 and x.dtype in HALF_DTYPES:
        return True
    return x.op in ("const", "scalar") and x.dtype in (torch.float32, torch.int64)


class FuseFMA(Pass):
    name = "fuse_fma"
    requires = frozenset({"cse"})
    ensures = frozenset({"fused"})

    def run(self, graph: Graph) -> Graph:
        while True:
            found = next(_candidates(graph), None)
            if found is None:
                return graph
            add, mul, other = found
            add.target = "fma"
            add.attrs = {}
            add.args = (mul.args[0], mul.args[1], other)
            graph.remove([mul])


@fact("fused")
def _no_mul_add(graph: Graph):
    found = next(_candidates(graph), None)
    return f"%{found[0].name} is still mul+add" if found else None
