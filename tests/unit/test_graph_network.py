"""The seed 003 graph network (edge, node and global blocks; hidden block applied three times),
rebuilt with plain torch + torch_scatter as a user would write it, explained by fxlrp.

LRP-0 equals gradient x input for node, edge and global features, and relevance is conserved
on the bias-free version.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch_scatter
from support.references import LRP0, explained_relevance, gradient_times_input, relative_error
from torch import Tensor, nn
from torch_scatter import scatter_max, scatter_mean

import fxlrp


@dataclasses.dataclass
class Graphs:
    """A batch of graphs, as torchgraphs' GraphBatch: attribute access and ``evolve``."""

    node_features: Tensor
    edge_features: Tensor
    global_features: Tensor
    senders: Tensor
    receivers: Tensor
    node_graph: Tensor
    edge_graph: Tensor
    num_nodes: int
    num_graphs: int

    def evolve(self, **changes: Tensor) -> Graphs:
        return dataclasses.replace(self, **changes)


def _scatter_max(src: Tensor, index: Tensor, dim: int, dim_size: int) -> Tensor:
    return scatter_max(src, index, dim=dim, dim_size=dim_size)[0]


get_aggregation = {"sum": torch_scatter.scatter_add, "mean": scatter_mean, "max": _scatter_max}


class EdgeBlock(nn.Module):
    def __init__(self, out: int, edge: int, sender: int | None = None, glob: int | None = None, bias=True):
        super().__init__()
        self.edge = nn.Linear(edge, out, bias=bias)
        self.sender = nn.Linear(sender, out, bias=False) if sender else None
        self.glob = nn.Linear(glob, out, bias=False) if glob else None

    def forward(self, graphs: Graphs) -> Graphs:
        edges = self.edge(graphs.edge_features)
        if self.sender is not None:
            edges = edges + self.sender(graphs.node_features)[graphs.senders]
        if self.glob is not None:
            edges = edges + torch.index_select(self.glob(graphs.global_features), 0, graphs.edge_graph)
        return graphs.evolve(edge_features=edges)


class NodeBlock(nn.Module):
    def __init__(self, out: int, node: int, incoming: int | None = None, glob: int | None = None,
                 aggregation: str = "sum", bias=True):
        super().__init__()
        self.node = nn.Linear(node, out, bias=bias)
        self.incoming = nn.Linear(incoming, out, bias=False) if incoming else None
        self.glob = nn.Linear(glob, out, bias=False) if glob else None
        self.aggregation = get_aggregation[aggregation]

    def forward(self, graphs: Graphs) -> Graphs:
        nodes = self.node(graphs.node_features)
        if self.incoming is not None:
            incoming = self.aggregation(graphs.edge_features, graphs.receivers, dim=0, dim_size=graphs.num_nodes)
            nodes = nodes + self.incoming(incoming)
        if self.glob is not None:
            nodes = nodes + self.glob(graphs.global_features)[graphs.node_graph]
        return graphs.evolve(node_features=nodes)


class GlobalBlock(nn.Module):
    def __init__(self, out: int, glob: int | None = None, node: int | None = None, edge: int | None = None,
                 bias=True):
        super().__init__()
        self.glob = nn.Linear(glob, out, bias=bias) if glob else None
        self.node = nn.Linear(node, out, bias=False) if node else None
        self.edge = nn.Linear(edge, out, bias=False) if edge else None

    def forward(self, graphs: Graphs) -> Graphs:
        total = 0
        if self.glob is not None:
            total = total + self.glob(graphs.global_features)
        if self.node is not None:
            nodes = torch_scatter.scatter_add(graphs.node_features, graphs.node_graph, 0, dim_size=graphs.num_graphs)
            total = total + self.node(nodes)
        if self.edge is not None:
            edges = scatter_mean(graphs.edge_features, graphs.edge_graph, dim=0, dim_size=graphs.num_graphs)
            total = total + self.edge(edges)
        return graphs.evolve(global_features=total)


class ReLUs(nn.Module):
    def forward(self, graphs: Graphs) -> Graphs:
        return graphs.evolve(node_features=torch.relu(graphs.node_features),
                             edge_features=torch.relu(graphs.edge_features),
                             global_features=torch.relu(graphs.global_features))


class ComplexGN(nn.Module):
    def __init__(self, bias: bool = True, hidden_aggregation: str = "max") -> None:
        super().__init__()
        self.encoder = nn.Sequential(EdgeBlock(8, 3, bias=bias), NodeBlock(8, 5, bias=bias),
                                     GlobalBlock(8, glob=7, bias=bias), ReLUs())
        self.hidden = nn.Sequential(
            EdgeBlock(8, 8, sender=8, glob=8, bias=bias),
            NodeBlock(8, 8, incoming=8, glob=8, aggregation=hidden_aggregation, bias=bias),
            GlobalBlock(8, glob=8, node=8, edge=8, bias=bias),
            ReLUs(),
        )
        self.decoder = GlobalBlock(1, glob=8, bias=bias)

    def forward(self, graphs: Graphs) -> Tensor:
        graphs = self.encoder(graphs)
        for _ in range(3):
            graphs = self.hidden(graphs)
        return self.decoder(graphs).global_features


def graph_batch(generator: torch.Generator) -> Graphs:
    """Two graphs: 4 nodes / 6 edges and 3 nodes / 4 edges; node 3 receives no edge."""
    senders = torch.tensor([0, 2, 3, 1, 0, 2, 4, 5, 6, 6])
    receivers = torch.tensor([1, 0, 0, 2, 2, 1, 5, 6, 4, 5])
    return Graphs(
        node_features=torch.rand(7, 5, generator=generator, dtype=torch.float64),
        edge_features=torch.rand(10, 3, generator=generator, dtype=torch.float64),
        global_features=torch.rand(2, 7, generator=generator, dtype=torch.float64),
        senders=senders, receivers=receivers,
        node_graph=torch.tensor([0, 0, 0, 0, 1, 1, 1]), edge_graph=torch.tensor([0] * 6 + [1] * 4),
        num_nodes=7, num_graphs=2,
    )


def build(aggregation: str, bias: bool) -> tuple[ComplexGN, Graphs]:
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    model = ComplexGN(bias=bias, hidden_aggregation=aggregation).double().eval()
    return model, graph_batch(generator)


def on_features(model: nn.Module, graphs: Graphs):
    """The model as a function of the three feature tensors (the structure held fixed)."""
    return lambda nodes, edges, globs: model(graphs.evolve(node_features=nodes, edge_features=edges,
                                                          global_features=globs))


def features(graphs: Graphs) -> list[Tensor]:
    return [graphs.node_features, graphs.edge_features, graphs.global_features]


def onehot_output(output: Tensor) -> Tensor:
    return output.detach().clone()  # one output per graph: R_out = out


@pytest.mark.parametrize("aggregation", ["sum", "mean", "max"])
def test_lrp0_is_gradient_times_input_for_nodes_edges_globals(aggregation: str) -> None:
    model, graphs = build(aggregation, bias=True)
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        assert torch.equal(explain(graphs), model(graphs))

    actual = explained_relevance(on_features(explain, graphs), features(graphs), onehot_output)
    expected = gradient_times_input(on_features(model, graphs), features(graphs), lambda out: out,
                                    onehot_output)
    for name, got, want in zip(("nodes", "edges", "globals"), actual, expected, strict=True):
        assert want.abs().max() > 0, name
        assert relative_error(got, want) < 1e-9, name


@pytest.mark.parametrize("aggregation", ["sum", "mean", "max"])
def test_bias_free_network_conserves_relevance(aggregation: str) -> None:
    model, graphs = build(aggregation, bias=False)
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        output = model(graphs)
    relevance = explained_relevance(on_features(explain, graphs), features(graphs), onehot_output)
    total = sum(value.sum() for value in relevance)
    assert all(torch.isfinite(value).all() for value in relevance)
    assert abs(total.item() - output.sum().item()) < 1e-9 * output.abs().sum().item()


def test_aggregations_are_recorded_as_scatter_calls() -> None:
    """Reached through a dict on a module attribute, ``from torch_scatter import`` and
    ``torch_scatter.scatter_add``, every aggregation is one scatter node of the graph."""
    model, _ = build("mean", bias=True)
    operations = [row.operation for row in fxlrp.convert(model).report().rows]
    # hidden block, applied 3 times: incoming mean, global node sum, global edge mean
    assert operations.count("scatter_sum") == 3 * 3
    assert fxlrp.convert(model).report().coverage == 1.0


def test_attribute_passes_integer_inputs_through() -> None:
    """Index inputs (senders, receivers) are not explained; the float inputs get LRP-0, which
    equals gradient x input of the model here (linear, indexing, scatter sum)."""
    torch.manual_seed(3)
    import torch_scatter

    class MessageSum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, nodes, senders, receivers):
            messages = self.linear(nodes)[senders]
            return torch_scatter.scatter_add(messages, receivers, dim=0, dim_size=nodes.shape[0])

    model = MessageSum().double()
    nodes = torch.randn(5, 4, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 4])
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))
    node_relevance, sender_relevance, receiver_relevance = fxlrp.attribute(
        explain, (nodes, senders, receivers), target=0
    )
    assert sender_relevance is None and receiver_relevance is None
    leaf = nodes.clone().requires_grad_()
    model(leaf, senders, receivers)[:, 0].sum().backward()
    torch.testing.assert_close(node_relevance, leaf.grad * nodes, rtol=1e-12, atol=1e-12)


class NormalisedInForward(torch.nn.Module):
    """A GCN layer that computes its degree normalisation in forward, with an operation fxlrp has
    no LRP rule for (reciprocal): it only sees indices, so strict conversion accepts it. pow and
    rsqrt have rules, which on such values compute the plain operation."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x, senders, receivers):
        degree = x.new_zeros(x.shape[0]).index_add(0, receivers, torch.ones_like(receivers, dtype=x.dtype))
        scale = degree.clamp(min=1).pow(-0.5).rsqrt().reciprocal()
        messages = self.linear(x)[senders] * scale[receivers].unsqueeze(-1)
        return x.new_zeros((x.shape[0], 2)).index_add(0, receivers, messages)


def test_rule_free_operations_on_indices_need_no_rule() -> None:
    torch.manual_seed(5)
    model = NormalisedInForward().double()
    x = torch.randn(5, 3, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 2])
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))  # strict: no error
    handling = {row.target: row.handling for row in explain.report().rows}
    assert handling[".reciprocal()"] == "no relevance"
    assert explain.report().coverage == 1.0
    relevance, _, _ = fxlrp.attribute(explain, (x, senders, receivers), target=1)
    leaf = x.clone().requires_grad_()
    model(leaf, senders, receivers)[:, 1].sum().backward()
    torch.testing.assert_close(relevance, leaf.grad * x, rtol=1e-12, atol=1e-12)


def test_rule_free_operation_on_relevance_is_still_an_error() -> None:
    class ExpOfFeatures(torch.nn.Module):
        def forward(self, x, index):
            return x.new_zeros((2, x.shape[1])).index_add(0, index, x.exp())

    with pytest.raises(fxlrp.UnsupportedOperationError, match="exp"):
        fxlrp.convert(ExpOfFeatures())
