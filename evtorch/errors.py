"""The error model: every user-facing failure is an ``EpilogueError``.

``EpilogueError`` subclasses ``ValueError``; ``EpilogueTypeError`` additionally subclasses ``TypeError``
so callers catching either builtin keep working. Messages name the offending thing (input, op, dim),
say what was given and what was expected, and, where tracing recorded it, point at the user's line.
"""
from __future__ import annotations


class EpilogueError(ValueError):
    """Bad epilogue or bad input to ``evt.gemm`` / ``evt.trace`` / ``evt.scan``."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{message}\n  at {where}" if where else message)


class EpilogueTypeError(EpilogueError, TypeError):
    """Wrong kind of value: unsupported dtype, non-tensor return, Python control flow on a traced value."""


class UnsupportedOpError(EpilogueTypeError):
    """The epilogue called a torch function or method that has no registry entry."""


class TraceControlFlowError(EpilogueTypeError):
    """``if``/``bool()``/``int()``/``.item()`` on a traced value: its value is unknown at trace time."""


class ShapeError(EpilogueError):
    """Shapes that do not broadcast against the accumulator, impossible reduction dims, bad views."""
