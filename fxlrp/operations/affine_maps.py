"""``torch.addcmul``: ``input + value * tensor1 * tensor2``, a per-element affine layer.

ResMLP's ``Affine`` (``torch.addcmul(beta, alpha, x)``) and ConvNeXt V2's response normalisation
(``torch.addcmul(bias, weight, x * n)``) scale a relevance-carrying tensor ``x`` elementwise by a
parameter ``w`` and shift it by a parameter ``b``: a layer with weights, ``z = b + value * w * x``,
which gets the composite's layer rule (the epsilon rule by default), as BatchNorm's per-channel
affine map does:

.. math:: R_{x_i} = \\frac{\\text{value} \\, w_i x_i}{s(z_i)} R_i

(``s`` the rule's stabilised denominator; the bias absorbs its share). Where ``input`` carries
relevance too, it is a second input of the same affine map (``z = input + value * w * x``).
Where both multiplicands carry relevance, it is a product: the rule of ``products.py`` for
several relevance-carrying factors (:class:`~fxlrp.rules.Product`, which the composite gives such
a call: the epsilon rule's share of each factor divided by their number, ``input`` a constant in
``z``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.call import RelevanceCall
from fxlrp.errors import UnsupportedOperationError
from fxlrp.operations.helpers import affine
from fxlrp.operations.products import multilinear
from fxlrp.registry import Kind, Operation, register
from fxlrp.relevance.rule_function import carries_relevance


def multiply_add(
    call: RelevanceCall, function: Callable[..., Tensor], input: Any, tensor1: Any, tensor2: Any, **kwargs: Any
) -> Tensor:
    """``input + value * tensor1 * tensor2`` by the node's rule: a layer whose weight is the
    multiplicand that carries no relevance and whose bias is ``input`` (when it carries none)."""
    input_carries, first_carries, second_carries = (carries_relevance(value) for value in (input, tensor1, tensor2))
    if first_carries and second_carries:
        if input_carries:
            raise UnsupportedOperationError(
                "fxlrp has no LRP rule for torch.addcmul(input, tensor1, tensor2) where all three tensors "
                "depend on the explained input; write it as input + tensor1 * tensor2 (a sum and a product)"
            )
        return multilinear(call, function, input, tensor1, tensor2, **kwargs)
    if not (first_carries or second_carries):
        # input + a constant: a sum whose constant term acts as a bias (or no relevance at all)
        return affine(call, function, input, tensor1, tensor2, **kwargs)

    def product(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        return (x, weight) if first_carries else (weight, x)

    signal, weight = (tensor1, tensor2) if first_carries else (tensor2, tensor1)
    if input_carries:
        def with_summand(summand: Tensor, x: Tensor, w: Tensor, b: None) -> Tensor:
            return function(summand, *product(x, w), **kwargs)

        return call.affine(call.layer(with_summand, weight, None, has_parameters=True), input, signal)

    def with_bias(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return function(b, *product(x, w), **kwargs)

    return call.affine(call.layer(with_bias, weight, input, has_parameters=True), signal)


def multiplicands(args: Sequence[Any]) -> Sequence[Any]:
    """The factors of ``torch.addcmul(input, tensor1, tensor2)``: ``tensor1`` and ``tensor2``."""
    return args[1:3]


register(
    Operation(
        "addcmul",
        Kind.AFFINE,
        functions=(torch.addcmul,),
        methods=("addcmul",),
        relevance=multiply_add,
        weighted=True,
        factors=multiplicands,
        description="input + value * w * x (ResMLP's Affine, ConvNeXt V2's GRN): a per-element layer with "
        "weight w and bias input; a product when both factors carry relevance",
    )
)
