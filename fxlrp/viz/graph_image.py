"""Node and edge relevance drawn on the graph (networkx + matplotlib).

Nodes are filled with the colour of their relevance, edges drawn in the colour of theirs, both on
one diverging colour map centred at zero (red positive, blue negative by default) with a colour
bar each. Node size grows with ``|relevance|`` so that the relevant part stands out even in
grey-scale print. Needs ``pip install fxlrp[pictures]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fxlrp.viz.image import ArrayLike, as_numpy, colour_map


def _symmetric_limit(values: np.ndarray) -> float:
    limit = float(np.abs(values).max()) if values.size else 0.0
    return limit if limit > 0 else 1.0


def _edge_list(edge_index: ArrayLike) -> list[tuple[int, int]]:
    index = np.asarray(edge_index.detach().cpu() if isinstance(edge_index, torch.Tensor) else edge_index)
    if index.ndim != 2 or index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, edges] (senders, receivers), got {index.shape}")
    return [(int(sender), int(receiver)) for sender, receiver in index.T]


def _graph_on_axis(edges: list[tuple[int, int]], count: int, positions: Mapping[int, Sequence[float]] | None,
                   seed: int, axis: Any) -> tuple[Any, dict, Any, Any]:
    """The directed graph of ``count`` nodes, its node positions (a spring layout unless given),
    and the figure and axis to draw on (a new figure unless ``axis`` is given)."""
    import networkx
    from matplotlib import pyplot

    graph = networkx.DiGraph()
    graph.add_nodes_from(range(count))
    graph.add_edges_from(edges)
    positions = dict(positions) if positions is not None else networkx.spring_layout(graph, seed=seed)
    if axis is None:
        figure, axis = pyplot.subplots(figsize=(7, 5.5))
    else:
        figure = axis.figure
    return graph, positions, figure, axis


def _saved(figure: Any, path: str | Path) -> Path:
    """``figure`` written to the PNG file ``path`` (its folder made) and closed."""
    from matplotlib import pyplot

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot.close(figure)
    return path


def draw_graph_relevance(
    edge_index: ArrayLike,
    node_relevance: ArrayLike,
    edge_relevance: ArrayLike | None = None,
    *,
    positions: Mapping[int, Sequence[float]] | None = None,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] = (),
    dashed: Sequence[bool] | None = None,
    title: str | None = None,
    cmap: str = "bwr",
    axis: Any = None,
    seed: int = 0,
) -> Any:
    """Draw relevance on a directed graph and return the matplotlib figure.

    ``edge_index``: ``[2, edges]`` senders and receivers. ``node_relevance``: ``[nodes]`` (sum
    the feature relevance of each node first). ``edge_relevance``: ``[edges]`` or None.
    ``highlight``: nodes drawn with a thick black ring (e.g. the explained node).
    ``dashed``: per edge, whether to draw it dashed (e.g. edges of a second kind).
    Every edge is drawn in light grey first, so edges without relevance stay visible.
    Node colours and edge colours each use a symmetric scale ``[-max|R|, max|R|]`` so white
    (bwr) or black (cold_and_hot) means zero relevance.
    """
    import matplotlib

    matplotlib.use("Agg")
    import networkx
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    nodes = as_numpy(node_relevance).reshape(-1)
    edges = _edge_list(edge_index)
    edge_values = None if edge_relevance is None else as_numpy(edge_relevance).reshape(-1)
    if edge_values is not None and edge_values.shape[0] != len(edges):
        raise ValueError(f"{edge_values.shape[0]} edge relevances for {len(edges)} edges")
    if edges and max(max(edge) for edge in edges) >= nodes.shape[0]:
        raise ValueError(f"edge_index refers to node {max(max(edge) for edge in edges)}, "
                         f"but node_relevance has {nodes.shape[0]} nodes")

    graph, positions, figure, axis = _graph_on_axis(edges, nodes.shape[0], positions, seed, axis)
    colours = colour_map(cmap)
    node_norm = Normalize(-_symmetric_limit(nodes), _symmetric_limit(nodes))
    sizes = 120 + 600 * np.abs(nodes) / _symmetric_limit(nodes)
    rings = ["black" if node in set(highlight) else "grey" for node in graph.nodes]
    widths = [3.0 if node in set(highlight) else 0.8 for node in graph.nodes]
    networkx.draw_networkx_nodes(graph, positions, ax=axis, node_color=nodes, cmap=colours,
                                 vmin=node_norm.vmin, vmax=node_norm.vmax, node_size=sizes,
                                 edgecolors=rings, linewidths=widths)
    networkx.draw_networkx_labels(graph, positions, labels=dict(labels) if labels else None, ax=axis, font_size=7)
    styles = ["dashed" if flag else "solid" for flag in dashed] if dashed is not None else ["solid"] * len(edges)
    if len(styles) != len(edges):
        raise ValueError(f"{len(styles)} dashed flags for {len(edges)} edges")
    networkx.draw_networkx_edges(graph, positions, edgelist=edges, ax=axis, edge_color="lightgrey", width=1.0,
                                 style=styles, arrows=True, arrowsize=8, node_size=sizes,
                                 connectionstyle="arc3,rad=0.08")
    bars = [(node_norm, "node relevance", "vertical")]
    if edge_values is not None:
        edge_norm = Normalize(-_symmetric_limit(edge_values), _symmetric_limit(edge_values))
        relevant = [index for index, value in enumerate(edge_values) if value != 0]
        networkx.draw_networkx_edges(
            graph, positions, edgelist=[edges[index] for index in relevant], ax=axis,
            edge_color=[edge_values[index] for index in relevant], edge_cmap=colours,
            edge_vmin=edge_norm.vmin, edge_vmax=edge_norm.vmax,
            width=[0.8 + 3.5 * abs(edge_values[index]) / edge_norm.vmax for index in relevant],
            style=[styles[index] for index in relevant], arrows=True, arrowsize=12, node_size=sizes,
            connectionstyle="arc3,rad=0.08")
        bars.append((edge_norm, "edge relevance", "horizontal"))
    for norm, label, orientation in bars:
        figure.colorbar(ScalarMappable(norm, colours), ax=axis, orientation=orientation, fraction=0.04,
                        pad=0.02, aspect=30, label=label)
    if title:
        axis.set_title(title, fontsize=10)
    axis.set_axis_off()
    return figure


def save_graph_relevance(path: str | Path, edge_index: ArrayLike, node_relevance: ArrayLike,
                         edge_relevance: ArrayLike | None = None, **options: Any) -> Path:
    """:func:`draw_graph_relevance` written to a PNG file; returns the path."""
    return _saved(draw_graph_relevance(edge_index, node_relevance, edge_relevance, **options), path)


def draw_walks(
    edge_index: ArrayLike,
    walks: ArrayLike,
    relevance: ArrayLike,
    *,
    nodes: int | None = None,
    positions: Mapping[int, Sequence[float]] | None = None,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] = (),
    title: str | None = None,
    cmap: str = "bwr",
    axis: Any = None,
    seed: int = 0,
) -> Any:
    """Draw relevant walks on the graph (from :func:`fxlrp.integrations.pyg.relevant_walks`) and return the figure.

    ``walks``: ``[W, L + 1]`` node ids, input layer first (``-1`` after the last node of a walk
    that leaves early, as with jumping knowledge); ``relevance``: ``[W]``. Each walk is a
    curved path through its nodes, an arrow on its last hop (towards the explained node), in the
    colour of its relevance on a symmetric diverging scale (red positive, blue negative by
    default), as wide as ``|relevance|`` is large; a step that stays at a node (self-loop, root
    term) is a small loop beside it. Walks sharing hops bend apart; the most relevant are drawn
    on top. ``nodes``: the number of nodes (default: the largest id in ``edge_index`` and
    ``walks``, plus one); the other options as for :func:`draw_graph_relevance`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import networkx
    from matplotlib import patches
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    edges = _edge_list(edge_index)
    paths = np.asarray(as_numpy(walks), dtype=np.int64)
    values = as_numpy(relevance).reshape(-1)
    if paths.ndim != 2 or paths.shape[0] != values.shape[0]:
        raise ValueError(f"walks must have shape [W, L + 1] with one relevance each, got {paths.shape} and "
                         f"{values.shape[0]} relevances")
    largest = max([max(edge) for edge in edges] + [int(paths.max()) if paths.size else -1])
    count = nodes if nodes is not None else largest + 1
    graph, positions, figure, axis = _graph_on_axis(edges, count, positions, seed, axis)
    colours = colour_map(cmap)
    on_walks = set(paths.reshape(-1).tolist()) - {-1}
    networkx.draw_networkx_edges(graph, positions, edgelist=edges, ax=axis, edge_color="lightgrey", width=0.8,
                                 arrows=False)
    norm = Normalize(-_symmetric_limit(values), _symmetric_limit(values))
    points = np.asarray([positions[node] for node in graph.nodes], dtype=float)
    centroid = points.mean(axis=0)
    span = float(np.ptp(points, axis=0).max()) or 1.0
    hops_drawn: dict[tuple[int, int], int] = {}
    for order in np.argsort(np.abs(values), kind="stable"):  # the most relevant last, on top
        colour = colours(norm(values[order]))
        width = 0.8 + 3.2 * abs(values[order]) / norm.vmax
        path = [node for node in paths[order].tolist() if node >= 0]  # -1: the walk left early
        for hop, (start, end) in enumerate(zip(path, path[1:], strict=False)):
            seen = hops_drawn.get((start, end), 0)
            hops_drawn[(start, end)] = seen + 1
            if start == end:  # a loop beside the node, on the side away from the graph's centre
                where = np.asarray(positions[start], dtype=float)
                outward = where - centroid
                outward = outward / np.linalg.norm(outward) if np.linalg.norm(outward) > 0 else np.array([0.0, 1.0])
                radius = span * (0.018 + 0.008 * seen)
                axis.add_patch(patches.Circle(tuple(where + outward * (span * 0.02 + radius)), radius, fill=False,
                                              edgecolor=colour, linewidth=width, zorder=3))
                continue
            axis.add_patch(patches.FancyArrowPatch(
                tuple(positions[start]), tuple(positions[end]), connectionstyle=f"arc3,rad={0.15 + 0.12 * seen}",
                arrowstyle="-|>" if hop == len(path) - 2 else "-", mutation_scale=10 + 2 * width, color=colour,
                linewidth=width, shrinkA=7, shrinkB=7, zorder=3))
    drawn = networkx.draw_networkx_nodes(
        graph, positions, ax=axis, node_size=[160 if node in on_walks else 60 for node in graph.nodes],
        node_color=["white" if node in on_walks else "whitesmoke" for node in graph.nodes],
        edgecolors=["black" if node in set(highlight) else "grey" for node in graph.nodes],
        linewidths=[2.5 if node in set(highlight) else 0.8 for node in graph.nodes])
    drawn.set_zorder(4)
    for text in networkx.draw_networkx_labels(graph, positions, labels=dict(labels) if labels else None, ax=axis,
                                              font_size=7).values():
        text.set_zorder(5)
    figure.colorbar(ScalarMappable(norm, colours), ax=axis, fraction=0.04, pad=0.02, aspect=30,
                    label="walk relevance")
    if title:
        axis.set_title(title, fontsize=10)
    axis.set_axis_off()
    return figure


def save_walks(path: str | Path, edge_index: ArrayLike, walks: ArrayLike, relevance: ArrayLike,
               **options: Any) -> Path:
    """:func:`draw_walks` written to a PNG file; returns the path."""
    return _saved(draw_walks(edge_index, walks, relevance, **options), path)
