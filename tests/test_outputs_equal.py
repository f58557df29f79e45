"""What the README says of the explainer's outputs: the model's, bit for bit, except for the
rounding of BatchNorm, which the explainer computes as its affine map (folded into the layer
before it or not)."""

from __future__ import annotations

import torch
import torchvision
from conftest import randomise_batch_norm_statistics, relative_error

import fxlrp


def test_outputs_are_bit_identical_without_batch_norm(generator: torch.Generator) -> None:
    model = torchvision.models.squeezenet1_1(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64, generator=generator)
    with torch.no_grad():
        assert torch.equal(fxlrp.convert(model)(x), model(x))


def test_batch_norm_as_an_affine_map_rounds_differently(generator: torch.Generator) -> None:
    model = randomise_batch_norm_statistics(torchvision.models.resnet18(num_classes=10), generator).eval()
    x = torch.randn(2, 3, 64, 64, generator=generator)
    with torch.no_grad():
        expected = model(x)
        for fold in (True, False):
            assert relative_error(fxlrp.convert(model, fold_batch_norm=fold)(x), expected) < 5e-6
