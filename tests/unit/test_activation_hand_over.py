"""A ReLU-like activation that is a layer's only consumer hands its output to the layer's rule,
which then reads its denominator from it instead of keeping its own output alive.

The results must be those of the rules written out layer by layer (where relevance arrives the
two tensors are equal), nothing may be handed over where the layer's output has other consumers,
and the rule must really keep the activation's output instead of its own.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.models import TwoLayers, rule_nodes
from support.references import (
    LRP0,
    dense_jacobians,
    epsilon_reference,
    explained_relevance,
    gamma_dense,
    gradient_times_input,
    onehot_relevance,
    relative_error,
)
from torch import Tensor, nn

import fxlrp

ACTIVATIONS = {
    "relu": F.relu,
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "clamp": lambda z: torch.clamp(z, min=-0.3, max=0.8),
    "threshold": lambda z: F.threshold(z, 0.2, -1.0),
    "relu_method": lambda z: z.relu(),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_layer_by_layer_reference_with_large_epsilon(name: str) -> None:
    """Epsilon 0.1 makes every denominator matter; the reference keeps the pre-activation."""
    torch.manual_seed(0)
    model = TwoLayers(ACTIVATIONS[name]).double()
    x = 8 * torch.randn(5, 6, dtype=torch.float64)  # large enough for ReLU6 and hardtanh to saturate
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    (actual,) = explained_relevance(explain, [x], onehot_relevance)

    with torch.no_grad():
        z = model.first(x)
        a = model.activation(z)
        output = model.second(a)
    (relevance_a,) = epsilon_reference(model.second, [a], onehot_relevance(output), epsilon=0.1)
    z_leaf = z.clone().requires_grad_()
    (relevance_z,) = torch.autograd.grad(model.activation(z_leaf), z_leaf, relevance_a)
    (expected,) = epsilon_reference(model.first, [x], relevance_z, epsilon=0.1)
    assert relative_error(actual, expected) < 1e-12


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gamma_behind_an_activation_equals_its_dense_formula(name: str) -> None:
    """The gamma rule reads the signs of its output in backward from the kept (rectified or
    handed-over) output; behind a ReLU it skips the half of negative outputs."""
    torch.manual_seed(4)
    model = TwoLayers(ACTIVATIONS[name]).double()
    x = 8 * torch.randn(5, 6, dtype=torch.float64)
    composite = fxlrp.composites.Composite(layer_rule=fxlrp.rules.Gamma(0.25))
    (actual,) = explained_relevance(fxlrp.convert(model, composite), [x], onehot_relevance)

    with torch.no_grad():
        z = model.first(x)
        a = model.activation(z)
        output = model.second(a)

    def gamma_reference(layer: nn.Linear, value: Tensor, relevance: Tensor) -> Tensor:
        (jacobian,) = dense_jacobians(layer, [value])  # the whole batch, flattened
        with torch.no_grad():
            bias = layer(torch.zeros_like(value)).reshape(-1)
        flat = gamma_dense(jacobian, bias, value.reshape(-1), relevance.reshape(-1), gamma=0.25)
        return flat.reshape(value.shape)

    relevance_a = gamma_reference(model.second, a, onehot_relevance(output))
    z_leaf = z.clone().requires_grad_()
    (relevance_z,) = torch.autograd.grad(model.activation(z_leaf), z_leaf, relevance_a)
    expected = gamma_reference(model.first, x, relevance_z)
    assert relative_error(actual, expected) < 1e-12


class SharedPreActivation(nn.Module):
    """The pre-activation has a second consumer: relevance reaches it where the ReLU is off."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.side = nn.Linear(6, 16), nn.Linear(16, 3), nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        z = self.first(x)
        return self.second(torch.relu(z)) + self.side(z)


def test_no_hand_over_where_the_output_has_other_consumers() -> None:
    torch.manual_seed(1)
    model = SharedPreActivation().double()
    x = torch.randn(5, 6, dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(model, LRP0), [x], onehot_relevance)
    (expected,) = gradient_times_input(model, [x], lambda out: out, onehot_relevance)
    assert relative_error(actual, expected) < 1e-10


def _tensors(state) -> list[Tensor]:
    if isinstance(state, Tensor):
        return [state]
    if isinstance(state, (tuple, list)):
        return [tensor for value in state for tensor in _tensors(value)]
    return []


def _held(node) -> list[Tensor]:
    """Every tensor a rule node holds for backward: its rule's state and the kept output."""
    return _tensors(node.state) + ([node.kept.values] if node.kept is not None else [])


def test_the_rule_keeps_the_activation_instead_of_its_own_output() -> None:
    model = TwoLayers(nn.ReLU())
    explain = fxlrp.convert(model)
    x = torch.randn(4, 6, requires_grad=True)
    output, recorded = explain.run_recording(["first", "activation"], x)
    first_rule = next(node for node in rule_nodes(output) if node.state[0][0] is not None
                      and node.state[0][0].shape == x.shape)
    kept = {tensor.data_ptr() for tensor in _held(first_rule)}
    assert recorded["activation"].data_ptr() in kept
    assert recorded["first"].data_ptr() not in kept


@pytest.mark.parametrize(
    "model, node",
    [(nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 3)), "_0"),
     # the kept output is also the source a GELU is recomputed from (checked first, in backward)
     (TwoLayers(nn.GELU()), "first")],
    ids=["denominator", "recomputed_activation"],
)
def test_in_place_change_of_a_kept_output_is_an_error(model: nn.Module, node: str) -> None:
    explain = fxlrp.convert(model)
    x = torch.randn(4, 6, requires_grad=True)
    output, recorded = explain.run_recording([node], x)
    with torch.no_grad():
        recorded[node].mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        torch.autograd.grad(output, x, torch.ones_like(output))


def test_relu_rectifies_the_rule_output_in_place() -> None:
    """Without recording, ReLU works in place on the rule's output, which the rule keeps."""
    torch.manual_seed(2)
    model = TwoLayers(nn.ReLU())
    x = torch.randn(4, 6, requires_grad=True)
    output = fxlrp.convert(model)(x)
    first_rule = next(node for node in rule_nodes(output) if node.state[0][0].shape == x.shape)
    kept = first_rule.kept.values
    assert torch.equal(kept, torch.relu(model.first(x.detach())))
    assert first_rule.kept.sign == 1.0  # known non-negative: the stabiliser skips its sign test


def test_a_second_backward_says_what_to_do() -> None:
    """A forward's relevance graph is used up by its backward (to save memory); a second backward
    must say so, and a forward inside reusable_graph() serves several, each equal to a fresh one."""
    from fxlrp.relevance.rule_function import reusable_graph

    torch.manual_seed(3)
    explain = fxlrp.convert(TwoLayers(nn.ReLU()).double())
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    output = explain(x)
    first = torch.autograd.grad(output, x, onehot_relevance(output, 0), retain_graph=True)[0]
    with pytest.raises(RuntimeError, match="used up by an earlier backward"):
        torch.autograd.grad(output, x, onehot_relevance(output, 1))
    with reusable_graph():
        output = explain(x)
    for target in (0, 1, 0):
        (reused,) = torch.autograd.grad(output, x, onehot_relevance(output, target), retain_graph=True)
        (fresh,) = explained_relevance(explain, [x], lambda out, target=target: onehot_relevance(out, target))
        assert torch.equal(reused, fresh)
    assert torch.equal(reused, first)


def test_a_relu_leaves_an_output_its_own_backward_reads_alone() -> None:
    """Found by the property search (tests/unit/test_properties.py): scatter_reduce's backward reads its
    result, so a ReLU after it must not rectify that result in place."""

    class ScatterReduceReLU(nn.Module):
        def forward(self, x):
            index = torch.zeros_like(x, dtype=torch.long)
            return torch.relu(x.new_zeros(1, 1).scatter_reduce(0, index, x, "sum"))

    x = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    relevance = fxlrp.attribute(fxlrp.convert(ScatterReduceReLU(), fxlrp.rules.Epsilon(0.0)), x, 0)
    assert torch.equal(relevance, x)  # LRP-0 = gradient x input
