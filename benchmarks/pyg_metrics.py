"""Explanation metrics side by side: fxlrp's LRPExplainer and PyG's explainers on the same models.

Four synthetic benchmarks, all generated locally with PyG's ``ExplainerDataset`` (no download):

- BA-Shapes: ``BAGraph(300, 5)`` + 80 house motifs (node classes: base, house top, middle, bottom);
- Tree-Cycles: ``TreeGraph(8)`` (511 nodes) + 60 6-cycles (node classes: base, cycle);
- Tree-Grid: ``TreeGraph(8)`` + 80 3x3 grids (node classes: base, grid);
- BA-2Motifs (graph classification): 200 graphs ``BAGraph(20, 1)`` + a house (class 0) and 200
  with a 5-cycle (class 1).

Node features are constant (node level) or one-hot degrees (BA-2Motifs: with constant features
the GCN stayed at chance); the evidence is structural. A 3-layer GCN is trained on each (node
level: its layers' outputs concatenated, then a linear classifier, 1000 epochs, Tree-Grid 2000;
graph level: GCN, mean pool, linear, 150 full-batch epochs). Every method explains the same
trained model and the same nodes (graphs) of the test split, motif nodes for node level, with
``explanation_type="phenomenon"`` and the model's prediction as target (PGExplainer supports no
other; with the prediction as target PyG's fidelity is the "model" fidelity),
``node_mask_type=None``, ``edge_mask_type="object"``:

- fxlrp ``LRPExplainer()`` (epsilon 1e-6), its edge mask (relevance, signed) scored by magnitude
  ``|R|`` and, in a row of its own, as given; and ``LRPExplainer(Gamma(0.25))`` by magnitude;
- fxlrp relevant walks (``relevant_walks``, default composite): each edge scored by the summed
  ``|R(w)|`` of the walks with a hop along it, over every walk (enumeration is cheap on these
  3-layer models and fields) and over the 25 walks of largest ``|R(w)|``;
- ``GNNExplainer(epochs=100)``; ``PGExplainer(epochs=20)`` (trained beforehand on 30 training
  nodes/graphs, the training time reported apart); ``GraphMaskExplainer(3, epochs=30)``;
  ``CaptumExplainer("IntegratedGradients")`` (50 steps) and ``CaptumExplainer("Saliency")``.

Metrics, per benchmark and method:

- edge AUROC: the soft edge mask against the ground-truth motif edges, over the edges of each
  explained node's 3-hop receptive field (graph level: all edges of the graph), pooled over the
  explained instances (scikit-learn's ``roc_auc_score``);
- fidelity+ / fidelity- (``torch_geometric.explain.metric.fidelity``), characterization score
  (``characterization_score`` of the mean fidelities) and unfaithfulness (``unfaithfulness``,
  1 - exp(-KL)), on *hard* masks: each explanation keeps its top-k edges, k the number of
  ground-truth edges in the receptive field (the same k for every method; masks that are scores
  of arbitrary scale, as relevance or gradients, are not soft masks);
- seconds per explanation: the median over the explained instances of the ``Explainer`` call
  (the target, the model's prediction, computed before; fxlrp's conversion is in the first call).

Fidelity and unfaithfulness are computed with a pristine copy of the model (GraphMask leaves its
own ``explain_message`` on the layers it explained). Each method gets its own copy.

Run: ``python benchmarks/pyg_metrics.py`` (a few minutes on 2 CPU cores); ``--markdown`` prints
the table for docs/pyg.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from sklearn.metrics import roc_auc_score
from torch import nn
from torch_geometric.datasets import ExplainerDataset
from torch_geometric.datasets.graph_generator import BAGraph, TreeGraph
from torch_geometric.datasets.motif_generator import CycleMotif, GridMotif, HouseMotif
from torch_geometric.explain import Explainer, Explanation
from torch_geometric.explain.algorithm import (
    CaptumExplainer,
    DummyExplainer,
    GNNExplainer,
    GraphMaskExplainer,
    PGExplainer,
)
from torch_geometric.explain.metric import characterization_score, fidelity, unfaithfulness
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool
from torch_geometric.utils import k_hop_subgraph

import fxlrp
from fxlrp.integrations.pyg import LRPExplainer, relevant_walks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from examples.ba_shapes import GCN  # noqa: E402  (the node-level model of the BA-Shapes example)

LAYERS = 3
GNN_EXPLAINER_EPOCHS, PG_EPOCHS, PG_TRAINING_INSTANCES, GRAPHMASK_EPOCHS = 100, 20, 30, 30
TOP_WALKS = 25


class GraphGCN(nn.Module):
    def __init__(self, features: int, width: int, classes: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList([GCNConv(features, width), GCNConv(width, width), GCNConv(width, width)])
        self.classify = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.classify(global_mean_pool(x, batch))


@dataclass
class Benchmark:
    name: str
    level: str
    model: nn.Module
    accuracy: float
    train_seconds: float
    explained: list  # node ids (node level) or Data objects (graph level)
    training: list  # for PGExplainer
    data: object = None
    rows: dict = field(default_factory=dict)


def split(data, seed: int) -> None:
    order = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(seed))
    data.train_mask = torch.zeros(data.num_nodes, dtype=torch.bool)
    data.train_mask[order[: int(0.8 * data.num_nodes)]] = True
    data.test_mask = ~data.train_mask


def node_benchmark(name: str, graph, motif, motifs: int, epochs: int, explained: int, seed: int,
                   binary: bool = False) -> Benchmark:
    torch.manual_seed(seed)
    np.random.seed(seed)  # PyG's Barabasi-Albert generator draws with numpy
    data = ExplainerDataset(graph_generator=graph, motif_generator=motif, num_motifs=motifs,
                            transform=T.Constant())[0]
    if binary:
        data.y = (data.y > 0).long()
    split(data, seed)
    model = GCN(data.num_features, 20, int(data.y.max()) + 1)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        optimiser.zero_grad()
        F.cross_entropy(model(data.x, data.edge_index)[data.train_mask], data.y[data.train_mask]).backward()
        optimiser.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        predicted = model(data.x, data.edge_index).argmax(dim=-1)
    accuracy = float((predicted[data.test_mask] == data.y[data.test_mask]).float().mean())
    motif_test = torch.nonzero(data.test_mask & (data.y > 0)).view(-1)
    motif_train = torch.nonzero(data.train_mask & (data.y > 0)).view(-1)
    nodes = motif_test[torch.linspace(0, motif_test.numel() - 1, explained).long()].tolist()
    training = motif_train[torch.randperm(motif_train.numel())[:PG_TRAINING_INSTANCES]].tolist()
    return Benchmark(name, "node", model, accuracy, seconds, nodes, training, data)


def ba_2motifs(graphs: int, epochs: int, explained: int, seed: int) -> Benchmark:
    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = []
    for label, motif in ((0, HouseMotif()), (1, CycleMotif(5))):
        # one-hot degrees: with constant features this GCN stays at chance (normalised aggregation)
        generated = ExplainerDataset(graph_generator=BAGraph(20, 1), motif_generator=motif, num_motifs=1,
                                     num_graphs=graphs, transform=T.OneHotDegree(24))
        for data in generated:
            data.y = torch.tensor([label])
            dataset.append(data)
    order = torch.randperm(len(dataset)).tolist()
    train_set = [dataset[i] for i in order[: int(0.8 * len(dataset))]]
    test_set = [dataset[i] for i in order[int(0.8 * len(dataset)):]]
    model = GraphGCN(dataset[0].num_features, 20, 2)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.005)
    everything = next(iter(DataLoader(train_set, batch_size=len(train_set))))
    start = time.perf_counter()
    for _ in range(epochs):  # full batch
        model.train()
        optimiser.zero_grad()
        F.cross_entropy(model(everything.x, everything.edge_index, everything.batch), everything.y).backward()
        optimiser.step()
    seconds = time.perf_counter() - start
    model.eval()
    test = next(iter(DataLoader(test_set, batch_size=len(test_set))))
    with torch.no_grad():
        accuracy = float((model(test.x, test.edge_index, test.batch).argmax(dim=-1) == test.y).float().mean())
    return Benchmark("BA-2Motifs", "graph", model, accuracy, seconds, test_set[:explained],
                     train_set[:PG_TRAINING_INSTANCES])


class SignedLRP(LRPExplainer):
    """fxlrp's edge relevance as given (signed)."""


class MagnitudeLRP(LRPExplainer):
    """fxlrp's edge relevance scored by magnitude |R|: edges that carry evidence of either sign."""

    def forward(self, model, x, edge_index, **kwargs) -> Explanation:
        explanation = super().forward(model, x, edge_index, **kwargs)
        explanation.edge_mask = explanation.edge_mask.abs()
        return explanation


class WalkMask(LRPExplainer):
    """An edge mask from relevant walks (GNN-LRP): each edge scored by the summed magnitude
    ``sum |R(w)|`` of the walks that pass along it (a hop ``j_t -> j_{t+1}`` between two nodes;
    steps that stay at a node are self-loops and root terms, no edge), over every walk
    (``top_k=None``) or over the ``top_k`` walks of largest magnitude (the ``top_k`` most positive
    and the ``top_k`` most negative found, the ``top_k`` largest of those kept)."""

    def __init__(self, composite=None, *, top_k: int | None = None) -> None:
        super().__init__(composite)
        self.top_k = top_k

    def forward(self, model, x, edge_index, *, target, index=None, **kwargs) -> Explanation:
        explain = self.explainer_for(model)
        index = int(torch.as_tensor(index).view(-1)[0])
        explained = int(target.view(-1)[index])
        search = dict(index=index, target=explained, top_k=self.top_k, **kwargs)
        walks, relevance = relevant_walks(explain, x, edge_index, **search)
        if self.top_k is not None:
            negative, negative_relevance = relevant_walks(explain, x, edge_index, largest=False, **search)
            walks, relevance = torch.cat([walks, negative]), torch.cat([relevance, negative_relevance])
            strongest = relevance.abs().topk(min(self.top_k, relevance.numel())).indices
            walks, relevance = walks[strongest], relevance[strongest]
        return Explanation(edge_mask=walk_edge_mask(walks, relevance, edge_index, x.size(0)))


def walk_edge_mask(walks: torch.Tensor, relevance: torch.Tensor, edge_index: torch.Tensor, nodes: int) -> torch.Tensor:
    """``[E]``: for each edge, the summed ``|R(w)|`` of the walks with a hop along it (edges with
    the same pair each get the whole sum)."""
    senders, receivers = walks[:, :-1].reshape(-1), walks[:, 1:].reshape(-1)
    weights = relevance.abs().repeat_interleave(walks.size(1) - 1)
    hop = (senders >= 0) & (receivers >= 0) & (senders != receivers)  # -1: the walk has left for the output
    keys = senders[hop] * nodes + receivers[hop]
    edge_keys = edge_index[0] * nodes + edge_index[1]
    per_pair = torch.zeros(nodes * nodes, dtype=relevance.dtype).index_add_(0, keys, weights[hop])
    return per_pair[edge_keys]


METHODS = {
    "fxlrp LRP, \\|R\\|": lambda benchmark: MagnitudeLRP(),
    "fxlrp LRP, R signed": lambda benchmark: SignedLRP(),
    "fxlrp LRP Gamma(0.25), \\|R\\|": lambda benchmark: MagnitudeLRP(fxlrp.rules.Gamma(0.25)),
    "fxlrp walks, all, sum \\|R(w)\\|": lambda benchmark: WalkMask(),
    f"fxlrp top-{TOP_WALKS} walks, sum \\|R(w)\\|": lambda benchmark: WalkMask(top_k=TOP_WALKS),
    f"GNNExplainer ({GNN_EXPLAINER_EPOCHS} ep.)": lambda benchmark: GNNExplainer(epochs=GNN_EXPLAINER_EPOCHS),
    f"PGExplainer ({PG_EPOCHS} ep.)": lambda benchmark: PGExplainer(epochs=PG_EPOCHS, lr=0.003),
    f"GraphMask ({GRAPHMASK_EPOCHS} ep.)": lambda benchmark: GraphMaskExplainer(LAYERS, epochs=GRAPHMASK_EPOCHS,
                                                                                log=False),
    "Captum IntegratedGradients": lambda benchmark: CaptumExplainer("IntegratedGradients"),
    "Captum Saliency": lambda benchmark: CaptumExplainer("Saliency"),
}


def make_explainer(benchmark: Benchmark, algorithm) -> Explainer:
    return Explainer(benchmark.model, algorithm=algorithm, explanation_type="phenomenon", node_mask_type=None,
                     edge_mask_type="object",
                     model_config=dict(mode="multiclass_classification", task_level=benchmark.level,
                                       return_type="raw"))


def instance(benchmark: Benchmark, item):
    """(x, edge_index, keywords, index, edges in the field, ground truth of those edges)."""
    if benchmark.level == "node":
        data = benchmark.data
        _, _, _, field_mask = k_hop_subgraph(item, LAYERS, data.edge_index, num_nodes=data.num_nodes)
        return data.x, data.edge_index, {}, item, field_mask, data.edge_mask[field_mask] > 0
    batch = torch.zeros(item.num_nodes, dtype=torch.long)
    every = torch.ones(item.edge_index.size(1), dtype=torch.bool)
    return item.x, item.edge_index, {"batch": batch}, 0, every, item.edge_mask > 0


def prediction(benchmark: Benchmark, x, edge_index, keywords) -> torch.Tensor:
    with torch.no_grad():
        return benchmark.model(x, edge_index, **keywords).argmax(dim=-1)


def train_pg(benchmark: Benchmark, explainer: Explainer) -> float:
    start = time.perf_counter()
    for epoch in range(PG_EPOCHS):
        for item in benchmark.training:
            x, edge_index, keywords, index, _, _ = instance(benchmark, item)
            target = prediction(benchmark, x, edge_index, keywords)
            explainer.algorithm.train(epoch, benchmark.model, x, edge_index, target=target, index=index, **keywords)
    return time.perf_counter() - start


def evaluate(benchmark: Benchmark, name: str, algorithm) -> dict:
    # a copy per method: explainers may leave state on the model (GraphMask's gates, masks)
    # Fidelity and unfaithfulness are judged on a pristine copy: GraphMask replaces the layers'
    # explain_message by its own, which would ignore the masks fidelity sets.
    judge = make_explainer(dataclasses.replace(benchmark, model=copy.deepcopy(benchmark.model)), DummyExplainer())
    benchmark = dataclasses.replace(benchmark, model=copy.deepcopy(benchmark.model))
    explainer = make_explainer(benchmark, algorithm)
    extra = {}
    if isinstance(algorithm, PGExplainer):
        extra["training_seconds"] = train_pg(benchmark, explainer)
    truths, scores, seconds, positive, negative, unfaithful = [], [], [], [], [], []
    for item in benchmark.explained:
        x, edge_index, keywords, index, field_mask, truth = instance(benchmark, item)
        target = prediction(benchmark, x, edge_index, keywords)
        start = time.perf_counter()
        explanation = explainer(x, edge_index, target=target, index=index, **keywords)
        seconds.append(time.perf_counter() - start)
        soft = explanation.edge_mask.detach().float()
        truths.append(truth)
        scores.append(soft[field_mask])
        # hard mask: the top-k edges of the field, k = the number of ground-truth edges there
        k = max(int(truth.sum()), 1)
        within = torch.full_like(soft, float("-inf"))
        within[field_mask] = soft[field_mask]
        hard = torch.zeros_like(soft)
        hard[within.topk(k).indices] = 1.0
        explanation.edge_mask = hard
        plus, minus = fidelity(judge, explanation)
        positive.append(plus)
        negative.append(minus)
        unfaithful.append(unfaithfulness(judge, explanation))
    truth, score = torch.cat(truths).numpy(), torch.cat(scores).numpy()
    plus, minus = float(np.mean(positive)), float(np.mean(negative))
    return dict(
        auroc=roc_auc_score(truth, score) if np.isfinite(score).all() else float("nan"),
        fidelity_plus=plus,
        fidelity_minus=minus,
        characterization=float(characterization_score(torch.tensor([plus]), torch.tensor([minus]))[0]),
        unfaithfulness=float(np.mean(unfaithful)),
        seconds=statistics.median(seconds),
        **extra,
    )


def markdown(benchmarks: list[Benchmark], machine: str, total: float) -> str:
    lines = [f"Machine: {machine}; whole run {total:.0f} s.", ""]
    for benchmark in benchmarks:
        count = len(benchmark.explained)
        what = "motif nodes of the test split" if benchmark.level == "node" else "test graphs"
        lines += [f"**{benchmark.name}** (GCN test accuracy {benchmark.accuracy:.3f}, trained in "
                  f"{benchmark.train_seconds:.1f} s; {count} {what} explained)", "",
                  "| method | edge AUROC | fidelity+ | fidelity- | characterization | unfaithfulness "
                  "| s / explanation |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, row in benchmark.rows.items():
            seconds = f"{row['seconds']:.4f}"
            if "training_seconds" in row:
                seconds += f" (+ {row['training_seconds']:.1f} s training)"
            lines.append(f"| {name} | {row['auroc']:.3f} | {row['fidelity_plus']:.3f} | {row['fidelity_minus']:.3f} | "
                         f"{row['characterization']:.3f} | {row['unfaithfulness']:.3f} | {seconds} |")
        lines.append("")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--explained", type=int, default=10, help="nodes (graphs) explained per benchmark")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="a subset of the methods")
    parser.add_argument("--markdown", action="store_true", help="print the markdown table for docs/pyg.md")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    began = time.perf_counter()
    n, seed = arguments.explained, arguments.seed
    benchmarks = [
        node_benchmark("BA-Shapes", BAGraph(300, 5), HouseMotif(), 80, 1000, n, seed),
        node_benchmark("Tree-Cycles", TreeGraph(8, undirected=True), CycleMotif(6), 60, 1000, n, seed),
        node_benchmark("Tree-Grid", TreeGraph(8, undirected=True), GridMotif(), 80, 2000, n, seed, binary=True),
        ba_2motifs(200, 150, n, seed),
    ]
    for benchmark in benchmarks:
        print(f"{benchmark.name}: test accuracy {benchmark.accuracy:.3f} ({benchmark.train_seconds:.1f} s)", flush=True)
        for name in arguments.methods:
            torch.manual_seed(seed)
            benchmark.rows[name] = row = evaluate(benchmark, name, METHODS[name](benchmark))
            print(f"  {name:<30} AUROC {row['auroc']:.3f}  fid+ {row['fidelity_plus']:.3f}  "
                  f"fid- {row['fidelity_minus']:.3f}  char {row['characterization']:.3f}  "
                  f"unf {row['unfaithfulness']:.3f}  {row['seconds']:.4f} s", flush=True)
    machine = (f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread, "
               f"torch {torch.__version__}")
    table = markdown(benchmarks, machine, time.perf_counter() - began)
    if arguments.markdown:
        print(table)


if __name__ == "__main__":
    main()
