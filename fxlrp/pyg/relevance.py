"""Node, edge and edge-feature relevance of a graph network in one call.

Edge relevance, precisely: for a call of a message-passing layer that sends messages
``m_e`` (the output of its ``message``, shape ``[E', ...]``) along ``edge_index'`` (the edges
after the layer added self-loops), the relevance of edge ``e`` in that layer is
``R_e = sum over features (and heads) of R(m_e)``, the relevance that reaches the message. Each
message belongs to the input edge with the same (source, target) pair; messages along self-loops
the layer added itself belong to no input edge and are reported per node (``self_loops``).
Several input edges with the same pair share their messages' relevance equally. The edge mask
is the sum over layers (and over repeated calls of one layer) of these per-layer relevances.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.pyg.edge_map import EdgeMap
from fxlrp.pyg.messages import Messages, recording_messages
from fxlrp.relevance.rule_function import reusable_graph


@dataclass
class GraphRelevance:
    """Relevance of the inputs of one explanation."""

    output: Tensor
    """The model's output."""
    node: Tensor
    """``[N, F]``: relevance of each node feature."""
    edge: Tensor
    """``[E]``: relevance of each input edge, summed over the message-passing layers."""
    edge_by_layer: dict[str, Tensor] = field(default_factory=dict)
    """``{layer name: [E]}``: relevance of the messages each layer sent along each input edge."""
    self_loops_by_layer: dict[str, Tensor] = field(default_factory=dict)
    """``{layer name: [N]}``: relevance of the messages along self-loops a layer added itself."""
    edge_attr: Tensor | None = None
    """Relevance of the edge features (``edge_attr``), when the model takes them."""


def output_relevance(output: Tensor, target: Any = None, index: Any = None, mode: str = "multiclass") -> Tensor:
    """The relevance to start from: the explained outputs themselves, zero elsewhere.

    ``mode``: ``"multiclass"`` (the logit of class ``target`` of each explained row; None: the
    highest), ``"binary"`` (a single logit: ``+logit`` for target 1, ``-logit`` for target 0) or
    ``"regression"`` (the outputs). ``index`` picks the explained rows (nodes or graphs); None:
    all rows.
    """
    rows = torch.zeros(output.size(0), dtype=torch.bool, device=output.device)
    rows[slice(None) if index is None else index] = True
    values = output.detach()
    if mode == "regression":
        mask = rows.view(-1, *([1] * (output.dim() - 1))).expand_as(output)
        return torch.where(mask, values, torch.zeros_like(values))
    if target is None:
        target = values.argmax(dim=-1) if mode == "multiclass" else (values.view(output.size(0), -1)[:, 0] > 0)
    target = torch.as_tensor(target, device=output.device).long().view(-1)
    target = target.expand(output.size(0)) if target.numel() == 1 else target
    if mode == "binary":
        sign = (2 * target - 1).to(values.dtype).view(-1, *([1] * (output.dim() - 1)))
        return torch.where(rows.view_as(sign).expand_as(values), values * sign, torch.zeros_like(values))
    onehot = torch.zeros_like(values)
    onehot[rows, target[rows]] = 1.0
    return values * onehot


def _per_edge(record: Messages, relevance: Tensor) -> Tensor:
    return relevance.movedim(record.edge_dim, 0).reshape(relevance.size(record.edge_dim), -1).sum(dim=1)


@dataclass
class GraphForward:
    """One forward of a converted graph model, from which relevance is propagated.

    ``reusable``: made under :func:`~fxlrp.relevance.rule_function.reusable_graph`, so that
    :func:`relevance_from` may run it backward any number of times (one forward, many explained
    outputs); otherwise once.
    """

    output: Tensor
    leaves: list[Tensor]
    """``x`` and, when the model takes floating edge features, ``edge_attr``, as graph leaves."""
    records: list[Messages]
    edge_index: Tensor
    reusable: bool
    edge_maps: list[EdgeMap] = field(default_factory=list)
    """One per record, made by the first :func:`relevance_from` (they depend on the graph only)."""


def explained_forward(
    explain: nn.Module, x: Tensor, edge_index: Tensor, *, reusable: bool = False, **kwargs: Any
) -> GraphForward:
    """Run ``explain(x, edge_index, **kwargs)`` (a module from :func:`fxlrp.convert`) recording
    the messages of its message-passing layers. A floating ``edge_attr`` keyword becomes a leaf."""
    x = x.detach().requires_grad_()
    leaves = [x]
    edge_attr = kwargs.get("edge_attr")
    if isinstance(edge_attr, Tensor) and edge_attr.is_floating_point():
        kwargs["edge_attr"] = edge_attr = edge_attr.detach().requires_grad_()
        leaves.append(edge_attr)
    with torch.enable_grad(), recording_messages() as records, reusable_graph() if reusable else nullcontext():
        output = explain(x, edge_index, **kwargs)
    if not isinstance(output, Tensor):
        raise TypeError(f"the model returns {type(output).__name__}; graph_relevance explains a tensor output")
    return GraphForward(output, leaves, records, edge_index, reusable)


def relevance_from(forward: GraphForward, relevance: Tensor) -> GraphRelevance:
    """Propagate the output relevance ``relevance`` through ``forward``."""
    leaves, records, edge_index = forward.leaves, forward.records, forward.edge_index
    gradients = torch.autograd.grad(forward.output, [*leaves, *(r.messages for r in records)], relevance,
                                    allow_unused=True, retain_graph=forward.reusable)
    found = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(gradients, leaves, strict=False)]
    x = leaves[0]
    if not forward.edge_maps:
        forward.edge_maps = [EdgeMap(r.edge_index, edge_index, x.size(0), r.source_to_target) for r in records]
    edge = torch.zeros(edge_index.size(1), dtype=torch.float64, device=x.device)
    by_layer: dict[str, Tensor] = {}
    loops_by_layer: dict[str, Tensor] = {}
    for record, edge_map, message_relevance in zip(records, forward.edge_maps, gradients[len(leaves):], strict=True):
        if message_relevance is None:
            continue
        per_edge, loops = edge_map(_per_edge(record, message_relevance).to(torch.float64))
        by_layer[record.layer] = by_layer.get(record.layer, 0) + per_edge
        loops_by_layer[record.layer] = loops_by_layer.get(record.layer, 0) + loops
        edge = edge + per_edge
    return GraphRelevance(
        output=forward.output.detach(),
        node=found[0],
        edge=edge.to(x.dtype),
        edge_by_layer={name: value.to(x.dtype) for name, value in by_layer.items()},
        self_loops_by_layer={name: value.to(x.dtype) for name, value in loops_by_layer.items()},
        edge_attr=found[1] if len(found) > 1 else None,
    )


def graph_relevance(
    explain: nn.Module,
    x: Tensor,
    edge_index: Tensor,
    *,
    target: Any = None,
    index: Any = None,
    mode: str = "multiclass",
    relevance: Tensor | None = None,
    **kwargs: Any,
) -> GraphRelevance:
    """Explain ``explain(x, edge_index, **kwargs)`` (a module from :func:`fxlrp.convert`).

    The output relevance is ``relevance`` if given, else :func:`output_relevance` of ``target``,
    ``index`` and ``mode``. A floating ``edge_attr`` keyword gets its own relevance.
    """
    forward = explained_forward(explain, x, edge_index, **kwargs)
    start = relevance if relevance is not None else output_relevance(forward.output, target, index, mode)
    return relevance_from(forward, start)
