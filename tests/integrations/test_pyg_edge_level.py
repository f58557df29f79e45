"""Edge-level tasks (link prediction) through PyG's Explainer: LRP-0 against gradient x input.

The explained output is the score of node pairs ``edge_label_index``: a GraphConv encoder and a
decoder on the pair's embeddings. With a piecewise-linear decoder (an MLP on ``[z_s, z_t]``)
LRP-0 is gradient x input, for node features and, through GraphConv's ``w_e * x_j`` messages,
for edges (``w * df/dw`` at ``w = 1``). A dot-product decoder ``z_s . z_t`` is a product of two
relevance-carrying factors, which get equal halves (AttnLRP's uniform rule): LRP-0 is then
exactly half of gradient x input (the encoder's backward is linear in the relevance it gets,
and each factor's gradient x input is the whole product).
"""

from __future__ import annotations

import pytest
import torch
from support.pyg_networks import LinkPredictor, random_graph, references
from torch_geometric.explain import Explainer

import fxlrp
from fxlrp.integrations.pyg import LRPExplainer


def explain(model, x, edge_index, pairs, mode, **call):
    explainer = Explainer(model, algorithm=LRPExplainer(fxlrp.rules.Epsilon(0.0)), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode=mode, task_level="edge", return_type="raw"))
    return explainer(x, edge_index, edge_label_index=pairs, **call)


@pytest.mark.parametrize("decoder, share", [("mlp", 1.0), ("dot", 0.5)])
def test_binary_link_scores(decoder, share):
    torch.manual_seed(0)
    x, edge_index = random_graph(10, 30)
    pairs = torch.randint(0, 10, (2, 6), generator=torch.Generator().manual_seed(1))
    model = LinkPredictor(decoder).double().eval()
    rows = torch.tensor([1, 4])
    score = model(x, edge_index, pairs)
    sign = torch.where(score > 0, 1.0, -1.0).double()  # binary: +-logit by the predicted class
    explanation = explain(model, x, edge_index, pairs, "binary_classification", index=rows)
    node, edge = references(model, x, edge_index, pairs, lambda out: (sign * out)[rows].sum())
    assert explanation.node_mask.shape == (10, 5) and explanation.edge_mask.shape == (30,)
    torch.testing.assert_close(explanation.node_mask, share * node, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(explanation.edge_mask, share * edge, rtol=1e-10, atol=1e-12)
    assert explanation.node_mask.abs().sum() > 0 and explanation.edge_mask.abs().sum() > 0


def test_multiclass_pair_phenomenon():
    torch.manual_seed(2)
    x, edge_index = random_graph(9, 25, seed=3)
    pairs = torch.randint(0, 9, (2, 5), generator=torch.Generator().manual_seed(4))
    model = LinkPredictor("mlp", classes=3).double().eval()
    target = torch.tensor([2, 0, 1, 1, 0])
    explainer = Explainer(model, algorithm=LRPExplainer(fxlrp.rules.Epsilon(0.0)), explanation_type="phenomenon",
                          node_mask_type="object", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="edge",
                                            return_type="raw"))
    explanation = explainer(x, edge_index, edge_label_index=pairs, target=target, index=3)
    node, edge = references(model, x, edge_index, pairs, lambda out: out[3, target[3]])
    torch.testing.assert_close(explanation.node_mask, node.sum(dim=-1, keepdim=True), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(explanation.edge_mask, edge, rtol=1e-10, atol=1e-12)
