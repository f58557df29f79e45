"""fxlrp's integrations with libraries, each loaded when a model that uses its library is converted.

:mod:`~fxlrp.integrations.torchvision` (Swin's window attention, stochastic depth),
:mod:`~fxlrp.integrations.pyg` (PyTorch Geometric: its layers and functions, ``LRPExplainer``,
relevant walks) and :mod:`~fxlrp.integrations.transformers` (Hugging Face's activation modules,
mixtures of experts, Mamba's scan) register their operations in the one registry
(:mod:`fxlrp.registry`). The core never imports them: the loader,
:mod:`fxlrp.explain.loader`, imports one when its library is in use, and
:func:`~fxlrp.registry.integrations.register_integration` (named here too, as docs/extending.md
shows it) adds your own.
"""

from fxlrp.registry.integrations import INTEGRATIONS, register_integration

__all__ = ["INTEGRATIONS", "register_integration"]
