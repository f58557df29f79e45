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

import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.eager.runner import LayerRunner
from fxlrp.errors import ExplanationInputError
from fxlrp.explain.input_checks import refuse_unusable_arguments
from fxlrp.explain.model_rejection import model_consulted, model_of, raised_from_the_call
from fxlrp.explain.rank_checks import refuse_ranks_the_model_refuses
from fxlrp.integrations.pyg.edge_map import EdgeMap
from fxlrp.integrations.pyg.messages import Messages, recording_messages
from fxlrp.relevance.rule_function import reusable_graph


@dataclass
class GraphRelevance:
    """Relevance of the inputs of one explanation.

    For a heterogeneous graph (``x`` and ``edge_index`` given as dicts by node and edge type),
    ``node`` is ``{node type: [N_t, F_t]}``, ``edge`` ``{edge type: [E_t]}``, ``edge_by_layer``
    ``{layer name: {edge type: [E_t]}}`` and ``self_loops_by_layer`` ``{layer name: {node type:
    [N_t]}}``.
    """

    output: Tensor
    """The model's output."""
    node: Tensor | dict[Any, Tensor]
    """``[N, F]``: relevance of each node feature."""
    edge: Tensor | dict[Any, Tensor]
    """``[E]``: relevance of each input edge, summed over the message-passing layers."""
    edge_by_layer: dict[str, Any] = field(default_factory=dict)
    """``{layer name: [E]}``: relevance of the messages each layer sent along each input edge."""
    self_loops_by_layer: dict[str, Any] = field(default_factory=dict)
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
    """``x`` (one leaf per node type for heterogeneous graphs) and, when the model takes floating
    edge features, ``edge_attr``, as graph leaves."""
    records: list[Messages]
    edge_index: Tensor | dict[Any, Tensor]
    reusable: bool
    edge_maps: list[Any] = field(default_factory=list)
    """One per record, made by the first :func:`relevance_from` (they depend on the graph only)."""
    node_types: list[Any] | None = None
    """Heterogeneous graphs: the node type of each of the first leaves."""


def layer_names(explain: nn.Module) -> dict[int, str]:
    """Qualified names, by ``id``, of the model's modules that run inside the explainer's nodes
    (for message-passing layers called by code that runs eagerly)."""
    names: dict[int, str] = {}
    for node in explain.modules():
        runner = getattr(node, "function", None)
        if isinstance(runner, LayerRunner):
            site = getattr(getattr(node, "call", None), "site", None)
            prefix = site.module_name + "." if site is not None and site.module_name else ""
            names.update(runner.module_names(prefix))
    return names


def explained_forward(
    explain: nn.Module, x: Tensor | dict[Any, Tensor], edge_index: Tensor | dict[Any, Tensor], *,
    reusable: bool = False, **kwargs: Any
) -> GraphForward:
    """Run ``explain(x, edge_index, **kwargs)`` (a module from :func:`fxlrp.convert`) recording
    the messages of its message-passing layers. A floating ``edge_attr`` keyword becomes a leaf.
    ``x`` and ``edge_index`` may be dicts by node and edge type (heterogeneous graphs)."""
    node_types = None
    if isinstance(x, dict):
        node_types = list(x)
        x = {node_type: features.detach().requires_grad_() for node_type, features in x.items()}
        leaves = list(x.values())
    else:
        x = x.detach().requires_grad_()
        leaves = [x]
    edge_attr = kwargs.get("edge_attr")
    if isinstance(edge_attr, Tensor) and edge_attr.is_floating_point():
        kwargs["edge_attr"] = edge_attr = edge_attr.detach().requires_grad_()
        leaves.append(edge_attr)
    run, args = explain, (x, edge_index)
    if hasattr(explain, "explainer_for"):
        # the graph the explainer's forward picks for these inputs (one traced for optional inputs
        # left None, for PyG's BasicGNN models), run directly: its nodes are the ones that run
        explain, args, kwargs = explain.explainer_for(x, edge_index, **kwargs)
        run = explain.graph_module
    with (torch.enable_grad(), recording_messages(layer_names(explain)) as records,
          reusable_graph() if reusable else nullcontext()):
        output = run(*args, **kwargs)
    if not isinstance(output, Tensor):
        raise TypeError(f"the model returns {type(output).__name__}; graph_relevance explains a tensor output "
                        "(for a heterogeneous model, return the output of the explained node type)")
    return GraphForward(output, leaves, records, edge_index, reusable, node_types=node_types)


def _edge_type_of(given: Tensor, edge_index: dict[Any, Tensor]) -> Any:
    """The edge type whose ``edge_index`` a layer was called with: the same tensor, else the one
    with equal values."""
    for edge_type, edges in edge_index.items():
        if edges is given:
            return edge_type
    equal = [edge_type for edge_type, edges in edge_index.items()
             if edges.shape == given.shape and torch.equal(edges, given)]
    if len(equal) != 1:
        raise ValueError("a message-passing layer was called with edges that are not one edge type's edge_index "
                         f"({'several equal ones' if equal else 'none equal'}); edge relevance per edge type "
                         "needs the edge_index tensors of the input")
    return equal[0]


def _hetero_pieces(record: Messages, edge_index: dict[Any, Tensor], sizes: dict[Any, int]) -> list[tuple]:
    """Which messages of ``record`` belong to which edge type: ``(edge type, EdgeMap or None,
    rows, node type of the receivers)``; an EdgeMap matches messages to input edges, rows
    without one are the edge type's input edges in order (layers taking a dict of edge types,
    as ``HGTConv``, send along the concatenation of the edge types' edges)."""
    given = record.given
    if isinstance(given, dict):
        counts = [edges.size(1) for edges in given.values()]
        sent = record.messages.size(record.edge_dim)
        if sum(counts) != sent:
            raise ValueError(f"layer {record.layer} takes a dict of edge types but sent {sent} messages along "
                             f"{sum(counts)} edges; its edge relevance cannot be split by edge type")
        pieces, start = [], 0
        for edge_type, count in zip(given, counts, strict=True):
            receiver = edge_type[-1] if record.source_to_target else edge_type[0]
            pieces.append((edge_type, None, slice(start, start + count), receiver))
            start += count
        return pieces
    if not isinstance(given, Tensor):
        raise ValueError(f"layer {record.layer} was called without an edge_index tensor; "
                         "its edge relevance cannot be given an edge type")
    edge_type = _edge_type_of(given, edge_index)
    receiver = edge_type[-1] if record.source_to_target else edge_type[0]
    num_nodes = max(sizes[edge_type[0]], sizes[edge_type[-1]])
    return [(edge_type, EdgeMap(record.edge_index, edge_index[edge_type], num_nodes, record.source_to_target),
             None, receiver)]


def _node_counts(forward: GraphForward) -> dict[Any, int]:
    sizes = {node_type: leaf.size(0) for node_type, leaf in zip(forward.node_types, forward.leaves, strict=False)}
    for edge_type, edges in forward.edge_index.items():
        for node_type, row in ((edge_type[0], 0), (edge_type[-1], 1)):
            if node_type not in sizes and edges.numel():
                sizes[node_type] = int(edges[row].max()) + 1
    return sizes


def relevance_from(forward: GraphForward, relevance: Tensor) -> GraphRelevance:
    """Propagate the output relevance ``relevance`` through ``forward``."""
    leaves, records = forward.leaves, forward.records
    gradients = torch.autograd.grad(forward.output, [*leaves, *(r.messages for r in records)], relevance,
                                    allow_unused=True, retain_graph=forward.reusable)
    found = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(gradients, leaves, strict=False)]
    if forward.node_types is not None:
        return _hetero_relevance(forward, found, gradients[len(leaves):])
    edge_index = forward.edge_index
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


def _hetero_relevance(forward: GraphForward, found: list[Tensor], message_gradients: tuple) -> GraphRelevance:
    edge_index = forward.edge_index
    sizes = _node_counts(forward)
    if not forward.edge_maps:
        forward.edge_maps = [_hetero_pieces(record, edge_index, sizes) for record in forward.records]
    dtype, device = forward.leaves[0].dtype, forward.leaves[0].device
    edge = {edge_type: torch.zeros(edges.size(1), dtype=torch.float64, device=device)
            for edge_type, edges in edge_index.items()}
    by_layer: dict[str, dict[Any, Tensor]] = {}
    loops_by_layer: dict[str, dict[Any, Tensor]] = {}
    for record, pieces, message_relevance in zip(forward.records, forward.edge_maps, message_gradients, strict=True):
        if message_relevance is None:
            continue
        per_message = _per_edge(record, message_relevance).to(torch.float64)
        for edge_type, edge_map, rows, receiver in pieces:
            if edge_map is None:
                per_edge, loops = per_message[rows], None
            else:
                per_edge, loops = edge_map(per_message)
            edge[edge_type] = edge[edge_type] + per_edge
            layer = by_layer.setdefault(record.layer, {})
            layer[edge_type] = layer.get(edge_type, 0) + per_edge
            if loops is not None:
                layer_loops = loops_by_layer.setdefault(record.layer, {})
                layer_loops[receiver] = layer_loops.get(receiver, 0) + loops[:sizes[receiver]]
    node_count = len(forward.node_types)
    return GraphRelevance(
        output=forward.output.detach(),
        node=dict(zip(forward.node_types, found[:node_count], strict=True)),
        edge={edge_type: value.to(dtype) for edge_type, value in edge.items()},
        edge_by_layer={name: {t: v.to(dtype) for t, v in values.items()} for name, values in by_layer.items()},
        self_loops_by_layer={name: {t: v.to(dtype) for t, v in values.items()}
                             for name, values in loops_by_layer.items()},
        edge_attr=found[node_count] if len(found) > node_count else None,
    )


_MODES = ("multiclass", "binary", "regression")


def _check_graph_target(target: Any, mode: str) -> None:
    """A target of a known kind for ``mode``, before anything runs: None, a class (an int) or a
    tensor of one per row; in ``"binary"`` mode 0/1 or bools."""
    if target is None or mode == "regression":
        return
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(target, (numpy.ndarray, numpy.generic)):
        target = torch.as_tensor(target)
    if isinstance(target, bool) and mode == "binary":
        return
    if isinstance(target, (list, tuple)) and target and all(isinstance(each, int) for each in target):
        return
    if isinstance(target, int) and not isinstance(target, bool):
        return
    if isinstance(target, Tensor):
        if target.device.type == "meta":
            raise ExplanationInputError("target is a tensor on the meta device, which holds no values: give it on "
                                        "the CPU or on the inputs' device")
        if not target.is_floating_point() and not target.is_complex() and (target.dtype != torch.bool
                                                                            or mode == "binary"):
            return
    raise ExplanationInputError(
        f"target {target!r} is not a class: in mode={mode!r} a target is None (each row's highest output), a class "
        f"index (an int; negative ones count from the end, as in torch indexing) or a tensor of one per row"
        + (" (0 or 1, or bools)" if mode == "binary" else ""))


def _check_against_output(output: Tensor, target: Any, index: Any, mode: str, relevance: Tensor | None) -> None:
    """``index``, ``target`` and ``relevance`` against the model's output, in the user's terms."""
    rows = output.size(0) if output.dim() else 0
    if relevance is not None:
        if not isinstance(relevance, Tensor) or relevance.shape != output.shape:
            shown = list(relevance.shape) if isinstance(relevance, Tensor) else type(relevance).__name__
            raise ExplanationInputError(f"relevance ({shown}) must be a tensor of the model's output's shape "
                                        f"{list(output.shape)}")
        return
    if index is not None:
        try:
            torch.zeros(rows, dtype=torch.bool)[index.cpu() if isinstance(index, Tensor) else index]
        except (IndexError, TypeError, RuntimeError, ValueError):
            raise ExplanationInputError(
                f"index {index!r} picks no rows of the model's output {list(output.shape)} ({rows} rows: nodes, "
                f"graphs or node pairs): give a row (0 to {rows - 1}; negative ones count from the end), a tensor "
                f"or list of rows, or a mask of {rows} bools") from None
    if mode == "multiclass" and output.dim() < 2:
        raise ExplanationInputError(f"mode='multiclass' explains a class of each row, but the model's output "
                                    f"{list(output.shape)} has no classes: use mode='regression' (or 'binary')")
    if mode == "regression" or target is None:
        return
    values = torch.as_tensor(target).reshape(-1)
    if values.numel() not in (1, rows):
        raise ExplanationInputError(f"target has {values.numel()} values; the model's output {list(output.shape)} "
                                    f"needs one class, or one per row ({rows})")
    if mode == "binary":
        if bool(((values != 0) & (values != 1)).any()):
            raise ExplanationInputError(f"target {target!r}: in mode='binary' a target is 0 (explain -logit) or 1 "
                                        "(explain +logit)")
        return
    classes = output.size(-1)
    if bool(((values < -classes) | (values >= classes)).any()):
        shown = target.tolist() if isinstance(target, Tensor) and target.numel() <= 16 else target
        raise ExplanationInputError(f"target {shown!r} is out of range: the model's output {list(output.shape)} has "
                                    f"{classes} classes (indices 0 to {classes - 1}, or -{classes} to -1 counting "
                                    "from the end)")


@raised_from_the_call
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

    Parameters
    ----------
    explain
        The explainer :func:`fxlrp.convert` returned for the graph model.
    x
        Node features ``[N, F]`` (a dict by node type for a heterogeneous graph).
    edge_index
        Edges ``[2, E]`` of integers (a dict by edge type for a heterogeneous graph).
    target
        The class explained at each row: None (each row's highest output), an int (negative ones
        count from the end, as in torch indexing) or a tensor of one per row; in ``"binary"`` mode
        0 (``-logit``) or 1 (``+logit``); unused in ``"regression"`` mode.
    index
        The explained rows of the output (nodes, graphs or node pairs): a row, rows or a mask;
        None: all.
    mode
        ``"multiclass"``, ``"binary"`` or ``"regression"``.
    relevance
        The output relevance itself, of the output's shape, instead of ``target`` and ``index``.
    **kwargs
        Further inputs of the model (``edge_attr``, ``batch``, ...).

    Returns
    -------
    GraphRelevance
        Node, edge and edge-feature relevance.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        (a ``ValueError`` and a ``TypeError``) for a NumPy array or a list where the model takes a
        tensor, inputs the model itself rejects (its own message, with what to do), an unknown
        ``mode``, or a target, index or relevance that does not fit the output.
    """
    if mode not in _MODES:
        raise ExplanationInputError(f"mode={mode!r} is not one of {', '.join(map(repr, _MODES))}")
    refuse_unusable_arguments({"x": x, "edge_index": edge_index, **kwargs}, lists_refused=("x", "edge_index"))
    _check_graph_target(target, mode)
    if isinstance(x, Tensor):
        refuse_ranks_the_model_refuses(explain, (x, edge_index))
    with model_consulted(explain, model_of(explain), (x, edge_index), kwargs):
        forward = explained_forward(explain, x, edge_index, **kwargs)
    _check_against_output(forward.output, target, index, mode, relevance)
    start = relevance if relevance is not None else output_relevance(forward.output, target, index, mode)
    return relevance_from(forward, start)
