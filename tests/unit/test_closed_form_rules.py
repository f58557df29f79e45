"""The rules in closed form against the same rules on an inner graph (issue 58), in float64.

Where a layer gives its vector-Jacobian product in closed form (a convolution's
``convolution_backward`` for the input alone, a linear layer's ``g @ W``), z+, alpha-beta,
gamma, flat, w^2, z^B and epsilon with ``zero_params`` compute their terms without autograd and
pull the shares back with that product and the modified weight; elsewhere (and here, with
:func:`fxlrp.relevance.terms.has_layer_gradient` answering no) each term is a graph of the
layer run on leaves of the inputs and the shares go back by ``torch.autograd.grad``. Both forms
compute the same sums, in another order only: equal to 1e-12 relative in float64, on the CPU's
path (which reads values to skip terms) and on the path the rules take on a GPU (every term
computed), in a network that has every case: a first layer on signed pixels, layers behind a
ReLU that alone reads their output (rectified: gamma's first half alone), a layer whose output
goes into a residual sum (both signs: gamma's two halves), a BatchNorm that no convolution
absorbs (a per-channel affine map) and a layer on signed inputs (the ``x-`` terms).
test_rules.py checks each rule against its dense formula.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.relevance import terms, tracing
from fxlrp.rules import AlphaBeta, Epsilon, Flat, Gamma, WSquare, ZBox, ZPlus
from fxlrp.rules.composites import Composite, EpsilonGammaBox, EpsilonPlusFlat
from tests.support.references import relative_error


class Network(nn.Module):
    """Convolutions behind a ReLU, into a residual sum, and linear layers on signed values."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 4, 3, padding=1)
        self.rectified = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.into_sum = nn.Conv2d(4, 4, 1, bias=False)
        self.norm = nn.BatchNorm2d(4)  # after a sum: not folded into a convolution
        self.on_signed = nn.Conv2d(4, 3, 3, stride=2)
        self.hidden = nn.Linear(12, 6)
        self.head = nn.Linear(6, 5)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(self.first(x))
        summed = self.into_sum(torch.relu(self.rectified(y))) + y
        signed = self.on_signed(self.norm(summed) - 0.5)
        return self.head(torch.relu(self.hidden(signed.flatten(1))))


COMPOSITES = {
    "EpsilonPlusFlat": lambda: EpsilonPlusFlat(),
    "EpsilonGammaBox": lambda: EpsilonGammaBox(low=-3.0, high=3.0),
    "zplus": lambda: Composite(ZPlus()),
    "alpha2_beta1": lambda: Composite(AlphaBeta(2.0, 1.0)),
    "gamma": lambda: Composite(Gamma(0.3)),
    "gamma_zero_bias": lambda: Composite(Gamma(0.3, zero_params="bias")),
    "epsilon_zero_bias": lambda: Composite(Epsilon(1e-6, zero_params="bias")),
    "wsquare": lambda: Composite(WSquare()),
    "flat_and_zbox": lambda: Composite(Epsilon(0.01), first_layer=Flat(),
                                       type_rules={nn.Linear: ZBox(-1.0, 2.0)}),
}


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("composite", list(COMPOSITES))
def test_closed_form_equals_the_inner_graph(composite: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Network().double().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-1.0, 1.0)
        model.norm.running_var.uniform_(0.5, 2.0)
        model.norm.weight.uniform_(-2.0, 2.0)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    if path == "gpu":  # the rules read no values: every term is computed
        monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())
    explain = fxlrp.convert(model, COMPOSITES[composite]())
    closed = fxlrp.attribute(explain, x)
    monkeypatch.setattr(terms, "has_layer_gradient", lambda layer, inputs: False)  # (asked at each call)
    on_a_graph = fxlrp.attribute(explain, x)
    assert on_a_graph.abs().sum() > 0
    assert relative_error(closed, on_a_graph) < 1e-12, relative_error(closed, on_a_graph)


class DotProduct(nn.Module):
    """``F.linear`` with a 1-D weight: one dot product per row, which has no ``g @ W`` form."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight).unsqueeze(-1)


@pytest.mark.parametrize("rule", ["epsilon", "zplus"])
def test_a_linear_map_of_a_one_dimensional_weight_keeps_the_inner_graph(rule: str) -> None:
    torch.manual_seed(0)
    model = DotProduct()
    x = torch.rand(3, 5, dtype=torch.float64)
    chosen = Epsilon(1e-6) if rule == "epsilon" else ZPlus()
    relevance = fxlrp.attribute(fxlrp.convert(model, chosen), x)
    with torch.no_grad():
        output = model(x)  # (the start relevance: the explained output itself)
        weight = model.weight if rule == "epsilon" else model.weight.clamp(min=0)
        contributions = x * weight
        expected = contributions / (contributions.sum(1, keepdim=True) + 1e-6 * (1 if rule == "zplus" else
                                    torch.sign(output))) * output
    assert relative_error(relevance, expected) < 1e-12, relative_error(relevance, expected)


class SumOfTwo(nn.Module):
    """A sum of two relevance-carrying summands, one non-negative and one signed and broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(4, 6)
        self.right = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.left(x)) + self.right(x)[:, :1])


SUM_RULES = {
    "zplus": lambda: ZPlus(),
    "alpha2_beta1": lambda: AlphaBeta(2.0, 1.0),
    "gamma": lambda: Gamma(0.3),
    "flat": lambda: Flat(),
    "epsilon_zero_bias": lambda: Epsilon(1e-6, zero_params="bias"),
    "zbox": lambda: ZBox(-1.0, 2.0),
}


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("rule", list(SUM_RULES))
def test_a_sum_of_two_relevance_carrying_summands_in_closed_form(
    rule: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sum's product in closed form (each summand's gradient: the output's, summed to its
    shape) reaches every summand, under a rule given to the sum, as on the inner graph."""
    torch.manual_seed(0)
    model = SumOfTwo().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    if path == "gpu":
        monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())
    explain = fxlrp.convert(model, Composite(Epsilon(0.01), operation_rules={"add": SUM_RULES[rule]()}))
    closed = fxlrp.attribute(explain, x)
    monkeypatch.setattr(terms, "has_layer_gradient", lambda layer, inputs: False)
    on_a_graph = fxlrp.attribute(explain, x)
    assert on_a_graph.abs().sum() > 0
    assert relative_error(closed, on_a_graph) < 1e-12, relative_error(closed, on_a_graph)


class GammaEdges(nn.Module):
    """Gamma's closed forms at their edges.

    ``cut``: a convolution behind a ReLU (the first half alone) whose denominator ``z+ + epsilon``
    is exactly 0 at the outputs the ReLU cuts off: an input of 0 there and a bias of
    ``-epsilon`` in one channel, so ``z = z+ = -epsilon``. ``grouped``: a grouped convolution
    whose output enters a residual sum (both halves, on the inner graph: a grouped convolution's
    channels are not its weight's rows in order). ``into_sum``: a linear layer whose output enters
    a residual sum (both halves as one product with the weights' rows stacked along the features).
    """

    def __init__(self) -> None:
        super().__init__()
        self.cut = nn.Conv2d(3, 4, 1)
        self.grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.hidden = nn.Linear(64, 8)
        self.into_sum = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        rectified = torch.relu(self.cut(x))
        summed = self.grouped(rectified) + rectified
        hidden = torch.relu(self.hidden(summed.flatten(1)))
        return self.into_sum(hidden) + hidden


@pytest.mark.parametrize("path", ["cpu", "gpu"])
def test_gamma_closed_forms_at_their_edges(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The closed forms equal the inner graph in float64, and a denominator of exactly 0 at an
    output the ReLU cut off gives no NaN (the ReLU's gate applies after gamma's quotient)."""
    torch.manual_seed(0)
    model = GammaEdges().double().eval()
    with torch.no_grad():
        model.cut.bias[0] = -1e-6
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    x[:, :, 1:3, 1:3] = 0.0  # (z = the bias there)
    if path == "gpu":
        monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())
    explain = fxlrp.convert(model, Composite(Gamma(0.3)))
    with torch.no_grad():
        assert (model.cut(x)[:, 0, 1:3, 1:3] == -1e-6).all()  # (so z+ + epsilon is 0 there)
    closed = fxlrp.attribute(explain, x, check_finite=False)
    monkeypatch.setattr(terms, "has_layer_gradient", lambda layer, inputs: False)
    on_a_graph = fxlrp.attribute(explain, x, check_finite=False)
    assert torch.isfinite(closed).all()
    assert on_a_graph.abs().sum() > 0
    assert relative_error(closed, on_a_graph) < 1e-12, relative_error(closed, on_a_graph)


class Aggregations(nn.Module):
    """Messages summed into nodes every way a graph network writes it: torch_scatter's
    ``scatter_add`` with a 1-D index (by keyword, a negative ``dim``, plus a bias) and
    ``scatter_sum`` with an index of the messages' shape (``dim`` by position), native
    ``zeros.scatter_add_`` (PyG's) and ``index_add``; node 0 receives no message (its sums are 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 5)
        self.bias = nn.Parameter(torch.randn(5))
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor, source: Tensor, target: Tensor) -> Tensor:
        import torch_scatter

        nodes = x.shape[0]
        h = self.embed(x)
        messages = h.index_select(0, source)
        index = target.unsqueeze(-1).expand_as(messages)
        summed = torch_scatter.scatter_add(messages, target, dim=-2, dim_size=nodes) + self.bias
        full = torch_scatter.scatter_sum(torch.relu(messages), index, 0, None, nodes)
        native = x.new_zeros((nodes, 5)).scatter_add_(0, index, messages * 0.5)
        added = x.new_zeros((nodes, 5)).index_add(0, target, messages - 1.0)
        return self.head(torch.relu(summed) + full + native + added)


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("rule", ["z", "epsilon", "zplus", "flat"])
def test_scatter_sums_in_closed_form_equal_the_inner_graph(
    rule: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scatter sum's product in closed form (the output's gradient read back at each message's
    node: ``index_select`` or ``gather``) gives, under each rule on the sums, the relevance the
    inner graph gives (autograd's own backward of the sum), to 1e-12 in float64; every sum of
    the model takes it."""
    from fxlrp.operations import scatter

    torch.manual_seed(0)
    model = Aggregations().double().eval()
    x = torch.randn(7, 4, dtype=torch.float64)
    source = torch.randint(0, 7, (20,))
    target = torch.randint(1, 7, (20,))  # (node 0 receives nothing)
    if path == "gpu":
        monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())
    rules = {"z": None, "epsilon": Epsilon(1e-3), "zplus": ZPlus(), "flat": Flat()}
    sums = {"scatter_sum": rules[rule], "index_add": rules[rule]} if rules[rule] is not None else {}
    explain = fxlrp.convert(model, Composite(Epsilon(0.01), operation_rules=sums))
    taken = []
    gathered = scatter.gathered

    def spied(*args):
        found = gathered(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(scatter, "gathered", spied)
    closed = fxlrp.attribute(explain, (x, source, target))[0]
    assert taken == [True] * 4
    monkeypatch.setattr(terms, "has_layer_gradient", lambda layer, inputs: False)
    on_a_graph = fxlrp.attribute(explain, (x, source, target))[0]
    assert on_a_graph.abs().sum() > 0
    assert relative_error(closed, on_a_graph) < 1e-12, relative_error(closed, on_a_graph)
