"""Errors of ``evt.scan``: each is an ``EpilogueError`` (a ``ValueError``), so callers catch one family.

- ``ScanStepError``: the update reads a state at the step being computed or a later one (``h.at(0)``), or an
  earlier step than ``init`` provides (``h.at(-3)`` with two init rows).
- ``ScanShapeError``: init and state rows disagree, inputs of different lengths along the scan dim, a body
  returning the wrong number of states (also a ``ShapeError``).
- ``ScanTraceError``: the body cannot be traced (returns a non-tensor, raises, uses an unsupported construct);
  also an ``EpilogueTypeError``, i.e. a ``TypeError``.
"""
from __future__ import annotations

from ..errors import (EpilogueError, EpilogueTypeError, ShapeError, TraceControlFlowError,
                      UnsupportedOpError)


class ScanError(EpilogueError):
    """Bad scan body or bad arguments to ``evt.scan``."""


class ScanStepError(ScanError):
    """A state (or input) read at a step the recurrence cannot provide."""


class ScanShapeError(ScanError, ShapeError):
    """Row shapes of init, states, inputs or the body's results disagree."""


class ScanTraceError(ScanError, EpilogueTypeError):
    """The scan body could not be traced into a per-step program."""


class ScanControlFlowError(ScanTraceError, TraceControlFlowError):
    """Python control flow (``if``, ``bool()``, ``.item()``) on a value of the scan body."""


class ScanUnsupportedOpError(ScanTraceError, UnsupportedOpError):
    """The scan body called a function or method evtorch cannot trace."""
