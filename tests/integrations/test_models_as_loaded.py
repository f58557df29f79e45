"""Language models as their users load them: gradient checkpointing enabled, and the image's
relevance of a vision-language model drawn over the image.

The models are test_transformers.py's tiny random-weight ones in float64, compared with the
relevance of the same model run without the setting (checkpointing), or with the relevance array
the picture shows (the picture).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from support.references import relative_error

import fxlrp
from fxlrp.rules.composites import AttnLRP
from fxlrp.viz import image
from integrations.test_transformers import CASES, _model


def test_gradient_checkpointing_gives_the_relevance_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with ``gradient_checkpointing_enable()`` in training mode, as it is fine-tuned, is
    explained as the same model without checkpointing in evaluation mode (float64, 1e-12
    relative): explanations run the layers in evaluation mode, where transformers does not
    checkpoint, and a checkpoint a model's own code runs is run as the function it wraps. The model
    keeps its mode and its layers' checkpointing."""
    case = CASES["LlamaForCausalLM"]
    for module_type, forward in case.float64_forwards():  # (RMSNorm without its float32 upcast)
        monkeypatch.setattr(module_type, "forward", forward)
    model, inputs = _model(case)
    expected = fxlrp.attribute(fxlrp.convert(model, AttnLRP(0.0)), inputs, target=1, output=case.pick)[0]
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable()
    checkpointed.train()
    explain = fxlrp.convert(checkpointed, AttnLRP(0.0))
    for _ in range(2):  # (the second call of the signature replays the recorded run)
        relevance = fxlrp.attribute(explain, inputs, target=1, output=case.pick)[0]
        assert relative_error(relevance, expected) <= 1e-12
    layers = checkpointed.model.layers
    assert checkpointed.training and all(layer.training and layer.gradient_checkpointing for layer in layers)


def test_a_vision_language_models_image_relevance_is_drawn_over_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLaVA's pixel relevance (next token after text and an image) as a heatmap and an overlay of
    the image: the heatmap's colours are the channel-summed relevance scaled by its largest
    magnitude (within a bin of the colour map's table and the 8-bit rounding of the colours), and
    the overlay shows the colour of its sign where relevance is largest."""
    case = CASES["LlavaForConditionalGeneration"]
    for module_type, forward in case.float64_forwards():  # (RMSNorm without its float32 upcast)
        monkeypatch.setattr(module_type, "forward", forward)
    model, (ids, pixels) = _model(case)
    _, relevance = fxlrp.attribute(fxlrp.convert(model, AttnLRP(0.0)), (ids, pixels), target=1, output=case.pick)
    assert relevance.shape == pixels.shape
    summed = relevance.sum(1)[0].numpy()
    shown = image.signed_values_from_bwr(image.heatmap(relevance)[0])
    # (the colour map's table has 256 entries over [-1, 1], a value takes its bin's colour, and colours are 8-bit)
    assert np.abs(shown - summed / np.abs(summed).max()).max() <= 2 / 256 + 0.5 / 255
    picture = image.overlay(pixels, relevance)[0]
    strongest = np.unravel_index(np.abs(summed).argmax(), summed.shape)
    # where relevance is largest, the colour; its sign: red (positive) or blue (negative)
    red, blue = picture[strongest][0], picture[strongest][2]
    assert (red > blue) == (summed[strongest] > 0) and abs(float(red) - float(blue)) > 0.5 * 255 * 0.7
    assert picture.shape == (*pixels.shape[-2:], 3)
