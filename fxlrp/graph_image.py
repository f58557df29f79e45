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

from fxlrp.image import ArrayLike, as_numpy, colour_map


def _symmetric_limit(values: np.ndarray) -> float:
    limit = float(np.abs(values).max()) if values.size else 0.0
    return limit if limit > 0 else 1.0


def _edge_list(edge_index: ArrayLike) -> list[tuple[int, int]]:
    index = np.asarray(edge_index.detach().cpu() if isinstance(edge_index, torch.Tensor) else edge_index)
    if index.ndim != 2 or index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, edges] (senders, receivers), got {index.shape}")
    return [(int(sender), int(receiver)) for sender, receiver in index.T]


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
    from matplotlib import pyplot
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

    graph = networkx.DiGraph()
    graph.add_nodes_from(range(nodes.shape[0]))
    graph.add_edges_from(edges)
    positions = dict(positions) if positions is not None else networkx.spring_layout(graph, seed=seed)
    colours = colour_map(cmap)

    if axis is None:
        figure, axis = pyplot.subplots(figsize=(7, 5.5))
    else:
        figure = axis.figure
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
    from matplotlib import pyplot

    figure = draw_graph_relevance(edge_index, node_relevance, edge_relevance, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot.close(figure)
    return path
