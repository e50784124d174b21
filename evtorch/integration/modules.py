"""``evtorch.nn.Linear``: a drop-in ``torch.nn.Linear`` whose forward is one fused GEMM with an epilogue.

    layer = evtorch.nn.Linear(512, 2048, epilogue=F.gelu)   # F.gelu(layer(x)) of nn.Linear, fused

It *is* an ``nn.Linear`` (same parameters, initialisation, ``state_dict`` keys and shapes), so checkpoints load
either way and ``isinstance(layer, nn.Linear)`` holds. ``epilogue`` is applied to ``x @ weight.T + bias``; it may
be any evtorch epilogue taking that value first (extra keyword inputs go to ``forward``).
"""
from __future__ import annotations

from typing import Callable

import torch

from .linear import linear


class Linear(torch.nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 epilogue: Callable | None = None, policy: str = "save"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.epilogue = epilogue
        self.policy = policy

    def forward(self, input: torch.Tensor, **inputs) -> torch.Tensor:
        return linear(input, self.weight, self.epilogue, self.bias, policy=self.policy, **inputs)

    def extra_repr(self) -> str:
        name = getattr(self.epilogue, "__name__", repr(self.epilogue)) if self.epilogue is not None else None
        return super().extra_repr() + (f", epilogue={name}" if name else "")
