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
:mod:`~fxlrp.integrations.pyg.walk_steps`, the layers run in :mod:`~fxlrp.integrations.pyg.walk_layers`,
the node states kept in :mod:`~fxlrp.integrations.pyg.walk_graph` and the walks searched in
:mod:`~fxlrp.integrations.pyg.walk_search`; here are the public functions and the derivation.

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

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.explain.model_rejection import raised_from_the_call
from fxlrp.integrations.pyg.walk_graph import HeteroWalks, walk_graph
from fxlrp.integrations.pyg.walk_search import search_walks
from fxlrp.rules import Rule
from fxlrp.rules.composites import Composite

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
    walks, relevance = search_walks(graph, width, largest)
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
