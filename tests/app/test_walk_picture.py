"""The picture of relevant walks (fxlrp.viz.graph_image.draw_walks / save_walks), read back from
the matplotlib figure: which nodes are drawn (against torch_geometric's k_hop_subgraph and a
breadth-first search written here), that a step staying at a node is a small loop at that node,
that every drawn node has its label, and that every option is in the signature and the docstring."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

pytest.importorskip("matplotlib")
pytest.importorskip("networkx")

from matplotlib import patches, pyplot  # noqa: E402
from torch_geometric.utils import k_hop_subgraph  # noqa: E402

from fxlrp.viz.graph_image import draw_walks, save_walks  # noqa: E402


def sixty_nodes() -> Tensor:
    """A random undirected graph on nodes 0-58, both directions of each edge, and node 59 without
    edges (the last id, so that the graph has 60 nodes)."""
    generator = torch.Generator().manual_seed(1)
    pairs = torch.combinations(torch.arange(59))
    chosen = pairs[torch.rand(len(pairs), generator=generator) < 0.06]
    return torch.cat([chosen.T, chosen.T.flip(0)], dim=1)


def walks_into(edge_index: Tensor, node: int) -> tuple[Tensor, Tensor]:
    """Walks of length 2 into ``node`` along edges, one of them staying at a neighbour (a
    self-loop step), with made-up relevance of both signs."""
    senders = edge_index[0, edge_index[1] == node].tolist()
    first, second = senders[0], senders[1]
    before = edge_index[0, edge_index[1] == first].tolist()
    walks = torch.tensor([[before[0], first, node], [first, first, node], [second, node, node], [node, second, node]])
    return walks, torch.tensor([0.5, -0.25, 0.125, 1.0])


def drawn_labels(figure) -> dict[str, np.ndarray]:
    """The label text of each drawn node and where it is (data coordinates: the node's centre)."""
    return {text.get_text(): np.asarray(text.get_position(), dtype=float) for text in figure.axes[0].texts}


def breadth_first(edge_index: Tensor, node: int, hops: int) -> set[int]:
    """Nodes that reach ``node`` in at most ``hops`` steps from sender to receiver."""
    reached = {node}
    for _ in range(hops):
        reached |= {int(sender) for sender, receiver in edge_index.T.tolist() if receiver in reached}
    return reached


def test_the_picture_shows_the_neighbourhood_of_the_explained_node() -> None:
    """By default the nodes within the walks' length (2 here) of the explained node, as
    k_hop_subgraph finds them, and no other: not the whole 60-node graph nor its node without
    edges (it drew all 60 before, most of the canvas empty)."""
    edge_index = sixty_nodes()
    walks, relevance = walks_into(edge_index, 0)
    figure = draw_walks(edge_index, walks, relevance)
    subset, _, _, _ = k_hop_subgraph(0, 2, edge_index, num_nodes=60, flow="source_to_target")
    expected = set(subset.tolist()) | set(walks.view(-1).tolist())
    assert expected == breadth_first(edge_index, 0, 2)
    assert set(drawn_labels(figure)) == {str(node) for node in expected}
    [discs] = figure.axes[0].collections[1:2]  # the background edges' lines, then the nodes' discs
    assert len(discs.get_offsets()) == len(expected) < 60
    pyplot.close(figure)

    figure = draw_walks(edge_index, walks, relevance, hops=1)
    one_hop = set(k_hop_subgraph(0, 1, edge_index, num_nodes=60)[0].tolist()) | set(walks.view(-1).tolist())
    assert set(drawn_labels(figure)) == {str(node) for node in one_hop}
    pyplot.close(figure)

    figure = draw_walks(edge_index, walks, relevance, whole_graph=True, nodes=60)
    positions = drawn_labels(figure)
    assert set(positions) == {str(node) for node in range(60)}
    # the node without edges sits beside the rest, not far off at the picture's edge
    others = np.stack([where for label, where in positions.items() if label != "59"])
    span = np.ptp(others, axis=0).max()
    assert np.linalg.norm(others - positions["59"], axis=1).min() < 0.5 * span
    pyplot.close(figure)


def test_a_walk_that_leaves_early_ends_at_its_last_node() -> None:
    """Jumping knowledge: ``-1`` after a walk's last node; the explained node is that last node."""
    path = torch.arange(7)
    edge_index = torch.cat([torch.stack([path[:-1], path[1:]]), torch.stack([path[1:], path[:-1]])], dim=1)
    walks = torch.tensor([[2, 3, -1], [3, 3, 3]])
    figure = draw_walks(edge_index, walks, torch.tensor([1.0, 0.5]))
    assert set(drawn_labels(figure)) == {"1", "2", "3", "4", "5"}  # within 2 hops of node 3
    pyplot.close(figure)


def loop_and_node_in_pixels(figure, node: int) -> tuple[list, np.ndarray, float]:
    """The loops drawn (their extents on the canvas, pixels), the node's centre and disc radius
    (pixels)."""
    figure.canvas.draw()
    axis = figure.axes[0]
    centre = axis.transData.transform(drawn_labels(figure)[str(node)])
    discs = axis.collections[1]
    index = [text.get_text() for text in axis.texts].index(str(node))
    radius = np.sqrt(discs.get_sizes()[index]) / 2 * figure.dpi / 72
    loops = [patch.get_window_extent() for patch in axis.patches if isinstance(patch, patches.Circle)]
    return loops, centre, float(radius)


@pytest.mark.parametrize("whole_graph", [False, True])
def test_a_step_that_stays_at_a_node_is_a_small_loop_at_that_node(whole_graph: bool) -> None:
    """The walk [n, n, 0] stays at n: its loop touches n's disc, is a circle no wider than the
    disc, and covers no other node (it was an ellipse as wide as several nodes, over another)."""
    edge_index = sixty_nodes()
    walks, relevance = walks_into(edge_index, 0)
    staying = int(walks[1, 0])
    walks, relevance = walks[1:2], relevance[1:2]
    figure = draw_walks(edge_index, walks, relevance, **({"whole_graph": True, "nodes": 60} if whole_graph else {}))
    [loop], centre, radius = loop_and_node_in_pixels(figure, staying)
    loop_centre = np.array([(loop.x0 + loop.x1) / 2, (loop.y0 + loop.y1) / 2])
    assert abs(loop.width - loop.height) < 0.02 * loop.width  # a circle on the canvas
    assert loop.width <= 2 * radius * 1.05
    distance = np.linalg.norm(loop_centre - centre)
    assert radius <= distance <= radius + loop.width / 2 + 1  # just outside the disc, touching it
    axis = figure.axes[0]
    for label, where in drawn_labels(figure).items():
        if label != str(staying):
            other = axis.transData.transform(where)
            assert not (loop.x0 <= other[0] <= loop.x1 and loop.y0 <= other[1] <= loop.y1), label
            assert np.linalg.norm(loop_centre - other) > distance
    pyplot.close(figure)


def test_several_loops_at_one_node_are_told_apart() -> None:
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    walks = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    figure = draw_walks(edge_index, walks, torch.tensor([1.0, -1.0, 0.5]))
    loops, centre, radius = loop_and_node_in_pixels(figure, 1)
    assert len(loops) == 7  # one per step that stays: 2 + 1 at node 1, 1 + 3 at node 0
    at_one = [loop for loop in loops
              if np.linalg.norm(np.array([(loop.x0 + loop.x1) / 2, (loop.y0 + loop.y1) / 2]) - centre) < 3 * radius]
    assert len(at_one) == 3 and len({round(loop.width, 3) for loop in at_one}) == 3
    pyplot.close(figure)


def test_labels_are_the_given_ones_and_fit_their_discs() -> None:
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    walks = torch.tensor([[2, 1, 0], [1, 1, 0]])
    labels = {0: "start\nc2", 1: "hub", 2: "302", 3: "x"}
    figure = draw_walks(edge_index, walks, torch.tensor([1.0, -0.5]), labels=labels, font_size=11)
    figure.canvas.draw()
    axis = figure.axes[0]
    texts = {text.get_text(): text for text in axis.texts}
    assert set(texts) == {"start\nc2", "hub", "302"}  # node 3 is 3 hops from node 0: not drawn
    sizes = axis.collections[1].get_sizes()
    renderer = figure.canvas.get_renderer()
    for index, text in enumerate(axis.texts):
        assert text.get_fontsize() == 11
        extent = text.get_window_extent(renderer)
        diameter = np.sqrt(sizes[index]) * figure.dpi / 72
        assert max(extent.width, extent.height) <= diameter
    pyplot.close(figure)


def test_every_option_is_named_and_documented(tmp_path: Path) -> None:
    """help(save_walks) lists its options (it said ``**options`` and sent the reader on twice)."""
    for function in (draw_walks, save_walks):
        parameters = inspect.signature(function).parameters
        assert not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
        documented = inspect.getdoc(function).split("Parameters\n----------\n")[1].split("\nReturns")[0]
        for name in parameters:
            assert f"\n{name} : " in "\n" + documented, (function.__name__, name)
    drawing = set(inspect.signature(draw_walks).parameters) - {"axis"}
    saving = set(inspect.signature(save_walks).parameters) - {"path", "dpi"}
    assert drawing == saving
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    path = save_walks(tmp_path / "walks.png", edge_index, torch.tensor([[2, 1, 0]]), torch.tensor([1.0]),
                      title="t", dpi=50)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_errors_name_what_is_wrong() -> None:
    edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="name node 5, but the graph has nodes=3"):
        draw_walks(edge_index, torch.tensor([[5, 1, 0]]), torch.tensor([1.0]), nodes=3)
    with pytest.raises(ValueError, match=r"positions has no place for node\(s\) \[1\]"):
        draw_walks(edge_index, torch.tensor([[1, 0]]), torch.tensor([1.0]), positions={0: (0.0, 0.0)})
    with pytest.raises(ValueError, match="one relevance each"):
        draw_walks(edge_index, torch.tensor([[1, 0]]), torch.tensor([1.0, 2.0]))
