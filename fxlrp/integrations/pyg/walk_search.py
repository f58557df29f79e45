"""The search of relevant walks (:mod:`fxlrp.integrations.pyg.walks`) on a
:class:`~fxlrp.integrations.pyg.walk_graph.WalkGraph`: suffixes extended from the output backward,
one step-backward pass per group of suffixes at nodes with disjoint neighbourhoods; every suffix
(exact enumeration) or a beam of the most relevant ones (top-k)."""

from __future__ import annotations

import torch
from torch import Tensor

from fxlrp.integrations.pyg.walk_graph import WalkGraph
from fxlrp.integrations.pyg.walk_steps import Neighbourhoods


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


def search_walks(graph: WalkGraph, beam: int | None, largest: bool) -> tuple[Tensor, Tensor]:
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
