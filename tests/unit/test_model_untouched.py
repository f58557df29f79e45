"""``convert`` and explaining only read the model: state, attributes, hooks, gradients and outputs
stay as they were. A module called several times and a tensor with several consumers are
explained correctly (LRP-0 == gradient x input)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from support.models import proxies_in, state_of_attributes
from support.references import LRP0, explained_relevance, gradient_times_input, onehot_relevance, relative_error
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
    model = ConstantInForward().double()
    before = sorted(vars(model))
    explain = fxlrp.convert(model)
    assert sorted(vars(model)) == before
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)  # (relevance-carrying: through the rules)
    assert relative_error(explain(x), model(x)) < 1e-14  # (float64: the same sums, rounded at 1e-16)


class CachingBlock(nn.Module):
    """Writes into itself in forward, as LeViT's attention-bias cache and counters do."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.cache: dict[str, torch.Tensor] = {}
        self.calls = 0

    def forward(self, x):
        key = str(x.device)  # while capturing, the text of a symbolic value
        if key not in self.cache:
            self.cache[key] = self.layer.weight * 2.0
        self.calls += 1
        return F.linear(x, self.cache[key], self.layer.bias)


class Caching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = CachingBlock()
        self.head = nn.Linear(4, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x)
        self.last_hidden = torch.relu(self.block(x))  # an attribute the forward creates
        return self.head(self.last_hidden)


class FailsAfterWriting(Caching):
    def forward(self, x):
        self.seen.append(x)
        self.block.cache["written"] = x
        if x.sum() > 0:  # data-dependent: capture fails here
            return x
        return -x


def test_state_written_in_forward_is_restored_after_capture() -> None:
    torch.manual_seed(0)
    model = Caching().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    reference = Caching().double().eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(x)
    before = state_of_attributes(model)

    explains = [fxlrp.convert(model, LRP0), fxlrp.convert(model, LRP0)]  # the second capture sees a clean model
    assert state_of_attributes(model) == before
    assert model.block.cache == {} and model.seen == [] and model.block.calls == 0
    assert not hasattr(model, "last_hidden")
    assert proxies_in(model) == []
    for explain in explains:
        with torch.no_grad():
            assert relative_error(explain(x), expected) < 1e-14
    expected_relevance = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    actual = explained_relevance(explains[1], [x], lambda out: onehot_relevance(out, 1))
    assert relative_error(actual[0], expected_relevance[0]) < 1e-10

    with torch.no_grad():  # the model itself still runs, and fills its cache with real values
        assert torch.equal(model(x), expected)
    filled = state_of_attributes(model)
    fxlrp.convert(model)
    assert state_of_attributes(model) == filled
    assert list(model.block.cache) == ["cpu"] and model.block.calls == 1 and len(model.seen) == 1


def test_state_written_in_forward_is_restored_when_capture_fails() -> None:
    model = FailsAfterWriting().double()
    before = state_of_attributes(model)
    # The trace fails after writing; then the model is either refused (tracing only) or run
    # eagerly when explained: either way the failed trace's writes are taken back.
    with contextlib.suppress(fxlrp.CaptureError):
        fxlrp.convert(model)
    assert state_of_attributes(model) == before
    assert model.seen == [] and model.block.cache == {}


class ParameterTransforms(nn.Module):
    """Operations on parameters alone, in training mode: relevance never reaches them, and they
    keep explanation-time semantics (dropout is the identity; BatchNorm uses its running
    statistics and never updates them)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        offset = F.dropout(self.offset, p=0.5, training=self.training)
        offset = F.batch_norm(offset, self.mean, self.var, training=self.training, momentum=0.5)
        return self.layer(x) + offset.sum(0)


def test_parameter_transforms_keep_explanation_time_semantics() -> None:
    torch.manual_seed(0)
    model = ParameterTransforms().double().train()
    x = torch.randn(3, 4, dtype=torch.float64)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        outputs = [explain(x) for _ in range(2)]
        expected = model.layer(x) + (model.offset / (1.0 + 1e-5) ** 0.5).sum(0)
    assert relative_error(outputs[0], expected) < 1e-14 and torch.equal(outputs[0], outputs[1])
    assert all(torch.equal(model.state_dict()[name], value) for name, value in state.items())
