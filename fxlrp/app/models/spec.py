"""``--model SPEC``: the model a spec names, loaded by its source, and the preprocessing that source
prescribes for image files (or ``--size``, ``--mean`` and ``--std``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from fxlrp.app.cli_options import InputError
from fxlrp.app.models.factory import factory_model
from fxlrp.app.models.huggingface import huggingface_preprocessing, open_pretrained
from fxlrp.app.models.timm import timm_model, timm_preprocessing
from fxlrp.app.models.torchvision import torchvision_model, torchvision_preprocessing
from fxlrp.app.models.weights import classes_of, read_state_dict
from fxlrp.app.preprocessing import Preprocessing


def load_model(spec: str, weights: str | Path | None = None) -> nn.Module:
    """The model a ``--model`` spec names, in eval mode.

    Parameters
    ----------
    spec
        ``torchvision:NAME`` (a classification, segmentation or video model), ``timm:NAME`` (random
        weights unless ``weights``), ``hf:DIR`` (a Hugging Face image classifier saved with
        ``save_pretrained``, its weights in DIR) or ``package.module:FACTORY`` (an ``nn.Module``
        class, a function returning one, or a module instance).
    weights
        A state dict file (``torch.save(model.state_dict(), path)``), or None.

    Returns
    -------
    nn.Module
        The model, in eval mode.
    """
    if ":" not in spec:
        raise InputError(f"model {spec!r} is not of the form torchvision:NAME, timm:NAME, hf:DIR or "
                         f"package.module:FACTORY")
    source, _, name = spec.partition(":")
    if source == "hf":
        if weights is not None:
            raise InputError("--weights is for torchvision, timm and factory models; hf:DIR has its weights in DIR")
        pretrained = open_pretrained(name)
        if not pretrained.image:
            raise InputError(f"the model in {name!r} is a text model ({pretrained.architecture}); explain text with "
                             f"--text TEXT")
        return pretrained.load_model()
    state_dict = read_state_dict(weights) if weights is not None else None
    if source == "torchvision":
        model = torchvision_model(name, state_dict)
    elif source == "timm":
        model = timm_model(name, classes_of(state_dict) if state_dict is not None else None)
    else:
        model = factory_model(spec)
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


def model_preprocessing(spec: str, model: nn.Module) -> Preprocessing:
    """The preprocessing a model's source prescribes for image files.

    Parameters
    ----------
    spec
        The ``--model`` spec (``torchvision:NAME``, ``timm:NAME``, ``hf:DIR``, ``package.module:FACTORY``).
    model
        The model it gave; a factory's timm model (one with timm's ``pretrained_cfg``) gets timm's
        data config too.

    Returns
    -------
    Preprocessing
        torchvision: its weights' ``transforms()``; timm: its data config; hf: its image processor;
        other models: the image as it is (no resize), pixels in [0, 1].
    """
    channels = first_layer_channels(model)
    source, _, name = spec.partition(":")
    if source == "torchvision":
        return torchvision_preprocessing(name, model, channels)
    if source == "timm" or isinstance(getattr(model, "pretrained_cfg", None), Mapping):
        return timm_preprocessing(model, channels)
    if source == "hf":
        return huggingface_preprocessing(name, channels)
    return Preprocessing(None, channels, (0.0,) * channels, (1.0,) * channels)


def preprocessing_from_options(args: argparse.Namespace, model: torch.nn.Module) -> Preprocessing:
    """The model's own preprocessing (:func:`model_preprocessing`), or, with ``--size``, ``--mean``
    or ``--std``, a resize to SIZE x SIZE (default: the model's input size) and ``(x - mean) / std``
    (defaults: the model's)."""
    own = model_preprocessing(args.model, model)
    size, mean, std = getattr(args, "size", None), getattr(args, "mean", None), getattr(args, "std", None)
    if size is None and mean is None and std is None:
        return own
    channels = own.channels
    mean, std = mean or own.mean, std or own.std
    for name, values in (("--mean", mean), ("--std", std)):
        if len(values) != channels:
            raise InputError(f"{name} has {len(values)} values; the model takes {channels} channels")
    if any(value <= 0 for value in std):
        raise InputError("--std values must be positive")
    if size is not None and size < 1:
        raise InputError(f"--size must be positive, got {size}")
    return Preprocessing(size or own.size, channels, tuple(mean), tuple(std), dims=own.dims)
