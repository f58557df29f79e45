"""Parity with zennit-crp 0.6.0 (the reference implementation of Concept Relevance Propagation,
Achtibat et al., Nature Machine Intelligence 2023): :func:`fxlrp.concepts.conditional_relevance`
and :func:`fxlrp.concepts.attribution_graph` against ``crp.attribution.CondAttribution`` and
``AttributionGraph`` for the same composite (EpsilonPlusFlat) and conditions, on torchvision's
VGG-16 with BatchNorm and ResNet-18 (random weights and BatchNorm statistics), in float64: the two
compute the same relevance by other operations (BatchNorm merged into the convolution or folded,
a ``Sum`` module or a graph-level add, another capture path), which round differently; in float32
a concept that carries little relevance moves by more than 1e-5 (:func:`top_channels`) and no
bound holds on every CPU, in float64 the same amplification of rounding stays far below 1e-10.

zennit-crp explains with zennit's canonizers (``VGGCanonizer``, ``ResNetCanonizer``: BatchNorm
merged into the convolution before it, the residual ``+`` a ``Sum`` module); fxlrp with its own
BatchNorm folding and graph-level add. As in ``test_zennit_parity.py``, zennit's merge leaves each
BatchNorm as ``x / sqrt(1 + eps)`` instead of the identity; :class:`ExactMerge`, a canonizer
applied after zennit's, sets ``eps = 0`` on the merged BatchNorms while the composite is active,
so that zennit-crp's model computes the original function (checked: its prediction equals the
model's).

zennit-crp 0.6.0 requires zennit <= 0.4.6 in its metadata but runs on zennit 0.5.1, which the
tests use everywhere: it is installed without its dependencies (``pip install --no-deps
zennit-crp==0.6.0``, the Makefile).

Heatmaps are compared summed over colour channels, as zennit-crp returns them; relevances of
recorded layers and concept relevances as they are. One difference is zennit-crp's and is tested
as such: with ``exclude_parallel=True`` its relevance of a conditioned layer is counted twice
(:func:`test_zennit_crp_counts_a_conditioned_layer_twice_with_exclude_parallel`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torchvision
from crp.attribution import AttributionGraph, CondAttribution
from crp.concepts import ChannelConcept as CrpChannelConcept
from crp.graph import trace_model_graph
from support.references import randomise_batch_norm_statistics, relative_error
from torch import Tensor, nn
from zennit.canonizers import Canonizer
from zennit.composites import EpsilonPlusFlat as ZennitEpsilonPlusFlat
from zennit.torchvision import ResNetCanonizer, VGGCanonizer

import fxlrp
from fxlrp.concepts import attribution_graph, conditional_relevance

BOUNDS = {torch.float64: 1e-10}
F64 = torch.float64
SLOW = pytest.mark.slow


def case(name: str, dtype: torch.dtype, slow: bool = False) -> Any:
    return pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=[SLOW] if slow else [])


# The fast lane compares each model and each feature once; ``make test-all`` adds the repeated
# comparisons.
CASES = [case("vgg16_bn", F64), case("resnet18", F64)]
SIZE = 32


class ExactMerge(Canonizer):
    """``eps = 0`` on every BatchNorm while zennit's merge has reduced it to ``x / sqrt(1 + eps)``."""

    def apply(self, root_module: nn.Module) -> list[Canonizer]:
        self.norms = [(module, module.eps) for module in root_module.modules()
                      if isinstance(module, nn.modules.batchnorm._BatchNorm)]
        for module, _ in self.norms:
            module.eps = 0.0
        return [self]

    def register(self) -> None:
        """Nothing to register: :meth:`apply` acts."""

    def remove(self) -> None:
        for module, eps in self.norms:
            module.eps = eps


def vgg16_bn() -> nn.Module:
    """torchvision's VGG-16 with BatchNorm; a narrow classifier keeps memory and time small."""
    model = torchvision.models.vgg16_bn(num_classes=10)
    model.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 64), nn.ReLU(inplace=True), nn.Dropout(),
                                     nn.Linear(64, 10))
    return model


def vgg16() -> nn.Module:
    """VGG-16 without BatchNorm (its ReLUs work in place on the convolutions' outputs)."""
    model = torchvision.models.vgg16(num_classes=10)
    model.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 64), nn.ReLU(inplace=True), nn.Dropout(),
                                     nn.Linear(64, 10))
    return model


MODELS: dict[str, tuple[Callable[[], nn.Module], type[Canonizer]]] = {
    "vgg16_bn": (vgg16_bn, VGGCanonizer),
    "vgg16": (vgg16, VGGCanonizer),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), ResNetCanonizer),
}

# Per model: conditions on one layer, on two layers one above the other, and layers recorded below.
# Concept indices are placeholders (None) filled with the channels of largest relevance.
LAYERS = {
    "vgg16_bn": {"upper": "features.40", "lower": "features.37", "record": ["features.34", "features.37"]},
    "resnet18": {"upper": "layer4.1", "lower": "layer4.0.conv2", "record": ["layer4.0.conv1", "layer3.1"]},
    "vgg16": {"upper": "features.28", "lower": "features.26", "record": ["features.21", "features.24"]},
}


@functools.cache
def model_and_input(name: str, dtype: torch.dtype) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(sum(map(ord, name)))
    build, _ = MODELS[name]
    model = randomise_batch_norm_statistics(build(), torch.Generator().manual_seed(1)).eval().to(dtype)
    return model, torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2)).to(dtype)


def crp_composite(name: str) -> ZennitEpsilonPlusFlat:
    return ZennitEpsilonPlusFlat(canonizers=[MODELS[name][1](), ExactMerge()])


@functools.cache
def explainer(name: str, dtype: torch.dtype, capture: str = "auto") -> fxlrp.Explainer:
    model, _ = model_and_input(name, dtype)
    return fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat(), capture=capture)


def top_channels(name: str, dtype: torch.dtype, layer: str, count: int, condition: dict[str, Any]) -> list[int]:
    """The channels of ``layer`` with the largest absolute relevance under ``condition``.

    Compared relevances are then far from zero and not small differences of large terms: for a
    concept that carries almost no relevance of the explained class, float32 rounding alone moves
    the relevance by more than 1e-5 (measured: zennit-crp's own float32 heatmap 3.3e-4 from its
    float64 heatmap, fxlrp's 5.1e-4, for a VGG-16 channel picked for another class).
    """
    model, x = model_and_input(name, dtype)
    found = conditional_relevance(explainer(name, dtype), x, [condition], record=[layer])
    return torch.argsort(found.concept_relevance(layer)[0, 0].abs(), descending=True)[:count].tolist()


@functools.cache
def conditions_for(name: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    upper, lower = LAYERS[name]["upper"], LAYERS[name]["lower"]
    a, b, c = top_channels(name, dtype, upper, 3, {"y": [1]})
    d, e = top_channels(name, dtype, lower, 2, {upper: [a], "y": [1]})
    (f,) = top_channels(name, dtype, lower, 1, {"y": [7]})
    # zennit-crp wants the layers of a condition from the output down (exclude_parallel)
    return [{upper: [a], "y": [1]}, {upper: [b, c], "y": [1, 4]}, {upper: [a], lower: [d, e], "y": [1]},
            {lower: [f], "y": [7]}]


def crp_attribution(name: str, dtype: torch.dtype, conditions: list[dict[str, Any]], record: list[str],
                    **options: Any) -> Any:
    model, x = model_and_input(name, dtype)
    attribution = CondAttribution(model, no_param_grad=False)
    data = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = attribution(data, conditions, crp_composite(name), record_layer=list(record), **options)
    if "start_layer" not in options:  # (else the prediction is the start layer's activation)
        with torch.no_grad():
            assert relative_error(result.prediction[:1], model(x)) < BOUNDS[dtype], "zennit's canonical model changed"
    model.requires_grad_(True)
    return result


def per_condition_error(actual: Tensor, expected: Tensor) -> float:
    """The largest relative error over conditions (each condition's relevance is nonzero)."""
    assert all(one.abs().max() > 0 for one in expected), "a compared relevance is all zero"
    return max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))


MEASURED: dict[tuple[str, str, str, str], float] = {}


@pytest.mark.parametrize(("name", "dtype"), CASES)
@pytest.mark.parametrize("exclude_parallel", [True, False], ids=["exclude_parallel", "all_paths"])
def test_conditional_relevance_equals_zennit_crp(name: str, dtype: torch.dtype, exclude_parallel: bool) -> None:
    compare_with_zennit_crp(name, dtype, exclude_parallel, "auto")


@pytest.mark.parametrize("dtype", [F64], ids=["float64"])
@pytest.mark.parametrize("exclude_parallel", [True, pytest.param(False, marks=SLOW)],
                         ids=["exclude_parallel", "all_paths"])
def test_model_run_eagerly_equals_zennit_crp(dtype: torch.dtype, exclude_parallel: bool) -> None:
    """The second capture path: VGG-16 run eagerly as a whole (its modules followed as they run,
    its in-place ReLUs writing into the convolutions' outputs) gives zennit-crp's numbers. Without
    BatchNorm: run eagerly, fxlrp explains a BatchNorm by its own rule instead of folding it."""
    compare_with_zennit_crp("vgg16", dtype, exclude_parallel, "eager")


def compare_with_zennit_crp(name: str, dtype: torch.dtype, exclude_parallel: bool, capture: str) -> None:
    model, x = model_and_input(name, dtype)
    conditions = conditions_for(name, dtype)
    upper, lower = LAYERS[name]["upper"], LAYERS[name]["lower"]
    record = [*LAYERS[name]["record"], upper, lower]
    expected = crp_attribution(name, dtype, conditions, record, exclude_parallel=exclude_parallel)
    ours = conditional_relevance(explainer(name, dtype, capture), x, conditions, record=record,
                                 exclude_parallel=exclude_parallel)
    bound = BOUNDS[dtype]
    errors = {"heatmap": per_condition_error(ours.heatmap[:, 0].sum(dim=1), expected.heatmap)}
    conditioned = {upper, lower}
    for layer in record:
        if exclude_parallel and layer in conditioned:
            continue  # zennit-crp counts these twice: the next test
        errors[layer] = relative_error(ours.relevance[layer][:, 0], expected.relevances[layer])
        errors[f"{layer} concepts"] = relative_error(
            ours.concept_relevance(layer, abs_norm=True)[:, 0],
            CrpChannelConcept().attribute(expected.relevances[layer], abs_norm=True))
        errors[f"{layer} activation"] = relative_error(ours.activation[layer], expected.activations[layer][:1])
    MEASURED.update({(name, capture, str(dtype), what): error for what, error in errors.items()})
    assert max(errors.values()) <= bound, errors


@pytest.mark.parametrize(("name", "dtype"), [case("vgg16_bn", F64, slow=True), case("resnet18", F64)])
def test_zennit_crp_counts_a_conditioned_layer_twice_with_exclude_parallel(name: str, dtype: torch.dtype) -> None:
    """zennit-crp's partial backward passes (``exclude_parallel=True``) end at a conditioned layer
    with ``torch.autograd.grad`` and start the next pass there: both add the layer's relevance to
    its retained ``.grad``, so it returns twice the relevance that passed the layer. fxlrp returns
    it once: the relevance that ``exclude_parallel=False`` also gives there."""
    model, x = model_and_input(name, dtype)
    conditions = conditions_for(name, dtype)
    upper, lower = LAYERS[name]["upper"], LAYERS[name]["lower"]
    excluded = crp_attribution(name, dtype, conditions, [upper, lower], exclude_parallel=True)
    ours = conditional_relevance(explainer(name, dtype), x, conditions, record=[upper, lower])
    for layer, rows in ((upper, [0, 1, 2]), (lower, [2, 3])):
        assert relative_error(2 * ours.relevance[layer][rows, 0], excluded.relevances[layer][rows]) <= BOUNDS[dtype]



@pytest.mark.parametrize(("name", "dtype"), [case("vgg16_bn", F64, slow=True), case("resnet18", F64)])
@pytest.mark.parametrize("repeat", [pytest.param(0, marks=SLOW), 3])
def test_many_conditions_equal_zennit_crp_generate(name: str, dtype: torch.dtype, repeat: int) -> None:
    """Seven conditions on one layer: zennit-crp's ``generate`` (three per backward pass, the last
    pass padded) against one forward pass and a backward pass per condition (``repeat=0``) or
    three conditions per pass (``repeat=3``)."""
    model, x = model_and_input(name, dtype)
    upper = LAYERS[name]["upper"]
    record = LAYERS[name]["record"]
    conditions = [{upper: [index], "y": [1]} for index in top_channels(name, dtype, upper, 7, {"y": [1]})]
    attribution = CondAttribution(model, no_param_grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(attribution.generate(x.clone().requires_grad_(), conditions, crp_composite(name),
                                            record_layer=record, batch_size=3, verbose=False))
    model.requires_grad_(True)
    heatmap = torch.cat([batch.heatmap for batch in batches])
    ours = conditional_relevance(explainer(name, dtype), x, conditions, record=record, repeat=repeat)
    assert per_condition_error(ours.heatmap[:, 0].sum(dim=1), heatmap) <= BOUNDS[dtype]
    for layer in record:
        expected = torch.cat([batch.relevances[layer] for batch in batches])
        assert relative_error(ours.relevance[layer][:, 0], expected) <= BOUNDS[dtype], layer


@pytest.mark.parametrize("dtype", [F64], ids=["float64"])
def test_start_layer_equals_zennit_crp(dtype: torch.dtype) -> None:
    """Relevance started at a layer's activation, masked by the condition's channels
    (zennit-crp's ``start_layer``): the concept's own heatmap, of no class."""
    name = "vgg16_bn"
    model, x = model_and_input(name, dtype)
    upper, lower = LAYERS[name]["upper"], LAYERS[name]["lower"]
    channels = top_channels(name, dtype, upper, 3, {"y": [1]})
    conditions = [{upper: [channels[0]]}, {upper: channels[1:]}]
    record = [lower, "features.34"]
    expected = crp_attribution(name, dtype, conditions, record, start_layer=upper, exclude_parallel=False)
    ours = conditional_relevance(explainer(name, dtype), x, conditions, record=record, start=upper)
    assert per_condition_error(ours.heatmap[:, 0].sum(dim=1), expected.heatmap) <= BOUNDS[dtype]
    for layer in record:
        assert per_condition_error(ours.relevance[layer][:, 0], expected.relevances[layer]) <= BOUNDS[dtype], layer


@pytest.mark.parametrize("dtype", [F64], ids=["float64"])
def test_attribution_graph_equals_zennit_crp(dtype: torch.dtype) -> None:
    """zennit-crp's ``AttributionGraph`` (its layer graph traced with ``torch.jit``) and fxlrp's
    :func:`attribution_graph` find the same concepts with the same relevances, decomposing the
    most relevant channel of VGG-16's last convolution through the two convolutions below."""
    name = "vgg16_bn"
    model, x = model_and_input(name, dtype)
    layers = ["features.40", "features.37", "features.34"]
    ours = attribution_graph(explainer(name, dtype), x, layers, width=[3, 2], target=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = trace_model_graph(model, x, layers)
        theirs = AttributionGraph(CondAttribution(model, no_param_grad=False), graph,
                                  {layer: CrpChannelConcept() for layer in layers})(
            x.clone().requires_grad_(), crp_composite(name), ours.root[1], layers[0], target=1, width=[3, 2],
            verbose=False)
    model.requires_grad_(True)
    expected = {(upper, lower[:2]): lower[2] for upper, lowers in theirs.connections.items() for lower in lowers}
    found = {(edge.upper, edge.lower): edge.relevance for edge in ours.edges}
    assert set(found) == set(expected)
    assert max(abs(found[key] - expected[key]) for key in found) <= BOUNDS[dtype] * max(map(abs, expected.values()))
    assert all(abs(value) > 1e-3 for value in expected.values())
