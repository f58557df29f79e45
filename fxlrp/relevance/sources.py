"""Where relevance ends inside a model: the outputs of embedding lookups.

A model that takes token ids has no input relevance can reach: ids are indices. Its input layer
is the embedding lookup, whose output (one vector per token) is where LRP's relevance ends, as it
ends at the pixels of an image. The lookup's output is therefore made a leaf that collects
relevance in ``.grad``; while :func:`sources_collected` is active each such leaf is recorded with
the indices it was looked up with, so that :func:`fxlrp.attribute` can hand the relevance back
per token of the ids the user passed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, get_gradient_edge


@dataclass(frozen=True)
class RelevanceSource:
    """An embedding lookup's output and the indices it was looked up with.

    The output is named by its gradient edge and its values as the lookup made them, taken at
    the lookup, as the explained inputs are: code run eagerly that writes into the output
    (``embeddings += position_embeddings``) gives the Python object the written values
    (:func:`fxlrp.eager.in_place.replace_values`), while relevance belongs to the lookup's.
    """

    indices: Tensor
    """The indices (token ids) the lookup was made with."""
    edge: GradientEdge
    """The gradient edge of the lookup's output, where its relevance arrives."""
    embedding: Tensor
    """The output's values as the lookup made them (detached)."""


@dataclass(frozen=True)
class Lookups:
    """The embedding lookups of a run: the relevance sources, and the indices of the others."""

    ids: tuple[Tensor, ...]
    """The explained token ids."""
    sources: list[RelevanceSource]
    """The lookups of the explained ids, in the order they were made."""
    other_indices: list[Tensor]
    """The indices of the other lookups (positions, token types)."""

    def of_copied_ids(self) -> bool:
        """Whether some lookup that is no source looked up a copy of the explained ids.

        A copy the model made, not a view: all of the ids' values are among its indices (XLNet
        transposes its ids, Longformer pads them to a multiple of its attention window). An
        integer input of two values at most (a padding mask of 0 and 1, found among any
        positions) is not taken for ids.

        Returns
        -------
        bool
            True if such a lookup was made.
        """
        return any(indices.dtype == ids.dtype and indices.numel() >= ids.numel()
                   and ids.unique().numel() > 2 and bool(torch.isin(ids, indices).all())
                   for indices in self.other_indices for ids in self.ids)


_collected: ContextVar[Lookups | None] = ContextVar("fxlrp_relevance_sources", default=None)


@contextmanager
def sources_collected(ids: Sequence[Tensor]) -> Iterator[Lookups]:
    """Record the relevance sources made while the block runs, in the order they are made.

    The sources are the lookups of the explained token ``ids`` (or of views of them,
    :func:`same_values`). Other lookups - of positions (RoFormer's sinusoidal table, BERT's
    learned one), of token types the model makes itself - are constants of the explanation
    there, as the rest of the model's parameters: a position embedding that multiplies the
    queries (RoFormer's rotary one) would otherwise be a relevance-carrying factor of that
    product and take a share of its relevance. (The explainer called by itself keeps every
    lookup a leaf: its outputs are then the model's own with gradients on, bit for bit, where
    kernels are chosen by whether a lookup requires gradients - T5's attention, whose position
    bias is one.)

    Parameters
    ----------
    ids : sequence of Tensor
        The explained token ids.

    Yields
    ------
    Lookups
        The lookups of the block, filled as they are made.
    """
    lookups = Lookups(tuple(ids), [], [])
    token = _collected.set(lookups)
    try:
        yield lookups
    finally:
        _collected.reset(token)


def relevance_source(indices: Tensor, embedding: Tensor) -> Tensor:
    """``embedding`` as a leaf that collects the relevance reaching it.

    Parameters
    ----------
    indices : Tensor
        The indices the lookup was made with.
    embedding : Tensor
        The lookup's output.

    Returns
    -------
    Tensor
        When gradients are recorded, a leaf with the values of ``embedding`` that requires
        gradients; inside :func:`sources_collected`, only for the explained ids, recorded with
        its ``indices``. Otherwise ``embedding`` itself.
    """
    if not torch.is_grad_enabled() or embedding.requires_grad or not embedding.is_floating_point():
        return embedding
    lookups = _collected.get()
    if lookups is not None and not any(same_values(indices, ids) for ids in lookups.ids):
        lookups.other_indices.append(indices)
        return embedding
    leaf = embedding.detach().requires_grad_()
    if lookups is not None:
        lookups.sources.append(RelevanceSource(indices, get_gradient_edge(leaf), leaf.detach()))
    return leaf


def same_values(indices: Tensor, ids: Tensor) -> bool:
    """Whether ``indices`` are ``ids`` or a view of them.

    A view such as ``ids.view(-1, length)``, or ``ids.long()`` of long ids: same storage, same
    number of elements.

    Parameters
    ----------
    indices : Tensor
        A lookup's indices.
    ids : Tensor
        The explained ids.

    Returns
    -------
    bool
        True if both are the same elements of the same storage.
    """
    return (
        indices.numel() == ids.numel()
        and indices.untyped_storage().data_ptr() == ids.untyped_storage().data_ptr()
        and indices.storage_offset() == ids.storage_offset()
    )


def looked_up_with(value: Any, sources: list[RelevanceSource]) -> list[RelevanceSource]:
    """The embedding lookups made with the token ids ``value`` or a view of them.

    Parameters
    ----------
    value : Any
        An input of the explained call.
    sources : list of RelevanceSource
        The lookups of the call (:attr:`Lookups.sources`).

    Returns
    -------
    list of RelevanceSource
        Those made with ``value``, in order; none for a value that is no integer tensor.
    """
    if not may_be_token_ids(value):
        return []
    return [source for source in sources if same_values(source.indices, value)]


def token_relevance(ids: Tensor, found: list[RelevanceSource], relevance: Iterator[Tensor | None]) -> Tensor:
    """Relevance per token: what reached each lookup made with ``ids``, summed over the
    embedding dimension.

    Parameters
    ----------
    ids : Tensor
        The token ids.
    found : list of RelevanceSource
        The lookups made with them (:func:`looked_up_with`).
    relevance : iterator
        The relevance that reached each lookup's output, in the order of ``found`` (None: none).

    Returns
    -------
    Tensor
        The relevance of each token, of the shape of ``ids``.
    """
    total = torch.zeros(ids.shape, dtype=found[0].embedding.dtype, device=found[0].embedding.device)
    for _ in found:
        share = next(relevance)
        if share is not None:
            total += share.reshape(ids.numel(), -1).sum(dim=1).reshape(ids.shape)
    return total


def may_be_token_ids(value: Any) -> bool:
    """Whether a value may be token ids an embedding looks up: a tensor neither floating-point nor complex.

    Parameters
    ----------
    value
        An input.

    Returns
    -------
    bool
        True for an integer or bool tensor.
    """
    return isinstance(value, Tensor) and not value.is_floating_point() and not value.is_complex()
