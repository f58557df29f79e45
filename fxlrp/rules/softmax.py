"""Softmax: AttnLRP's rule (:class:`SoftmaxRule`) and CP-LRP's constant attention
(:class:`AttentionAsConstant`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance
from fxlrp.rules.epsilon import Epsilon
from fxlrp.rules.rule import Relevance, Rule


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

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        logits = inputs[0]
        if layer.softmax_dim is None or not carries_relevance(logits):
            return super().forward(layer, inputs, prepared)
        with torch.no_grad():  # the closed form below reads the logits and the kept output only
            output = layer.forward(inputs)
        return output, (inputs, None, None)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, root, _ = state
        if root is not None:  # the softmax's dimension is not known: x * J^T (R / s) through autograd
            shares = super().backward(layer, state, relevance, output)
            return tuple(share if share is None else _zero_where_infinite(share, value)
                         for share, value in zip(shares, inputs, strict=True))
        # The formula as it stands, over the dimension the softmax names: the quotient R / s and
        # the softmax's backward (which multiplies by s again) are not computed - two passes and a
        # buffer fewer over attention's scores.
        share = self.closed_form(relevance, output.take().detach(), inputs[0].detach(), layer.softmax_dim)
        return (share, *[None] * (len(inputs) - 1))

    @staticmethod
    def closed_form(relevance: Tensor, weights: Tensor, logits: Tensor, dim: int, owned: bool = False,
                    masked: bool = True) -> Tensor:
        """The rule's closed form, ``x * (R - s * sum R)`` over ``dim``.

        Parameters
        ----------
        relevance : Tensor
            The relevance ``R`` of the softmax's output.
        weights : Tensor
            The softmax's output ``s``.
        logits : Tensor
            The softmax's input ``x``.
        dim : int
            The dimension the softmax normalises over.
        owned : bool, default False
            Whether ``relevance`` is the caller's own fresh tensor, which the result may
            overwrite.
        masked : bool, default True
            Whether logits may be ``-inf`` (a mask was added to them); False where none can be
            (attention without a mask, whose finite logits give finite weights), which skips
            looking for them.

        Returns
        -------
        Tensor
            The relevance of the logits; 0 where a logit is ``-inf``.
        """
        total = relevance.sum(dim, keepdim=True)
        if owned and not relevance.requires_grad:
            share = relevance.addcmul_(weights, total, value=-1.0)
        else:
            share = torch.addcmul(relevance, weights, total, value=-1.0)
        share = share * logits if share.requires_grad else share.mul_(logits)
        return _zero_where_infinite(share, logits) if masked else share

    def __repr__(self) -> str:
        return "SoftmaxRule()"


def _zero_where_infinite(share: Tensor, value: Tensor) -> Tensor:
    """``share`` with 0 where ``value`` is infinite (masked logits of ``-inf``: ``0 * -inf`` is NaN).
    A logit of NaN or ``+inf`` makes the softmax's output NaN, which the explanation's checks refuse."""
    infinite = torch.isinf(value)
    return share.masked_fill_(infinite, 0.0) if not share.requires_grad else share.masked_fill(infinite, 0.0)


class AttentionAsConstant(Rule):
    """CP-LRP for attention: the softmax's output is a constant.

    ``R(logits) = 0``, and products with the coefficients pass their relevance to the other
    factor unchanged.
    """

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        return layer.forward(inputs).detach(), None

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        raise RuntimeError("fxlrp: attention treated as a constant receives no relevance")

    def has_gradient_form(self, prepared: Any = None) -> bool:
        return True

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        return layer.forward(inputs).detach()

    def __repr__(self) -> str:
        return "AttentionAsConstant()"
