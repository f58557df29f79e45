"""Attention layers (GAT, GATv2, TransformerConv): same outputs, finite non-zero relevance;
conservation on bias-free versions with attention as constants (CP-LRP)."""

from __future__ import annotations

import pytest
import torch
from support.pyg_networks import Stack, random_graph
from torch_geometric.nn.models import GAT

import fxlrp
from fxlrp.integrations.pyg import graph_relevance, with_cp_lrp

ATTENTION = ["gat", "gatv2", "transformer"]


@pytest.mark.parametrize("layer", ATTENTION)
@pytest.mark.parametrize("attention_as_constant", [False, True])
def test_outputs_and_relevance(layer, attention_as_constant):
    torch.manual_seed(0)
    x, edge_index = random_graph(13, 40)
    model = Stack(layer).double().eval()
    composite = with_cp_lrp() if attention_as_constant else None
    explain = fxlrp.convert(model, composite)
    torch.testing.assert_close(explain(x, edge_index), model(x, edge_index), rtol=0, atol=0)
    relevance = graph_relevance(explain, x, edge_index, index=torch.arange(13))
    assert torch.isfinite(relevance.node).all() and torch.isfinite(relevance.edge).all()
    assert relevance.node.abs().sum() > 0 and relevance.edge.abs().sum() > 0


@pytest.mark.parametrize("layer", ATTENTION)
def test_conservation_bias_free_with_attention_as_constants(layer):
    torch.manual_seed(1)
    x, edge_index = random_graph(12, 36)
    model = Stack(layer, bias=False).double().eval()
    explain = fxlrp.convert(model, with_cp_lrp(fxlrp.rules.Epsilon(0.0)))
    relevance = graph_relevance(explain, x, edge_index, index=torch.arange(12))
    explained = relevance.output.max(dim=-1).values.sum()
    torch.testing.assert_close(relevance.node.sum(), explained, rtol=1e-10, atol=1e-10)


def test_default_attention_rule_differs_from_constant_attention():
    """Relevance enters the attention logits by AttnLRP's rule unless CP-LRP is chosen."""
    torch.manual_seed(2)
    x, edge_index = random_graph(12, 36)
    model = Stack("gat", bias=False).double().eval()
    default = graph_relevance(fxlrp.convert(model, fxlrp.rules.Epsilon(0.0)), x, edge_index)
    constant = graph_relevance(fxlrp.convert(model, with_cp_lrp(fxlrp.rules.Epsilon(0.0))), x, edge_index)
    assert not torch.allclose(default.node, constant.node)


def test_pyg_gat_model():
    torch.manual_seed(3)
    x, edge_index = random_graph(12, 36)
    model = GAT(5, 8, num_layers=3, out_channels=3, heads=2).double().eval()
    explain = fxlrp.convert(model)
    torch.testing.assert_close(explain(x, edge_index), model(x, edge_index), rtol=0, atol=0)
    relevance = graph_relevance(explain, x, edge_index, index=torch.arange(12))
    assert torch.isfinite(relevance.node).all() and relevance.node.abs().sum() > 0
