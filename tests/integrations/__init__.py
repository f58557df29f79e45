"""fxlrp with other libraries: PyG, transformers, torchvision's operations, plug-ins and torch.compile."""
