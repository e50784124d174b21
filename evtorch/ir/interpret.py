"""The reference executor: runs an epilogue graph with torch ops on real tensors.

Every value is a tensor broadcastable to the canonical iteration space (L, M, N) (L = 1 when unbatched), so a
node's shape class is literally the set of its non-broadcast dims. Loads go through the same per-axis strides
the Triton launcher uses (``ir.layouts``), so this executor also checks the layout logic. It is the CPU
backend ("reference"), the oracle of the generated kernels, and deterministic.

Subclass and override ``run_<op>`` to build analyses (torch.fx's Interpreter pattern).
"""
from __future__ import annotations

import torch

from ..ops import REGISTRY
from ..ops.registry import BOOL_ONLY, CAST, COMPARE
from .graph import Graph
from .layouts import input_axis_strides
from .node import Node
from .types import AXES

_DIM = {a: i for i, a in enumerate(AXES)}


class Interpreter:
    def __init__(self, graph: Graph, sizes: dict):
        self.graph = graph
        self.sizes = {"L": 1, **sizes}

    def full_shape(self, axes) -> list[int]:
        return [self.sizes[a] if a in axes else 1 for a in AXES]

    def run(self, acc: torch.Tensor, inputs: dict) -> dict[int, torch.Tensor]:
        """Returns {output position: tensor over canonical (L, M, N) broadcast dims}."""
        self.acc = acc if acc.dim() == 3 else acc.unsqueeze(0)
        self.inputs = inputs
        env: dict[int, object] = {}
        outs = {}
        for n in self.graph.nodes:
            args = [env[id(a)] for a in n.args]
            value = getattr(self, f"run_{n.op}")(n, *args)
            env[id(n)] = value
            if n.op == "output":
                outs[n.target] = value
        return outs

    def run_acc(self, n: Node):
        return self.acc

    def run_input(self, n: Node):
        x = self.inputs[n.target]
        if x.dim() == 0:
            return x
        strides = input_axis_strides(n.target, x, n.attrs["binding"], self.sizes)
        return x.as_strided(self.full_shape(n.axes), [strides[a] if a in n.axes else 0 for a in AXES],
                            x.storage_offset())

    def run_scalar(self, n: Node):
        return self.inputs[n.target]  # a Python number: eager's "wrapped scalar" promotion

    def run_index(self, n: Node):
        shape = [1, 1, 1]
        shape[_DIM[n.target]] = self.sizes[n.target]
        return torch.arange(self.sizes[n.target], device=self.acc.device).view(shape)

    def run_const(self, n: Node):
        return n.target

    def run_compute(self, n: Node, *args):
        op = REGISTRY[n.target]
        opmath = None
        if n.dtype.is_floating_point and not (op.has(CAST) or op.has(COMPARE) or op.has(BOOL_ONLY)):
            # floating operands enter in the opmath type of the node's dtype (the dtype eager promotion gave it):
            # float64, or float32 for float32 and 16-bit results, which are rounded after, as eager's kernels and
            # codegen compute them (a 0-d float32 operand rounded to float16 first was an ulp off, found
            # 2026-11-29); a constant standing for a tensor (``torch.zeros_like(acc)``, a folded constant) is a
            # Python number here, which alone would not promote (``0.1 + C16`` would compute in float16)
            opmath = torch.float64 if n.dtype == torch.float64 else torch.float32
            args = [a.to(opmath) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point and a.dtype != opmath
                    else a for a in args]
        try:
            out = op.torch_ref(*args, **n.attrs)
        except TypeError:
            # a torch function that takes no Python number (torch.maximum, torch.exp) given a constant that stands
            # for a tensor (``torch.zeros_like(x)``): eager called it on a tensor of the constant's IR dtype
            args = [a if isinstance(a, torch.Tensor) or not isinstance(a, (bool, int, float)) else
                    torch.tensor(a, dtype=x.dtype, device=self.acc.device) for a, x in zip(args, n.args)]
            out = op.torch_ref(*args, **n.attrs)
        if not isinstance(out, (torch.Tensor, bool, int, float)):
            out = torch.tensor(out, dtype=n.dtype, device=self.acc.device)
        if opmath is not None and isinstance(out, torch.Tensor) and out.dtype != n.dtype:
            out = out.to(n.dtype)
        # arithmetic on Python-number scalars stays a Python number, exactly as in eager: rounding it to a
        # float32 tensor would lose precision in float64 epilogues and change how it promotes
        return out

    def run_reduce(self, n: Node, x):
        op = REGISTRY[n.target]
        over = n.attrs["over"]
        x = torch.as_tensor(x, device=self.acc.device).to(n.dtype)
        keep = set(n.args[0].axes) | set(over)
        x = x.expand(self.full_shape(keep)) if x.dim() == 3 else x.reshape(1, 1, 1).expand(self.full_shape(keep))
        return op.torch_ref(x, dim=tuple(_DIM[a] for a in over), keepdim=True)

    def run_output(self, n: Node, x):
        if not isinstance(x, torch.Tensor):  # a Python number: no rounding before the final cast
            x = torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else None, device=self.acc.device)
        x = torch.as_tensor(x, device=self.acc.device)
        if x.dim() < 3:
            x = x.reshape(1, 1, 1)
        return x
