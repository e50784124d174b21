"""The op registry (``REGISTRY``) with every built-in op declared. Importing this package declares them."""
from . import elementwise, reductions  # noqa: F401  (declarations)
from .registry import REGISTRY, OpDef, define

__all__ = ["REGISTRY", "OpDef", "define"]
