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

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.pyg.messages import Messages, recording_messages


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


def to_input_edges(record: Messages, relevance: Tensor, edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Per-message relevance -> (``[E]`` per input edge, ``[N]`` per self-loop the layer added)."""
    per_message = _per_edge(record, relevance).to(torch.float64)
    sent = record.edge_index
    input_keys = edge_index[0] * num_nodes + edge_index[1]
    message_keys = sent[0] * num_nodes + sent[1]
    keys, inverse, counts = torch.unique(input_keys, return_inverse=True, return_counts=True)
    if keys.numel() == 0:
        found = torch.zeros_like(message_keys, dtype=torch.bool)
        per_edge = per_message.new_zeros(edge_index.size(1))
    else:
        position = torch.searchsorted(keys, message_keys).clamp(max=keys.numel() - 1)
        found = keys[position] == message_keys
        per_key = per_message.new_zeros(keys.numel()).index_add_(0, position[found], per_message[found])
        per_edge = per_key[inverse] / counts[inverse]
    target = sent[1] if record.source_to_target else sent[0]
    loops = per_message.new_zeros(num_nodes).index_add_(0, target[~found], per_message[~found])
    return per_edge, loops


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
    x = x.detach().requires_grad_()
    leaves = [x]
    edge_attr = kwargs.get("edge_attr")
    if isinstance(edge_attr, Tensor) and edge_attr.is_floating_point():
        kwargs["edge_attr"] = edge_attr = edge_attr.detach().requires_grad_()
        leaves.append(edge_attr)
    with torch.enable_grad(), recording_messages() as records:
        output = explain(x, edge_index, **kwargs)
        if not isinstance(output, Tensor):
            raise TypeError(f"the model returns {type(output).__name__}; graph_relevance explains a tensor output")
        start = relevance if relevance is not None else output_relevance(output, target, index, mode)
        gradients = torch.autograd.grad(output, [*leaves, *(r.messages for r in records)], start, allow_unused=True)
    found = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(gradients, leaves, strict=False)]
    num_nodes = x.size(0)
    edge = torch.zeros(edge_index.size(1), dtype=torch.float64, device=x.device)
    by_layer: dict[str, Tensor] = {}
    loops_by_layer: dict[str, Tensor] = {}
    for record, message_relevance in zip(records, gradients[len(leaves):], strict=True):
        if message_relevance is None:
            continue
        per_edge, loops = to_input_edges(record, message_relevance, edge_index, num_nodes)
        by_layer[record.layer] = by_layer.get(record.layer, 0) + per_edge
        loops_by_layer[record.layer] = loops_by_layer.get(record.layer, 0) + loops
        edge = edge + per_edge
    return GraphRelevance(
        output=output.detach(),
        node=found[0],
        edge=edge.to(x.dtype),
        edge_by_layer={name: value.to(x.dtype) for name, value in by_layer.items()},
        self_loops_by_layer={name: value.to(x.dtype) for name, value in loops_by_layer.items()},
        edge_attr=found[1] if len(found) > 1 else None,
    )
