"""How transformers and gated CNNs choose their rules (:class:`~fxlrp.rules.Product`,
:class:`~fxlrp.rules.SoftmaxRule`, :class:`~fxlrp.rules.AttentionAsConstant`, which live with
the other rules): CP-LRP and the gating conventions as a composite's ``operation_rules``. Where
the composite gives a product of several relevance-carrying tensors a layer rule, it resolves it
to a product rule itself (:meth:`fxlrp.rules.composites.Composite.resolve`).

Canonical operations these rules apply to: ``"softmax"``, ``"mul"`` (elementwise products,
squeeze-excitation gates), ``"matmul"`` and ``"einsum"`` (attention scores and attention times
values) and whole attention blocks, ``"attention"`` (``F.scaled_dot_product_attention``),
``"multihead_attention"`` (``nn.MultiheadAttention``) and ``"window_attention"`` (Swin's
``shifted_window_attention``), whose inner projections, products and softmax are given rules as
nodes of the enclosing module would be.
"""

from __future__ import annotations

from fxlrp.relevance.roles import ATTENTION, GATE
from fxlrp.rules import AttentionAsConstant, Product, Rule, SoftmaxRule

GRAPH_SOFTMAX = "graph_softmax"
"""The canonical operation of a softmax over groups of edges (graph attention)."""

PRODUCT_OPERATIONS = ("mul", "matmul", "einsum", "attention", "multihead_attention", "window_attention")
"""Canonical operations whose relevance-carrying factors are shared by a :class:`Product` rule."""


def cp_lrp(epsilon: float | None = None) -> dict[str, Rule]:
    """``operation_rules`` for CP-LRP: attention weights are constants, values take the relevance.

    Covers transformer attention (softmax weights times values) and graph attention (the softmax
    over each node's edges in GAT, GATv2, TransformerConv). ``Composite(layer_rule,
    operation_rules=cp_lrp())``; combine with other operation rules by ``{**cp_lrp(), "add": ...}``.

    Parameters
    ----------
    epsilon : float or None, optional
        The epsilon of the products' epsilon rule. None (the default) takes the epsilon of the
        composite's layer rule (``Composite(Epsilon(0.0), operation_rules=cp_lrp())`` is CP-LRP
        with LRP-0 on the products too, as LXT's CP-LRP is), or 1e-6 if that rule is not an
        epsilon rule.

    Returns
    -------
    dict of str to Rule
        A rule per canonical operation: :class:`Product` with attention and gates as constants
        for :data:`PRODUCT_OPERATIONS`, :class:`AttentionAsConstant` for :data:`GRAPH_SOFTMAX`.
    """
    rules: dict[str, Rule] = {
        operation: Product(epsilon, constants=(GATE, ATTENTION)) for operation in PRODUCT_OPERATIONS
    }
    rules[GRAPH_SOFTMAX] = AttentionAsConstant()
    return rules


def uniform_gates(epsilon: float = 1e-6) -> dict[str, Product]:
    """``operation_rules`` that split the relevance of ``x * gate`` equally between signal and gate.

    Parameters
    ----------
    epsilon : float, default 1e-6
        The epsilon of the product rule.

    Returns
    -------
    dict of str to Product
        ``{"mul": Product(epsilon, constants=())}``.
    """
    return {"mul": Product(epsilon, constants=())}


__all__ = ["PRODUCT_OPERATIONS", "GRAPH_SOFTMAX", "Product", "SoftmaxRule", "AttentionAsConstant", "cp_lrp",
           "uniform_gates"]
