"""LRP-0 equals gradient x input on PyG networks of piecewise-linear pieces (float64, exact)."""

from __future__ import annotations

import pytest
import torch
from support.pyg_networks import EdgeFeatureStack, Stack, gradient_times_input, random_graph
from torch_geometric.nn import GraphConv
from torch_geometric.nn.models import GCN, GIN, GraphSAGE

import fxlrp
from fxlrp.integrations.pyg import graph_relevance

LRP0 = fxlrp.rules.Epsilon(0.0)
PIECEWISE_LINEAR = ["gcn", "gin", "sage_mean", "sage_max", "graphconv_add", "graphconv_max", "edgeconv"]


def assert_lrp0_is_gradient_times_input(model, x, edge_index, rows, **kwargs):
    model = model.double().eval()
    explain = fxlrp.convert(model, LRP0)
    output = model(x, edge_index, **kwargs)
    torch.testing.assert_close(explain(x, edge_index, **kwargs), output, rtol=0, atol=0)
    target = output.argmax(dim=-1)
    relevance = graph_relevance(explain, x, edge_index, target=target, index=rows, **kwargs)
    floating = {name: value for name, value in kwargs.items() if name == "edge_attr"}
    references = gradient_times_input(lambda x, edge_index, **rest: model(x, edge_index, **rest),
                                      [x, *floating.values()], (edge_index,),
                                      {k: v for k, v in kwargs.items() if k not in floating}, rows, target) \
        if not floating else _with_edge_attr(model, x, edge_index, kwargs["edge_attr"], rows, target)
    torch.testing.assert_close(relevance.node, references[0], rtol=1e-10, atol=1e-12)
    assert relevance.node.abs().sum() > 0
    return relevance, references


def _with_edge_attr(model, x, edge_index, edge_attr, rows, target):
    return gradient_times_input(lambda x, edge_attr: model(x, edge_index, edge_attr=edge_attr),
                                [x, edge_attr], (), {}, rows, target)


@pytest.mark.parametrize("layer", PIECEWISE_LINEAR)
def test_node_level(layer):
    torch.manual_seed(0)
    x, edge_index = random_graph(14, 40)
    assert_lrp0_is_gradient_times_input(Stack(layer), x, edge_index, torch.tensor([0, 3, 7]))


@pytest.mark.parametrize("layer, pool", [("gcn", "add"), ("gin", "mean"), ("sage_max", "max"),
                                         ("graphconv_max", "mean"), ("sage_mean", "add")])
def test_graph_level_batched(layer, pool):
    torch.manual_seed(1)
    x_a, edges_a = random_graph(9, 25, seed=1)
    x_b, edges_b = random_graph(6, 15, seed=2)
    x = torch.cat([x_a, x_b])
    edge_index = torch.cat([edges_a, edges_b + 9], dim=1)
    batch = torch.tensor([0] * 9 + [1] * 6)
    relevance, _ = assert_lrp0_is_gradient_times_input(Stack(layer, pool=pool), x, edge_index,
                                                       torch.tensor([0, 1]), batch=batch)
    # no message crosses from one graph to the other
    assert relevance.node.abs().sum() > 0


def test_edge_features():
    torch.manual_seed(2)
    x, edge_index = random_graph(10, 30)
    edge_attr = torch.randn(30, 3, dtype=torch.float64)
    relevance, references = assert_lrp0_is_gradient_times_input(EdgeFeatureStack(), x, edge_index,
                                                                 torch.tensor([1, 4]), edge_attr=edge_attr)
    torch.testing.assert_close(relevance.edge_attr, references[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", [GCN, GIN, GraphSAGE])
def test_pyg_ready_models(model):
    torch.manual_seed(3)
    x, edge_index = random_graph(12, 36)
    assert_lrp0_is_gradient_times_input(model(5, 8, num_layers=3, out_channels=3), x, edge_index,
                                        torch.arange(12))


def test_two_graph_sizes_in_a_row():
    """Nothing is baked from the first input: one conversion explains graphs of any size."""
    torch.manual_seed(4)
    model = Stack("gcn", pool="mean").double().eval()
    explain = fxlrp.convert(model, LRP0)
    for nodes, edges in ((7, 12), (31, 90)):
        x, edge_index = random_graph(nodes, edges, seed=nodes)
        batch = torch.zeros(nodes, dtype=torch.long)
        output = model(x, edge_index, batch)
        torch.testing.assert_close(explain(x, edge_index, batch), output, rtol=0, atol=0)
        target = output.argmax(dim=-1)
        relevance = graph_relevance(explain, x, edge_index, target=target, batch=batch)
        reference = gradient_times_input(model, [x], (edge_index, batch), {}, torch.tensor([0]), target)[0]
        torch.testing.assert_close(relevance.node, reference, rtol=1e-10, atol=1e-12)


class WeightedGraphConvs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList([GraphConv(5, 8), GraphConv(8, 8), GraphConv(8, 3)])

    def forward(self, x, edge_index, edge_weight=None):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_weight)
            x = x.relu() if i < 2 else x
        return x


def test_edge_relevance_is_gradient_times_edge_weight():
    """Under LRP-0 a message's relevance is its gradient x input. GraphConv sends
    ``w_e * x_j``, so summed over features and layers it is ``w * df/dw`` at ``w = 1``."""
    torch.manual_seed(5)
    x, edge_index = random_graph(11, 33)
    model = WeightedGraphConvs().double().eval()
    rows = torch.tensor([2, 5, 9])
    output = model(x, edge_index)
    target = output.argmax(dim=-1)
    relevance = graph_relevance(fxlrp.convert(model, LRP0), x, edge_index, target=target, index=rows)
    weight = torch.ones(33, dtype=torch.float64, requires_grad=True)
    explained = model(x, edge_index, weight)[rows, target[rows]].sum()
    reference, = torch.autograd.grad(explained, weight)
    torch.testing.assert_close(relevance.edge, reference, rtol=1e-10, atol=1e-12)
    assert sorted(relevance.edge_by_layer) == ["convs.0", "convs.1", "convs.2"]
    torch.testing.assert_close(sum(relevance.edge_by_layer.values()), relevance.edge)


def test_plain_index_select_after_pyg_import() -> None:
    """PyG replaces torch.index_select by a Python wrapper; a plain model calling it still
    converts and gets LRP-0 = gradient x input."""

    class Gather(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x, index):
            return torch.index_select(self.linear(x), 0, index).sum(dim=0)

    model = Gather().double()
    x, index = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 2, 2, 3])
    relevance, _ = fxlrp.attribute(fxlrp.convert(model, LRP0), (x, index), target=1)
    leaf = x.clone().requires_grad_()
    model(leaf, index)[1].backward()
    torch.testing.assert_close(relevance, leaf.grad * x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["gcn", "sage_mean", "gat"])
def test_the_first_layer_rule_reaches_inside_the_first_message_passing_layer(layer: str) -> None:
    # EpsilonPlusFlat's Flat belongs to the first linear layer the input meets: inside the first
    # message-passing layer, where the model run eagerly as a whole also puts it (not the head).
    from fxlrp.rules.composites import EpsilonPlusFlat

    torch.manual_seed(0)
    model = Stack(layer).double().eval()
    x, edge_index = random_graph(12, 30)
    graph = fxlrp.convert(model, EpsilonPlusFlat(), capture="fx")
    assert "Flat" not in [row.rule for row in graph.report().rows if row.name == "head"][0]
    expected = fxlrp.attribute(fxlrp.convert(model, EpsilonPlusFlat(), capture="eager"), (x, edge_index), target=1)
    relevance = fxlrp.attribute(graph, (x, edge_index), target=1)
    torch.testing.assert_close(relevance[0], expected[0], rtol=1e-12, atol=1e-14)
