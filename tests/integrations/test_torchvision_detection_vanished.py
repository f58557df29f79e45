"""Issue 59, point 3, for detectors: ``explain_detection``, ``explain_mask`` and
``explain_keypoint`` warn when the relevance of what they explain vanished on its way to the
images, and name the layer that absorbed most.

A detector runs eagerly as a whole, so the layer is found by one more run of the explanation
that follows its modules' calls (only once the warning is given: a run without the warning makes
one call of each module). The tiny Faster, Mask and Keypoint R-CNN of ``support.detectors`` in
float64 under LRP-0, one layer in the middle made to absorb: weights of 1e-9 of theirs, so that
its output is practically its bias and it passes on a share of ~1e-9 of the relevance reaching
it, while no layer before or after it absorbs much (the detector's own transform first, the
heads' last layers last: naming either is wrong). References: the warning's totals at that
layer's output and input from the model's own gradient (LRP-0 is gradient x activation at every
activation of a piecewise-linear path, biases included; for a mask, of the linear function of
the mask logits that the paste and the sigmoid's identity rule give), the message in full.
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
from fxlrp.integrations.torchvision import explain_detection, explain_keypoint, explain_mask  # noqa: E402


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


def _made_to_absorb(layer: nn.Module) -> None:
    """A convolution of a head whose output is practically its bias (0.1): it passes on ~1e-9 of
    the relevance reaching it."""
    with torch.no_grad():
        layer.weight.mul_(1e-9)
        layer.bias.fill_(0.1)


def _activation_totals(model: nn.Module, x: Tensor, layer: nn.Module, value_of) -> tuple[float, float]:
    """``sum |dF/da * a|`` at the output and the input of ``layer``, with ``F = value_of(detections,
    mask logits)`` a linear function of the activations below the sigmoid (LRP-0 is gradient x
    activation for it), by the model's own autograd."""
    seen: list[tuple[Tensor, Tensor]] = []
    logits: list[Tensor] = []
    handles = [layer.register_forward_hook(lambda m, args, output: seen.append((output, args[0])))]
    if hasattr(model.roi_heads, "mask_predictor") and model.roi_heads.mask_predictor is not None:
        handles.append(model.roi_heads.mask_predictor.register_forward_hook(
            lambda m, args, output: logits.append(output)))
    try:
        detections = model(x.clone().requires_grad_())[0]
    finally:
        for handle in handles:
            handle.remove()
    [(output, input)] = seen
    gradients = torch.autograd.grad(value_of(detections, logits[0] if logits else None), [output, input])
    at_output, at_input = ((gradient * value).abs().sum().item()
                           for gradient, value in zip(gradients, [output, input], strict=True))
    return at_output, at_input


def _mask_functional(index: int, model: nn.Module, x: Tensor):
    """The mask's relevance below its sigmoid, ``R_L = p A^T 1_region`` (the paste ``A`` linear,
    the sigmoid's identity rule), as the linear function ``sum_L L R_L / L`` of the logits."""
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    def value_of(detections: dict[str, Tensor], logits: Tensor) -> Tensor:
        label = int(detections["labels"][index])
        probability = logits[index, label].detach().sigmoid().requires_grad_()
        pasted = paste_masks_in_image(probability[None, None], detections["boxes"][index:index + 1].detach(),
                                      x.shape[-2:])[0]
        (adjoint,) = torch.autograd.grad((pasted * (pasted > 0.0)).sum(), probability)
        return (logits[index, label] * (probability.detach() * adjoint / logits[index, label].detach())).sum()

    return value_of


@pytest.mark.parametrize("kind", ["mask", "keypoint"])
def test_a_mask_or_keypoint_whose_relevance_vanished_is_warned_of_with_the_layer(kind: str) -> None:
    model, x = tiny_detector(kind), pictures()
    head = model.roi_heads.mask_head if kind == "mask" else model.roi_heads.keypoint_head
    absorbing, path = ((head[1][0], "roi_heads.mask_head.1.0") if kind == "mask" else
                       (head[2], "roi_heads.keypoint_head.2"))
    _made_to_absorb(absorbing)
    explain = fxlrp.convert(model, Epsilon(0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = (explain_mask(explain, x, 0, threshold=0.0) if kind == "mask" else
                     explain_keypoint(explain, x, 0, 3))
        rows = [row.name for row in explain.report().all_rows]
    [warning] = caught
    assert warning.category is fxlrp.VanishedRelevanceWarning and warning.filename == __file__
    value_of = (_mask_functional(0, model, x) if kind == "mask" else
                lambda detections, _: detections["keypoints_scores"][0, 3])
    at_output, at_input = _activation_totals(model, x, absorbing, value_of)
    assert at_input < 1e-6 * at_output
    named = ("the layer that absorbed most (the largest fall of the absolute relevance from its output to its inputs) "
             f"is {path} (Conv2d, row 'model › {path}' of explain.report()): {at_output:.2g} reached its output, "
             f"{at_input:.2g} its inputs")
    assert str(warning.message) == _warning_text(explained.relevance.abs().sum().item(), abs(explained.explained),
                                                 named)
    assert f"model › {path}" in rows
