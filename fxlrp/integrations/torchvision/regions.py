"""Pooling of a detector's feature maps over boxes (RoIAlign, RoIPool, their position-sensitive
forms, ``MultiScaleRoIAlign``), with the boxes held constant: they say where to pool, not what."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.eager.interpret import interpret
from fxlrp.operations.helpers import affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Routed, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall

try:
    from torchvision.ops import MultiScaleRoIAlign, ps_roi_align, ps_roi_pool, roi_align, roi_pool
except ImportError:  # torchvision is optional for fxlrp's core
    MultiScaleRoIAlign = roi_align = roi_pool = ps_roi_align = ps_roi_pool = None


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


if MultiScaleRoIAlign is not None:
    register(
        Operation(
            "multi_scale_roi_align",
            Spelling(modules=(MultiScaleRoIAlign,)),
            Affine(multi_scale_region_average, default_rule=proportional),
            description="MultiScaleRoIAlign: RoIAlign on each box's level of the feature pyramid, run with relevance "
            "functions inside; the boxes get no relevance",
        )
    )
