"""An explainer explains the model as it is now: changes the user makes after converting (a
training step, new weights, a swapped module, a changed attribute) are followed, as zennit's hooks
on the live model follow them. The reference is a fresh conversion of the changed model."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules.composites import EpsilonPlusFlat


class SmallNet(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 3)
        self.temperature = 1.0
        with torch.no_grad():
            self.norm.running_mean.uniform_(-0.2, 0.2)
            self.norm.running_var.uniform_(0.5, 1.5)

    def forward(self, x: Tensor, sharpen: bool = False) -> Tensor:
        h = self.act(self.norm(self.conv(x)))
        logits = self.head(h.mean((2, 3))) / self.temperature
        return logits * 2 if sharpen else logits


def _images(batch: int = 4, seed: int = 1) -> Tensor:
    return torch.randn(batch, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _train_mode_forward(model: nn.Module) -> None:
    model.train()
    model(_images(seed=7) * 3 + 1)  # updates BatchNorm's running statistics
    model.eval()


def _optimizer_step(model: nn.Module) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(_images(seed=8)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _load_state_dict(model: nn.Module) -> None:
    model.load_state_dict(SmallNet(seed=5).double().state_dict())


def _parameter_replaced(model: nn.Module) -> None:
    model.head.weight = nn.Parameter(model.head.weight.detach() * -2)


def _submodule_swapped(model: nn.Module) -> None:
    model.act = nn.GELU()


def _attribute_changed(model: nn.Module) -> None:
    model.temperature = 4.0


def _storage_replaced(model: nn.Module) -> None:
    model.head.weight.data = model.head.weight.detach() * 3  # the same Parameter, new storage


CHANGES: dict[str, Callable[[nn.Module], None]] = {
    "train-mode forward": _train_mode_forward, "optimizer step": _optimizer_step,
    "load_state_dict": _load_state_dict, "parameter replaced": _parameter_replaced,
    "submodule swapped": _submodule_swapped, "attribute changed": _attribute_changed,
    "storage replaced": _storage_replaced,
}
CONVERSIONS = {
    "fx, BatchNorm folded": dict(capture="fx"),
    "fx, BatchNorm a layer": dict(capture="fx", fold_batch_norm=False),
    "eager": dict(capture="eager"),
}


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
@pytest.mark.parametrize("change", list(CHANGES))
def test_explainer_follows_changes_to_the_model(change: str, conversion: str) -> None:
    model = SmallNet().double().eval()
    images = _images()
    explain = fxlrp.convert(model, EpsilonPlusFlat(), **CONVERSIONS[conversion])
    before = fxlrp.attribute(explain, images, target=1)
    CHANGES[change](model)
    fresh = fxlrp.convert(model, EpsilonPlusFlat(), **CONVERSIONS[conversion])
    expected = fxlrp.attribute(fresh, images, target=1)
    assert not torch.equal(expected, before)  # the change matters
    assert torch.equal(explain(images), fresh(images))
    assert torch.equal(fxlrp.attribute(explain, images, target=1), expected)
    # a graph traced for another value of a setting follows too
    assert torch.equal(explain(images, sharpen=True), fresh(images, sharpen=True))


def test_unchanged_model_keeps_its_graph() -> None:
    """Calls that change nothing (explanations, the model's own forward in eval mode, a change
    written in place, which the graph shares) convert nothing again."""
    model = SmallNet().double().eval()
    explain = fxlrp.convert(model, EpsilonPlusFlat(), capture="fx", fold_batch_norm=False)
    graph = explain.graph_module
    for _ in range(2):
        fxlrp.attribute(explain, _images(), target=1)
        model(_images())
    with torch.no_grad():
        model.head.weight.mul_(2)
    fxlrp.attribute(explain, _images(), target=1)
    assert explain.graph_module is graph
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.temperature = 2.0
    fxlrp.attribute(explain, _images(), target=1)
    assert explain.graph_module is not graph
    # following converts again; the model stays as the user left it
    assert all(torch.equal(tensor, state[name]) for name, tensor in model.state_dict().items())
    assert model.temperature == 2.0


@pytest.mark.slow  # Inductor compiles C++ kernels: a minute or more on a fresh machine's empty cache
def test_compiled_explanation_follows_changes_to_the_model() -> None:
    """fxlrp.compile traces the explainer as it is: a change the explainer follows by converting
    again drops the traces of the old model."""
    model = SmallNet().double().eval()
    images = _images()
    compiled = fxlrp.compile(fxlrp.convert(model, EpsilonPlusFlat(), capture="fx"))
    compiled(images, 1)
    _submodule_swapped(model)
    model.load_state_dict(SmallNet(seed=5).double().state_dict())  # into weights folded with BatchNorm
    expected = fxlrp.attribute(fxlrp.convert(model, EpsilonPlusFlat(), capture="fx"), images, target=1)
    # Inductor sums in other orders than eager: in float64 a rounding of 1e-16 relative, even
    # divided by a denominator as small as epsilon (1e-6), stays below 1e-9; the old model's
    # relevance is off by order 1
    assert relative_error(compiled(images, 1), expected) < 1e-9
    assert compiled.graphs == 1


def test_a_copy_explains_the_model_as_copied() -> None:
    model = SmallNet().double().eval()
    explain = fxlrp.convert(model, EpsilonPlusFlat(), capture="fx")
    before = fxlrp.attribute(explain, _images(), target=1)
    twin = copy.deepcopy(explain)
    _load_state_dict(model)
    _submodule_swapped(model)
    assert torch.equal(fxlrp.attribute(twin, _images(), target=1), before)
    assert not torch.equal(fxlrp.attribute(explain, _images(), target=1), before)


def test_explainer_follows_forward_hooks_added_and_removed() -> None:
    """Capture runs modules with forward hooks eagerly (tests/unit/test_module_hooks.py): a hook added
    after conversion is followed as the model's other changes are, and so is its removal."""
    model = SmallNet().double().eval()
    images = _images()
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    before = fxlrp.attribute(explain, images, target=1)
    handle = model.head.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    expected = fxlrp.attribute(fxlrp.convert(model, EpsilonPlusFlat()), images, target=1)
    assert not torch.equal(expected, before)  # the hook matters
    assert torch.equal(fxlrp.attribute(explain, images, target=1), expected)
    handle.remove()
    assert torch.equal(fxlrp.attribute(explain, images, target=1), before)

    strict = fxlrp.convert(model, EpsilonPlusFlat(), capture="fx")
    model.head.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    with pytest.raises(fxlrp.CaptureError, match="head: it has forward hooks"):
        fxlrp.attribute(strict, images, target=1)
