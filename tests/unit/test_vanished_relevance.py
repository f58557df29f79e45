"""Issue 59, point 3: relevance that vanished on its way to the inputs is warned of.

``fxlrp.attribute`` warns (:class:`fxlrp.VanishedRelevanceWarning`, once per call, in the
user's terms) when the relevance reaching the inputs sums, in absolute value, to less than 1e-6
of the explained output's: the threshold is checked on both sides with a one-weight layer whose
bias makes up a known share of its output (LRP-0 gives the input ``w x`` of ``w x + b``), the
message in full on a layer whose epsilon dwarfs its outputs. Silent on ordinary models
(ResNet-18 and a small ViT with random weights, under the default and zennit's composites), and
with ``check_finite=False``, which keeps the call free of the check's synchronisation.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn

import fxlrp
from fxlrp.rules import Epsilon


def _vanishing_warnings(function) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function()
    return [str(each.message) for each in caught if issubclass(each.category, fxlrp.VanishedRelevanceWarning)]


def _one_weight(bias: float) -> nn.Module:
    layer = nn.Linear(1, 1).double()
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(bias)
    return layer


@pytest.mark.parametrize(("bias", "warned"), [(1e7 - 1.0, True), (1e5 - 1.0, False)])
def test_the_threshold_is_a_millionth_of_the_output(bias: float, warned: bool) -> None:
    # z = w x + b = 1 + b, and LRP-0 gives the input w x = 1: a share of 1e-7 warns, 1e-5 does not.
    explain = fxlrp.convert(_one_weight(bias), Epsilon(0.0))
    x = torch.ones(1, 1, dtype=torch.float64)
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0))
    assert len(found) == int(warned)


def test_the_warning_says_how_much_reached_the_inputs_and_what_to_do() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(1e9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relevance = fxlrp.attribute(explain, x, target=0)
    [warning] = caught
    assert warning.category is fxlrp.VanishedRelevanceWarning and issubclass(warning.category, UserWarning)
    assert warning.filename == __file__  # the user's call, not fxlrp's inside
    reached, output = relevance.abs().sum().item(), model(x)[:, 0].abs().sum().item()
    assert str(warning.message) == (
        f"fxlrp: the relevance reaching the inputs is {reached:.2g} in all, a negligible share (under 1e-06) of the "
        f"explained output's {output:.2g} (absolute values summed): the rules absorbed it on the way - biases that "
        "make up nearly all of the output (weights left at their random initialisation), an epsilon larger than "
        "the layers' outputs, or a rule that finds no contribution to share it by (z+ where none is positive) - "
        "so a heatmap of it shows rounding noise, not the model's reasons. Load the trained "
        "weights or use a smaller epsilon; to find the layer that absorbs it, compare the relevance sums of nodes "
        "of explain.report() from fxlrp.attribute_nodes(explain, inputs, nodes=[...], target=...)"
    )
    # once per call, however many passes explain its targets
    assert len(_vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=[0, 1, 2], repeat=2))) == 1
    assert _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0, check_finite=False)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fxlrp.FxlrpWarning)  # users can filter fxlrp's warnings
        fxlrp.attribute(explain, x, target=0)


def _small_vit() -> nn.Module:
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64)


ZENNIT = [fxlrp.composites.EpsilonPlusFlat(), fxlrp.composites.EpsilonAlpha2Beta1()]


@pytest.mark.parametrize(("make", "composite"), [
    (_small_vit, None), *[(_small_vit, composite) for composite in ZENNIT],
    (torchvision.models.resnet18, None),
    *[pytest.param(torchvision.models.resnet18, composite, marks=pytest.mark.slow) for composite in ZENNIT],
])
def test_ordinary_models_are_not_warned_of(make, composite) -> None:
    torch.manual_seed(0)
    explain = fxlrp.convert(make().eval(), composite)
    x = torch.randn(2, 3, 32, 32)
    assert _vanishing_warnings(lambda: fxlrp.attribute(explain, x)) == []


@pytest.mark.slow  # (a detector at 320 pixels: 20 s on two cores)
def test_a_detector_left_at_random_weights_is_warned_of() -> None:
    # The case: the features of a random MobileNet are ~1e-8, its logits nearly all bias.
    from fxlrp.integrations.torchvision import explain_detection

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
    explain = fxlrp.convert(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = explain_detection(explain, torch.rand(1, 3, 320, 320), 0)
    [message] = [str(each.message) for each in caught if each.category is fxlrp.VanishedRelevanceWarning]
    reached, output = explained.relevance.abs().sum().item(), abs(explained.explained)
    assert reached < 1e-6 * output
    assert message.startswith(f"fxlrp: the relevance reaching the inputs is {reached:.2g} in all, a negligible share "
                              f"(under 1e-06) of the explained output's {output:.2g} (absolute values summed)")
