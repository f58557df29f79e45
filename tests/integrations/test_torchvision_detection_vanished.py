"""Issue 59, point 3, for detectors: ``explain_detection`` warns when the relevance of a
detection's logit vanished on its way to the images, and names the layer that absorbed most.

A detector runs eagerly as a whole, so the layer is found by one more run of the explanation
that follows its modules' calls (only once the warning is given). The tiny Faster R-CNN of
``support.detectors`` in float64 under LRP-0, its box head's second layer (``fc7``) given weights
of 1e-9 of theirs, so that its output is practically its bias: it passes on a share of ~1e-9 of
the relevance reaching it, and no layer before or after it absorbs much (the detector's own
transform first, the box predictor last: naming either is wrong). References: the warning's
totals at ``fc7``'s output and input from the model's own gradient (LRP-0 is gradient x
activation at every activation of a piecewise-linear path, biases included), the message in full.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from support.detectors import pictures, tiny_detector
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon

pytest.importorskip("torchvision")
from fxlrp.integrations.torchvision import explain_detection  # noqa: E402


def _warning_text(reached: float, output: float, found: str) -> str:
    return (
        f"fxlrp: the relevance reaching the inputs is {reached:.2g} in all, a negligible share (under 1e-06) of "
        f"the explained output's {output:.2g} (absolute values summed): the rules absorbed it on the way - biases "
        "that make up nearly all of the output (weights left at their random initialisation), an epsilon larger "
        "than the layers' outputs, or a rule that finds no contribution to share it by (z+ where none is positive) "
        "- so a heatmap of it shows rounding noise, not the model's reasons. Load the trained weights or use a "
        f"smaller epsilon; {found}"
    )


def _gradient_times_activation(model: nn.Module, x: Tensor, position: tuple[int, ...],
                               layer: nn.Module) -> tuple[float, float]:
    """``sum |dz/da * a|`` at the output and the input of ``layer`` for the class logit ``z`` at
    ``position`` of the box predictor's output, by the model's own autograd."""
    logits: list[Tensor] = []
    seen: list[tuple[Tensor, Tensor]] = []
    handles = [model.roi_heads.box_predictor.register_forward_hook(lambda m, args, output: logits.append(output[0])),
               layer.register_forward_hook(lambda m, args, output: seen.append((output, args[0])))]
    try:
        model(x.clone().requires_grad_())
    finally:
        for handle in handles:
            handle.remove()
    [(output, input)] = seen
    gradients = torch.autograd.grad(logits[0][position], [output, input])
    at_output, at_input = ((gradient * value).abs().sum().item()
                           for gradient, value in zip(gradients, [output, input], strict=True))
    return at_output, at_input


def test_the_detection_warning_names_the_layer_that_absorbed_its_relevance() -> None:
    model, x = tiny_detector(), pictures()
    absorbing = model.roi_heads.box_head.fc7
    with torch.no_grad():
        absorbing.weight.mul_(1e-9)
    explain = fxlrp.convert(model, Epsilon(0.0))
    calls = []
    handle = absorbing.register_forward_hook(lambda *_: calls.append(1))  # (the user's module, called eagerly)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            explained = explain_detection(explain, x, 0)
        rows = [row.name for row in explain.report().all_rows]  # (read while the hook is there: the model as explained)
    finally:
        handle.remove()
    [warning] = caught
    assert warning.category is fxlrp.VanishedRelevanceWarning and warning.filename == __file__
    at_output, at_input = _gradient_times_activation(model, x, explained.position, absorbing)
    assert at_input < 1e-6 * at_output  # (fc7 passes on practically nothing: the layer the test knows absorbs)
    named = ("the layer that absorbed most (the largest fall of the absolute relevance from its output to its inputs) "
             "is roi_heads.box_head.fc7 (Linear, row 'model › roi_heads.box_head.fc7' of explain.report()): "
             f"{at_output:.2g} reached its output, {at_input:.2g} its inputs")
    assert str(warning.message) == _warning_text(explained.relevance.abs().sum().item(), abs(explained.explained),
                                                 named)
    assert len(calls) == 2  # the explanation, and the run that found the layer
    assert "model › roi_heads.box_head.fc7" in rows  # the row the warning names


def test_a_detection_whose_relevance_reaches_the_images_pays_for_no_search() -> None:
    model, x = tiny_detector(), pictures()
    explain = fxlrp.convert(model, Epsilon(0.0))
    calls = []
    handle = model.roi_heads.box_head.fc7.register_forward_hook(lambda *_: calls.append(1))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", fxlrp.VanishedRelevanceWarning)
            explained = explain_detection(explain, x, 0)
    finally:
        handle.remove()
    assert explained.relevance.abs().sum() >= 1e-6 * abs(explained.explained)
    assert len(calls) == 1  # one run: no run to find a layer
