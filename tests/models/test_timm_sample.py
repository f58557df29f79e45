"""A fixed sample of timm families, one per mechanism fxlrp has to get right, small configurations
on small inputs (random weights, float64): strict conversion by the capture path the family needs,
outputs equal to the model's, every node covered, finite non-zero relevance. Where the model is
piecewise linear (ReLU CNNs) LRP-0 must equal gradient x input, and the same ViT explained through
the graph and run eagerly as a whole must give the same relevance. The full sweep over every
family is benchmarks/timm_sweep.py (docs/timm-coverage.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from support.references import LRP0, explained_relevance, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp

timm = pytest.importorskip("timm")


def small_caformer() -> nn.Module:
    """CAFormer's pieces (StarReLU MLPs, separable-convolution and attention mixers, bias-free
    LayerNorms, the MLP head's squared ReLU) at one block per stage."""
    from timm.models import metaformer

    return metaformer.MetaFormer(
        depths=(1, 1, 1, 1), dims=(16, 32, 32, 64), num_classes=10,
        token_mixers=[metaformer.SepConv, metaformer.SepConv, metaformer.Attention, metaformer.Attention],
        norm_layers=[metaformer.LayerNorm2dNoBias] * 2 + [metaformer.LayerNormNoBias] * 2,
    )


def small_nest() -> nn.Module:
    """NesT: its blocking of the image into nested windows reads shapes with ``int()``, so each
    level runs eagerly inside the captured graph."""
    from timm.models import nest

    return nest.Nest(img_size=32, embed_dims=(16, 32, 64), num_heads=(1, 2, 4), depths=(1, 1, 1), num_classes=10)


@dataclass(frozen=True)
class Case:
    name: str
    """timm model name, or a description where ``build`` makes the model."""
    size: int
    capture: str
    """``fx``, ``partly eager`` or ``whole eager``: which path this family needs."""
    settings: dict[str, Any] = field(default_factory=dict)
    build: Callable[[], nn.Module] | None = None
    piecewise_linear: bool = False
    """ReLU, max pooling and affine maps only: LRP-0 is gradient x input."""


SAMPLE = [
    # a plain CNN: BatchNorm folded into the convolutions, ReLU, max pooling, residual sums
    Case("resnet18", 32, "fx", piecewise_linear=True),
    # grouped convolutions (RegNetX)
    Case("regnetx_002", 32, "fx", piecewise_linear=True),
    # pre-activation BatchNorm that no layer before it can absorb, concatenations
    Case("densenet121", 32, "fx", piecewise_linear=True),
    # a ViT with a fixed image size is one graph (its dynamic twin is compared below)
    Case("test_vit", 32, "fx", {"img_size": 32, "dynamic_img_size": False}),
    # windows, shifted by torch.roll, relative position bias
    Case("swin_tiny_patch4_window7_224", 32, "fx",
         {"img_size": 32, "window_size": 4, "embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2)}),
    # ConvNeXt V2: global response normalisation, LayerNorm2d, depthwise 7x7
    Case("convnextv2_atto", 32, "fx"),
    # MetaFormer: StarReLU (a * relu(x) ** 2 + b), separable convolutions, attention
    Case("caformer (small)", 32, "fx", build=small_caformer),
    # torch.fx cannot trace NesT's levels: they run eagerly
    Case("nest (small)", 32, "partly eager", build=small_nest),
    # LeViT: attention bias cache filled in forward, BatchNorm on linear layers, hardswish
    Case("levit_128s", 64, "fx", {"img_size": 64}),
    # NFNet: weight standardisation (F.batch_norm on the weights runs natively), SE gates
    Case("test_nfnet", 32, "fx"),
    # EfficientFormerV2: attention with a learned bias, a strided attention downsampling
    Case("efficientformerv2_s0", 64, "fx", {"img_size": 64}),
    # MaxViT/CoAtNet: MBConv blocks and relative-position attention
    Case("test_coatnet", 64, "fx", {"img_size": 64}),
    # EfficientNet: SiLU, squeeze-excitation, depthwise convolutions
    Case("test_efficientnet", 32, "fx"),
]


def make(case: Case) -> nn.Module:
    torch.manual_seed(0)
    if case.build is not None:
        model = case.build()
    else:
        model = timm.create_model(case.name, pretrained=False, num_classes=10, **case.settings)
    return model.double().eval()


def image(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def capture_path(explain: nn.Module) -> str:
    eager = explain.report().eager_modules
    return "fx" if not eager else "whole eager" if "" in eager else "partly eager"


@pytest.mark.parametrize("case", SAMPLE, ids=[case.name for case in SAMPLE])
def test_timm_family_converts_strictly_and_explains(case: Case) -> None:
    model = make(case)
    x = image(case.size)
    explain = fxlrp.convert(model, strict=True, capture="auto")
    report = explain.report()
    assert capture_path(explain) == case.capture, report.capture
    assert report.coverage == 1.0 and "gradient" not in report.counts
    with torch.no_grad():
        expected = model(x)
    assert expected.abs().max() > 0
    # through the relevance Functions (with gradients: parts run eagerly check strictness here)
    with torch.enable_grad():
        assert relative_error(explain(x.clone().requires_grad_()).detach(), expected) < 1e-10
    relevance = fxlrp.attribute(explain, x, target=None)
    assert relevance.shape == x.shape
    assert torch.isfinite(relevance).all() and relevance.abs().sum() > 0


@pytest.mark.parametrize("case", [case for case in SAMPLE if case.piecewise_linear],
                         ids=[case.name for case in SAMPLE if case.piecewise_linear])
def test_piecewise_linear_family_lrp0_is_gradient_times_input(case: Case) -> None:
    model = make(case)
    x = torch.cat([image(case.size), image(case.size) * 0.5 + 0.1])
    explain = fxlrp.convert(model, LRP0, strict=True)
    actual = explained_relevance(explain, [x], lambda out: onehot_relevance(out, 3))
    expected = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 3))
    assert expected[0].abs().sum() > 0
    assert relative_error(actual[0], expected[0]) < 1e-10


def test_vit_run_eagerly_explains_as_its_graph_does() -> None:
    """timm's test_vit resamples its position embedding when the image size changes
    (``dynamic_img_size``), a branch on a shape: the whole model runs eagerly. With the size fixed
    the same weights trace to one graph. Both paths must give the same outputs and relevance."""
    eager_case = Case("test_vit", 32, "whole eager", {"img_size": 32})
    graph_case = next(case for case in SAMPLE if case.name == "test_vit")
    eager_model, graph_model = make(eager_case), make(graph_case)
    assert all(torch.equal(a, b) for a, b in zip(eager_model.state_dict().values(),
                                                  graph_model.state_dict().values(), strict=True))
    x = image(32)
    for composite in (fxlrp.composites.EpsilonPlusFlat(), LRP0):
        eager = fxlrp.convert(eager_model, composite, strict=True)
        graph = fxlrp.convert(graph_model, composite, strict=True)
        assert capture_path(eager) == "whole eager" and capture_path(graph) == "fx"
        eager_relevance = fxlrp.attribute(eager, x, target=2)
        graph_relevance = fxlrp.attribute(graph, x, target=2)
        assert graph_relevance.abs().sum() > 0
        assert relative_error(eager_relevance, graph_relevance) < 1e-10
