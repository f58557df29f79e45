"""What is explained: the relevance an explanation starts from at the model's output (a class, a
contrast of two, each sample's value, a pixel's class) and which output of a model's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def output_relevance(output: Tensor, target: Any, samples: int | None = None) -> Tensor:
    """The relevance to start from: the output times a one-hot mask of ``target``.

    ``target`` may be a class index, a tensor of one index per sample, None (each sample's
    highest output), a pair ``(a, b)`` of class indices (a contrast: ``R = out_a e_a - out_b e_b``,
    the relevance of logit ``a`` minus logit ``b``, e.g. two candidate next tokens) or a tensor of
    the output's shape (taken as the relevance itself). Classes are in the last dimension
    (``[batch, classes]``, ``[batch, positions, classes]``), except in an image-shaped output of four
    or more dimensions (``[batch, classes, height, width]``, a segmentation model's), where they are
    in dimension 1 and a class is explained at every pixel (None: each pixel's top class).
    ``samples``: the batch size of the explained inputs, if they have one; a one-dimensional output
    of that length holds one value per sample (a regression, a score, a node's): None explains each
    sample's value, an index the value of that sample.
    """
    if isinstance(target, Tensor) and target.shape == output.shape and target.is_floating_point():
        return target
    if output.dim() == 0:
        return output.detach().clone()
    if target is None and output.dim() == 1 and samples is not None and output.shape[0] == samples:
        return output.detach().clone()  # (an index still picks one sample: a node of a graph)
    if isinstance(target, tuple) and len(target) == 2:
        return output_relevance(output, target[0], samples) - output_relevance(output, target[1], samples)
    if output.dim() > 3:
        return _dense_relevance(output, target)
    return _class_relevance(output, target)


def _class_relevance(output: Tensor, target: Any, given: Tensor | None = None) -> Tensor:
    """The output times a one-hot mask over its last dimension, the classes: at ``target`` (an
    index, or one per sample), or at each sample's highest output (None). ``given``: the output as
    the model gave it, when its classes were moved last (an image-shaped output)."""
    if target is None:
        target = output.detach().argmax(dim=-1)
    mask = torch.zeros_like(output)
    index = torch.as_tensor(target, device=output.device, dtype=torch.long)
    _check_target(index, target, output, given)
    if index.dim() == 0:
        mask[..., index] = 1.0
    else:
        mask.scatter_(-1, index.reshape(*output.shape[:-1], 1), 1.0)
    return output.detach() * mask


def _dense_relevance(output: Tensor, target: Any) -> Tensor:
    """:func:`output_relevance` of an image-shaped output ``[batch, classes, *spatial]`` (a
    segmentation model's): its classes are in dimension 1 (torch's convention for convolutional
    outputs), a class index (or one per sample) is explained at every position, None explains each
    position's top class."""
    if isinstance(target, Tensor) and target.dim() == 1 and target.numel() == output.shape[0]:
        target = target.view(-1, *[1] * (output.dim() - 2)).expand(output.shape[:1] + output.shape[2:])
    return _class_relevance(output.movedim(1, -1), target, given=output).movedim(-1, 1)


def _check_target(index: Tensor, target: Any, output: Tensor, given: Tensor | None = None) -> None:
    """A ValueError in the user's terms for a class index the output does not have, or a number of
    indices that is not one per sample (instead of an indexing error from inside torch); ``output``
    has its classes last, ``given`` is the output as the model gave it if they were not."""
    classes, samples = output.shape[-1], output[..., 0].numel()
    shape = list((output if given is None else given).shape)
    if index.dim() > 0 and index.numel() != samples:
        per = f"one per sample ({samples})" if given is None else f"one per sample ({shape[0]}) or position ({samples})"
        raise ValueError(f"target has {index.numel()} class indices; the explained output {shape} needs one index, "
                         f"or {per}")
    if index.numel() and bool((index < -classes).any() | (index >= classes).any()):
        shown = (target.tolist() if target.numel() <= 16 else f"tensor of shape {list(target.shape)}") \
            if isinstance(target, Tensor) else target
        where = f"has {classes} classes in its last dimension" if given is None else \
            f"is image-shaped, with {classes} classes in dimension 1"
        raise ValueError(f"target {shown!r} is out of range: the explained output {shape} {where} "
                         f"(indices 0 to {classes - 1})")


def per_copy(target: Any, batch: int) -> Tensor:
    """One class index per sample of a copy: an index for all, or one per sample."""
    index = torch.as_tensor(target)
    if index.is_floating_point() or index.dim() > 1 or (index.dim() == 1 and len(index) != batch):
        raise ValueError(f"attribute(..., repeat=...) takes class indices as targets (an index, or one per sample "
                         f"of the batch of {batch}); got {target!r}; leave repeat=0 for other targets")
    return index.long().expand(batch)


def default_output(result: Any, mask: Tensor | None = None) -> Any:
    """The tensor to explain when no ``output=`` is given: the output itself; a model output with
    ``logits`` (Hugging Face's), its logits - of the last position if they are per position
    ``[batch, length, vocabulary]``, which is a causal language model's next-token prediction.
    With a padding ``mask`` of the logits' ``[batch, length]`` (1 at tokens, 0 at padding), each
    sequence's last token: in a batch padded on the right, a shorter sequence's last position is
    padding, whose prediction nobody asked to explain."""
    logits = getattr(result, "logits", None) if not isinstance(result, Tensor) else None
    if not isinstance(logits, Tensor):
        return result
    if logits.dim() != 3:
        return logits
    if mask is None or mask.shape != logits.shape[:2]:
        return logits[:, -1]
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask != 0, positions, -1).amax(dim=1).to(logits.device)  # (-1: no token marked)
    return logits[torch.arange(logits.shape[0], device=logits.device), last]


PADDING_MASK = "attention_mask"


def padding_mask(explain: nn.Module, inputs: Tensor | Sequence[Any]) -> Tensor | None:
    """The tensor given for the model's input named :data:`PADDING_MASK`, if any (``inputs`` as
    :func:`attribute` takes them: by position)."""
    names = getattr(explain, "input_names", ())
    if PADDING_MASK not in names or isinstance(inputs, Tensor):
        return None
    position = names.index(PADDING_MASK)
    mask = inputs[position] if position < len(inputs) else None
    return mask if isinstance(mask, Tensor) else None
