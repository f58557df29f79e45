"""The rule of a product of relevance-carrying factors (AttnLRP's uniform split, :class:`Product`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.roles import GATE
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance, stabilised_gradient
from fxlrp.rules.epsilon import Epsilon
from fxlrp.rules.rule import Relevance, Rule

DEFAULT_PRODUCT_EPSILON = 1e-6
"""The epsilon of :class:`Product` where none is given or followed."""


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
      take all relevance (see :func:`fxlrp.rules.attention.cp_lrp`);
    - ``constants=()``: the uniform split everywhere, gates included.

    If every relevance-carrying factor is a constant by role, they share uniformly. With a single
    relevance-carrying factor (a product with a parameter) it is the epsilon rule.

    Parameters
    ----------
    epsilon : float or None, default 1e-6
        The stabiliser's ``epsilon``; None follows the composite's layer rule
        (:meth:`following`).
    constants : sequence of str, default ("gate",)
        The roles whose factors are treated as constants.
    """

    def __init__(self, epsilon: float | None = 1e-6, constants: Sequence[str] = (GATE,)) -> None:
        super().__init__(DEFAULT_PRODUCT_EPSILON if epsilon is None else epsilon)
        self.epsilon = epsilon
        self.constants = tuple(constants)

    def following(self, layer_rule: Rule) -> Product:
        """This rule with the epsilon of ``layer_rule`` if it was made with ``epsilon=None``.

        Parameters
        ----------
        layer_rule : Rule
            The composite's rule for layers; its ``epsilon`` is followed if it is an
            :class:`Epsilon`, else :data:`DEFAULT_PRODUCT_EPSILON` is used.

        Returns
        -------
        Product
            This rule if it has an epsilon of its own, else a copy with the followed epsilon.
        """
        if self.epsilon is not None:
            return self
        epsilon = layer_rule.epsilon if isinstance(layer_rule, Epsilon) else DEFAULT_PRODUCT_EPSILON
        return type(self)(epsilon, self.constants)

    def has_gradient_form(self, prepared: Any = None) -> bool:
        return self.epsilon is not None and super().has_gradient_form(prepared)  # (None: not yet followed)

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        receivers = sum(carries_relevance(value) for value in inputs)
        return stabilised_gradient(layer.forward(inputs), self._stabiliser.epsilon, 1.0 / receivers)

    def gradient_is_native(self) -> bool:
        return False  # the gradient is divided among the factors

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, root, _ = state
        factors = [value for value in inputs if carries_relevance(value)]
        receivers = len(factors)
        quotient = self._quotient(layer, state, relevance, output)
        # 1 / N is taken where it costs least: on the quotient when the output is no larger than
        # the receiving factors (attention's ``weights @ values``: the output is value-sized, the
        # weights length x length), else on the shares.
        on_quotient = receivers > 1 and quotient.numel() <= sum(factor.numel() for factor in factors)
        if on_quotient:
            quotient = _divided(quotient, receivers)
        shares = terms.input_times_gradient(root, inputs, quotient)
        if receivers == 1 or on_quotient:
            return shares
        return tuple(None if share is None else _divided(share, receivers) for share in shares)


def _divided(tensor: Tensor, divisor: int) -> Tensor:
    """``tensor / divisor`` for a rule's own fresh tensor: in place (no allocation of its size),
    unless recorded (a double backward needs it unchanged)."""
    return tensor / divisor if tensor.requires_grad else tensor.div_(divisor)
