"""Reverse-mode differentiation of epilogues, in the IR, with the op registry's derivative rules.

``GradPlan(ep, wrt_acc=..., wrt_inputs=...)`` builds, for one traced epilogue, a forward that also returns what
the backward needs and a backward that is itself an evtorch epilogue (or a few, when a reduction result is
needed inside the tile): see ``autodiff.plan``. ``evtorch.integration`` runs them as a ``torch.library`` op
with an autograd formula.
"""
from .canonical import from_canonical, space, to_canonical
from .plan import POLICIES, BackwardProgram, GradPlan, Saved

__all__ = ["GradPlan", "BackwardProgram", "Saved", "POLICIES", "to_canonical", "from_canonical", "space"]
