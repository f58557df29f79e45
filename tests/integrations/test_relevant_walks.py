"""Relevant walks (GNN-LRP) and subgraph relevance (sGNN-LRP), float64, on graphs of at most 8
nodes where every walk can be enumerated.

References, none computed by the code under test:
- masked LRP: for every sequence of nodes (walks and non-walks alike, and sequences that leave for
  the output early), one full backward pass of the converted model with the relevance of each
  node state ``H_t`` restricted to row ``j_t`` by a tensor hook, the definition of a walk's
  relevance;
- node relevance from ``fxlrp.integrations.pyg.graph_relevance`` / ``fxlrp.attribute`` / ``LRPExplainer`` (the
  walks starting at a node sum to it), and gradient x input for piecewise-linear models (LRP-0);
- edge relevance per layer from ``graph_relevance`` (the walks along an edge sum to it, LRP-0);
- the closed form of a 2-layer linear GCN under LRP-0, written out with the normalised adjacency.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch_scatter
from support.pyg_networks import EdgeFeatureStack, LinkPredictor, Stack, references
from torch import Tensor, nn
from torch_geometric.nn import GCNConv

import fxlrp
from fxlrp.integrations.pyg import graph_relevance
from fxlrp.integrations.pyg.walk_graph import walk_graph
from fxlrp.integrations.pyg.walk_search import search_walks
from fxlrp.integrations.pyg.walk_steps import walk_steps
from fxlrp.integrations.pyg.walks import relevant_walks, subgraph_relevance
from fxlrp.relevance.rule_function import reusable_graph
from fxlrp.rules import Epsilon, Gamma, ZPlus

LRP0 = Epsilon(0.0)


def undirected_graph(nodes: int, density: float, seed: int, features: int = 5) -> tuple[Tensor, Tensor]:
    """Random features and a random undirected graph (both directions, no self-loops, no repeats)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=generator, dtype=torch.float64)
    pairs = torch.combinations(torch.arange(nodes))
    chosen = pairs[torch.rand(len(pairs), generator=generator) < density]
    return x, torch.cat([chosen.T, chosen.T.flip(0)], dim=1)


class ScatterGNN(nn.Module):
    """Two message-passing steps written with torch_scatter as a user writes them (messages from
    sender and receiver rows, sum then mean aggregation, an update from the node and its incoming
    messages); node-level logits, or graph-level through a scatter-sum pooling over ``batch``."""

    def __init__(self, features: int = 5, hidden: int = 6, classes: int = 3, pool: bool = False) -> None:
        super().__init__()
        self.pool = pool
        self.message_1 = nn.Linear(2 * features, hidden)
        self.update_1 = nn.Linear(features + hidden, hidden)
        self.message_2 = nn.Linear(2 * hidden, hidden)
        self.update_2 = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None) -> Tensor:
        senders, receivers = edge_index
        messages = self.message_1(torch.cat([x[senders], x.index_select(0, receivers)], dim=1)).relu()
        incoming = torch_scatter.scatter_add(messages, receivers, dim=0, dim_size=x.size(0))
        h = self.update_1(torch.cat([x, incoming], dim=1)).relu()
        messages = self.message_2(torch.cat([h[senders], h[receivers]], dim=1)).relu()
        incoming = torch_scatter.scatter_mean(messages, receivers, dim=0, dim_size=x.size(0))
        h = self.update_2(torch.cat([h, incoming], dim=1)).relu()
        if self.pool:
            h = torch_scatter.scatter_add(h, batch, dim=0)
        return self.head(h)


class JumpingKnowledge(nn.Module):
    """Two GCN layers whose outputs are joined with the input before the head: relevance reaches
    the output from every node state directly (walks end at each)."""

    def __init__(self, features: int = 5, width: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.first = GCNConv(features, width)
        self.second = GCNConv(width, width)
        self.head = nn.Linear(features + 2 * width, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h1 = self.first(x, edge_index).relu()
        h2 = self.second(h1, edge_index).relu()
        return self.head(torch.cat([x, h1, h2], dim=1))


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if name == "jk":
        model = JumpingKnowledge()
    elif name == "scatter":
        model = ScatterGNN()
    elif name == "scatter_pool":
        model = ScatterGNN(pool=True)
    elif name == "gine":
        model = EdgeFeatureStack()
    elif name.endswith("_pool"):
        model = Stack(name[: -len("_pool")], depth=2, pool="add")
    else:
        model = Stack(name, depth=2)
    return model.double().eval()


def keywords(name: str, x: Tensor, edge_index: Tensor) -> dict[str, Tensor]:
    if name == "gine":
        generator = torch.Generator().manual_seed(5)
        return {"edge_attr": torch.randn(edge_index.size(1), 3, generator=generator, dtype=torch.float64)}
    if name.endswith("_pool"):
        return {"batch": torch.zeros(x.size(0), dtype=torch.long)}
    return {}


def hub(edge_index: Tensor) -> int:
    """The node with the most neighbours (the most walks)."""
    return int(torch.bincount(edge_index[1]).argmax())


def as_dict(walks: Tensor, relevance: Tensor) -> dict[tuple[int, ...], float]:
    return {tuple(walk): value for walk, value in zip(walks.tolist(), relevance.tolist(), strict=True)}


def start_relevance(output: Tensor, index: int, target: int) -> Tensor:
    start = torch.zeros_like(output)
    start[index, target] = output[index, target]
    return start.detach()


def sequences(nodes: int, depth: int) -> list[tuple[int, ...]]:
    """Every node sequence ``(j_0, ..., j_L)`` and every shorter one ``(j_0, ..., j_t)`` padded
    with ``-1`` (a walk leaving for the output at ``H_t``)."""
    return [walk + (-1,) * (depth - t) for t in range(depth + 1)
            for walk in itertools.product(range(nodes), repeat=t + 1)]


def masked_lrp(explain: nn.Module, x: Tensor, edge_index: Tensor, states: list[str], index: int, target: int,
               **kwargs: Tensor) -> dict[tuple[int, ...], float]:
    """Every node sequence ``(j_0, ..., j_L)``: LRP through the whole model with the relevance of
    state ``H_t`` kept at row ``j_t`` only (a hook on the recorded state), summed over ``x``'s row
    ``j_0``; a ``-1`` keeps none of the state's relevance (the walk left before it), and the
    value of the sequence one state shorter is taken off (see the end)."""
    leaf = x.detach().requires_grad_()
    arguments = [leaf, edge_index, *kwargs.values()]
    with torch.enable_grad(), reusable_graph():
        output, recorded = explain.run_recording([name for name in states if name != "output"], *arguments)
    tensors = [output if name == "output" else recorded[name] for name in states]
    start = start_relevance(output, index, target)
    found = {}
    for walk in sequences(x.size(0), len(states)):
        handles, masked_start = [], start
        for tensor, node in zip(tensors, walk[1:], strict=True):
            keep = torch.zeros(x.size(0), 1, dtype=x.dtype)
            if node >= 0:
                keep[node] = 1.0
            if tensor is output:  # the relevance the output starts from, restricted to the last node
                masked_start = start * keep
            else:
                handles.append(tensor.register_hook(lambda gradient, keep=keep: gradient * keep))
        (relevance,) = torch.autograd.grad(output, leaf, masked_start, retain_graph=True)
        for handle in handles:
            handle.remove()
        found[walk] = relevance[walk[0]].sum().item()
    # masking keeps at H_t what reaches row j_t through the later rows kept *and* what reaches it
    # directly from the output: a sequence's own share is its value less that of the sequence
    # leaving one state earlier (zero without jumping knowledge)
    shorter = {walk: walk[:depth] + (-1,) * (len(walk) - depth)
               for walk in found for depth in [sum(node >= 0 for node in walk) - 1] if depth > 0}
    return {walk: value - (found[shorter[walk]] if walk in shorter else 0.0) for walk, value in found.items()}


@pytest.mark.parametrize("name", ["gcn", "gat", "scatter", "gin_pool", "jk"])
def test_walk_relevance_is_masked_lrp_for_every_node_sequence(name: str) -> None:
    """All 6^3 sequences (and the 6^2 + 6 that leave early): the enumerated walks carry the
    masked-LRP relevance, every other sequence has masked-LRP relevance 0 (6 nodes, 2 steps).
    Only the jumping-knowledge model has walks that leave early."""
    x, edge_index = undirected_graph(6, 0.6, seed=3)
    model = build(name)
    explain = fxlrp.convert(model, Epsilon(0.01))
    extra = keywords(name, x, edge_index)
    index = 0 if name.endswith("_pool") else hub(edge_index)
    output = explain(x, edge_index, **extra)
    target = int(output[index].argmax())
    walks, relevance = relevant_walks(explain, x, edge_index, index=index, target=target, **extra)
    found = as_dict(walks, relevance)
    reference = masked_lrp(explain, x, edge_index, walk_steps(explain), index, target, **extra)
    scale = max(abs(value) for value in reference.values())
    assert scale > 0 and len(found) >= 20
    assert set(found) <= set(reference)
    assert max(abs(found.get(walk, 0.0) - value) for walk, value in reference.items()) < 1e-12 * scale
    leaving = [walk for walk in found if walk[-1] == -1]
    assert (len({walk.count(-1) for walk in leaving}) == 2) if name == "jk" else not leaving


LAYERS = ["gcn", "gin", "gine", "sage_mean", "sage_max", "graphconv_add", "graphconv_max", "gat", "gatv2",
          "transformer", "edgeconv", "scatter", "gcn_pool", "scatter_pool", "jk"]


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("rule", [Epsilon(0.01), Gamma(0.25)], ids=["epsilon", "gamma"])
def test_walks_starting_at_a_node_sum_to_its_relevance(name: str, rule) -> None:
    x, edge_index = undirected_graph(8, 0.35, seed=1)
    model = build(name)
    explain = fxlrp.convert(model, rule)
    extra = keywords(name, x, edge_index)
    index = 0 if name.endswith("_pool") else hub(edge_index)
    output = explain(x, edge_index, **extra)
    target = int(output[index].argmax())
    if name == "scatter_pool":
        start = start_relevance(output, index, target)
        expected = fxlrp.attribute(explain, (x, edge_index, extra["batch"]), start)[0].sum(dim=1)
    else:
        expected = graph_relevance(explain, x, edge_index, target=target, index=index, **extra).node.sum(dim=1)
    walks, relevance = relevant_walks(explain, x, edge_index, index=index, target=target, **extra)
    per_node = torch.zeros_like(expected).index_add_(0, walks[:, 0], relevance)
    assert walks.size(1) == len(walk_steps(explain)) + 1
    winner_takes_all = name in ("sage_max", "graphconv_max", "edgeconv")  # max aggregation: fewer walks
    assert walks.size(0) >= (5 if winner_takes_all else 15) and expected.abs().max() > 0
    assert (per_node - expected).abs().max() < 1e-12 * expected.abs().max()
    if not name.endswith("_pool"):
        ends = walks.gather(1, (walks >= 0).sum(dim=1, keepdim=True) - 1)  # the last node before any -1
        assert bool((ends == index).all())


def test_linear_gcn_walks_have_their_closed_form() -> None:
    r"""Two bias-free GCNConv layers, no nonlinearity, LRP-0, output ``H_2 = Â Â X W_1 W_2``:
    ``R(j_0 -> j_1 -> v) = Â[v, j_1] Â[j_1, j_0] (x_{j_0} W_1 W_2)_c`` with
    ``Â = D^{-1/2} (A + I) D^{-1/2}``, ``A[k, i] = 1`` for an edge ``i -> k``, ``D`` its row sums."""

    class LinearGCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = GCNConv(5, 4, bias=False)
            self.second = GCNConv(4, 3, bias=False)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.second(self.first(x, edge_index), edge_index)

    torch.manual_seed(2)
    model = LinearGCN().double().eval()
    x, edge_index = undirected_graph(7, 0.4, seed=4)
    nodes, explained, target = 7, 3, 1
    adjacency = torch.zeros(nodes, nodes, dtype=torch.float64)
    adjacency[edge_index[1], edge_index[0]] = 1.0
    adjacency += torch.eye(nodes, dtype=torch.float64)
    inverse_root = adjacency.sum(dim=1).rsqrt()
    normalised = inverse_root[:, None] * adjacency * inverse_root[None, :]
    weights = model.first.lin.weight.T @ model.second.lin.weight.T  # [5, 3]
    input_term = (x @ weights)[:, target]
    expected = {(j0, j1, explained): (normalised[explained, j1] * normalised[j1, j0] * input_term[j0]).item()
                for j0 in range(nodes) for j1 in range(nodes)}
    expected = {walk: value for walk, value in expected.items() if value != 0}

    walks, relevance = relevant_walks(model, x, edge_index, index=explained, target=target, composite=LRP0)
    found = as_dict(walks, relevance)
    assert set(found) == set(expected)
    scale = max(abs(value) for value in expected.values())
    assert max(abs(found[walk] - value) for walk, value in expected.items()) < 1e-12 * scale
    assert len(found) >= 10


@pytest.mark.parametrize("name", ["gcn", "gat", "scatter", "gin_pool", "jk"])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_is_the_top_of_the_enumeration(name: str, largest: bool) -> None:
    x, edge_index = undirected_graph(8, 0.4, seed=2)
    model = build(name, seed=1)
    explain = fxlrp.convert(model, Epsilon(0.01))
    extra = keywords(name, x, edge_index)
    index = 0 if name.endswith("_pool") else hub(edge_index)
    every, values = relevant_walks(explain, x, edge_index, index=index, **extra)
    assert every.size(0) > 20
    order = torch.argsort(values, descending=largest)
    for k in (1, 5, 10):
        walks, relevance = relevant_walks(explain, x, edge_index, index=index, top_k=k, largest=largest, **extra)
        assert torch.equal(relevance, values[order[:k]])
        assert torch.equal(walks, every[order[:k]])
        # sorted, and nothing left out is better
        assert bool((relevance[:-1] >= relevance[1:]).all() if largest else (relevance[:-1] <= relevance[1:]).all())
        rest = values[order[k:]]
        assert bool((rest <= relevance[-1]).all() if largest else (rest >= relevance[-1]).all())


def test_a_narrow_beam_returns_exact_relevances_within_its_budget() -> None:
    """Beam search is an approximation when a step has more suffixes than the beam: each walk it
    returns carries its exact relevance, it runs at most ``L * beam`` step-backward passes, and
    with a beam wide enough it is exact."""
    x, edge_index = undirected_graph(10, 0.45, seed=0)
    model = Stack("gcn", depth=3).double().eval()
    explain = fxlrp.convert(model, Epsilon(0.01))
    enumerated = as_dict(*relevant_walks(explain, x, edge_index, index=0))
    best = sorted(enumerated.values(), reverse=True)[:10]
    graph = walk_graph(explain, x, edge_index, index=0, check=False)
    walks, relevance = search_walks(graph, beam=8, largest=True)
    assert graph.passes <= 3 * 8
    for walk, value in as_dict(walks, relevance).items():
        assert abs(enumerated[walk] - value) < 1e-12 * abs(best[0])
    narrow = relevant_walks(explain, x, edge_index, index=0, top_k=10, beam=20)[1].tolist()
    wide = relevant_walks(explain, x, edge_index, index=0, top_k=10, beam=len(enumerated))[1].tolist()
    assert wide == best
    assert narrow[0] <= best[0] and len(narrow) == 10


def test_disjoint_neighbourhoods_share_a_pass() -> None:
    """Suffixes ending at nodes whose neighbourhoods do not overlap go through one pass: the same
    walks and relevances as one pass per suffix, in fewer passes."""
    x, edge_index = undirected_graph(8, 0.3, seed=6)
    explain = fxlrp.convert(build("gcn_pool"), Epsilon(0.01))
    batch = torch.zeros(8, dtype=torch.long)
    shared = walk_graph(explain, x, edge_index, index=0, check=False, batch=batch)
    single = walk_graph(explain, x, edge_index, index=0, check=False, batch=batch)
    single.neighbourhoods = [None] * single.depth
    walks, relevance = search_walks(shared, None, True)
    walks_single, relevance_single = search_walks(single, None, True)
    assert as_dict(walks, relevance) == as_dict(walks_single, relevance_single)
    assert shared.passes < single.passes


@pytest.mark.parametrize("name", ["gcn", "scatter", "gin_pool"])
def test_subgraph_relevance_sums_the_walks_inside(name: str) -> None:
    x, edge_index = undirected_graph(8, 0.4, seed=7)
    explain = fxlrp.convert(build(name), Epsilon(0.01))
    extra = keywords(name, x, edge_index)
    walks, relevance = relevant_walks(explain, x, edge_index, index=0, **extra)
    generator = torch.Generator().manual_seed(0)
    for size in (2, 4, 6, 8):
        nodes = torch.cat([torch.tensor([0]), 1 + torch.randperm(7, generator=generator)[: size - 1]])
        inside = torch.zeros(8, dtype=torch.bool)
        inside[nodes] = True
        expected = relevance[inside[walks].all(dim=1)].sum()
        found = subgraph_relevance(explain, x, edge_index, nodes, index=0, **extra)
        assert abs(found - expected) < 1e-12 * relevance.abs().sum()
    assert abs(found - relevance.sum()) < 1e-12 * relevance.abs().sum()  # S = every node


def test_positive_rules_give_positive_walks() -> None:
    """z+ on a GCN with non-negative features: every walk's relevance is >= 0."""
    x, edge_index = undirected_graph(7, 0.4, seed=8)
    explain = fxlrp.convert(build("gcn"), ZPlus())
    _, relevance = relevant_walks(explain, x.abs(), edge_index, index=hub(edge_index))
    assert relevance.numel() > 10 and bool((relevance >= 0).all())


def test_a_skip_connection_around_a_step_is_refused() -> None:
    """``x`` enters the second step's messages without passing the first step: its relevance
    there belongs to no walk (a skip straight to the head would be a walk leaving early)."""

    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = GCNConv(5, 6)
            self.second = GCNConv(6, 6)
            self.project = nn.Linear(5, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            h = self.first(x, edge_index).relu()
            return self.head(self.second(h + self.project(x), edge_index).relu())

    x, edge_index = undirected_graph(6, 0.5, seed=9)
    model = Skip().double().eval()
    with pytest.raises(ValueError, match="around the message-passing steps"):
        relevant_walks(model, x, edge_index, index=0)
    with pytest.raises(ValueError, match="around the message-passing steps"):
        subgraph_relevance(model, x, edge_index, [0, 1], index=0)


def test_steps_are_found_and_can_be_given() -> None:
    x, edge_index = undirected_graph(6, 0.5, seed=10)
    scatter = fxlrp.convert(build("scatter"), Epsilon(0.01))
    assert walk_steps(scatter) == ["relu_1", "output"]
    pooled = fxlrp.convert(build("scatter_pool"), Epsilon(0.01))
    assert walk_steps(pooled)[0] == "relu_1" and len(walk_steps(pooled)) == 2
    stack = fxlrp.convert(build("gcn"), Epsilon(0.01))
    assert walk_steps(stack) == ["convs_0", "convs_1"]
    given = relevant_walks(stack, x, edge_index, index=0, steps=["relu", "relu_1"])
    found = relevant_walks(stack, x, edge_index, index=0)
    assert as_dict(*given) == pytest.approx(as_dict(*found), rel=1e-12, abs=1e-300)


def test_walks_are_drawn_one_curve_per_hop(tmp_path) -> None:
    from matplotlib import patches, pyplot

    from fxlrp.viz.graph_image import draw_walks, save_walks

    x, edge_index = undirected_graph(7, 0.4, seed=11)
    walks, relevance = relevant_walks(build("gcn"), x, edge_index, index=hub(edge_index), top_k=5)
    figure = draw_walks(edge_index, walks, relevance, highlight=[hub(edge_index)])
    hops = walks[:, 1:] != walks[:, :-1]
    arrows = [patch for patch in figure.axes[0].patches if isinstance(patch, patches.FancyArrowPatch)]
    loops = [patch for patch in figure.axes[0].patches if isinstance(patch, patches.Circle)]
    assert len(arrows) == int(hops.sum()) and len(loops) == int((~hops).sum())
    pyplot.close(figure)
    path = save_walks(tmp_path / "walks.png", edge_index, walks, relevance)
    assert path.read_bytes()[:4] == b"\x89PNG"
    # walks that leave early (jumping knowledge): the -1 after their last node draws nothing
    x, edge_index = undirected_graph(6, 0.6, seed=3)
    walks, relevance = relevant_walks(build("jk"), x, edge_index, index=hub(edge_index))
    leaving = walks[:, -1] < 0
    assert bool(leaving.any()) and bool((~leaving).any())
    figure = draw_walks(edge_index, walks, relevance)
    steps = (walks[:, 1:] >= 0) & (walks[:, :-1] >= 0)
    hops = steps & (walks[:, 1:] != walks[:, :-1])
    arrows = [patch for patch in figure.axes[0].patches if isinstance(patch, patches.FancyArrowPatch)]
    loops = [patch for patch in figure.axes[0].patches if isinstance(patch, patches.Circle)]
    assert len(arrows) == int(hops.sum()) and len(loops) == int((steps & ~hops).sum())
    pyplot.close(figure)


def test_walks_of_a_pyg_basic_gnn_sum_to_gradient_times_input() -> None:
    """torch_geometric.nn.models.GCN leaves optional inputs (edge_weight, batch, ...) None: its
    graph is one traced for them, which the walk search must run itself (it failed before: each
    call of the explainer traced another graph, whose layers the search's hooks never saw)."""
    from torch_geometric.nn.models import GCN

    torch.manual_seed(7)
    x, edge_index = undirected_graph(8, 0.35, seed=3)
    model = GCN(x.size(1), 6, num_layers=3, out_channels=3).double().eval()
    index = hub(edge_index)
    leaf = x.clone().requires_grad_()
    output = model(leaf, edge_index)
    target = int(output[index].argmax())
    gradient, = torch.autograd.grad(output[index, target], leaf)
    expected = (x * gradient).sum(dim=1)
    walks, relevance = relevant_walks(model, x, edge_index, index=index, target=target, composite=LRP0)
    per_node = torch.zeros_like(expected).index_add_(0, walks[:, 0], relevance)
    assert walks.size(1) == 4 and expected.abs().max() > 0
    assert (per_node - expected).abs().max() < 1e-12 * expected.abs().max()


@pytest.mark.parametrize("decoder, share", [("mlp", 1.0), ("dot", 0.5)])
def test_link_score_walks_end_at_the_pair_and_decompose_its_node_relevance(decoder: str, share: float) -> None:
    """Edge level (the score of a node pair, as PyG's link prediction): walks end at either node
    of the pair; those starting at a node sum to its node mask from LRPExplainer (task level
    ``edge``) and to gradient x input (MLP decoder, piecewise linear) or half of it (dot
    product: its two relevance-carrying factors get equal halves)."""
    from torch_geometric.explain import Explainer

    from fxlrp.integrations.pyg import LRPExplainer

    torch.manual_seed(3)
    x, edge_index = undirected_graph(9, 0.45, seed=12)
    pairs = torch.tensor([[0, 4, 7, 2], [5, 1, 3, 8]])
    model = LinkPredictor(decoder).double().eval()
    row = 2
    walks, relevance = relevant_walks(model, x, edge_index, index=row, composite=LRP0, edge_label_index=pairs)
    per_node = torch.zeros(9, dtype=torch.float64).index_add_(0, walks[:, 0], relevance)
    explainer = Explainer(model, algorithm=LRPExplainer(LRP0), explanation_type="model", node_mask_type="object",
                          edge_mask_type=None,
                          model_config=dict(mode="regression", task_level="edge", return_type="raw"))
    mask = explainer(x, edge_index, edge_label_index=pairs, index=row).node_mask.view(-1)
    node, _ = references(model, x, edge_index, pairs, lambda out: out[row])
    scale = mask.abs().max()
    assert scale > 0 and walks.size(0) >= 20
    assert (per_node - mask).abs().max() < 1e-12 * scale
    assert (per_node - share * node.sum(dim=1)).abs().max() < 1e-10 * scale
    assert set(walks[:, -1].tolist()) == {7, 3}


def test_link_score_top_k_is_the_top_of_the_enumeration() -> None:
    torch.manual_seed(4)
    x, edge_index = undirected_graph(9, 0.35, seed=13)
    pairs = torch.tensor([[1, 6], [4, 0]])
    explain = fxlrp.convert(LinkPredictor("mlp").double().eval(), Epsilon(0.01))
    every, values = relevant_walks(explain, x, edge_index, index=1, edge_label_index=pairs)
    assert every.size(0) > 20
    order = torch.argsort(values, descending=True)
    for k in (1, 5, 10):
        walks, relevance = relevant_walks(explain, x, edge_index, index=1, top_k=k, edge_label_index=pairs)
        assert torch.equal(relevance, values[order[:k]]) and torch.equal(walks, every[order[:k]])


@pytest.mark.parametrize("name", ["gcn", "graphconv_add", "gin"])
def test_walks_along_an_edge_sum_to_its_edge_relevance(name: str) -> None:
    """Bias-free, LRP-0 (conservative): the relevance of the messages a layer sends along an edge
    (``graph_relevance(...).edge_by_layer``, read from the recorded messages) is the sum of the
    relevances of the walks whose hop at that layer's step follows the edge."""
    torch.manual_seed(0)
    x, edge_index = undirected_graph(8, 0.4, seed=1)
    explain = fxlrp.convert(Stack(name, depth=3, bias=False).double().eval(), LRP0)
    node = hub(edge_index)
    expected = graph_relevance(explain, x, edge_index, index=node).edge_by_layer
    walks, relevance = relevant_walks(explain, x, edge_index, index=node)
    edge_of = {pair: position for position, pair in enumerate(map(tuple, edge_index.T.tolist()))}
    for t, layer in enumerate(f"convs.{step}" for step in range(3)):
        along = torch.zeros(edge_index.size(1), dtype=torch.float64)
        for walk, value in zip(walks.tolist(), relevance.tolist(), strict=True):
            if walk[t] != walk[t + 1]:  # a hop, not the root term or a self-loop
                along[edge_of[(walk[t], walk[t + 1])]] += value
        scale = expected[layer].abs().max()
        assert scale > 0 and (along - expected[layer]).abs().max() < 1e-12 * scale
