"""The CP-LRP choice for attention layers (GAT, GATv2, TransformerConv)."""

from __future__ import annotations

import copy

from fxlrp.rules import Rule
from fxlrp.rules import attention as attention_rules
from fxlrp.rules.composites import Composite, as_composite


def with_cp_lrp(composite: Composite | Rule | None = None) -> Composite:
    """``composite`` with attention coefficients treated as constants (CP-LRP, Ali et al. 2022).

    No relevance enters the attention logits; a message ``alpha_ij * x_j`` passes all of its
    relevance to ``x_j``. Without it, the softmax gets AttnLRP's rule and a product of two
    relevance-carrying factors splits relevance in halves. The same choice as
    ``operation_rules=fxlrp.rules.attention.cp_lrp()``, added to an existing composite.

    Parameters
    ----------
    composite : Composite, Rule or None, optional
        The composite (a rule: that rule on every weighted layer; None: the default).

    Returns
    -------
    Composite
        A copy of the composite with CP-LRP's operation rules added; ``composite`` is unchanged.
    """
    chosen = copy.copy(as_composite(composite))
    chosen.operation_rules = {**chosen.operation_rules, **attention_rules.cp_lrp()}
    return chosen
