"""A detector's ``GeneralizedRCNNTransform`` (normalising, resizing and batching its images),
explained as one affine map of the raw images."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Spelling, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance


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
