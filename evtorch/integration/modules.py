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
        from ..autodiff.plan import POLICIES
        from ..errors import EpilogueError, EpilogueTypeError
        if policy not in POLICIES:  # checked here, not at the first forward
            raise EpilogueError(f"evt.nn.Linear: policy must be one of {POLICIES}, got {policy!r}")
        if epilogue is not None and not callable(epilogue):
            raise EpilogueTypeError(f"evt.nn.Linear: epilogue must be a function or None, got "
                                    f"{type(epilogue).__name__}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        # a plain attribute even for an nn.Module epilogue (nn.GELU()): registered as a submodule it would add
        # its entries to the state_dict, which then no longer loads into an nn.Linear
        self.__dict__["epilogue"] = epilogue
        self.policy = policy

    def forward(self, input: torch.Tensor, **inputs) -> torch.Tensor:
        return linear(input, self.weight, self.epilogue, self.bias, policy=self.policy, **inputs)

    def extra_repr(self) -> str:
        name = getattr(self.epilogue, "__name__", repr(self.epilogue)) if self.epilogue is not None else None
        return super().extra_repr() + (f", epilogue={name}" if name else "")
