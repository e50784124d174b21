"""``evt.scan``: recurrences over one dim (TVM's scan), traced from plain PyTorch and compiled to Triton.

Layers: ``trace`` (proxies, lane maps) -> ``body`` (traced graphs) -> ``plan`` (groups, recurrence
classification) -> ``kernels``/``emit`` (Triton source) -> ``launch`` (run) ; ``reference`` (the loop
executor and oracle), ``autograd`` (reverse scan). See docs/scan.md.
"""
from .api import scan
from .errors import (ScanControlFlowError, ScanError, ScanShapeError, ScanStepError, ScanTraceError,
                     ScanUnsupportedOpError)
from .launch import ScanConfig

__all__ = ["scan", "ScanConfig", "ScanError", "ScanShapeError", "ScanStepError", "ScanTraceError",
           "ScanControlFlowError", "ScanUnsupportedOpError"]
