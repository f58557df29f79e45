"""What the README says of the explainer's outputs: the model's, bit for bit, except for the
rounding of BatchNorm, which the explainer computes as its affine map (folded into the layer
before it or not)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torchvision
from support.references import randomise_batch_norm_statistics, relative_error

import fxlrp
from fxlrp.rules.composites import Epsilon


def test_outputs_are_bit_identical_without_batch_norm(generator: torch.Generator) -> None:
    model = torchvision.models.squeezenet1_1(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64, generator=generator)
    with torch.no_grad():
        assert torch.equal(fxlrp.convert(model)(x), model(x))


def test_batch_norm_as_an_affine_map_rounds_differently(generator: torch.Generator) -> None:
    """BatchNorm as its affine map, folded or not: the same function, its sums rounded in another
    order. In float64 (rounding ~1e-16 relative, grown along ResNet-18's depth to well under 1e-13)
    a bound of 1e-12 holds by construction, while a change of the map (an epsilon dropped from the
    variance: ~1e-5 relative) is far above it."""
    torch.manual_seed(0)
    model = randomise_batch_norm_statistics(torchvision.models.resnet18(num_classes=10), generator).double().eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        expected = model(x)
        for fold in (True, False):
            assert relative_error(fxlrp.convert(model, fold_batch_norm=fold)(x), expected) < 1e-12


class ScoresAsModelOutput(torch.nn.Module):
    """A classifier returning a transformers ``ModelOutput`` (a dataclass that is an ordered
    dict), as a user's head on a transformers backbone does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        return SequenceClassifierOutput(logits=self.layer(torch.relu(x)))


class FeaturesByLayer(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> OrderedDict:
        return OrderedDict([("layer.1", torch.relu(x)), ("class", x.sum(1))])


def test_an_ordered_dict_comes_back_as_the_models_own_type(generator: torch.Generator) -> None:
    """torch.fx makes every dict it captures a plain one: torchvision's segmentation models return
    an ``OrderedDict``, a transformers model captured by torch.fx (transformers 4.x) its
    ``ModelOutput``, whose ``.logits`` and ``[0]`` a plain dict does not have (before: a dict came
    back from both). Values as the model's; relevance passes the container: LRP-0 is gradient x
    input."""
    segmentation = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3).double().eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        expected, explained = segmentation(x), fxlrp.convert(segmentation)(x)
    assert type(explained) is type(expected) is OrderedDict and list(explained) == list(expected)
    # its BatchNorm folded: the same function rounded otherwise, in float64 (as above)
    assert relative_error(explained["out"], expected["out"]) < 1e-12
    by_layer = fxlrp.convert(FeaturesByLayer())(x)  # keys a call cannot take by name
    assert type(by_layer) is OrderedDict and list(by_layer) == ["layer.1", "class"]

    model = ScoresAsModelOutput().double()
    x = torch.randn(2, 6, dtype=torch.float64, generator=generator)
    explain = fxlrp.convert(model, Epsilon(0.0))
    output = explain(x)
    assert type(output) is type(model(x)) and torch.equal(output.logits, model(x).logits)
    assert torch.equal(output[0], output.logits)
    relevance = fxlrp.attribute(explain, x, target=1, output=lambda output: output.logits)
    leaf = x.clone().requires_grad_()
    model(leaf).logits[:, 1].sum().backward()
    assert relative_error(relevance, leaf.grad * x) < 1e-14
