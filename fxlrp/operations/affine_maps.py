"""A term plus a product: ``torch.addcmul``, ``torch.addmm``, ``torch.baddbmm``, ``torch.addbmm``.

Each computes ``beta * input + alpha * (tensor1 . tensor2)``, the product elementwise (addcmul,
whose scale is called ``value``), a matrix product (addmm), a batch of them (baddbmm: ALiBi's
attention scores in BLOOM, ``alibi.baddbmm(batch1=q, batch2=k)``) or their sum (addbmm). Where
one factor carries relevance it is a layer whose weight is the other factor and whose bias is
the term: GPT-2's ``Conv1D`` (``torch.addmm(b, x, W)``), ResMLP's ``Affine``
(``torch.addcmul(beta, alpha, x)``), ConvNeXt V2's response normalisation. It gets the
composite's layer rule (the epsilon rule by default), as ``F.linear`` does:

.. math:: R_{x_i} = \\sum_k \\frac{x_i \\, \\partial z_k / \\partial x_i}{s(z_k)} R_k

(``s`` the rule's stabilised denominator; the term absorbs its share). Where the term carries
relevance too, it is a second input of the same affine map. Where both factors carry relevance,
it is a product: the rule of ``products.py`` for several relevance-carrying factors
(:class:`~fxlrp.rules.Product`, which the composite gives such a call: the epsilon rule's share
of each factor divided by their number, the term a constant in ``z``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import UnsupportedOperationError
from fxlrp.operations.helpers import NATIVE_UNDER_NATIVE_RULE, affine
from fxlrp.operations.products import multilinear
from fxlrp.registry import Affine, Operation, Spelling, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance


class AddedProduct:
    """The relevance function and the factors of ``input + product(first, second)``, whose
    arguments a model may pass by position or by name (``first`` and ``second``: the factors'
    parameter names, ``batch1`` and ``batch2`` for baddbmm)."""

    def __init__(self, name: str, first: str, second: str) -> None:
        self.name, self.names = name, ("input", first, second)

    def operands(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``[input, first, second]`` and the other keyword arguments (the scales)."""
        rest = dict(kwargs)
        operands = [args[index] if index < len(args) else rest.pop(name, None) for index, name in enumerate(self.names)]
        return operands, rest

    def factors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Sequence[Any]:
        """The two factors (the Product rule is given where both carry relevance)."""
        return self.operands(args, kwargs)[0][1:]

    def __call__(self, call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
        (input, first, second), scales = self.operands(args, kwargs)
        input_carries, first_carries, second_carries = (carries_relevance(value) for value in (input, first, second))
        if first_carries and second_carries:
            if input_carries:
                raise UnsupportedOperationError(
                    f"fxlrp has no LRP rule for torch.{self.name} where the added input and both factors depend "
                    f"on the explained input; write it as a sum and a product (input + {self.names[1]} times "
                    f"{self.names[2]}), whose rules fxlrp has"
                )
            return multilinear(call, function, input, first, second, **scales)
        if not (first_carries or second_carries):
            # input + a constant: a sum whose constant term acts as a bias (or no relevance at all)
            return affine(call, function, input, first, second, **scales)

        def product(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
            return (x, weight) if first_carries else (weight, x)

        signal, weight = (first, second) if first_carries else (second, first)
        if input_carries:
            def with_summand(summand: Tensor, x: Tensor, w: Tensor, b: None) -> Tensor:
                return function(summand, *product(x, w), **scales)

            return call.affine(call.layer(with_summand, weight, None, has_parameters=True), input, signal)

        def with_bias(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
            return function(b, *product(x, w), **scales)

        return call.affine(call.layer(with_bias, weight, input, has_parameters=True), signal)


def _register(name: str, first: str, second: str, description: str) -> None:
    added_product = AddedProduct(name, first, second)
    register(
        Operation(
            name,
            Spelling(functions=(getattr(torch, name),), methods=(name,)),
            Affine(
                added_product,
                factors=added_product.factors,
                weighted=True,
                # at most one relevance-carrying factor: an affine map of the carriers (LRP-0: its gradient)
                gradient_native=NATIVE_UNDER_NATIVE_RULE,
            ),
            description=description,
        )
    )


_register("addcmul", "tensor1", "tensor2", "input + value * w * x (ResMLP's Affine, ConvNeXt V2's GRN): a per-element "
          "layer with weight w and bias input; a product when both factors carry relevance")
_register("addmm", "mat1", "mat2", "beta * input + alpha * x @ W (GPT-2's Conv1D): a linear layer; a product when both "
          "factors carry relevance")
_register("baddbmm", "batch1", "batch2", "beta * input + alpha * a @ b, batched (BLOOM's ALiBi attention scores): a "
          "layer in the factor that carries relevance, the Product rule when both do")
_register("addbmm", "batch1", "batch2", "beta * input + alpha * the sum of the batch's a @ b: a layer in the factor "
          "that carries relevance, the Product rule when both do")
