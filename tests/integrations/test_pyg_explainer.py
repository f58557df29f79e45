"""fxlrp.integrations.pyg.LRPExplainer through PyG's Explainer API, and PyG without torch_scatter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from support.pyg_networks import Stack, random_graph
from torch_geometric.explain import Explainer, Explanation
from torch_geometric.explain.metric import characterization_score, fidelity, unfaithfulness

from fxlrp.integrations.pyg import LRPExplainer, with_cp_lrp

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_explainer(model, task_level, mode="multiclass_classification", node_mask_type="attributes",
                   explanation_type="model", composite=None):
    return Explainer(model, algorithm=LRPExplainer(composite), explanation_type=explanation_type,
                     node_mask_type=node_mask_type, edge_mask_type="object",
                     model_config=dict(mode=mode, task_level=task_level, return_type="raw"))


@pytest.mark.parametrize("node_mask_type", ["object", "attributes", "common_attributes"])
def test_node_level_classification(node_mask_type):
    torch.manual_seed(0)
    x, edge_index = random_graph(15, 45, dtype=torch.float32)
    model = Stack("gcn", bias=False).eval()
    explainer = make_explainer(model, "node", node_mask_type=node_mask_type)
    explanation = explainer(x, edge_index, index=3)
    assert isinstance(explanation, Explanation)
    expected = {"object": (15, 1), "attributes": (15, 5), "common_attributes": (1, 5)}[node_mask_type]
    assert explanation.node_mask.shape == expected and explanation.edge_mask.shape == (45,)
    # relevance of the explained logit is distributed (bias-free: conserved up to epsilon)
    logit = model(x, edge_index)[3].max()
    torch.testing.assert_close(explanation.node_mask.sum(), logit, rtol=1e-3, atol=1e-4)
    positive, negative = fidelity(explainer, explanation)
    assert 0.0 <= positive <= 1.0 and 0.0 <= negative <= 1.0
    assert 0.0 <= unfaithfulness(explainer, explanation) <= 1.0
    assert 0.0 <= characterization_score(torch.tensor([positive]), torch.tensor([negative])) <= 1.0


def test_graph_level_phenomenon_and_regression():
    torch.manual_seed(1)
    x, edges_a = random_graph(6, 15, seed=1, dtype=torch.float32)
    x_b, edges_b = random_graph(6, 15, seed=2, dtype=torch.float32)
    x, edge_index = torch.cat([x, x_b]), torch.cat([edges_a, edges_b + 6], dim=1)
    batch = torch.tensor([0] * 6 + [1] * 6)
    model = Stack("sage_max", pool="mean", bias=False).eval()
    explainer = make_explainer(model, "graph", explanation_type="phenomenon")
    target = torch.tensor([2, 0])
    explanation = explainer(x, edge_index, target=target, index=1, batch=batch)
    assert explanation.node_mask[:6].abs().sum() == 0  # graph 0 is not explained
    torch.testing.assert_close(explanation.node_mask.sum(), model(x, edge_index, batch)[1, 0],
                               rtol=1e-3, atol=1e-4)
    regression = Stack("gat", classes=1, pool="add").eval()
    explainer = make_explainer(regression, "graph", mode="regression", composite=with_cp_lrp())
    explanation = explainer(x, edge_index, batch=batch)
    assert explanation.node_mask.shape == (12, 5) and torch.isfinite(explanation.edge_mask).all()
    assert explanation.node_mask.abs().sum() > 0


@pytest.mark.slow  # (a fresh interpreter that hides torch_scatter: ~10 s of imports)
def test_without_torch_scatter():
    """PyG falls back to native scatter_add_/scatter_reduce_; LRP-0 still equals gradient x input."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch_scatter"] = None  # import torch_scatter now fails
        sys.path.insert(0, {TESTS!r})
        import torch, torch_geometric.typing
        assert not torch_geometric.typing.WITH_TORCH_SCATTER
        import fxlrp
        from fxlrp.integrations.pyg import graph_relevance
        from support.pyg_networks import Stack, random_graph, gradient_times_input
        for layer, pool in (("sage_max", "max"), ("gcn", "mean"), ("graphconv_max", "add")):
            model = Stack(layer, pool=pool).double().eval()
            explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))
            for nodes in (9, 17):
                x, edge_index = random_graph(nodes, 3 * nodes, seed=nodes)
                batch = torch.zeros(nodes, dtype=torch.long)
                out = model(x, edge_index, batch)
                target = out.argmax(-1)
                relevance = graph_relevance(explain, x, edge_index, target=target, batch=batch)
                reference = gradient_times_input(model, [x], (edge_index, batch), {{}}, torch.tensor([0]), target)[0]
                torch.testing.assert_close(relevance.node, reference, rtol=1e-10, atol=1e-12)
        assert "torch_scatter" not in {{m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}}
        print("ok")
    """)
    root = os.path.dirname(TESTS)
    environment = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
