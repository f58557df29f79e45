"""Who infects whom: relevance of nodes and edges in a scatter-based graph network.

Generated graphs (no download): each node is healthy, sick or immune, each directed edge a real
or a virtual contact. A node is sick after one step if it was sick, or healthy with a sick node
reaching it through a real edge. A one-round message-passing network written with torch_scatter
learns the task in seconds; fxlrp explains "node v gets sick" for newly infected nodes and draws
node and edge relevance on the graph. A good explanation puts positive relevance on a sick node
that reaches v by a real edge, and on that edge.

    python examples/infection_graph.py [--fast] [--out out/infection]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import fxlrp
from fxlrp.toys.infection import (
    NODE_STATES,
    InfectionNetwork,
    explain_node,
    generate_infection_graphs,
    infection_accuracy,
    newly_infected,
    train_infection_network,
)
from fxlrp.viz.graph_image import save_graph_relevance


def main(argv: list[str] | None = None) -> float:
    """Returns the share of explained nodes whose most relevant node is a sick node with a real
    edge to them (the node that actually infects them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer training steps and pictures (for CI)")
    parser.add_argument("--out", type=Path, default=Path("out/infection"))
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = train_infection_network(InfectionNetwork(), steps=40 if args.fast else 80, graphs_per_step=64)
    node_accuracy, edge_accuracy = infection_accuracy(model, generate_infection_graphs(200, seed=12345))
    print(f"node accuracy {node_accuracy:.1%}, edge accuracy {edge_accuracy:.1%}")

    explain = fxlrp.convert(model)
    print(explain.report())
    graphs = generate_infection_graphs(20, min_nodes=10, max_nodes=14, seed=2024)
    found, explained = 0, 0
    for index in range(20):
        graph = graphs.graph(index)
        states = [NODE_STATES[int(state)] for state in graph.nodes.argmax(dim=1)]
        for node in newly_infected(graph).tolist():
            node_relevance, edge_relevance = explain_node(explain, graph, node)
            top = int(node_relevance.argmax())
            infects = bool(((graph.senders == top) & (graph.receivers == node) & (graph.infecting == 1)).any())
            found, explained = found + infects, explained + 1
            if explained <= (2 if args.fast else 6):
                path = save_graph_relevance(
                    args.out / f"graph{index}_node{node}.png", graph.edge_index, node_relevance, edge_relevance,
                    labels={i: f"{i}\n{state[0].upper()}" for i, state in enumerate(states)}, highlight=[node],
                    dashed=(graph.edges[:, 1] == 1).tolist(),
                    title=f"why does node {node} get sick? (H healthy, S sick, I immune; dashed: virtual)")
                print(f"graph {index}, node {node}: most relevant node {top} ({states[top]}, "
                      f"{'infects it' if infects else 'does not infect it'}) -> {path}")
    share = found / max(explained, 1)
    print(f"{found} of {explained} explained nodes: the most relevant node is the one that infects them ({share:.0%})")
    return share


if __name__ == "__main__":
    main()
