"""BatchNorm folding in the graph: exact outputs, one affine layer for the rules, model untouched."""

from __future__ import annotations

import pytest
import torch
from support.references import epsilon_reference, explained_relevance, randomise_batch_norm_statistics, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon


def operations(explain: nn.Module) -> list[str]:
    return [row.operation for row in explain.report().rows]


class Concatenated(nn.Module):
    """BatchNorm after a concatenation (as in DenseNet): nothing to fold it into before it."""

    def __init__(self, follower: nn.Module) -> None:
        super().__init__()
        self.left, self.right = nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1)
        self.norm = nn.BatchNorm2d(4, eps=1e-3)
        self.follower = follower

    def forward(self, x: Tensor) -> Tensor:
        return self.follower(self.norm(torch.cat([self.left(x), self.right(x)], dim=1)))


CASES = {
    "conv_then_norm": (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.BatchNorm2d(6)), (2, 4, 5, 5)),
    "conv_without_bias_then_norm": (
        lambda: nn.Sequential(nn.Conv1d(3, 5, 3, bias=False), nn.BatchNorm1d(5, eps=0.1)), (2, 3, 7)),
    "linear_then_norm": (lambda: nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)), (3, 5)),
    "transposed_then_norm": (
        lambda: nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), nn.BatchNorm2d(6)), (1, 4, 3, 3)),
    "norm_then_linear": (lambda: nn.Sequential(nn.BatchNorm1d(5), nn.Linear(5, 3)), (4, 5)),
    "norm_then_unpadded_conv": (
        lambda: nn.Sequential(nn.BatchNorm2d(4), nn.Conv2d(4, 6, 3, groups=2)), (2, 4, 5, 5)),
    "norm_then_reflecting_conv": (
        lambda: nn.Sequential(nn.BatchNorm2d(2), nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")), (1, 2, 4, 4)),
    "concatenation_norm_conv": (lambda: Concatenated(nn.Conv2d(4, 3, 1)), (2, 2, 3, 3)),
    "conv_norm_conv_norm": (
        lambda: nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), (2, 3, 3, 3)),
}
NOT_FOLDED = {
    # zero padding adds zeros, not the BatchNorm's shift, at the border: not one affine layer
    "norm_then_zero_padded_conv": (
        lambda: nn.Sequential(nn.BatchNorm2d(2), nn.Conv2d(2, 3, 3, padding=1)), (1, 2, 4, 4)),
    "concatenation_norm_relu": (lambda: Concatenated(nn.ReLU()), (2, 2, 3, 3)),
    # a transposed convolution of a constant is not constant near the border
    "norm_then_transposed": (lambda: nn.Sequential(nn.BatchNorm2d(2), nn.ConvTranspose2d(2, 3, 2)), (1, 2, 3, 3)),
}


def build(case: dict, name: str) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(len(name))
    make, shape = case[name]
    model = randomise_batch_norm_statistics(make(), torch.Generator().manual_seed(3)).double().eval()
    return model, torch.randn(shape, dtype=torch.float64)


@pytest.mark.parametrize("name", list(CASES))
def test_folded_layer_computes_the_model_and_is_one_layer_for_the_rule(name: str) -> None:
    model, x = build(CASES, name)
    explain = fxlrp.convert(model, Epsilon(0.1))
    assert "batch_norm" not in operations(explain)
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-13

    if name in ("conv_then_norm", "linear_then_norm", "transposed_then_norm", "norm_then_linear",
                "norm_then_unpadded_conv", "norm_then_reflecting_conv", "conv_without_bias_then_norm"):
        # the pair is one affine layer x -> z: the epsilon rule on it, written out densely
        relevance = torch.randn_like(model(x))
        (actual,) = explained_relevance(explain, [x], relevance)
        (expected,) = epsilon_reference(model, [x], relevance, epsilon=0.1)
        assert relative_error(actual, expected) < 1e-12
        (unfolded,) = explained_relevance(fxlrp.convert(model, Epsilon(0.1), fold_batch_norm=False), [x], relevance)
        assert relative_error(unfolded, expected) > 1e-3  # BatchNorm as a layer of its own differs


@pytest.mark.parametrize("name", list(NOT_FOLDED))
def test_batch_norm_that_is_not_one_layer_with_a_neighbour_stays(name: str) -> None:
    model, x = build(NOT_FOLDED, name)
    explain = fxlrp.convert(model)
    assert "batch_norm" in operations(explain)
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-13


def test_folding_leaves_the_model_untouched() -> None:
    model, x = build(CASES, "conv_norm_conv_norm")
    model.train()  # explanations use the running statistics in any mode; the mode is kept
    before = {name: (tensor, tensor.clone()) for name, tensor in model.state_dict(keep_vars=True).items()}
    explain = fxlrp.convert(model, Epsilon(0.0))
    (relevance,) = explained_relevance(explain, [x], lambda output: output.detach())
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    for name, (tensor, copy) in before.items():
        assert after[name] is tensor and torch.equal(tensor, copy) and tensor.grad is None, name
    assert model.training and all(module.training for module in model.modules())
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())
    model.eval()
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-13


class Reused(nn.Module):
    def __init__(self, norm_after_both: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.norm = nn.BatchNorm2d(3)
        self.norm_after_both = norm_after_both

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.conv(x)).relu()
        y = self.conv(y)
        return self.norm(y) if self.norm_after_both else y


@pytest.mark.parametrize("norm_after_both", [True, False])
def test_reused_layer_is_folded_only_when_every_call_pairs_with_the_same_norm(norm_after_both: bool) -> None:
    model = randomise_batch_norm_statistics(Reused(norm_after_both), torch.Generator().manual_seed(0)).double().eval()
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    explain = fxlrp.convert(model)
    assert ("batch_norm" in operations(explain)) is not norm_after_both
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-13


def test_lrp0_is_gradient_times_input_with_and_without_folding() -> None:
    model, x = build(CASES, "conv_then_norm")
    model = nn.Sequential(*model, nn.ReLU(), nn.Flatten(), nn.Linear(150, 3)).double().eval()
    x = x.clamp(min=-1)
    leaf = x.clone().requires_grad_()
    output = model(leaf)
    (gradient,) = torch.autograd.grad(output[:, 1].sum(), leaf)
    expected = x * gradient
    for fold in (True, False):
        (actual,) = explained_relevance(
            fxlrp.convert(model, Epsilon(0.0), fold_batch_norm=fold), [x],
            lambda out: out.detach() * torch.nn.functional.one_hot(torch.tensor(1), 3).to(out))
        assert relative_error(actual, expected) < 1e-12, fold


class CountingZPlus(fxlrp.rules.ZPlus):
    """z+ that counts how often its weight transforms are computed."""

    prepared = 0

    def prepare(self, layer):
        CountingZPlus.prepared += 1
        return super().prepare(layer)


def test_unfolded_batch_norm_transforms_once_per_conversion_and_follows_in_place_updates() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 2, 3)).double().eval()
    randomise_batch_norm_statistics(model, torch.Generator().manual_seed(2))
    composite = fxlrp.composites.Composite(type_rules={nn.BatchNorm2d: CountingZPlus()})
    explain = fxlrp.convert(model, composite, fold_batch_norm=False)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    CountingZPlus.prepared = 0
    first = fxlrp.attribute(explain, x, target=1)
    second = fxlrp.attribute(explain, x, target=1)
    assert CountingZPlus.prepared == 1
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    with torch.no_grad():
        model[0].running_var.mul_(4.0)  # an in-place update of the model is seen by the explainer
    updated = fxlrp.attribute(explain, x, target=1)
    fresh = fxlrp.attribute(fxlrp.convert(model, composite, fold_batch_norm=False), x, target=1)
    assert CountingZPlus.prepared == 3
    torch.testing.assert_close(updated, fresh, rtol=1e-12, atol=1e-12)
    assert relative_error(updated, first) > 1e-3
