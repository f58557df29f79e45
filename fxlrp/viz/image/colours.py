"""Relevance of images as colours: channel reduction, symmetric normalisation, colour maps,
heatmaps and overlays on the input, and the ``bwr`` map read back into values."""

from __future__ import annotations

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import Colormap, LinearSegmentedColormap

ArrayLike = np.ndarray | torch.Tensor

COLD_AND_HOT = LinearSegmentedColormap.from_list(
    "fxlrp_cold_and_hot",
    # negative: light cyan -> blue -> black at zero; positive: black -> red -> yellow
    [(0.0, (0.6, 1.0, 1.0)), (0.25, (0.0, 0.0, 1.0)), (0.5, (0.0, 0.0, 0.0)),
     (0.75, (1.0, 0.0, 0.0)), (1.0, (1.0, 1.0, 0.0))],
    N=255,  # odd: the middle entry is exactly the value 0 (black)
)
"""Diverging map on black: cold (blue, cyan) for negative, hot (red, yellow) for positive."""

COLOUR_MAPS = ("bwr", "seismic", "coolwarm", "RdBu_r", "cold_and_hot")
"""Names :func:`colour_map` accepts; any other matplotlib colour map name works too."""

CHANNEL_REDUCTIONS = ("sum", "abs_sum", "max_abs", "none")
"""Names :func:`reduce_channels` accepts."""


def as_numpy(values: ArrayLike) -> np.ndarray:
    """A float64 numpy copy of a tensor or array (detached, on the CPU).

    Parameters
    ----------
    values : ndarray or Tensor
        The values.

    Returns
    -------
    ndarray
        The float64 array.
    """
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64)


def colour_map(name: str | Colormap) -> Colormap:
    """A matplotlib colour map by name.

    Parameters
    ----------
    name : str or Colormap
        A matplotlib colour map name, ``"cold_and_hot"`` (fxlrp's :data:`COLD_AND_HOT`), or a
        colour map, returned as it is.

    Returns
    -------
    Colormap
        The colour map.

    Raises
    ------
    ValueError
        If no colour map has that name.
    """
    if isinstance(name, Colormap):
        return name
    if name in ("cold_and_hot", "coldnhot"):
        return COLD_AND_HOT
    try:
        return colormaps[name]
    except KeyError:
        raise ValueError(f"unknown colour map {name!r}; use one of {', '.join(COLOUR_MAPS)} "
                         f"or any matplotlib colour map name") from None


def reduce_channels(relevance: ArrayLike, reduction: str = "sum", channel_axis: int = -3) -> np.ndarray:
    """Collapse the channel axis of ``[..., channels, height, width]`` relevance.

    Parameters
    ----------
    relevance : ndarray or Tensor
        The relevance.
    reduction : {"sum", "abs_sum", "max_abs", "none"}, default "sum"
        ``"sum"``: ``R_hw = sum_c R_chw`` (keeps the sign; relevance of a pixel is the sum over
        its colours). ``"abs_sum"``: ``sum_c |R_chw|`` (magnitude only). ``"max_abs"``: the
        channel value with the largest magnitude, sign kept. ``"none"``: the input must have no
        channel axis.
    channel_axis : int, default -3
        The channel axis.

    Returns
    -------
    ndarray
        The relevance without the channel axis.

    Raises
    ------
    ValueError
        For an unknown reduction, or relevance with fewer than 3 dimensions to reduce.
    """
    values = as_numpy(relevance)
    if reduction == "none":
        return values
    if values.ndim < 3:
        raise ValueError(f"relevance of shape {values.shape} has no channel axis; "
                         f"pass reduction='none' for [height, width] maps")
    if reduction == "sum":
        return values.sum(axis=channel_axis)
    if reduction == "abs_sum":
        return np.abs(values).sum(axis=channel_axis)
    if reduction == "max_abs":
        index = np.expand_dims(np.abs(values).argmax(axis=channel_axis), channel_axis)
        return np.take_along_axis(values, index, axis=channel_axis).squeeze(channel_axis)
    raise ValueError(f"unknown channel reduction {reduction!r}; use one of {', '.join(CHANNEL_REDUCTIONS)}")


def normalise_symmetric(heatmaps: ArrayLike, per_map: bool = True, percentile: float = 100.0) -> np.ndarray:
    """Scale ``[..., height, width]`` maps to ``[-1, 1]`` by ``R / max|R|``, keeping zero at zero.

    All-zero maps stay zero.

    Parameters
    ----------
    heatmaps : ndarray or Tensor
        The maps.
    per_map : bool, default True
        Whether each map gets its own scale; otherwise one scale for all.
    percentile : float, default 100.0
        Below 100, that percentile of ``|R|`` is the scale and values beyond it are clipped, so
        that a few extreme pixels do not wash out the rest.

    Returns
    -------
    ndarray
        The normalised maps.

    Raises
    ------
    ValueError
        If the maps have fewer than 2 dimensions.
    """
    values = as_numpy(heatmaps)
    if values.ndim < 2:
        raise ValueError(f"heatmaps need at least [height, width], got shape {values.shape}")
    magnitude = np.abs(values)
    axes = (-2, -1) if per_map else tuple(range(values.ndim))
    if percentile >= 100.0:
        scale = magnitude.max(axis=axes, keepdims=True)
    else:
        scale = np.percentile(magnitude, percentile, axis=axes, keepdims=True)
    # an all-zero map has no scale: dividing by 1 keeps it zero instead of NaN
    scale = np.where(scale > 0, scale, 1.0)
    return np.clip(values / scale, -1.0, 1.0)


def colourise(normalised: ArrayLike, cmap: str | Colormap = "bwr") -> np.ndarray:
    """Map values in ``[-1, 1]`` to RGB ``uint8`` with zero at the centre of ``cmap``.

    Parameters
    ----------
    normalised : ndarray or Tensor
        Values in ``[-1, 1]`` (clipped to it).
    cmap : str or Colormap, default "bwr"
        The colour map (:func:`colour_map`).

    Returns
    -------
    ndarray
        ``[..., 3]`` colours.
    """
    values = as_numpy(normalised)
    rgba = colour_map(cmap)((np.clip(values, -1.0, 1.0) + 1.0) / 2.0)
    return np.round(rgba[..., :3] * 255).astype(np.uint8)


def heatmap(
    relevance: ArrayLike,
    cmap: str | Colormap = "bwr",
    reduction: str = "sum",
    per_map: bool = True,
    percentile: float = 100.0,
) -> np.ndarray:
    """Relevance as RGB ``uint8`` pictures: reduce channels, normalise symmetrically, colour.

    Parameters
    ----------
    relevance : ndarray or Tensor
        ``[..., channels, height, width]`` (or ``[..., h, w]`` with ``reduction="none"``).
    cmap : str or Colormap, default "bwr"
        The colour map (:func:`colour_map`).
    reduction : str, default "sum"
        The channel reduction (:func:`reduce_channels`).
    per_map : bool, default True
        Whether each map gets its own scale (:func:`normalise_symmetric`).
    percentile : float, default 100.0
        The percentile of ``|R|`` that is the scale (:func:`normalise_symmetric`).

    Returns
    -------
    ndarray
        ``[..., height, width, 3]``.
    """
    return colourise(normalise_symmetric(reduce_channels(relevance, reduction), per_map, percentile), cmap)


def image_to_rgb(image: ArrayLike, low: float | None = None, high: float | None = None) -> np.ndarray:
    """An input image ``[..., channels, height, width]`` (1 or 3 channels) as RGB ``uint8``.

    Values are scaled from ``[low, high]`` to ``[0, 255]``, which undoes any per-channel-free
    normalisation well enough for display.

    Parameters
    ----------
    image : ndarray or Tensor
        The image or images.
    low, high : float, optional
        The range of the values; by default the image's own.

    Returns
    -------
    ndarray
        ``[..., height, width, 3]``.

    Raises
    ------
    ValueError
        If the image does not have 1 or 3 channels third from last.
    """
    values = as_numpy(image)
    if values.ndim < 3 or values.shape[-3] not in (1, 3):
        raise ValueError(f"images need shape [..., 1 or 3 channels, height, width], got {values.shape}")
    low = values.min() if low is None else low
    high = values.max() if high is None else high
    scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    rgb = np.moveaxis(np.clip(scaled, 0.0, 1.0), -3, -1)
    if rgb.shape[-1] == 1:
        rgb = np.repeat(rgb, 3, axis=-1)
    return np.round(rgb * 255).astype(np.uint8)


def overlay(
    image: ArrayLike,
    relevance: ArrayLike,
    cmap: str | Colormap = "bwr",
    reduction: str = "sum",
    strength: float = 0.7,
    percentile: float = 100.0,
) -> np.ndarray:
    """The heatmap of ``relevance`` laid over the grey version of ``image``.

    Each pixel blends a grey image with the heatmap colour, weighted by ``strength * |R|`` of the
    normalised relevance: irrelevant pixels show the image, relevant ones the colour.

    Parameters
    ----------
    image : ndarray or Tensor
        ``[..., channels, height, width]``.
    relevance : ndarray or Tensor
        ``[..., channels, height, width]``, of the image's size.
    cmap : str or Colormap, default "bwr"
        The colour map (:func:`colour_map`).
    reduction : str, default "sum"
        The channel reduction (:func:`reduce_channels`).
    strength : float, default 0.7
        The weight of the colour at the largest relevance.
    percentile : float, default 100.0
        The percentile of ``|R|`` that is the scale (:func:`normalise_symmetric`).

    Returns
    -------
    ndarray
        ``[..., height, width, 3]``.

    Raises
    ------
    ValueError
        If image and relevance differ in size.
    """
    grey = image_to_rgb(image).astype(np.float64).mean(axis=-1, keepdims=True)
    normalised = normalise_symmetric(reduce_channels(relevance, reduction), percentile=percentile)
    if normalised.shape != grey.shape[:-1]:
        raise ValueError(f"image {grey.shape[:-1]} and relevance {normalised.shape} differ in size")
    colours = colourise(normalised, cmap).astype(np.float64)
    weight = strength * np.abs(normalised)[..., None]
    return np.round((1.0 - weight) * grey + weight * colours).astype(np.uint8)


def signed_values_from_bwr(rgb: np.ndarray) -> np.ndarray:
    """Invert the ``bwr`` map: the value in ``[-1, 1]`` each pixel of a bwr heatmap shows.

    bwr runs blue ``(0, 0, 1)`` -> white -> red ``(1, 0, 0)``, so ``(red - blue) / 255`` is the
    normalised relevance. Used to check rendered pictures, not only the arrays behind them.

    Parameters
    ----------
    rgb : ndarray
        ``[..., 3]`` colours of a bwr heatmap.

    Returns
    -------
    ndarray
        The values.
    """
    channels = rgb.astype(np.float64)
    return (channels[..., 0] - channels[..., 2]) / 255.0
