"""Integrations with libraries (torchvision, PyG, Hugging Face transformers) load themselves when the library is in use.

The core never imports an integration or its library on its own: ``import fxlrp`` works without
them and stays fast (torchvision alone takes over a second to import). When a model is converted
and a library named here has already been imported (the model uses it), its integration is
imported and registers its operations in the one registry. An integration that fails to load (a
library version it does not support) is reported once as a warning; models that do not use that
library are not affected.
"""

from __future__ import annotations

import importlib
import sys
import warnings

INTEGRATIONS = {
    "torchvision": "fxlrp.integrations.torchvision",
    "torch_geometric": "fxlrp.integrations.pyg",
    "transformers": "fxlrp.integrations.transformers",
}
"""Library (top-level module name) -> fxlrp integration module."""

_attempted: set[str] = set()


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


def load_integrations() -> None:
    """Import the integration of every library in :data:`INTEGRATIONS` that is already imported."""
    for library, integration in INTEGRATIONS.items():
        if library not in sys.modules or integration in _attempted:
            continue
        _attempted.add(integration)
        try:
            importlib.import_module(integration)
        except Exception as error:  # an unsupported library version must not break other models
            version = getattr(sys.modules[library], "__version__", "?")
            warnings.warn(
                f"fxlrp: its support for {library} {version} could not be loaded ({type(error).__name__}: {error}); "
                f"models using {library}'s own layers or functions may be refused. Other models are not affected.",
                stacklevel=3,
            )
