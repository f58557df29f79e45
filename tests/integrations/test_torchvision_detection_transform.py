"""A detector's own normalisation, resizing and batching (``GeneralizedRCNNTransform``).

It is explained as one affine map ``y = J x + y_0`` of the raw images ``x``: by the z-rule, with
which LRP-0 of the detector stays gradient x input; under a first-layer rule that does not share
by its input's values (flat, w^2, z^B) without its constant part, ``R_x = x J^T (R_y / (J x))``.
References: the model's own gradient, and that formula with ``J`` from torchvision's transform
run by autograd (``J x = T(x) - T(0)``) and ``R_y`` the relevance the backbone's input received.
A tiny Faster R-CNN (two convolutions) in float64, images in ``[0, 1]``.
"""

from __future__ import annotations

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon, Flat, WSquare, ZBox
from fxlrp.rules.composites import Composite, EpsilonGammaBox, EpsilonPlusFlat

torchvision = pytest.importorskip("torchvision")
from support.detectors import pictures, tiny_detector  # noqa: E402

from fxlrp.integrations.torchvision import explain_detection  # noqa: E402


def test_lrp0_through_the_detectors_transform_is_gradient_times_input() -> None:
    model, x = tiny_detector(), pictures()
    explained = explain_detection(fxlrp.convert(model, Epsilon(0.0)), x, 2)
    logits: list[Tensor] = []
    handle = model.roi_heads.box_predictor.register_forward_hook(lambda module, args, output: logits.append(output[0]))
    leaf = x.clone().requires_grad_()
    try:
        model(leaf)
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(logits[0][explained.position], leaf)
    assert relative_error(explained.relevance, gradient * x) < 1e-12 and explained.relevance.abs().sum() > 0


FIRST_LAYER_RULES = {
    "EpsilonPlusFlat": (EpsilonPlusFlat, Flat),
    "EpsilonGammaBox": (lambda: EpsilonGammaBox(low=-2.2, high=2.7), ZBox),  # (bounds of the normalised image)
    "w^2": (lambda: Composite(first_layer=WSquare()), WSquare),
}


@pytest.mark.parametrize("composite", list(FIRST_LAYER_RULES))
def test_a_first_layer_rule_reads_the_normalised_image_and_its_relevance_moves_to_the_raw_pixels(
        composite: str) -> None:
    make, first_rule = FIRST_LAYER_RULES[composite]
    model, x = tiny_detector(), pictures()
    explain = fxlrp.convert(model, make())
    at_backbone: list[Tensor] = []

    def follow(module: nn.Module, args: tuple) -> None:
        if args[0].requires_grad:
            args[0].register_hook(at_backbone.append)

    handle = model.backbone.register_forward_pre_hook(follow)
    try:
        explained = explain_detection(explain, x, 2)
        rows = {row.name: row.rule for row in explain.report().all_rows}  # (read while the hook is there)
    finally:
        handle.remove()
    [relevance_y] = at_backbone  # what the backbone's first layer gave its input, the normalised batch

    # R_x = x J^T (R_y / (J x)), J x = T(x) - T(0) with torchvision's own transform
    leaf = x.clone().requires_grad_()
    transformed = model.transform(leaf)[0].tensors
    with torch.no_grad():
        linear_part = transformed - model.transform(torch.zeros_like(x))[0].tensors
    quotient = torch.where(linear_part != 0, relevance_y / linear_part.where(linear_part != 0, 1.0), 0.0)
    (pulled,) = torch.autograd.grad(transformed, leaf, quotient)
    assert relative_error(explained.relevance, x * pulled) < 1e-12
    # Each raw pixel's share of a resized value is between 0 and 1 (positive bilinear weights and
    # pixels): relevance is conserved, except the padding's (J x = 0), and its absolute values'
    # sum cannot grow - under the z-rule of each step it grew with 1 / y near y = 0.
    kept = relevance_y[linear_part != 0]
    assert abs(explained.relevance.sum() - kept.sum()) <= 1e-12 * kept.abs().sum()
    assert explained.relevance.abs().sum() <= kept.abs().sum() * (1 + 1e-12)
    assert rows["model › backbone.0"].startswith(first_rule.__name__ + "(")
    assert rows["model › backbone.2"].startswith(("ZPlus(", "Gamma(", "Epsilon("))
    assert rows["model › transform"] == "Epsilon(epsilon=0.0, zero_params=['bias'])"


def test_the_transform_keeps_its_z_rule_under_first_layer_rules_that_share_by_values() -> None:
    explain = fxlrp.convert(tiny_detector(), Composite(first_layer=Epsilon(0.0)))
    explain_detection(explain, pictures(), 0)
    rows = {row.operation: row.rule for row in explain.report().all_rows}
    assert rows["image_transform"] == "Epsilon(epsilon=0.0, zero_params=[])"


