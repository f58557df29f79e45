"""fxlrp: Layer-wise Relevance Propagation for any torch.fx-traceable PyTorch model.

``explain = fxlrp.convert(model)`` gives a module with the model's outputs whose backward
propagates relevance: ``explain(x).backward(R)`` leaves the relevance of ``x`` in ``x.grad``.
"""

import importlib

from fxlrp.errors import (
    CaptureError,
    ExplanationInputError,
    FxlrpError,
    FxlrpWarning,
    UnsupportedOperationError,
    VanishedRelevanceWarning,
)

LAZY = {
    "convert": ("fxlrp.explain.convert", "convert"),
    "attribute": ("fxlrp.explain.attribute", "attribute"),
    "attribute_nodes": ("fxlrp.explain.attribute", "attribute_nodes"),
    "explain_generation": ("fxlrp.explain.generation", "explain_generation"),
    "GenerationExplanation": ("fxlrp.explain.generation", "GenerationExplanation"),
    "compile": ("fxlrp.explain.compiled", "compile"),
    "Region": ("fxlrp.explain.targets", "Region"),
    "Explainer": ("fxlrp.explain.explainer", "Explainer"),
    "rules": ("fxlrp.rules", None),
    "composites": ("fxlrp.rules.composites", None),
    "evaluate": ("fxlrp.evaluate", None),
    "read_explanations": ("fxlrp.app.explanations_store", "read_explanations"),
}
"""The package's attributes, imported on first use (name -> module, attribute; None: the module):
``import fxlrp`` imports no torch, so that ``fxlrp --help`` answers at once."""

__all__ = [
    "convert",
    "attribute",
    "attribute_nodes",
    "explain_generation",
    "GenerationExplanation",
    "compile",
    "Region",
    "Explainer",
    "rules",
    "composites",
    "evaluate",
    "CaptureError",
    "ExplanationInputError",
    "FxlrpError",
    "FxlrpWarning",
    "UnsupportedOperationError",
    "VanishedRelevanceWarning",
    "read_explanations",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """The package's attributes, imported on first use.

    Parameters
    ----------
    name : str
        One of :data:`LAZY` (``convert``, ``attribute``, ... and ``read_explanations``, the
        explanations written by ``fxlrp explain --data``).

    Returns
    -------
    object
        The function, class or module.

    Raises
    ------
    AttributeError
        For any other name.
    """
    if name in LAZY:
        module_name, attribute = LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attribute is None else getattr(module, attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fxlrp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *LAZY})
