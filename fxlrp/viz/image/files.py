"""Pictures of relevance as PNG files: written at a readable size, and read back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from fxlrp.viz.image.layout import enlarge, readable_scale


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
