"""Roles of intermediate tensors that product rules need to know: gates and attention weights.

A product of two relevance-carrying tensors is explained differently depending on what its
factors are: in ``x * sigmoid(s)`` (squeeze-excitation) the gate rescales the signal ``x``; in
``softmax(q k^T) @ v`` CP-LRP treats the attention weights as constants. The operations that make
gates and attention weights (sigmoid, hardsigmoid, softmax) mark their outputs, as do ``topk``
and ``max`` where they pick a router's weights, and the product rules read the mark. Operations
that only move or re-type the values (views, reshapes, permutes, slices, dtype casts,
``contiguous``, dropout at inference) hand the mark on, so that
``softmax(w, dtype=torch.float32).to(q.dtype)`` - Hugging Face's eager attention - is still
attention weights when it meets the values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from fxlrp.relevance.rule_function import carries_relevance

GATE = "gate"
"""Output of a sigmoid-like squashing function, in [0, 1], that multiplies a signal."""
ATTENTION = "attention"
"""Output of a softmax: attention weights."""
SELECTED = "selected"
"""The values ``topk`` chose from scores that are not yet weights (a router's logits): their
softmax or sigmoid is a router's weights, gates (:func:`fxlrp.operations.neutral.largest_role`)."""
ACTIVATION = "activation"
"""Output of a smooth activation (GELU, SiLU, ...): in ``act(x W_gate) * (x W_up)`` (SwiGLU,
GeGLU) the gating factor; CP-LRP treats it as a constant, AttnLRP shares uniformly."""

_ATTRIBUTE = "_fxlrp_role"


def mark(tensor: Tensor, role: str) -> Tensor:
    """Record ``role`` on ``tensor`` and return it.

    Parameters
    ----------
    tensor : Tensor
        The tensor to mark.
    role : str
        The role (:data:`GATE`, :data:`ATTENTION`, :data:`SELECTED`, :data:`ACTIVATION`).

    Returns
    -------
    Tensor
        ``tensor``.
    """
    setattr(tensor, _ATTRIBUTE, role)
    return tensor


def role_of(value: Any) -> str | None:
    """The role recorded on ``value`` by :func:`mark`, or None.

    Parameters
    ----------
    value : Any
        A tensor, or a list or tuple of tensors (what ``torch.cat`` and ``torch.stack`` take).

    Returns
    -------
    str or None
        The tensor's role; for a list or tuple, the role all of them share. None if there is
        none.
    """
    if isinstance(value, (list, tuple)):
        return _one({role_of(item) for item in value})
    return getattr(value, _ATTRIBUTE, None) if isinstance(value, Tensor) else None


def shared_role(values: Sequence[Any]) -> str | None:
    """The role every relevance-carrying tensor among ``values`` has.

    Parameters
    ----------
    values : sequence
        An operation's arguments.

    Returns
    -------
    str or None
        The shared role; None if none carries one, or their roles differ.
    """
    return _one({role_of(value) for value in values if carries_relevance(value)})


def give_role(result: Any, role: str | None) -> Any:
    """Mark ``result`` with ``role``, where it has none yet.

    Parameters
    ----------
    result : Any
        A tensor, or the tensors of a tuple or list (the pieces of ``split``, ``chunk``,
        ``unbind``).
    role : str or None
        The role; None marks nothing.

    Returns
    -------
    Any
        ``result``.
    """
    if role is None:
        return result
    for value in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(value, Tensor) and role_of(value) is None:
            mark(value, role)
    return result


def _one(roles: set[str | None]) -> str | None:
    return roles.pop() if len(roles) == 1 else None
