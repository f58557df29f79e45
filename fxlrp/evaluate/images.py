"""Perturbation curves of images: pixel flipping (Bach et al. 2015) and region perturbation
(Samek et al. 2017), most or least relevant first, batched over samples and steps."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.evaluate.curves import (
    EvaluationInputError,
    PerturbationCurves,
    as_relevance,
    check_choice,
    check_curve_options,
    tensor_curves,
)

BASELINES = ("zeros", "mean", "blur", "noise")


def image_baseline(inputs: Tensor, baseline: str | float | Tensor, blur_sigma: float = 2.0,
                   seed: int = 0) -> Tensor:
    """What a perturbed pixel becomes, per image.

    Parameters
    ----------
    inputs : Tensor
        ``[samples, channels, height, width]``.
    baseline : str, float or Tensor
        ``"zeros"``; ``"mean"``: each image's mean per channel (of the unperturbed image: Quantus's
        ``"mean"`` takes the mean of the image as perturbed so far at each step); ``"blur"``: the
        image blurred with a Gaussian of standard deviation ``blur_sigma`` pixels (reflected at the
        border), so that a perturbed pixel loses its detail but keeps its surroundings' colour;
        ``"noise"``: Gaussian noise with each image's mean and standard deviation per channel,
        drawn once per image from a generator seeded with ``seed`` (on the CPU: the same on every
        device); a number; or a tensor broadcastable to ``inputs``.
    blur_sigma : float
        The blur's standard deviation in pixels.
    seed : int
        The noise's seed.

    Returns
    -------
    Tensor
        Broadcastable to ``inputs``, in their dtype and on their device.
    """
    if isinstance(baseline, Tensor):
        try:
            torch.broadcast_shapes(baseline.shape, inputs.shape)
        except RuntimeError:
            raise EvaluationInputError(f"the baseline has shape {list(baseline.shape)}, which does not broadcast to "
                                       f"the inputs' {list(inputs.shape)}") from None
        return baseline.to(inputs.device, inputs.dtype)
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        return torch.full((1,) * inputs.dim(), float(baseline), dtype=inputs.dtype, device=inputs.device)
    check_choice(baseline, BASELINES, "baseline")  # type: ignore[arg-type]
    if baseline == "zeros":
        return torch.zeros((1,) * inputs.dim(), dtype=inputs.dtype, device=inputs.device)
    if baseline == "mean":
        return inputs.mean(dim=(2, 3), keepdim=True)
    if baseline == "blur":
        return gaussian_blur(inputs, blur_sigma)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(inputs.shape, generator=generator, dtype=torch.float64).to(inputs.device, inputs.dtype)
    return inputs.mean(dim=(2, 3), keepdim=True) + inputs.std(dim=(2, 3), keepdim=True) * noise


def gaussian_blur(inputs: Tensor, sigma: float) -> Tensor:
    """Each channel of ``inputs`` ``[samples, channels, height, width]`` blurred with a Gaussian of
    standard deviation ``sigma`` pixels (kernel radius ``ceil(3 sigma)``, reflected at the border)."""
    if not sigma > 0:
        raise EvaluationInputError(f"blur_sigma must be positive, got {sigma}")
    height, width = inputs.shape[-2:]
    radius = max(1, min(math.ceil(3 * sigma), height - 1, width - 1))
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64, device=inputs.device)
    kernel = torch.exp(-offsets ** 2 / (2 * sigma ** 2))
    kernel = (kernel / kernel.sum()).to(inputs.dtype)
    channels = inputs.shape[1]
    padded = torch.nn.functional.pad(inputs, (radius, radius, radius, radius), mode="reflect")
    rows = torch.nn.functional.conv2d(padded, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)
    return torch.nn.functional.conv2d(rows, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)


def patch_grid(height: int, width: int, patch: int, device: torch.device | None = None) -> Tensor:
    """The patch each pixel belongs to ``[height, width]`` (int64, row-major patch numbers):
    ``patch x patch`` squares on a grid centred on the image, so that where ``patch`` does not
    divide a side the patches at both borders are cut (the grid of Quantus's
    ``RegionPerturbation``, which pads the image to a multiple of the patch size)."""
    if patch < 1:
        raise EvaluationInputError(f"patch must be at least 1 pixel, got {patch}")
    top, left = ((-height) % patch) // 2, ((-width) % patch) // 2
    across = -(-(width + (-width) % patch) // patch)
    rows = (torch.arange(height, device=device) + top) // patch
    columns = (torch.arange(width, device=device) + left) // patch
    return rows[:, None] * across + columns[None, :]


def image_curves(model: Callable[[Tensor], Any], inputs: Tensor, relevance: Any, target: Any = None, *,
                 patch: int = 1, per_channel: bool = False, orders: str | tuple[str, ...] = ("morf", "lerf"),
                 mode: str = "deletion", baseline: str | float | Tensor = "zeros", blur_sigma: float = 2.0,
                 seed: int = 0, score: str = "logit", features_per_step: int | None = None,
                 steps: int | None = None, batch_size: int = 256, progress: bool = True) -> PerturbationCurves:
    r"""Pixel-flipping / region-perturbation curves of images: the model's score as pixels (or
    patches) are replaced by a baseline in the order of their relevance.

    For each image, order and step ``j`` the input :math:`x^{(j)}` has its ``k_j`` first features
    in the order replaced by the baseline (deletion; insertion starts from the baseline and
    restores them), and the curve holds :math:`f_c(x^{(j)})`, the target's logit (or probability).
    Every (image, order, step) is one row of a batch: the model runs on ``batch_size`` perturbed
    images at a time, on the inputs' device. :class:`~fxlrp.evaluate.PerturbationCurves`
    summarises them (AUC, ABPC, AOPC).

    Parameters
    ----------
    model : callable
        The model (in evaluation mode; it is not changed), or any function of a batch
        ``[batch, channels, height, width]`` returning scores ``[batch, classes]`` (or, with a
        callable ``target``, whatever that target reads: a detector's detections).
    inputs : Tensor
        ``[samples, channels, height, width]``.
    relevance : Tensor, numpy.ndarray or array-like
        ``[samples, channels, height, width]``, ``[samples, 1, height, width]`` or
        ``[samples, height, width]``, from fxlrp, Captum, zennit or anywhere; a pixel's relevance
        is the sum over its channels, a patch's the sum over its pixels.
    target : int, Tensor, callable or None
        The class whose score the curves follow, one for all or one per image; None: each
        image's predicted class (on the unperturbed image). A callable
        ``target(output, samples)`` reads the scores itself: given the model's output on a batch
        and the image each of its inputs perturbs (``[batch]`` int64), it returns one score per
        input ``[batch]`` (e.g. :class:`~fxlrp.evaluate.DetectionScore`, the score of a detection
        matched to the explained box); ``score`` then stays ``"logit"``.
    patch : int
        1: pixels; ``p``: ``p x p`` patches (:func:`patch_grid`).
    per_channel : bool
        Each channel of each pixel is a feature of its own (Quantus's ``PixelFlipping`` on
        attributions of the input's full shape); needs ``patch=1``.
    orders : str or tuple of str
        ``"morf"`` (most relevant first), ``"lerf"`` (least relevant first) or both.
    mode : str
        ``"deletion"`` or ``"insertion"``.
    baseline : str, float or Tensor
        ``"zeros"``, ``"mean"``, ``"blur"``, ``"noise"``, a number or a tensor
        (:func:`image_baseline`).
    blur_sigma, seed : float, int
        The blur's standard deviation in pixels; the noise's seed.
    score : str
        ``"logit"`` or ``"probability"`` (the softmax of the output) of the target class.
    features_per_step : int or None
        Features perturbed per step (the last step takes the rest); default 1.
    steps : int or None
        Instead, the number of steps: step ``j`` perturbs ``round(j F / steps)`` features.
    batch_size : int
        Perturbed images per model call.
    progress : bool
        Show a progress bar (tqdm, when installed and stderr is a terminal).

    Returns
    -------
    PerturbationCurves
        Scores ``[samples, steps + 1]`` per order, in float64.
    """
    orders = check_curve_options(model, orders, mode, score)
    if not isinstance(inputs, Tensor) or inputs.dim() != 4:
        shape = list(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise EvaluationInputError(f"image_curves takes images [samples, channels, height, width] as a tensor, got "
                                   f"{shape}")
    samples, channels, height, width = inputs.shape
    values = as_relevance(relevance, inputs.device)
    if values.dim() == 3:
        values = values[:, None]
    if values.dim() != 4 or values.shape[0] != samples or tuple(values.shape[2:]) != (height, width) \
            or values.shape[1] not in (1, channels):
        raise EvaluationInputError(f"relevance has shape {list(values.shape)}; for images {list(inputs.shape)} give "
                                   f"[{samples}, {channels}, {height}, {width}], [{samples}, 1, {height}, {width}] "
                                   f"or [{samples}, {height}, {width}]")
    if per_channel:
        if patch != 1:
            raise EvaluationInputError("per_channel perturbs single values; it takes patch=1")
        feature_of = torch.arange(channels * height * width, device=inputs.device).view(channels, height, width)
        per_feature = values.expand(samples, channels, height, width).reshape(samples, -1)
    else:
        grid = patch_grid(height, width, patch, inputs.device)
        feature_of = grid[None]
        summed = values.sum(dim=1).reshape(samples, -1)
        per_feature = torch.zeros(samples, int(grid.max()) + 1, dtype=torch.float64, device=inputs.device)
        per_feature.index_add_(1, grid.reshape(-1), summed)
    filled = image_baseline(inputs, baseline, blur_sigma, seed)
    return tensor_curves(model, inputs, per_feature, feature_of, filled, target, orders=orders, mode=mode,
                         score=score, features_per_step=features_per_step, steps=steps, valid=None,
                         batch_size=batch_size, progress=progress)
