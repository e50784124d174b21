"""evtorch: fused GEMM + epilogue kernels compiled from plain PyTorch functions.

    import torch, evtorch as evt

    def epi(acc, C, bias, alpha, beta):
        D = torch.relu(alpha * acc + beta * C + bias[:, None])
        return D, D.sum(dim=1)

    D, rowsum = evt.gemm(A, B, epi, C=C, bias=bias, alpha=1.5, beta=0.5)
"""
from . import ops  # noqa: F401  (declares the built-in ops)
from .api import col_index, gemm, register_op, row_index
from .epilogue import Epilogue, trace
from .errors import (EpilogueError, EpilogueTypeError, ShapeError, TraceControlFlowError,
                     UnsupportedOpError)
from .frontend.signature import spec
from .integration.linear import linear
from .integration import ops as _operators  # noqa: E402,F401  (registers torch.ops.evtorch.*: see integration)
from . import nn  # noqa: E402,F401  (evtorch.nn.Linear)
from .scan import scan

__version__ = "0.1.0"

__all__ = ["gemm", "scan", "linear", "nn", "trace", "spec", "Epilogue", "row_index", "col_index", "register_op",
           "EpilogueError",
           "EpilogueTypeError", "ShapeError", "TraceControlFlowError", "UnsupportedOpError"]
