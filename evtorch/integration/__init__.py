"""PyTorch integration: the ``torch.library`` operators with autograd (``ops``), ``evt.linear`` and
``evtorch.nn.Linear``. ``dispatch`` decides when ``evt.gemm`` goes through the operator."""
