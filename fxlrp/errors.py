"""Errors fxlrp raises, each saying what went wrong and what to do."""


class FxlrpError(Exception):
    """Base class of fxlrp's errors."""


class CaptureError(FxlrpError):
    """The model could not be captured as a torch.fx graph."""


class UnsupportedOperationError(FxlrpError):
    """The graph has operations with no LRP rule that are not known to be relevance-neutral."""
