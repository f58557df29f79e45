"""Language models as their users load them: gradient checkpointing enabled, and the image's
relevance of a vision-language model drawn over the image.

The models are test_transformers.py's tiny random-weight ones in float64, compared with the
relevance of the same model run without the setting (checkpointing), or with the relevance array
the picture shows (the picture).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from support.references import relative_error
from torch import Tensor

import fxlrp
from fxlrp.relevance.form import gradient_form
from fxlrp.rules.composites import AttnLRP
from fxlrp.viz import image
from integrations.test_transformers import CASES, MORE_CASES, Float32PartsInFloat64, _model


def _saved_for_backward(run: Callable[[], Tensor]) -> tuple[Tensor, int]:
    """What ``run`` returns, and the bytes of the distinct storages autograd saved for backward
    during it outside checkpointed regions (torch's checkpoint keeps what it saves inside them
    to itself and recomputes it in backward)."""
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = run()
    return result, sum(saved.values())


def _held_by_relevance_functions(output: Tensor) -> int:
    """The bytes of the distinct storages that the relevance Functions of ``output``'s graph hold
    themselves for backward (a stabilised layer's kept output), which saved-tensor hooks do not see."""
    held: dict[int, int] = {}
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kept = getattr(node, "kept", None)
        if kept is not None and kept.values is not None:
            storage = kept.values.untyped_storage()
            held[storage.data_ptr()] = storage.nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    return sum(held.values())


def _gradient_times_input(model: torch.nn.Module, ids: Tensor, pick: Callable[[Any], Tensor]) -> Tensor:
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    pick(model(inputs_embeds=embeddings))[:, 1].sum().backward()
    return (embeddings * embeddings.grad).sum(-1)


@pytest.mark.parametrize(("composite", "training"), [(AttnLRP(0.0), True), (AttnLRP(), False)],
                         ids=["epsilon-0-training", "stabilised-evaluation"])
def test_gradient_checkpointing_is_honoured(composite: AttnLRP, training: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with ``gradient_checkpointing_enable()``, in training mode as it is fine-tuned or in
    evaluation mode, is explained with its layers checkpointed: the relevance is that of the same
    model without checkpointing in evaluation mode (float64, 1e-12 relative; the layers are
    recomputed in backward under the same rules, the second call of the signature included, which
    runs eagerly rather than from a recording); autograd keeps less for backward outside the
    checkpointed layers than without checkpointing, and no more than the checkpointed gradient x
    input keeps in training mode (1.1x; without checkpointing 11x), with the stabiliser too (each
    layer's output, kept for its denominator, goes through the checkpoint's saved-tensor hooks).
    The model keeps its mode and its layers' checkpointing."""
    case = CASES["LlamaForCausalLM"]
    for module_type, forward in case.float64_forwards():  # (RMSNorm without its float32 upcast)
        monkeypatch.setattr(module_type, "forward", forward)
    model, inputs = _model(case)
    expected, kept_without = _saved_for_backward(
        lambda: fxlrp.attribute(fxlrp.convert(model, composite), inputs, target=1, output=case.pick)[0])
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable()
    checkpointed.train(training)
    explain = fxlrp.convert(checkpointed, composite)
    for _ in range(2):  # (the second call would be recorded: it runs eagerly, as the first)
        relevance, kept = _saved_for_backward(
            lambda: fxlrp.attribute(explain, inputs, target=1, output=case.pick)[0])
        assert relative_error(relevance, expected) <= 1e-12
        assert kept < kept_without
    layers = checkpointed.model.layers
    assert checkpointed.training is training
    assert all(layer.training is training and layer.gradient_checkpointing for layer in layers)

    def forward() -> Tensor:  # (in the gradient form, as fxlrp.attribute runs it)
        with torch.enable_grad(), gradient_form():
            return case.pick(explain(inputs[0].clone()))

    output, kept_in_forward = _saved_for_backward(forward)
    assert explain.gradient_form and kept_in_forward <= kept
    # what its relevance Functions hold themselves, beyond autograd's saved tensors: nothing, where
    # saved-tensor hooks are active (each keeps its output through them)
    held = _held_by_relevance_functions(output)
    checkpointed.train()  # (transformers checkpoints in training mode only)
    _, gradient_kept = _saved_for_backward(lambda: _gradient_times_input(checkpointed, inputs[0], case.pick))
    assert kept_in_forward + held <= 1.1 * gradient_kept < kept_without


@pytest.mark.parametrize("composite", [AttnLRP(0.0), pytest.param(AttnLRP(), marks=pytest.mark.slow)],
                         ids=["epsilon-0", "stabilised"])
def test_mixtrals_eager_experts_are_explained_as_its_grouped_experts(composite: AttnLRP) -> None:
    """Mixtral loaded with ``experts_implementation="eager"`` (the experts' own loop, each chosen
    expert's output times its router weight, the top-k of a softmax divided by their sum) gives
    the relevance of the default grouped experts, whose router weights are a gate held constant
    (float64 with the router's float32 casts in float64, 1e-10 relative): the renormalised weights
    stay a gate, so no relevance goes to the router through the product."""
    case = MORE_CASES["MixtralForCausalLM"]
    with Float32PartsInFloat64():
        model, inputs = _model(case)
        expected = fxlrp.attribute(fxlrp.convert(model, composite), inputs, target=1, output=case.pick)[0]
        eager = copy.deepcopy(model)
        for module in eager.modules():  # (the experts read the setting from their config)
            if isinstance(getattr(module, "config", None), transformers.PretrainedConfig):
                module.config._experts_implementation = "eager"
        relevance = fxlrp.attribute(fxlrp.convert(eager, composite), inputs, target=1, output=case.pick)[0]
    assert relative_error(relevance, expected) <= 1e-10


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
