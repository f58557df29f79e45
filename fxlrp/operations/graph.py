"""Graph operations: softmax over groups of edges (attention coefficients).

A graph-attention layer normalises one logit per edge over the edges that arrive at the same
node: ``s_e = exp(a_e) / sum_{e' -> i} exp(a_e')``. Two ways to explain it:

- default, the Taylor rule of AttnLRP (Achtibat et al. 2024) for softmax:
  ``R(a_e) = a_e * (R_e - s_e * sum_{e' -> i} R_e')``, which is the epsilon rule's formula
  ``a * J^T (R / s)`` applied to the softmax, so it runs as an affine rule on the operation
  (``Epsilon(0.0)`` by default; a composite may give another epsilon);
- CP-LRP (Ali et al. 2022, "XAI for Transformers: better explanations through conservative
  propagation"): the attention coefficients are constants. The softmax output carries no relevance,
  so a product ``alpha * x_j`` passes all of its relevance to the values ``x_j`` and no relevance
  enters the logits. Select it with the rule :class:`AttentionAsConstant` for the operation
  ``"graph_softmax"`` (``fxlrp.integrations.pyg.with_cp_lrp(composite)`` does that).

Library spellings: torch_scatter's ``scatter_softmax`` here; integrations add theirs (PyG's
``torch_geometric.utils.softmax``) with ``REGISTRY.extend("graph_softmax", ...)``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fxlrp.operations.helpers import bind
from fxlrp.operations.scatter_library import scatter_functions
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules import AttentionAsConstant
from fxlrp.rules.attention import GRAPH_SOFTMAX


def group_softmax(call: RelevanceCall, function: Any, src: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """Softmax of ``src`` over groups: the AttnLRP rule by default, constants under CP-LRP."""
    if isinstance(call.rule, AttentionAsConstant):
        return bind(function, kwargs)(src, *args).detach()
    return call.affine(call.layer(bind(function, kwargs)), src, *args)


register(
    Operation(
        GRAPH_SOFTMAX,
        Spelling(functions=scatter_functions(("scatter_softmax",))),
        Affine(group_softmax, default_rule=proportional),
        ValueFlow(index_arguments=(1,)),
        description="softmax over groups of edges (attention): AttnLRP's rule R(a) = a (R - s sum R); "
        "AttentionAsConstant gives CP-LRP",
    )
)
