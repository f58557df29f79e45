"""What the command line reads as one model input: an image file (preprocessed) or a ``.pt``/``.npy``
tensor file (taken as it is), checked to hold no NaN or Inf."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fxlrp.app.cli_options import InputError, first_sentence
from fxlrp.app.preprocessing import Preprocessing

TENSOR_SUFFIXES = (".pt", ".pth", ".npy")


def _read_tensor_file(path: Path) -> Tensor:
    try:
        if path.suffix == ".npy":
            values = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            values = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read tensor file {str(path)!r}: {first_sentence(error)}") from None
    if not isinstance(values, Tensor):
        raise InputError(f"{str(path)!r} holds a {type(values).__name__}, not a tensor")
    return values.float()


def _read_image_file(path: Path, preprocessing: Preprocessing) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    if preprocessing.dims != 3:
        how = f" ({preprocessing.description})" if preprocessing.description else ""
        raise InputError(f"{str(path)!r} is an image; the model takes video clips: give .pt/.npy tensors "
                         f"{preprocessing.sample_layout}{how}")
    try:
        with Image.open(path) as picture:
            picture = picture.convert("L" if preprocessing.channels == 1 else "RGB")
            if preprocessing.transform is not None:
                values = preprocessing.transform(picture)
                return values if isinstance(values, Tensor) else torch.as_tensor(np.asarray(values))
            if preprocessing.size is not None:
                picture = picture.resize((preprocessing.size, preprocessing.size), Image.Resampling.BILINEAR)
            pixels = np.asarray(picture, dtype=np.float32) / 255.0
    except UnidentifiedImageError:
        raise InputError(f"{str(path)!r} is not an image pillow can read (or a .pt/.npy tensor)") from None
    except (OSError, ValueError, SyntaxError) as error:  # a damaged file: pillow fails while decoding it
        raise InputError(f"{str(path)!r} cannot be decoded: {first_sentence(error)}") from None
    if pixels.ndim == 2:
        pixels = pixels[None]
    else:
        pixels = pixels.transpose(2, 0, 1)
    if pixels.shape[0] != preprocessing.channels:
        raise InputError(f"{str(path)!r} has {pixels.shape[0]} channels, the model takes {preprocessing.channels}")
    mean = torch.tensor(preprocessing.mean).reshape(-1, 1, 1)
    std = torch.tensor(preprocessing.std).reshape(-1, 1, 1)
    return (torch.from_numpy(pixels.copy()) - mean) / std


def non_finite(values: Tensor) -> str | None:
    """Why a sample cannot be explained if it holds NaN or Inf.

    Parameters
    ----------
    values
        One sample.

    Returns
    -------
    str or None
        How many NaN and Inf it holds (its relevance, and that of every value it meets in the
        model, would be NaN), as the end of a sentence naming it; None when all are finite.
    """
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(values).sum())
    infinite = int((~finite).sum()) - nan
    found = " and ".join(f"{count} {kind}" for count, kind in ((nan, "NaN"), (infinite, "Inf")) if count)
    return f"has {found} among its {values.numel()} values (its relevance would be NaN)"


def read_input(path: str | Path, preprocessing: Preprocessing) -> Tensor:
    """One model input: ``[channels, height, width]`` (``[channels, frames, height, width]`` for
    a video model).

    Parameters
    ----------
    path
        An image file, or a ``.pt``/``.npy`` tensor file.
    preprocessing
        How image files are resized, converted to the model's channels and normalised (the
        model's own transform where it has one); tensor files are taken as they are (already
        preprocessed) and must have the shape of one sample (without the channel dimension for
        one channel).

    Returns
    -------
    Tensor
        The sample, float32; an :class:`InputError` if it cannot be read or holds NaN or Inf.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"image {str(path)!r} does not exist")
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        values = _read_image_file(path, preprocessing)
    else:
        values = _read_tensor_file(path)
        if values.dim() == preprocessing.dims - 1 and preprocessing.channels == 1:
            values = values[None]
        if values.dim() != preprocessing.dims or values.shape[0] != preprocessing.channels:
            layout = preprocessing.sample_layout.replace("channels", str(preprocessing.channels), 1)
            raise InputError(f"{str(path)!r} has shape {tuple(values.shape)}; the model takes {layout}")
    problem = non_finite(values)
    if problem is not None:
        raise InputError(f"{str(path)!r} {problem}; replace them or remove the file")
    return values


def stack_inputs(paths: Sequence[str | Path], preprocessing: Preprocessing) -> Tensor:
    """A batch ``[n, channels, height, width]``; all inputs must end up the same size."""
    return torch.stack([read_input(path, preprocessing) for path in paths])


def check_inputs(paths: Sequence[str | Path], preprocessing: Preprocessing) -> tuple[int, ...]:
    """Read every input once, before any work starts, so that a bad file among many fails
    fast; returns the common shape ``(channels, height, width)``."""
    missing = [str(path) for path in paths if not Path(path).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"image {missing[0]!r} does not exist{more}")
    shapes = {Path(path).name: tuple(read_input(path, preprocessing).shape) for path in paths}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name} {shape[1:]}" for name, shape in list(shapes.items())[:4])
        raise InputError(f"inputs differ in size ({listing}, ...); pass --size to resize images")
    return next(iter(shapes.values()))
