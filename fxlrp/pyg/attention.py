"""The CP-LRP choice for attention layers (GAT, GATv2, TransformerConv)."""

from __future__ import annotations

import copy

from fxlrp.composites import Composite, as_composite
from fxlrp.operations.graph import GRAPH_SOFTMAX, AttentionAsConstant
from fxlrp.rules import Rule


def cp_lrp(composite: Composite | Rule | None = None) -> Composite:
    """``composite`` with attention coefficients treated as constants (CP-LRP, Ali et al. 2022).

    No relevance enters the attention logits; a message ``alpha_ij * x_j`` passes all of its
    relevance to ``x_j``. Without it, the softmax gets AttnLRP's rule and a product of two
    relevance-carrying factors splits relevance in halves.
    """
    chosen = copy.copy(as_composite(composite))
    chosen.operation_rules = {**chosen.operation_rules, GRAPH_SOFTMAX: AttentionAsConstant()}
    return chosen
