"""What the command line reads: a model from a spec and a weights file, a composite by name,
images (or tensor files) into batches. Every problem becomes an :class:`InputError` whose
message is one line naming the input and what to do."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fxlrp import rules
from fxlrp.errors import FxlrpError
from fxlrp.rules import composites

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TENSOR_SUFFIXES = (".pt", ".pth", ".npy")


class InputError(FxlrpError):
    """A command-line input (model, weights, composite, image) that cannot be used."""


@dataclass(frozen=True)
class Preprocessing:
    """How image files become model inputs: size, channels, ``(x - mean) / std`` per channel."""

    size: int | None
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def input_bounds(self) -> tuple[Tensor, Tensor]:
        """Lowest and highest normalised input values ``[1, C, 1, 1]`` (pixels 0 and 1)."""
        mean = torch.tensor(self.mean).reshape(1, -1, 1, 1)
        std = torch.tensor(self.std).reshape(1, -1, 1, 1)
        return (0.0 - mean) / std, (1.0 - mean) / std


# ---------------------------------------------------------------------------------------------
# models


def _torchvision_model(name: str, classes: int | None) -> nn.Module:
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        close = [model for model in known if model.startswith(name[:4])][:6]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise InputError(f"unknown torchvision model {name!r}{hint}; see torchvision.models.list_models()")
    options = {} if classes is None else {"num_classes": classes}
    return torchvision.models.get_model(name, weights=None, **options)


def imported_object(spec: str, kind: type, what: str) -> Any:
    """``package.module:NAME``: the object NAME if it is a ``kind``, else what calling it returns
    (a class or factory function); a one-line :class:`InputError` if it cannot be imported."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(f"cannot import {module_name!r} for {what} {spec!r}: {error}") from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise InputError(f"{module_name!r} has no attribute {attribute!r} ({what} spec {spec!r})")
    return factory if isinstance(factory, kind) else factory()


def _imported_model(spec: str) -> nn.Module:
    model = imported_object(spec, nn.Module, "model")
    if not isinstance(model, nn.Module):
        raise InputError(f"{spec!r} gives a {type(model).__name__}, not a torch.nn.Module")
    return model


def _first_sentence(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text.split(". ")[0][:160]


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """A state dict from ``torch.save(model.state_dict(), path)`` (or ``{"state_dict": ...}``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"weights file {str(path)!r} does not exist")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise InputError(f"cannot read weights {str(path)!r}: {_first_sentence(error)}; expected a file written by "
                         f"torch.save(model.state_dict(), path)") from None
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(isinstance(value, Tensor) for value in loaded.values()):
        raise InputError(f"weights {str(path)!r} are not a state dict; save them with "
                         f"torch.save(model.state_dict(), path)")
    return loaded


def classes_of(state_dict: dict[str, Tensor]) -> int | None:
    """Output size of the last matrix-shaped weight: the classifier of torchvision models."""
    matrices = [value for key, value in state_dict.items() if key.endswith("weight") and value.dim() == 2]
    return int(matrices[-1].shape[0]) if matrices else None


def load_model(spec: str, weights: str | Path | None = None) -> nn.Module:
    """``torchvision:NAME`` (random weights unless ``weights``) or ``package.module:FACTORY``
    (an ``nn.Module`` class, a function returning one, or a module instance); eval mode."""
    if ":" not in spec:
        raise InputError(f"model {spec!r} is not of the form torchvision:NAME or package.module:FACTORY")
    state_dict = read_state_dict(weights) if weights is not None else None
    source, _, name = spec.partition(":")
    if source == "torchvision":
        model = _torchvision_model(name, classes_of(state_dict) if state_dict is not None else None)
    else:
        model = _imported_model(spec)
    if state_dict is not None:
        try:
            model.load_state_dict(state_dict)
        except RuntimeError as error:
            detail = " ".join(str(error).split())[:300]
            raise InputError(f"weights {str(weights)!r} do not fit {spec}: {detail}") from None
    return model.eval()


def first_layer_channels(model: nn.Module, default: int = 3) -> int:
    """Input channels of the first convolution (what images must be turned into)."""
    for module in model.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return int(module.in_channels)
    return default


# ---------------------------------------------------------------------------------------------
# composites


def _composite_factories() -> dict[str, Callable[[Preprocessing], Any]]:
    """Composite names the command line accepts; EpsilonGammaBox gets the input's bounds."""
    return {
        "epsilon": lambda _: rules.Epsilon(1e-6),
        "lrp0": lambda _: rules.Epsilon(0.0),
        "epsilon_plus": lambda _: composites.EpsilonPlus(),
        "epsilon_plus_flat": lambda _: composites.EpsilonPlusFlat(),
        "epsilon_alpha2_beta1": lambda _: composites.EpsilonAlpha2Beta1(),
        "epsilon_alpha2_beta1_flat": lambda _: composites.EpsilonAlpha2Beta1Flat(),
        "epsilon_gamma_box": lambda preprocessing: composites.EpsilonGammaBox(*preprocessing.input_bounds()),
        "attnlrp": lambda _: composites.AttnLRP(),
        "cplrp": lambda _: composites.CPLRP(),
    }


def composite_names() -> list[str]:
    return list(_composite_factories())


def composite_by_name(name: str, preprocessing: Preprocessing) -> Any:
    """The composite (or single rule) for a command-line name such as ``epsilon_plus_flat``."""
    factories = _composite_factories()
    key = name.lower().replace("-", "_")
    if key not in factories:
        raise InputError(f"unknown composite {name!r}; choose one of {', '.join(factories)}")
    return factories[key](preprocessing)


# ---------------------------------------------------------------------------------------------
# images


def _read_tensor_file(path: Path) -> Tensor:
    try:
        if path.suffix == ".npy":
            values = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            values = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read tensor file {str(path)!r}: {_first_sentence(error)}") from None
    if not isinstance(values, Tensor):
        raise InputError(f"{str(path)!r} holds a {type(values).__name__}, not a tensor")
    return values.float()


def _read_image_file(path: Path, preprocessing: Preprocessing) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as picture:
            picture = picture.convert("L" if preprocessing.channels == 1 else "RGB")
            if preprocessing.size is not None:
                picture = picture.resize((preprocessing.size, preprocessing.size), Image.Resampling.BILINEAR)
            pixels = np.asarray(picture, dtype=np.float32) / 255.0
    except UnidentifiedImageError:
        raise InputError(f"{str(path)!r} is not an image pillow can read (or a .pt/.npy tensor)") from None
    if pixels.ndim == 2:
        pixels = pixels[None]
    else:
        pixels = pixels.transpose(2, 0, 1)
    if pixels.shape[0] != preprocessing.channels:
        raise InputError(f"{str(path)!r} has {pixels.shape[0]} channels, the model takes {preprocessing.channels}")
    mean = torch.tensor(preprocessing.mean).reshape(-1, 1, 1)
    std = torch.tensor(preprocessing.std).reshape(-1, 1, 1)
    return (torch.from_numpy(pixels.copy()) - mean) / std


def read_input(path: str | Path, preprocessing: Preprocessing) -> Tensor:
    """One model input ``[channels, height, width]``.

    Image files are resized to ``size`` (if given), converted to the model's channels and
    normalised; ``.pt``/``.npy`` tensors are taken as they are (already preprocessed) and must have
    shape ``[channels, height, width]`` (or ``[height, width]`` for one channel).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"image {str(path)!r} does not exist")
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        return _read_image_file(path, preprocessing)
    values = _read_tensor_file(path)
    if values.dim() == 2 and preprocessing.channels == 1:
        values = values[None]
    if values.dim() != 3 or values.shape[0] != preprocessing.channels:
        raise InputError(f"{str(path)!r} has shape {tuple(values.shape)}; the model takes "
                         f"[{preprocessing.channels}, height, width]")
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


def _preprocessing(args: argparse.Namespace, model: torch.nn.Module) -> Preprocessing:
    channels = first_layer_channels(model)
    from_torchvision = args.model.startswith("torchvision:")
    imagenet = from_torchvision and channels == 3
    size = getattr(args, "size", None) or (224 if from_torchvision else None)
    mean = getattr(args, "mean", None) or (IMAGENET_MEAN if imagenet else (0.0,) * channels)
    std = getattr(args, "std", None) or (IMAGENET_STD if imagenet else (1.0,) * channels)
    for name, values in (("--mean", mean), ("--std", std)):
        if len(values) != channels:
            raise InputError(f"{name} has {len(values)} values; the model takes {channels} channels")
    if any(value <= 0 for value in std):
        raise InputError("--std values must be positive")
    if size is not None and size < 1:
        raise InputError(f"--size must be positive, got {size}")
    return Preprocessing(size, channels, tuple(mean), tuple(std))


def _run_model(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> torch.Tensor:
    try:
        with torch.no_grad():
            logits = explain(inputs)
    except RuntimeError as error:
        detail = str(error).strip().splitlines()[0][:200]
        raise InputError(f"the model cannot take {paths[0]!r} (input shape {tuple(inputs.shape[1:])}): "
                         f"{detail}; check --size and the image") from None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise InputError("fxlrp explain needs a classifier returning [batch, classes] scores")
    return logits


def _targets(target: int | None, logits: torch.Tensor) -> torch.Tensor:
    classes = logits.shape[1]
    if target is None:
        return logits.argmax(dim=1)
    if not 0 <= target < classes:
        raise InputError(f"--target {target} is out of range: the model has {classes} classes (0..{classes - 1})")
    return torch.full((logits.shape[0],), target, dtype=torch.long)
