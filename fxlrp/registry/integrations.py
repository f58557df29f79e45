"""Which integration serves which library (torchvision, PyG, Hugging Face transformers, bitsandbytes).

The core never imports an integration or its library on its own: ``import fxlrp`` works without
them and stays fast (torchvision alone takes over a second to import). When a model is converted
and a library named here has already been imported (the model uses it), the loader
(:func:`fxlrp.explain.loader.load_integrations`) imports its integration, which registers its
operations in the one registry.
"""

from __future__ import annotations

INTEGRATIONS = {
    "torchvision": "fxlrp.integrations.torchvision",
    "torch_geometric": "fxlrp.integrations.pyg",
    "transformers": "fxlrp.integrations.transformers",
    "bitsandbytes": "fxlrp.integrations.bitsandbytes",
}
"""Library (top-level module name) -> fxlrp integration module."""


def register_integration(library: str, integration: str) -> None:
    """Load the module ``integration`` whenever a model is converted while ``library`` is imported.

    This is the whole plug-in interface.

    Parameters
    ----------
    library : str
        The library's top-level module name.
    integration : str
        The module that registers its operations (with :func:`fxlrp.registry.register`,
        ``REGISTRY.extend`` or ``REGISTRY.fix_arguments``).
    """
    INTEGRATIONS[library] = integration
