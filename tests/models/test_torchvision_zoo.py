"""Every classification model of torchvision, converted with strict=True and explained.

The sweep (``-m zoo`` selects it, CI runs it with everything else): for each of the models of
``torchvision.models.list_models(module=torchvision.models)``, at the smallest input it allows
(``tests/support/zoo.py``): the explainer's outputs are the model's (bit for bit in float32, or
else both in float64 within 1e-9 relative: folding BatchNorm and other kernels for the same sums
round differently, in float32 by an amount no bound holds for on every CPU), the float32 input
relevance is finite and not all zero, and the report accounts for 100% of the nodes by a rule or a
declared relevance-neutral operation. On the models built from piecewise-linear pieces only, LRP-0 also
equals gradient x input in float64.

Conservation: with biases, BatchNorm shifts, class token and position embeddings zeroed, LRP-0 on
layers, the z-rule on sums, the identity rule on normalisations, gates and smooth activations,
and CP-LRP on attention pass the whole output relevance to the input.
"""

from __future__ import annotations

import pytest
import torch
from support.references import explained_relevance, onehot_relevance
from support.zoo import (
    CONSERVING,
    INPUT_SIZE,
    LARGE,
    NAMES,
    PIECEWISE_LINEAR,
    bias_free,
    build,
    check,
    check_in_subprocess,
    liven,
)
from torch import Tensor, nn
from torchvision.models import VisionTransformer
from torchvision.models.convnext import CNBlockConfig, ConvNeXt

import fxlrp


def test_the_zoo_is_complete() -> None:
    assert len(NAMES) == 80
    assert set(INPUT_SIZE) == set(NAMES)


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model(name: str) -> None:
    """``support.zoo.check`` without the conservation reference (``test_bias_free_models_conserve_relevance``
    and the sweep have it): one model in memory at a time, and a model whose float64 copy takes
    more than 2 GB (``LARGE``: regnet_y_128gf, vit_h_14, vit_l_16, vit_l_32) in a process of its
    own, so that the slow lane's peak memory is one model's."""
    record = check_in_subprocess(name, conservation=False) if name in LARGE else check(name, conservation=False)
    assert "error" not in record, record
    assert record["converts"] and record["coverage"] == 1.0, record
    assert record["outputs_equal"] and record["relevance_ok"], record
    assert (name in PIECEWISE_LINEAR) == ("reference" in record), record
    assert record.get("reference_ok", True), record


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
