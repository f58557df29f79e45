"""What a relevance Function holds for its backward where its rule builds no inner graph.

The epsilon rule on a linear layer or a convolution reads its input's values only (the layer's
own vector-Jacobian product in closed form): its Function holds the input itself, saved by
autograd, instead of an alias that is a leaf of an inner graph; a ReLU that rectifies the rule's
output in place is applied by that Function's backward instead of a node of its own. References:
the same model written without the in-place write, and the rules' dense formulas (float64).
"""

from __future__ import annotations

import pytest
import torch
from support.references import dense_jacobians, epsilon_dense, explained_relevance, flat_dense, relative_error
from torch import nn

import fxlrp
from fxlrp.rules import Epsilon, Flat
from fxlrp.rules.composites import Composite


class WritesAfterReading(nn.Module):
    """Code torch.fx cannot trace (run eagerly) that writes into a layer's input after the layer
    has read it: the write gives the Python object new values (fxlrp.eager.in_place), while the
    layer's relevance belongs to the values it read."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(6, 6), nn.Linear(6, 3)
        self.in_place = in_place

    def forward(self, x):
        if x.sum() > -1e9:  # torch.fx cannot trace this
            pass
        hidden = torch.tanh(x)
        read = self.first(hidden)
        if self.in_place:
            hidden.mul_(3.0)
        else:
            hidden = hidden * 3.0
        return self.last(torch.relu(read) + hidden)


def test_a_write_into_a_layers_input_after_it_was_read_leaves_the_relevance_of_the_values_read() -> None:
    torch.manual_seed(4)
    in_place, out_of_place = WritesAfterReading(True).double(), WritesAfterReading(False).double()
    out_of_place.load_state_dict(in_place.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64)
    rule = Epsilon(0.01)
    explain_in_place, explain_out_of_place = fxlrp.convert(in_place, rule), fxlrp.convert(out_of_place, rule)
    assert "" in explain_in_place.report().eager_modules
    expected = fxlrp.attribute(explain_out_of_place, x, target=1)
    assert expected.abs().sum() > 0
    assert relative_error(fxlrp.attribute(explain_in_place, x, target=1), expected) < 1e-12


def test_a_write_into_a_layers_input_between_forward_and_backward_is_an_error() -> None:
    explain = fxlrp.convert(nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3)).double())
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    output, recorded = explain.run_recording(["_0"], x)
    with torch.no_grad():
        recorded["_0"].mul_(2.0)  # the input of the last layer, whose rule reads it in backward
    with pytest.raises(RuntimeError, match="input of a layer was modified in place"):
        torch.autograd.grad(output, x, torch.ones_like(output))


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_a_relu_applied_by_its_layers_function_stops_relevance_at_inactive_units(layer: str) -> None:
    """The flat rule after the ReLU gives relevance to inactive units too (it shares by the
    weights); the ReLU's gate, run by the epsilon rule's Function before its rule, drops it."""
    torch.manual_seed(6)
    if layer == "linear":
        first, last, x = nn.Linear(5, 7), nn.Linear(7, 3), torch.randn(4, 5, dtype=torch.float64)
    else:
        first, last = nn.Conv1d(2, 3, 3, stride=2, padding=1), nn.Conv1d(3, 2, 2)
        x = torch.randn(2, 2, 9, dtype=torch.float64)
    first, last = first.double(), last.double()
    explain = fxlrp.convert(nn.Sequential(first, nn.ReLU(), last), Composite(Flat(), first_layer=Epsilon(1e-6)))
    with torch.no_grad():
        pre_activation = first(x)
        relevance = torch.randn_like(last(torch.relu(pre_activation)))
    (actual,) = explained_relevance(explain, [x], relevance)

    activation = torch.relu(pre_activation)
    (last_jacobian,) = dense_jacobians(last, [activation])
    (first_jacobian,) = dense_jacobians(first, [x])
    with torch.no_grad():
        last_bias, first_bias = last(torch.zeros_like(activation)).reshape(-1), first(torch.zeros_like(x)).reshape(-1)
    reaching = flat_dense(last_jacobian, last_bias, activation.reshape(-1), relevance.reshape(-1))
    assert (reaching[activation.reshape(-1) == 0] != 0).any()  # relevance the gate must drop
    gated = reaching * (pre_activation.reshape(-1) > 0)
    expected = epsilon_dense(first_jacobian, first_bias, x.reshape(-1), gated).reshape(x.shape)
    assert relative_error(actual, expected) < 1e-12
