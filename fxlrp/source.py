"""Where in the user's source a graph node came from."""

from __future__ import annotations

import os
import re

import torch
from torch import fx

_LIBRARY_DIRECTORIES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s*(?P<code>[^\n]*)')


def source_line(node: fx.Node) -> str:
    """``file:line: code`` of the innermost user frame that created ``node``; '' if unknown."""
    frames = [match for match in _FRAME.finditer(node.stack_trace or "")
              if not match["file"].startswith(_LIBRARY_DIRECTORIES)]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame['file']}:{frame['line']}: {frame['code'].strip()}"


def function_name(function: object) -> str:
    """How the user writes ``function``: ``torch.exp``, ``Tensor.exp``, ``F.gelu``'s
    ``torch.nn.functional.gelu``, ``operator.add``; not torch's internal class names."""
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
