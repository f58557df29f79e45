"""Which input edge each message of a message-passing layer was sent along.

A layer sends messages along its own ``edge_index'`` (the input edges, possibly reordered, with
self-loops added or removed). A message belongs to the input edge with the same (source,
target) pair; several input edges with one pair share that pair's messages equally; messages
along pairs that are no input edge (self-loops the layer added) belong to their node. The
matching depends on the graph only, so it is computed once per recorded layer call and applied
to as many relevances as are propagated through that call.
"""

from __future__ import annotations

import torch
from torch import Tensor


class EdgeMap:
    """Sums per-message relevance into per-input-edge and per-node (added self-loop) relevance.

    Parameters
    ----------
    sent : Tensor
        ``[2, E']``: the edges the messages went along.
    edge_index : Tensor
        ``[2, E]``: the input edges.
    num_nodes : int
        The number of nodes.
    source_to_target : bool
        The layer's flow (a self-loop message belongs to its receiving node).
    """

    def __init__(self, sent: Tensor, edge_index: Tensor, num_nodes: int, source_to_target: bool) -> None:
        self.num_edges = edge_index.size(1)
        self.num_nodes = num_nodes
        input_keys = edge_index[0] * num_nodes + edge_index[1]
        message_keys = sent[0] * num_nodes + sent[1]
        keys, inverse, counts = torch.unique(input_keys, return_inverse=True, return_counts=True)
        self.num_keys = keys.numel()
        if self.num_keys == 0:
            found = torch.zeros_like(message_keys, dtype=torch.bool)
        else:
            position = torch.searchsorted(keys, message_keys).clamp(max=self.num_keys - 1)
            found = keys[position] == message_keys
            self.slots = position[found]
        # Row indices instead of boolean masks: applied per relevance, they need no nonzero().
        self.along_input = found.nonzero().view(-1)
        along_loop = (~found).nonzero().view(-1)
        self.along_loop = along_loop
        self.inverse = inverse
        # Edges with a repeated pair share its messages; without repeats no division (by 1).
        self.shares = counts[inverse] if bool((counts > 1).any()) else None
        receivers = sent[1] if source_to_target else sent[0]
        self.loop_nodes = receivers[along_loop]

    def __call__(self, per_message: Tensor) -> tuple[Tensor, Tensor]:
        """Sum per-message relevance into per-edge and per-node relevance.

        Parameters
        ----------
        per_message : Tensor
            ``[E']`` relevance per message.

        Returns
        -------
        per_edge : Tensor
            ``[E]`` relevance per input edge.
        loops : Tensor
            ``[N]`` relevance per added self-loop, at its node.
        """
        if self.num_keys == 0:
            per_edge = per_message.new_zeros(self.num_edges)
        else:
            per_key = per_message.new_zeros(self.num_keys).index_add_(
                0, self.slots, per_message.index_select(0, self.along_input))
            per_edge = per_key.index_select(0, self.inverse)
            if self.shares is not None:
                per_edge = per_edge / self.shares
        loops = per_message.new_zeros(self.num_nodes).index_add_(
            0, self.loop_nodes, per_message.index_select(0, self.along_loop))
        return per_edge, loops
