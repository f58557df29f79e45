"""torchvision functions that capture records as single calls (``torch.fx.wrap``).

- ``stochastic_depth``: the identity at explanation time, like dropout;
- Swin's ``shifted_window_attention``: run with relevance functions inside (see
  :mod:`fxlrp.eager.interpret`): linear projections by the layer rule, ``q k^T`` and
  ``attention @ v`` by the :class:`~fxlrp.rules.attention.Product` rule, softmax by its rule, the
  relative position bias and the shift mask as constants added to the scores (z-rule);
- ``_patch_merging_pad``: padding and strided slices, a copy routed by its native backward;
- ``_get_relative_position_bias``: computed from parameters only, it carries no relevance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from fxlrp.capture.interception import module_calls_followed
from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.eager.interpret import interpret
from fxlrp.eager.rule_choice import operations_observed
from fxlrp.explain.input_checks import vanished_relevance
from fxlrp.explain.targets import box_pixels
from fxlrp.operations.helpers import affine, identity
from fxlrp.operations.sums import proportional
from fxlrp.registry import REGISTRY, Affine, Native, Operation, Routed, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import require_relevance_form
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.stabilise import divide_dropping_zeros

try:
    from torchvision.models import swin_transformer
    from torchvision.ops import ps_roi_align, ps_roi_pool, roi_align, roi_pool, stochastic_depth
except ImportError:  # torchvision is optional for fxlrp's core
    swin_transformer = stochastic_depth = roi_align = roi_pool = ps_roi_align = ps_roi_pool = None

if stochastic_depth is not None:
    register(
        Operation(
            "stochastic_depth",
            Spelling(functions=(stochastic_depth,)),
            Routed(identity),
            description="stochastic depth: the identity at explanation time",
        )
    )
if swin_transformer is not None:
    register(
        Operation(
            "window_attention",
            Spelling(functions=(swin_transformer.shifted_window_attention,)),
            Affine(interpret, weighted=True),
            description="Swin window attention, run with relevance functions inside",
        )
    )
    register(
        Operation(
            "patch_merging_pad",
            Spelling(functions=(swin_transformer._patch_merging_pad,)),
            Native(),
            description="Swin patch merging: padding and strided slices (a copy)",
        )
    )
    register(
        Operation(
            "relative_position_bias",
            Spelling(functions=(swin_transformer._get_relative_position_bias,)),
            Native(),
            description="Swin relative position bias: from parameters only, carries no relevance",
        )
    )


def _fixed(boxes: Any) -> Any:
    """The boxes (a tensor, or one per image) as constants: they say where to pool, not what."""
    if isinstance(boxes, Tensor):
        return boxes.detach()
    if isinstance(boxes, (list, tuple)):
        return type(boxes)(_fixed(each) for each in boxes)
    return boxes


def region_average(call: RelevanceCall, function: Callable[..., Any], input: Tensor, boxes: Any, *args: Any,
                   **kwargs: Any) -> Any:
    r"""RoIAlign (and the position-sensitive RoIAlign and RoIPool) with the boxes held constant.

    For fixed boxes each output cell is a weighted average of bilinear samples of the feature map,
    ``z_k = sum_j a_kj x_j``: a linear map of ``input``, explained by the node's rule, by default
    the z-rule of the sums,

    .. math:: R_j = \sum_k \frac{x_j a_{kj}}{z_k} R_k

    The boxes (which a detector's mask and keypoint heads compute from its box regression) get
    no relevance: they say where to pool, as ``grid_sample``'s positions do.

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        ``torchvision.ops.roi_align`` (or another spelling: the ``torchvision::`` operator).
    input : Tensor
        The feature map ``[batch, channels, height, width]``.
    boxes : Tensor or list of Tensor
        The boxes, held constant.
    *args, **kwargs
        The other arguments of ``function``.

    Returns
    -------
    Any
        ``function``'s output (the pooled features; an operator's pair of them and its indices).
    """
    boxes = _fixed(boxes)
    if function in _PAIRED_OPERATORS:  # (the operators return the features with their indices)
        pooled = affine(call, _FirstOutput(function), input, boxes, *args, **kwargs)
        with torch.no_grad():
            indices = function(input.detach(), boxes, *args, **kwargs)[1]
        return pooled, indices
    return affine(call, function, input, boxes, *args, **kwargs)


def region_maximum(call: RelevanceCall, function: Callable[..., Any], input: Tensor, boxes: Any, *args: Any,
                   **kwargs: Any) -> Any:
    """RoIPool with the boxes held constant: each output cell is the largest value of its bin, a
    copy routed by the native backward (winner-take-all, as max pooling).

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        ``torchvision.ops.roi_pool`` or the ``torchvision::roi_pool`` operator.
    input : Tensor
        The feature map.
    boxes : Tensor or list of Tensor
        The boxes, held constant.
    *args, **kwargs
        The other arguments of ``function``.

    Returns
    -------
    Any
        ``function``'s output.
    """
    return function(input, _fixed(boxes), *args, **kwargs)


class _FirstOutput:
    """``function(...)[0]``: an operator's features without its indices (picklable)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.function(*args, **kwargs)[0]


_PAIRED_OPERATORS: tuple[Any, ...] = ()
if roi_align is not None:
    _PAIRED_OPERATORS = (torch.ops.torchvision.ps_roi_align, torch.ops.torchvision.ps_roi_pool)
    register(
        Operation(
            "roi_align",
            Spelling(
                functions=(roi_align, torch.ops.torchvision.roi_align, ps_roi_align, ps_roi_pool, *_PAIRED_OPERATORS),
                leaf=True,  # (torchvision's Python functions branch on their inputs: recorded as one call)
            ),
            Affine(region_average, default_rule=proportional),
            ValueFlow(index_arguments=(1,)),
            description="RoIAlign (position-sensitive RoIAlign and RoIPool): for fixed boxes a linear map of the "
            "features (averages of bilinear samples), z-rule; the boxes get no relevance",
        )
    )
    register(
        Operation(
            "roi_pool",
            Spelling(functions=(roi_pool, torch.ops.torchvision.roi_pool), leaf=True),
            Routed(region_maximum),
            ValueFlow(index_arguments=(1,)),
            description="RoIPool: the largest value of each bin of a fixed box, winner-take-all (native backward)",
        )
    )


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
    """
    if score not in ("logit", "score"):
        raise ValueError(f"score={score!r}: explain the class 'logit' or the 'score'")
    as_list, leaves = _leaves(images)
    heads = LOGIT_HEADS if heads is None else heads
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
        start, position, seed = value, None, value.detach()
        relevance = torch.autograd.grad(value, leaves, seed, allow_unused=True)
    else:
        carrying = [output for output in outputs if isinstance(output, Tensor) and output.requires_grad]
        if not carrying:
            raise ValueError(f"no class logits found in {type(explain).__name__}'s run: pass heads= with the type "
                             "of the module that outputs them")
        found = _reached_positions(value, carrying, label) if value.requires_grad else []
        if len(found) != 1:  # (a score the rules hold constant, as FCOS's: the model's own gradient says)
            found = _logit_positions(explain, leaves if as_list else leaves[0], image, index, label, heads)
        if len(found) != 1 or found[0][0] >= len(carrying):
            raise ValueError(f"the class logit of detection {index} is not one element of the classification head's "
                             f"output (found {len(found)}); explain score='score' instead")
        number, position = found[0]
        logits = carrying[number]
        start = logits[position]
        seed = torch.zeros_like(logits)
        seed[position] = start.detach()
        relevance = torch.autograd.grad(logits, leaves, seed, allow_unused=True)
    vanished, warning = vanished_relevance([seed.abs().float().sum()], [relevance])
    if bool(vanished):  # (the detection's value is read on the host below anyway)
        warning()
    box = box_pixels(detections["boxes"][index].detach(), *_size(leaves, image, as_list), leaves[0].device)
    return DetectionExplanation(_filled(relevance, leaves, as_list), index, label, value.item(), start.item(),
                                position, box)


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
    """
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
    return DetectionExplanation(_filled(relevance, leaves, as_list), index, int(detections["labels"][index]),
                                detections["scores"][index].item(), start.sum().item(), None, inside[0])


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
    """
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
    return DetectionExplanation(_filled(relevance, leaves, as_list), index, int(detections["labels"][index]),
                                detections["scores"][index].item(), start.sum().item(), None, around)


class _PassingGradient(torch.autograd.Function):
    """Forward: a squashing function's value. Backward: the gradient unchanged, so that it reaches
    the logit a score comes from also where the score has saturated (a softmax or sigmoid of 1.0
    in float32 has derivative 0)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, logits: Tensor) -> Tensor:
        return value

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[None, Tensor]:
        return None, gradient


class _SquashingPassesGradients(TorchFunctionMode):
    """Softmax and sigmoid (functions and methods) whose backward passes the gradient unchanged:
    where a detection's score comes from is a matter of which elements it is selected from, not of
    how steep the squashing is there. Which calls squash the registry says
    (:attr:`~fxlrp.registry.ValueFlow.saturates`)."""

    def __init__(self) -> None:
        super().__init__()
        self.squashing = REGISTRY.callables_where(lambda operation: operation.flow.saturates)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        value = func(*args, **(kwargs or {}))
        if func in self.squashing and isinstance(args[0], Tensor) and args[0].requires_grad:
            return _PassingGradient.apply(value.detach(), args[0])
        return value


def _logit_positions(explain: nn.Module, images: Any, image: int, index: int, label: int,
                     heads: dict[type, int | None]) -> list[tuple[int, tuple[int, ...]]]:
    """Where the logit of a detection's class is: (which output of a classification head, the
    element), found from the model's own gradient of the detection's score (as the model runs
    it, in evaluation mode; the model is put back as it was), with softmax and sigmoid passing
    the gradient unchanged (a saturated score's derivative is 0)."""
    model = getattr(getattr(explain, "conversion", None), "model", None)
    if model is None:
        raise ValueError("the explainer holds no model (a copy): explain score='score' instead")
    outputs: list[Tensor] = []

    def after(module: nn.Module, args: Any, output: Any) -> None:
        for kind, position in heads.items():
            if isinstance(module, kind):
                outputs.append(output if position is None else output[position])

    detached = ([each.detach().requires_grad_() for each in images] if isinstance(images, list)
                else images.detach().requires_grad_())
    with MODEL_WRITES:
        state = ModuleState(model)
        in_evaluation_mode(state.modules)
        try:
            with torch.enable_grad(), module_calls_followed(after=after), _SquashingPassesGradients():
                detections = model(detached)[image]
        finally:
            state.restore()
    value = detections["scores"][index]
    logits = [output for output in outputs if isinstance(output, Tensor) and output.requires_grad]
    if not value.requires_grad or not logits:
        return []
    return _reached_positions(value, logits, label, keep=False)


def _reached_positions(value: Tensor, logits: list[Tensor], label: int,
                       keep: bool = True) -> list[tuple[int, tuple[int, ...]]]:
    """The elements of class ``label`` among ``logits`` that ``value`` (a detection's score) comes
    back to in backward: (which tensor, the element). In an explanation's run what comes back is
    the score's relevance, which the softmax's and sigmoid's rules keep in the detection's row."""
    shares = torch.autograd.grad(value, logits, value.detach(), retain_graph=keep, allow_unused=True)
    return [(number, tuple(int(each) for each in where) + (label,))
            for number, share in enumerate(shares) if share is not None
            for where in (share[..., label] != 0).nonzero()]


def _ignore(*arguments: Any) -> None:
    """An observer that keeps parts running eagerly (their module calls seen) and counts nothing."""


def multi_scale_region_average(call: RelevanceCall, function: Callable[..., Any], x: Any, boxes: Any,
                               *args: Any, **kwargs: Any) -> Any:
    """``MultiScaleRoIAlign``: its code run with relevance functions inside (each level's
    ``roi_align`` by :func:`region_average`), the boxes held constant (they also choose each box's
    level).

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        The module.
    x : dict of str to Tensor
        The feature maps by name.
    boxes : list of Tensor
        The boxes of each image, held constant.
    *args, **kwargs
        The images' sizes.

    Returns
    -------
    Any
        The pooled features.
    """
    return interpret(call, function, x, _fixed(boxes), *args, **kwargs)


if roi_align is not None:
    from torchvision.ops import MultiScaleRoIAlign

    register(
        Operation(
            "multi_scale_roi_align",
            Spelling(modules=(MultiScaleRoIAlign,)),
            Affine(multi_scale_region_average, default_rule=proportional),
            description="MultiScaleRoIAlign: RoIAlign on each box's level of the feature pyramid, run with relevance "
            "functions inside; the boxes get no relevance",
        )
    )


class _DecodedBoxes(torch.autograd.Function):
    """Forward: torchvision's ``BoxCoder.decode_single`` as the model runs it. Backward: the
    relevance of each box coordinate shared among the terms it is the sum of (see
    :func:`box_decoding`)."""

    @staticmethod
    def forward(ctx: Any, function: Callable[..., Tensor], coder: Any, codes: Tensor, boxes: Tensor) -> Tensor:
        decoded = function(coder, codes, boxes)
        ctx.save_for_backward(codes, boxes, decoded)
        ctx.coder = coder
        return decoded

    @staticmethod
    def backward(ctx: Any, relevance: Tensor) -> tuple[None, None, Tensor, None]:
        codes, boxes, decoded = ctx.saved_tensors
        coder = ctx.coder
        boxes = boxes.to(codes.dtype)
        sizes = torch.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], dim=1)[:, None]  # [N, 1, 2]
        deltas = codes.reshape(codes.shape[0], -1, 4) / torch.as_tensor(coder.weights, dtype=codes.dtype,
                                                                        device=codes.device)
        centre = deltas[..., :2] * sizes  # (the shift of the centre from the reference box's)
        log_sizes = deltas[..., 2:]
        half = 0.5 * sizes * torch.expm1(log_sizes.clamp(max=coder.bbox_xform_clip))  # (the change of half the size)
        half = half * (log_sizes <= coder.bbox_xform_clip)  # (clipped: a constant, no relevance)
        shares = divide_dropping_zeros(relevance, decoded).reshape(centre.shape[0], -1, 4)  # R / z per coordinate
        low, high = shares[..., :2], shares[..., 2:]  # (x0, y0) = centre - half, (x1, y1) = centre + half
        by_code = torch.cat([centre * (low + high), half * (high - low)], dim=-1)
        return None, None, by_code.reshape(codes.shape), None


def box_decoding(call: RelevanceCall, function: Callable[..., Any], coder: Any, codes: Tensor, boxes: Tensor) -> Tensor:
    r"""torchvision's ``BoxCoder.decode_single``: boxes from predicted offsets of reference boxes
    (anchors, proposals), with the reference boxes held constant.

    Each coordinate is a sum, e.g. the left edge

    .. math:: x_0 = \underbrace{c_x - \tfrac{w}{2}}_{\text{reference}}
        + \underbrace{w\,d_x}_{\text{shift}} - \underbrace{\tfrac{w}{2}(e^{d_w} - 1)}_{\text{resize}}

    (``c_x``, ``w`` the reference box's centre and width, ``d_x = t_x / w_x`` and ``d_w = t_w /
    w_w`` the predicted codes over the coder's weights, ``d_w`` clipped above as the model clips
    it), and its relevance is shared among the terms by the z-rule, ``R_term = term / x_0 R``:
    the reference box's share is a constant's (a bias's), the shift's goes to ``t_x`` (linear),
    the resize's to ``t_w``. That is the rule of the sums with ``e^{d}`` explained as
    ``1 + (e^{d} - 1)``: the value it has at ``d = 0`` a constant, the change the part of
    ``d``, ``R_d = (1 - e^{-d}) R_{e^d}``. The relevance reaching the network is the
    coordinate's offset from the reference box's, ``x_0 - (c_x - w / 2)``: what moved the edge
    from where the anchor or proposal had it. The centre ``(x_0 + x_1) / 2`` is linear in the
    codes: the resize terms cancel, and LRP-0 of it is gradient x input on a piecewise-linear
    network.

    Parameters
    ----------
    call : RelevanceCall
        The node's settings.
    function : callable
        ``BoxCoder.decode_single``.
    coder : BoxCoder
        The detector's coder (its weights and clip).
    codes : Tensor
        The predicted offsets ``[N, 4 K]``.
    boxes : Tensor
        The reference boxes ``[N, 4]``, held constant.

    Returns
    -------
    Tensor
        The decoded boxes ``[N, 4 K]``, as the model computes them.
    """
    if not torch.is_grad_enabled() or not carries_relevance(codes):
        return function(coder, codes, boxes)
    require_relevance_form("box decoding")
    return _DecodedBoxes.apply(function, coder, codes, boxes.detach())


try:
    from torchvision.models.detection._utils import BoxCoder
except ImportError:  # torchvision is optional
    BoxCoder = None

if BoxCoder is not None:
    register(
        Operation(
            "box_decoding",
            Spelling(functions=(BoxCoder.decode_single,), leaf=True),
            Affine(box_decoding, default_rule=proportional),
            ValueFlow(index_arguments=(2,)),
            description="box decoding (BoxCoder.decode_single): each coordinate the sum of the reference box's "
            "(a constant), the predicted shift's and the predicted resize's (e^d - 1) terms, z-rule",
        )
    )


def transformed_images(call: RelevanceCall, function: Callable[..., Any], transform: nn.Module, images: Any,
                       targets: Any = None) -> Any:
    r"""A detector's ``GeneralizedRCNNTransform``: its images normalised, resized and batched,
    an affine map of the raw images ``x`` to the batch ``y = J x + y_0`` the backbone reads
    (``y_0``, the map of zero images, is the normalisation's mean resized, 0 in the padding).

    Explained as one layer whose input is the raw images, by the node's rule: by default the
    z-rule (LRP-0), with which LRP-0 of the detector is gradient x input,

    .. math:: R_{x_j} = \sum_k \frac{x_j J_{kj}}{y_k} R_{y_k};

    under a first-layer rule that does not share by its input's values (flat, w^2, z^B: the
    composite gives the map ``Epsilon(0, zero_params="bias")``) the mean is left out,

    .. math:: R_{x_j} = \sum_k \frac{x_j J_{kj}}{(J x)_k} R_{y_k},

    so the first layer's rule sees the normalised image it expects and its relevance moves to
    the raw pixels by their shares of each resized value (bilinear weights are positive: for
    images of non-negative values each share is between 0 and 1), where the z-rule of each step
    would divide by normalised values near 0. Padding gets no relevance.

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        ``GeneralizedRCNNTransform.forward``.
    transform : GeneralizedRCNNTransform
        The detector's transform.
    images : Tensor or list of Tensor
        The raw images.
    targets : list of dict, optional
        Training targets (resized as the model resizes them; they carry no relevance).

    Returns
    -------
    tuple
        ``(ImageList, targets)``, as ``function`` returns them.
    """
    as_list = isinstance(images, (list, tuple))
    pictures = list(images) if as_list else [images]
    if call.runs_natively() or not any(carries_relevance(picture) for picture in pictures):
        return function(transform, images, targets)
    with torch.no_grad():
        zero, _ = function(transform, [torch.zeros_like(picture) for picture in pictures] if as_list
                           else torch.zeros_like(images), None)
        if targets is not None:
            _, targets = function(transform, images, targets)
    offset = zero.tensors

    def batched(*arguments: Any) -> Tensor:
        # (the map with the constant ``bias`` in the place of its own y_0: y exactly where it is y_0)
        *inputs, _, bias = arguments
        batch = function(transform, inputs if as_list else inputs[0], None)[0].tensors
        return batch + (bias - offset)

    layer = call.layer(batched, None, offset, has_parameters=True)
    return ImageList(call.affine(layer, *pictures), zero.image_sizes), targets


try:
    from torchvision.models.detection.image_list import ImageList
    from torchvision.models.detection.transform import GeneralizedRCNNTransform
except ImportError:  # torchvision is optional
    GeneralizedRCNNTransform = None

if GeneralizedRCNNTransform is not None:
    register(
        Operation(
            "image_transform",
            Spelling(functions=(GeneralizedRCNNTransform.forward,), leaf=True),
            Affine(transformed_images, default_rule=proportional),
            description="a detector's normalisation, resizing and batching (GeneralizedRCNNTransform): an affine map "
            "of the raw images, z-rule; without its mean under a first layer's flat, w^2 or z^B rule",
        )
    )


try:
    from torchvision.models.video import mvit
    from torchvision.models.video import swin_transformer as swin_transformer_3d
except ImportError:  # torchvision is optional
    mvit = swin_transformer_3d = None

if swin_transformer_3d is not None:
    register(
        Operation(
            "window_attention_3d",
            Spelling(functions=(swin_transformer_3d.shifted_window_attention_3d,)),
            Affine(interpret, weighted=True),
            description="Swin3D window attention, run with relevance functions inside (as the 2D one)",
        )
    )
if mvit is not None:
    register(
        Operation(
            "mvit_reshape",
            Spelling(functions=(mvit._unsqueeze, mvit._squeeze)),
            Native(),
            description="MViT's adding and removing of a dimension: a view, routed by its native backward",
        )
    )
    register(
        Operation(
            "mvit_attention_pieces",
            Spelling(functions=(mvit._add_rel_pos, mvit._add_shortcut)),
            Affine(interpret, weighted=True),
            description="MViT's relative positions added to the attention scores (q times the position tables: linear "
            "in q) and its pooled shortcut (a sum), run with relevance functions inside",
        )
    )
