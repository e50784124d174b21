"""PyTorch integration: the ``torch.library`` operators with autograd (``ops``), ``evt.linear`` and
``evtorch.nn.Linear``. ``dispatch`` decides when ``evt.gemm`` goes through the operator.

``grad_plan(A, B, fn, **inputs)`` returns the ``autodiff.GradPlan`` of a call (what the forward saves, the
backward epilogues); ``op_arguments`` the arguments of its ``torch.ops.evtorch.gemm`` call.
"""


def __getattr__(name):  # the operators register on first use, not at `import evtorch`
    if name in ("grad_plan", "op_arguments", "fused_gemm"):
        from . import function
        return getattr(function, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
