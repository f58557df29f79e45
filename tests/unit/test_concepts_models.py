"""fxlrp.concepts beyond zennit-crp: concepts of a vision transformer (MLP neurons, attention
heads), of a Hugging Face language model under AttnLRP (neurons, heads, token heatmaps per
concept; the model runs eagerly), of a PyTorch Geometric GCN (channels of a layer, conditional
node and edge relevance).

References: conservation of the condition (the conditional relevances over a partition of a
layer's concepts sum to the relevance through the layer, which at a cut of the graph is
fxlrp.attribute's unconditional relevance); LRP-0 as gradient x input with the gradient masked at
the layer, where LRP-0 is gradient x input (the GCN); a recorded relevance is zero outside the
condition's concepts and equals the unconditional one inside them, where the site is the first
one relevance meets; both capture paths and both batchings against each other.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.concepts import HeadConcept, NeuronConcept, conditional_relevance


class HeadMix(nn.Module):
    """Scaled dot-product attention of ``heads`` heads; returns their outputs side by side."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        batch, tokens, width = q.shape
        size = width // self.heads

        def split(t: Tensor) -> Tensor:
            return t.reshape(batch, tokens, self.heads, size).transpose(1, 2)

        weights = torch.softmax(split(q) @ split(k).transpose(-2, -1) / math.sqrt(size), dim=-1)
        return (weights @ split(v)).transpose(1, 2).reshape(batch, tokens, width)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.mix, self.proj = nn.Linear(width, 3 * width), HeadMix(heads), nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(self.mix(q, k, v))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """Patches of 4x4 pixels, two pre-norm blocks, mean pooling, a linear head."""

    def __init__(self, width: int = 16, heads: int = 4, hidden: int = 24, classes: int = 5) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4)
        self.blocks = nn.Sequential(Block(width, heads, hidden), Block(width, heads, hidden))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, images: Tensor) -> Tensor:
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(tokens)).mean(dim=1))


HEADS = 4


def tiny_vit() -> nn.Module:
    torch.manual_seed(6)
    return TinyViT(heads=HEADS).double().eval()


@pytest.fixture(scope="module")
def vit() -> tuple[nn.Module, Tensor]:
    return tiny_vit(), torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(7))


def test_vit_heads_partition_the_relevance_through_the_attention(vit: tuple[nn.Module, Tensor]) -> None:
    """Each head of the second block's attention (its output before the projection, heads side by
    side): the recorded relevance of a head condition is the all-heads relevance on that head's
    features and zero elsewhere; the head heatmaps sum to the heatmap through all heads."""
    model, images = vit
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP())
    site = "blocks.1.attn.mix"
    conditions = [{site: [head]} for head in range(HEADS)] + [{site: list(range(HEADS))}]
    found = conditional_relevance(explain, images, conditions, target=3, record=[site],
                                  concepts={site: HeadConcept(HEADS)})
    assert relative_error(found.heatmap[:HEADS].sum(dim=0), found.heatmap[HEADS]) < 1e-12
    everything = found.relevance[site][HEADS]
    size = everything.shape[-1] // HEADS
    for head in range(HEADS):
        mask = torch.zeros(everything.shape[-1], dtype=torch.float64)
        mask[head * size:(head + 1) * size] = 1.0
        assert relative_error(found.relevance[site][head], everything * mask) < 1e-12
    per_head = found.concept_relevance(site)  # [conditions, batch, heads]
    assert relative_error(per_head[:HEADS].sum(dim=0), per_head[HEADS]) < 1e-12
    assert relative_error(per_head[HEADS], everything.sum(dim=1).reshape(2, HEADS, size).sum(dim=-1)) < 1e-12
    assert all(found.heatmap[head].abs().max() > 0 for head in range(HEADS))


def test_vit_mlp_neurons_and_a_cut(vit: tuple[nn.Module, Tensor]) -> None:
    """Neurons of the first block's MLP: the neuron heatmaps over a partition sum to the heatmap
    through all neurons; the first block's output is a cut: a partition of its features gives
    fxlrp.attribute's relevance."""
    model, images = vit
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP())
    parts = [[0, 5, 9], list(range(1, 5)), list(range(10, 24)), [6, 7, 8]]
    mlp = conditional_relevance(explain, images, [{"blocks.0.mlp.0": part} for part in parts]
                                + [{"blocks.0.mlp.0": list(range(24))}], target=1, concepts=NeuronConcept())
    assert relative_error(mlp.heatmap[:4].sum(dim=0), mlp.heatmap[4]) < 1e-12
    features = [list(range(0, 16, 2)), list(range(1, 16, 2))]
    cut = conditional_relevance(explain, images, [{"blocks.0": part} for part in features], target=1,
                                concepts=NeuronConcept())
    assert relative_error(cut.heatmap.sum(dim=0), fxlrp.attribute(explain, images, target=1)) < 1e-12


@pytest.mark.parametrize("exclude_parallel", [True, False])
def test_vit_on_both_capture_paths_and_batchings(vit: tuple[nn.Module, Tensor], exclude_parallel: bool) -> None:
    model, images = vit
    conditions = [{"blocks.1.attn.mix": [1], "blocks.0.mlp.0": [3, 4]}, {"blocks.0.mlp.0": [0]}, {"blocks.1": [2]},
                  {"blocks.1.attn.mix": [0, 2], "y": [4]}]
    concepts = {"blocks.1.attn.mix": HeadConcept(HEADS), "blocks.0.mlp.0": NeuronConcept(),
                "blocks.1": NeuronConcept()}
    found = []
    for capture in ("auto", "eager"):
        explain = fxlrp.convert(model, fxlrp.composites.AttnLRP(), capture=capture)
        for repeat in (0, 3):
            found.append(conditional_relevance(explain, images, conditions, record=["blocks.0.mlp.0"], repeat=repeat,
                                               concepts=concepts, exclude_parallel=exclude_parallel))
    for other in found[1:]:
        assert relative_error(other.heatmap, found[0].heatmap) < 1e-12
        assert relative_error(other.relevance["blocks.0.mlp.0"], found[0].relevance["blocks.0.mlp.0"]) < 1e-12


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert() -> tuple[nn.Module, dict[str, Tensor]]:
    torch.manual_seed(8)
    config = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config).double().eval()
    ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # the second sequence is padded
    return model, {"input_ids": ids, "attention_mask": mask}


def test_language_model_neurons_heads_and_token_heatmaps(bert: tuple[nn.Module, dict[str, Tensor]]) -> None:
    """A 2-layer BERT under AttnLRP, run eagerly as a whole (its modules followed by name): token
    heatmaps per FFN neuron and per attention head of the second layer sum, over all neurons
    (heads), to the heatmap through all of them; the first layer's output is a cut: a partition of
    its features gives fxlrp.attribute's token relevance; three conditions per backward pass give
    what one per pass gives."""
    model, inputs = bert
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP())
    neurons, heads, layer = "bert.encoder.layer.1.intermediate", "bert.encoder.layer.1.attention.self", \
        "bert.encoder.layer.0"
    concepts = {neurons: NeuronConcept(), heads: HeadConcept(2), layer: NeuronConcept()}
    conditions = ([{neurons: list(range(part, 24, 3))} for part in range(3)] + [{neurons: list(range(24))}]
                  + [{heads: [0]}, {heads: [1]}, {heads: [0, 1]}]
                  + [{layer: list(range(part, 16, 4))} for part in range(4)])
    found = conditional_relevance(explain, inputs, conditions, target=2, concepts=concepts, record=[neurons])
    tokens = found.heatmap["input_ids"]
    assert tokens.shape == (11, 2, 9)
    assert relative_error(tokens[:3].sum(dim=0), tokens[3]) < 1e-12
    assert relative_error(tokens[4] + tokens[5], tokens[6]) < 1e-12
    unconditional = fxlrp.attribute(explain, inputs, target=2)["input_ids"]
    assert relative_error(tokens[7:].sum(dim=0), unconditional) < 1e-12
    assert all(tokens[index].abs().max() > 0 for index in range(11))
    for part in range(3):  # a neuron condition keeps the relevance of its neurons only
        outside = torch.ones(24, dtype=torch.bool)
        outside[part::3] = False
        assert found.relevance[neurons][part][..., outside].abs().max() == 0
    batched = conditional_relevance(explain, inputs, conditions, target=2, concepts=concepts, record=[neurons],
                                    repeat=3)
    assert relative_error(batched.heatmap["input_ids"], tokens) < 1e-12
    assert relative_error(batched.relevance[neurons], found.relevance[neurons]) < 1e-12


torch_geometric = pytest.importorskip("torch_geometric")


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2, self.conv3 = GCNConv(5, 8), GCNConv(8, 8), GCNConv(8, 3)

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        h = torch.relu(self.conv1(x, edge_index, edge_weight))
        h = torch.relu(self.conv2(h, edge_index, edge_weight))
        return self.conv3(h, edge_index, edge_weight)


@pytest.fixture(scope="module")
def graph() -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    torch.manual_seed(10)
    model = GCN().double().eval()
    nodes = 9
    x = torch.randn(nodes, 5, dtype=torch.float64)
    senders = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2, 4, 6])
    receivers = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 0, 4, 6, 8, 1])
    edge_index = torch.cat([torch.stack([senders, receivers]), torch.stack([receivers, senders])], dim=1)
    weight = torch.rand(edge_index.shape[1], dtype=torch.float64) + 0.5
    return model, x, edge_index, weight


NODE = 4


def pick_node(output: Tensor) -> Tensor:
    return output[NODE]


def test_gcn_lrp0_is_masked_gradient_times_input(graph: tuple[nn.Module, Tensor, Tensor, Tensor]) -> None:
    """LRP-0 on a GCN (linear aggregation, ReLU) is gradient x input; conditioned on channels of the
    second layer it is gradient x input with the gradient masked at that layer's output, computed
    by autograd on the model itself."""
    model, x, edge_index, _ = graph
    channels = [1, 2, 6]
    found = conditional_relevance(fxlrp.convert(model, fxlrp.rules.Epsilon(0.0)), [x, edge_index],
                                  [{"conv2": channels, "y": [1]}], output=pick_node)
    leaf = x.clone().requires_grad_()
    mask = torch.zeros(8, dtype=torch.float64)
    mask[channels] = 1.0
    handle = model.conv2.register_forward_hook(lambda module, args, out: out.register_hook(lambda g: g * mask) and None)
    try:
        score = model(leaf, edge_index)[NODE, 1]
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(score, leaf)
    expected = leaf.detach() * gradient
    assert expected.abs().max() > 0
    assert relative_error(found.heatmap[0][0], expected) < 1e-12


def test_gcn_channels_give_conditional_node_and_edge_relevance(
        graph: tuple[nn.Module, Tensor, Tensor, Tensor]) -> None:
    """Channels of the first GCN layer with edge weights as an explained input. Every path from the
    node features passes the layer, so over a partition of its channels the conditional node
    relevances sum to fxlrp.attribute's. The edge weights also enter the later layers directly: the
    conditional edge relevances sum to the relevance through the layer, and what goes around it is
    the relevance under a mask of zeros with ``exclude_parallel=False`` (zero for the nodes); the two
    add up to the unconditional edge relevance. The recorded layer relevance is the unconditional one
    restricted to the condition's channels; per-node concept relevance sums the channels."""
    model, x, edge_index, weight = graph
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlus())
    parts = [[0, 3], [1, 2, 7], [4, 5, 6]]
    found = conditional_relevance(explain, [x, edge_index, weight], [{"conv1": part} for part in parts], target=2,
                                  output=pick_node, record=["conv1"])
    nodes, _, edges = found.heatmap
    assert nodes.shape == (3, 9, 5) and edges.shape == (3, weight.shape[0])
    (node_relevance, _, edge_relevance), recorded = fxlrp.attribute_nodes(
        explain, [x, edge_index, weight], ["conv1"], target=2, output=pick_node)
    assert relative_error(nodes.sum(dim=0), node_relevance) < 1e-12
    around = conditional_relevance(explain, [x, edge_index, weight], [{"conv1": torch.zeros(8)}], target=2,
                                   output=pick_node, exclude_parallel=False)
    assert around.heatmap[0].abs().max() == 0
    assert relative_error(edges.sum(dim=0) + around.heatmap[2][0], edge_relevance) < 1e-12
    assert edges.abs().max() > 0 and around.heatmap[2].abs().max() > 0
    for part, relevance in zip(parts, found.relevance["conv1"], strict=True):
        mask = torch.zeros(8, dtype=torch.float64)
        mask[part] = 1.0
        assert relative_error(relevance, recorded["conv1"] * mask) < 1e-12
    per_node = found.concept_relevance("conv1")  # [conditions, nodes, channels]
    assert per_node.shape == (3, 9, 8)
    assert relative_error(per_node.sum(dim=0), recorded["conv1"]) < 1e-12
