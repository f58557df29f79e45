"""A model's own normalisation of its raw input, written in its code before the first layer.

torchvision's Inception v3 and GoogLeNet with ``transform_input`` map ImageNet-normalised
channels to their own (``x * a_c + b_c``), Gemma 4's vision encoder (timm and transformers) maps
pixels in [0, 1] to [-1, 1] (``2 * (x - 0.5)``). Such a map ``y = J x + y_0`` is affine and
elementwise here. By the z-rule, with which LRP-0 of the model stays gradient x input, a sum
adding ``b`` gives ``x`` the share ``a x / (a x + b)``, a division by the normalised value that
makes outliers where it is near 0. Under a first-layer rule that does not share by its input's
values (flat, w^2, z^B) the sums the inputs meet before the first layer take LRP-0 without the
constant, ``R_x = x J^T (R_y / (J x))``, which for an elementwise map is ``R_y``: the raw input
gets the relevance the first layer's rule gave the normalised image it reads.

Reference: the same weights without the normalisation, explained on the normalised image ``y``,
must give the raw input the same relevance (float64, 1e-10); both capture paths.
"""

from __future__ import annotations

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import EpsilonGammaBox, EpsilonPlusFlat

torchvision = pytest.importorskip("torchvision")


class SmallInception(nn.Module):
    """torchvision's own ``GoogLeNet._transform_input`` (Inception v3's is the same code) before two
    convolutions and a classifier; ``transform_input`` False leaves the image as it is."""

    def __init__(self, transform_input: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.transform_input = transform_input
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.fc = nn.Linear(32, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = torchvision.models.GoogLeNet._transform_input(self, x)
        return self.fc(self.features(x).flatten(1))


def googlenet(transform_input: bool) -> nn.Module:
    return SmallInception(transform_input).eval().double()


def images() -> Tensor:
    # ImageNet-normalised pixels: torchvision's transform_input expects them
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).view(3, 1, 1)
    raw = torch.rand(1, 3, 12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return (raw - mean) / std


def transformed(x: Tensor) -> Tensor:
    """torchvision's ``_transform_input``, applied outside the model."""
    return torchvision.models.GoogLeNet._transform_input(googlenet(True), x)


COMPOSITES = {
    "EpsilonPlusFlat": EpsilonPlusFlat,
    # (bounds of the image the first layer reads: transform_input's output, [-1, 1] for pixels in [0, 1])
    "EpsilonGammaBox": lambda: EpsilonGammaBox(-1.0, 1.0),
}


@pytest.mark.parametrize("composite", list(COMPOSITES), ids=list(COMPOSITES))
def test_torchvisions_transform_input_gives_the_first_layer_the_image_it_expects(composite: str) -> None:
    x = images()
    with_map = fxlrp.attribute(fxlrp.convert(googlenet(True), COMPOSITES[composite]()), x, target=3)
    without = fxlrp.attribute(fxlrp.convert(googlenet(False), COMPOSITES[composite]()), transformed(x), target=3)
    assert relative_error(with_map, without) < 1e-10 and without.abs().sum() > 0


def test_torchvisions_transform_input_under_lrp0_is_gradient_times_input() -> None:
    model, x = googlenet(True), images()
    relevance = fxlrp.attribute(fxlrp.convert(model, Epsilon(0.0)), x, target=3)
    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)[0, 3], leaf)
    assert relative_error(relevance, gradient * x) < 1e-10 and relevance.abs().sum() > 0


class Encoder(nn.Module):
    """Gemma 4's patch embedding in small: ``2 * (x - 0.5)``, a dense layer, then a classifier;
    ``eager`` adds a branch on a tensor's value, which torch.fx cannot trace (run eagerly)."""

    def __init__(self, normalises: bool, eager: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.normalises, self.eager = normalises, eager
        self.input_proj = nn.Linear(12, 16)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))

    def forward(self, patches: Tensor) -> Tensor:
        if self.normalises:
            patches = 2 * (patches - 0.5)
        if self.eager and patches.sum() > float("-inf"):
            patches = patches * 1.0
        return self.head(self.input_proj(patches)).sum(1)


@pytest.mark.parametrize("eager", [False, True], ids=["traced", "eager"])
def test_a_normalisation_in_the_models_code_gives_the_first_layer_the_image_it_expects(eager: bool) -> None:
    patches = torch.rand(2, 6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    explain = fxlrp.convert(Encoder(True, eager).double().eval(), EpsilonPlusFlat())
    assert ("captured by torch.fx" in str(explain.report())) is not eager
    with_map = fxlrp.attribute(explain, patches, target=1)
    without = fxlrp.attribute(fxlrp.convert(Encoder(False, eager).double().eval(), EpsilonPlusFlat()),
                              2 * (patches - 0.5), target=1)
    assert relative_error(with_map, without) < 1e-10 and without.abs().sum() > 0
    # the second call of the same signature (replayed from a recorded graph where run eagerly)
    assert relative_error(fxlrp.attribute(explain, patches, target=1), without) < 1e-10


@pytest.mark.parametrize("eager", [False, True], ids=["traced", "eager"])
def test_lrp0_through_a_normalisation_in_the_models_code_is_gradient_times_input(eager: bool) -> None:
    model = Encoder(True, eager).double().eval()
    patches = torch.rand(2, 6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    relevance = fxlrp.attribute(fxlrp.convert(model, Epsilon(0.0)), patches, target=1)
    leaf = patches.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)[:, 1].sum(), leaf)
    assert relative_error(relevance, gradient * patches) < 1e-10 and relevance.abs().sum() > 0
