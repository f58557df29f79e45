"""Top-10 relevant walks of a 3-layer GCN on a generated 10,000-node, 100,000-edge graph, beside
one plain explanation of the same node (forward + backward, node relevance).

    python benchmarks/relevant_walks.py                    # 10,000 nodes, 100,000 edges, 2 threads
    python benchmarks/relevant_walks.py --nodes 2000 --edges 20000 --repeats 3

Random weights (eval mode), float32, PyG's ``GCNConv`` (self-loops, symmetric normalisation),
ReLU between layers, a linear head; ``edges / 2`` node pairs drawn uniformly at random, each
made an edge in both directions. Times are medians of ``--repeats`` runs taking turns, each a
fresh forward; the ratio is also given per repeat. Also printed: the step-backward passes of
the search and the walks it scored, and with ``--enumerate`` the full enumeration of the walks
ending at the node and how many of its top 10 the search found.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fxlrp  # noqa: E402
from fxlrp.integrations.pyg import graph_relevance  # noqa: E402
from fxlrp.integrations.pyg.walk_graph import walk_graph  # noqa: E402
from fxlrp.integrations.pyg.walk_search import search_walks  # noqa: E402
from fxlrp.integrations.pyg.walks import DEFAULT_BEAM, relevant_walks  # noqa: E402


class GCN(nn.Module):
    def __init__(self, features: int, width: int, classes: int, depth: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        widths = [features] + [width] * depth
        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.head(x)


def graph(nodes: int, edges: int, features: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=generator)
    pairs = torch.randint(0, nodes, (2, edges // 2), generator=generator)
    pairs = pairs[:, pairs[0] != pairs[1]]
    edge_index = torch.cat([pairs, pairs.flip(0)], dim=1)
    return x, edge_index


def interleaved_seconds(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each run per repeat, the runs taking turns (a shared machine's load hits all)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--edges", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--beam", type=int, default=None, help="suffixes kept per step (default: the library's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--enumerate", action="store_true", help="also enumerate every walk (slow) and compare")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    torch.manual_seed(0)
    model = GCN(arguments.features, arguments.width, classes=4).eval()
    x, edge_index = graph(arguments.nodes, arguments.edges, arguments.features)
    node = 0
    explain = fxlrp.convert(model)
    output = explain(x, edge_index).detach()
    target = int(output[node].argmax())
    start = torch.zeros_like(output)
    start[node, target] = output[node, target]
    beam = arguments.beam if arguments.beam is not None else max(DEFAULT_BEAM, 16 * arguments.top_k)

    def plain() -> Tensor:
        return fxlrp.attribute(explain, (x, edge_index), start)[0]

    def with_edges() -> Tensor:
        return graph_relevance(explain, x, edge_index, target=target, index=node).edge

    def walks() -> tuple[Tensor, Tensor]:
        return relevant_walks(explain, x, edge_index, index=node, target=target, top_k=arguments.top_k, beam=beam)

    plain(), with_edges(), walks()  # warm-up
    times = interleaved_seconds({"plain": plain, "edges": with_edges, "walks": walks}, arguments.repeats)
    plain_seconds, edge_seconds, walk_seconds = (statistics.median(times[name]) for name in ("plain", "edges", "walks"))
    ratios = [walk / plain for walk, plain in zip(times["walks"], times["plain"], strict=True)]
    found, relevance = walks()
    degree = torch.bincount(edge_index[1], minlength=arguments.nodes).double() + 1  # with the self-loop
    print(f"graph: {arguments.nodes} nodes, {edge_index.size(1)} directed edges (mean in-degree "
          f"{degree.mean() - 1:.1f}); 3 x GCNConv({arguments.width}), float32, {arguments.threads} threads; "
          f"node {node} (in-degree {int(degree[node]) - 1})")
    print(f"plain explanation (fxlrp.attribute: forward + backward): {plain_seconds * 1e3:.1f} ms")
    print(f"graph_relevance (node and edge relevance):             {edge_seconds * 1e3:.1f} ms")
    print(f"top-{arguments.top_k} walks (relevant_walks, beam {beam}):            {walk_seconds * 1e3:.1f} ms")
    print(f"ratio top-{arguments.top_k} walks / plain explanation: {walk_seconds / plain_seconds:.1f}x (per repeat: "
          f"{', '.join(f'{ratio:.1f}' for ratio in ratios)}; median {statistics.median(ratios):.1f}x)")
    search = walk_graph(explain, x, edge_index, index=node, target=target, check=False)
    suffixes = search_walks(search, beam, True)[0]
    print(f"step-backward passes of the search: {search.passes} (+{len(model.convs)} for the decomposition check); "
          f"walks scored: {suffixes.size(0)}")
    for walk, value in zip(found.tolist(), relevance.tolist(), strict=True):
        print(f"  {' -> '.join(map(str, walk))}: {value:+.4g}")
    if arguments.enumerate:
        start = time.perf_counter()
        every, values = relevant_walks(explain, x, edge_index, index=node, target=target)
        seconds = time.perf_counter() - start
        best = set(map(tuple, every[: arguments.top_k].tolist()))
        hits = len(best & set(map(tuple, found.tolist())))
        print(f"full enumeration: {every.size(0)} walks with non-zero relevance in {seconds * 1e3:.0f} ms; "
              f"{hits} of its top {arguments.top_k} found by the beam search")


if __name__ == "__main__":
    main()
