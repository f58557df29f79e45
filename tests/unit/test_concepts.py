"""fxlrp.concepts against references that need no zennit-crp: masked LRP written out by hand
(the epsilon rule on an MLP, with a residual connection for ``exclude_parallel``), LRP-0 as
gradient x input with the gradient masked at the conditioned layer (plain autograd on the
model), conservation of conditions (the conditional relevances over a partition of a layer's
concepts sum to the relevance through the layer; to the unconditional relevance where the layer is
a cut), both capture paths and both batchings against each other, the concept relevance's formula,
and the errors a user meets.
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from support.concepts import small_cnn
from support.references import relative_error, stabilised
from torch import Tensor, nn

import fxlrp
from fxlrp.concepts import (
    ChannelConcept,
    HeadConcept,
    NeuronConcept,
    attribution_graph,
    concept_relevance,
    conditional_relevance,
)
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import Composite

EPSILON = 0.01
LRP0 = Epsilon(0.0)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()


def epsilon_share(layer: nn.Linear, x: Tensor, relevance: Tensor) -> Tensor:
    """The epsilon rule by hand: ``R_x = x * W^T (R / (z + eps sign z))``, ``z = W x + b``."""
    z = x @ layer.weight.T + layer.bias
    return x * ((relevance / stabilised(z, EPSILON)) @ layer.weight)


def test_masked_epsilon_rule_equals_the_hand_written_reference() -> None:
    """An MLP under the epsilon rule, conditioned on neurons of its second linear layer: the
    relevance reaching that layer's output is multiplied by the neurons' mask and shared on by the
    epsilon rule, written out here layer by layer."""
    model = mlp()
    x = torch.randn(4, 6, dtype=torch.float64)
    kept = [1, 4, 6]
    found = conditional_relevance(fxlrp.convert(model, Epsilon(EPSILON)), x, [{"2": kept, "y": [2]}],
                                  record=["0", "2"])
    first, second, last = model[0], model[2], model[4]
    with torch.no_grad():
        a1 = torch.relu(first(x))
        a2 = torch.relu(second(a1))
        y = last(a2)
        start = torch.zeros_like(y)
        start[:, 2] = y[:, 2]
        mask = torch.zeros(8, dtype=torch.float64)
        mask[kept] = 1.0
        at_second = epsilon_share(last, a2, start) * mask  # ReLU passes relevance on as it is
        at_first = epsilon_share(second, a1, at_second)
        at_input = epsilon_share(first, x, at_first)
    assert relative_error(found.heatmap[0], at_input) < 1e-12
    assert relative_error(found.relevance["2"][0], at_second) < 1e-12
    assert relative_error(found.relevance["0"][0], at_first) < 1e-12
    assert at_input.abs().max() > 0


class Residual(nn.Module):
    """``y = head(relu(inner(h)) + h)``, ``h = relu(stem(x))``: the sum lets relevance pass ``inner``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.inner, self.head = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.stem(x))
        return self.head(torch.relu(self.inner(h)) + h)


@pytest.mark.parametrize("exclude_parallel", [True, False])
def test_parallel_paths_follow_the_hand_written_reference(exclude_parallel: bool) -> None:
    """The sum's relevance, by the epsilon rule, goes to ``relu(inner(h))`` and to ``h``; the mask on
    ``inner``'s output restricts the first share. With ``exclude_parallel`` only relevance through
    ``inner`` reaches ``h`` and the input, without it the second share is added at ``h``."""
    torch.manual_seed(3)
    model = Residual().double().eval()
    x = torch.randn(3, 5, dtype=torch.float64)
    kept = [0, 2, 3]
    composite = Composite(Epsilon(EPSILON), operation_rules={"add": Epsilon(EPSILON)})
    found = conditional_relevance(fxlrp.convert(model, composite), x, [{"inner": kept, "y": [1]}],
                                  record=["stem", "inner"], exclude_parallel=exclude_parallel)
    with torch.no_grad():
        h = torch.relu(model.stem(x))
        branch = torch.relu(model.inner(h))
        total = branch + h
        y = model.head(total)
        start = torch.zeros_like(y)
        start[:, 1] = y[:, 1]
        at_total = epsilon_share(model.head, total, start)
        quotient = at_total / stabilised(total, EPSILON)
        mask = torch.zeros(7, dtype=torch.float64)
        mask[kept] = 1.0
        at_inner = branch * quotient * mask
        at_h = epsilon_share(model.inner, h, at_inner)
        if not exclude_parallel:
            at_h = at_h + h * quotient
        at_input = epsilon_share(model.stem, x, at_h)
    assert relative_error(found.relevance["inner"][0], at_inner) < 1e-12
    assert relative_error(found.relevance["stem"][0], at_h) < 1e-12
    assert relative_error(found.heatmap[0], at_input) < 1e-12


def masked_gradient_times_input(model: nn.Module, layer: nn.Module, x: Tensor, mask: Tensor, target: int,
                                exclude_parallel: bool) -> Tensor:
    """LRP-0's conditional relevance by autograd on the plain model: gradient x input with the
    gradient at ``layer``'s output multiplied by ``mask`` (with ``exclude_parallel``: the gradient of
    the masked ``layer`` output alone)."""
    leaf = x.clone().requires_grad_()
    kept: dict[str, Tensor] = {}

    def hook(module: nn.Module, args: object, output: Tensor) -> None:
        kept["output"] = output
        if not exclude_parallel:
            output.register_hook(lambda grad: grad * mask)

    handle = layer.register_forward_hook(hook)
    try:
        y = model(leaf)
    finally:
        handle.remove()
    score = y[:, target].sum()
    if exclude_parallel:
        (at_layer,) = torch.autograd.grad(score, kept["output"], retain_graph=True)
        (gradient,) = torch.autograd.grad(kept["output"], leaf, at_layer * mask)
    else:
        (gradient,) = torch.autograd.grad(score, leaf)
    return leaf.detach() * gradient


@pytest.mark.parametrize("exclude_parallel", [True, False])
@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_lrp0_is_masked_gradient_times_input_on_resnet18(exclude_parallel: bool, capture: str) -> None:
    """LRP-0 on a ReLU network is gradient x input; conditioned on channels of a convolution inside
    a residual block (relevance also goes around it), it is gradient x input with the gradient
    masked there - on both capture paths. (BatchNorm folded on the graph, its own rule run eagerly:
    both are the gradient under LRP-0.)"""
    torch.manual_seed(2)
    model = torchvision.models.resnet18(num_classes=5).double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    layer, channels, target = "layer3.0.conv2", [3, 17, 40, 41], 2
    found = conditional_relevance(fxlrp.convert(model, LRP0, capture=capture), x, [{layer: channels, "y": [target]}],
                                  exclude_parallel=exclude_parallel)
    mask = torch.zeros(1, 256, 1, 1, dtype=torch.float64)
    mask[0, channels] = 1.0
    expected = masked_gradient_times_input(model, model.get_submodule(layer), x, mask, target, exclude_parallel)
    assert expected.abs().max() > 0
    assert relative_error(found.heatmap[0], expected) < 1e-10


def test_conditions_over_all_concepts_of_a_cut_sum_to_the_unconditional_relevance() -> None:
    """Every path from the input to the output passes a layer of a plain CNN: the conditional
    relevances over a partition of its channels sum to fxlrp.attribute's relevance; the recorded
    relevance of each condition is the layer's relevance restricted to its channels."""
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    x = torch.randn(3, 3, 12, 12, dtype=torch.float64)
    groups = [[0, 3], [1], [2, 4, 5, 7], [6]]
    found = conditional_relevance(explain, x, [{"0": group} for group in groups], target=1, record=["0"])
    unconditional, nodes = fxlrp.attribute_nodes(explain, x, ["_0"], target=1)
    assert relative_error(found.heatmap.sum(dim=0), unconditional) < 1e-12
    for group, relevance in zip(groups, found.relevance["0"], strict=True):
        mask = torch.zeros(1, 8, 1, 1, dtype=torch.float64)
        mask[0, group] = 1.0
        assert relative_error(relevance, nodes["_0"] * mask) < 1e-12
    assert relative_error(found.relevance["0"].sum(dim=0), nodes["_0"]) < 1e-12


def test_conservation_on_a_layer_relevance_goes_around() -> None:
    """Inside a residual block relevance also passes by the identity path: the conditional
    relevances over all channels of ``layer2.0.conv1`` sum to the condition on all its channels,
    and with ``exclude_parallel=False`` the difference to the unconditional relevance is the
    relevance that went around, the same for every condition (a partition of n sets counts it n
    times); a block's output is a cut: there the sum is the unconditional relevance."""
    torch.manual_seed(4)
    model = torchvision.models.resnet18(num_classes=5).double().eval()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    parts = [list(range(start, 128, 4)) for start in range(4)]
    layer = "layer2.0.conv1"
    through = conditional_relevance(explain, x, [{layer: part} for part in parts] + [{layer: list(range(128))}],
                                    target=3)
    assert relative_error(through.heatmap[:4].sum(dim=0), through.heatmap[4]) < 1e-10
    everywhere = conditional_relevance(explain, x, [{layer: part} for part in parts] + [{layer: list(range(128))}],
                                       target=3, exclude_parallel=False)
    unconditional = fxlrp.attribute(explain, x, target=3)
    assert relative_error(everywhere.heatmap[4], unconditional) < 1e-10
    around = unconditional - through.heatmap[4]
    assert around.abs().max() > 1e-3 * unconditional.abs().max()  # the identity path carries relevance
    for part in range(4):
        assert relative_error(everywhere.heatmap[part], through.heatmap[part] + around) < 1e-10
    block = conditional_relevance(explain, x, [{"layer2.0": part} for part in parts], target=3)
    assert relative_error(block.heatmap.sum(dim=0), unconditional) < 1e-10


@pytest.mark.parametrize("exclude_parallel", [True, False])
def test_both_capture_paths_and_both_batchings_agree(exclude_parallel: bool) -> None:
    """The same conditions on a graph captured by torch.fx and on the model run eagerly as a whole
    (module names followed as the modules run), one backward pass per condition and three
    conditions per pass: the same relevances. Records a layer that a ReLU overwrites in place."""
    model = small_cnn()
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = True
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    conditions = [{"5": [1], "y": [0]}, {"5": [0, 4], "2": [1, 2], "y": [3]}, {"2": [5]}, {"5": [2], "y": [0, 1]}]
    results = []
    for capture in ("auto", "eager"):
        explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat(), capture=capture)
        for repeat in (0, 3):
            results.append(conditional_relevance(explain, x, conditions, record=["0", "2", "5"], repeat=repeat,
                                                 exclude_parallel=exclude_parallel))
    with torch.no_grad():
        reference_activation = model[2](model[1](model[0](x)).clone())
    first = results[0]
    assert first.heatmap.shape == (4, 2, 3, 12, 12)
    assert relative_error(first.activation["2"], reference_activation) < 1e-12
    for other in results[1:]:
        assert relative_error(other.heatmap, first.heatmap) < 1e-12
        for layer in ("0", "2", "5"):
            assert relative_error(other.relevance[layer], first.relevance[layer]) < 1e-12
            assert relative_error(other.activation[layer], first.activation[layer]) < 1e-12


def test_start_at_a_concept_explains_its_activation() -> None:
    """``start=``: the backward pass begins at the layer's output with its activation, masked to
    the concept; LRP-0 then gives gradient x input of the concept's summed activation, and over all
    channels (a cut) the heatmaps sum to the relevance of the summed activation."""
    model = small_cnn()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    found = conditional_relevance(fxlrp.convert(model, LRP0), x, [{"5": [2]}, {"5": [0, 1, 3, 4]}], start="5")
    leaf = x.clone().requires_grad_()
    activation = model[:6](leaf)
    (gradient,) = torch.autograd.grad(activation[:, 2].sum(), leaf)
    assert relative_error(found.heatmap[0], leaf.detach() * gradient) < 1e-10
    (gradient,) = torch.autograd.grad(model[:6](leaf).sum(), leaf)
    assert relative_error(found.heatmap.sum(dim=0), leaf.detach() * gradient) < 1e-10


def test_concept_relevance_formula() -> None:
    """Channels, neurons and heads: sums over each concept's positions, normalised by the sum of
    absolute values per sample (+1e-10); with leading condition dimensions kept."""
    relevance = torch.randn(2, 3, 6, 5, 4, dtype=torch.float64)  # [conditions, batch, channels, h, w]
    channels = concept_relevance(relevance, ChannelConcept(), batch_dim=1)
    assert relative_error(channels, relevance.sum(dim=(3, 4))) < 1e-14
    normalised = concept_relevance(relevance, abs_norm=True, batch_dim=1)
    sums = relevance.sum(dim=(3, 4))
    assert relative_error(normalised, sums / (sums.abs().sum(-1, keepdim=True) + 1e-10)) < 1e-14
    tokens = torch.randn(3, 7, 12, dtype=torch.float64)  # [batch, tokens, heads * head_size]
    assert relative_error(NeuronConcept().relevance(tokens), tokens.sum(dim=1)) < 1e-14
    heads = HeadConcept(3).relevance(tokens)
    assert relative_error(heads, tokens.sum(dim=1).reshape(3, 3, 4).sum(dim=-1)) < 1e-14
    mask = HeadConcept(3).mask(tokens.shape, [0, 2], dtype=torch.float64)
    assert mask.shape == (1, 1, 12)
    assert mask.flatten().tolist() == [1.0] * 4 + [0.0] * 4 + [1.0] * 4


def test_attribution_graph_table_and_picture(tmp_path) -> None:
    """The graph's edges are the normalised concept relevances of the lower layer under the upper
    concept's condition; its table lists them and its picture is written."""
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    x = torch.randn(1, 3, 12, 12, dtype=torch.float64)
    graph = attribution_graph(explain, x, ["5", "2", "0"], width=[2, 2], target=1)
    assert len(graph.levels[0]) == 2 and len(graph.edges) == 2 + 2 * 2
    root_layer, root = graph.root
    for edge in graph.edges[:2]:
        found = conditional_relevance(explain, x, [{"5": [root], "y": [1]}], record=["2"])
        expected = found.concept_relevance("2", abs_norm=True)[0, 0, edge.lower[1]]
        assert abs(edge.relevance - float(expected)) < 1e-12
    table = str(graph)
    assert f"concept {root} of 5" in table and len(table.splitlines()) == 2 + len(graph.edges)
    figure = graph.picture(tmp_path / "graph.png")
    assert (tmp_path / "graph.png").stat().st_size > 0
    figure.clf()
    from_concept = attribution_graph(explain, x, ["5", "2"], root, width=3, from_concept=True)
    assert from_concept.target == "concept" and len(from_concept.edges) == 3


def test_the_model_and_the_explainer_are_left_as_they_were() -> None:
    model = small_cnn()
    state = {name: value.clone() for name, value in model.state_dict().items()}
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    before = fxlrp.attribute(explain, x, target=0)
    conditional_relevance(explain, x, [{"2": [1]}, {"5": [0]}], record=["0"], repeat=2)
    assert all(torch.equal(value, state[name]) for name, value in model.state_dict().items())
    assert not any(module._forward_hooks for module in list(model.modules()) + list(explain.modules()))
    # (float64: another summation order of the math library moves it by ~1e-16; a changed model or
    # a hook left behind by far more)
    assert relative_error(fxlrp.attribute(explain, x, target=0), before) < 1e-12


def test_errors_name_the_problem_and_what_to_do() -> None:
    torch.manual_seed(5)
    resnet = torchvision.models.resnet18(num_classes=5).eval()
    explain = fxlrp.convert(resnet, fxlrp.composites.EpsilonPlusFlat())
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="no node or module named 'layer9'"):
        conditional_relevance(explain, x, [{"layer9": [0]}])
    with pytest.raises(ValueError, match="calls module 'layer1.0.relu' 2 times.*layer1_0_relu, layer1_0_relu_1"):
        conditional_relevance(explain, x, [{"layer1.0.relu": [0]}])
    with pytest.raises(ValueError, match="BatchNorm that fxlrp folded"):
        conditional_relevance(explain, x, [{"layer1.0.bn1": [0]}])
    with pytest.raises(ValueError, match="concept 64 does not exist.*64 concepts"):
        conditional_relevance(explain, x, [{"layer1.0.conv1": [64]}])
    with pytest.raises(ValueError, match="parallel branches"):
        conditional_relevance(explain, x, [{"layer2.0.conv2": [0], "layer2.0.downsample.0": [1]}])
    with pytest.raises(ValueError, match="start='layer4.1' begins the backward pass"):
        conditional_relevance(explain, x, [{"layer4.1": [0], "y": [1]}], start="layer4.1")
    with pytest.raises(ValueError, match="'layer4.1' .* computes after the start, 'layer3.1'"):
        conditional_relevance(explain, x, [{"layer4.1": [0]}], start="layer3.1")
    with pytest.raises(TypeError, match="list of concept indices"):
        conditional_relevance(explain, x, [{"layer4.1": "all"}])
    with pytest.raises(ValueError, match="does not broadcast"):
        conditional_relevance(explain, x, [{"layer4.1": torch.ones(3)}])
    with pytest.raises(ValueError, match="model's input"):
        conditional_relevance(explain, x, [{"x": [0]}])
    with pytest.raises(TypeError, match="explainer returned by fxlrp.convert"):
        conditional_relevance(resnet, x, [{"layer4.1": [0]}])
    with pytest.raises(KeyError, match="not recorded"):
        conditional_relevance(explain, x, [{"layer4.1": [0]}]).concept_relevance("layer4.1")
