"""Values known never to be negative from the graph (issue 58): the rules that treat positive and
negative inputs apart (z+, alpha-beta, gamma) leave out the terms of negative inputs behind them
without reading a value, on every device.

The analysis (:func:`fxlrp.graph.relevance_flow.nodes_known_non_negative`) is checked node by
node against what each call can output; the relevance with it against the relevance without it,
both on the path the rules take on a GPU (every term computed where nothing is known), and against
the CPU's path, which reads the values.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.utils._python_dispatch import TorchDispatchMode

import fxlrp
import fxlrp.explain.loader  # noqa: F401  (registers the operations)
from fxlrp.graph.relevance_flow import find_operation, nodes_known_non_negative
from fxlrp.relevance import tracing
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules import AlphaBeta, Gamma, ZPlus
from fxlrp.rules.composites import Composite, EpsilonGammaBox, EpsilonPlusFlat
from tests.support.references import relative_error


class Calls(nn.Module):
    """One call per output, each named by what it is known to be (``known_``) or not (``unknown_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.zero_pad = nn.ZeroPad2d(1)
        self.negative_pad = nn.ConstantPad2d(1, -0.5)
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        r = self.relu(x)
        s = torch.sigmoid(x)
        return {
            "unknown_input": x + 0,
            "known_relu": r,
            "known_softmax": x.softmax(-1),
            "known_plus_one": r + 1,
            "unknown_plus_minus_one": r + (-1.0),
            "unknown_minus_one": r - 1,
            "unknown_add_alpha": torch.add(r, s, alpha=-2),
            "known_sum_of_two": r + s,
            "known_scaled": r * 0.5,
            "unknown_negated": r * -1,
            "known_max_pool": F.max_pool2d(r, 2),
            "known_avg_pool": F.adaptive_avg_pool2d(r, 1),
            "known_mean": r.mean((2, 3)),
            "known_cat": torch.cat([r, s], 1),
            "unknown_cat_with_input": torch.cat([r, x], 1),
            "known_flatten": torch.flatten(r, 1),
            "unknown_view_minus_one": r.view(-1),  # (a dimension of -1 is not told from a value: not known)
            "known_selected": r[:, 0, -1],
            "known_zero_pad": self.zero_pad(r),
            "unknown_negative_pad_module": self.negative_pad(r),
            "known_pad": F.pad(r, (1, 1)),
            "unknown_negative_pad": F.pad(r, (1, 1), value=-1.0),
            "unknown_filled": r.masked_fill(x > 1, -1.0),
            "unknown_conv": self.conv(r),
            "known_relu_of_conv": torch.relu(self.conv(x)),
        }


def test_the_graph_tells_which_values_are_never_negative() -> None:
    model = Calls()
    graph = fx.symbolic_trace(model).graph
    modules = dict(model.named_modules())
    known = nodes_known_non_negative(graph, lambda node: find_operation(node, modules), modules)
    returned = next(node for node in graph.nodes if node.op == "output").args[0]
    assert {name for name, node in returned.items() if node in known} == {
        name for name in returned if name.startswith("known_")}


class Residual(nn.Module):
    """Convolution, ReLU, pooling and a residual sum, as in a ResNet; one layer's input made
    negative in places (``relu - 0.5``), whose negative terms must stay."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 6, 3, padding=1)
        self.second = nn.Conv2d(6, 6, 3, padding=1)
        self.third = nn.Conv2d(6, 6, 1)
        self.shifted = nn.Conv2d(6, 6, 1)
        self.linear = nn.Linear(12, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(torch.relu(self.first(x)), 2)
        h = torch.relu(self.second(h) + h)
        h = torch.relu(self.third(h)) + self.shifted(torch.relu(h) - 0.5)
        return self.linear(torch.cat([F.adaptive_avg_pool2d(torch.relu(h), 1).flatten(1),
                                      torch.sigmoid(h).mean((2, 3))], 1))


COMPOSITES = {
    "EpsilonPlusFlat": EpsilonPlusFlat,
    "EpsilonGammaBox": lambda: EpsilonGammaBox(low=-3.0, high=3.0),
    "AlphaBeta(2, 1)": lambda: Composite(layer_rule=AlphaBeta(2.0, 1.0)),
    "Gamma(0.25)": lambda: Composite(layer_rule=Gamma(0.25)),
}


def _relevance(composite: str, monkeypatch: pytest.MonkeyPatch, *, known: bool, reads_values: bool) -> Tensor:
    torch.manual_seed(0)
    model = Residual().double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with monkeypatch.context() as patched:
        if not known:  # no layer told that its inputs are non-negative, whatever the graph says
            layer = RelevanceCall.layer
            patched.setattr(RelevanceCall, "layer", lambda call, *arguments, **settings: dataclasses.replace(
                layer(call, *arguments, **settings), inputs_non_negative=False))
        if not reads_values:
            patched.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())  # as on a GPU
        return fxlrp.attribute(fxlrp.convert(model, COMPOSITES[composite]()), x)


@pytest.mark.parametrize("composite", list(COMPOSITES))
def test_leaving_out_the_terms_of_inputs_known_non_negative_changes_no_relevance(
        composite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In float64, with the fact (the terms of negative inputs left out) and without it (both
    halves computed, as on a GPU), and against the CPU's path (which reads the values)."""
    with_fact = _relevance(composite, monkeypatch, known=True, reads_values=False)
    every_term = _relevance(composite, monkeypatch, known=False, reads_values=False)
    read = _relevance(composite, monkeypatch, known=False, reads_values=True)
    assert with_fact.abs().sum() > 0
    assert relative_error(with_fact, every_term) <= 1e-12
    assert relative_error(with_fact, read) <= 1e-12


class Convolutions(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.name().split("::", 1)[-1].split(".", 1)[0] == "convolution"
        return func(*args, **(kwargs or {}))


def test_layers_behind_non_negative_values_apply_z_plus_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU's path, z+ runs each layer once in forward and once with its positive weights,
    plus once with its negative weights where an input may be negative: the first and the
    ``shifted`` convolution (behind ``relu - 0.5``)."""
    torch.manual_seed(0)
    explain = fxlrp.convert(Residual().eval(), Composite(layer_rule=ZPlus()))
    monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())
    with Convolutions() as dispatched:
        fxlrp.attribute(explain, torch.randn(1, 3, 8, 8))
    assert dispatched.count == 4 + 4 + 2  # forward, x+ terms, x- terms of `first` and `shifted`
