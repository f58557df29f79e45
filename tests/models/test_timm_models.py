"""timm models with random weights on small inputs (no network): capture leaves the model as it
found it (LeViT and EfficientFormerV2 fill an attention-bias cache in forward), and weight
standardisation (BiT's StdConv2d, NFNet's ScaledStdConv2d: ``F.batch_norm`` on the weights) runs
natively, the convolution taking the standardised weight as its constant weight."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from support.models import proxies_in, state_of_attributes
from support.references import LRP0, explained_relevance, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp

timm = pytest.importorskip("timm")


def timm_model(name: str, **settings) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **settings).double().eval()


def image(size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def convert_quietly(model: nn.Module, **settings) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # strict=False lists operations without a rule
        return fxlrp.convert(model, **settings)


@pytest.mark.parametrize(("name", "strict"), [("levit_128s", True), ("efficientformerv2_s0", False)])
def test_converting_twice_leaves_the_attention_bias_cache_alone(name: str, strict: bool) -> None:
    model = timm_model(name, img_size=64)
    x = image(64)
    with torch.no_grad():
        expected = copy.deepcopy(model)(x)  # the model itself stays unrun: its cache empty
    state = {key: value.clone() for key, value in model.state_dict().items()}
    attributes = state_of_attributes(model)
    caches = [module.attention_bias_cache for module in model.modules() if hasattr(module, "attention_bias_cache")]
    assert caches

    explains = [convert_quietly(model, strict=strict) for _ in range(2)]
    assert state_of_attributes(model) == attributes
    assert all(cache == {} for cache in caches) and proxies_in(model) == []
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state.items())
    with torch.no_grad():
        for explain in explains:
            assert relative_error(explain(x), expected) < 1e-12
        assert torch.equal(model(x), expected)

    # Run once, the model holds real attention biases; capture keeps exactly those.
    filled = state_of_attributes(model)
    assert all(list(cache) == ["cpu"] for cache in caches)
    convert_quietly(model, strict=strict)
    assert state_of_attributes(model) == filled and proxies_in(model) == []
    with torch.no_grad():
        assert torch.equal(model(x), expected)


# Weight standardisation -------------------------------------------------------------------------


def group_norm_with_sigma_constant(x, num_groups, weight=None, bias=None, eps=1e-5):
    """``F.group_norm`` whose gradient holds each group's sigma constant, as fxlrp explains it."""
    grouped = x.reshape(x.shape[0], num_groups, -1)
    sigma = torch.sqrt(grouped.detach().var(-1, unbiased=False, keepdim=True) + eps)
    normalised = ((grouped - grouped.mean(-1, keepdim=True)) / sigma).reshape(x.shape)
    channel = (1, -1) + (1,) * (x.dim() - 2)
    return normalised * weight.view(channel) + bias.view(channel)


def handling_of(explain: nn.Module, operation: str) -> list[str]:
    return [row.handling for row in explain.report().rows if row.operation == operation]


def test_bit_resnetv2_lrp0_is_gradient_times_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """BiT: StdConv2d (weight standardisation), pre-activation GroupNorm + ReLU, max pooling,
    residual sums. Every piece but GroupNorm is piecewise linear, and GroupNorm is explained with
    sigma constant, so LRP-0 equals gradient x input of the model whose GroupNorm holds sigma
    constant."""
    model = timm_model("resnetv2_50x1_bit", num_classes=10)
    x = torch.cat([image(32), image(32, seed=2)])
    explain = fxlrp.convert(model, LRP0)  # strict
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    standardisations = sum(isinstance(module, timm.layers.StdConv2d) for module in model.modules())
    assert handling_of(explain, "batch_norm") == ["no relevance"] * standardisations
    assert handling_of(explain, "conv").count("rule") == standardisations + 1  # and the head
    actual = explained_relevance(explain, [x], lambda out: onehot_relevance(out, 3))
    monkeypatch.setattr(torch.nn.functional, "group_norm", group_norm_with_sigma_constant)
    expected = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 3))
    assert relative_error(actual[0], expected[0]) < 1e-10


@pytest.mark.parametrize("name", ["test_nfnet", "nf_resnet26"])
def test_nfnet_family_converts_strictly(name: str) -> None:
    """NF nets (ScaledStdConv2d; GELU/SiLU, squeeze-excitation gates): smooth, so no exact
    reference; the explainer gives the model's outputs and finite, non-zero relevance."""
    model = timm_model(name, num_classes=10)
    x = image(32)
    explain = fxlrp.convert(model)  # strict
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-12
    standardisations = sum(isinstance(module, timm.layers.ScaledStdConv2d) for module in model.modules())
    assert handling_of(explain, "batch_norm") == ["no relevance"] * standardisations
    relevance = fxlrp.attribute(explain, x, target=3)
    assert torch.isfinite(relevance).all() and relevance.abs().sum() > 0


def standardised(weight: torch.Tensor, eps: float, gain: torch.Tensor | None = None) -> torch.Tensor:
    """Weight standardisation by hand: per output channel ``(w - mean) / sqrt(var + eps)``."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    result = (flat - flat.mean(1, keepdim=True)) / torch.sqrt(flat.var(1, unbiased=False, keepdim=True) + eps)
    if gain is not None:
        result = result * gain.detach().reshape(-1, 1)
    return result.reshape(weight.shape)


class PiecewiseLinear(nn.Module):
    """StdConv2d -> ReLU -> ScaledStdConv2d -> ReLU -> average pooling -> Linear, or the same
    network with plain convolutions (``standard``)."""

    def __init__(self, standard: bool = False) -> None:
        super().__init__()
        if standard:
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=True)
            self.conv2 = nn.Conv2d(4, 5, 3, stride=2, padding=1, bias=True)
        else:
            self.conv1 = timm.layers.StdConv2d(3, 4, 3, bias=True, eps=1e-5)
            self.conv2 = timm.layers.ScaledStdConv2d(4, 5, 3, stride=2, gamma=1.7, eps=1e-5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        hidden = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(hidden.mean(dim=(2, 3)))


def piecewise_linear_pair() -> tuple[nn.Module, nn.Module]:
    """The timm network with random weights and its twin with the weights standardised by hand."""
    torch.manual_seed(0)
    model = PiecewiseLinear().double().eval()
    with torch.no_grad():
        model.conv1.bias.normal_(0, 0.3)
        model.conv2.gain.uniform_(0.5, 1.5)
    twin = PiecewiseLinear(standard=True).double().eval()
    with torch.no_grad():
        twin.conv1.weight.copy_(standardised(model.conv1.weight, 1e-5))
        twin.conv1.bias.copy_(model.conv1.bias)
        twin.conv2.weight.copy_(standardised(model.conv2.weight, 1e-5, model.conv2.gain * model.conv2.scale))
        twin.conv2.bias.copy_(model.conv2.bias)
        twin.head.load_state_dict(model.head.state_dict())
    return model, twin


def test_standardised_convolutions_lrp0_is_gradient_times_input() -> None:
    model, twin = piecewise_linear_pair()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        assert relative_error(twin(x), model(x)) < 1e-12  # the hand standardisation is the layer's
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    actual = explained_relevance(explain, [x], lambda out: onehot_relevance(out, 1))
    expected = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(actual[0], expected[0]) < 1e-10


@pytest.mark.parametrize(
    "composite",
    [
        fxlrp.rules.Epsilon(0.25),
        fxlrp.rules.ZPlus(),
        fxlrp.rules.Gamma(0.25),
        fxlrp.rules.AlphaBeta(2.0, 1.0),
        fxlrp.composites.Composite(fxlrp.rules.Epsilon(0.1), first_layer=fxlrp.rules.ZBox(-3.0, 3.0)),
    ],
    ids=["epsilon", "zplus", "gamma", "alpha2beta1", "first-layer zbox"],
)
def test_standardised_convolution_takes_its_rule_on_the_standardised_weight(composite) -> None:
    """Every rule (its weight transforms included) sees the standardised weight, and the first
    layer is the first convolution, not the standardisation of its weights: relevance equals
    that of the network with plain convolutions holding the weights standardised by hand."""
    model, twin = piecewise_linear_pair()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    actual = explained_relevance(fxlrp.convert(model, composite), [x], lambda out: onehot_relevance(out, 1))
    expected = explained_relevance(fxlrp.convert(twin, composite), [x], lambda out: onehot_relevance(out, 1))
    assert relative_error(actual[0], expected[0]) < 1e-10
