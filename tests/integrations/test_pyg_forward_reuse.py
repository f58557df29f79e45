"""One forward for many explanations: LRPExplainer reuses the forward of the same inputs, and the
result for every node is identical to a fresh explanation; any change forces a new forward."""

from __future__ import annotations

import pytest
import torch
from support.pyg_networks import EdgeFeatureStack, Stack, gradient_times_input, random_graph
from torch import nn
from torch_geometric.explain import Explainer

import fxlrp
from fxlrp.integrations.pyg import LRPExplainer, with_cp_lrp
from fxlrp.integrations.pyg.forward_reuse import forward_key
from fxlrp.relevance.rule_function import reusable_graph
from fxlrp.rules import AlphaBeta, Epsilon, Gamma, ZPlus

NODES = [0, 3, 7, 9, 3]


def make_explainer(model, reuse_forward: bool, composite=None) -> Explainer:
    return Explainer(model, algorithm=LRPExplainer(composite, reuse_forward=reuse_forward),
                     explanation_type="model", node_mask_type="attributes", edge_mask_type="object",
                     model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))


def assert_identical(explanation, reference) -> None:
    assert torch.equal(explanation.node_mask, reference.node_mask)
    assert torch.equal(explanation.edge_mask, reference.edge_mask)


@pytest.mark.parametrize(("layer", "composite"), [
    ("gcn", None),
    ("gin", fxlrp.composites.EpsilonAlpha2Beta1()),
    ("sage_max", ZPlus()),
    ("gat", with_cp_lrp(Gamma(0.25))),
])
def test_reused_forward_equals_fresh_explanations(layer, composite):
    torch.manual_seed(0)
    x, edge_index = random_graph(14, 40)
    model = Stack(layer).double().eval()
    reused, fresh = make_explainer(model, True, composite), make_explainer(model, False, composite)
    forwards = set()
    for node in NODES:
        explanation = reused(x, edge_index, index=node)
        forwards.add(id(reused.algorithm._reuse._forward))
        assert_identical(explanation, fresh(x, edge_index, index=node))
        assert explanation.edge_mask.abs().sum() > 0
    assert len(forwards) == 1  # one forward served every node


@pytest.mark.parametrize("layer", ["gcn", "sage_mean", "graphconv_max"])
def test_reused_forward_keeps_lrp0_equal_to_gradient_times_input(layer):
    """Independent of fresh explanations: every node explained through one reused forward gets
    LRP-0 = gradient x input of its own logit (float64)."""
    torch.manual_seed(5)
    x, edge_index = random_graph(14, 40)
    model = Stack(layer).double().eval()
    explainer = make_explainer(model, True, Epsilon(0.0))
    target = model(x, edge_index).argmax(dim=-1)
    for node in NODES:
        rows = torch.tensor([node])
        (reference,) = gradient_times_input(model, [x], (edge_index,), {}, rows, target)
        explanation = explainer(x, edge_index, index=node)
        torch.testing.assert_close(explanation.node_mask, reference, rtol=1e-10, atol=1e-12)
        assert reference.abs().sum() > 0
    assert explainer.algorithm._reuse._forward is not None


def test_edge_features_reused():
    torch.manual_seed(1)
    x, edge_index = random_graph(10, 30)
    edge_attr = torch.randn(30, 3, dtype=torch.float64)
    model = EdgeFeatureStack().double().eval()
    reused, fresh = make_explainer(model, True), make_explainer(model, False)
    for node in NODES:
        assert_identical(reused(x, edge_index, index=node, edge_attr=edge_attr),
                         fresh(x, edge_index, index=node, edge_attr=edge_attr))


def test_changed_inputs_or_model_run_a_new_forward():
    torch.manual_seed(2)
    x, edge_index = random_graph(14, 40)
    model = Stack("gcn").double().eval()
    reused, fresh = make_explainer(model, True), make_explainer(model, False)
    before = reused(x, edge_index, index=3)
    kept = reused.algorithm._reuse._forward

    x.mul_(2.0).add_(0.5)  # same tensor, changed in place
    changed = reused(x, edge_index, index=3)
    assert reused.algorithm._reuse._forward is not kept
    assert_identical(changed, fresh(x, edge_index, index=3))
    assert not torch.equal(changed.node_mask, before.node_mask)

    edge_index[1, :5] = edge_index[1, 5:10].clone()  # edges rewired in place
    assert_identical(reused(x, edge_index, index=3), fresh(x, edge_index, index=3))

    kept = reused.algorithm._reuse._forward
    with torch.no_grad():
        model.convs[1].lin.weight.mul_(-1.5)  # the model changed in place (an optimiser step)
    changed = reused(x, edge_index, index=3)
    assert reused.algorithm._reuse._forward is not kept
    assert_identical(changed, fresh(x, edge_index, index=3))

    kept = reused.algorithm._reuse._forward
    assert_identical(reused(x.clone(), edge_index, index=3), fresh(x, edge_index, index=3))
    assert reused.algorithm._reuse._forward is not kept  # another tensor: not assumed equal

    reused(x, edge_index, index=3)
    replaced = model.convs[2].lin.weight.detach() * 0.5
    model.convs[2].lin.weight = nn.Parameter(replaced)  # replaced, not changed in place
    changed = reused(x, edge_index, index=3)
    assert_identical(changed, make_explainer(model, False)(x, edge_index, index=3))
    with torch.no_grad():  # the per-node backward needs no grad mode of its own
        assert_identical(reused(x, edge_index, index=5), fresh(x, edge_index, index=5))


def test_training_mode_and_other_keywords_are_not_reused():
    torch.manual_seed(3)
    x, edge_index = random_graph(12, 30)
    model = Stack("gcn", pool="add").double().eval()
    algorithm = LRPExplainer()
    explainer = Explainer(model, algorithm=algorithm, explanation_type="model", node_mask_type="object",
                          edge_mask_type="object",
                          model_config=dict(mode="regression", task_level="graph", return_type="raw"))
    batch = torch.zeros(12, dtype=torch.long)
    explainer(x, edge_index, batch=batch)
    assert algorithm._reuse._forward is not None
    explain = algorithm.explainer_for(model)
    assert forward_key(model, explain, x, edge_index, {"batch": batch, "size": 12}) is not None
    # a keyword that is neither a tensor nor a plain value: the call is not reused
    assert forward_key(model, explain, x, edge_index, {"batch": batch, "options": [12]}) is None
    algorithm.clear()
    assert algorithm._reuse._forward is None
    model.convs[0].train()  # dropout would draw anew: called outside PyG's Explainer (which sets eval)
    assert forward_key(model, explain, x, edge_index, {"batch": batch}) is None


class Convolutions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(2, 4, 3)
        self.second = nn.Conv2d(4, 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).relu()).relu().sum(dim=(2, 3))


@pytest.mark.parametrize("rule", [Epsilon(0.0), Epsilon(0.1), ZPlus(), AlphaBeta(2.0, 1.0), Gamma(0.25)])
def test_reusable_graph_goes_backward_many_times(rule):
    """The relevance Functions' own option: every backward pass of one reusable forward gives
    the relevance of a fresh forward, for rules that keep their output and rules that do not."""
    torch.manual_seed(4)
    model = Convolutions().double().eval()
    explain = fxlrp.convert(model, rule)
    explain.keep_to_relevance_form()  # attribute as the direct call explains: bit for bit (LRP-0 could use R / x)
    x = torch.randn(2, 2, 7, 7, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    with reusable_graph():
        output = explain(leaf)
    for target in (0, 2, 1, 0):
        start = torch.zeros_like(output)
        start[:, target] = output.detach()[:, target]
        (reused,) = torch.autograd.grad(output, leaf, start, retain_graph=True)
        fresh = fxlrp.attribute(explain, x, target=target)
        assert torch.equal(reused, fresh)


def test_reusable_graph_refuses_inputs_changed_in_place():
    model = Convolutions().double().eval()
    explain = fxlrp.convert(model, Epsilon(0.0))
    leaf = torch.randn(1, 2, 7, 7, dtype=torch.float64, requires_grad=True)
    with reusable_graph():
        output = explain(leaf)
    torch.autograd.grad(output, leaf, output.detach(), retain_graph=True)
    with torch.no_grad():
        leaf.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified"):
        torch.autograd.grad(output, leaf, output.detach(), retain_graph=True)
