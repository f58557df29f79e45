"""Small PyG networks for the tests: a stack of one layer type, node- or graph-level."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import (
    EdgeConv,
    GATConv,
    GATv2Conv,
    GCNConv,
    GINConv,
    GINEConv,
    GraphConv,
    SAGEConv,
    TransformerConv,
    global_add_pool,
    global_max_pool,
    global_mean_pool,
)

POOLS = {"add": global_add_pool, "mean": global_mean_pool, "max": global_max_pool}


def mlp(width_in: int, width_out: int, bias: bool = True) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(width_in, width_out, bias=bias), nn.ReLU(), nn.Linear(width_out, width_out, bias=bias)
    )


LAYERS = {
    "gcn": lambda a, b, bias=True: GCNConv(a, b, bias=bias),
    "gin": lambda a, b, bias=True: GINConv(mlp(a, b, bias), train_eps=True),
    "sage_mean": lambda a, b, bias=True: SAGEConv(a, b, aggr="mean", bias=bias),
    "sage_max": lambda a, b, bias=True: SAGEConv(a, b, aggr="max", bias=bias),
    "graphconv_add": lambda a, b, bias=True: GraphConv(a, b, aggr="add", bias=bias),
    "graphconv_max": lambda a, b, bias=True: GraphConv(a, b, aggr="max", bias=bias),
    "edgeconv": lambda a, b, bias=True: EdgeConv(mlp(2 * a, b, bias), aggr="max"),
    "gat": lambda a, b, bias=True: GATConv(a, b // 2, heads=2, bias=bias),
    "gatv2": lambda a, b, bias=True: GATv2Conv(a, b // 2, heads=2, bias=bias),
    "transformer": lambda a, b, bias=True: TransformerConv(a, b // 2, heads=2, bias=bias),
}


class Stack(nn.Module):
    """``depth`` layers with ReLU between them; optionally a global pool and a linear head."""

    def __init__(self, layer: str, features: int = 5, width: int = 8, classes: int = 3, depth: int = 3,
                 pool: str | None = None, bias: bool = True) -> None:
        super().__init__()
        widths = [features] + [width] * depth
        self.convs = nn.ModuleList(LAYERS[layer](a, b, bias=bias) for a, b in zip(widths, widths[1:], strict=False))
        self.pool = pool
        self.head = nn.Linear(width, classes, bias=bias)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor | None = None) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        if self.pool is not None:
            x = POOLS[self.pool](x, batch)
        return self.head(x)


class EdgeFeatureStack(nn.Module):
    """GINE layers: node and edge features."""

    def __init__(self, features: int = 5, edge_features: int = 3, width: int = 8) -> None:
        super().__init__()
        self.first = GINEConv(mlp(features, width), edge_dim=edge_features)
        self.second = GINEConv(mlp(width, width), edge_dim=edge_features)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        x = self.first(x, edge_index, edge_attr).relu()
        return self.head(self.second(x, edge_index, edge_attr).relu())


def random_graph(nodes: int, edges: int, features: int = 5, seed: int = 0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=generator, dtype=dtype)
    edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
    return x, edge_index


def gradient_times_input(model: nn.Module, inputs: list[torch.Tensor], args: tuple, kwargs: dict,
                         rows: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """The reference: ``x * d(sum of the explained logits)/dx`` with the model's own autograd."""
    leaves = [value.detach().requires_grad_() for value in inputs]
    output = model(*leaves, *args, **kwargs)
    selected = output[rows, target[rows]].sum()
    gradients = torch.autograd.grad(selected, leaves)
    return [leaf.detach() * gradient for leaf, gradient in zip(leaves, gradients, strict=True)]


class LinkPredictor(nn.Module):
    def __init__(self, decoder: str, classes: int = 1) -> None:
        super().__init__()
        self.convs = nn.ModuleList([GraphConv(5, 8), GraphConv(8, 8)])
        self.decoder = decoder
        self.mlp = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, classes))

    def forward(self, x, edge_index, edge_label_index, edge_weight=None):
        z = self.convs[1](self.convs[0](x, edge_index, edge_weight).relu(), edge_index, edge_weight)
        source, target = z[edge_label_index[0]], z[edge_label_index[1]]
        if self.decoder == "dot":
            return (source * target).sum(dim=-1)
        score = self.mlp(torch.cat([source, target], dim=-1))
        return score.view(-1) if score.size(-1) == 1 else score


def references(model, x, edge_index, pairs, explained):
    """Gradient x input of ``explained(output)`` for ``x`` and for unit edge weights."""
    x = x.detach().requires_grad_()
    weight = torch.ones(edge_index.size(1), dtype=x.dtype, requires_grad=True)
    node, edge = torch.autograd.grad(explained(model(x, edge_index, pairs, weight)), [x, weight])
    return x.detach() * node, edge
