"""Ops the scan needs that the shared registry may not declare yet (declared here only when missing).

``logaddexp`` is one of the associative recurrences ``evt.scan`` runs as a parallel scan
(``h = torch.logaddexp(h, x)``: a running log-sum-exp). It is a primitive rather than a composite so the
recurrence classifier can recognise it; its emission is written with Triton primitives and ``tlmath``
helpers only, and handles infinities on both sides (``-inf`` is the scan identity) without producing NaN.
"""
from __future__ import annotations

import torch

from ..ops.registry import COMMUTATIVE, FLOAT_ONLY, REGISTRY, define


def _logaddexp(input, other): ...


# max + log1p(exp(min - max)); the difference is formed from where()-guarded operands so that equal
# infinities give 0 instead of NaN (no NaN is ever computed, not even in a discarded where() branch)
_MAX, _MIN = "tlmath.maximum({0}, {1})", "tlmath.minimum({0}, {1})"
_EMISSION = (f"({_MAX} + tlmath.log1p(tl.exp(tl.where({_MIN} == {_MAX}, 0.0, {_MIN}) - "
             f"tl.where({_MIN} == {_MAX}, 0.0, {_MAX}))))")


if "logaddexp" not in REGISTRY:
    define("logaddexp", _logaddexp, operands=("input", "other"),
           torch_ref=torch.logaddexp,
           triton=_EMISSION,
           derivative=lambda g, a, b, out: (g * torch.exp(a - out), g * torch.exp(b - out)),
           torch_fns=(torch.logaddexp,), methods=("logaddexp",),
           traits=frozenset({FLOAT_ONLY, COMMUTATIVE}),
           doc="log(exp(a) + exp(b)) without overflow; equal infinities give that infinity")
