"""``fxlrp.attribute(..., target=[t1, ..., tk])``: relevance ``[k, ...]`` from one forward pass
(or from repeated inputs with ``repeat=``), equal to ``k`` separate attributions (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.toys.digits import DigitsCNN


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.fixture(scope="module")
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return DigitsCNN().double().eval()


@pytest.mark.parametrize("composite", [fxlrp.rules.Epsilon(1e-6), fxlrp.composites.EpsilonPlusFlat()],
                         ids=["epsilon", "epsilon_plus_flat"])
def test_many_targets_of_a_batch_equal_separate_attributions(cnn: nn.Module, composite: object) -> None:
    explain = fxlrp.convert(cnn, composite)
    images = torch.rand(2, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    targets = [0, 3, torch.tensor([1, 9]), (2, 5), None, 7]
    together = fxlrp.attribute(explain, images, target=targets)
    assert together.shape == (6, 2, 1, 8, 8)
    for row, target in enumerate(targets):
        alone = fxlrp.attribute(explain, images, target=target)
        assert relative_error(together[row], alone) < 1e-12, target

    indices = [0, 3, torch.tensor([1, 9]), 7, 4]
    repeated = fxlrp.attribute(explain, images, target=indices, repeat=2)  # passes of 2, 2 and 1 copies
    assert repeated.shape == (5, 2, 1, 8, 8)
    for row, target in enumerate(indices):
        assert relative_error(repeated[row], fxlrp.attribute(explain, images, target=target)) < 1e-12, target


def test_nodes_and_several_inputs_are_stacked_too(cnn: nn.Module) -> None:
    explain = fxlrp.convert(cnn, fxlrp.rules.Epsilon(1e-6))
    image = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    relevance, nodes = fxlrp.attribute_nodes(explain, [image], ["features_1"], target=[2, 4, 6])
    assert isinstance(relevance, tuple) and relevance[0].shape == (3, 1, 1, 8, 8)
    for row, target in enumerate([2, 4, 6]):
        (alone,), alone_nodes = fxlrp.attribute_nodes(explain, [image], ["features_1"], target=target)
        assert relative_error(relevance[0][row], alone) < 1e-12
        assert relative_error(nodes["features_1"][row], alone_nodes["features_1"]) < 1e-12
    repeated, repeated_nodes = fxlrp.attribute_nodes(explain, [image], ["features_1"], target=[2, 4, 6], repeat=3)
    assert relative_error(repeated[0], relevance[0]) < 1e-12
    assert relative_error(repeated_nodes["features_1"], nodes["features_1"]) < 1e-12


class ScatterGCN(nn.Module):
    """Two GCN layers (``index_select`` and ``torch_scatter.scatter_add``), a score per node."""

    def __init__(self, features: int = 6, hidden: int = 16) -> None:
        super().__init__()
        self.first = nn.Linear(features, hidden)
        self.second = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, edge_index: Tensor, norm: Tensor) -> Tensor:
        from torch_scatter import scatter_add

        source, target = edge_index[0], edge_index[1]
        h = self.first(x).index_select(0, source) * norm[:, None]
        h = torch.relu(scatter_add(h, target, dim=0, dim_size=x.size(0)))
        h = self.second(h).index_select(0, source) * norm[:, None]
        return scatter_add(h, target, dim=0, dim_size=x.size(0)).squeeze(-1)


def test_many_nodes_of_one_graph_from_one_forward() -> None:
    pytest.importorskip("torch_scatter")
    generator = torch.Generator().manual_seed(2)
    nodes, edges = 30, 120
    edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
    norm = torch.rand(edges, dtype=torch.float64, generator=generator)
    x = torch.randn(nodes, 6, dtype=torch.float64, generator=generator)
    torch.manual_seed(3)
    explain = fxlrp.convert(ScatterGCN().double().eval(), fxlrp.composites.EpsilonPlusFlat())
    explained = [0, 4, 11, 29, 17]
    together = fxlrp.attribute(explain, [x, edge_index, norm], target=explained)
    assert together[0].shape == (5, nodes, 6) and together[1] is None and together[2].shape == (5, edges)
    for row, node in enumerate(explained):
        alone = fxlrp.attribute(explain, [x, edge_index, norm], target=node)
        assert relative_error(together[0][row], alone[0]) < 1e-12, node
        assert relative_error(together[2][row], alone[2]) < 1e-12, node


def test_bad_many_targets(cnn: nn.Module) -> None:
    explain = fxlrp.convert(cnn, fxlrp.rules.Epsilon(1e-6))
    image = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="names no target"):
        fxlrp.attribute(explain, image, target=[])
    with pytest.raises(ValueError, match="takes class indices as targets"):
        fxlrp.attribute(explain, image, target=[(1, 2)], repeat=4)
