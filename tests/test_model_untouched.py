"""``convert`` and explaining only read the model: state, attributes, hooks, gradients and outputs
stay as they were. A module called several times and a tensor with several consumers are
explained correctly (LRP-0 == gradient x input)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import LRP0, explained_relevance, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp


class Model(nn.Module):
    """A BatchNorm, in-place ReLUs, a block called three times, a tensor with three consumers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        features = self.relu(self.norm(self.conv(x))).mean(dim=(2, 3))
        hidden = features
        for _ in range(3):
            hidden = self.block(hidden)
        hidden = hidden + features + F.relu(features) * 0.5  # features has three consumers
        hidden += torch.ones(4, dtype=hidden.dtype)
        return self.head(hidden)


def model_and_input() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(4)
    model = Model().double()
    with torch.no_grad():
        model.norm.running_mean.normal_(0, 0.3)
        model.norm.running_var.uniform_(0.5, 2.0)
    return model.eval(), torch.randn(2, 3, 6, 6, dtype=torch.float64)


def snapshot(model: nn.Module) -> dict:
    return {
        "state": {name: value.clone() for name, value in model.state_dict().items()},
        "attributes": {name: sorted(vars(module)) for name, module in model.named_modules()},
        "flags": {name: (module.training, getattr(module, "inplace", None)) for name, module in model.named_modules()},
        "parameters": {name: (value.requires_grad, value.data_ptr()) for name, value in model.named_parameters()},
    }


def assert_untouched(model: nn.Module, before: dict, x: torch.Tensor, output: torch.Tensor) -> None:
    after = snapshot(model)
    assert after["state"].keys() == before["state"].keys()
    for name, value in before["state"].items():
        assert torch.equal(after["state"][name], value), name
    assert after["attributes"] == before["attributes"]
    assert after["flags"] == before["flags"]
    assert after["parameters"] == before["parameters"]
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert not module._backward_hooks and not getattr(module, "_backward_pre_hooks", {})
    assert all(parameter.grad is None for parameter in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(x), output)


def test_convert_and_explaining_leave_the_model_untouched() -> None:
    model, x = model_and_input()
    with torch.no_grad():
        output = model(x)
    before = snapshot(model)

    explain = fxlrp.convert(model)
    assert_untouched(model, before, x, output)

    relevance = fxlrp.attribute(explain, x, target=1)
    assert torch.isfinite(relevance).all()
    leaf = x.clone().requires_grad_()
    explain(leaf).sum().backward()
    assert_untouched(model, before, x, output)
    assert all(parameter.grad is None for parameter in explain.parameters())


def test_explainer_output_equals_model_output() -> None:
    model, x = model_and_input()
    with torch.no_grad():
        assert relative_error(fxlrp.convert(model, fold_batch_norm=False)(x), model(x)) < 1e-14
        assert relative_error(fxlrp.convert(model)(x), model(x)) < 1e-14


def test_repeated_module_and_shared_tensor_lrp0_is_gradient_times_input() -> None:
    model, x = model_and_input()
    explain = fxlrp.convert(model, LRP0)
    expected = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 2))
    actual = explained_relevance(explain, [x], lambda out: onehot_relevance(out, 2))
    assert relative_error(actual[0], expected[0]) < 1e-9


def test_block_called_three_times_appears_three_times_in_the_report() -> None:
    model, _ = model_and_input()
    targets = [row.target for row in fxlrp.convert(model).report().rows]
    assert targets.count("block.0") == 3


class ConstantInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)

    def forward(self, x):
        return self.layer(x) + torch.ones(3)  # a tensor constant while capturing


def test_constant_made_in_forward_is_not_stored_on_the_model() -> None:
    model = ConstantInForward()
    before = sorted(vars(model))
    explain = fxlrp.convert(model)
    assert sorted(vars(model)) == before
    x = torch.randn(2, 3)
    torch.testing.assert_close(explain(x), model(x))
