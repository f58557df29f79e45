"""Explaining one detection of a torchvision detector: its class logit or score
(:func:`explain_detection`), its mask (:func:`explain_mask`) or one of its keypoints
(:func:`explain_keypoint`), chosen by index or by class and box (:func:`detection_target`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from fxlrp.capture.interception import module_calls_followed
from fxlrp.eager.rule_choice import operations_observed
from fxlrp.explain.absorption import absorbing_module
from fxlrp.explain.finite_checks import vanished_relevance
from fxlrp.explain.targets import box_pixels
from fxlrp.integrations.torchvision.logit_positions import logit_positions, reached_positions


def detection_target(detections: dict[str, Tensor], *, index: int | None = None, label: int | None = None,
                     box: Sequence[float] | Tensor | None = None) -> int:
    """The index of a detection among one image's detections: given, or by class and box.

    Parameters
    ----------
    detections : dict of str to Tensor
        One image's output of a torchvision detector (``boxes``, ``labels``, ``scores``).
    index : int, optional
        The detection's index (negative ones count from the end).
    label : int, optional
        With ``box``: the class; the detection of that class whose box overlaps ``box`` most
        (the highest intersection over union) is chosen.
    box : sequence of float or Tensor, optional
        ``(x0, y0, x1, y1)`` in the image's pixels.

    Returns
    -------
    int
        The index into ``detections["scores"]`` (and its boxes and labels).

    Raises
    ------
    ValueError
        For neither or both of ``index`` and ``label``/``box``, an index out of range, a class
        with no detection.
    """
    count = int(detections["scores"].shape[0])
    if (index is None) == (label is None or box is None):
        raise ValueError("detection_target takes index=, or label= and box= (a detection of that class with the "
                         "highest IoU with the box)")
    if index is not None:
        if not -count <= index < count:
            raise ValueError(f"detection {index} is out of range: the image has {count} detection(s)")
        return index % count
    labels = detections["labels"]
    same = (labels == label).nonzero().flatten()
    if same.numel() == 0:
        found = sorted({int(each) for each in labels})
        raise ValueError(f"no detection of class {label}; the image's detections are of class(es) {found}")
    given = torch.as_tensor(box, dtype=detections["boxes"].dtype, device=detections["boxes"].device).reshape(1, 4)
    overlap = box_iou(detections["boxes"][same].detach(), given)[:, 0]
    return int(same[int(overlap.argmax())])


@dataclasses.dataclass(frozen=True)
class DetectionExplanation:
    """What :func:`explain_detection` explained and the relevance it found."""

    relevance: Tensor | list[Tensor]
    """The relevance of the images, in their shapes (a tensor, or a list as the images were given)."""
    index: int
    """The detection's index in the image's output."""
    label: int
    """Its class."""
    score: float
    """Its score, as the model outputs it."""
    explained: float
    """The value explained: the class logit, the score, the mask's values summed over its pixels
    (:func:`explain_mask`) or the keypoint's score (:func:`explain_keypoint`)."""
    position: tuple[int, ...] | None
    """Where the logit is in the output of the classification head (None for the others)."""
    region: Tensor | None = None
    """Where the explained thing is in the image: a bool ``[height, width]`` mask of the detection's
    box, the mask's pixels, or the keypoint's pixel and its neighbours (for
    :func:`fxlrp.viz.image.with_region`)."""


LOGIT_HEADS: dict[type, int | None] = {}
"""The modules whose output holds a detector's class logits, and which output (None: the output
itself): torchvision's box predictor of the R-CNNs (``(class_logits, box_regression)``) and the
classification heads of RetinaNet, SSD, SSDlite and FCOS."""
try:
    from torchvision.models.detection import faster_rcnn, fcos, retinanet, ssd
    from torchvision.ops import box_iou

    LOGIT_HEADS.update({faster_rcnn.FastRCNNPredictor: 0, retinanet.RetinaNetClassificationHead: None,
                        ssd.SSDScoringHead: None, fcos.FCOSClassificationHead: None})
except ImportError:  # torchvision is optional
    box_iou = None


def explain_detection(explain: nn.Module, images: Tensor | list[Tensor], index: int, *, image: int = 0,
                      score: str = "logit", heads: dict[type, int | None] | None = None) -> DetectionExplanation:
    """Explain one detection of a torchvision detector: its class logit, or its score.

    ``score="logit"`` explains the logit of the detection's class before the softmax (R-CNNs, SSD)
    or sigmoid (RetinaNet, FCOS) that makes its score: relevance starts as ``R = z`` at that one
    element of the classification head's output, ``R_j = z e_j``, found by where the relevance
    of the detection's score goes in that output. ``score="score"`` starts from the score the
    model outputs, ``R = s``, through the softmax's or sigmoid's rule. Boxes, their decoding, NMS
    and top-k selections take no part in either (see :func:`region_average`); a box coordinate is
    explained from the ``boxes`` output (see :func:`box_decoding`).

    Parameters
    ----------
    explain : nn.Module
        The explainer of a detector (:func:`fxlrp.convert`).
    images : Tensor or list of Tensor
        The images as the detector takes them (``[batch, 3, H, W]``, or a list of ``[3, H, W]``).
    index : int
        The detection's index in image ``image``'s output (see :func:`detection_target`).
    image : int, default 0
        Which image's detection.
    score : {"logit", "score"}, default "logit"
        What is explained.
    heads : dict of type to int or None, optional
        For a detector of your own: the module types whose output holds the class logits, and
        which element of it (None: the output itself); by default :data:`LOGIT_HEADS`.

    Returns
    -------
    DetectionExplanation
        The relevance of the images and what was explained.

    Raises
    ------
    ValueError
        For an unknown ``score``, an index out of range, a detector whose class logits are not
        found.

    Warns
    -----
    fxlrp.VanishedRelevanceWarning
        Where the relevance reaching the images is under a millionth of the explained value's
        (absolute values summed: the rules absorbed it, as the biases of random weights do),
        naming the module that absorbed most, found by one more run of the explanation
        (:func:`~fxlrp.explain.absorption.absorbing_module`), made only then.
    """
    if score not in ("logit", "score"):
        raise ValueError(f"score={score!r}: explain the class 'logit' or the 'score'")
    heads = LOGIT_HEADS if heads is None else heads
    run = _explained_detection(explain, images, index, image, score, heads)
    _warn_if_vanished(explain, run.seed, run.relevance, functools.partial(
        _explained_detection, explain, images, run.index, image, score, heads, run.found))
    box = box_pixels(run.detections["boxes"][run.index].detach(), *_size(run.leaves, image, run.as_list),
                     run.leaves[0].device)
    return DetectionExplanation(_filled(run.relevance, run.leaves, run.as_list), run.index, run.label,
                                run.value.item(), run.start.item(), run.position, box)


@dataclasses.dataclass(frozen=True)
class _Explained:
    """One run of :func:`explain_detection`: the images' leaves and relevance, the detection and
    what was explained."""

    as_list: bool
    leaves: list[Tensor]
    detections: dict[str, Tensor]
    index: int
    value: Tensor
    """The detection's score."""
    label: int
    start: Tensor
    """The value explained."""
    found: tuple[int, tuple[int, ...]] | None
    """Which classification head's output holds the logit, and where (None: the score explained)."""
    seed: Tensor
    """The relevance the backward pass started from."""
    relevance: tuple[Tensor | None, ...]

    @property
    def position(self) -> tuple[int, ...] | None:
        return None if self.found is None else self.found[1]


def _explained_detection(explain: nn.Module, images: Tensor | list[Tensor], index: int, image: int, score: str,
                         heads: dict[type, int | None],
                         found: tuple[int, tuple[int, ...]] | None = None) -> _Explained:
    """:func:`explain_detection`'s forward and backward pass (one backward pass from the explained
    value: where the logit is, is found by another one unless ``found`` says it)."""
    as_list, leaves = _leaves(images)
    outputs: list[Tensor] = []

    def after(module: nn.Module, args: Any, output: Any) -> None:
        for kind, position in heads.items():
            if isinstance(module, kind):
                outputs.append(output if position is None else output[position])

    with operations_observed(_ignore), module_calls_followed(after=after):  # (each run eagerly: modules called)
        detections = explain(leaves if as_list else leaves[0])[image]
    index = detection_target(detections, index=index)
    value, label = detections["scores"][index], int(detections["labels"][index])
    if score == "score":
        if not value.requires_grad:
            raise ValueError(f"the scores of {type(explain).__name__} carry no relevance (an operation the rules hold "
                             "constant makes them, as FCOS's square root); explain score='logit' instead")
        start, seed = value, value.detach()
        relevance = torch.autograd.grad(value, leaves, seed, allow_unused=True)
        return _Explained(as_list, leaves, detections, index, value, label, start, None, seed, relevance)
    carrying = [output for output in outputs if isinstance(output, Tensor) and output.requires_grad]
    if not carrying:
        raise ValueError(f"no class logits found in {type(explain).__name__}'s run: pass heads= with the type "
                         "of the module that outputs them")
    if found is None:
        positions = reached_positions(value, carrying, label) if value.requires_grad else []
        if len(positions) != 1:  # (a score the rules hold constant, as FCOS's: the model's own gradient says)
            positions = logit_positions(explain, leaves if as_list else leaves[0], image, index, label, heads)
        if len(positions) != 1 or positions[0][0] >= len(carrying):
            raise ValueError(f"the class logit of detection {index} is not one element of the classification head's "
                             f"output (found {len(positions)}); explain score='score' instead")
        found = positions[0]
    number, position = found
    logits = carrying[number]
    start = logits[position]
    seed = torch.zeros_like(logits)
    seed[position] = start.detach()
    relevance = torch.autograd.grad(logits, leaves, seed, allow_unused=True)
    return _Explained(as_list, leaves, detections, index, value, label, start, found, seed, relevance)


def _warn_if_vanished(explain: nn.Module, start: Tensor, relevance: Sequence[Tensor | None],
                      again: Callable[[], Any]) -> None:
    """A :class:`fxlrp.VanishedRelevanceWarning` where the relevance reaching the images is a
    negligible share of what the explanation started from, ``start``
    (:func:`~fxlrp.explain.finite_checks.vanished_relevance`), naming the module that absorbed
    most, found by ``again`` (the same explanation once more) only then. One flag read on the
    host (the explained value is read anyway)."""
    vanished, warning = vanished_relevance([start.detach().abs().float().sum()], [relevance],
                                           functools.partial(_absorbing_module, explain, again))
    if bool(vanished):
        warning()


def _absorbing_module(explain: nn.Module, again: Callable[[], Any], _: int) -> str | None:
    """The module that absorbed most of the detection's relevance
    (:func:`~fxlrp.explain.absorption.absorbing_module`); None where it cannot be found."""
    try:
        return absorbing_module(explain, again)
    except (TypeError, ValueError, RuntimeError):
        # (a run the module calls' hooks cannot follow: the warning says how to find the layer;
        # the explanation itself succeeded)
        return None


def _leaves(images: Tensor | list[Tensor]) -> tuple[bool, list[Tensor]]:
    """Whether the images are a list, and a copy of each that requires gradients."""
    if isinstance(images, Tensor):
        return False, [images.detach().clone().requires_grad_()]
    return True, [each.detach().clone().requires_grad_() for each in images]


def _size(leaves: list[Tensor], image: int, as_list: bool) -> tuple[int, int]:
    """Image ``image``'s height and width (the images a list of them, or a batch)."""
    height, width = leaves[image if as_list else 0].shape[-2:]
    return int(height), int(width)


def _filled(relevance: Sequence[Tensor | None], leaves: list[Tensor], as_list: bool) -> Tensor | list[Tensor]:
    """The images' relevance, zeros for an image none reached, as the images were given."""
    filled = [torch.zeros_like(leaf) if each is None else each for each, leaf in zip(relevance, leaves, strict=True)]
    return filled if as_list else filled[0]


def _detections(explain: nn.Module, images: Tensor | list[Tensor], index: int, image: int,
                key: str, what: str) -> tuple[bool, list[Tensor], dict[str, Tensor], int]:
    """One explanation run of a detector: the images' leaves, image ``image``'s detections (which
    must hold ``key``), the detection's index checked."""
    as_list, leaves = _leaves(images)
    detections = explain(leaves if as_list else leaves[0])[image]
    if key not in detections:
        raise ValueError(f"{type(explain).__name__}'s detections hold no {key!r} ({', '.join(detections)}): "
                         f"{what}")
    return as_list, leaves, detections, detection_target(detections, index=index)


def explain_mask(explain: nn.Module, images: Tensor | list[Tensor], index: int, *, image: int = 0,
                 threshold: float = 0.5) -> DetectionExplanation:
    """Explain the mask of one detection of Mask R-CNN: its values over its pixels.

    Relevance starts as the mask's value at each pixel where it exceeds ``threshold`` (the pixels
    the model says are the instance), 0 elsewhere, ``R_p = m_p [m_p > threshold]``: the mask summed
    over the instance. It goes back through the pasting of the mask into the image (bilinear
    interpolation and padding: the z-rule of a linear map), the sigmoid (identity rule), the mask
    head and the RoIAlign of its box (held constant) to the image.

    Parameters
    ----------
    explain : nn.Module
        The explainer of a Mask R-CNN (:func:`fxlrp.convert`).
    images : Tensor or list of Tensor
        The images as the detector takes them.
    index : int
        The detection's index in image ``image``'s output (see :func:`detection_target`).
    image : int, default 0
        Which image's detection.
    threshold : float, default 0.5
        The mask's pixels are where it exceeds this (torchvision's convention for a binary mask).

    Returns
    -------
    DetectionExplanation
        The relevance of the images; ``explained`` the mask's values summed over its pixels,
        ``region`` its pixels.

    Raises
    ------
    ValueError
        For a detector without masks, an index out of range, a mask with no pixel above
        ``threshold``.

    Warns
    -----
    fxlrp.VanishedRelevanceWarning
        As :func:`explain_detection`, where the relevance reaching the images vanished.
    """
    return _explanation(explain, functools.partial(_explained_mask, explain, images, index, image, threshold))


class _Pass(NamedTuple):
    """One forward and backward pass of :func:`explain_mask` or :func:`explain_keypoint`."""

    as_list: bool
    leaves: list[Tensor]
    detections: dict[str, Tensor]
    index: int
    start: Tensor
    """The relevance the backward pass started from."""
    relevance: tuple[Tensor | None, ...]
    region: Tensor


def _explanation(explain: nn.Module, again: Callable[[], _Pass]) -> DetectionExplanation:
    """The explanation of one pass ``again()``, warned of where its relevance vanished (the pass
    run once more to find the layer, only then)."""
    run = again()
    _warn_if_vanished(explain, run.start, run.relevance, again)
    return DetectionExplanation(_filled(run.relevance, run.leaves, run.as_list), run.index,
                                int(run.detections["labels"][run.index]), run.detections["scores"][run.index].item(),
                                run.start.sum().item(), None, run.region)


def _explained_mask(explain: nn.Module, images: Tensor | list[Tensor], index: int, image: int,
                    threshold: float) -> _Pass:
    """:func:`explain_mask`'s forward and backward pass."""
    as_list, leaves, detections, index = _detections(explain, images, index, image, "masks",
                                                     "explain_mask explains Mask R-CNN's masks")
    masks = detections["masks"]
    value = masks[index].detach()
    inside = value > threshold
    if not bool(inside.any()):
        raise ValueError(f"the mask of detection {index} has no pixel above threshold={threshold} (its largest value "
                         f"is {value.max().item():.3g}): give a lower threshold")
    start = torch.zeros_like(masks)
    start[index] = value * inside
    relevance = torch.autograd.grad(masks, leaves, start, allow_unused=True)
    return _Pass(as_list, leaves, detections, index, start, relevance, inside[0])


def explain_keypoint(explain: nn.Module, images: Tensor | list[Tensor], index: int, keypoint: int, *,
                     image: int = 0) -> DetectionExplanation:
    """Explain one keypoint of one detection of Keypoint R-CNN: its heatmap at the keypoint.

    Relevance starts as the keypoint's score, ``R = s``: the value of the keypoint's heatmap
    (the keypoint head's output, resized to the box by bicubic interpolation) at the keypoint,
    which is where it is largest. The interpolation is linear in the heatmap (z-rule), the
    keypoint's position is held constant (it is where the largest value is, an index), the head
    and the RoIAlign of its box take their rules.

    Parameters
    ----------
    explain : nn.Module
        The explainer of a Keypoint R-CNN (:func:`fxlrp.convert`).
    images : Tensor or list of Tensor
        The images as the detector takes them.
    index : int
        The detection's index in image ``image``'s output (see :func:`detection_target`).
    keypoint : int
        Which keypoint (negative ones count from the end).
    image : int, default 0
        Which image's detection.

    Returns
    -------
    DetectionExplanation
        The relevance of the images; ``explained`` the keypoint's score, ``region`` its pixel and
        the 8 around it.

    Raises
    ------
    ValueError
        For a detector without keypoints, an index or keypoint out of range.

    Warns
    -----
    fxlrp.VanishedRelevanceWarning
        As :func:`explain_detection`, where the relevance reaching the images vanished.
    """
    return _explanation(explain, functools.partial(_explained_keypoint, explain, images, index, keypoint, image))


def _explained_keypoint(explain: nn.Module, images: Tensor | list[Tensor], index: int, keypoint: int,
                        image: int) -> _Pass:
    """:func:`explain_keypoint`'s forward and backward pass."""
    as_list, leaves, detections, index = _detections(explain, images, index, image, "keypoints_scores",
                                                     "explain_keypoint explains Keypoint R-CNN's keypoints")
    scores = detections["keypoints_scores"]
    count = scores.shape[1]
    if not -count <= keypoint < count:
        raise ValueError(f"keypoint {keypoint} is out of range: the detector has {count} keypoints")
    keypoint %= count
    start = torch.zeros_like(scores)
    start[index, keypoint] = scores[index, keypoint].detach()
    relevance = torch.autograd.grad(scores, leaves, start, allow_unused=True)
    x, y = (float(value) for value in detections["keypoints"][index, keypoint, :2].detach())
    around = box_pixels((x - 1.5, y - 1.5, x + 1.5, y + 1.5), *_size(leaves, image, as_list), leaves[0].device)
    return _Pass(as_list, leaves, detections, index, start, relevance, around)


def _ignore(*arguments: Any) -> None:
    """An observer that keeps parts running eagerly (their module calls seen) and counts nothing."""
