"""``--device`` and ``--dtype``: the device checked to exist, the model and its inputs on it in the
precision asked for (float64 converts them; bfloat16 and float16 run them under autocast)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.app.cli_options import InputError

AUTOCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def device_of(name: str) -> torch.device:
    """``--device`` as a torch device, checked to exist on this machine."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"unknown --device {name!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise InputError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {name}: MPS is not available on this machine")
    if device.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"--device {name}: use cpu, cuda, cuda:N or mps")
    return device


def prepare_model(model: nn.Module, device: torch.device, dtype: str) -> nn.Module:
    """The model on ``device``, in float64 for ``--dtype float64`` (autocast dtypes keep float32
    parameters)."""
    model = model.to(device)
    return model.double() if dtype == "float64" else model


def prepare_inputs(inputs: Tensor, device: torch.device, dtype: str) -> Tensor:
    return inputs.to(device, torch.float64 if dtype == "float64" else torch.float32)


def autocast(device: torch.device, dtype: str) -> AbstractContextManager[Any]:
    """Autocast to bfloat16 / float16 on ``device``; nothing for float32 and float64."""
    if dtype not in AUTOCAST:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST[dtype])
