"""Perturbation curves of graphs: a node's class score as edges are removed (or node features
replaced) in the order of their relevance, batched as one disjoint union of perturbed copies.

This works with any model called as ``model(x, edge_index)`` that returns node scores
``[nodes, classes]`` (PyG's node classifiers); the relevance can come from
:class:`fxlrp.integrations.pyg.LRPExplainer` (its ``edge_mask``/``node_mask``),
:func:`fxlrp.integrations.pyg.graph_relevance` or any other explainer. It needs no PyG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.evaluate.curves import (
    EvaluationInputError,
    PerturbationCurves,
    Rows,
    as_relevance,
    check_choice,
    check_curve_options,
    check_targets,
    curve_counts,
    explained_scores,
    feature_ranks,
    perturbed_features,
    score_rows,
)

ELEMENTS = ("edges", "nodes")


def graph_curves(model: Callable[[Tensor, Tensor], Any], x: Tensor, edge_index: Tensor, relevance: Any,
                 index: Any, target: Any = None, *, perturb: str = "edges", candidates: Tensor | None = None,
                 baseline: float = 0.0, orders: str | tuple[str, ...] = ("morf", "lerf"), mode: str = "deletion",
                 score: str = "logit", features_per_step: int | None = None, steps: int | None = None,
                 batch_size: int = 64, progress: bool = True) -> PerturbationCurves:
    r"""Perturbation curves of node classifications: removing edges (or replacing node features
    by ``baseline``) in the order of their relevance, and following the explained node's score.

    Sample ``i`` explains node ``index[i]`` with relevance ``relevance[i]`` over the graph's edges
    (or nodes). A batch of perturbed graphs is one disjoint union of ``batch_size`` copies of the
    graph, each with its own edges removed, run in one model call.

    Parameters
    ----------
    model : callable
        ``model(x, edge_index)`` returning node scores ``[nodes, classes]``; in evaluation mode.
    x : Tensor
        Node features ``[nodes, features]``.
    edge_index : Tensor
        ``[2, edges]``.
    relevance : Tensor, numpy.ndarray or array-like
        Per explained node: ``[samples, edges]`` (``perturb="edges"``), ``[samples, nodes]`` or
        ``[samples, nodes, features]`` (``perturb="nodes"``, summed over the features); one
        sample may drop its first dimension.
    index : int, sequence or Tensor
        The explained node of each sample.
    target : int, Tensor or None
        The class followed; None: each node's predicted class.
    perturb : str
        ``"edges"``: a perturbed edge is removed; ``"nodes"``: a perturbed node's features become
        ``baseline``.
    candidates : Tensor or None
        ``[samples, edges]`` (or ``[samples, nodes]``) bool: what may be perturbed, e.g. the
        edges of the node's receptive field (beyond it nothing changes its score); None: all.
    baseline : float
        The value of a perturbed node's features.
    orders, mode, score, features_per_step, steps, batch_size, progress
        As :func:`fxlrp.evaluate.image_curves`; ``batch_size`` counts graphs.

    Returns
    -------
    PerturbationCurves
    """
    check_choice(perturb, ELEMENTS, "perturb")
    orders = check_curve_options(model, orders, mode, score)
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise EvaluationInputError("x must be node features [nodes, features]")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise EvaluationInputError("edge_index must be a tensor [2, edges]")
    device, nodes, edges = x.device, x.shape[0], edge_index.shape[1]
    explained = torch.as_tensor(index, device=device).reshape(-1).to(torch.int64)
    samples = len(explained)
    if bool(((explained < 0) | (explained >= nodes)).any()):
        raise EvaluationInputError(f"index {explained.tolist()} names nodes outside the graph's {nodes}")
    values = as_relevance(relevance, device)
    size = edges if perturb == "edges" else nodes
    if perturb == "nodes" and values.dim() == 3:
        values = values.sum(dim=2)
    if values.dim() == 1:
        values = values[None]
    if tuple(values.shape) != (samples, size):
        raise EvaluationInputError(f"relevance has shape {list(values.shape)}; for {samples} explained node(s) and "
                                   f"perturb={perturb!r} give [{samples}, {size}] (one value per "
                                   f"{perturb[:-1]})")
    valid = None
    if candidates is not None:
        valid = candidates.to(device).bool()
        if valid.dim() == 1:
            valid = valid[None].expand(samples, -1)
        if tuple(valid.shape) != (samples, size):
            raise EvaluationInputError(f"candidates must be [{samples}, {size}] like the relevance")
    counted = torch.full((samples,), size, device=device) if valid is None else valid.sum(dim=1)
    counts = curve_counts(counted, features_per_step, steps)
    layout = Rows(len(orders), samples, counts.shape[1], device)
    with torch.no_grad():
        logits = model(x, edge_index)
    explained_scores(logits, torch.zeros(nodes, dtype=torch.int64, device=device), "logit")  # (its shape)
    targets = check_targets(target, logits.detach()[explained])
    ranks = torch.stack([feature_ranks(values, order, valid) for order in orders])
    fill = torch.tensor(baseline, dtype=x.dtype, device=device)

    def make_batch(rows: Tensor) -> tuple[Tensor, Tensor]:
        order, sample, point = layout.locate(rows)
        chosen = perturbed_features(ranks[order, sample], counts[sample, point], mode,
                                    None if valid is None else valid[sample])
        copies = len(rows)
        offsets = torch.arange(copies, device=device) * nodes
        union = (edge_index[:, None, :] + offsets[None, :, None]).reshape(2, -1)
        features = x.expand(copies, nodes, x.shape[1])
        if perturb == "edges":
            union = union[:, ~chosen.reshape(-1)]
        else:
            features = torch.where(chosen[..., None], fill, features)
        return features.reshape(copies * nodes, -1), union

    def read(output: Any, rows: Tensor) -> Tensor:
        _, sample, _ = layout.locate(rows)
        positions = torch.arange(len(rows), device=device) * nodes + explained[sample]
        if not isinstance(output, Tensor):
            output = getattr(output, "logits", output)
        return explained_scores(output[positions], targets[sample], score)

    unperturbed = explained_scores(logits[explained], targets, score)
    found = score_rows(layout, counts, counted, mode, unperturbed, batch_size, make_batch, lambda batch: model(*batch),
                       read, progress, f"{perturb} {mode} curves")
    return layout.curves(found, orders, counts, counted, mode)
