"""Pictures of relevance laid out: enlarged to a readable size, with a colour bar and a title,
an explained region outlined beside the image and labelled, and figures of several heatmaps per
sample."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import Colormap
from PIL import Image

from fxlrp.viz.image.colours import (
    ArrayLike,
    as_numpy,
    colour_map,
    colourise,
    heatmap,
    image_to_rgb,
    reduce_channels,
)


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
    """One figure with, for each sample, the input and one heatmap per relevance batch, each
    heatmap with a colour bar on its right: each map has its own symmetric scale, as
    :func:`heatmap` colours it (``R / max|R|``), and its bar runs from ``-max|R|`` at the bottom
    through 0 to ``+max|R|`` at the top, labelled with those values (as :func:`with_colour_bar`'s).

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
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    inputs = image_to_rgb(images)
    maps = [heatmap(relevance, cmap, reduction) for relevance in relevances]
    # (the scale heatmap() normalised each map by, which its colour bar labels)
    largest = [np.abs(reduce_channels(relevance, reduction)).max(axis=(-2, -1)) for relevance in relevances]
    samples, kinds = inputs.shape[0], 1 + len(maps)
    if len(titles) != kinds:
        raise ValueError(f"figure_grid needs {kinds} titles (input plus one per relevance), got {len(titles)}")
    rows, columns = (kinds, samples) if samples_in_columns else (samples, kinds)
    figure, axes = pyplot.subplots(rows, columns, figsize=(2.2 * columns, 1.7 * rows), squeeze=False)
    for sample in range(samples):
        for kind, picture in enumerate([inputs[sample]] + [colours[sample] for colours in maps]):
            axis = axes[kind, sample] if samples_in_columns else axes[sample, kind]
            axis.imshow(picture, interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            bar_axis = make_axes_locatable(axis).append_axes("right", size="8%", pad=0.05)
            if kind == 0:
                bar_axis.set_axis_off()  # (kept: the input as large as the heatmaps beside it)
            else:
                end = float(largest[kind - 1][sample])
                bar = figure.colorbar(ScalarMappable(Normalize(-end, end), colour_map(cmap)), cax=bar_axis,
                                      ticks=[-end, 0.0, end])
                bar.ax.set_yticklabels([f"{-end:+.3g}", "0", f"{end:+.3g}"], fontsize=7)
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
