"""Rules whose shares do not depend on the input: :class:`Flat`, :class:`WSquare`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance
from fxlrp.relevance.terms import Parameters
from fxlrp.rules.rule import Relevance, StabilisedRule


class InputIndependent(StabilisedRule):
    r"""Rules that ignore the input's values.

    ``R_j = \sum_k \frac{m_{jk}}{s(\sum_j m_{jk})} R_k`` for modified weights ``m`` (and modified
    bias in the denominator), computed with an input of ones in backward, where it is used.
    ``prepare`` gives the modified ``(weight, bias)``.
    """

    shares_by_input_values = False

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        return terms.original_output(layer, inputs), (inputs, prepared, terms.has_layer_gradient(layer, inputs))

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool:
        # With the layer's product in closed form the ones' term is computed without autograd.
        return not terms.has_layer_gradient(layer, inputs)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, parameters, closed = state
        if closed:
            with torch.no_grad():
                on_ones = layer(terms.map_carrying(inputs, torch.ones_like), *parameters)
            share = self.scaled(relevance, on_ones, layer)
            # x_j = 1: the relevance is the gradient itself.
            root = terms.LayerGradient(layer, parameters[0])
            return tuple(root.of(share, value) if carries_relevance(value) else None for value in inputs)
        ones = terms.map_carrying(inputs, lambda value: torch.ones_like(value).requires_grad_())
        with torch.enable_grad():
            on_ones = layer(ones, *parameters)
        return terms.input_times_gradient(on_ones, ones, self.scaled(relevance, on_ones.detach(), layer))


class Flat(InputIndependent):
    r"""The flat rule: relevance spread uniformly over each output's receptive field.

    .. math:: R_j = \sum_k \frac{1}{s\left(\sum_{j'} 1\right)} R_k

    where the sum runs over the inputs connected to output ``k`` (``f(1; 1, 0)``: all weights
    one, bias left out).

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"`` or ``"bias"``; the bias is left out in any case.
    """

    def prepare(self, layer: AffineLayer) -> Parameters:
        return terms.modified_parameters(layer, torch.ones_like, self._zero | {"bias"})


class WSquare(InputIndependent):
    r"""The w^2 rule: relevance shared by squared weights, independent of the input.

    .. math:: R_j = \sum_k \frac{w_{jk}^2}{s\left(\sum_{j'} w_{j'k}^2 + b_k^2\right)} R_k

    As in zennit, the bias enters the denominator squared.

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 before squaring.
    """

    def prepare(self, layer: AffineLayer) -> Parameters:
        return terms.modified_parameters(layer, torch.square, self._zero)
