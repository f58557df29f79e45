"""Running the layers of a converted message-passing model for relevant walks: the forward that
records each step's node states and edges, homogeneous or heterogeneous
(:mod:`fxlrp.integrations.pyg.walks`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn.conv import MessagePassing

from fxlrp.capture.interception import module_calls_followed
from fxlrp.explain.explainer import Explainer
from fxlrp.graph.nodes import REWRITTEN_PREFIX
from fxlrp.integrations.pyg.messages import Messages, recording_messages
from fxlrp.integrations.pyg.relevance import _edge_type_of, layer_names
from fxlrp.integrations.pyg.walk_steps import OUTPUT, Neighbourhoods, Step, detect_steps
from fxlrp.relevance.rule_function import outputs_recorded, reusable_graph


def runs_eagerly(explain: Explainer) -> bool:
    """Whether the model's message passing runs inside code torch.fx could not capture (its
    layers are then not rows of the report)."""
    operations = {row.operation for row in explain.report().rows}
    return "eager" in operations and "message_passing" not in operations


def _call(explain: Explainer, call_args: Sequence[Any], call_kwargs: dict[str, Any], x: Any, leaf: Any) -> Tensor:
    """The explained forward with ``x`` replaced by its leaves, recording messages."""
    arguments = [leaf if value is x else value for value in call_args]
    keywords = {name: leaf if value is x else value for name, value in call_kwargs.items()}
    output = explain.graph_module(*arguments, **keywords)
    if not isinstance(output, Tensor):
        raise TypeError(f"the model returns {type(output).__name__}; relevant walks explain a tensor output "
                        "(for a heterogeneous model, return the output of the explained node type)")
    return output


def run_homogeneous(explain: Explainer, x: Tensor, steps: Sequence[str] | None, call_args: Sequence[Any],
                     call_kwargs: dict[str, Any]) -> tuple[Tensor, list[list[Tensor]], list[Neighbourhoods | None]]:
    described = detect_steps(explain) if steps is None else [Step(name) for name in steps]
    if not described:
        raise ValueError("no message-passing steps: steps must name at least one node state")
    leaf = x.detach().requires_grad_()
    recorded: dict[str, Any] = {}
    handles = []
    try:
        for step in described:
            if step.state != OUTPUT:
                recorder = _output_recorder(recorded, step.state)
                handles.append(_module(explain, step.state).register_forward_hook(recorder))
            indexed = [(step.aggregation, 1, True)] if step.aggregation else []
            for name, position, aggregation in indexed + [(name, position, False) for name, position in step.gathers]:
                recorder = _index_recorder(recorded, name, position, aggregation)
                handles.append(_module(explain, name).register_forward_pre_hook(recorder, with_kwargs=True))
        with torch.enable_grad(), outputs_recorded(), reusable_graph(), recording_messages() as records:
            output = _call(explain, call_args, call_kwargs, x, leaf)
    finally:
        for handle in handles:
            handle.remove()
    states: list[list[Tensor]] = [[leaf]]
    for step in described:
        value = output if step.state == OUTPUT else recorded.get(step.state)
        if not isinstance(value, Tensor) or not value.requires_grad:
            raise ValueError(f"node state {step.state!r} is not a tensor that carries relevance from x")
        if value.dim() == 0 or value.size(0) != x.size(0):
            raise ValueError(f"node state {step.state!r} has shape {tuple(value.shape)}: a node state has one row "
                             f"per node ({x.size(0)})")
        states.append([value])
    neighbourhoods = [_neighbourhoods(step, records, recorded, x.size(0)) for step in described]
    return output, states, neighbourhoods


@dataclass
class _LayerCall:
    layer: nn.Module
    output: Any
    records: list[Messages]
    """The messages sent during the call."""


@contextmanager
def _layer_calls(records: list[Messages]) -> Iterator[list[_LayerCall]]:
    """The outermost calls of PyG message-passing layers made on this thread while active (in
    captured graphs and in code run eagerly, as ``HeteroConv``'s loop), with their outputs and
    the messages ``records`` received during each."""
    calls: list[_LayerCall] = []
    running: list[tuple[nn.Module, int]] = []

    def before(module: nn.Module, args: Any) -> None:
        if isinstance(module, MessagePassing):
            running.append((module, len(records)))

    def after(module: nn.Module, args: Any, output: Any) -> None:
        if running and running[-1][0] is module:
            _, first = running.pop()
            if not running:
                calls.append(_LayerCall(module, output, records[first:]))

    with module_calls_followed(before, after):
        yield calls


def run_layer_calls(
    explain: Explainer, x: Tensor | dict[Any, Tensor], edge_index: Tensor | dict[Any, Tensor],
    call_args: Sequence[Any], call_kwargs: dict[str, Any],
) -> tuple[Tensor, list[list[Tensor]], list[list[int]], list[Neighbourhoods | None], tuple[int, ...]]:
    """Steps from the calls of PyG message-passing layers (heterogeneous graphs, and models run
    eagerly): ``H_t`` is the outputs of the layer calls of step ``t``, a call's step being one
    more than the largest step of the calls its output is computed from (``to_hetero``'s copies
    of one layer, the layers of one ``HeteroConv``, one ``HGTConv`` call: one step). A
    homogeneous graph is one node type, ``None``."""
    hetero = isinstance(x, dict)
    inputs: dict[Any, Tensor] = x if hetero else {None: x}
    if hetero:
        missing = {kind for edge_type in edge_index for kind in (edge_type[0], edge_type[-1])} - set(x)
        if missing:
            raise ValueError(f"node types {sorted(map(str, missing))} have edges but no features in x; walks start "
                             "at input nodes of every type that sends messages")
    counts = {kind: value.size(0) for kind, value in inputs.items()}
    type_offsets = tuple(itertools.accumulate([0, *counts.values()]))[:-1]
    offset = dict(zip(inputs, type_offsets, strict=True))
    nodes = sum(counts.values())
    leaves = {kind: value.detach().requires_grad_() for kind, value in inputs.items()}
    names = layer_names(explain)
    with (torch.enable_grad(), outputs_recorded(), reusable_graph(), recording_messages(names) as records,
          _layer_calls(records) as calls):
        output = _call(explain, call_args, call_kwargs, x, leaves if hetero else leaves[None])
    if not calls:
        raise ValueError("found no call of a PyG message-passing layer in the model; relevant walks here follow the "
                         "layers' messages (to_hetero, HeteroConv, HGTConv and other PyG layers)")
    typed_edges = edge_index if hetero else {(None, None): edge_index}
    # calls on tensors that carry no relevance from x (edge features, positions) are no steps
    kept = [(call, [(tensor, kind) for tensor, kind in _typed_outputs(call, typed_edges, names)
                    if tensor.requires_grad]) for call in calls]
    calls, outputs = [call for call, typed in kept if typed], [typed for _, typed in kept if typed]
    if not calls:
        raise ValueError("no message-passing layer of the model computes on relevance from x")
    depths = _call_depths([[tensor for tensor, _ in typed] for typed in outputs])
    states: list[list[Tensor]] = [list(leaves.values())]
    offsets: list[list[int]] = [list(type_offsets)]
    neighbourhoods: list[Neighbourhoods | None] = []
    for depth in range(1, max(depths) + 1):
        mine = [index for index, found in enumerate(depths) if found == depth]
        tensors = [(tensor, kind) for index in mine for tensor, kind in outputs[index]]
        for tensor, kind in tensors:
            if tensor.dim() == 0 or tensor.size(0) != counts[kind]:
                described = "" if kind is None else f" for node type {kind!r}"
                raise ValueError(f"a message-passing layer of step {depth} returned {tuple(tensor.shape)}{described}, "
                                 f"with {counts[kind]} nodes: a node state has one row per node")
        states.append([tensor for tensor, _ in tensors])
        offsets.append([offset[kind] for _, kind in tensors])
        edges = [_typed_edges(record, typed_edges, offset) for index in mine for record in calls[index].records]
        if any(found is None for found in edges) or not edges:
            neighbourhoods.append(None)
        else:
            pairs = [pair for found in edges for pair in found]
            neighbourhoods.append(Neighbourhoods(torch.cat([senders for senders, _ in pairs]),
                                                 torch.cat([receivers for _, receivers in pairs]), nodes))
    return output, states, offsets, neighbourhoods, type_offsets


def _typed_outputs(call: _LayerCall, edge_index: dict[Any, Tensor], names: dict[int, str]) -> list[tuple[Tensor, Any]]:
    """The tensors a layer call returned, each with its node type (that of the receivers of its
    edge type, or the key of a dict by node type as ``HGTConv`` returns)."""
    name = names.get(id(call.layer), type(call.layer).__name__)
    if isinstance(call.output, dict):
        return [(value, kind) for kind, value in call.output.items() if isinstance(value, Tensor)]
    if not isinstance(call.output, Tensor):
        raise ValueError(f"message-passing layer {name} returned {type(call.output).__name__}; walks need its node "
                         "states, a tensor or a dict of tensors by node type")
    if (None, None) in edge_index:  # homogeneous
        return [(call.output, None)]
    given = [record.given for record in call.records if isinstance(record.given, Tensor)]
    if not given:
        raise ValueError(f"message-passing layer {name} sent no messages along an edge_index tensor of the input; "
                         "walks cannot tell the node type of its output")
    edge_type = _edge_type_of(given[0], edge_index)
    return [(call.output, edge_type[-1] if call.records[0].source_to_target else edge_type[0])]


def _typed_edges(record: Messages, edge_index: dict[Any, Tensor],
                 offset: dict[Any, int]) -> list[tuple[Tensor, Tensor]] | None:
    """The (senders, receivers) global rows of the edges a record's messages were sent along;
    None where they are not known."""
    if (None, None) in edge_index:  # homogeneous: the edges the layer sent along
        typed = [((None, None), record.edge_index)]
    elif isinstance(record.given, dict):  # one call for all edge types (HGTConv): the given edges
        typed = list(record.given.items())
    elif isinstance(record.given, Tensor):
        try:
            typed = [(_edge_type_of(record.given, edge_index), record.edge_index)]
        except ValueError:
            return None
    else:
        return None
    found = []
    for edge_type, edges in typed:
        first, second = offset[edge_type[0]] + edges[0], offset[edge_type[-1]] + edges[1]
        found.append((first, second) if record.source_to_target else (second, first))
    return found


def _call_depths(outputs: list[list[Tensor]]) -> list[int]:
    """The step of each layer call: one more than the largest step of the earlier calls whose
    outputs its outputs are computed from (found in the autograd graph)."""
    owner = {tensor.grad_fn: index for index, tensors in enumerate(outputs) for tensor in tensors
             if tensor.grad_fn is not None}
    depths: list[int] = []
    for index, tensors in enumerate(outputs):
        below, seen = 0, set()
        stack = [parent for tensor in tensors if tensor.grad_fn is not None
                 for parent, _ in tensor.grad_fn.next_functions if parent is not None]
        while stack:
            function = stack.pop()
            if function in seen:
                continue
            seen.add(function)
            earlier = owner.get(function)
            if earlier is not None and earlier != index:
                below = max(below, depths[earlier])
                continue
            stack.extend(parent for parent, _ in function.next_functions if parent is not None)
        depths.append(below + 1)
    return depths


def _module(explain: Explainer, name: str) -> nn.Module:
    try:
        return explain.graph_module.get_submodule(REWRITTEN_PREFIX + name)
    except AttributeError:
        known = ", ".join(row.name for row in explain.report().rows[:12])
        raise ValueError(f"no node {name!r} to record in the explained model; steps are names of rows of "
                         f"explain.report() (e.g. {known}, ...)") from None
def _output_recorder(recorded: dict[str, Any], name: str) -> Any:
    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        recorded[name] = output

    return hook


def _index_recorder(recorded: dict[str, Any], name: str, position: int, aggregation: bool) -> Any:
    """Records the index a gather (``x[index]``: position 1, ``x.index_select(0, index)``: 2) or an
    aggregation along dimension 0 (``scatter(src, index, dim=0)``: 1) is called with."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        source = args[0] if args else None
        index = args[position] if len(args) > position else kwargs.get("index")
        if aggregation:  # torch_scatter's functions default to dim=-1, PyG's scatter to dim=0
            library = getattr(getattr(module, "function", None), "__module__", None) or ""
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0 if library.startswith("torch_geometric") else -1)
        elif position == 2:  # index_select(x, dim, index)
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
        else:  # x[index]
            dim = 0
        if isinstance(source, Tensor) and isinstance(index, Tensor) and index.dim() == 1 and isinstance(dim, int) \
                and dim in (0, -source.dim()):
            recorded[name] = index

    return hook


def _neighbourhoods(step: Step, records: list[Messages], recorded: dict[str, Any], nodes: int) -> Neighbourhoods | None:
    """The step's edges as :class:`Neighbourhoods`; None where they are not known exactly."""
    if step.layer is not None:
        mine = [record for record in records if record.layer == step.layer]
        if len(mine) != 1:
            return None  # a layer run twice, or one that propagates several times
        sent = mine[0].edge_index
        senders, receivers = (sent[0], sent[1]) if mine[0].source_to_target else (sent[1], sent[0])
        return Neighbourhoods(senders, receivers, nodes)
    if step.aggregation is None:
        return None
    receivers = recorded.get(step.aggregation)
    gathered = [recorded.get(name) for name, _ in step.gathers]
    if not isinstance(receivers, Tensor) or not gathered or any(
            not isinstance(index, Tensor) or index.shape != receivers.shape for index in gathered):
        return None
    return Neighbourhoods(torch.cat(gathered), receivers.repeat(len(gathered)), nodes)
