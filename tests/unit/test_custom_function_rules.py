"""A custom autograd Function: explained by its forward's operations unless its own backward is
declared its rule (``relevance=own_backward``); where its forward stops relevance, the error
names the operation, its line and the Function.

Reference for the declared rule: LRP-0 written out by hand for linear -> straight-through round
-> linear without biases, ``R_h = h W_b^T (R / y)`` at the rounded values and
``R_x = x W_a^T (R_h / z)`` with ``R_h`` handed unchanged through the estimator's identity.
"""

from __future__ import annotations

import pytest
import torch
from support.references import LRP0, relative_error
from torch import nn

import fxlrp
from fxlrp.registry import REGISTRY, Operation, Pass, Spelling, own_backward, register


class RoundedStraightThrough(torch.autograd.Function):
    """Forward: x rounded to quarters; backward: the identity (a straight-through estimator)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, gradient):
        return gradient


class Undeclared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, gradient):
        return gradient


class Quantised(nn.Module):
    def __init__(self, function: type[torch.autograd.Function], per_token: bool = False) -> None:
        super().__init__()
        self.function, self.per_token = function, per_token
        self.a, self.b = nn.Linear(4, 6, bias=False), nn.Linear(6, 3, bias=False)

    def forward(self, x):
        if self.per_token:  # (torch.fx cannot trace the loop: the model runs eagerly)
            x = torch.stack([x[:, index] for index in range(x.shape[1])], dim=1)
        return self.b(self.function.apply(self.a(x))).sum(dim=1)


@pytest.fixture(scope="module")
def declared():
    if "rounded_straight_through" not in REGISTRY.operations:
        register(Operation(
                     "rounded_straight_through",
                     Spelling(functions=(RoundedStraightThrough,)),
                     Pass(own_backward),
                 ))
    return REGISTRY.operations["rounded_straight_through"]


def lrp0_by_hand(model: Quantised, x: torch.Tensor, target: int) -> torch.Tensor:
    z = x @ model.a.weight.T
    h = torch.round(z * 4) / 4
    y = (h @ model.b.weight.T).sum(dim=1)
    relevance = torch.zeros_like(y)
    relevance[:, target] = y[:, target]
    # the sum over tokens (z-rule), then the second layer at each token
    per_token = (h @ model.b.weight.T) / y.unsqueeze(1) * relevance.unsqueeze(1)
    at_h = h * ((per_token / (h @ model.b.weight.T)) @ model.b.weight)
    return x * ((at_h / z) @ model.a.weight)


@pytest.mark.parametrize("per_token", [False, True], ids=["traced", "eager"])
def test_a_declared_own_backward_is_the_functions_rule(declared, per_token: bool) -> None:
    torch.manual_seed(0)
    model = Quantised(RoundedStraightThrough, per_token).double()
    explain = fxlrp.convert(model, LRP0)
    for _ in range(3):  # the relevance mode, a recording (refused: a custom Function), again
        x = torch.randn(2, 5, 4, dtype=torch.float64)
        relevance = fxlrp.attribute(explain, x, target=1)
        assert relative_error(relevance, lrp0_by_hand(model, x, 1)) < 1e-10
        with torch.no_grad():
            assert torch.equal(explain(x), model(x))
    handling = {row.operation: row.handling for row in explain.report().all_rows}
    assert handling["rounded_straight_through"] == "identity"


def test_an_undeclared_function_that_stops_relevance_is_named_with_its_line() -> None:
    torch.manual_seed(0)
    explain = fxlrp.convert(Quantised(Undeclared).double(), LRP0)
    with pytest.raises(ValueError, match="does not depend on the inputs") as raised:
        fxlrp.attribute(explain, torch.randn(2, 5, 4, dtype=torch.float64), target=1)
    message = str(raised.value)
    assert "relevance stops at torch.round (a step function: its gradient is 0)" in message
    assert "test_custom_function_rules.py" in message and "return torch.round(x * 4) / 4" in message
    assert "inside Undeclared.forward" in message and "relevance=own_backward" in message
