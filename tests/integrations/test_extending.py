"""The worked examples of docs/extending.md, as tests: a new rule is one short declaration over
the term engine, a new integration one plug-in."""

from __future__ import annotations

import pytest
import torch
from support import extending_plugin
from support.references import LRP0, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp
from fxlrp.registry.integrations import register_integration
from fxlrp.relevance import terms
from fxlrp.rules import InputIndependent
from fxlrp.rules.composites import Composite


class PositiveWSquare(InputIndependent):
    r"""R_j = sum_k (w_jk^+)^2 / s(sum_j' (w_j'k^+)^2) R_k: relevance by squared positive weights."""

    def prepare(self, layer):
        return terms.modified_parameters(layer, lambda w: w.clamp(min=0) ** 2, self._zero | {"bias"})


def test_a_rule_declared_in_four_lines_follows_its_formula() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, Composite(LRP0, name_rules={"0": PositiveWSquare(0.0)}))
    _, nodes = fxlrp.attribute_nodes(explain, x, ["_0"], target=1)
    relevance = fxlrp.attribute(explain, x, target=1)
    # The formula with the weight matrix: m = (w^+)^2, R_j = sum_k m_kj / sum_j' m_kj' R_k.
    # (an output whose weights are all negative has nothing to share its relevance by: dropped)
    squared = model[0].weight.detach().clamp(min=0) ** 2
    totals = squared.sum(dim=1)
    expected = torch.where(totals > 0, nodes["_0"] / totals, torch.zeros_like(totals)) @ squared
    assert relative_error(relevance, expected) < 1e-12


def test_a_library_taught_by_one_plug_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from fxlrp.registry import integrations

    monkeypatch.setattr(integrations, "INTEGRATIONS", dict(integrations.INTEGRATIONS))
    register_integration("support.extending_plugin", "support.extending_plugin_support")

    class UsesTheLibrary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 6)

        def forward(self, x):
            return extending_plugin.shifted_sum(torch.relu(self.layer(x)).view(-1, 2, 3), shift=0.5)

    torch.manual_seed(1)
    model = UsesTheLibrary().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)  # strict: the plug-in's entry is found
    assert "shifted_sum" in {row.operation for row in explain.report().rows}
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
