"""What is explained: the relevance an explanation starts from at the model's output (a class, a
contrast of two, each sample's value, a pixel's class) and which output of a model's result.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.errors import ExplanationInputError

TARGETS = (
    "A target is None (each sample's highest output: the predicted class), a class index (an int; negative "
    "ones count from the end, as in torch indexing), a tensor of one class index per sample, a pair (a, b) of "
    "these (logit a minus logit b), a float tensor of the explained output's shape (the output relevance "
    "itself), a Region (a class over a box or mask of an image-shaped output), or a list of these (one "
    "explanation each)"
)
"""What :func:`output_relevance` takes, for error messages."""

_WORDS = {"predicted": "None", "prediction": "None", "pred": "None", "max": "None", "argmax": "None",
          "top": "None", "best": "None", "label": "the labels", "labels": "the labels", "true": "the labels"}


def _numpy_kind(value: Any, kinds: str) -> bool:
    """A NumPy scalar of one of ``kinds`` (``"b"``: bool, ``"iu"``: integer, ``"f"``: float)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in kinds


def _is_index(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or _numpy_kind(value, "iu")


def refuse_unknown_target(target: Any, *, many: bool = True) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` for a target that is none of the kinds
    :func:`output_relevance` takes (see :data:`TARGETS`), before anything runs: a name (``"cat"``,
    ``"predicted"``), a float or bool where a class index belongs, a dict, a tensor of bools or
    one on the meta device (which holds no values). Whether an index is in range, and whether a
    float tensor has the output's shape, is known when the output is.

    Parameters
    ----------
    target
        The target as given to :func:`fxlrp.attribute`.
    many
        Whether a list is a list of targets (one explanation each), as at the top level.

    Raises
    ------
    ExplanationInputError
        Saying what the target is and what targets are.
    """
    if many and isinstance(target, list):
        for each in target:
            refuse_unknown_target(each, many=False)
        return
    if target is None or _is_index(target) or isinstance(target, Region):
        return
    if isinstance(target, tuple) and len(target) == 2:
        for each in target:
            refuse_unknown_target(each, many=False)
        return
    if isinstance(target, bool) or _numpy_kind(target, "b"):
        raise ExplanationInputError(f"target {target!r} is a bool; a class is given by its index, an int. {TARGETS}")
    if isinstance(target, float) or _numpy_kind(target, "f"):
        instead = f" (target={int(target)})" if float(target).is_integer() else ""
        raise ExplanationInputError(f"target {target!r} is a float; a class is given by its index, an "
                                    f"int{instead}. {TARGETS}")
    if isinstance(target, (str, bytes)):
        meant = _WORDS.get(str(target).strip().lower())
        hint = (" (for the predicted class pass target=None)" if meant == "None" else
                " (for each sample's label pass the labels as a tensor of class indices)" if meant else "")
        raise ExplanationInputError(f"target {target!r} is not a target fxlrp knows{hint}. {TARGETS}")
    if isinstance(target, (list, tuple)):
        if all(_is_index(each) or isinstance(each, (list, tuple)) for each in target):
            for each in target:  # (indices per sample, nested as a tensor of them would be)
                if isinstance(each, (list, tuple)):
                    refuse_unknown_target(each, many=False)
            return
        other = next(each for each in target if not (_is_index(each) or isinstance(each, (list, tuple))))
        raise ExplanationInputError(f"target {target!r} holds {other!r}, which is not a class index (an int). "
                                    f"{TARGETS}")
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(target, numpy.ndarray):
        if target.dtype.kind not in "iuf":
            raise ExplanationInputError(f"target is a NumPy array of {target.dtype}. {TARGETS}")
        return
    if isinstance(target, Tensor):
        if target.device.type == "meta":
            raise ExplanationInputError("target is a tensor on the meta device, which holds no values: give it on "
                                        "the CPU or on the inputs' device")
        if target.dtype == torch.bool or target.is_complex():
            raise ExplanationInputError(f"target is a tensor of {target.dtype}; class indices are integers (a mask "
                                        f"of classes is not a target). {TARGETS}")
        return
    raise ExplanationInputError(f"target is a {type(target).__name__}, which is not a target fxlrp knows. {TARGETS}")


def output_relevance(output: Tensor, target: Any, samples: int | None = None) -> Tensor:
    """The relevance to start from: the output times a one-hot mask of ``target``.

    ``target`` may be a class index, a tensor of one index per sample, None (each sample's
    highest output), a pair ``(a, b)`` of class indices (a contrast: ``R = out_a e_a - out_b e_b``,
    the relevance of logit ``a`` minus logit ``b``, e.g. two candidate next tokens) or a float
    tensor of the output's shape (taken as the relevance itself; moved to the output's device).
    Class indices are integers: negative ones count from the end, as in torch indexing
    (``-1``: the last class), and a float or a float tensor of another shape than the output's
    is an error, never rounded to an index. Classes are in the last dimension
    (``[batch, classes]``, ``[batch, positions, classes]``), except in an image-shaped output of four
    or more dimensions (``[batch, classes, height, width]``, a segmentation model's), where they are
    in dimension 1 and a class is explained at every pixel (None: each pixel's top class), or over
    a :class:`Region` of them.
    ``samples``: the batch size of the explained inputs, if they have one; a one-dimensional output
    of that length holds one value per sample (a regression, a score, a node's): None explains each
    sample's value, an index the value of that sample.

    Parameters
    ----------
    output
        The explained output.
    target
        As described above.
    samples
        As described above.

    Returns
    -------
    Tensor
        The relevance to start from, of the output's shape.

    Raises
    ------
    ExplanationInputError
        For an index out of range, a number of indices that is not one per sample, a float (tensor)
        target not of the output's shape.
    """
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(target, numpy.ndarray):
        target = torch.as_tensor(target)
    if isinstance(target, Tensor) and target.shape == output.shape and target.is_floating_point():
        return target.to(device=output.device)
    if isinstance(target, (Region, FromOutput)):
        return target.relevance(output)
    if output.dim() == 0:
        return output.detach().clone()
    if target is None and output.dim() == 1 and samples is not None and output.shape[0] == samples:
        return output.detach().clone()  # (an index still picks one sample: a node of a graph)
    if isinstance(target, tuple) and len(target) == 2:
        return output_relevance(output, target[0], samples) - output_relevance(output, target[1], samples)
    if output.dim() > 3:
        return _dense_relevance(output, target)
    return _class_relevance(output, target)


@dataclasses.dataclass(frozen=True)
class Region:
    """A class explained over a region of an image-shaped output (a segmentation model's
    ``[batch, classes, height, width]``): relevance starts as that class's logit at each pixel of
    the region, 0 elsewhere, ``R_{c,h,w} = z_{c,h,w}`` for ``(h, w)`` in the region: the
    relevance of the class's logits summed over the region. Give ``box=(x0, y0, x1, y1)`` in
    the output's pixels (``x`` the column, ``y`` the row; torchvision's segmentation models give
    their output at the image's size): the pixels whose centres lie in the box, for whole numbers
    ``[y0:y1, x0:x1]``; or ``mask=``, a bool tensor of the output's ``[height, width]`` (one for
    all samples) or ``[batch, height, width]``. Relevance is linear in where it starts, so a
    region's explanation is the sum of its pixels' explanations.

    Parameters
    ----------
    target
        The class: an index, a tensor of one per sample, a pair ``(a, b)`` (logit ``a`` minus
        logit ``b``), or None (each pixel's top class), as :func:`output_relevance` takes them.
    box
        ``(x0, y0, x1, y1)``, with ``x0 < x1`` and ``y0 < y1``.
    mask
        A bool tensor; give ``box`` or ``mask``, not both.

    Raises
    ------
    ExplanationInputError
        For neither or both of ``box`` and ``mask``, a box that is not four increasing numbers, a
        mask that is not a bool tensor, a target that is no class.
    """

    target: Any = None
    box: Sequence[float] | Tensor | None = None
    mask: Tensor | None = None

    def __post_init__(self) -> None:
        if (self.box is None) == (self.mask is None):
            raise ExplanationInputError("a Region takes box=(x0, y0, x1, y1) or mask= (a bool tensor [height, width] "
                                        "or [batch, height, width]), one of them")
        if isinstance(self.target, Region):
            raise ExplanationInputError("a Region's target is a class (an index, one per sample, a pair or None), "
                                        "not another Region")
        refuse_unknown_target(self.target, many=False)
        if self.mask is not None:
            if not isinstance(self.mask, Tensor) or self.mask.dtype != torch.bool:
                shown = f"a tensor of {self.mask.dtype}" if isinstance(self.mask, Tensor) else \
                    f"a {type(self.mask).__name__}"
                raise ExplanationInputError(f"a Region's mask is {shown}; give a bool tensor (e.g. labels == k, or "
                                            "weights > 0.5)")
            return
        corners = torch.as_tensor(self.box, dtype=torch.float64).flatten() if _numbers(self.box) else None
        if corners is None or corners.numel() != 4 or not bool(torch.isfinite(corners).all()):
            raise ExplanationInputError(f"a Region's box is {self.box!r}; give four numbers (x0, y0, x1, y1) in the "
                                        "output's pixels")
        x0, y0, x1, y1 = corners.tolist()
        if not (x0 < x1 and y0 < y1):
            raise ExplanationInputError(f"a Region's box {tuple(corners.tolist())} is empty: it is (x0, y0, x1, y1) "
                                        "with x0 < x1 and y0 < y1 (x the column, y the row)")

    def where(self, output: Tensor) -> Tensor:
        """The region's pixels of ``output``: a bool tensor ``[batch or 1, *spatial]``.

        Parameters
        ----------
        output
            The explained output ``[batch, classes, *spatial]``, at least two spatial dimensions.

        Returns
        -------
        Tensor
            True at the region's pixels (a box: in the last two dimensions, every frame of a video).

        Raises
        ------
        ExplanationInputError
            For an output with fewer dimensions, a mask of other dimensions, a region with no pixel
            of the output.
        """
        shape = list(output.shape)
        if output.dim() < 4:
            raise ExplanationInputError(
                f"a Region needs an image-shaped output [batch, classes, height, width] (a segmentation model's); the "
                f"explained output has shape {shape}, with no height and width to take a region of: explain a class "
                f"(target=index) or give output= that picks an image-shaped tensor")
        spatial = list(output.shape[2:])
        if self.mask is not None:
            mask = self.mask.to(output.device)
            if list(mask.shape) == spatial:
                mask = mask[None]
            elif list(mask.shape) != [shape[0], *spatial]:
                raise ExplanationInputError(f"a Region's mask has shape {list(self.mask.shape)}; the explained output "
                                            f"{shape} needs a mask of {spatial} or {[shape[0], *spatial]}")
            if not bool(mask.any()):
                raise ExplanationInputError("a Region's mask selects no pixel: there would be nothing to explain")
            return mask
        inside = box_pixels(self.box, spatial[-2], spatial[-1], output.device)
        if not bool(inside.any()):
            x0, y0, x1, y1 = torch.as_tensor(self.box, dtype=torch.float64).flatten().tolist()
            raise ExplanationInputError(f"the box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) holds no pixel of the explained "
                                        f"output's {spatial[-1]} columns and {spatial[-2]} rows (x0, y0, x1, y1: x "
                                        "the column, y the row)")
        return inside.expand(1, *spatial)

    def relevance(self, output: Tensor) -> Tensor:
        """The relevance to start from: :func:`output_relevance` of the class, 0 outside the region.

        Parameters
        ----------
        output
            The explained output ``[batch, classes, *spatial]``.

        Returns
        -------
        Tensor
            Of the output's shape.
        """
        where = self.where(output)
        return output_relevance(output, self.target) * where.unsqueeze(1).to(output.dtype)


def made_for_the_call(target: Any) -> bool:
    """Whether :func:`output_relevance` makes a new tensor for ``target`` (one the explanation may
    overwrite, as the gradient form divides it by the output in place), rather than returning a
    relevance the user gave as a tensor or an array, which stays as it was given.

    Parameters
    ----------
    target
        A target :func:`output_relevance` takes.

    Returns
    -------
    bool
        False for a tensor or a NumPy array (the relevance itself, or class indices), else True.
    """
    numpy = sys.modules.get("numpy")
    return not isinstance(target, Tensor) and not (numpy is not None and isinstance(target, numpy.ndarray))


@dataclasses.dataclass(frozen=True)
class FromOutput:
    """A target computed from the explained output: ``relevance(output)`` is the relevance to
    start from, of the output's shape. Made inside fxlrp by explanations whose targets need the
    output's values (:func:`fxlrp.explain_generation`: one row per generated token, each at its
    own position of per-position logits); not a target users give :func:`fxlrp.attribute`."""

    relevance: Callable[[Tensor], Tensor]


def box_pixels(box: Sequence[float] | Tensor, height: int, width: int,
               device: torch.device | str | None = None) -> Tensor:
    """The pixels of a box ``(x0, y0, x1, y1)``: those whose centres lie in it, for whole numbers
    ``[y0:y1, x0:x1]`` (as :class:`Region` takes a box, and a detector gives one).

    Parameters
    ----------
    box
        ``(x0, y0, x1, y1)`` in pixels, ``x`` the column, ``y`` the row.
    height, width
        The picture's size.
    device
        Where the mask is made.

    Returns
    -------
    Tensor
        A bool ``[height, width]`` mask.
    """
    x0, y0, x1, y1 = torch.as_tensor(box, dtype=torch.float64).flatten().tolist()
    rows = torch.arange(height, dtype=torch.float64, device=device) + 0.5  # (pixel centres)
    columns = torch.arange(width, dtype=torch.float64, device=device) + 0.5
    return ((rows >= y0) & (rows <= y1))[:, None] & ((columns >= x0) & (columns <= x1))[None, :]


def _numbers(box: Any) -> bool:
    """Whether ``box`` is a tensor or a sequence of numbers (not a string)."""
    if isinstance(box, Tensor):
        return not box.is_complex() and box.dtype != torch.bool
    return isinstance(box, (list, tuple)) and all(isinstance(each, (int, float)) and not isinstance(each, bool)
                                                  or _numpy_kind(each, "iuf") for each in box)


def _class_relevance(output: Tensor, target: Any, given: Tensor | None = None) -> Tensor:
    """The output times a one-hot mask over its last dimension, the classes: at ``target`` (an
    index, or one per sample), or at each sample's highest output (None). ``given``: the output as
    the model gave it, when its classes were moved last (an image-shaped output)."""
    mask = torch.zeros_like(output)
    if target is None:  # (in range and one per sample: nothing to check, no index read on the host)
        with torch.no_grad():  # (not recorded, and no detach dispatched)
            return output * mask.scatter_(-1, output.argmax(dim=-1, keepdim=True), 1.0)
    if isinstance(target, float) or (isinstance(target, Tensor) and target.is_floating_point()):
        shape = list((output if given is None else given).shape)
        shown = f"a float tensor of shape {list(target.shape)}" if isinstance(target, Tensor) else f"{target!r}"
        raise ExplanationInputError(
            f"target is {shown}: a float tensor is taken as the output relevance itself and must have the explained "
            f"output's shape {shape}; class indices are integers (pass target.long() for labels held as floats)")
    if isinstance(target, int) and not isinstance(target, bool):  # (checked on the host: no synchronisation)
        _check_target(target, target, output, given)
        mask[..., target] = 1.0
        return output.detach() * mask
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


def _check_target(index: Tensor | int, target: Any, output: Tensor, given: Tensor | None = None) -> None:
    """A ValueError in the user's terms for a class index the output does not have, or a number of
    indices that is not one per sample (instead of an indexing error from inside torch); ``output``
    has its classes last, ``given`` is the output as the model gave it if they were not. ``index``:
    the indices as a tensor, or one index as a Python int."""
    classes, samples = output.shape[-1], output[..., 0].numel()
    shape = list((output if given is None else given).shape)
    if isinstance(index, int):
        out_of_range = not -classes <= index < classes
    elif index.dim() > 0 and index.numel() != samples:
        per = f"one per sample ({samples})" if given is None else f"one per sample ({shape[0]}) or position ({samples})"
        raise ExplanationInputError(f"target has {index.numel()} class indices; the explained output {shape} needs "
                                    f"one index, or {per}")
    else:
        out_of_range = index.numel() > 0 and bool((index < -classes).any() | (index >= classes).any())
    if out_of_range:
        shown = (target.tolist() if target.numel() <= 16 else f"tensor of shape {list(target.shape)}") \
            if isinstance(target, Tensor) else target
        where = f"has {classes} classes in its last dimension" if given is None else \
            f"is image-shaped, with {classes} classes in dimension 1"
        raise ExplanationInputError(f"target {shown!r} is out of range: the explained output {shape} {where} "
                                    f"(indices 0 to {classes - 1}, or -{classes} to -1 counting from the end)")


def per_copy(target: Any, batch: int) -> Tensor:
    """One class index per sample of a copy: an index for all, or one per sample."""
    index = torch.as_tensor(target)
    if index.is_floating_point() or index.dim() > 1 or (index.dim() == 1 and len(index) != batch):
        raise ValueError(f"attribute(..., repeat=...) takes class indices as targets (an index, or one per sample "
                         f"of the batch of {batch}); got {target!r}; leave repeat=0 for other targets")
    return index.long().expand(batch)


LISTED_PER_POSITION = (
    "target=[...] on per-position logits (a language model's [batch, length, vocabulary]) would explain every "
    "target at the last position only, as candidates for the next token: to explain generated tokens each at "
    "its own position use fxlrp.explain_generation(explain, sequences, start); for candidates of the next token "
    "pick the position with output= (output=lambda out: out.logits[:, -1]), or give target=(a, b) for a contrast"
)
"""Why a list of targets on per-position logits picked by default is refused (:func:`fxlrp.attribute`)."""


def logits_per_position(result: Any) -> bool:
    """Whether ``result`` is a model output with ``logits`` per position ``[batch, length,
    vocabulary]`` (a language model's), of which :func:`default_output` explains one position."""
    logits = getattr(result, "logits", None) if not isinstance(result, Tensor) else None
    return isinstance(logits, Tensor) and logits.dim() == 3


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
