"""In-place writes under the relevance mode: nothing is written into memory a relevance function
keeps; the written tensor takes the new values and relevance instead (:func:`replace_values`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fxlrp.eager.views import Views, swap
from fxlrp.registry.writes import view_of_written, written_through_view
from fxlrp.relevance.rule_function import carries_relevance


def write(function: Any, args: tuple, kwargs: dict, views: Views) -> Any:
    """``target[index] = value``, ``target.copy_(source)``, ...: natively when ``target`` carries no
    relevance (a buffer being filled), else on a copy of ``target`` that then replaces it."""
    target = args[0]
    if not carries_relevance(target):
        return function(*args, **kwargs)
    written = target.clone()
    result = function(written, *args[1:], **kwargs)
    replace_values(target, written, views)
    return None if result is None else target



def replace_values(target: Tensor, new: Tensor, views: Views | None = None) -> Tensor:
    """Make ``target`` hold ``new``'s values and relevance, as an in-place write into ``target`` would.

    Nothing is written into memory that a relevance function keeps for its backward (its input,
    or its output as the epsilon rule's denominator; writing there would change the relevance or
    fail). The Python object ``target`` is given ``new``'s tensor (the mechanism of
    ``torch.utils.swap_tensors``, without its check that nothing else holds ``target``'s tensor:
    what holds it is exactly the relevance functions, which keep the old values); code holding
    ``target`` sees the new values, as after an in-place write. A write into a view reaches its
    base the same way: the base is replaced by a copy with the view's region written.

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    new : Tensor
        The values it takes, of its shape (cast to its dtype).
    views : Views, optional
        The run's views; those of the base taken before are taken again of the copy.

    Returns
    -------
    Tensor
        ``target``, now standing for the new values.

    Raises
    ------
    RuntimeError
        If ``new`` has another shape than ``target``.
    """
    if new.shape != target.shape:
        raise RuntimeError(f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                           f"{list(new.shape)}")
    new = new.to(target.dtype)
    base = target._base if target._is_view() else target
    taken = [] if views is None else [view for view in views.taken_of(base) if view is not target]
    if base is target and not taken:
        swap(target, new)
        return target
    written = written_through_view(base, target, new)  # (laid out as ``base``: its views are taken again)
    swap(base, written)  # (``written`` now stands for the old base)
    if views is not None:
        views.take_again(taken, base, written)
    if base is not target:
        swap(target, view_of_written(base, target, written))
    return target
