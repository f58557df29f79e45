"""In-place writes spelled out of place: the functions canonical form (:mod:`fxlrp.graph.canonicalise`)
and code run eagerly (:mod:`fxlrp.eager.interpret`) put in place of ``copy_``, ``fill_``,
``x[i] = v`` and writes through a view, which the registry's entries route relevance through
(:mod:`fxlrp.operations.neutral`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fxlrp.registry.spellings import WRITES


def copied(target: Tensor, source: Any, non_blocking: bool = False) -> Tensor:
    """``target.copy_(source)`` out of place.

    Relevance goes back to ``source``; ``target``'s, replaced, to nothing.

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    source : Tensor or number
        The values written.
    non_blocking : bool, default False
        As for ``Tensor.copy_``.

    Returns
    -------
    Tensor
        ``source``'s values in ``target``'s shape and dtype, a new tensor.
    """
    return torch.empty_like(target).copy_(source, non_blocking)


def filled(target: Tensor, value: Any) -> Tensor:
    """``target.fill_(value)`` out of place.

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    value : number or Tensor
        The value.

    Returns
    -------
    Tensor
        A new tensor of ``target``'s shape and dtype, filled with ``value``.
    """
    return torch.empty_like(target).fill_(value)


def zeroed(target: Tensor) -> Tensor:
    """``target.zero_()`` out of place.

    Parameters
    ----------
    target : Tensor
        The tensor written into.

    Returns
    -------
    Tensor
        Zeros of ``target``'s shape and dtype.
    """
    return torch.zeros_like(target)


def items_set(target: Tensor, index: Any, value: Any) -> Tensor:
    """``target[index] = value`` out of place (relevance of the replaced items goes to nothing).

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    index : Any
        The index.
    value : Tensor or number
        The values written.

    Returns
    -------
    Tensor
        A copy of ``target`` with the items written.
    """
    written = target.clone()
    written[index] = value
    return written


def diagonal_filled(target: Tensor, value: Any, wrap: bool = False) -> Tensor:
    """``target.fill_diagonal_(value, wrap)`` out of place.

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    value : number
        The value.
    wrap : bool, default False
        As for ``Tensor.fill_diagonal_``.

    Returns
    -------
    Tensor
        A copy of ``target`` with its diagonal filled.
    """
    return target.clone().fill_diagonal_(value, wrap)


WRITTEN_COPIES = {"copy_": copied, "fill_": filled, "zero_": zeroed, "fill_diagonal_": diagonal_filled,
                  "__setitem__": items_set}
"""The in-place writes (:data:`~fxlrp.registry.spellings.WRITES`) as the functions that return the
written tensor: relevance is routed as the values are."""
assert WRITTEN_COPIES.keys() == WRITES


def written_through_view(base: Any, view: Tensor, values: Tensor) -> Any:
    """``base`` with the elements that ``view`` shows of it replaced by ``values``.

    An in-place write into a view, out of place. Relevance follows the values: the written
    elements' to ``values``, the others' to ``base``.

    Parameters
    ----------
    base : Any
        The tensor the view may show.
    view : Tensor
        The tensor written into.
    values : Tensor
        The values written.

    Returns
    -------
    Any
        A new tensor with ``base``'s strides; ``base`` itself where ``view`` is no view of it
        (indexing by a tensor copies).
    """
    if not _aliases(view, base):
        return base
    written = torch.empty_strided(base.size(), base.stride(), dtype=base.dtype, device=base.device)
    written.copy_(base)
    _region(written, view, base).copy_(values)
    return written


def view_of_written(written: Any, alias: Any, base: Any) -> Any:
    """A view of ``base`` taken before a write, taken of the written tensor instead.

    Parameters
    ----------
    written : Any
        What :func:`written_through_view` returned.
    alias : Any
        The view of ``base``, taken before the write.
    base : Any
        The tensor written into.

    Returns
    -------
    Any
        The same view of ``written``; ``alias`` itself where it was no view of ``base``.
    """
    if written is base or not _aliases(alias, base):
        return alias
    return _region(written, alias, base)


def _aliases(view: Any, base: Any) -> bool:
    return (isinstance(view, Tensor) and isinstance(base, Tensor)
            and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())


def _region(tensor: Tensor, view: Tensor, base: Tensor) -> Tensor:
    """The elements of ``tensor`` (laid out as ``base``) at the place ``view`` shows of ``base``."""
    return tensor.as_strided(view.size(), view.stride(),
                             tensor.storage_offset() + view.storage_offset() - base.storage_offset())
