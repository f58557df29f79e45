"""fxlrp: Layer-wise Relevance Propagation for any torch.fx-traceable PyTorch model.

``explain = fxlrp.convert(model)`` gives a module with the model's outputs whose backward
propagates relevance: ``explain(x).backward(R)`` leaves the relevance of ``x`` in ``x.grad``.
"""

import sys

from fxlrp import _moved, rules
from fxlrp.errors import CaptureError, FxlrpError, UnsupportedOperationError
from fxlrp.explain.attribute import attribute, attribute_nodes
from fxlrp.explain.compiled import compile
from fxlrp.explain.convert import convert
from fxlrp.explain.explainer import Explainer
from fxlrp.rules import composites

__all__ = [
    "convert",
    "attribute",
    "attribute_nodes",
    "compile",
    "Explainer",
    "rules",
    "composites",
    "CaptureError",
    "FxlrpError",
    "UnsupportedOperationError",
    "read_explanations",
]
__version__ = "0.1.0"

_moved.install(sys.modules[__name__])


def __getattr__(name: str) -> object:
    """The package's attributes that are imported on first use.

    Parameters
    ----------
    name : str
        ``"read_explanations"`` (explanations written by ``fxlrp explain --data``), imported on
        first use so that ``import fxlrp`` stays light; or a module's old path
        (``fxlrp.explainer``), which names the module at its place in the package layout
        (:mod:`fxlrp._moved`).

    Returns
    -------
    object
        The function or the module.

    Raises
    ------
    AttributeError
        For any other name.
    """
    if name == "read_explanations":
        from fxlrp.app.explanations_store import read_explanations

        return read_explanations
    module = _moved.moved_module(sys.modules[__name__], name)
    if module is not None:
        return module
    raise AttributeError(f"module 'fxlrp' has no attribute {name!r}")
