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
