"""Composites: precedence, zennit's layer maps and first layer, per-call rules of a reused
module, and conservation of relevance on bias-free networks."""

from __future__ import annotations

import pytest
import torch
from support.references import (
    dense_jacobians,
    epsilon_dense,
    explained_relevance,
    flat_dense,
    onehot_relevance,
    relative_error,
    zplus_dense,
)
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import AlphaBeta, Epsilon, Flat, Gamma, Norm, Pass, Rule, WSquare, ZBox, ZPlus
from fxlrp.rules.composites import (
    Composite,
    EpsilonAlpha2Beta1,
    EpsilonAlpha2Beta1Flat,
    EpsilonGammaBox,
    EpsilonPlus,
    EpsilonPlusFlat,
    Site,
)


def site(operation: str = "conv", *, weighted: bool = True, name: str | None = "features.3",
         module_type: type | None = nn.Conv2d, first: bool = False) -> Site:
    return Site("node", operation, weighted, name, module_type, first, is_module_call=module_type is not None)


def test_precedence_name_first_layer_type_operation_layer_default() -> None:
    by_name, first, by_type, by_operation, layer = Flat(), ZBox(0.0, 1.0), Gamma(), ZPlus(), Epsilon()
    composite = Composite(layer, name_rules={"features.*": by_name}, first_layer=first,
                          type_rules={nn.Conv2d: by_type}, operation_rules={"conv": by_operation, "add": Pass()})
    assert composite.rule_for(site(first=True)) is by_name
    assert composite.rule_for(site(name="layer1.conv", first=True)) is first
    assert composite.rule_for(site(name="layer1.conv")) is by_type
    assert composite.rule_for(site(name="layer1.conv", module_type=nn.Conv1d)) is by_operation
    assert composite.rule_for(site("linear", name="fc", module_type=nn.Linear)) is layer
    assert isinstance(composite.rule_for(site("add", weighted=False, name=None, module_type=None)), Pass)
    assert composite.rule_for(site("mean", weighted=False, name=None, module_type=None)) is None  # its default


class Block(nn.Module):
    """A first convolution, a residual block, pooling, BatchNorm after a concatenation, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).relu()
        y = x + self.conv(x)
        y = self.norm(torch.cat([x, y], dim=1)).relu()
        return self.fc(self.pool(y).flatten(1))


def rules_by_node(explain: nn.Module) -> dict[str, str]:
    return {row.name: row.rule.split("(")[0] for row in explain.report().rows if row.handling == "rule"}


@pytest.mark.parametrize("composite, first, convolution", [
    (EpsilonPlus(), "ZPlus", "ZPlus"),
    (EpsilonPlusFlat(), "Flat", "ZPlus"),
    (EpsilonAlpha2Beta1(), "AlphaBeta", "AlphaBeta"),
    (EpsilonAlpha2Beta1Flat(), "Flat", "AlphaBeta"),
    (EpsilonGammaBox(-1.0, 1.0), "ZBox", "Gamma"),
])
def test_zennit_layer_maps(composite: Composite, first: str, convolution: str) -> None:
    rules = rules_by_node(fxlrp.convert(Block(), composite))
    assert rules == {"stem": first, "conv": convolution, "add": "Norm", "norm": "Pass", "pool": "Norm",
                     "fc": "Epsilon"}


class DenseFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(12, 12)
        self.conv = nn.Conv2d(3, 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(self.dense(x).view(-1, 3, 2, 2))


def test_first_layer_is_the_first_operation_the_composite_names() -> None:
    # zennit's EpsilonGammaBox puts zB on the first convolution, the Flat composites on the
    # first dense or convolutional layer
    assert rules_by_node(fxlrp.convert(DenseFirst(), EpsilonGammaBox(-1.0, 1.0))) == {
        "dense": "Epsilon", "conv": "ZBox"}
    assert rules_by_node(fxlrp.convert(DenseFirst(), EpsilonPlusFlat())) == {"dense": "Flat", "conv": "ZPlus"}


def test_user_rules_take_precedence_over_the_map() -> None:
    composite = EpsilonPlus(type_rules={nn.Linear: WSquare()}, name_rules={"conv": Gamma()},
                            operation_rules={"add": Epsilon(0.0)})
    assert rules_by_node(fxlrp.convert(Block(), composite)) == {
        "stem": "ZPlus", "conv": "Gamma", "add": "Epsilon", "norm": "Pass", "pool": "Norm", "fc": "WSquare"}


class Recurrent(nn.Module):
    """One convolution called three times."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(3):
            x = self.conv(x).relu()
        return self.head(x.flatten(1))


def test_reused_module_gets_its_rule_at_each_call() -> None:
    torch.manual_seed(0)
    model = Recurrent().double()
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    assert list(rules_by_node(explain).values()) == ["Flat", "ZPlus", "ZPlus", "Epsilon"]
    (actual,) = explained_relevance(explain, [x], lambda output: onehot_relevance(output, 1))

    # the same by hand: dense matrices, each call with the rule and the activations of that call
    (conv_matrix,) = dense_jacobians(model.conv, [x])
    with torch.no_grad():
        conv_bias = model.conv(torch.zeros_like(x)).reshape(-1)
        pre_activations, activations = [], [x]
        for _ in range(3):
            pre_activations.append(model.conv(activations[-1]))
            activations.append(pre_activations[-1].relu())
        output = model.head(activations[-1].flatten(1))
    (head_matrix,) = dense_jacobians(model.head, [activations[-1].flatten(1)])
    relevance = epsilon_dense(head_matrix, model.head.bias.detach(), activations[-1].reshape(-1),
                              onehot_relevance(output, 1).reshape(-1))
    for call in (2, 1, 0):
        relevance = relevance * (pre_activations[call].reshape(-1) > 0)  # ReLU routes relevance
        rule = flat_dense if call == 0 else zplus_dense
        relevance = rule(conv_matrix, conv_bias, activations[call].reshape(-1), relevance)
    assert relative_error(actual, relevance.reshape(x.shape)) < 1e-12


class BiasFree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, bias=False)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.conv3 = nn.Conv2d(8, 6, 1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 4, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x).relu()
        x = x + self.conv2(x).relu()  # residual: the default z-rule of sums conserves too
        x = nn.functional.max_pool2d(x, 2)
        x = self.conv3(x).relu()
        return self.fc(self.pool(x).flatten(1))


@pytest.mark.parametrize("rule", [Epsilon(0.0), ZPlus(0.0), AlphaBeta(2.0, 1.0, 0.0), AlphaBeta(3.0, 2.0, 0.0),
                                  Gamma(0.25, 0.0)], ids=repr)
def test_conservation_on_bias_free_networks(rule: Rule) -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)  # signed inputs: the x- terms take part
    explain = fxlrp.convert(BiasFree().double(), rule)
    output = explain(x)
    start = onehot_relevance(output, 2)
    (relevance,) = explained_relevance(explain, [x], start)
    assert start.abs().sum() > 0
    totals = relevance.sum(dim=(1, 2, 3))
    assert relative_error(totals, start.sum(dim=1)) < 1e-12
    assert relevance.abs().sum() > 0


def test_norm_and_epsilon_keep_their_stabiliser_in_the_composites() -> None:
    composite = EpsilonPlus(epsilon=0.25, stabilizer=1e-3)
    assert composite.layer_rule.epsilon == 0.25
    assert composite.operation_rules["add"].epsilon == 1e-3 and isinstance(composite.operation_rules["add"], Norm)
    assert composite.operation_rules["conv"].stabilizer == 1e-3


class SharedEncoder(nn.Module):
    """One convolution applied to two inputs (a siamese model), summed: symmetric in its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.head(self.conv(a).relu().mean((2, 3)) + self.conv(b).relu().mean((2, 3)))


class ParallelStem(nn.Module):
    """Two convolutions reading the input side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Conv2d(3, 2, 3), nn.Conv2d(3, 2, 1, padding=0)
        self.head = nn.Linear(4 * 3 * 3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.cat([self.left(x), self.right(x)[..., 1:-1, 1:-1]], 1).relu().flatten(1))


class GateFromTheFirstLayer(nn.Module):
    """ReLU written as a selection whose condition calls the first layer too (a branch relevance
    never reaches, executed first)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense, self.head = nn.Linear(6, 5), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.where(self.dense(x) > 0, self.dense(x), 0.0))


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("composite", [EpsilonGammaBox(-3.0, 3.0), EpsilonPlusFlat()], ids=["EpsilonGammaBox", "Flat"])
def test_every_call_the_inputs_meet_is_a_first_layer(capture: str, composite: Composite) -> None:
    """The first layer is where the input meets a layer (docs/rules-and-composites.md): at each
    call of a shared encoder, whichever input comes first; on layers side by side; and not on a
    call whose output relevance never reaches, in place of the one that explains."""
    torch.manual_seed(0)
    shared = fxlrp.convert(SharedEncoder().double().eval(), composite, capture=capture)
    a, b = torch.randn(2, 3, 5, 5, dtype=torch.float64), torch.randn(2, 3, 5, 5, dtype=torch.float64)
    relevance_a, relevance_b = fxlrp.attribute(shared, (a, b), target=1)
    swapped_b, swapped_a = fxlrp.attribute(shared, (b, a), target=1)
    assert relative_error(swapped_a, relevance_a) < 1e-12 and relative_error(swapped_b, relevance_b) < 1e-12

    stem = ParallelStem().double().eval()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    first = composite.first_layer
    expected = fxlrp.convert(stem, Composite(Epsilon(1e-6), type_rules={nn.Conv2d: first}), capture="fx")
    assert relative_error(fxlrp.attribute(fxlrp.convert(stem, composite, capture=capture), x, target=1),
                          fxlrp.attribute(expected, x, target=1)) < 1e-12

    if isinstance(composite, EpsilonPlusFlat):  # (a dense first layer)
        gated, features = GateFromTheFirstLayer().double().eval(), torch.randn(4, 6, dtype=torch.float64)
        reference = Composite(Epsilon(1e-6), type_rules={nn.Linear: Epsilon(1e-6)}, name_rules={"dense": first})
        assert relative_error(fxlrp.attribute(fxlrp.convert(gated, composite, capture=capture), features, target=1),
                              fxlrp.attribute(fxlrp.convert(gated, reference), features, target=1)) < 1e-12


def test_shared_encoder_is_the_first_layer_at_both_calls() -> None:
    explain = fxlrp.convert(SharedEncoder(), EpsilonGammaBox(-3.0, 3.0))
    rules = rules_by_node(explain)
    assert (rules["conv"], rules["conv_1"], rules["head"]) == ("ZBox", "ZBox", "Epsilon")
