"""Rules for what transformers and gated CNNs add to affine layers: softmax and products of
two relevance-carrying tensors (AttnLRP, Achtibat et al., ICML 2024), with CP-LRP and the
gating conventions selectable through a composite's ``operation_rules``.

Canonical operations these rules apply to: ``"softmax"``, ``"mul"`` (elementwise products,
squeeze-excitation gates), ``"matmul"`` and ``"einsum"`` (attention scores and attention times
values) and whole attention blocks, ``"attention"`` (``F.scaled_dot_product_attention``),
``"multihead_attention"`` (``nn.MultiheadAttention``) and ``"window_attention"`` (Swin's
``shifted_window_attention``), whose inner projections, products and softmax are given rules as
nodes of the enclosing module would be.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.roles import ATTENTION, GATE
from fxlrp.rules import Epsilon, Rule

DEFAULT_PRODUCT_EPSILON = 1e-6

PRODUCT_OPERATIONS = ("mul", "matmul", "einsum", "attention", "multihead_attention", "window_attention")
"""Canonical operations whose relevance-carrying factors are shared by a :class:`Product` rule."""


class Product(Epsilon):
    r"""Uniform epsilon rule for a product of ``N`` relevance-carrying factors (AttnLRP).

    The product is linear in each factor when the others are held fixed; each receiving factor
    gets the epsilon rule's share of that linear map, divided by the number ``N`` of receivers:

    .. math::
        R_{a_i} = \frac{1}{N} \sum_k \frac{a_i \, \partial z_k / \partial a_i}{z_k + \epsilon \cdot
        (\operatorname{sign}(z_k) + [z_k = 0])} R_k

    For ``z = a @ b`` that is ``R_a = a * ((R / z) @ b^T) / 2``. An elementwise product ``a * b``
    has one term per output, so its shares are exactly ``R / N`` (no stabiliser is needed).
    Factors whose role is listed in ``constants`` (see :mod:`fxlrp.relevance.roles`) are treated
    as constants and get no relevance:

    - ``constants=("gate",)`` (the default): in ``x * sigmoid(s)`` the signal ``x`` gets all
      relevance, the gate none (squeeze-excitation); attention products split uniformly (AttnLRP);
    - ``constants=("gate", "attention")``: CP-LRP, attention weights are constants and the values
      take all relevance (see :func:`cp_lrp`);
    - ``constants=()``: the uniform split everywhere, gates included.

    If every relevance-carrying factor is a constant by role, they share uniformly. With a single
    relevance-carrying factor (a product with a parameter) it is the epsilon rule.
    """

    def __init__(self, epsilon: float | None = 1e-6, constants: Sequence[str] = (GATE,)) -> None:
        # None: the epsilon of the composite's layer rule, filled in by the composite
        # (:meth:`following`); until then the default.
        super().__init__(DEFAULT_PRODUCT_EPSILON if epsilon is None else epsilon)
        self.epsilon = epsilon
        self.constants = tuple(constants)

    def following(self, layer_rule: Rule) -> Product:
        """This rule with the epsilon of ``layer_rule`` if it was made with ``epsilon=None``."""
        if self.epsilon is not None:
            return self
        epsilon = layer_rule.epsilon if isinstance(layer_rule, Epsilon) else DEFAULT_PRODUCT_EPSILON
        return type(self)(epsilon, self.constants)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        shares = super().backward(layer, state, relevance)
        receivers = sum(share is not None for share in shares)
        return tuple(None if share is None else share / receivers for share in shares)


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
    # Imported here: the graph operations import this module's rules when they register.
    from fxlrp.operations.graph import GRAPH_SOFTMAX, AttentionAsConstant

    rules: dict[str, Rule] = {
        operation: Product(epsilon, constants=(GATE, ATTENTION)) for operation in PRODUCT_OPERATIONS
    }
    rules[GRAPH_SOFTMAX] = AttentionAsConstant()
    return rules


def uniform_gates(epsilon: float = 1e-6) -> dict[str, Product]:
    """``operation_rules`` that split the relevance of ``x * gate`` equally between signal and gate."""
    return {"mul": Product(epsilon, constants=())}


class SoftmaxRule(Epsilon):
    r"""AttnLRP's softmax rule: the softmax linearised at its input.

    .. math::
        R_{x_i} = x_i \left(R_i - s_i \sum_j R_j\right), \qquad s = \operatorname{softmax}(x)

    which is ``x * J_s^T (R / s)``: the epsilon rule (with ``epsilon = 0``) applied to the softmax
    as if it were linear. It does not conserve relevance (the softmax has no zero point).
    Inputs of ``-inf`` (masked positions) get no relevance.
    """

    def __init__(self) -> None:
        super().__init__(0.0)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs = state[0]
        shares = super().backward(layer, state, relevance)
        return tuple(
            share if share is None else torch.where(torch.isfinite(value), share, torch.zeros_like(share))
            for share, value in zip(shares, inputs, strict=True)
        )

    def __repr__(self) -> str:
        return "SoftmaxRule()"
