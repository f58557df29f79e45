"""Perturbation curves of token sequences: deletion and insertion with a baseline token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.evaluate.curves import (
    EvaluationInputError,
    PerturbationCurves,
    as_relevance,
    check_curve_options,
    tensor_curves,
)


def token_curves(model: Callable[..., Any], input_ids: Tensor, relevance: Any, target: Any = None, *,
                 baseline_token: int, attention_mask: Tensor | None = None, perturbable: Tensor | None = None,
                 orders: str | tuple[str, ...] = ("morf", "lerf"), mode: str = "deletion", score: str = "logit",
                 features_per_step: int | None = None, steps: int | None = None, batch_size: int = 256,
                 progress: bool = True) -> PerturbationCurves:
    r"""Deletion / insertion curves of token sequences: the model's score as tokens are replaced by
    ``baseline_token`` (deletion, most or least relevant first) or restored from a sequence of
    baseline tokens (insertion).

    Each (sequence, order, step) is one row of a batch of token ids; the model runs on
    ``batch_size`` of them at a time. A token's place is kept (the baseline token takes it), so
    positions and the sequence length do not change.

    Parameters
    ----------
    model : callable
        Called as ``model(ids)`` (with ``attention_mask``: ``model(ids, attention_mask=mask)``),
        returning scores ``[batch, classes]`` or an output with ``.logits`` (a Hugging Face
        classifier); in evaluation mode.
    input_ids : Tensor
        ``[samples, length]`` int64.
    relevance : Tensor, numpy.ndarray or array-like
        ``[samples, length]`` per token, or ``[samples, length, dims]`` per embedding value
        (summed over ``dims``).
    target : int, Tensor, callable or None
        The class followed, one for all or per sequence; None: the predicted class; a callable
        reads each input's score from the model's output (as in :func:`~fxlrp.evaluate.image_curves`).
    baseline_token : int
        The token id a perturbed token becomes (a ``[MASK]``, ``[UNK]`` or padding token).
    attention_mask : Tensor or None
        ``[samples, length]``: passed to the model with each row; positions where it is 0
        (padding) are never perturbed.
    perturbable : Tensor or None
        ``[samples, length]`` bool: the positions that may be perturbed (e.g. not ``[CLS]`` and
        ``[SEP]``); None: all (within ``attention_mask``). Sequences with different numbers of
        perturbable tokens need ``steps`` (the default then: as many as the longest has).
    orders, mode, score, features_per_step, steps, batch_size, progress
        As :func:`fxlrp.evaluate.image_curves`.

    Returns
    -------
    PerturbationCurves
    """
    orders = check_curve_options(model, orders, mode, score)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        shape = list(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise EvaluationInputError(f"token_curves takes token ids [samples, length] (an integer tensor), got {shape}")
    samples, length = input_ids.shape
    values = as_relevance(relevance, input_ids.device)
    if values.dim() == 3:
        values = values.sum(dim=2)
    if tuple(values.shape) != (samples, length):
        raise EvaluationInputError(f"relevance has shape {list(values.shape)}; for token ids {list(input_ids.shape)} "
                                   f"give [{samples}, {length}] or [{samples}, {length}, dims]")
    valid = torch.ones(samples, length, dtype=torch.bool, device=input_ids.device)
    extra = {}
    for name, mask in (("attention_mask", attention_mask), ("perturbable", perturbable)):
        if mask is None:
            continue
        if not isinstance(mask, Tensor) or tuple(mask.shape) != (samples, length):
            raise EvaluationInputError(f"{name} must be a tensor [{samples}, {length}] like the token ids")
        valid &= mask.to(input_ids.device).bool()
    if attention_mask is not None:
        extra["attention_mask"] = attention_mask.to(input_ids.device)
    baseline = torch.full((1, 1), int(baseline_token), dtype=input_ids.dtype, device=input_ids.device)
    return tensor_curves(model, input_ids, values, torch.arange(length, device=input_ids.device), baseline, target,
                         orders=orders, mode=mode, score=score, features_per_step=features_per_step, steps=steps,
                         valid=valid, batch_size=batch_size, progress=progress, extra=extra)
