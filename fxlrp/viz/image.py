"""Relevance of images as pictures: channel reduction, symmetric normalisation, colour maps,
overlays on the input, PNG files. Works on single maps and on batches.

Needs matplotlib and pillow (``pip install fxlrp[pictures]``); the core of fxlrp does not
import this module, so ``import fxlrp`` works without them.

Conventions: relevance batches are ``[batch, channels, height, width]`` tensors or arrays, single
maps ``[channels, height, width]`` or ``[height, width]``. Colours are RGB ``uint8`` arrays of
shape ``[..., height, width, 3]``. Zero relevance is always the middle of the colour map, so
positive and negative relevance keep their meaning across a picture.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import Colormap, LinearSegmentedColormap
from PIL import Image

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


def enlarge(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Repeat each pixel ``factor`` times along height and width.

    Small inputs such as 8x8 digits stay crisp: no interpolation invents structure.

    Parameters
    ----------
    rgb : ndarray
        ``[..., height, width, 3]``.
    factor : int
        The repetitions, at least 1.

    Returns
    -------
    ndarray
        ``[..., factor * height, factor * width, 3]``.

    Raises
    ------
    ValueError
        If ``factor < 1``.
    """
    if factor < 1:
        raise ValueError(f"enlarge factor must be >= 1, got {factor}")
    return np.repeat(np.repeat(rgb, factor, axis=-3), factor, axis=-2)


READABLE_SIDE = 256
"""The shortest side, in pixels, a picture is saved with by default (small inputs enlarged)."""


def readable_scale(height: int, width: int, side: int = READABLE_SIDE) -> int:
    """The enlargement (:func:`enlarge`) that gives a ``height x width`` picture a short side of at
    least ``side`` pixels.

    Parameters
    ----------
    height, width : int
        The picture's size.
    side : int, default :data:`READABLE_SIDE`
        The shortest side wanted.

    Returns
    -------
    int
        ``ceil(side / min(height, width))``, at least 1 (large pictures are kept as they are).
    """
    return max(1, -(-side // max(1, min(height, width))))


def at_size(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """A picture ``[h, w, 3]`` resized to ``[height, width, 3]`` by nearest neighbour: each output
    pixel shows the colour of the input pixel its centre falls in (no invented colours, so a
    heatmap keeps its values and its zero), e.g. a map of a squashed image back at the image's
    own aspect.

    Parameters
    ----------
    rgb : ndarray
        The picture.
    height, width : int
        The size wanted.

    Returns
    -------
    ndarray
        The resized picture.
    """
    rows = ((np.arange(height) + 0.5) * rgb.shape[0] / height).astype(np.int64)
    columns = ((np.arange(width) + 0.5) * rgb.shape[1] / width).astype(np.int64)
    return np.ascontiguousarray(rgb[rows][:, columns])


def shown_size(height: int, width: int, side: int = READABLE_SIDE) -> tuple[int, int]:
    """The size with the aspect of ``height x width`` (an image file's size) and a short side of
    ``side`` pixels.

    Parameters
    ----------
    height, width : int
        The size whose aspect is kept.
    side : int, default :data:`READABLE_SIDE`
        The short side.

    Returns
    -------
    tuple of int
        ``(height, width)``, each rounded to whole pixels.
    """
    factor = side / max(1, min(height, width))
    return max(1, round(height * factor)), max(1, round(width * factor))


COLOUR_BAR_WIDTH = 16
"""Width in pixels of the colour bar of :func:`with_colour_bar`."""


def with_colour_bar(rgb: np.ndarray, largest: float, title: str | None = None,
                    cmap: str | Colormap = "bwr") -> tuple[np.ndarray, tuple[int, int]]:
    """A heatmap with a colour bar on its right (its colours from ``-largest`` at the bottom through
    0 to ``+largest`` at the top, labelled) and a title above it, on white.

    Parameters
    ----------
    rgb : ndarray
        The heatmap picture ``[height, width, 3]`` (as :func:`heatmap` colours it, normalised so
        that ``largest`` is the map's end).
    largest : float
        The relevance the ends of the colour map stand for.
    title : str, optional
        A line above the picture (model, target, composite).
    cmap : str or Colormap, default "bwr"
        The colour map of the heatmap.

    Returns
    -------
    tuple
        The picture, and the ``(row, column)`` of the heatmap's top-left corner in it (the heatmap
        is there unchanged).
    """
    from PIL import ImageDraw

    height, width = rgb.shape[:2]
    font = _font(height)
    line = 0 if title is None else int(font.getbbox("Ag")[3]) + 8
    labels = [f"{largest:+.3g}", "0", f"{-largest:+.3g}"]
    label_width = max(int(font.getlength(label)) for label in labels)
    gap = 8
    wide = width + gap + COLOUR_BAR_WIDTH + 6 + label_width + 6
    if title is not None:
        wide = max(wide, int(font.getlength(title)) + 4)
    canvas = np.full((line + height + 8, wide, 3), 255, dtype=np.uint8)
    canvas[line:line + height, :width] = rgb
    values = np.linspace(1.0, -1.0, height)  # top: +largest, bottom: -largest
    bar = colourise(np.broadcast_to(values[:, None], (height, COLOUR_BAR_WIDTH)), cmap)
    left = width + gap
    canvas[line:line + height, left:left + COLOUR_BAR_WIDTH] = bar
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    if title is not None:
        draw.text((0, 2), title, fill=(0, 0, 0), font=font)
    for label, row in zip(labels, (line, line + height // 2, line + height - 1), strict=True):
        draw.text((left + COLOUR_BAR_WIDTH + 6, row), label, fill=(0, 0, 0), font=font, anchor="lm")
    return np.asarray(picture), (line, 0)


REGION_COLOUR = (0, 200, 0)
"""The outline of a region: green, which none of the diverging colour maps uses."""


def outline(mask: ArrayLike) -> np.ndarray:
    """The border pixels of a region: those of ``mask`` with a 4-neighbour outside it (or at the
    picture's edge).

    Parameters
    ----------
    mask : ndarray or Tensor
        A bool ``[..., height, width]`` mask.

    Returns
    -------
    ndarray
        A bool mask of the same shape.
    """
    inside = as_numpy(mask) != 0
    padded = np.pad(inside, [(0, 0)] * (inside.ndim - 2) + [(1, 1), (1, 1)], constant_values=False)
    interior = (padded[..., :-2, 1:-1] & padded[..., 2:, 1:-1] & padded[..., 1:-1, :-2] & padded[..., 1:-1, 2:])
    return inside & ~interior


def with_region(
    image: ArrayLike,
    relevance: ArrayLike,
    region: ArrayLike,
    cmap: str | Colormap = "bwr",
    reduction: str = "sum",
    gap: int = 2,
    *,
    title: str | None = None,
    label: str | None = None,
    scale: int = 1,
) -> np.ndarray:
    """The image and the heatmap of its relevance side by side, the explained region outlined on
    both (:data:`REGION_COLOUR`): where the relevance of a box, a mask or a region of an output
    lies against where the explained thing is; optionally a title above them and the region's
    label (a detection's class and score) at its top-left corner on both.

    Parameters
    ----------
    image : ndarray or Tensor
        ``[..., channels, height, width]`` (1 or 3 channels).
    relevance : ndarray or Tensor
        ``[..., channels, height, width]``, of the image's size.
    region : ndarray or Tensor
        A bool ``[..., height, width]`` (or ``[height, width]``) mask;
        :func:`fxlrp.explain.targets.box_pixels` makes one of a box.
    cmap : str or Colormap, default "bwr"
        The colour map (:func:`colour_map`).
    reduction : str, default "sum"
        The channel reduction (:func:`reduce_channels`).
    gap : int, default 2
        White columns between the two.
    title : str, optional
        A line above the picture (model, target, composite); one picture only.
    label : str, optional
        Written in the region's colour at its top-left corner (inside it where the region touches
        the picture's top); one picture only.
    scale : int, default 1
        Each pixel repeated ``scale`` times (:func:`enlarge`) before the text is written, so that
        the text has the saved picture's resolution.

    Returns
    -------
    ndarray
        ``[..., scale * height, scale * (2 * width + gap), 3]``, and a title's line higher.

    Raises
    ------
    ValueError
        If image, relevance and region differ in size, or a title or label is given for several
        pictures.
    """
    pictures, colours = image_to_rgb(image), heatmap(relevance, cmap, reduction)
    border = outline(region)
    if pictures.shape != colours.shape or border.shape[-2:] != pictures.shape[-3:-1]:
        raise ValueError(f"image {pictures.shape[:-1]}, relevance {colours.shape[:-1]} and region {border.shape} "
                         "differ in size")
    border = np.broadcast_to(border, pictures.shape[:-1])
    pictures, colours = pictures.copy(), colours.copy()
    pictures[border], colours[border] = REGION_COLOUR, REGION_COLOUR
    spacer = np.full((*pictures.shape[:-2], gap, 3), 255, dtype=np.uint8)
    joined = enlarge(np.concatenate([pictures, spacer, colours], axis=-2), scale)
    if title is None and label is None:
        return joined
    if joined.ndim != 3:
        raise ValueError(f"with_region writes a title or label on one picture; got {joined.shape[0]}: call it per "
                         "picture")
    return _with_text(joined, border, (pictures.shape[-2] + gap) * scale, scale, title, label)


def _with_text(joined: np.ndarray, border: np.ndarray, offset: int, scale: int, title: str | None,
               label: str | None) -> np.ndarray:
    """``joined`` (two panels, the second ``offset`` columns right, enlarged ``scale`` times) with
    ``label`` at the region's top-left corner on both panels and ``title`` on a line above."""
    from PIL import ImageDraw

    height = joined.shape[0]
    font = _font(height)
    line = 0 if title is None else int(font.getbbox("Ag")[3]) + 6
    canvas = np.full((line + height, max(joined.shape[1], _text_width(font, title) + 4), 3), 255, dtype=np.uint8)
    canvas[line:, :joined.shape[1]] = joined
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    if title is not None:
        draw.text((2, 2), title, fill=(0, 0, 0), font=font)
    if label is not None and border.any():
        rows, columns = (where * scale for where in np.nonzero(border))
        text_height = int(font.getbbox("Ag")[3]) + 2
        top = int(rows.min()) - text_height if rows.min() >= text_height else int(rows.min()) + scale + 1
        for left in (int(columns.min()), int(columns.min()) + offset):
            corner = (left, line + top)
            draw.rectangle(draw.textbbox(corner, label, font=font), fill=(255, 255, 255))
            draw.text(corner, label, fill=REGION_COLOUR, font=font)
    return np.asarray(picture)


def _font(height: int) -> Any:
    """The default font at a size readable on a picture ``height`` pixels high."""
    from PIL import ImageFont

    return ImageFont.load_default(size=max(10, min(18, height // 16)))


def _text_width(font: Any, text: str | None) -> int:
    return 0 if text is None else int(font.getlength(text))


def save_png(rgb: np.ndarray, path: str | Path, scale: int | None = None) -> Path:
    """Save one RGB ``uint8`` picture ``[height, width, 3]`` as PNG.

    Parameters
    ----------
    rgb : ndarray
        The picture.
    path : str or Path
        The file; its directory is made if missing.
    scale : int, optional
        Each pixel is saved as ``scale x scale`` pixels (:func:`enlarge`); default: enough for a
        short side of :data:`READABLE_SIDE` pixels (:func:`readable_scale`; 1 for larger pictures).

    Returns
    -------
    Path
        The path.

    Raises
    ------
    ValueError
        If ``rgb`` is not one RGB picture.
    """
    if rgb.ndim != 3 or rgb.shape[-1] != 3:
        raise ValueError(f"save_png takes one RGB picture [height, width, 3], got shape {rgb.shape}")
    scale = readable_scale(*rgb.shape[:2]) if scale is None else scale
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(enlarge(np.ascontiguousarray(rgb, dtype=np.uint8), scale)).save(path, format="PNG")
    return path


def save_pngs(rgb: np.ndarray, directory: str | Path, names: Sequence[str], scale: int | None = None) -> list[Path]:
    """Save a batch ``[batch, height, width, 3]`` as ``directory/name.png`` each.

    Parameters
    ----------
    rgb : ndarray
        The pictures.
    directory : str or Path
        The directory.
    names : sequence of str
        One file name (without ``.png``) per picture.
    scale : int, optional
        Each pixel is saved as ``scale x scale`` pixels; default: a short side of
        :data:`READABLE_SIDE` pixels (:func:`readable_scale`).

    Returns
    -------
    list of Path
        The paths.

    Raises
    ------
    ValueError
        If ``rgb`` is no batch or the names do not match it.
    """
    if rgb.ndim != 4 or len(names) != rgb.shape[0]:
        raise ValueError(f"save_pngs takes a batch [batch, height, width, 3] and one name per picture; "
                         f"got shape {rgb.shape} and {len(names)} names")
    directory = Path(directory)
    return [save_png(picture, directory / f"{name}.png", scale) for picture, name in zip(rgb, names, strict=True)]


def read_png(path: str | Path) -> np.ndarray:
    """An RGB ``uint8`` array ``[height, width, 3]`` read from a PNG file.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    ndarray
        The picture.
    """
    with Image.open(path) as picture:
        return np.asarray(picture.convert("RGB"))


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


def figure_grid(
    images: ArrayLike,
    relevances: Sequence[ArrayLike],
    titles: Sequence[str],
    path: str | Path,
    sample_labels: Sequence[str] | None = None,
    cmap: str | Colormap = "bwr",
    reduction: str = "sum",
    samples_in_columns: bool = False,
) -> Path:
    """One figure with, for each sample, the input and one heatmap per relevance batch.

    Parameters
    ----------
    images : ndarray or Tensor
        ``[batch, channels, h, w]``.
    relevances : sequence of (ndarray or Tensor)
        Batches of the same shape (for example one per composite).
    titles : sequence of str
        ``"input"`` plus one per relevance batch.
    path : str or Path
        The PNG file; its directory is made if missing.
    sample_labels : sequence of str, optional
        One label per sample.
    cmap : str or Colormap, default "bwr"
        The colour map (:func:`colour_map`).
    reduction : str, default "sum"
        The channel reduction (:func:`reduce_channels`).
    samples_in_columns : bool, default False
        Whether samples are columns (for wide figures) rather than rows.

    Returns
    -------
    Path
        The path.

    Raises
    ------
    ValueError
        If the titles do not match the relevance batches.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    inputs = image_to_rgb(images)
    maps = [heatmap(relevance, cmap, reduction) for relevance in relevances]
    samples, kinds = inputs.shape[0], 1 + len(maps)
    if len(titles) != kinds:
        raise ValueError(f"figure_grid needs {kinds} titles (input plus one per relevance), got {len(titles)}")
    rows, columns = (kinds, samples) if samples_in_columns else (samples, kinds)
    figure, axes = pyplot.subplots(rows, columns, figsize=(1.6 * columns, 1.6 * rows), squeeze=False)
    for sample in range(samples):
        for kind, picture in enumerate([inputs[sample]] + [colours[sample] for colours in maps]):
            axis = axes[kind, sample] if samples_in_columns else axes[sample, kind]
            axis.imshow(picture, interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            kind_label = axis.set_ylabel if samples_in_columns else axis.set_title
            sample_label = axis.set_title if samples_in_columns else axis.set_ylabel
            if sample == 0:
                kind_label(titles[kind], fontsize=9)
            if kind == 0 and sample_labels is not None:
                sample_label(sample_labels[sample], fontsize=8)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
