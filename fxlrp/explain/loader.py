"""The one place that fills the registry: the core's operations, the parts run eagerly, and the
integrations of the libraries a model uses.

The registry (:mod:`fxlrp.registry`) only holds what is registered: nothing below this module loads
anything into it. Importing this module registers the core's operations (:mod:`fxlrp.operations`)
and the relevance function of parts run eagerly (:mod:`fxlrp.eager`, which also supplies the
operations its interpreter: :meth:`~fxlrp.relevance.call.RelevanceCall.decompose`).
:func:`load_integrations` imports the integration of each library in use
(:data:`~fxlrp.registry.integrations.INTEGRATIONS`, read at each call: plug-ins named by module,
since the core never imports them). What starts a conversion imports this module (:mod:`~fxlrp.explain.convert`,
:mod:`fxlrp.jax.explain`), and a saved explainer names it (:func:`operation_named`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import warnings

import fxlrp.eager  # noqa: F401  (registers the parts run eagerly, supplies the interpreter)
import fxlrp.operations  # noqa: F401  (registers the operations)
from fxlrp.registry import REGISTRY, integrations, registered_operation

_attempted: set[str] = set()


def load_integrations() -> None:
    """Import the integration of every library in :data:`~fxlrp.registry.integrations.INTEGRATIONS`
    that is already imported.

    An integration that fails to load (a library version it does not support) is one warning;
    models that do not use that library are not affected.
    """
    for library, integration in integrations.INTEGRATIONS.items():
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


def _load_integration_registering(name: str) -> None:
    """Import the integrations of installed libraries until one registers the operation ``name``."""
    for library, integration in integrations.INTEGRATIONS.items():
        if name in REGISTRY.operations:
            return
        if importlib.util.find_spec(library) is not None:
            importlib.import_module(integration)


operation_named = functools.partial(registered_operation, load=_load_integration_registering)
"""``operation_named(name)``: the registered operation ``name``, loading the integrations of
installed libraries until one registers it. A pickled operation names it
(:attr:`fxlrp.registry.Registry.find_by_name`): the process loading an explainer with ``pickle``
or ``torch.load`` imports this module (which registers the core's operations) and may not have
imported the library of an integration."""


REGISTRY.find_by_name = operation_named
