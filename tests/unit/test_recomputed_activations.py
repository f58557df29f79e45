"""A layer whose input is a smooth activation (GELU, SiLU, ...) of another layer's output keeps
nothing of its own for that input: the other layer's rule keeps the activation's input anyway,
and the activation is recomputed from it in backward.

The results must be those of the rules written out layer by layer, the recomputation must not
happen where the source is not kept, and the layer must really hold no copy of the activation
between forward and backward. (A source changed in place is an error: see
test_activation_hand_over.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.models import TwoLayers as MLP
from support.models import rule_nodes
from support.references import epsilon_reference, explained_relevance, onehot_relevance, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.relevance.rule_function import reusable_graph

ACTIVATIONS = {
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "silu": nn.SiLU(),
    "silu_in_place": nn.SiLU(inplace=True),
    "tanh_function": torch.tanh,
    "softplus_function": F.softplus,
}


def _layer_by_layer(model: MLP, x: Tensor, epsilon: float) -> Tensor:
    """Epsilon on both layers, the identity rule on the activation, written out."""
    with torch.no_grad():
        hidden = model.first(x)
        activated = model.activation(hidden.clone())
        output = model.second(activated)
    (relevance_activated,) = epsilon_reference(model.second, [activated], onehot_relevance(output), epsilon=epsilon)
    (expected,) = epsilon_reference(model.first, [x], relevance_activated, epsilon=epsilon)
    return expected



def _holds_nothing(value: object) -> bool:
    """An input a rule holds in place of one it recomputes in backward: None (a rule that reads
    values only) or an empty leaf (a rule whose inner graph starts at the leaf)."""
    return value is None or isinstance(value, Tensor) and value.numel() == 0


def _size_held(value: object) -> int:
    return 0 if _holds_nothing(value) else value.numel()

@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_layer_by_layer_reference(name: str) -> None:
    torch.manual_seed(0)
    model = MLP(ACTIVATIONS[name]).double()
    x = 3 * torch.randn(5, 6, dtype=torch.float64)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    (actual,) = explained_relevance(explain, [x], onehot_relevance)
    assert relative_error(actual, _layer_by_layer(model, x, 0.1)) < 1e-12


def test_the_layer_keeps_no_copy_of_the_activation() -> None:
    torch.manual_seed(0)
    model = MLP(nn.GELU()).double()
    explain = fxlrp.convert(model)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    output = explain(x)
    kept_inputs = [node.state[0][0] for node in rule_nodes(output)]
    # the first layer keeps x (4 x 6); the second nothing in place of gelu (4 x 16)
    assert sorted(_size_held(tensor) for tensor in kept_inputs) == [0, 24]
    (relevance,) = torch.autograd.grad(output, x, onehot_relevance(output))
    with torch.no_grad():
        expected = _layer_by_layer(model, x.detach(), 1e-6)
    assert relative_error(relevance, expected) < 1e-12


class SourceNotKept(nn.Module):
    """The activation reads a rescaled output (the identity rule, which keeps nothing): no rule
    keeps the activation's input, so the second layer keeps the activation itself."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.first(x)
        return self.second(F.gelu(hidden * 2.0))


def test_no_recomputation_from_a_source_the_rules_do_not_keep() -> None:
    torch.manual_seed(2)
    model = SourceNotKept().double()
    x = torch.randn(5, 6, dtype=torch.float64)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    (actual,) = explained_relevance(explain, [x], onehot_relevance)
    with torch.no_grad():
        hidden = model.first(x)
        activated = F.gelu(hidden * 2.0)
        output = model.second(activated)
    (relevance_activated,) = epsilon_reference(model.second, [activated], onehot_relevance(output), epsilon=0.1)
    (expected,) = epsilon_reference(model.first, [x], relevance_activated, epsilon=0.1)
    assert relative_error(actual, expected) < 1e-12
    output = explain(x.clone().requires_grad_())
    assert all(node.state[0][0].numel() > 0 for node in rule_nodes(output))


def test_reused_graph_keeps_the_activation_and_gives_the_same_relevance() -> None:
    torch.manual_seed(3)
    model = MLP(nn.SiLU()).double()
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    with reusable_graph():
        output = explain(x)
    assert all(node.state[0][0].numel() > 0 for node in rule_nodes(output))
    for target in range(3):
        seed = torch.zeros_like(output)
        seed[:, target] = output[:, target].detach()
        (reused,) = torch.autograd.grad(output, x, seed, retain_graph=True)
        (fresh,) = explained_relevance(explain, [x.detach()], lambda out, t=target: _column(out, t))
        assert torch.equal(reused, fresh)


def _column(output: Tensor, target: int) -> Tensor:
    seed = torch.zeros_like(output)
    seed[:, target] = output[:, target]
    return seed


def test_an_activation_module_is_recomputed_without_firing_its_hooks_again() -> None:
    model = MLP(nn.GELU())
    calls = []
    model.activation.register_forward_hook(lambda module, args, output: calls.append(output.shape))
    explain = fxlrp.convert(model)
    x = torch.randn(4, 6, requires_grad=True)
    output = explain(x)
    torch.autograd.grad(output, x, onehot_relevance(output))
    assert calls == [torch.Size([4, 16])]


def test_a_recomputation_of_another_layout_is_an_error() -> None:
    """As if backward ran under a mode (autocast) that gives the activation another dtype."""
    from fxlrp.relevance.rule_function import _restore_recomputed

    leaf, source = torch.empty(0, requires_grad=True), torch.randn(4, 16)
    layout = (torch.Size([4, 16]), (16, 1), torch.float32)
    _restore_recomputed([(leaf, layout, torch.tanh, source, source._version)], None)
    assert torch.equal(leaf.detach(), torch.tanh(source))
    with pytest.raises(RuntimeError, match="another layout"):
        _restore_recomputed([(leaf, layout, lambda value: value.double(), source, source._version)], None)


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("name", ["GELUActivation", "NewGELUActivation", "QuickGELUActivation"])
def test_a_transformers_activation_module_is_recomputed(name: str, capture: str) -> None:
    """Hugging Face's activation modules (run eagerly, their ``forward(module, input)`` is the
    intercepted call) are recomputed as torch's are: the second layer keeps an empty leaf."""
    from transformers import activations

    torch.manual_seed(4)
    model = MLP(getattr(activations, name)()).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1), capture=capture)
    output = explain(x.clone().requires_grad_())
    assert sorted(_size_held(node.state[0][0]) for node in rule_nodes(output)) == [0, 30]
    (actual,) = explained_relevance(explain, [x], onehot_relevance)
    assert relative_error(actual, _layer_by_layer(model, x, 0.1)) < 1e-12


class NormedProjections(nn.Module):
    """A transformer's pattern: a residual sum (whose rule keeps it as its denominator), LayerNorm,
    and two projections of the normalised tensor, then a second LayerNorm on the first's input
    (whose input is not a rule's kept output)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.norm = nn.Linear(6, 6), nn.LayerNorm(6)
        self.query, self.key, self.head = nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(4, 3)
        self.input_norm = nn.LayerNorm(6)

    def forward(self, x: Tensor) -> Tensor:
        residual = x + self.inner(x)
        normed = self.norm(residual)
        return self.head(self.query(normed) * 0.5 + self.key(normed) + self.key(self.input_norm(x)))


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_a_normalisation_output_is_recomputed_from_the_kept_sum(capture: str) -> None:
    """Neither the LayerNorm after the sum nor the projections reading it keep its output; it is
    recomputed in backward (the kernel again, on the same input: the same bits), so the relevance
    is exactly that of the graph that keeps everything (reusable_graph). The LayerNorm on the
    model's input keeps its output: nothing else keeps that input."""
    torch.manual_seed(4)
    model = NormedProjections().double().eval()
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1), capture=capture)
    output = explain(x)
    nodes = rule_nodes(output)
    empty = sum(1 for node in nodes for value in node.state[0] if _holds_nothing(value))
    assert empty == 2  # query and key read the recomputed normalisation, not their own copies
    recipes = [node for node in nodes if node.kept is not None and node.kept.values is None]
    assert len(recipes) == 1
    (relevance,) = torch.autograd.grad(output, x, onehot_relevance(output))
    with reusable_graph():
        kept_output = explain(x)
    assert not any(node.kept is not None and node.kept.values is None for node in rule_nodes(kept_output))
    (reference,) = torch.autograd.grad(kept_output, x, onehot_relevance(kept_output))
    assert torch.equal(relevance, reference)


class SharedActivation(nn.Module):
    """An activation read by a residual sum and by a convolution (which, unlike a linear layer,
    saves its input in autograd even with frozen weights); each recomputes it, and the sum takes
    its product in its own copy (its two gradients share one buffer, so it cannot take it there)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.inner = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        activated = F.gelu(self.first(x))
        return (activated + self.inner(activated)).mean((2, 3))


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_an_activation_read_by_a_sum_and_a_convolution_is_recomputed_for_each(capture: str) -> None:
    torch.manual_seed(5)
    model = SharedActivation().double().eval()
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1), capture=capture)
    output = explain(x)
    assert sum(1 for node in rule_nodes(output) for value in node.state[0]
               if _holds_nothing(value)) == 2  # both read a recomputation
    (relevance,) = torch.autograd.grad(output, x, onehot_relevance(output))
    with reusable_graph():
        kept = explain(x)
    (reference,) = torch.autograd.grad(kept, x, onehot_relevance(kept))
    assert torch.equal(relevance, reference)
