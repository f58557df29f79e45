"""Generated "infection" graphs and a scatter-based graph network that learns them.

The task comes from graph-network explainability experiments: each node is healthy, sick or
immune; each directed edge is a real contact or a virtual one (no contact). After one step a
node is sick if it was sick, or if it was healthy and a sick node reaches it through a real
edge. An edge "infects" when it is real, its sender is sick and its receiver healthy. A good
explanation of "node v gets sick" points at v (healthy), at a sick
sender and at the real edge between them, and not at virtual edges or immune nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.toys import single_thread

NODE_STATES = ("healthy", "sick", "immune")
EDGE_KINDS = ("real", "virtual")


@dataclass(frozen=True)
class InfectionGraphs:
    """A batch of graphs as one disjoint union."""

    nodes: Tensor
    """One-hot states ``[n, 3]`` (:data:`NODE_STATES`)."""
    edges: Tensor
    """One-hot kinds ``[e, 2]`` (:data:`EDGE_KINDS`)."""
    senders: Tensor
    """``[e]`` node indices."""
    receivers: Tensor
    """``[e]`` node indices."""
    sick_next: Tensor
    """``[n]`` targets: 1 for a node sick after the step."""
    infecting: Tensor
    """``[e]`` targets: 1 for an edge that infects."""
    graph_of_node: Tensor
    """``[n]`` graph index."""

    @property
    def edge_index(self) -> Tensor:
        """``[2, e]``: senders and receivers, as PyG writes edges."""
        return torch.stack([self.senders, self.receivers])

    def graph(self, index: int) -> InfectionGraphs:
        """The ``index``-th graph alone, with node indices starting at 0.

        Parameters
        ----------
        index : int
            The graph's index.

        Returns
        -------
        InfectionGraphs
            The graph.
        """
        node_mask = self.graph_of_node == index
        first = int(node_mask.nonzero()[0])
        edge_mask = node_mask[self.senders]
        return InfectionGraphs(self.nodes[node_mask], self.edges[edge_mask], self.senders[edge_mask] - first,
                               self.receivers[edge_mask] - first, self.sick_next[node_mask],
                               self.infecting[edge_mask], torch.zeros(int(node_mask.sum()), dtype=torch.long))


def generate_infection_graphs(count: int, min_nodes: int = 10, max_nodes: int = 20, contacts: int = 2,
                              sick: float = 0.2, immune: float = 0.2, virtual: float = 0.3,
                              seed: int = 0) -> InfectionGraphs:
    """``count`` random graphs; every node sends ``contacts`` edges to random other nodes.

    Parameters
    ----------
    count : int
        The number of graphs.
    min_nodes, max_nodes : int, default 10, 20
        The bounds of each graph's number of nodes (both included).
    contacts : int, default 2
        Edges each node sends.
    sick : float, default 0.2
        The probability that a node is sick.
    immune : float, default 0.2
        The probability that a node is immune.
    virtual : float, default 0.3
        The probability that an edge is virtual.
    seed : int, default 0
        The seed.

    Returns
    -------
    InfectionGraphs
        The graphs, with their targets.
    """
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[Tensor]] = {key: [] for key in ("nodes", "edges", "senders", "receivers", "graph")}
    offset = 0
    for graph in range(count):
        size = int(torch.randint(min_nodes, max_nodes + 1, (1,), generator=generator))
        draw = torch.rand(size, generator=generator)
        state = torch.where(draw < sick, 1, torch.where(draw < sick + immune, 2, 0))
        senders = torch.arange(size).repeat_interleave(contacts)
        # a random other node for each contact: shift by 1..size-1 so that there are no self-loops
        receivers = (senders + torch.randint(1, size, (size * contacts,), generator=generator)) % size
        kind = (torch.rand(size * contacts, generator=generator) < virtual).long()
        parts["nodes"].append(F.one_hot(state, len(NODE_STATES)).float())
        parts["edges"].append(F.one_hot(kind, len(EDGE_KINDS)).float())
        parts["senders"].append(senders + offset)
        parts["receivers"].append(receivers + offset)
        parts["graph"].append(torch.full((size,), graph))
        offset += size
    nodes, edges = torch.cat(parts["nodes"]), torch.cat(parts["edges"])
    senders, receivers = torch.cat(parts["senders"]), torch.cat(parts["receivers"])
    state = nodes.argmax(dim=1)
    infecting = (edges[:, 0] == 1) & (state[senders] == 1) & (state[receivers] == 0)
    reached = torch.zeros(len(nodes), dtype=torch.bool).index_put((receivers[infecting],), torch.tensor(True))
    sick_next = (state == 1) | reached
    return InfectionGraphs(nodes, edges, senders, receivers, sick_next.float(), infecting.float(),
                           torch.cat(parts["graph"]))


class InfectionNetwork(nn.Module):
    """One round of message passing written with torch_scatter, as users write GNNs.

    messages ``m_e = MLP([x_sender, x_receiver, edge_e])``; incoming ``a_v = sum_{e -> v} m_e``
    (``torch_scatter.scatter_add``); node logit ``MLP([x_v, a_v])``; edge logit ``w^T m_e``.

    Parameters
    ----------
    hidden : int, default 32
        The width of messages and hidden layers.
    """

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        node_features, edge_features = len(NODE_STATES), len(EDGE_KINDS)
        self.message = nn.Sequential(nn.Linear(2 * node_features + edge_features, hidden), nn.ReLU(),
                                     nn.Linear(hidden, hidden), nn.ReLU())
        self.update = nn.Sequential(nn.Linear(node_features + hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.edge_readout = nn.Linear(hidden, 1)

    def forward(self, nodes: Tensor, edges: Tensor, senders: Tensor, receivers: Tensor) -> tuple[Tensor, Tensor]:
        """The node and edge logits.

        Parameters
        ----------
        nodes : Tensor
            One-hot node states ``[n, 3]``.
        edges : Tensor
            One-hot edge kinds ``[e, 2]``.
        senders, receivers : Tensor
            ``[e]`` node indices.

        Returns
        -------
        node_logits : Tensor
            ``[n]``, for "sick after the step".
        edge_logits : Tensor
            ``[e]``, for "infects".
        """
        from torch_scatter import scatter_add

        messages = self.message(torch.cat([nodes[senders], nodes[receivers], edges], dim=1))
        incoming = scatter_add(messages, receivers, dim=0, dim_size=nodes.shape[0])
        node_logits = self.update(torch.cat([nodes, incoming], dim=1)).squeeze(-1)
        return node_logits, self.edge_readout(messages).squeeze(-1)


def train_infection_network(model: InfectionNetwork, steps: int = 300, graphs_per_step: int = 32,
                            learning_rate: float = 1e-2, seed: int = 0) -> InfectionNetwork:
    """Train with Adam on the node and edge cross-entropies, fresh graphs every step.

    Parameters
    ----------
    model : InfectionNetwork
        The network, trained in place.
    steps : int, default 300
        Training steps.
    graphs_per_step : int, default 32
        Graphs generated for each step.
    learning_rate : float, default 1e-2
        Adam's learning rate.
    seed : int, default 0
        The seed of the generated graphs.

    Returns
    -------
    InfectionNetwork
        ``model``, in eval mode.
    """
    with single_thread():
        optimiser = torch.optim.Adam(model.parameters(), lr=learning_rate)
        model.train()
        for step in range(steps):
            batch = generate_infection_graphs(graphs_per_step, seed=seed * 100_003 + step + 1)
            node_logits, edge_logits = model(batch.nodes, batch.edges, batch.senders, batch.receivers)
            loss = (F.binary_cross_entropy_with_logits(node_logits, batch.sick_next)
                    + F.binary_cross_entropy_with_logits(edge_logits, batch.infecting))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        return model.eval()


@torch.no_grad()
def infection_accuracy(model: nn.Module, graphs: InfectionGraphs) -> tuple[float, float]:
    """Accuracy of the thresholded logits on nodes and on edges.

    Parameters
    ----------
    model : nn.Module
        The network.
    graphs : InfectionGraphs
        The graphs.

    Returns
    -------
    nodes, edges : float
        The node and the edge accuracy.
    """
    node_logits, edge_logits = model(graphs.nodes, graphs.edges, graphs.senders, graphs.receivers)
    nodes = ((node_logits > 0).float() == graphs.sick_next).float().mean().item()
    edges = ((edge_logits > 0).float() == graphs.infecting).float().mean().item()
    return nodes, edges


def explain_node(explain: nn.Module, graphs: InfectionGraphs, node: int) -> tuple[Tensor, Tensor]:
    """Relevance for "``node`` is sick next": per-node and per-edge relevance ``([n], [e])``.

    Starts from the node's logit (``R = logit`` at ``node``, 0 elsewhere) and sums the relevance
    of each node's and each edge's one-hot features. Indices carry no relevance, so only the
    feature tensors are leaves of the backward pass.

    Parameters
    ----------
    explain : nn.Module
        The converted network (``fxlrp.convert(model)``).
    graphs : InfectionGraphs
        The graphs.
    node : int
        The explained node.

    Returns
    -------
    node_relevance : Tensor
        ``[n]``.
    edge_relevance : Tensor
        ``[e]``.
    """
    nodes = graphs.nodes.detach().requires_grad_()
    edges = graphs.edges.detach().requires_grad_()
    with torch.enable_grad():
        node_logits, _ = explain(nodes, edges, graphs.senders, graphs.receivers)
        start = torch.zeros_like(node_logits)
        start[node] = node_logits[node].detach()
        node_relevance, edge_relevance = torch.autograd.grad(node_logits, (nodes, edges), start)
    return node_relevance.sum(dim=1), edge_relevance.sum(dim=1)


def newly_infected(graphs: InfectionGraphs) -> Tensor:
    """Indices of healthy nodes that a sick node infects in this step.

    Parameters
    ----------
    graphs : InfectionGraphs
        The graphs.

    Returns
    -------
    Tensor
        The nodes' indices.
    """
    return ((graphs.nodes[:, 0] == 1) & (graphs.sick_next == 1)).nonzero().flatten()
