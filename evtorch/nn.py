"""PyTorch modules backed by fused evtorch GEMMs: ``evtorch.nn.Linear`` (see ``evtorch.integration.modules``)."""
from .integration.modules import Linear

__all__ = ["Linear"]
