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


def _saved(figure: Any, path: str | Path, dpi: int = 110) -> Path:
    """``figure`` written to the PNG file ``path`` (its folder made) and closed."""
    from matplotlib import pyplot

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
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


def save_graph_relevance(
    path: str | Path,
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
    seed: int = 0,
) -> Path:
    """Draw relevance on a directed graph (:func:`draw_graph_relevance`) into a PNG file.

    Parameters
    ----------
    path : str or Path
        The PNG file to write (its folder is made).
    edge_index : array-like of int, shape [2, edges]
        Senders and receivers.
    node_relevance : array-like, shape [nodes]
        One relevance per node (sum the feature relevance of each node first).
    edge_relevance : array-like, shape [edges], optional
        One relevance per edge.
    positions : mapping of node id to (x, y), optional
        Node positions; a spring layout (``seed``) by default.
    labels : mapping of node id to str, optional
        Node labels; the node ids by default.
    highlight : sequence of int
        Nodes drawn with a thick black ring (e.g. the explained node).
    dashed : sequence of bool, optional
        Per edge, whether to draw it dashed (edges of a second kind).
    title : str, optional
        The picture's title.
    cmap : str
        A diverging matplotlib colour map (``"bwr"``: red positive, blue negative).
    seed : int
        Seed of the spring layout.

    Returns
    -------
    Path
        ``path``.
    """
    return _saved(draw_graph_relevance(edge_index, node_relevance, edge_relevance, positions=positions, labels=labels,
                                       highlight=highlight, dashed=dashed, title=title, cmap=cmap, seed=seed), path)


def walk_ends(walks: ArrayLike) -> list[int]:
    """The nodes the walks end at (the explained node, or nodes), in order of first appearance:
    each walk's last node id that is not ``-1`` (a walk that leaves early, as with jumping
    knowledge, is padded with ``-1`` after its last node)."""
    paths = np.asarray(as_numpy(walks), dtype=np.int64)
    ends: dict[int, None] = {}
    for path in paths.reshape(len(paths), -1) if paths.size else []:
        kept = path[path >= 0]
        if kept.size:
            ends[int(kept[-1])] = None
    return list(ends)


def neighbourhood(edges: Sequence[tuple[int, int]], ends: Sequence[int], hops: int) -> set[int]:
    """The nodes from which one of ``ends`` is reached in at most ``hops`` steps along the edges
    (sender to receiver, the direction messages and walks take), ``ends`` included."""
    incoming: dict[int, list[int]] = {}
    for sender, receiver in edges:
        incoming.setdefault(receiver, []).append(sender)
    reached, frontier = set(ends), set(ends)
    for _ in range(hops):
        frontier = {sender for node in frontier for sender in incoming.get(node, ())} - reached
        if not frontier:
            break
        reached |= frontier
    return reached


def _packed_layout(graph: Any, seed: int) -> dict[int, np.ndarray]:
    """Positions for an undirected view of ``graph``: a spring layout per connected component,
    scaled to the square root of its size, the components packed in rows (the largest first), so
    that a node without edges sits beside the rest instead of being pushed to the picture's edge."""
    import networkx

    undirected = networkx.Graph(graph)
    undirected.remove_edges_from(networkx.selfloop_edges(undirected))
    components = sorted((sorted(component) for component in networkx.connected_components(undirected)),
                        key=lambda component: (-len(component), component[0]))
    placed: list[tuple[list[int], dict[int, np.ndarray], float, float]] = []
    for component in components:
        if len(component) == 1:
            local = {component[0]: np.zeros(2)}
        else:
            local = {node: np.asarray(where, dtype=float) for node, where in networkx.spring_layout(
                undirected.subgraph(component), seed=seed, scale=float(np.sqrt(len(component)))).items()}
        points = np.stack(list(local.values()))
        low = points.min(axis=0)
        size = points.max(axis=0) - low
        placed.append((component, {node: where - low for node, where in local.items()}, float(size[0]), float(size[1])))
    gap = 1.0
    row_width = max(max(width for _, _, width, _ in placed),
                    float(np.sqrt(sum((width + gap) * (height + gap) for _, _, width, height in placed))) * 1.3)
    positions: dict[int, np.ndarray] = {}
    x = y = row_height = 0.0
    for _, local, width, height in placed:
        if x > 0 and x + width > row_width:
            x, y, row_height = 0.0, y - row_height - gap, 0.0
        for node, where in local.items():
            positions[node] = where + np.array([x, y - height])
        x += width + gap
        row_height = max(row_height, height)
    return positions


def _node_diameter(label: str, font_size: float) -> float:
    """A node's diameter in points: its label fits inside."""
    lines = label.split("\n")
    return max(0.62 * font_size * max(len(line) for line in lines), 1.25 * font_size * len(lines)) + 0.6 * font_size


def draw_walks(
    edge_index: ArrayLike,
    walks: ArrayLike,
    relevance: ArrayLike,
    *,
    nodes: int | None = None,
    hops: int | None = None,
    whole_graph: bool = False,
    positions: Mapping[int, Sequence[float]] | None = None,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] | None = None,
    title: str | None = None,
    cmap: str = "bwr",
    font_size: float = 9.0,
    axis: Any = None,
    seed: int = 0,
) -> Any:
    """Draw relevant walks on the graph around the explained node and return the figure.

    The walks come from :func:`fxlrp.integrations.pyg.relevant_walks`. Each walk is a curved path
    through its nodes, an arrow on its last hop (towards the explained node), in the colour of its
    relevance on a symmetric diverging scale (red positive, blue negative by default) and as wide
    as ``|relevance|`` is large; a step that stays at a node (a self-loop, the root term) is a
    small loop at that node, on the side away from its neighbours. Walks sharing a hop bend apart;
    the most relevant are drawn on top. Nodes on walks are white, the others grey; every node
    shows its label, inside a disc that fits it.

    Parameters
    ----------
    edge_index : array-like of int, shape [2, edges]
        Senders and receivers (messages go from sender to receiver).
    walks : array-like of int, shape [W, L + 1]
        Node ids of each walk, input layer first, the explained node last; ``-1`` after the last
        node of a walk that leaves early (jumping knowledge).
    relevance : array-like, shape [W]
        One relevance per walk.
    nodes : int, optional
        The number of nodes of the graph (default: the largest id in ``edge_index`` and ``walks``,
        plus one); only ``whole_graph`` draws nodes without edges beyond those.
    hops : int, optional
        The neighbourhood drawn: the nodes from which the explained node (the walks' last nodes)
        is reached in at most ``hops`` steps along the edges, and every node of a walk. Default:
        the walks' length ``L``, so that every node a walk of that length could start from is
        drawn.
    whole_graph : bool
        Draw every node of the graph instead of the neighbourhood (``hops`` is then not used).
    positions : mapping of node id to (x, y), optional
        Node positions (for the nodes drawn); by default a spring layout of each connected part of
        what is drawn, the parts packed side by side.
    labels : mapping of node id to str, optional
        Node labels (may hold line breaks); the node ids by default.
    highlight : sequence of int, optional
        Nodes drawn with a thick black ring; default: the explained node(s), where the walks end.
    title : str, optional
        The picture's title.
    cmap : str
        A diverging matplotlib colour map (``"bwr"``: red positive, blue negative).
    font_size : float
        Size of the node labels in points; the nodes grow with it.
    axis : matplotlib Axes, optional
        Where to draw; a new figure, sized for the nodes drawn, by default.
    seed : int
        Seed of the spring layout.

    Returns
    -------
    matplotlib.figure.Figure
        The figure (``figure.axes[0]`` holds the graph, ``figure.axes[-1]`` the colour bar).

    Raises
    ------
    ValueError
        Where ``edge_index`` is not ``[2, edges]``, ``walks`` and ``relevance`` do not match, a
        walk names a node the graph does not have, or ``positions`` lacks a node that is drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import networkx
    from matplotlib import patches, pyplot, transforms
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
    if largest >= count:
        raise ValueError(f"edge_index or walks name node {largest}, but the graph has nodes={count}")
    ends = walk_ends(paths)
    on_walks = set(paths.reshape(-1).tolist()) - {-1}
    if whole_graph:
        drawn = set(range(count))
    else:
        drawn = neighbourhood(edges, ends, paths.shape[1] - 1 if hops is None else hops) | on_walks
    order = sorted(drawn)
    graph = networkx.DiGraph()
    graph.add_nodes_from(order)
    graph.add_edges_from(edge for edge in edges if edge[0] in drawn and edge[1] in drawn)
    if positions is None:
        # laid out with the nodes outside that join two drawn ones (so that a ring cut open by the
        # neighbourhood keeps its shape instead of becoming a line), drawn without them
        context = networkx.DiGraph(graph)
        joining: dict[int, set[int]] = {}
        for sender, receiver in edges:
            if (sender in drawn) != (receiver in drawn):
                outside, inside = (receiver, sender) if sender in drawn else (sender, receiver)
                joining.setdefault(outside, set()).add(inside)
        context.add_edges_from((outside, inside) for outside, insides in joining.items() if len(insides) > 1
                               for inside in insides)
        where = {node: place for node, place in _packed_layout(context, seed).items() if node in drawn}
    else:
        missing = [node for node in order if node not in positions]
        if missing:
            raise ValueError(f"positions has no place for node(s) {missing[:10]} that are drawn")
        where = {node: np.asarray(positions[node], dtype=float) for node in order}
    texts = {node: str(labels[node]) if labels is not None and node in labels else str(node) for node in order}
    diameters = {node: _node_diameter(texts[node], font_size) for node in order}
    if axis is None:
        side = float(np.clip(3.0 + 0.75 * np.sqrt(len(order)), 4.5, 13.0))
        figure, axis = pyplot.subplots(figsize=(side + 1.3, side))
    else:
        figure = axis.figure
    axis.set_aspect("equal", adjustable="datalim")
    colours = colour_map(cmap)
    norm = Normalize(-_symmetric_limit(values), _symmetric_limit(values))
    background = [edge for edge in graph.edges if edge[0] != edge[1]]
    networkx.draw_networkx_edges(graph, where, edgelist=background, ax=axis, edge_color="lightgrey", width=0.8,
                                 arrows=False)
    rings = set(ends if highlight is None else highlight)
    drawn_nodes = networkx.draw_networkx_nodes(
        graph, where, nodelist=order, ax=axis, node_size=[diameters[node] ** 2 for node in order],
        node_color=["white" if node in on_walks else "whitesmoke" for node in order],
        edgecolors=["black" if node in rings else "grey" for node in order],
        linewidths=[2.5 if node in rings else 0.8 for node in order])
    drawn_nodes.set_zorder(4)
    for node, text in networkx.draw_networkx_labels(graph, where, labels=texts, ax=axis,
                                                    font_size=font_size).items():
        text.set_zorder(5)
        if node not in on_walks:
            text.set_color("dimgrey")
    hops_drawn: dict[tuple[int, int], int] = {}
    for walk in np.argsort(np.abs(values), kind="stable"):  # the most relevant last, on top
        colour = colours(norm(values[walk]))
        width = 0.8 + 3.2 * abs(values[walk]) / norm.vmax
        path = [node for node in paths[walk].tolist() if node >= 0]  # -1: the walk left early
        for hop, (start, end) in enumerate(zip(path, path[1:], strict=False)):
            seen = hops_drawn.get((start, end), 0)
            hops_drawn[(start, end)] = seen + 1
            if start == end:
                axis.add_patch(_loop(axis, where, graph, start, diameters[start], seen, colour, width, transforms,
                                     patches))
                continue
            axis.add_patch(patches.FancyArrowPatch(
                tuple(where[start]), tuple(where[end]), connectionstyle=f"arc3,rad={0.15 + 0.12 * seen}",
                arrowstyle="-|>" if hop == len(path) - 2 else "-", mutation_scale=10 + 2 * width, color=colour,
                linewidth=width, shrinkA=diameters[start] / 2 + 1, shrinkB=diameters[end] / 2 + 2, zorder=3))
    axis.margins(0.12)  # room for the discs and loops, which are sized in points
    figure.colorbar(ScalarMappable(norm, colours), ax=axis, fraction=0.04, pad=0.02, aspect=30,
                    label="walk relevance")
    if title:
        axis.set_title(title, fontsize=10, pad=14)
    axis.set_axis_off()
    return figure


def _loop(axis: Any, where: Mapping[int, np.ndarray], graph: Any, node: int, diameter: float, seen: int,
          colour: Any, width: float, transforms: Any, patches: Any) -> Any:
    """A step that stays at ``node``: a circle in points, just outside the node's disc in the widest
    free angle between its neighbours and the nodes nearest to it (placed where the node is drawn,
    whatever the axis' scale), larger for each further loop at the node, so that several are told
    apart."""
    centre = np.asarray(where[node], dtype=float)
    others = [other for other in where if other != node]
    nearest = sorted(others, key=lambda other: float(np.linalg.norm(where[other] - centre)))[:6]
    around = set(graph.predecessors(node)) | set(graph.successors(node)) | set(nearest)
    angles = sorted(float(np.arctan2(*(np.asarray(where[other], dtype=float) - centre)[::-1]))
                    for other in around - {node} if np.any(np.asarray(where[other], dtype=float) != centre))
    if angles:
        gaps = [(angles[(index + 1) % len(angles)] - angle) % (2 * np.pi) or 2 * np.pi
                for index, angle in enumerate(angles)]
        widest = int(np.argmax(gaps))
        angle = angles[widest] + gaps[widest] / 2
    else:
        angle = np.pi / 2
    outward = np.array([np.cos(angle), np.sin(angle)])
    radius = (0.35 * diameter + 0.12 * diameter * seen) / 72.0  # inches
    offset = outward * (diameter / 2 / 72.0 + radius * 0.85)
    placed = axis.figure.dpi_scale_trans + transforms.ScaledTranslation(centre[0], centre[1], axis.transData)
    return patches.Circle(tuple(offset), radius, transform=placed, fill=False, edgecolor=colour, linewidth=width,
                          zorder=3, clip_on=False)


def save_walks(
    path: str | Path,
    edge_index: ArrayLike,
    walks: ArrayLike,
    relevance: ArrayLike,
    *,
    nodes: int | None = None,
    hops: int | None = None,
    whole_graph: bool = False,
    positions: Mapping[int, Sequence[float]] | None = None,
    labels: Mapping[int, str] | None = None,
    highlight: Sequence[int] | None = None,
    title: str | None = None,
    cmap: str = "bwr",
    font_size: float = 9.0,
    seed: int = 0,
    dpi: int = 110,
) -> Path:
    """Draw relevant walks on the graph around the explained node into a PNG file.

    Each walk is a curved path in the colour of its relevance (red for, blue against by default),
    as wide as ``|relevance|`` is large, with an arrow on its last hop; a step that stays at a
    node is a small loop at that node. By default only the explained node's neighbourhood is
    drawn: the nodes within the walks' length of it.

    Parameters
    ----------
    path : str or Path
        The PNG file to write (its folder is made).
    edge_index : array-like of int, shape [2, edges]
        Senders and receivers (messages go from sender to receiver).
    walks : array-like of int, shape [W, L + 1]
        Node ids of each walk, input layer first, the explained node last
        (:func:`fxlrp.integrations.pyg.relevant_walks`); ``-1`` after the last node of a walk
        that leaves early (jumping knowledge).
    relevance : array-like, shape [W]
        One relevance per walk.
    nodes : int, optional
        The number of nodes of the graph (default: the largest id in ``edge_index`` and ``walks``,
        plus one); only ``whole_graph`` draws nodes without edges beyond those.
    hops : int, optional
        The neighbourhood drawn: the nodes from which the explained node (the walks' last nodes)
        is reached in at most ``hops`` steps along the edges, and every node of a walk. Default:
        the walks' length ``L``.
    whole_graph : bool
        Draw every node of the graph instead of the neighbourhood.
    positions : mapping of node id to (x, y), optional
        Node positions (for the nodes drawn); a spring layout of each connected part by default.
    labels : mapping of node id to str, optional
        Node labels (may hold line breaks); the node ids by default.
    highlight : sequence of int, optional
        Nodes drawn with a thick black ring; default: the explained node(s), where the walks end.
    title : str, optional
        The picture's title.
    cmap : str
        A diverging matplotlib colour map.
    font_size : float
        Size of the node labels in points; the nodes grow with it.
    seed : int
        Seed of the spring layout.
    dpi : int
        Resolution of the PNG file, dots per inch.

    Returns
    -------
    Path
        ``path``.

    See Also
    --------
    draw_walks : the same picture as a matplotlib figure, or drawn into an axis of yours.
    """
    figure = draw_walks(edge_index, walks, relevance, nodes=nodes, hops=hops, whole_graph=whole_graph,
                        positions=positions, labels=labels, highlight=highlight, title=title, cmap=cmap,
                        font_size=font_size, seed=seed)
    return _saved(figure, path, dpi)
