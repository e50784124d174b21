"""PyTorch integration: the ``torch.library`` operators with autograd (``ops``), ``evt.linear`` and
``evtorch.nn.Linear``. ``dispatch`` decides when ``evt.gemm`` goes through the operator.

``grad_plan(A, B, fn, **inputs)`` returns the ``autodiff.GradPlan`` of a call (what the forward saves, the
backward epilogues); ``op_arguments`` the arguments of its ``torch.ops.evtorch.gemm`` call.
The operators register at ``import evtorch`` (``ops``, about 25 ms), so that a program exported with
``torch.export`` and saved loads in any process that imported evtorch; running it there needs the plans it names,
which live in the process that traced them (``ops.entry`` says so).
"""


def __getattr__(name):  # function's helpers load on first use
    if name in ("grad_plan", "op_arguments", "fused_gemm"):
        from . import function
        return getattr(function, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
