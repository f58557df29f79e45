"""Heterogeneous graphs through PyG's Explainer: ``HeteroExplanation`` with node masks per node
type and edge masks per edge type.

Piecewise-linear models (``to_hetero`` of SAGEConv/GraphConv, ``HeteroConv``): LRP-0 equals
gradient x input in float64, for node features and, through GraphConv's ``w_e * x_j`` messages,
for each edge type's edges (``w * df/dw`` at ``w = 1``). ``HGTConv`` (attention with a softmax,
GELU, a sigmoid-gated skip) is not piecewise linear, so no gradient identity holds: it is checked
for conservation (bias-free, LRP-0 with attention as constants: node masks of all types sum to
the logit), finite masks, and, for its edge masks (one message-passing call over all edge types
at once, split back by edge type), zero relevance exactly on the edges outside the explained
node's receptive field, found by brute force.
"""

from __future__ import annotations

import pytest
import torch
from support.pyg_hetero import CITES, HGT, WRITES, WRITTEN, ToHetero, WithHeteroConv
from torch_geometric.data import HeteroData
from torch_geometric.explain import Explainer, HeteroExplanation

import fxlrp
from fxlrp.integrations.pyg import LRPExplainer, with_cp_lrp

LRP0 = fxlrp.rules.Epsilon(0.0)


def small_graph(seed: int = 0) -> HeteroData:
    generator = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    data["author"].x = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    writes = torch.stack([torch.randint(0, 5, (12,), generator=generator),
                          torch.randint(0, 7, (12,), generator=generator)])
    data[WRITES].edge_index = writes
    data[CITES].edge_index = torch.randint(0, 7, (2, 10), generator=generator)
    data[WRITTEN].edge_index = writes.flip(0)
    return data


class WeightedToHetero(ToHetero):
    def __init__(self, metadata) -> None:
        super().__init__(metadata, weighted=True)

    def forward(self, x_dict, edge_index_dict, edge_weight_dict):
        return self.head(self.encoder(x_dict, edge_index_dict, edge_weight_dict)["paper"])


def explain(model, data, rows, **kwargs):
    explainer = Explainer(model, algorithm=LRPExplainer(kwargs.pop("composite", LRP0)), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
    return explainer(data.x_dict, data.edge_index_dict, index=rows, **kwargs)


def gradient_times_input(model, data, rows, weights=False):
    x = {node_type: value.detach().requires_grad_() for node_type, value in data.x_dict.items()}
    args = (x, data.edge_index_dict)
    weight = {edge_type: torch.ones(edges.size(1), dtype=torch.float64, requires_grad=True)
              for edge_type, edges in data.edge_index_dict.items()}
    output = model(*args, weight) if weights else model(*args)
    target = output.argmax(dim=-1)
    leaves = [*x.values(), *(weight.values() if weights else ())]
    gradients = torch.autograd.grad(output[rows, target[rows]].sum(), leaves, allow_unused=True)
    node = {t: value.detach() * g for (t, value), g in zip(x.items(), gradients, strict=False)}
    edge = dict(zip(weight, gradients[len(x):], strict=False)) if weights else None
    return node, edge


@pytest.mark.parametrize("make", [lambda data: ToHetero(data.metadata()), lambda data: WithHeteroConv()],
                         ids=["to_hetero", "HeteroConv"])
def test_lrp0_is_gradient_times_input(make):
    torch.manual_seed(0)
    data = small_graph()
    model = make(data).double()
    model(data.x_dict, data.edge_index_dict)  # lazy (-1) sizes
    model.eval()
    rows = torch.tensor([0, 3, 5])
    explanation = explain(model, data, rows)
    assert isinstance(explanation, HeteroExplanation)
    node, _ = gradient_times_input(model, data, rows)
    for node_type, reference in node.items():
        torch.testing.assert_close(explanation[node_type].node_mask, reference, rtol=1e-10, atol=1e-12)
    assert sum(explanation[t].node_mask.abs().sum() for t in node) > 0
    assert set(explanation.edge_mask_dict) == set(data.edge_types)
    for edge_type, edges in data.edge_index_dict.items():
        assert explanation[edge_type].edge_mask.shape == (edges.size(1),)


def test_edge_masks_per_edge_type_are_gradient_times_edge_weight():
    torch.manual_seed(1)
    data = small_graph(seed=2)
    ones = {edge_type: torch.ones(edges.size(1), dtype=torch.float64)
            for edge_type, edges in data.edge_index_dict.items()}
    model = WeightedToHetero(data.metadata()).double()
    model(data.x_dict, data.edge_index_dict, ones)
    model.eval()
    rows = torch.tensor([1, 2])
    explainer = Explainer(model, algorithm=LRPExplainer(LRP0), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
    explanation = explainer(data.x_dict, data.edge_index_dict, edge_weight_dict=ones, index=rows)
    node, edge = gradient_times_input(model, data, rows, weights=True)
    for node_type, reference in node.items():
        torch.testing.assert_close(explanation[node_type].node_mask, reference, rtol=1e-10, atol=1e-12)
    for edge_type, reference in edge.items():
        torch.testing.assert_close(explanation[edge_type].edge_mask, reference, rtol=1e-10, atol=1e-12)
    assert all(explanation[edge_type].edge_mask.abs().sum() > 0 for edge_type in edge)


def test_hgt_conservation_and_receptive_field():
    torch.manual_seed(3)
    data = small_graph(seed=4)
    model = HGT(data.metadata()).double()
    model(data.x_dict, data.edge_index_dict)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
    model.eval()
    paper = 2
    explanation = explain(model, data, torch.tensor([paper]), composite=with_cp_lrp(LRP0))
    logit = model(data.x_dict, data.edge_index_dict)[paper].max()
    total = sum(explanation[node_type].node_mask.sum() for node_type in data.node_types)
    torch.testing.assert_close(total, logit, rtol=1e-9, atol=1e-15)
    # receptive field: the explained paper (and, through the skip, itself) and the typed nodes
    # with an edge into it; layer 1 reaches only edges into those, layer 2 only edges into the paper
    receivers = {("paper", paper)}
    for edge_type, edges in data.edge_index_dict.items():
        if edge_type[-1] == "paper":
            receivers |= {(edge_type[0], int(j)) for j in edges[0, edges[1] == paper]}
    for edge_type, edges in data.edge_index_dict.items():
        mask = explanation[edge_type].edge_mask
        assert torch.isfinite(mask).all()
        inside = torch.tensor([(edge_type[-1], int(i)) in receivers for i in edges[1]])
        assert (mask[~inside] == 0).all()
        assert (mask[inside] != 0).all()


def test_forward_reused_across_nodes_of_a_hetero_graph():
    """The kept forward (keyed by each node and edge type's tensor) gives what a fresh one gives."""
    torch.manual_seed(5)
    data = small_graph(seed=6)
    model = ToHetero(data.metadata()).double()
    model(data.x_dict, data.edge_index_dict)
    model.eval()
    algorithm = LRPExplainer(LRP0)
    config = dict(explanation_type="model", node_mask_type="object", edge_mask_type="object",
                  model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
    reused = Explainer(model, algorithm=algorithm, **config)
    fresh = Explainer(model, algorithm=LRPExplainer(LRP0, reuse_forward=False), **config)
    for row in (0, 4, 6):
        kept = reused(data.x_dict, data.edge_index_dict, index=row)
        new = fresh(data.x_dict, data.edge_index_dict, index=row)
        for key in [*data.node_types, *data.edge_types]:
            for name in ("node_mask", "edge_mask"):
                if name in new[key]:
                    assert torch.equal(kept[key][name], new[key][name])
    assert algorithm._reuse._forward is not None
    first = algorithm._reuse._forward
    reused(data.x_dict, data.edge_index_dict, index=1)
    assert algorithm._reuse._forward is first
