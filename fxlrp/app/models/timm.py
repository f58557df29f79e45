"""``--model timm:NAME``: a timm model with random weights (or ``--weights``), preprocessed by its
own data config."""

from __future__ import annotations

import json

from torch import nn

from fxlrp.app.cli_options import InputError
from fxlrp.app.preprocessing import Preprocessing


def timm_model(name: str, classes: int | None) -> nn.Module:
    """A timm model with random weights (``pretrained=False``: no download)."""
    try:
        import timm
    except ImportError:
        raise InputError("timm: models need the timm package: pip install timm") from None
    if not timm.is_model(name):
        close = timm.list_models(f"{name[:4]}*")[:6]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise InputError(f"unknown timm model {name!r}{hint}; see timm.list_models()")
    options = {} if classes is None else {"num_classes": classes}
    return timm.create_model(name, pretrained=False, **options)


def timm_preprocessing(model: nn.Module, channels: int) -> Preprocessing:
    """A timm model's preprocessing from its own data config: input size, interpolation, mean,
    std, crop (``timm.data.resolve_model_data_config``), applied by timm's eval transform."""
    import timm.data

    config = timm.data.resolve_model_data_config(model)
    transform = timm.data.create_transform(**config, is_training=False)
    described = "timm data config " + json.dumps({key: list(value) if isinstance(value, tuple) else value
                                                  for key, value in config.items()}, sort_keys=True)
    size = int(config["input_size"][-1])
    return Preprocessing(size, channels, tuple(config["mean"]), tuple(config["std"]), transform, described)
