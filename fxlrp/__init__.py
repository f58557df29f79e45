"""fxlrp: Layer-wise Relevance Propagation for any torch.fx-traceable PyTorch model.

``explain = fxlrp.convert(model)`` gives a module with the model's outputs whose backward
propagates relevance: ``explain(x).backward(R)`` leaves the relevance of ``x`` in ``x.grad``.
"""

from fxlrp import composites, rules
from fxlrp.convert import convert
from fxlrp.errors import CaptureError, FxlrpError, UnsupportedOperationError
from fxlrp.explainer import Explainer, attribute

__all__ = [
    "convert",
    "attribute",
    "Explainer",
    "rules",
    "composites",
    "CaptureError",
    "FxlrpError",
    "UnsupportedOperationError",
]
__version__ = "0.1.0"
