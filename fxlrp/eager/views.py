"""View tracking: the views of relevance-carrying tensors a run takes, taken again of a base a
write replaced, and the exchange of the tensors two Python objects stand for."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from fxlrp.registry.writes import view_of_written


class Views:
    """The views of relevance-carrying tensors taken in one run, by their base.

    After a write has replaced a base (:func:`replace_values`) each view taken before it is
    taken again of the written base, as it would see the write in memory.
    """

    def __init__(self) -> None:
        self.of_base: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}

    def note(self, view: Tensor) -> None:
        """Note a view (held weakly).

        Parameters
        ----------
        view : Tensor
            A view of a relevance-carrying tensor.
        """
        base = view._base
        entry = self.of_base.get(id(base))
        if entry is None or entry[0]() is not base:
            entry = self.of_base[id(base)] = (weakref.ref(base), [])
        entry[1].append(weakref.ref(view))

    def taken_of(self, base: Tensor) -> list[Tensor]:
        """The views of ``base`` still alive.

        Parameters
        ----------
        base : Tensor
            A base tensor.

        Returns
        -------
        list of Tensor
            Its noted views that are alive.
        """
        entry = self.of_base.get(id(base))
        if entry is None or entry[0]() is not base:
            return []
        return [view for view in (reference() for reference in entry[1]) if view is not None]

    def take_again(self, views: list[Tensor], base: Tensor, old: Tensor) -> None:
        """Make ``views`` of ``old`` views of ``base``, which replaced it.

        Parameters
        ----------
        views : list of Tensor
            The views, changed in place.
        base : Tensor
            The written base.
        old : Tensor
            The tensor the views were taken of.
        """
        for view in views:
            swap(view, view_of_written(base, view, old))



def swap(tensor: Tensor, other: Tensor) -> None:
    """Exchange the tensors two Python objects stand for, with their attributes (roles)."""
    tensor.__dict__, other.__dict__ = other.__dict__, tensor.__dict__
    torch._C._swap_tensor_impl(tensor, other)
