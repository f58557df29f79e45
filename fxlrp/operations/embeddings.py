"""Embedding lookups: the input layer of a model that takes token ids.

Ids are indices and carry no relevance, so relevance ends at the lookup's output, one vector
per token (see :mod:`fxlrp.relevance.sources`): ``fxlrp.attribute(explain, ids)`` returns the
relevance of each token, ``fxlrp.attribute_nodes(explain, ids, [<the embedding node>])`` the relevance of each token and
embedding dimension. ``EmbeddingBag`` looks up every token and reduces each bag: the lookups are
the sources, the bag sum (or mean) is an affine sum explained by the node's rule (the z-rule by
default), and its maximum routes relevance to the winning token as max pooling does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Routed, Spelling, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.sources import relevance_source
from fxlrp.relevance.straight_through import decomposed_in_backward


def lookup(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """``weight[ids]``, whose output is where relevance ends (a relevance source).
    (``F.embedding`` takes ``(ids, weight)``, ``torch.embedding`` ``(weight, ids)``.)"""
    output = function(*args, **kwargs)
    tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, Tensor)]
    ids = next(value for value in tensors if not value.is_floating_point())
    if any(carries_relevance(value) for value in tensors):
        return output  # a table computed from the explained inputs: a gather, routed natively
    return relevance_source(ids, output)


def embedding_module(module: nn.Embedding, parameters: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    return F.embedding, {
        "weight": parameters["weight"], "padding_idx": module.padding_idx, "max_norm": module.max_norm,
        "norm_type": module.norm_type, "scale_grad_by_freq": module.scale_grad_by_freq, "sparse": module.sparse,
    }


register(
    Operation(
        "embedding",
        Spelling(functions=(F.embedding, torch.embedding), modules=(nn.Embedding,), module_function=embedding_module),
        Routed(lookup, source=True),
        description="embedding lookup: the input layer of token ids; relevance ends at its output",
    )
)


def _bags(input: Tensor, offsets: Tensor | None, include_last_offset: bool) -> tuple[Tensor, Tensor, int]:
    """Flat ids, the bag of each id, and the number of bags (``F.embedding_bag``'s layouts)."""
    if input.dim() == 2:
        count, length = input.shape
        return input.reshape(-1), torch.arange(count, device=input.device).repeat_interleave(length), count
    starts = offsets[:-1] if include_last_offset else offsets
    count = starts.numel()
    bag = torch.zeros(input.numel(), dtype=torch.long, device=input.device)
    bag.index_add_(0, starts[1:], torch.ones_like(starts[1:]))
    return input, bag.cumsum(0), count


@functools.cache
def _signature(function: Callable[..., Tensor]) -> inspect.Signature:
    return inspect.signature(function)


def embedding_bag(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    r"""``F.embedding_bag``: the native kernel's output; relevance through its decomposition
    ``bag_b = \sum_{i \in b} p_i e_{id_i}`` (mode ``"sum"``, divided by the bag's size for ``"mean"``;
    ``p`` = ``per_sample_weights`` or 1), whose token embeddings ``e_{id_i}`` are the relevance
    sources. The sum takes the node's rule: with the z-rule (the default)
    ``R_{i,d} = p_i e_{id_i,d} R_{b,d} / bag_{b,d}``. Mode ``"max"`` routes each dimension's
    relevance to the token that wins it."""
    bag_call = _signature(function).bind(*args, **kwargs)
    bag_call.apply_defaults()
    settings = bag_call.arguments
    input, weight, mode = settings["input"], settings["weight"], settings["mode"]
    padding_idx, per_sample_weights = settings["padding_idx"], settings["per_sample_weights"]

    def exact(tokens: Tensor) -> Tensor:
        return function(*args, **kwargs)

    if not torch.is_grad_enabled() or carries_relevance(weight) or settings["max_norm"] is not None:
        return exact(weight)
    ids, bag, count = _bags(input, settings["offsets"], settings["include_last_offset"])
    tokens = relevance_source(ids, F.embedding(ids, weight))
    kept = torch.ones_like(ids, dtype=tokens.dtype) if padding_idx is None else (ids != padding_idx).to(tokens.dtype)
    if per_sample_weights is not None:
        kept = kept * per_sample_weights.reshape(-1).to(tokens.dtype)

    def reduce(values: Tensor) -> Tensor:
        if mode == "max":
            chosen = kept > 0
            empty = torch.full((count, values.shape[1]), float("-inf"), dtype=values.dtype, device=values.device)
            members = values[chosen]
            reduced = empty.scatter_reduce(0, bag[chosen, None].expand_as(members), members, "amax")
            return torch.where(torch.isinf(reduced), torch.zeros_like(reduced), reduced)
        summed = torch.zeros(count, values.shape[1], dtype=values.dtype, device=values.device)
        summed = summed.index_add(0, bag, values * kept[:, None])
        if mode == "mean":
            sizes = torch.zeros(count, dtype=values.dtype, device=values.device)
            sizes = sizes.index_add(0, bag, (kept != 0).to(values.dtype))
            summed = summed / sizes.clamp(min=1)[:, None]
        return summed

    def path(values: Tensor) -> Tensor:
        return reduce(values) if mode == "max" else call.affine(call.layer(reduce), values)

    return decomposed_in_backward(exact, path, tokens)


def _module_embedding_bag(
    input: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None, *, weight: Tensor,
    max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
    sparse: bool = False, include_last_offset: bool = False, padding_idx: int | None = None,
) -> Tensor:
    """``nn.EmbeddingBag``'s call order (input, offsets, per_sample_weights) over ``F.embedding_bag``."""
    return F.embedding_bag(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, include_last_offset, padding_idx)


def embedding_bag_module(module: nn.EmbeddingBag, parameters: dict[str, Any]):
    return _module_embedding_bag, {
        "weight": parameters["weight"], "max_norm": module.max_norm, "norm_type": module.norm_type,
        "scale_grad_by_freq": module.scale_grad_by_freq, "mode": module.mode, "sparse": module.sparse,
        "include_last_offset": module.include_last_offset, "padding_idx": module.padding_idx,
    }


register(
    Operation(
        "embedding_bag",
        Spelling(functions=(F.embedding_bag,), modules=(nn.EmbeddingBag,), module_function=embedding_bag_module),
        Affine(embedding_bag, default_rule=proportional, source=True),
        description="embedding bag: token lookups (relevance sources) summed or averaged per bag (z-rule), "
        "or their maximum (winner takes all)",
    )
)
