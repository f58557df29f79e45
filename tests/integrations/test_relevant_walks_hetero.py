"""Relevant walks on heterogeneous graphs (``to_hetero``, ``HeteroConv``, ``HGTConv``), node- and
edge-level outputs, float64, on a 6-paper 4-author graph small enough to enumerate every walk.

References, none computed by the code under test:
- masked LRP: for every typed node sequence ``((T_0, j_0), (T_1, j_1), (T_2, j_2))``, one full
  backward pass of the converted model with the relevance of each recorded layer output of step
  ``t`` kept at row ``j_t`` if the output is of type ``T_t``, zeroed otherwise (tensor hooks);
- node relevance from ``fxlrp.integrations.pyg.graph_relevance`` (the node masks of ``LRPExplainer``) under
  the same composite: the walks starting at a node sum to it;
- gradient x input, for LRP-0 on the piecewise-linear models (``to_hetero`` of SAGEConv +
  GraphConv(max), ``HeteroConv`` of SAGEConv and GraphConv);
- the full enumeration, for ``top_k`` and ``subgraph_relevance``.
"""

from __future__ import annotations

import itertools
import pathlib

import pytest
import torch
from support.pyg_hetero import CITES, HGT, WRITES, WRITTEN, Encoder, ToHetero, WithHeteroConv
from support.references import LRP0
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import to_hetero

import fxlrp
from fxlrp.integrations.pyg import graph_relevance
from fxlrp.integrations.pyg.walks import HeteroWalks, relevant_walks, subgraph_relevance
from fxlrp.relevance.rule_function import reusable_graph

PAPER = 2
pytestmark = pytest.mark.filterwarnings("ignore:There exist node types")  # HeteroConv's second layer: papers only


def dense_graph(seed: int = 0) -> HeteroData:
    """6 papers, 4 authors; each author writes 3 papers (and is written by them), 12 citations."""
    generator = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    data["author"].x = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    writes = torch.tensor([[author for author in range(4) for _ in range(3)],
                           [(2 * author + step) % 6 for author in range(4) for step in range(3)]])
    cites = torch.combinations(torch.arange(6)).T
    data[WRITES].edge_index = writes
    data[CITES].edge_index = cites[:, torch.randperm(cites.size(1), generator=generator)[:12]]
    data[WRITTEN].edge_index = writes.flip(0)
    return data


MODELS = {
    "to_hetero": lambda data: ToHetero(data.metadata()),
    "HeteroConv": lambda data: WithHeteroConv(),
    "HGT": lambda data: HGT(data.metadata()),
}


def prepared(name: str, data: HeteroData, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = MODELS[name](data).double()
    model(data.x_dict, data.edge_index_dict)  # lazy (-1) sizes
    return model.eval()


def typed(walks: HeteroWalks, relevance: Tensor) -> dict[tuple[tuple[str, int], ...], float]:
    return {tuple(walks.steps(row)): value for row, value in enumerate(relevance.tolist())}


def per_node(walks: HeteroWalks, relevance: Tensor, data: HeteroData) -> dict[str, Tensor]:
    """The summed relevance of the walks starting at each node, by node type."""
    found = {}
    for position, node_type in enumerate(walks.node_types):
        starting = walks.types[:, 0] == position
        found[node_type] = torch.zeros(data[node_type].num_nodes, dtype=torch.float64).index_add_(
            0, walks.ids[starting, 0], relevance[starting])
    return found


def gradient_times_input(model: nn.Module, data: HeteroData, explained, **kwargs) -> dict[str, Tensor]:
    x = {node_type: value.detach().requires_grad_() for node_type, value in data.x_dict.items()}
    gradients = torch.autograd.grad(explained(model(x, data.edge_index_dict, **kwargs)), list(x.values()))
    return {node_type: (value.detach() * gradient).sum(dim=1)
            for (node_type, value), gradient in zip(x.items(), gradients, strict=True)}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("composite", [LRP0, None], ids=["lrp0", "default"])
def test_walks_starting_at_a_node_sum_to_its_relevance(name: str, composite) -> None:
    data = dense_graph()
    model = prepared(name, data)
    explain = fxlrp.convert(model, composite)
    output = model(data.x_dict, data.edge_index_dict)
    target = int(output[PAPER].argmax())
    walks, relevance = relevant_walks(explain, data.x_dict, data.edge_index_dict, index=PAPER, target=target)
    expected = graph_relevance(explain, data.x_dict, data.edge_index_dict, index=PAPER, target=target).node
    found = per_node(walks, relevance, data)
    scale = max(value.abs().max() for value in expected.values())
    assert scale > 0 and len(walks) >= 20
    for node_type, value in expected.items():
        assert (found[node_type] - value.sum(dim=1)).abs().max() < 1e-12 * scale
    if composite is LRP0 and name != "HGT":  # piecewise linear: LRP-0 is gradient x input
        reference = gradient_times_input(model, data, lambda out: out[PAPER, target])
        for node_type, value in reference.items():
            assert (found[node_type] - value).abs().max() < 1e-10 * scale
    assert walks.ids.shape == walks.types.shape == (len(walks), 3)
    assert {walk[-1] for walk in typed(walks, relevance)} == {("paper", PAPER)}
    assert {kinds[0] for kinds in walks.by_types()} == {"paper", "author"}  # walks start at both types


def masked_lrp(explain: nn.Module, data: HeteroData) -> dict[tuple[tuple[str, int], ...], float]:
    """Every typed node sequence of length 3 through the ``to_hetero`` model's two steps: LRP with
    each step's layer outputs kept at the sequence's node (outputs of the other type zeroed)."""
    x = {node_type: value.detach().requires_grad_() for node_type, value in data.x_dict.items()}
    rows = [row.name for row in explain.report().rows if row.operation == "message_passing"]
    with torch.enable_grad(), reusable_graph():
        output, recorded = explain.run_recording(rows, x, data.edge_index_dict)
    states = [[(recorded[row], row.rsplit("__", 1)[1]) for row in rows if f"conv{t}" in row] for t in (1, 2)]
    start = torch.zeros_like(output)
    target = int(output[PAPER].argmax())
    start[PAPER, target] = output[PAPER, target].detach()
    nodes = [(node_type, node) for node_type in x for node in range(x[node_type].size(0))]
    found = {}
    for walk in itertools.product(nodes, repeat=3):
        handles = []
        for (node_type, node), tensors in zip(walk[1:], states, strict=True):
            for tensor, kind in tensors:
                keep = torch.zeros(tensor.size(0), 1, dtype=tensor.dtype)
                if kind == node_type:
                    keep[node] = 1.0
                handles.append(tensor.register_hook(lambda gradient, keep=keep: gradient * keep))
        relevance = dict(zip(x, torch.autograd.grad(output, list(x.values()), start, retain_graph=True,
                                                    allow_unused=True), strict=True))
        for handle in handles:
            handle.remove()
        first_type, first = walk[0]
        found[walk] = 0.0 if relevance[first_type] is None else relevance[first_type][first].sum().item()
    return found


def test_walk_relevance_is_masked_lrp_for_every_typed_sequence() -> None:
    """All 10^3 typed sequences through the two steps of a ``to_hetero`` model: the enumerated
    walks carry the masked-LRP relevance, every other sequence has 0."""
    data = dense_graph(seed=1)
    explain = fxlrp.convert(prepared("to_hetero", data, seed=1), fxlrp.rules.Epsilon(0.01))
    found = typed(*relevant_walks(explain, data.x_dict, data.edge_index_dict, index=PAPER))
    reference = masked_lrp(explain, data)
    scale = max(abs(value) for value in reference.values())
    assert scale > 0 and len(found) >= 15
    assert set(found) <= set(reference)
    assert max(abs(found.get(walk, 0.0) - value) for walk, value in reference.items()) < 1e-12 * scale
    # walks through an author: author -> paper (writes) -> paper, paper -> author (rev_writes) -> paper
    assert any(walk[1][0] == "author" for walk in found) and any(walk[0][0] == "author" for walk in found)


@pytest.mark.parametrize("name", ["to_hetero", "HGT"])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_is_the_top_of_the_enumeration(name: str, largest: bool) -> None:
    data = dense_graph(seed=2)
    explain = fxlrp.convert(prepared(name, data, seed=2), fxlrp.rules.Epsilon(0.01))
    every, values = relevant_walks(explain, data.x_dict, data.edge_index_dict, index=PAPER)
    assert len(every) > 20
    order = torch.argsort(values, descending=largest)
    for k in (1, 5, 10):
        walks, relevance = relevant_walks(explain, data.x_dict, data.edge_index_dict, index=PAPER, top_k=k,
                                          largest=largest)
        assert torch.equal(relevance, values[order[:k]])
        assert torch.equal(walks.ids, every.ids[order[:k]]) and torch.equal(walks.types, every.types[order[:k]])


def test_subgraph_relevance_sums_the_typed_walks_inside() -> None:
    data = dense_graph(seed=3)
    explain = fxlrp.convert(prepared("HeteroConv", data, seed=3), fxlrp.rules.Epsilon(0.01))
    walks, relevance = relevant_walks(explain, data.x_dict, data.edge_index_dict, index=PAPER)
    found = typed(walks, relevance)
    for papers, authors in (([PAPER], []), ([PAPER, 0, 3], [1]), ([PAPER, 1, 4, 5], [0, 2, 3]), (range(6), range(4))):
        inside = {("paper", node) for node in papers} | {("author", node) for node in authors}
        expected = sum(value for walk, value in found.items() if set(walk) <= inside)
        result = subgraph_relevance(explain, data.x_dict, data.edge_index_dict,
                                    {"paper": list(papers), "author": list(authors)}, index=PAPER)
        assert abs(result - expected) < 1e-12 * relevance.abs().sum()
    assert abs(result - relevance.sum()) < 1e-12 * relevance.abs().sum()  # every node


def test_hetero_walks_select_and_group() -> None:
    data = dense_graph(seed=4)
    walks, relevance = relevant_walks(prepared("to_hetero", data, seed=4), data.x_dict, data.edge_index_dict,
                                      index=PAPER, composite=LRP0)
    assert walks.node_types == ("paper", "author")
    first = walks[:3]
    assert len(first) == 3 and first.steps(1) == walks.steps(1) and walks[1].steps(0) == walks.steps(1)
    groups = walks.by_types()
    assert sorted(int(row) for rows in groups.values() for row in rows) == list(range(len(walks)))
    for kinds, rows in groups.items():
        assert all(tuple(kind for kind, _ in walks.steps(row)) == kinds for row in rows.tolist())


class LinkScore(nn.Module):
    """A ``to_hetero`` encoder and a dot-product score of (author, paper) pairs."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.encoder = to_hetero(Encoder(), metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict, edge_label_index):
        z = self.encoder(x_dict, edge_index_dict)
        return (z["author"][edge_label_index[0]] * z["paper"][edge_label_index[1]]).sum(dim=-1)


def test_author_paper_link_walks_end_at_the_pair() -> None:
    """Edge level on a heterogeneous graph: walks end at the author or the paper of the scored
    pair, and decompose the node relevance (LRP-0: half of gradient x input, the dot product's
    two factors getting equal halves)."""
    data = dense_graph(seed=5)
    pairs = torch.tensor([[0, 3, 1], [5, 2, 4]])
    torch.manual_seed(5)
    model = LinkScore(data.metadata()).double()
    model(data.x_dict, data.edge_index_dict, pairs)
    model.eval()
    row = 1
    walks, relevance = relevant_walks(model, data.x_dict, data.edge_index_dict, index=row, composite=LRP0,
                                      edge_label_index=pairs)
    found = per_node(walks, relevance, data)
    reference = gradient_times_input(model, data, lambda out: out[row], edge_label_index=pairs)
    explain = fxlrp.convert(model, LRP0)
    expected = graph_relevance(explain, data.x_dict, data.edge_index_dict, index=row, mode="regression",
                               edge_label_index=pairs).node
    scale = max(value.abs().max() for value in reference.values())
    assert scale > 0
    for node_type in reference:
        assert (found[node_type] - expected[node_type].sum(dim=1)).abs().max() < 1e-12 * scale
        assert (found[node_type] - 0.5 * reference[node_type]).abs().max() < 1e-10 * scale
    assert {walk[-1] for walk in typed(walks, relevance)} == {("author", 3), ("paper", 2)}


def test_inputs_that_are_not_a_heterogeneous_graph_are_refused() -> None:
    data = dense_graph()
    model = prepared("to_hetero", data)
    with pytest.raises(ValueError, match="both be tensors .* or both dicts"):
        relevant_walks(model, data.x_dict, data[CITES].edge_index, index=0)
    with pytest.raises(ValueError, match="steps= names node states of a homogeneous model"):
        relevant_walks(model, data.x_dict, data.edge_index_dict, index=0, steps=["encoder_conv1"])
    with pytest.raises(ValueError, match=r"give nodes as a dict \{node type: node ids\}"):
        subgraph_relevance(model, data.x_dict, data.edge_index_dict, [0, 1], index=0)
    with pytest.raises(ValueError, match=r"node types \['venue'\] are not in x"):
        subgraph_relevance(model, data.x_dict, data.edge_index_dict, {"venue": [0]}, index=0)
    with pytest.raises(ValueError, match="no features in x"):
        relevant_walks(model, {"paper": data["paper"].x}, data.edge_index_dict, index=0)


def test_the_documented_example() -> None:
    """docs/pyg.md's example (heterogeneous walks, subgraph relevance, link prediction), run in
    float64 and checked against the enumeration and graph_relevance."""
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "pyg.md"
    text = docs.read_text()
    marker = text.index("test_relevant_walks_hetero.py::test_the_documented_example")
    block = text[text.index("```python\n", marker) + len("```python\n"):]
    block = block[:block.index("```")]
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        found: dict = {}
        exec(compile(block, str(docs), "exec"), found)  # noqa: S102  (the documentation's own code)
    finally:
        torch.set_default_dtype(previous)
    model, data, walks, relevance = found["model"], found["data"], found["walks"], found["relevance"]
    every, values = relevant_walks(model, data.x_dict, data.edge_index_dict, index=3)
    order = torch.argsort(values, descending=True)[:5]
    assert torch.equal(relevance, values[order]) and torch.equal(walks.ids, every.ids[order])
    assert all(walks.steps(row)[-1] == ("paper", 3) for row in range(len(walks)))
    expected = graph_relevance(fxlrp.convert(model), data.x_dict, data.edge_index_dict, index=3).node
    sums = per_node(every, values, data)
    scale = max(value.abs().max() for value in expected.values())
    assert scale > 0 and all((sums[kind] - value.sum(dim=1)).abs().max() < 1e-12 * scale
                             for kind, value in expected.items())
    inside = {("paper", 2), ("paper", 3), ("author", 1)}
    assert abs(found["inside"] - sum(value for walk, value in typed(every, values).items() if set(walk) <= inside)) \
        < 1e-12 * values.abs().sum()
    scorer, pairs = found["scorer"], found["pairs"]
    link_walks, link_relevance = found["link_walks"], found["link_relevance"]
    assert {walk[-1] for walk in typed(link_walks, link_relevance)} == {("author", 2), ("paper", 3)}
    link_expected = graph_relevance(fxlrp.convert(scorer), data.x_dict, data.edge_index_dict, index=1,
                                    mode="regression", edge_label_index=pairs).node
    link_sums = per_node(link_walks, link_relevance, data)
    link_scale = max(value.abs().max() for value in link_expected.values())
    assert link_scale > 0 and all((link_sums[kind] - value.sum(dim=1)).abs().max() < 1e-12 * link_scale
                                  for kind, value in link_expected.items())
