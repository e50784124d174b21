"""Runtime parameters of generated kernels and where their values come from.

Generated kernels take every size-dependent value as an argument (pointers, element strides, scalar inputs,
element counts), never as a constant: a new M, N, K, L or a new scalar value reuses the compiled kernel.
A ``Param`` names the argument and says how the launcher finds its value (``kind`` + ``key``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Param:
    name: str
    kind: str   # in_ptr | in_stride | scalar | out_ptr | out_stride | buf_ptr | buf_stride | count
    key: Any    # in_*: (input name, binding, axis); scalar: name; out_*: (position, axis); buf_*: (rid, part, axis)
    # the kernel signature's type annotation, where Triton's own typing of the value would lose something: a
    # Python float is passed as fp32 unless the parameter says tl.float64 (a float64 epilogue's scalar input)
    annotation: str = ""


class ParamList:
    """Ordered, de-duplicated parameters; ``get`` returns the argument name for a (kind, key)."""

    def __init__(self):
        self.params: list[Param] = []
        self._by_key: dict[tuple, str] = {}

    def get(self, kind: str, key, name: str, annotation: str = "") -> str:
        k = (kind, key)
        if k not in self._by_key:
            base, i = name, 0
            taken = {p.name for p in self.params}
            while name in taken:
                i += 1
                name = f"{base}_{i}"
            self._by_key[k] = name
            self.params.append(Param(name, kind, key, annotation))
        return self._by_key[k]

    def scalar(self, node, wide: bool = False) -> str:
        """The argument of scalar input ``node``: a float64 one, or a float one with ``wide`` (float64 ops read
        it), is declared tl.float64 (``Param.annotation``)."""
        return self.get("scalar", node.target, f"sc_{node.target}",
                        "tl.float64" if node.dtype == torch.float64 or wide else "")

    def annotations(self) -> dict[str, str]:
        """{name: annotation} of the parameters whose kernel signature must type them (``Param.annotation``)."""
        return {p.name: p.annotation for p in self.params if p.annotation}

    def signature(self) -> list[str]:
        """The parameters as a kernel signature declares them: names, annotated where ``annotations`` says."""
        return [f"{p.name}: {p.annotation}" if p.annotation else p.name for p in self.params]

    def names(self, kind: str | None = None) -> list[str]:
        """Parameter names in order; with ``kind``, only those of that kind (e.g. 'scalar')."""
        return [p.name for p in self.params if kind is None or p.kind == kind]
