"""Whole-model parity with zennit 0.5.1: every composite fxlrp shares with zennit gives zennit's
input relevance on VGG (with and without BatchNorm) and ResNet (basic and bottleneck blocks),
in float64, with random weights and random BatchNorm statistics.

zennit explains with its canonizers (``VGGCanonizer``, ``ResNetCanonizer``: BatchNorm merged
into the preceding layer, residual ``+`` replaced by a ``Sum`` module); fxlrp with its own
BatchNorm folding and its graph-level add. One correction on zennit's side: its merge leaves
each BatchNorm as ``x / sqrt(1 + eps)`` instead of the identity (running statistics reset to
0 and 1, ``eps`` kept), which changes activations by ``5e-6`` per BatchNorm and relevance by
about ``3e-5`` (measured). :func:`merged_batch_norms_exact` sets ``eps = 0`` on the merged
BatchNorms, after the merge used the true ``eps``, so that zennit's model computes the
original function; the tests check that it does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import pytest
import torch
import torchvision
from support.references import explained_relevance, onehot_relevance, randomise_batch_norm_statistics, relative_error
from torch import Tensor, nn
from zennit import composites as zennit_composites
from zennit.torchvision import ResNetCanonizer, VGGCanonizer

import fxlrp
from fxlrp.rules import composites

TARGET = 3
LOW = torch.tensor([-2.1, -2.0, -1.8], dtype=torch.float64).reshape(1, 3, 1, 1)
HIGH = torch.tensor([2.2, 2.0, 2.5], dtype=torch.float64).reshape(1, 3, 1, 1)


def vgg11(batch_norm: bool) -> nn.Module:
    """torchvision's VGG-11 features and pooling; a narrow classifier keeps float64 memory small."""
    model = (torchvision.models.vgg11_bn if batch_norm else torchvision.models.vgg11)(num_classes=10)
    model.classifier = nn.Sequential(
        nn.Linear(512 * 7 * 7, 64), nn.ReLU(inplace=True), nn.Dropout(),
        nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Dropout(),
        nn.Linear(64, 10),
    )
    return model


MODELS: dict[str, tuple[Callable[[], nn.Module], type]] = {
    "vgg11": (lambda: vgg11(False), VGGCanonizer),
    "vgg11_bn": (lambda: vgg11(True), VGGCanonizer),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), ResNetCanonizer),
    "resnet50": (lambda: torchvision.models.resnet50(num_classes=10), ResNetCanonizer),
}

COMPOSITES: dict[str, tuple[Callable[[], composites.Composite], Callable[..., object]]] = {
    "EpsilonPlus": (composites.EpsilonPlus, zennit_composites.EpsilonPlus),
    "EpsilonPlusFlat": (composites.EpsilonPlusFlat, zennit_composites.EpsilonPlusFlat),
    "EpsilonAlpha2Beta1": (composites.EpsilonAlpha2Beta1, zennit_composites.EpsilonAlpha2Beta1),
    "EpsilonAlpha2Beta1Flat": (composites.EpsilonAlpha2Beta1Flat, zennit_composites.EpsilonAlpha2Beta1Flat),
    "EpsilonGammaBox": (
        lambda: composites.EpsilonGammaBox(LOW, HIGH),
        lambda canonizers: zennit_composites.EpsilonGammaBox(LOW, HIGH, canonizers=canonizers),
    ),
}


@functools.cache
def model_and_input(name: str) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(sum(map(ord, name)))
    build, _ = MODELS[name]
    model = randomise_batch_norm_statistics(build(), torch.Generator().manual_seed(1)).double().eval()
    return model, torch.randn(1, 3, 32, 32, dtype=torch.float64)


@contextlib.contextmanager
def merged_batch_norms_exact(model: nn.Module) -> Iterator[None]:
    """``eps = 0`` on every BatchNorm while zennit's canonizers have reduced it to the identity."""
    norms = [module for module in model.modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    saved = [module.eps for module in norms]
    for module in norms:
        module.eps = 0.0
    try:
        yield
    finally:
        for module, eps in zip(norms, saved, strict=True):
            module.eps = eps


def zennit_relevance(model: nn.Module, composite: object, x: Tensor) -> tuple[Tensor, Tensor]:
    leaf = x.clone().requires_grad_()
    with composite.context(model) as canonical, merged_batch_norms_exact(canonical):
        output = canonical(leaf)
        output.backward(onehot_relevance(output, TARGET))
    return leaf.grad, output.detach()


def parity_error(model_name: str, composite_name: str) -> float:
    """Relative error (max-abs) of fxlrp's input relevance against zennit's."""
    model, x = model_and_input(model_name)
    ours, theirs = COMPOSITES[composite_name]
    canonizer = MODELS[model_name][1]
    expected, zennit_output = zennit_relevance(model, theirs(canonizers=[canonizer()]), x)
    with torch.no_grad():
        assert relative_error(zennit_output, model(x)) < 1e-12, "zennit's canonical model changed the function"
    (relevance,) = explained_relevance(
        fxlrp.convert(model, ours()), [x], lambda output: onehot_relevance(output, TARGET))
    assert expected.abs().sum() > 0
    return relative_error(relevance, expected)


@pytest.mark.parametrize("composite_name", list(COMPOSITES))
@pytest.mark.parametrize("model_name", [pytest.param(name, marks=pytest.mark.slow) if name == "resnet50" else name
                                        for name in MODELS])  # resnet50: resnet18's blocks, 4x the time
def test_relevance_equals_zennit(model_name: str, composite_name: str) -> None:
    assert parity_error(model_name, composite_name) < 1e-6
