"""What a model's output means to the command line: the tensor it explains, the ``[batch, classes]``
scores, the explained classes, and why a sample's explanation cannot be used."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.app.cli_options import InputError
from fxlrp.errors import ExplanationInputError
from fxlrp.explain.model_rejection import model_consulted, model_of


def explained_output(result: Any) -> Tensor:
    """The tensor the command line explains in a model's result.

    Parameters
    ----------
    result
        What the model returns.

    Returns
    -------
    Tensor
        The result itself, a torchvision segmentation model's ``"out"`` (not its ``"aux"``
        training head) or a Hugging Face output's ``logits``; an :class:`InputError` for anything
        else.
    """
    if isinstance(result, Tensor):
        return result
    if isinstance(result, Mapping) and isinstance(result.get("out"), Tensor):
        return result["out"]
    logits = getattr(result, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    raise InputError(f"the model returns a {type(result).__name__}; fxlrp explain needs a classifier returning "
                     f"[batch, classes] scores or a segmentation model returning [batch, classes, height, width]")


def class_scores(output: Tensor) -> Tensor:
    """The ``[batch, classes]`` scores of an explained output.

    Parameters
    ----------
    output
        A classifier's ``[batch, classes]`` logits, or an image-shaped output ``[batch, classes,
        height, width]`` (a segmentation model's).

    Returns
    -------
    Tensor
        The logits; for an image-shaped output each class's logits summed over the pixels, which
        is what explaining a class over the image explains. An :class:`InputError` for other
        shapes.
    """
    if output.dim() == 2:
        return output
    if output.dim() >= 4:
        return output.sum(dim=tuple(range(2, output.dim())))
    raise InputError(f"fxlrp explain needs a classifier returning [batch, classes] scores or a segmentation model "
                     f"returning [batch, classes, height, width]; this model returns shape {list(output.shape)}")


def probe_model(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> tuple[Tensor, bool]:
    """The ``[batch, classes]`` scores of ``inputs`` (:func:`class_scores`), without relevance, and
    whether the model's output is image-shaped (a segmentation model's).

    Parameters
    ----------
    explain
        The explainer (or the model).
    inputs
        A batch of inputs.
    paths
        Their names, for the message when the model cannot take them.

    Returns
    -------
    tuple
        The scores and whether they are summed over pixels.
    """
    try:  # (the explainer's forward runs its traced graph; the model's own refusal is what the user can act on)
        with torch.no_grad(), model_consulted(explain, model_of(explain), (inputs,), {}):
            result = explain(inputs)
    except ExplanationInputError as error:
        raise InputError(f"{paths[0]}: {error}") from None
    output = explained_output(result)
    return class_scores(output), output.dim() > 2


def model_scores(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> torch.Tensor:
    """The ``[batch, classes]`` scores of ``inputs`` (:func:`class_scores`), without relevance."""
    return probe_model(explain, inputs, paths)[0]


def checked_targets(target: int | tuple[int, int] | None, logits: torch.Tensor) -> torch.Tensor:
    """Each sample's class: ``target``'s (a contrast's first class), or the predicted one; checked to exist."""
    classes = logits.shape[1]
    if target is None:
        return logits.argmax(dim=1)
    for index in target if isinstance(target, tuple) else (target,):
        if not 0 <= index < classes:
            raise InputError(f"--target {index} is out of range: the model has {classes} classes (0..{classes - 1})")
    first = target[0] if isinstance(target, tuple) else target
    return torch.full((logits.shape[0],), first, dtype=torch.long)


def unexplainable(scores: Tensor, relevance: Tensor, dtype: str = "float32") -> list[str | None]:
    """Per sample, why its explanation cannot be used (its scores or relevance NaN or Inf), or None.

    Parameters
    ----------
    scores
        ``[batch, classes]`` scores (:func:`class_scores`).
    relevance
        ``[batch, ...]`` relevance of the inputs.
    dtype
        The precision the model ran in (``--dtype``), for the advice.

    Returns
    -------
    list
        One entry per sample.
    """
    advice = ("; float16 holds values up to 65504: use --dtype bfloat16 or float32" if dtype == "float16"
              else "")
    scores_finite = torch.isfinite(scores.detach()).flatten(1).all(dim=1).tolist()
    relevance_finite = torch.isfinite(relevance.detach()).flatten(1).all(dim=1).tolist()
    reasons: list[str | None] = []
    for scores_ok, relevance_ok in zip(scores_finite, relevance_finite, strict=True):
        if not scores_ok:
            reasons.append(f"the model's output is NaN or Inf for it: an activation overflowed{advice}")
        elif not relevance_ok:
            reasons.append(f"its relevance came out NaN or Inf: relevance divided by a near-zero output overflowed"
                           f"{advice or '; choose a composite with a larger stabiliser (--composite)'}")
        else:
            reasons.append(None)
    return reasons
