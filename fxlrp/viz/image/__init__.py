"""Relevance of images as pictures: channel reduction, symmetric normalisation, colour maps,
overlays on the input, PNG files. Works on single maps and on batches.

Needs matplotlib and pillow (``pip install fxlrp[pictures]``); the core of fxlrp does not
import this module, so ``import fxlrp`` works without them.

Conventions: relevance batches are ``[batch, channels, height, width]`` tensors or arrays, single
maps ``[channels, height, width]`` or ``[height, width]``. Colours are RGB ``uint8`` arrays of
shape ``[..., height, width, 3]``. Zero relevance is always the middle of the colour map, so
positive and negative relevance keep their meaning across a picture.

Its modules, by job: :mod:`~fxlrp.viz.image.colours` (heatmap colouring),
:mod:`~fxlrp.viz.image.layout` (sizes, colour bar and title, regions, figures) and
:mod:`~fxlrp.viz.image.files` (PNG files); every name is here too.
"""

from fxlrp.viz.image.colours import (
    CHANNEL_REDUCTIONS,
    COLD_AND_HOT,
    COLOUR_MAPS,
    ArrayLike,
    as_numpy,
    colour_map,
    colourise,
    heatmap,
    image_to_rgb,
    normalise_symmetric,
    overlay,
    reduce_channels,
    signed_values_from_bwr,
)
from fxlrp.viz.image.files import read_png, save_png, save_pngs
from fxlrp.viz.image.layout import (
    COLOUR_BAR_WIDTH,
    READABLE_SIDE,
    REGION_COLOUR,
    at_size,
    enlarge,
    figure_grid,
    outline,
    readable_scale,
    shown_size,
    with_colour_bar,
    with_region,
)

__all__ = [
    "CHANNEL_REDUCTIONS", "COLD_AND_HOT", "COLOUR_BAR_WIDTH", "COLOUR_MAPS", "READABLE_SIDE", "REGION_COLOUR",
    "ArrayLike", "as_numpy", "at_size", "colour_map", "colourise", "enlarge", "figure_grid", "heatmap",
    "image_to_rgb", "normalise_symmetric", "outline", "overlay", "read_png", "readable_scale", "reduce_channels",
    "save_png", "save_pngs", "shown_size", "signed_values_from_bwr", "with_colour_bar", "with_region",
]
