"""Where in the user's source a graph node came from."""

from __future__ import annotations

import linecache
import os
import re
import sys
import traceback

import torch
from torch import fx

LIBRARY_DIRECTORIES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # (fxlrp/, above capture/)
)
"""torch's and fxlrp's own files: frames there are never the user's."""
GENERATED_BY_FXLRP = "<fxlrp "
"""File name prefix of code objects fxlrp compiles (fxlrp/capture/interception.py)."""


def is_library_file(filename: str) -> bool:
    """Whether a file is torch's or fxlrp's own, or code fxlrp compiled.

    Parameters
    ----------
    filename : str
        A frame's file name.

    Returns
    -------
    bool
        True if frames there are never the user's.
    """
    return filename.startswith((*LIBRARY_DIRECTORIES, GENERATED_BY_FXLRP))


def _formatted(filename: str, line_number: int | None, code: str | None) -> str:
    return f"{filename}:{line_number}: {(code or '').strip()}"


def innermost_user_frame() -> str:
    """The innermost caller outside torch and fxlrp, in traceback format.

    Recorded on each captured node; :func:`source_line` reads it. (torch.fx's
    ``record_stack_traces`` would format the whole stack of every node and, the first time,
    import torch.export, which takes seconds.)

    Returns
    -------
    str
        The frame, as long as it runs inside a ``forward`` (as torch.fx's own stack traces
        require); '' otherwise.
    """
    frame = sys._getframe(1)
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    user = frame
    while frame is not None and frame.f_code.co_name != "forward":
        frame = frame.f_back
    if user is None or frame is None:
        return ""
    code = user.f_code
    line = linecache.getline(code.co_filename, user.f_lineno).strip()
    return f'File "{code.co_filename}", line {user.f_lineno}, in {code.co_name}\n    {line}'


def calling_line() -> str:
    """``file:line: code`` of the innermost frame of the current stack outside torch and fxlrp.

    Returns
    -------
    str
        The line of the user's or a library's code that called the running operation; '?' if
        none.
    """
    frame = sys._getframe(1)  # (a walk of the frames: traceback.extract_stack reads every frame's line)
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    filename = frame.f_code.co_filename
    return _formatted(filename, frame.f_lineno, linecache.getline(filename, frame.f_lineno))


def error_line(error: BaseException) -> str | None:
    """``file:line: code`` of the innermost frame of ``error``'s traceback in the user's code.

    Parameters
    ----------
    error : BaseException
        The error.

    Returns
    -------
    str or None
        The line; None if no frame of the traceback is the user's.
    """
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if not is_library_file(frame.filename) and not frame.filename.startswith("<"):
            return _formatted(frame.filename, frame.lineno, frame.line)
    return None
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s*(?P<code>[^\n]*)')


def source_line(node: fx.Node) -> str:
    """``file:line: code`` of the innermost user frame that created ``node``.

    Parameters
    ----------
    node : fx.Node
        A captured node (with its ``stack_trace``).

    Returns
    -------
    str
        The line; '' if unknown.
    """
    frames = [match for match in _FRAME.finditer(node.stack_trace or "")
              if not is_library_file(match["file"])]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame['file']}:{frame['line']}: {frame['code'].strip()}"


def function_name(function: object) -> str:
    """How the user writes ``function``, not torch's internal class names.

    Parameters
    ----------
    function : object
        A called function.

    Returns
    -------
    str
        ``torch.exp``, ``Tensor.exp``, ``F.gelu``'s ``torch.nn.functional.gelu``,
        ``operator.add``, or the function's module and qualified name.
    """
    name = getattr(function, "__name__", None)
    qualified = getattr(function, "__qualname__", None) or name
    if name is None:
        return repr(function)
    if qualified.startswith("_VariableFunctionsClass.") or getattr(torch, name, None) is function:
        return f"torch.{name}"
    if getattr(torch.Tensor, name, None) is function or qualified.startswith("TensorBase."):
        return f"Tensor.{name}"
    if getattr(torch.nn.functional, name, None) is function:
        return f"torch.nn.functional.{name}"
    module = getattr(function, "__module__", None)
    if module == "_operator":
        return f"operator.{name}"
    return f"{module}.{qualified}" if module and module != "builtins" else qualified
