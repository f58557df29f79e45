r"""Relevant walks (GNN-LRP, Schnake et al., TPAMI 2022) and subgraph relevance (sGNN-LRP, Xiong
et al., ICML 2022) for any message-passing model fxlrp explains: homogeneous and heterogeneous
graphs, node-, edge- and graph-level outputs.

**Node states.** A model with ``L`` message-passing steps computes node states
``H_0 = x, H_1, ..., H_L`` (tensors with one row per node) and its output from ``H_L``. Step
``t`` computes row ``k`` of ``H_t`` from the rows of ``H_{t-1}`` at ``k`` and at its neighbours
(the messages along the edges into ``k``, the root or self-loop term). For PyG models ``H_t`` is
the output of the ``t``-th message-passing layer; for torch_scatter models it is the tensor whose
rows the next step's messages gather (``h[senders]``), and ``H_L`` the input of the pooling after
the last step or, for node-level outputs, the output itself (see
:func:`~fxlrp.integrations.pyg.walk_steps.walk_steps`). The steps are found in
:mod:`~fxlrp.integrations.pyg.walk_steps`, the layers run in :mod:`~fxlrp.integrations.pyg.walk_layers`;
here the walks are searched.

**LRP is linear in the output relevance.** Given the forward pass, every rule fxlrp applies
(LRP-0, epsilon, gamma, z+, alpha-beta, flat, z^B, the proportional and winner-take-all rules of
aggregations, AttnLRP's softmax and product rules, CP-LRP) computes the input relevance as a
linear function of the output relevance, e.g. epsilon: ``R_in = x * J^T (R_out / (z + eps
sign z))`` with ``x``, ``J`` and ``z`` fixed by the forward pass. So the backward pass of step
``t`` is a linear map ``B_t`` from relevance at ``H_t`` to relevance at ``H_{t-1}``
(``torch.autograd.grad(H_t, H_{t-1}, R)`` through the rewritten graph), and the output's is a
linear map ``B_out`` from the output relevance ``r`` (the explained logit at ``index``, zero
elsewhere, as in :func:`fxlrp.attribute`) to ``H_L``.

**Walk relevance.** Let ``P_j`` keep row ``j`` of a node-indexed tensor and zero the others, and
``1^T`` sum a row over its features. The relevance of the walk ``w = (j_0, j_1, ..., j_L)``
(input-layer node first, ``j_L`` a node of ``H_L``: the explained node for node-level outputs)
is GNN-LRP's: LRP with relevance allowed only through node ``j_t`` at step ``t``,

    R(w) = 1^T P_{j_0} B_1 P_{j_1} B_2 ... P_{j_{L-1}} B_L P_{j_L} B_out r.

Written with the node blocks ``A^t_{ik}`` of ``B_t`` (the ``F_{t-1} x F_t`` matrix taking the
relevance of row ``k`` of ``H_t`` to row ``i`` of ``H_{t-1}``; zero unless ``i = k`` or an edge
``i -> k`` is used by step ``t``) and ``b = P_{j_L} B_out r``, it is a chain of matrix products
``R(w) = 1^T A^1_{j_0 j_1} A^2_{j_1 j_2} ... A^L_{j_{L-1} j_L} b_{j_L}``.

**Exact decomposition.** ``sum_j P_j = I`` and every map is linear, so summing ``R(w)`` over
``j_1, ..., j_L`` removes the masks: for every node ``j``

    sum over walks with j_0 = j of R(w) = 1^T P_j B_1 B_2 ... B_L B_out r = R(j),

the node relevance of ``j`` from one ordinary explanation (``fxlrp.attribute``,
:func:`fxlrp.integrations.pyg.graph_relevance`) under the same composite. This holds when relevance reaches
``H_{t-1}`` only through step ``t`` (for relevance reaching a state directly from the output,
see walks that leave early, below); :func:`relevant_walks` checks it on every call (the chain
``B_1 ... B_L B_out r`` must equal the model's own backward pass) and raises ``ValueError``
otherwise.

**Computation.** The walks are found from the output backward, suffix by suffix: a suffix
``(j_t, ..., j_L)`` carries its relevance vector ``v = P_{j_t} B_{t+1} ... P_{j_L} B_out r``
(one row of ``H_t``); one backward pass through step ``t`` alone (``autograd.grad`` of ``H_t``
with respect to ``H_{t-1}``, the forward kept with
:func:`~fxlrp.relevance.rule_function.reusable_graph`) gives ``B_t v``, whose non-zero rows ``i``
are the suffixes ``(i, j_t, ..., j_L)`` one step longer. A row that is zero has only walks of
relevance zero (linearity), so ``top_k=None`` returns every walk with non-zero relevance.

Suffixes share a pass where that is exact: ``B_t`` sends the relevance of row ``k`` only to the
rows of its *neighbourhood* ``D_t(k)`` (``k`` and the senders of the messages ``k`` receives in
step ``t``: read from the edges a PyG layer actually sent messages along, self-loops included,
or from the indices a scatter model's step gathers and aggregates with). For suffixes at nodes
with pairwise disjoint neighbourhoods, ``B_t`` of the sum of their seeds, restricted to
``D_t(k)``, is ``B_t`` of the seed at ``k`` (linearity, disjoint supports), so one pass serves
them all (greedy first-fit grouping; relevance on a row outside every neighbourhood of a group is
an error, never silently attributed). Suffixes at one node, or at nodes sharing a neighbour, get
separate passes. Enumeration is exponential in depth, as every enumeration of walks is (about
``(d + 1)^L`` walks per explained node for mean degree ``d``).

**Top-k.** Walk relevance is a bilinear form of a chain of signed ``F x F`` matrices, not a
product of scalars, so the max-product (Viterbi) dynamic programme that gives exact top-k paths
for scalar weights does not apply: two suffixes ending at the same node cannot be merged, and
the best completion of a suffix depends on its whole vector ``v``. Exact top-k over node-level
walks in polynomial time is not known; with ``2 x 2`` rotation blocks (angle ``pi a_t / S`` or
``0`` at the two nodes of layer ``t``) the largest walk relevance is ``1`` exactly when the
numbers ``a_t`` have a subset summing to ``S / 2`` (PARTITION). Xiong et al. (Relevant Walk
Search, ICML 2023) likewise find top-K walks exactly only at the neuron level (scalar factors)
and approximately at the node level. ``top_k=k`` therefore runs a **beam search**: at each step
only the ``beam`` suffixes with the largest (``largest=False``: smallest) relevance ``1^T v``
are extended. ``1^T v`` is the sum of the relevances of all walks the suffix leads to (exactly,
for bias-free conservative rules; otherwise up to what biases absorb), so the beam keeps the
suffixes that carry the most relevance of the sign asked for. Cost: at most ``L * beam``
step-backward passes, each linear in the number of edges: polynomial in graph size and depth.
Every returned relevance is the exact ``R(w)`` of its walk; the search is exact (equal to the
top ``k`` of the full enumeration) whenever no step had more than ``beam`` suffixes, which holds
on small graphs and receptive fields with the default ``beam`` (256); beyond that it is an
approximation (a walk whose suffix carries little total relevance, its completions cancelling,
can be missed).

**Walks that leave early** (jumping knowledge: the layers' outputs joined before the head, or
``x`` itself fed to the head). Relevance then reaches the output from an earlier state ``H_t``
directly, not through ``H_{t+1}``. With ``E_t`` the relevance reaching ``H_t`` from the output
through no later state (one backward pass in which every state records what reaches it and
passes nothing on; ``E_L = B_out r``), the relevance at ``H_t`` is ``E_t + B_{t+1}(...)``
and walks ``(j_0, ..., j_t)`` of every length ``t`` decompose it:
``R(j_0, ..., j_t) = 1^T P_{j_0} B_1 P_{j_1} ... B_t P_{j_t} E_t``, returned padded with ``-1``
after ``j_t``. A model without such paths has ``E_t = 0`` for ``t < L``. Relevance that reaches
``H_{t-1}`` neither through ``H_t`` nor directly from the output (an earlier state fed into a
later step's messages) belongs to no walk: the check refuses it.

**Heterogeneous graphs** (``x`` and ``edge_index`` dicts by node and edge type). Nodes of all
types are numbered one type after the other (the order of ``x``), so a state is one matrix with
a row per node (:class:`Layout`) and all of the above applies unchanged. The steps are found from
the calls of the PyG message-passing layers: ``H_t`` is the outputs of the calls of step ``t``, a
call's step being one more than the largest step of the calls its output is computed from (in
the autograd graph). ``to_hetero`` and ``HeteroConv`` run one copy of a layer per edge type and
sum the copies sending to a node type afterwards: the copies' outputs are the state's tensors
of that type, side by side in its row (masking each copy's row masks the sum's row, the sum
acting element by element). An ``HGTConv`` call returns all types at once. The neighbourhoods
come from each call's messages and the edge type its ``edge_index`` belongs to. Models torch.fx
cannot trace (run eagerly as a whole) get their steps the same way, with one node type.

**Edge-level outputs** (the score of a node pair, link prediction) need nothing of their own:
the explained row's relevance reaches ``H_L`` at the pair's two nodes, so walks end at either.

**Subgraph relevance** (sGNN-LRP). The relevance of a node set ``S`` is the sum over walks that
stay inside ``S``; with ``P_S = sum_{j in S} P_j`` it is

    R(S) = 1^T P_S B_1 P_S B_2 ... P_S B_L P_S B_out r,

``L`` step-backward passes, linear in depth (:func:`subgraph_relevance`); with early exits,
``P_S (B_t v + E_{t-1})`` at each step.
"""

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


def _nonzero_rows(relevance: Tensor) -> Tensor:
    return relevance.ne(0).any(dim=1).nonzero().view(-1)


def _batches(nodes: list[int], neighbourhoods: Neighbourhoods | None) -> list[list[int]]:
    """Suffix positions grouped so that the suffixes of a group end at nodes whose
    neighbourhoods are disjoint (first fit); one group per suffix without known edges."""
    if neighbourhoods is None:
        return [[position] for position in range(len(nodes))]
    groups: list[tuple[set[int], list[int]]] = []
    for position, node in enumerate(nodes):
        rows = neighbourhoods.of(node)
        for used, members in groups:
            if used.isdisjoint(rows):
                used |= rows
                members.append(position)
                break
        else:
            groups.append((set(rows), [position]))
    return [members for _, members in groups]


def _extend(graph: WalkGraph, t: int, suffixes: Tensor, vectors: Tensor) -> tuple[Tensor, Tensor]:
    """Every suffix ``(j_t, ..., j_L)`` one step longer: ``(i, j_t, ..., j_L)`` with the rows
    ``i`` of ``B_t v`` that are not zero, and those rows."""
    nodes = suffixes[:, 0].tolist()
    neighbourhoods = graph.neighbourhoods[t - 1]
    longer, carried = [], []
    seed = graph.layouts[t].zeros()
    for group in _batches(nodes, neighbourhoods):
        for position in group:
            seed[nodes[position]] = vectors[position]
        below = graph.step(t, seed)
        for position in group:
            seed[nodes[position]] = 0
        found = _nonzero_rows(below)
        if len(group) == 1:
            owners = [found]
        else:
            rows = found.tolist()
            owner_of = {row: position for position in group for row in neighbourhoods.of(nodes[position])}
            if any(row not in owner_of for row in rows):
                raise RuntimeError(
                    f"relevance of message-passing step {t} reached rows outside the neighbourhoods its edges give; "
                    "the step mixes nodes in another way: name its node states with steps=[...]")
            owners = [found[[owner_of[row] == position for row in rows]] if rows else found for position in group]
        for position, mine in zip(group, owners, strict=True):
            longer.append(torch.cat([mine.view(-1, 1), suffixes[position].expand(mine.numel(), -1)], dim=1))
            carried.append(below[mine])
    if not longer:
        return suffixes.new_zeros(0, suffixes.size(1) + 1), graph.layouts[t - 1].zeros(0)
    return torch.cat(longer), torch.cat(carried).detach()


def _search(graph: WalkGraph, beam: int | None, largest: bool) -> tuple[Tensor, Tensor]:
    """Walks ``[W, L + 1]`` (input node first, ``-1`` after a walk's exit) and their relevance
    ``[W]``; every suffix extended if ``beam`` is None, else the ``beam`` suffixes of largest
    (smallest) relevance at each step. A suffix starts at each row of ``H_L`` with relevance and
    at each row of an earlier state that relevance reaches directly (an exit)."""
    depth = graph.depth
    rows = _nonzero_rows(graph.last)
    suffixes, vectors = rows.view(-1, 1), graph.last[rows].detach()
    for t in range(depth, 0, -1):
        if beam is not None and suffixes.size(0) > beam:
            kept = torch.topk(vectors.sum(dim=1), beam, largest=largest).indices
            suffixes, vectors = suffixes[kept], vectors[kept]
        suffixes, vectors = _extend(graph, t, suffixes, vectors)
        exit_relevance = graph.exits[t - 1]
        rows = _nonzero_rows(exit_relevance)
        if rows.numel():
            ended = torch.cat([rows.view(-1, 1), rows.new_full((rows.numel(), depth - t + 1), -1)], dim=1)
            suffixes = torch.cat([suffixes, ended])
            vectors = torch.cat([vectors, exit_relevance[rows].detach()])
    relevance = vectors.sum(dim=1)
    nonzero = relevance != 0
    return suffixes[nonzero], relevance[nonzero]


DEFAULT_BEAM = 256
"""Suffixes a top-k search extends per step, at least (``max(DEFAULT_BEAM, 16 k)``)."""


@raised_from_the_call
def relevant_walks(
    model: nn.Module,
    x: Tensor | dict[Any, Tensor],
    edge_index: Tensor | dict[Any, Tensor],
    *,
    index: Any,
    target: Any = None,
    composite: Composite | Rule | None = None,
    top_k: int | None = None,
    largest: bool = True,
    steps: Sequence[str] | None = None,
    beam: int | None = None,
    **forward_kwargs: Any,
) -> tuple[Tensor | HeteroWalks, Tensor]:
    r"""The relevant walks of ``model(x, edge_index, **forward_kwargs)`` for output row ``index``.

    ``index``: the explained row of the output: a node (node-level outputs ``[N, C]`` or
    ``[N]``), a graph (graph-level outputs ``[G, C]``) or a node pair (edge-level outputs, one
    row per pair of a keyword such as ``edge_label_index``: link prediction); ``target``: its
    class (None: the largest logit; a single score per row is explained as it is); the output
    relevance is that logit, zero elsewhere, as in :func:`fxlrp.attribute` (a float tensor of the
    output's shape is taken as the output relevance itself). ``composite``: as for
    :func:`fxlrp.convert` (``model`` may also be an already converted :class:`~fxlrp.Explainer`).

    Returns ``(walks, relevance)``: ``walks`` ``[W, L + 1]`` node ids from the input layer to the
    last node state (``walks[:, 0]`` the input node ``j_0``; ``walks[:, -1]`` the explained node
    for node-level outputs, one of the pair's two nodes for edge-level outputs), ``relevance``
    ``[W]`` the GNN-LRP relevance
    :math:`R(w) = 1^T P_{j_0} B_1 P_{j_1} \cdots B_L P_{j_L} B_{out} r` (see this module), sorted
    from largest to smallest (``largest=False``: smallest first). Where relevance reaches the
    output from an earlier node state ``H_t`` directly (jumping knowledge: the layers' outputs
    joined before the head), walks also end there: ``(j_0, ..., j_t, -1, ..., -1)``.

    Heterogeneous graphs: ``x`` and ``edge_index`` dicts by node and edge type
    (``data.x_dict``, ``data.edge_index_dict``; models made with ``to_hetero``, ``HeteroConv``,
    ``HGTConv``; the model returns the explained node type's output). ``walks`` is then a
    :class:`HeteroWalks`: ``walks.ids`` ``[W, L + 1]`` node ids within their type,
    ``walks.types`` ``[W, L + 1]`` their types as indices into ``walks.node_types`` (the types
    of ``x``); ``walks.steps(w)`` lists walk ``w`` as ``(node type, id)`` pairs and
    ``walks.by_types()`` groups the walks by node-type sequence. Step ``t`` is the ``t``-th
    round of message-passing layer calls (a layer call's step is one more than that of the
    calls its output is computed from); so it is for homogeneous models torch.fx cannot trace
    (run eagerly as a whole).

    ``top_k=None``: every walk with non-zero relevance (exact; their number grows exponentially
    with depth); for each input node they sum to its node relevance.
    ``top_k=k``: the ``k`` walks of largest (smallest) relevance found by a beam search that
    extends at most ``beam`` suffixes per step (default ``max(256, 16 k)``): at most
    ``L * beam`` step-backward passes, exact when no step has more suffixes than ``beam``, else an
    approximation (see the module docstring). ``steps`` (homogeneous graphs): names of the node
    states ``H_1, ..., H_L`` (rows of ``explain.report()``; ``"output"`` for the output itself),
    by default :func:`fxlrp.integrations.pyg.walk_steps`.

    Parameters
    ----------
    model
        The model, or the explainer :func:`fxlrp.convert` made of it.
    x, edge_index
        Node features ``[N, F]`` and edges ``[2, E]`` (integers) as tensors, or dicts of them by
        node and edge type.
    index
        The explained row: an int (negative ones count from the end, as in torch indexing) or a
        tensor holding one.
    target
        The explained class: None (the largest logit), an int (``-1``: the last class, as in
        torch indexing), or a float tensor of the output's shape (the output relevance itself).
    composite
        As for :func:`fxlrp.convert`, when ``model`` is not converted yet.
    top_k, largest, steps, beam
        As described above.
    **forward_kwargs
        Further inputs of the model.

    Returns
    -------
    tuple of (Tensor or HeteroWalks, Tensor)
        ``(walks, relevance)`` as described above.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        (a ``ValueError`` and a ``TypeError``) for a NumPy array or a list where the model takes a
        tensor, inputs the model itself rejects (its own message, raised from its own error, with
        what to do), an ``index`` that is not one row of the output, a ``target`` that is no class
        or out of range.
    ValueError
        For ``top_k`` or ``beam`` out of range, and steps that do not decompose the explanation.
    """
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be a positive number of walks or None, got {top_k}")
    width = None if top_k is None else (beam if beam is not None else max(DEFAULT_BEAM, 16 * top_k))
    if width is not None and width < top_k:
        raise ValueError(f"beam ({width}) must be at least top_k ({top_k})")
    graph = walk_graph(model, x, edge_index, index=index, target=target, composite=composite, steps=steps,
                       **forward_kwargs)
    walks, relevance = _search(graph, width, largest)
    order = torch.argsort(relevance, descending=largest, stable=True)
    if top_k is not None:
        order = order[:top_k]
    walks, relevance = walks[order], relevance[order]
    return (walks if graph.node_types is None else graph.typed(walks)), relevance


@raised_from_the_call
def subgraph_relevance(
    model: nn.Module,
    x: Tensor | dict[Any, Tensor],
    edge_index: Tensor | dict[Any, Tensor],
    nodes: Tensor | Sequence[int] | dict[Any, Tensor | Sequence[int]],
    *,
    index: Any,
    target: Any = None,
    composite: Composite | Rule | None = None,
    steps: Sequence[str] | None = None,
    **forward_kwargs: Any,
) -> Tensor:
    r"""sGNN-LRP: the relevance of the node set ``nodes``, the sum of the relevance of every walk
    whose nodes all lie in it, :math:`R(S) = 1^T P_S B_1 P_S \cdots B_L P_S B_{out} r` (plus, with
    jumping knowledge, the walks ending earlier).

    One forward and ``L`` step-backward passes (linear in depth; as many again for the check that
    the steps decompose the explanation). Arguments as for :func:`relevant_walks`; ``nodes`` is
    ``{node type: ids}`` on heterogeneous graphs. Returns a scalar tensor.

    Parameters
    ----------
    model, x, edge_index, index, target, composite, steps, **forward_kwargs
        As for :func:`relevant_walks`.
    nodes
        The node set: node ids, or ``{node type: ids}`` on heterogeneous graphs.

    Returns
    -------
    Tensor
        The relevance of the node set, a scalar.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        As :func:`relevant_walks` raises it.
    ValueError
        For nodes of unknown types, and steps that do not decompose the explanation.
    """
    graph = walk_graph(model, x, edge_index, index=index, target=target, composite=composite, steps=steps,
                       **forward_kwargs)
    inside = torch.zeros(graph.last.size(0), 1, dtype=graph.last.dtype, device=graph.last.device)
    inside[graph.node(nodes)] = 1.0
    relevance = graph.last * inside
    for t in range(graph.depth, 0, -1):
        relevance = (graph.step(t, relevance) + graph.exits[t - 1]) * inside
    return relevance.sum().detach()
