"""Roles of intermediate tensors that product rules need to know: gates and attention weights.

A product of two relevance-carrying tensors is explained differently depending on what its
factors are: in ``x * sigmoid(s)`` (squeeze-excitation) the gate rescales the signal ``x``; in
``softmax(q k^T) @ v`` CP-LRP treats the attention weights as constants. The operations that make
gates and attention weights (sigmoid, hardsigmoid, softmax) mark their outputs, and the product
rules read the mark. Views of a marked tensor are not marked: the mark names the exact tensor the
operation returned, which is what squeeze-excitation and attention multiply with.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

GATE = "gate"
"""Output of a sigmoid-like squashing function, in [0, 1], that multiplies a signal."""
ATTENTION = "attention"
"""Output of a softmax: attention weights."""

_ATTRIBUTE = "_fxlrp_role"


def mark(tensor: Tensor, role: str) -> Tensor:
    """Record ``role`` on ``tensor`` and return it."""
    setattr(tensor, _ATTRIBUTE, role)
    return tensor


def role_of(value: Any) -> str | None:
    """The role recorded on ``value`` by :func:`mark`, or None."""
    return getattr(value, _ATTRIBUTE, None) if isinstance(value, Tensor) else None
