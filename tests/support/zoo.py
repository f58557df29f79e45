"""The torchvision classification zoo as the sweep uses it: names, smallest inputs, builders.

``INPUT_SIZE`` is the smallest square input (from 16, 24, 32, 48, 64, 75, ..., 224) each model's
default configuration runs on: the vision transformers and MaxViT fix their input size at 224;
swin_t runs at 64 so that one model takes the shifted-window path with its attention mask
(smaller inputs give windows larger than the feature map, which switches the shift off).
"""

from __future__ import annotations

import warnings

import torch
import torchvision
from torch import Tensor, nn

NAMES = tuple(torchvision.models.list_models(module=torchvision.models))

_SIZES = {
    "alexnet": 64, "inception_v3": 75, "maxvit_t": 224, "squeezenet1_0": 24, "squeezenet1_1": 24, "swin_t": 64,
}
_SIZES.update({name: 32 for name in NAMES if name.startswith(("convnext", "densenet", "vgg"))})
_SIZES.update({name: 224 for name in NAMES if name.startswith("vit_")})
INPUT_SIZE = {name: _SIZES.get(name, 16) for name in NAMES}

PIECEWISE_LINEAR = tuple(
    name for name in NAMES
    if name.startswith(("alexnet", "vgg", "resnet", "resnext", "wide_resnet", "densenet", "squeezenet",
                        "googlenet", "inception", "mnasnet", "mobilenet_v2", "shufflenet", "regnet_x"))
)
"""Models built only from affine layers, ReLU/ReLU6, max and average pooling, BatchNorm, add, cat
and views: LRP-0 equals gradient x input on them."""


def liven(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Random BatchNorm statistics and affine parameters, and random values for weights that are
    initialised to zero (ViT's head): with default initialisation some models' logits are ~1e-15
    or exactly 0, which would make "relevance not all zero" meaningless."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.1)
        for parameter in model.parameters():
            if parameter.dim() >= 2 and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """The model with random weights (no downloads), in eval mode."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # googlenet / inception_v3 weight-initialisation notice
        model = torchvision.models.get_model(name, weights=None)
    return liven(model, torch.Generator().manual_seed(seed)).to(dtype).eval()


def image(name: str, dtype: torch.dtype = torch.float32, seed: int = 1) -> Tensor:
    size = INPUT_SIZE[name]
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=dtype)
