"""Heterogeneous PyG models of ``tests/integrations/test_pyg_hetero.py`` (also
``test_relevant_walks_hetero.py``): papers and authors, three edge types."""

from __future__ import annotations

from torch import nn
from torch_geometric.nn import GraphConv, HeteroConv, HGTConv, SAGEConv, to_hetero

WRITES, CITES, WRITTEN = ("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "rev_writes", "author")


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), 8)
        self.conv2 = GraphConv((-1, -1), 8, aggr="max")

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index).relu()


class WeightedEncoder(nn.Module):
    """GraphConv sends ``w_e * x_j``: its edge relevance is ``w * df/dw`` under LRP-0."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GraphConv((-1, -1), 8)
        self.conv2 = GraphConv((-1, -1), 8)

    def forward(self, x, edge_index, edge_weight):
        return self.conv2(self.conv1(x, edge_index, edge_weight).relu(), edge_index, edge_weight).relu()


class ToHetero(nn.Module):
    """``to_hetero`` encoder, a linear head on the papers."""

    def __init__(self, metadata, weighted: bool = False) -> None:
        super().__init__()
        self.encoder = to_hetero(WeightedEncoder() if weighted else Encoder(), metadata, aggr="sum")
        self.head = nn.Linear(8, 3)

    def forward(self, x_dict, edge_index_dict):
        return self.head(self.encoder(x_dict, edge_index_dict)["paper"])


class WithHeteroConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = HeteroConv({WRITES: SAGEConv((-1, -1), 8), CITES: GraphConv(-1, 8),
                                 WRITTEN: SAGEConv((-1, -1), 8, aggr="max")}, aggr="sum")
        self.conv2 = HeteroConv({WRITES: GraphConv((-1, -1), 8), CITES: GraphConv(-1, 8, aggr="max")}, aggr="sum")
        self.head = nn.Linear(8, 3)

    def forward(self, x_dict, edge_index_dict):
        hidden = {node_type: value.relu() for node_type, value in self.conv1(x_dict, edge_index_dict).items()}
        return self.head(self.conv2(hidden, edge_index_dict)["paper"].relu())


class HGT(nn.Module):
    def __init__(self, metadata) -> None:
        super().__init__()
        self.conv1 = HGTConv(-1, 8, metadata, heads=2)
        self.conv2 = HGTConv(8, 8, metadata, heads=2)
        self.head = nn.Linear(8, 3, bias=False)

    def forward(self, x_dict, edge_index_dict):
        return self.head(self.conv2(self.conv1(x_dict, edge_index_dict), edge_index_dict)["paper"])
