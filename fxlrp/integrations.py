"""Integrations with libraries (PyG, ...) load themselves when the library is in use.

The core never imports an integration or its library on its own: ``import fxlrp`` works without
them. When a model is converted and a library named here has already been imported (the model
uses it), its integration is imported and registers its operations in the one registry.
"""

from __future__ import annotations

import importlib
import sys

INTEGRATIONS = {"torch_geometric": "fxlrp.pyg"}
"""Library (top-level module name) -> fxlrp integration module."""


def load_integrations() -> None:
    """Import the integration of every library in :data:`INTEGRATIONS` that is already imported."""
    for library, integration in INTEGRATIONS.items():
        if library in sys.modules:
            importlib.import_module(integration)
