"""The walk graph of relevant walks (:mod:`fxlrp.integrations.pyg.walks`): one forward pass of a
converted message-passing model with its node states ``H_0, ..., H_L`` as :class:`Layout` matrices,
the output relevance and the relevance reaching each state directly from the output, kept for any
number of step-backward passes ``B_t`` (:class:`WalkGraph`, built and checked by :func:`walk_graph`),
and the walks it returns on heterogeneous graphs (:class:`HeteroWalks`)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.errors import ExplanationInputError
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.input_checks import refuse_unusable_arguments
from fxlrp.explain.model_rejection import model_consulted, model_of, raised_from_the_call
from fxlrp.explain.rank_checks import refuse_ranks_the_model_refuses
from fxlrp.integrations.pyg.walk_layers import run_homogeneous, run_layer_calls, runs_eagerly
from fxlrp.integrations.pyg.walk_steps import Neighbourhoods
from fxlrp.rules import Rule
from fxlrp.rules.composites import Composite


class Layout:
    """The tensors of one node state as one matrix ``[N, F]``, on which walks are searched.

    Row ``offset + i`` is node ``i`` of a node type (the node types of ``x`` one after another;
    a homogeneous graph has one type, offset 0); its columns are that node's rows of the state's
    tensors of its type side by side, flattened, zero-padded to the widest type. A
    heterogeneous state has several tensors per type when the layers of one step send to a type
    along several edge types (``to_hetero``'s and ``HeteroConv``'s copies per edge type, summed
    afterwards: masking each copy's row masks the sum's row, the sum acting element by element).
    """

    def __init__(self, tensors: Sequence[Tensor], offsets: Sequence[int], nodes: int) -> None:
        self.shapes = [tensor.shape for tensor in tensors]
        self.nodes = nodes
        self.dtype, self.device = tensors[0].dtype, tensors[0].device
        used: dict[int, int] = {}
        self.blocks: list[tuple[int, int, int, int]] = []  # rows first:end, columns left:right
        for tensor, offset in zip(tensors, offsets, strict=True):
            width, left = math.prod(tensor.shape[1:]), used.get(offset, 0)
            self.blocks.append((offset, offset + tensor.size(0), left, left + width))
            used[offset] = left + width
        self.width = max(used.values())
        self.whole = len(tensors) == 1 and tensors[0].size(0) == nodes

    def zeros(self, rows: int | None = None) -> Tensor:
        return torch.zeros(self.nodes if rows is None else rows, self.width, dtype=self.dtype, device=self.device)

    def flat(self, parts: Sequence[Tensor | None]) -> Tensor:
        """The matrix of the state's tensors (None: zero)."""
        if self.whole and parts[0] is not None:
            return parts[0].reshape(self.nodes, -1)
        matrix = self.zeros()
        for part, (first, end, left, right) in zip(parts, self.blocks, strict=True):
            if part is not None:
                matrix[first:end, left:right] = part.reshape(end - first, -1)
        return matrix

    def parts(self, matrix: Tensor) -> list[Tensor]:
        """The state's tensors of a matrix."""
        return [matrix[first:end, left:right].reshape(shape)
                for (first, end, left, right), shape in zip(self.blocks, self.shapes, strict=True)]


@dataclass(frozen=True, eq=False)
class HeteroWalks:
    """Walks on a heterogeneous graph: step ``t`` of walk ``w`` is node ``ids[w, t]`` of type
    ``node_types[types[w, t]]`` (``node_types`` the types of ``x`` in its order). A walk that
    reaches the output from an earlier node state (jumping knowledge) has ``-1`` in both after
    its last node, as for homogeneous walks. Index with rows (``walks[:5]``, ``walks[rows]``) for
    a subset, :meth:`steps` for one walk as ``(node type, id)`` pairs."""

    node_types: tuple[Any, ...]
    types: Tensor
    """``[W, L + 1]``: index of each step's node type in :attr:`node_types`."""
    ids: Tensor
    """``[W, L + 1]``: each step's node id within its type."""

    def __len__(self) -> int:
        return self.ids.size(0)

    def __getitem__(self, rows: Any) -> HeteroWalks:
        if isinstance(rows, int):
            rows = slice(rows, rows + 1 if rows != -1 else None)
        return HeteroWalks(self.node_types, self.types[rows], self.ids[rows])

    def steps(self, walk: int) -> list[tuple[Any, int]]:
        """Walk ``walk`` as ``[(node type, id), ...]``, input layer first."""
        return [(self.node_types[kind], node)
                for kind, node in zip(self.types[walk].tolist(), self.ids[walk].tolist(), strict=True) if kind >= 0]

    def by_types(self) -> dict[tuple[Any, ...], Tensor]:
        """The rows of the walks of each node-type sequence (input layer first), e.g.
        ``{("author", "paper", "paper"): tensor([0, 3, ...]), ...}``."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for row, kinds in enumerate(self.types.tolist()):
            groups.setdefault(tuple(self.node_types[kind] for kind in kinds if kind >= 0), []).append(row)
        return {key: torch.tensor(rows, dtype=torch.long) for key, rows in groups.items()}


@dataclass
class WalkGraph:
    """One forward pass of a converted model, kept for any number of step-backward passes.

    ``states``: per step ``t = 0..L`` the tensors of ``H_t`` (``H_0``: the input leaves, one per
    node type), with ``layouts`` that make each state one matrix (:class:`Layout`; every
    relevance here is such a matrix); ``start``: the output relevance ``r``; ``exits``: per
    ``t = 0..L`` the relevance reaching ``H_t`` from the output through no later state
    (``exits[L]``: all of ``H_L``'s, ``B_out r``; earlier ones non-zero for jumping knowledge);
    ``neighbourhoods``: per step ``t = 1..L`` (index ``t - 1``) the rows each node's relevance
    can reach, where the step's edges are known (then suffixes at nodes with disjoint
    neighbourhoods share one pass). ``node_types`` and ``offsets``: for heterogeneous graphs, the
    node types and where each one's rows start.
    """

    output: Tensor
    states: list[list[Tensor]]
    layouts: list[Layout]
    start: Tensor
    exits: list[Tensor]
    neighbourhoods: list[Neighbourhoods | None] = field(default_factory=list)
    node_types: tuple[Any, ...] | None = None
    offsets: tuple[int, ...] = (0,)
    passes: int = 0
    """Step-backward passes run so far."""

    @property
    def depth(self) -> int:
        return len(self.states) - 1

    @property
    def last(self) -> Tensor:
        """The relevance at ``H_L``."""
        return self.exits[-1]

    def step(self, t: int, relevance: Tensor) -> Tensor:
        """``B_t``: relevance at ``H_t`` to relevance at ``H_{t-1}`` (as :class:`Layout` matrices)."""
        self.passes += 1
        with torch.enable_grad():
            found = torch.autograd.grad(self.states[t], self.states[t - 1], self.layouts[t].parts(relevance),
                                        retain_graph=True, allow_unused=True)
        return self.layouts[t - 1].flat(found)

    def node(self, nodes: Tensor | Sequence[int] | dict[Any, Tensor | Sequence[int]]) -> Tensor:
        """The rows of ``nodes`` (ids; on heterogeneous graphs ``{node type: ids}``) in the
        :class:`Layout` matrices."""
        if self.node_types is None:
            return torch.as_tensor(nodes, dtype=torch.long, device=self.start.device).view(-1)
        if not isinstance(nodes, dict):
            raise ValueError("for a heterogeneous graph, give nodes as a dict {node type: node ids}")
        unknown = set(nodes) - set(self.node_types)
        if unknown:
            raise ValueError(f"node types {sorted(map(str, unknown))} are not in x (node types: "
                             f"{', '.join(map(str, self.node_types))})")
        offset = dict(zip(self.node_types, self.offsets, strict=True))
        return torch.cat([offset[kind] + torch.as_tensor(ids, dtype=torch.long, device=self.start.device).view(-1)
                          for kind, ids in nodes.items()] or [torch.zeros(0, dtype=torch.long)])

    def typed(self, walks: Tensor) -> HeteroWalks:
        """Walks of global row ids as :class:`HeteroWalks`."""
        offsets = torch.tensor(self.offsets, dtype=torch.long, device=walks.device)
        types = torch.searchsorted(offsets, walks.clamp(min=0), right=True) - 1
        ids = walks - offsets[types]
        ended = walks < 0
        return HeteroWalks(self.node_types, types.masked_fill(ended, -1), ids.masked_fill(ended, -1))


def _converted(model: nn.Module, composite: Composite | Rule | None) -> Explainer:
    if isinstance(model, Explainer):
        if composite is not None:
            raise ValueError("model is already converted: give composite= to fxlrp.convert instead")
        return model
    return fxlrp.convert(model, composite)


def _one_integer(value: Any) -> bool:
    """An int (a NumPy integer included) or a tensor holding one integer; not a bool or a float."""
    if isinstance(value, Tensor):
        return value.numel() == 1 and not value.is_floating_point() and not value.is_complex() \
            and value.dtype != torch.bool
    if isinstance(value, (bool, float)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check_walk_target(target: Any, index: Any) -> None:
    """``target`` and ``index`` of known kinds, before anything runs: a target is None, a class (an
    int, or a tensor holding one) or a float tensor (the output relevance, checked against the
    output's shape when it is known); an index is a row: an int or a tensor holding one."""
    if not _one_integer(index):
        raise ExplanationInputError(f"index {index!r} is not a row of the output: give one row (a node, a graph or a "
                                    "node pair) as an int, or a tensor holding one")
    if isinstance(target, Tensor) and target.device.type == "meta":
        raise ExplanationInputError("target is a tensor on the meta device, which holds no values: give it on the CPU "
                                    "or on the inputs' device")
    if target is None or _one_integer(target):
        return
    if isinstance(target, Tensor) and target.is_floating_point():
        return
    raise ExplanationInputError(f"target {target!r} is not a class: a target is None (the row's highest output), a "
                                "class index (an int; negative ones count from the end, as in torch indexing), or a "
                                "float tensor of the output's shape (the output relevance itself)")


def _check_walk_start(output: Tensor, index: Any, target: Any) -> None:
    """``index`` and ``target`` against the model's output, in the user's terms."""
    if isinstance(target, Tensor) and target.is_floating_point():
        if target.shape != output.shape:
            raise ExplanationInputError(f"target is a float tensor of shape {list(target.shape)}: a float tensor is "
                                        f"taken as the output relevance itself and must have the model's output's "
                                        f"shape {list(output.shape)}; a class is given by its index, an int")
        return
    rows = output.size(0) if output.dim() else 0
    row = int(index)
    if not -rows <= row < rows:
        raise ExplanationInputError(f"index {row} is out of range: the model's output {list(output.shape)} has {rows} "
                                    f"rows (nodes, graphs or node pairs; 0 to {rows - 1}, or -{rows} to -1 counting "
                                    "from the end)")
    if target is not None and output.dim() == 2:
        classes, chosen = output.size(1), int(target)
        if not -classes <= chosen < classes:
            raise ExplanationInputError(f"target {chosen} is out of range: the model's output {list(output.shape)} "
                                        f"has {classes} classes (indices 0 to {classes - 1}, or -{classes} to -1 "
                                        "counting from the end)")


@raised_from_the_call
def walk_graph(
    model: nn.Module,
    x: Tensor | dict[Any, Tensor],
    edge_index: Tensor | dict[Any, Tensor],
    *,
    index: Any,
    target: Any = None,
    composite: Composite | Rule | None = None,
    steps: Sequence[str] | None = None,
    check: bool = True,
    **forward_kwargs: Any,
) -> WalkGraph:
    """Run ``model(x, edge_index, **forward_kwargs)`` explained (``model`` as it is if it is an
    :class:`~fxlrp.Explainer`, else ``fxlrp.convert(model, composite)``), keeping the node states
    (homogeneous: ``steps``, default :func:`fxlrp.integrations.pyg.walk_steps`; heterogeneous: see
    :func:`relevant_walks`) and the relevance reaching each from the output.

    ``check``: verify that the step-by-step backward (the chain of ``B_t`` with the exits) equals
    the model's own relevance of ``x`` (no relevance bypasses a step); ``ValueError`` otherwise.

    Parameters
    ----------
    model, x, edge_index, index, target, composite, steps, **forward_kwargs
        As for :func:`relevant_walks`.
    check
        As described above.

    Returns
    -------
    WalkGraph
        The node states, their layouts and the relevance reaching each.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        (a ``ValueError`` and a ``TypeError``) for a NumPy array or a list where the model takes a
        tensor, inputs the model itself rejects (its own message, raised from its own error, with
        what to do), an ``index`` that is not one row of the output, a ``target`` that is no class
        or out of range.
    ValueError
        For steps that do not decompose the explanation, or a graph that is not one.
    """
    refuse_unusable_arguments({"x": x, "edge_index": edge_index, **forward_kwargs}, lists_refused=("x", "edge_index"))
    if isinstance(x, dict) != isinstance(edge_index, dict):
        raise ValueError("x and edge_index must both be tensors (homogeneous graph) or both dicts by node and edge "
                         "type (heterogeneous graph: data.x_dict, data.edge_index_dict)")
    _check_walk_target(target, index)
    converted = _converted(model, composite)
    if isinstance(x, Tensor):
        refuse_ranks_the_model_refuses(converted, (x, edge_index))
    # (inputs the model itself rejects are refused in its words, not by a failure inside)
    with model_consulted(converted, model_of(converted), (x, edge_index), forward_kwargs):
        # the graph this call runs; run directly, since calling the explainer it comes from (or that
        # one, when it was traced for optional inputs left None) may trace yet another graph
        explain, call_args, call_kwargs = converted.explainer_for(x, edge_index, **forward_kwargs)
        if isinstance(x, dict):
            if steps is not None:
                raise ValueError("steps= names node states of a homogeneous model; on heterogeneous graphs the steps "
                                 "are the calls of the message-passing layers, found by themselves")
            output, states, offsets, neighbourhoods, type_offsets = run_layer_calls(explain, x, edge_index, call_args,
                                                                                     call_kwargs)
            node_types, nodes = tuple(x), sum(value.size(0) for value in x.values())
        elif steps is None and runs_eagerly(explain):
            output, states, offsets, neighbourhoods, _ = run_layer_calls(explain, x, edge_index, call_args,
                                                                          call_kwargs)
            node_types, type_offsets, nodes = None, (0,), x.size(0)
        else:
            output, states, neighbourhoods = run_homogeneous(explain, x, steps, call_args, call_kwargs)
            offsets, node_types, type_offsets, nodes = [[0]] * len(states), None, (0,), x.size(0)
    _check_walk_start(output, index, target)
    layouts = [Layout(tensors, offset, nodes) for tensors, offset in zip(states, offsets, strict=True)]
    start = _output_relevance(output, index, target)
    exits = _exits(states, layouts, output, start)
    graph = WalkGraph(output.detach(), states, layouts, start, exits, neighbourhoods, node_types, type_offsets)
    if check:
        _check_decomposition(graph, output)
    return graph


def _exits(states: list[list[Tensor]], layouts: list[Layout], output: Tensor, start: Tensor) -> list[Tensor]:
    """Per ``t = 0..L``: the relevance reaching ``H_t`` from the output through no later state
    (one backward pass in which each state records what reaches it and passes nothing on)."""
    last = len(states) - 1
    if any(tensor is output for tensor in states[last]):  # the output is H_L: nothing avoids it
        return [layout.zeros() for layout in layouts[:last]] + [
            layouts[last].flat([start if tensor is output else None for tensor in states[last]])]
    reached: dict[tuple[int, int], Tensor] = {}

    def stop(key: tuple[int, int]) -> Any:
        def hook(gradient: Tensor) -> Tensor:
            reached[key] = gradient
            return torch.zeros_like(gradient)

        return hook

    handles = [tensor.register_hook(stop((t, position)))
               for t in range(1, last + 1) for position, tensor in enumerate(states[t])]
    try:
        with torch.enable_grad():
            found = torch.autograd.grad(output, states[0], start, retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    return [layouts[0].flat(found)] + [
        layouts[t].flat([reached.get((t, position)) for position in range(len(states[t]))])
        for t in range(1, last + 1)]


def _output_relevance(output: Tensor, index: Any, target: Any) -> Tensor:
    """``r``: the explained output itself at row ``index`` (class ``target``; None: the largest)."""
    if isinstance(target, Tensor) and target.is_floating_point() and target.shape == output.shape:
        return target.detach()
    if isinstance(index, Tensor) and index.numel() == 1:  # as PyG's Explainer passes it
        index = int(index)
    values = output.detach()
    start = torch.zeros_like(values)
    if values.dim() == 1:
        start[index] = values[index]
        return start
    row = values[index]
    if row.dim() != 1:
        raise ValueError(f"index {index!r} picks {tuple(row.shape)} outputs; it must pick one row of logits")
    chosen = int(row.argmax()) if target is None else int(target)
    start[index, chosen] = values[index, chosen]
    return start


def _check_decomposition(graph: WalkGraph, output: Tensor) -> None:
    """The chain of step backwards (with the exits) must give the model's own input relevance."""
    with torch.enable_grad():
        found = torch.autograd.grad(output, graph.states[0], graph.start, retain_graph=True, allow_unused=True)
    full = graph.layouts[0].flat(found)
    chained = graph.exits[-1]
    for t in range(graph.depth, 0, -1):
        chained = graph.step(t, chained) + graph.exits[t - 1]
    scale = full.abs().max().item() if full.numel() else 0.0
    difference = (chained - full).abs().max().item() if full.numel() else 0.0
    if difference > 1e4 * torch.finfo(full.dtype).eps * max(scale, torch.finfo(full.dtype).tiny):
        raise ValueError(
            "relevance reaches the input around the message-passing steps (a connection from an earlier node state "
            "into a later step's messages, or node states that are not the steps' outputs): walks do not decompose "
            f"the explanation (largest difference {difference:.3g} at relevance scale {scale:.3g}); name the "
            "node states with steps=[...]"
        )
