"""Errors fxlrp raises, each saying what went wrong and what to do."""


class FxlrpError(Exception):
    """Base class of fxlrp's errors."""


class CaptureError(FxlrpError):
    """The model could not be captured as a torch.fx graph."""


class UnsupportedOperationError(FxlrpError):
    """The graph has operations with no LRP rule that are not known to be relevance-neutral."""


class ExplanationInputError(FxlrpError, ValueError, TypeError):
    """An input or target that an explanation cannot take as it is: a NumPy array or a list where
    the model takes tensors, an input the model itself rejects (no batch dimension, another dtype
    or device than its parameters), a target that names no output. The message says which and what
    to do; a rejection by the model is raised from the model's own error. A :class:`ValueError` and a
    :class:`TypeError`, so that code catching either, as for the errors torch raises, catches it."""


class FxlrpWarning(UserWarning):
    """Base class of fxlrp's warnings: ``warnings.filterwarnings("ignore", category=fxlrp.FxlrpWarning)``
    silences them all."""


class VanishedRelevanceWarning(FxlrpWarning):
    """The relevance reaching the inputs is a negligible share of the explained output's: the rules
    absorbed it on the way (see :func:`fxlrp.attribute`), so a heatmap of it shows rounding noise."""
