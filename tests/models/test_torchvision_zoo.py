"""Every classification model of torchvision, converted with strict=True and explained.

The sweep (``-m zoo`` selects it, CI runs it with everything else): for each of the models of
``torchvision.models.list_models(module=torchvision.models)``, at the smallest input it allows
(``tests/support/zoo.py``), float32: the explainer's outputs are the model's, the input relevance is finite
and not all zero, and the report accounts for 100% of the nodes by a rule or a declared
relevance-neutral operation. On the models built from piecewise-linear pieces only, LRP-0 also
equals gradient x input in float64.

Conservation: with biases, BatchNorm shifts, class token and position embeddings zeroed, LRP-0 on
layers, the z-rule on sums, the identity rule on normalisations, gates and smooth activations,
and CP-LRP on attention pass the whole output relevance to the input.
"""

from __future__ import annotations

import copy

import pytest
import torch
from support.references import explained_relevance, gradient_times_input, onehot_relevance, relative_error
from support.zoo import CONSERVING, INPUT_SIZE, NAMES, PIECEWISE_LINEAR, bias_free, build, image, liven
from torch import Tensor, nn
from torchvision.models import VisionTransformer
from torchvision.models.convnext import CNBlockConfig, ConvNeXt

import fxlrp
from fxlrp.explain.targets import output_relevance

GRADIENT_TOLERANCE = 1e-9


def test_the_zoo_is_complete() -> None:
    assert len(NAMES) == 80
    assert set(INPUT_SIZE) == set(NAMES)


def check_explains(model: nn.Module, x: Tensor) -> fxlrp.Explainer:
    explain = fxlrp.convert(model, strict=True)
    report = explain.report()
    assert report.coverage == 1.0, str(report)
    assert f"coverage {1:.2%}" in str(report)
    with torch.no_grad():
        expected = model(x)
        exact = copy.deepcopy(model).double()(x.double())
    leaf = x.clone().requires_grad_()
    output = explain(leaf)
    # Folding BatchNorm into the convolutions (and other kernels for the same sums) rounds the
    # float32 sums differently: the outputs stay within twice the model's own float32 rounding,
    # measured against the model in float64 (0.8x to 1.4x over the zoo).
    assert relative_error(output.detach().double(), exact) <= 2 * relative_error(expected.double(), exact)
    output.backward(output_relevance(output, None))
    assert torch.isfinite(leaf.grad).all()
    assert (leaf.grad != 0).any()
    return explain


def check_lrp0_is_gradient_times_input(model: nn.Module, x: Tensor) -> None:
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0), strict=True)
    [relevance] = explained_relevance(explain, [x], onehot_relevance)
    [reference] = gradient_times_input(model, [x], lambda output: output, onehot_relevance)
    assert relative_error(relevance, reference) < GRADIENT_TOLERANCE


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model(name: str) -> None:
    model = build(name)
    check_explains(model, image(name))
    if name in PIECEWISE_LINEAR:
        check_lrp0_is_gradient_times_input(model.double(), image(name, torch.float64))


def conserved(model: nn.Module, x: Tensor) -> tuple[float, float]:
    explain = fxlrp.convert(model, CONSERVING, strict=True)
    [relevance] = explained_relevance(explain, [x], onehot_relevance)
    with torch.no_grad():
        total = onehot_relevance(model(x)).sum().item()
    return relevance.sum().item(), total


def small_convnext() -> nn.Module:
    torch.manual_seed(0)
    settings = [CNBlockConfig(8, 16, 2), CNBlockConfig(16, None, 1)]
    return ConvNeXt(settings, num_classes=5, layer_scale=0.5)


def small_vit() -> nn.Module:
    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=5)
    return liven(model, torch.Generator().manual_seed(0))  # the head is initialised to zero


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, size",
    [(lambda: build("efficientnet_b0"), 16), (lambda: build("mobilenet_v3_small"), 16), (small_convnext, 32),
     (small_vit, 32), (lambda: build("swin_t"), 64)],
    ids=["efficientnet_b0", "mobilenet_v3_small", "convnext", "vit", "swin_t"],
)
def test_bias_free_models_conserve_relevance(make, size: int) -> None:
    model = bias_free(make()).double().eval()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    input_total, output_total = conserved(model, x)
    assert abs(input_total - output_total) < 1e-9 * abs(output_total)
    assert output_total != 0
