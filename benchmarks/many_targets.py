"""Many outputs of one input: ``fxlrp.attribute(..., target=[t1, ..., tk])`` against k separate
explanations, same process, same run.

- **Graph**: the predicted class of 1,000 nodes of a two-layer PyG GCN (``GCNConv``, 64 -> 64 -> 8
  features) on a generated graph of 10,000 nodes and 100,000 edges: 1,000 separate
  ``fxlrp.attribute`` calls (a forward and a backward pass each), one call with the 1,000 nodes
  as a list of targets (one forward pass kept for 1,000 backward passes), and PyG's ``Explainer``
  with ``LRPExplainer(reuse_forward=True)`` called once per node (its reused forward; node masks
  only). The relevance of the list call is checked against the separate calls.
- **Image**: the 10 classes of one image for a torchvision ResNet-18 (random weights, 3x64x64):
  10 separate calls, the list (one forward, 10 backward passes) and ``repeat=10`` (the image
  repeated 10 times: one forward and one backward pass over a batch of 10).

Run: ``python -m benchmarks.many_targets [--nodes 1000] [--threads 2]``; prints a table of
seconds and speed-ups.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import fxlrp


def timed(works: list[Callable[[], Any]], repeats: int) -> list[tuple[float, Any]]:
    """Median seconds of each work over ``repeats`` rounds, interleaved (a busy machine slows all
    alike), and each work's last result."""
    times: list[list[float]] = [[] for _ in works]
    results: list[Any] = [None] * len(works)
    for _ in range(repeats):
        for index, work in enumerate(works):
            start = time.perf_counter()
            results[index] = work()
            times[index].append(time.perf_counter() - start)
    return [(statistics.median(spent), result) for spent, result in zip(times, results, strict=True)]


class PygGCN(nn.Module):
    """Two ``GCNConv`` layers with a ReLU between them: node classification logits."""

    def __init__(self, features: int = 64, hidden: int = 64, classes: int = 8) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.first = GCNConv(features, hidden)
        self.second = GCNConv(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.second(self.first(x, edge_index).relu(), edge_index)


def graph(nodes: int, edges: int, explained: int, repeats: int) -> list[tuple[str, float, str]]:
    """Seconds of each way to explain ``explained`` nodes, with a note."""
    from torch_geometric.explain import Explainer

    from fxlrp.integrations.pyg import LRPExplainer

    torch.manual_seed(0)
    x = torch.randn(nodes, 64)
    edge_index = torch.randint(0, nodes, (2, edges))
    model = PygGCN().eval()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    with torch.no_grad():
        predicted = model(x, edge_index).argmax(dim=1)
    targets = torch.randperm(nodes)[:explained].tolist()

    def score(logits: Tensor) -> Tensor:  # each node's logit of its predicted class: a score per node
        return logits.gather(1, predicted[:, None]).squeeze(1)

    pyg = Explainer(model, algorithm=LRPExplainer(fxlrp.composites.EpsilonPlusFlat(), reuse_forward=True),
                    explanation_type="model", node_mask_type="attributes", edge_mask_type=None,
                    model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
    (separate_time, separate), (together_time, together), (pyg_time, masks) = timed([
        lambda: torch.stack([fxlrp.attribute(explain, [x, edge_index], target=node, output=score)[0]
                             for node in targets]),
        lambda: fxlrp.attribute(explain, [x, edge_index], target=targets, output=score)[0],
        lambda: torch.stack([pyg(x, edge_index, index=node).node_mask for node in targets]),
    ], repeats)
    difference = float((together - separate).abs().max() / separate.abs().max())
    pyg_difference = float((masks - separate).abs().max() / separate.abs().max())
    return [
        (f"{explained} separate fxlrp.attribute calls", separate_time, "a forward and a backward pass each"),
        (f"fxlrp.attribute(target=[{explained} nodes])", together_time,
         f"one forward, {explained} backward passes; max relative difference {difference:.1e}"),
        (f"PyG Explainer + LRPExplainer(reuse_forward=True), {explained} calls", pyg_time,
         f"max relative difference {pyg_difference:.1e}"),
    ]


def image(repeats: int, classes: int = 10) -> list[tuple[str, float, str]]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes).eval()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    picture = torch.randn(1, 3, 64, 64)
    targets = list(range(classes))
    fxlrp.attribute(explain, picture, target=0)  # warm-up
    (separate_time, separate), (together_time, together), (repeat_time, repeated) = timed([
        lambda: torch.stack([fxlrp.attribute(explain, picture, target=target) for target in targets]),
        lambda: fxlrp.attribute(explain, picture, target=targets),
        lambda: fxlrp.attribute(explain, picture, target=targets, repeat=classes),
    ], repeats)
    scale = separate.abs().max()
    return [
        (f"{classes} separate fxlrp.attribute calls", separate_time, ""),
        (f"fxlrp.attribute(target=[{classes} classes])", together_time,
         f"one forward, {classes} backward passes; max relative difference "
         f"{float((together - separate).abs().max() / scale):.1e}"),
        (f"fxlrp.attribute(target=[{classes} classes], repeat={classes})", repeat_time,
         f"one pass over a batch of {classes}; max relative difference "
         f"{float((repeated - separate).abs().max() / scale):.1e}"),
    ]


def table(title: str, rows: list[tuple[str, float, str]]) -> str:
    baseline = rows[0][1]
    lines = [f"### {title}", "", "| method | seconds | speed-up | note |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {time_:.2f} | {baseline / time_:.2f}x | {note} |" for name, time_, note in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help="explained nodes (default 1000)")
    parser.add_argument("--graph-nodes", type=int, default=10_000, help="nodes of the graph (default 10000)")
    parser.add_argument("--edges", type=int, default=100_000, help="edges of the graph (default 100000)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds of the graph, median (default 1)")
    parser.add_argument("--image-repeats", type=int, default=5, help="the same for the image (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, CPU; medians of interleaved rounds")
    print(table(f"GCN, {args.graph_nodes} nodes, {args.edges} edges: relevance of {args.nodes} nodes' predicted "
                f"classes (EpsilonPlusFlat; {args.repeats} round(s))",
                graph(args.graph_nodes, args.edges, args.nodes, args.repeats)))
    print()
    print(table(f"ResNet-18, one 3x64x64 image: relevance of its 10 classes (EpsilonPlusFlat; {args.image_repeats} "
                f"rounds)", image(args.image_repeats)))


if __name__ == "__main__":
    main()
