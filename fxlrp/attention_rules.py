"""How transformers and gated CNNs choose their rules (:class:`~fxlrp.rules.Product`,
:class:`~fxlrp.rules.SoftmaxRule`, :class:`~fxlrp.rules.AttentionAsConstant`, which live with
the other rules): CP-LRP and the gating conventions as a composite's ``operation_rules``, and the
rule a product gets where the composite gave it a layer rule.

Canonical operations these rules apply to: ``"softmax"``, ``"mul"`` (elementwise products,
squeeze-excitation gates), ``"matmul"`` and ``"einsum"`` (attention scores and attention times
values) and whole attention blocks, ``"attention"`` (``F.scaled_dot_product_attention``),
``"multihead_attention"`` (``nn.MultiheadAttention``) and ``"window_attention"`` (Swin's
``shifted_window_attention``), whose inner projections, products and softmax are given rules as
nodes of the enclosing module would be.
"""

from __future__ import annotations

import warnings

from fxlrp.relevance.roles import ATTENTION, GATE
from fxlrp.rules import AttentionAsConstant, Epsilon, Product, Rule, SoftmaxRule

GRAPH_SOFTMAX = "graph_softmax"
"""The canonical operation of a softmax over groups of edges (graph attention)."""

PRODUCT_OPERATIONS = ("mul", "matmul", "einsum", "attention", "multihead_attention", "window_attention")
"""Canonical operations whose relevance-carrying factors are shared by a :class:`Product` rule."""


def product_rule(rule: Rule | None) -> Product:
    """The product rule to use where the composite assigned ``rule`` to a product.

    A :class:`Product` is used as it is; an :class:`~fxlrp.rules.Epsilon` (e.g. the layer rule
    that reaches ``matmul`` and ``einsum``) becomes the uniform epsilon rule with its epsilon;
    other rules (z+, alpha-beta, ...) have no meaning on a product of two variables, which then
    gets the default :class:`Product`.
    """
    if isinstance(rule, Product):
        return rule
    if isinstance(rule, Epsilon):
        return Product(rule.epsilon)
    if rule is not None:
        warnings.warn(
            f"fxlrp: {rule!r} was chosen for a product of two relevance-carrying tensors (an attention or "
            "gating product), where it has no meaning; the uniform product rule Product() is used there "
            "instead. Give such products a rule of their own with operation_rules={'matmul': Product(...), "
            "'mul': ..., 'einsum': ...} to silence this.",
            stacklevel=2,
        )
    return Product()


def cp_lrp(epsilon: float | None = None) -> dict[str, Rule]:
    """``operation_rules`` for CP-LRP: attention weights are constants, values take the relevance.

    ``epsilon`` of the products' epsilon rule; None (the default) takes the epsilon of the
    composite's layer rule (``Composite(Epsilon(0.0), operation_rules=cp_lrp())`` is CP-LRP with
    LRP-0 on the products too, as LXT's CP-LRP is), or 1e-6 if that rule is not an epsilon rule.
    Covers transformer attention (softmax weights times values) and graph attention (the softmax
    over each node's edges in GAT, GATv2, TransformerConv). ``Composite(layer_rule,
    operation_rules=cp_lrp())``; combine with other operation rules by ``{**cp_lrp(), "add": ...}``.
    """
    rules: dict[str, Rule] = {
        operation: Product(epsilon, constants=(GATE, ATTENTION)) for operation in PRODUCT_OPERATIONS
    }
    rules[GRAPH_SOFTMAX] = AttentionAsConstant()
    return rules


def uniform_gates(epsilon: float = 1e-6) -> dict[str, Product]:
    """``operation_rules`` that split the relevance of ``x * gate`` equally between signal and gate."""
    return {"mul": Product(epsilon, constants=())}


__all__ = ["PRODUCT_OPERATIONS", "GRAPH_SOFTMAX", "Product", "SoftmaxRule", "AttentionAsConstant", "product_rule",
           "cp_lrp", "uniform_gates"]
