r"""Attribution graphs: how a concept of one layer draws its relevance from concepts of the layers
below, for one prediction (zennit-crp's ``AttributionGraph``).

For the root concept ``(L_0, c_0)`` and the explained class ``t``, level 1 explains the condition
``{L_0: [c_0], "y": [t]}`` and reads the concept relevance of layer ``L_1``,

    r(L_1, c) = R_c / (sum_c' |R_c'| + 1e-10),   R_c = sum over the positions of concept c of R(L_1),

whose ``width[0]`` largest concepts become the level's nodes, each joined to ``(L_0, c_0)`` by an
edge of relevance ``r(L_1, c)``. Level ``k + 1`` decomposes each node ``(L_k, c)`` the same way
under ``{L_k: [c], L_0: [c_0], "y": [t]}`` (the root's condition kept, as zennit-crp keeps it).
Relevance passes by every path (``exclude_parallel=False``, zennit-crp's choice for graphs), and
with ``from_concept=True`` the explanation starts at the root concept's activation instead of a
class (zennit-crp's ``target=None``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fxlrp.concepts.concept import ChannelConcept, Concept
from fxlrp.concepts.conditional import conditional_relevance
from fxlrp.concepts.sites import OUTPUT
from fxlrp.explain.attribute import Inputs
from fxlrp.explain.explainer import Explainer


@dataclass(frozen=True)
class ConceptEdge:
    """Relevance flowing from a lower concept into an upper one."""

    upper: tuple[str, int]
    """``(layer, concept)`` above."""
    lower: tuple[str, int]
    """``(layer, concept)`` below."""
    relevance: float
    """The lower concept's share of the relevance of the upper one (normalised by the sum of
    absolute concept relevances of the lower layer)."""


@dataclass
class ConceptGraph:
    """An attribution graph: the root concept, the concepts found per level and the edges.

    ``str(graph)`` is a table of the edges; :meth:`picture` draws it.
    """

    root: tuple[str, int]
    levels: list[list[tuple[str, int]]]
    """The concepts of each level below the root, in the order found (each once)."""
    edges: list[ConceptEdge]
    target: Any = None
    """The explained class (None: each sample's predicted class; ``"concept"``: from the root's activation)."""
    root_relevance: float | None = None
    """The root concept's normalised relevance within its layer for the prediction (None from the concept)."""
    nodes: list[tuple[str, int]] = field(init=False)
    """The root and every concept found, each once."""

    def __post_init__(self) -> None:
        self.nodes = [self.root, *dict.fromkeys(node for level in self.levels for node in level)]

    def __str__(self) -> str:
        layer_width = max(len("layer"), *(len(name) for name, _ in self.nodes))
        explained = "its activation" if self.target == "concept" else (
            "the predicted class" if self.target is None else f"class {self.target}")
        share = "" if self.root_relevance is None else f", {self.root_relevance:+.4f} of its layer's relevance"
        lines = [f"attribution graph of concept {self.root[1]} of {self.root[0]} (explaining {explained}{share})",
                 f"{'upper layer':<{layer_width}}  {'concept':>7}  {'lower layer':<{layer_width}}  {'concept':>7}"
                 f"  {'relevance':>10}"]
        for edge in self.edges:
            lines.append(f"{edge.upper[0]:<{layer_width}}  {edge.upper[1]:>7}  {edge.lower[0]:<{layer_width}}  "
                         f"{edge.lower[1]:>7}  {edge.relevance:>+10.4f}")
        return "\n".join(lines)

    def picture(self, path: str | Path | None = None, ax: Any = None) -> Any:
        """Draw the graph: one row of concepts per level, the root on top; edges red for
        positive relevance, blue for negative, their width proportional to ``|relevance|``.

        Needs matplotlib (``pip install -e ".[pictures]"``).

        Parameters
        ----------
        path : str or Path, optional
            Where to save the picture (PNG, SVG, PDF by suffix).
        ax : matplotlib Axes, optional
            Draw into these axes instead of a new figure.

        Returns
        -------
        matplotlib.figure.Figure
            The figure.
        """
        import matplotlib

        if ax is None:
            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt

            rows = [[self.root], *self.levels]
            figure, ax = plt.subplots(figsize=(max(4.0, 1.6 * max(len(row) for row in rows)), 1.6 * len(rows)))
        figure = ax.figure
        rows = [[self.root], *self.levels]
        where: dict[tuple[str, int], tuple[float, float]] = {}
        for depth, row in enumerate(rows):
            for index, node in enumerate(row):
                where.setdefault(node, ((index + 0.5) / len(row), 1.0 - depth / max(1, len(rows) - 1)))
        strongest = max((abs(edge.relevance) for edge in self.edges), default=0.0) or 1.0
        for edge in self.edges:
            (x0, y0), (x1, y1) = where[edge.upper], where[edge.lower]
            ax.plot([x0, x1], [y0, y1], color="#c0392b" if edge.relevance >= 0 else "#2e6bd6",
                    linewidth=0.5 + 4.5 * abs(edge.relevance) / strongest, alpha=0.8, zorder=1)
            ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{edge.relevance:+.2f}", fontsize=7, ha="center", va="center",
                    zorder=3, bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none"})
        for (layer, concept), (x, y) in where.items():
            ax.text(x, y, f"{layer}\n#{concept}", fontsize=8, ha="center", va="center", zorder=2,
                    bbox={"boxstyle": "round,pad=0.3", "facecolor": "#f4f4f4", "edgecolor": "#555555"})
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(-0.2, 1.2)
        ax.axis("off")
        if path is not None:
            figure.savefig(path, bbox_inches="tight", dpi=150)
        return figure


def attribution_graph(
    explain: Explainer,
    inputs: Inputs,
    layers: Sequence[str],
    concept: int | None = None,
    *,
    width: Sequence[int] | int = 3,
    target: int | None = None,
    from_concept: bool = False,
    concepts: Concept | Mapping[str, Concept] | None = None,
    abs_norm: bool = True,
    repeat: int = 0,
) -> ConceptGraph:
    r"""The attribution graph of one concept of ``layers[0]`` through ``layers[1:]``, for one sample.

    Level ``k`` holds the ``width[k - 1]`` concepts of ``layers[k]`` with the largest normalised
    relevance ``r(L_k, c) = R_c / (sum_c' |R_c'| + 1e-10)`` under the condition ``{L_{k-1}: [c'],
    L_0: [c_0], "y": [t]}`` of each concept ``c'`` of the level above (see
    :mod:`fxlrp.concepts.graph`).

    Parameters
    ----------
    explain : Explainer
        The explainer :func:`fxlrp.convert` returned.
    inputs : Tensor, sequence or mapping
        One sample (batch size 1), as :func:`fxlrp.attribute` takes inputs.
    layers : sequence of str
        The root layer, then one layer per level below it (node or module names).
    concept : int, optional
        The root concept of ``layers[0]``; None: the one of largest relevance for the prediction.
    width : int or sequence of int, default 3
        Concepts kept per decomposed concept, per level (one int for every level).
    target : int, optional
        The explained class; None: the predicted class.
    from_concept : bool, default False
        Start from the root concept's activation instead of a class (zennit-crp's ``target=None``).
    concepts : Concept or dict of str to Concept, optional
        The concepts of the layers (``ChannelConcept()`` by default).
    abs_norm : bool, default True
        Normalise concept relevances by the sum of absolute values (as zennit-crp).
    repeat : int, default 0
        Conditions per backward pass (see :func:`~fxlrp.concepts.conditional_relevance`).

    Returns
    -------
    ConceptGraph
        Nodes per level and edges with their relevance.
    """
    if isinstance(layers, str) or len(layers) < 2:
        raise ValueError("layers must name the root layer and at least one layer below it, e.g. "
                         "['features.40', 'features.37']")
    widths = [width] * (len(layers) - 1) if isinstance(width, int) else list(width)
    if len(widths) != len(layers) - 1 or any(not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"width must be a positive int or one positive int per level below the root "
                         f"({len(layers) - 1}), got {width!r}")
    if from_concept and target is not None:
        raise ValueError("from_concept=True explains the root concept's activation, not a class: leave target=None")
    root_layer = layers[0]
    start = root_layer if from_concept else None
    cls = {} if from_concept or target is None else {OUTPUT: [target]}

    def of_layer(name: str) -> Concept:
        if isinstance(concepts, Concept):
            return concepts
        if isinstance(concepts, Mapping) and name in concepts:
            return concepts[name]
        return ChannelConcept()

    def relevance_of(layer: str, found: Any) -> Tensor:
        return found.concept_relevance(layer, of_layer(layer), abs_norm=abs_norm)

    root_relevance = None
    if concept is None or not from_concept:
        found = conditional_relevance(explain, inputs, [dict(cls)], record=[root_layer], target=target,
                                      concepts={root_layer: of_layer(root_layer)}, exclude_parallel=False)
        shares = relevance_of(root_layer, found)
        if shares.shape[1] != 1:
            raise ValueError(f"an attribution graph explains one sample; the inputs hold {shares.shape[1]}")
        if concept is None:
            concept = int(torch.argmax(shares[0, 0]))
        root_relevance = float(shares[0, 0, concept])
    root = (root_layer, concept)
    levels: list[list[tuple[str, int]]] = []
    edges: list[ConceptEdge] = []
    upper = [root]
    for layer, keep in zip(layers[1:], widths, strict=True):
        conditions = [{name: [index], root_layer: [concept], **cls} for name, index in upper]
        names = {name for name, _ in upper} | {root_layer, layer}
        found = conditional_relevance(explain, inputs, conditions, record=[layer], target=target, start=start,
                                      concepts={name: of_layer(name) for name in names}, exclude_parallel=False,
                                      repeat=repeat)
        shares = relevance_of(layer, found)[:, 0]
        level: list[tuple[str, int]] = []
        for node, row in zip(upper, shares, strict=True):
            for index in torch.argsort(row, descending=True)[:keep].tolist():
                edges.append(ConceptEdge(node, (layer, index), float(row[index])))
                level.append((layer, index))
        level = list(dict.fromkeys(level))
        levels.append(level)
        upper = level
    return ConceptGraph(root, levels, edges, "concept" if from_concept else target, root_relevance)
