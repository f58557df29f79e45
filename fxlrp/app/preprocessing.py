"""How image files become a model's inputs: a resize (or the model's own transform), the channels,
``(x - mean) / std`` per channel, and the bounds of the normalised inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocessing:
    """How image files become model inputs: size, channels, ``(x - mean) / std`` per channel.

    ``transform``: the model's own preprocessing of a PIL image (a torchvision weights'
    ``transforms()``, timm's eval transform of the model's data config, a Hugging Face image
    processor), used instead of ``size``, ``mean`` and ``std`` when set (``mean`` and ``std`` then
    repeat its normalisation, for the input bounds); ``description`` says what it does (recorded
    in a data-set run's settings). ``dims``: dimensions of one sample, 3 for images
    ``[channels, height, width]``, 4 for a video model's clips ``[channels, frames, height, width]``.
    """

    size: int | None
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    transform: Callable[[Any], Tensor] | None = field(default=None, compare=False, repr=False)
    description: str | None = None
    dims: int = 3

    def input_bounds(self) -> tuple[Tensor, Tensor]:
        """Lowest and highest normalised input values ``[1, C, 1, ...]`` (pixels 0 and 1)."""
        shape = (1, -1, *[1] * (self.dims - 1))
        mean = torch.tensor(self.mean).reshape(shape)
        std = torch.tensor(self.std).reshape(shape)
        return (0.0 - mean) / std, (1.0 - mean) / std

    @property
    def sample_layout(self) -> str:
        """A sample's dimensions in words, for messages."""
        return "[channels, frames, height, width]" if self.dims == 4 else "[channels, height, width]"
