"""The epsilon rule and its normalising variant (:class:`Epsilon`, :class:`Norm`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, gradient_root, output_recomputation, stabilised_gradient
from fxlrp.relevance.terms import Parameters, ZeroParams
from fxlrp.rules.rule import Relevance, StabilisedRule, Stabiliser


class Epsilon(StabilisedRule):
    r"""The epsilon rule (LRP-epsilon; LRP-0 for ``epsilon=0``).

    .. math::
        R_j = \sum_k \frac{x_j w_{jk}}{s(z_k)} R_k,
        \qquad z_k = \sum_j x_j w_{jk} + b_k,
        \qquad s(z) = z + \epsilon \cdot (\operatorname{sign}(z) + [z = 0])

    The bias takes part in ``z_k`` and absorbs its share of the relevance, as in zennit.
    Relevance of an output with a zero denominator (only possible for ``epsilon=0``) is dropped.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The number ``epsilon`` of the stabiliser ``s``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in the layer's modified copy.
    """

    stabiliser_name = "epsilon"

    def __init__(self, epsilon: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        super().__init__(epsilon, zero_params)

    def prepare(self, layer: AffineLayer) -> Parameters | None:
        if not self._zero or not layer.has_parameters:
            return None
        return terms.modified_parameters(layer, terms.identity, self._zero)

    def keeps_output(self, prepared: Any) -> bool:
        return prepared is None  # with zero_params the denominator is the modified term

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        # state: inputs, root, and the denominator where it is not the kept output (with zero_params
        # the modified term; in closed form computed in backward, where it is used)
        if prepared is None:
            output, root = terms.output_and_root(layer, inputs)
            return output, (inputs, root, None)
        if terms.has_layer_gradient(layer, inputs):
            return terms.original_output(layer, inputs), (
                inputs, terms.LayerGradient(layer, prepared[0]), lambda: layer(inputs, *prepared))
        modified = layer(inputs, *prepared)
        return terms.original_output(layer, inputs), (inputs, gradient_root(modified), modified)

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool:
        # The layer's product in closed form (terms.output_and_root, terms.LayerGradient) reads the
        # input's values only.
        return not terms.has_layer_gradient(layer, inputs)

    def has_gradient_form(self, prepared: Any = None) -> bool:
        # R_x = x * J^T (R / s(z)), i.e. g_x = J^T (g_z z / s(z)) for a number epsilon >= 0
        # (StabilisedGradient; epsilon = 0: g_x = J^T g_z); zero_params change J and z
        epsilon = self._stabiliser.epsilon
        return epsilon is not None and epsilon >= 0.0 and not self._zero

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        return stabilised_gradient(layer.forward(inputs), self._stabiliser.epsilon,
                                   recompute=output_recomputation(layer, inputs))

    def gradient_is_native(self) -> bool:
        return self._stabiliser.epsilon == 0.0 and not self._zero  # LRP-0: g_x = J^T g_z

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, root, _ = state
        return terms.input_times_gradient(root, inputs, self._quotient(layer, state, relevance, output))

    def _quotient(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Tensor:
        """``R / s(z)``, a fresh tensor of the output's size."""
        _, _, modified = state
        if output is not None:  # the sign of the kept output is known once a ReLU rectified it
            sign = output.sign
            denominator = output.take()
        elif callable(modified):
            with torch.no_grad():
                denominator, sign = modified(), None
        else:
            denominator, sign = modified, None
        if torch.is_grad_enabled():  # (a backward that records, create_graph=True; else nothing records)
            denominator = denominator.detach()
        return self.scaled(relevance, denominator, layer, sign=sign)


class Norm(Epsilon):
    r"""Normalise by the output and weight by the contributions: zennit's rule for sums and average pooling.

    It is the epsilon rule with ``epsilon`` used only as a stabiliser:

    .. math:: R_j = \frac{x_j \, \partial z / \partial x_j}{s(z)} R

    for ``z = x_1 + x_2`` (a residual add), a sum or a mean over dimensions, or average pooling.

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    """

    def __init__(self, stabilizer: Stabiliser = 1e-6) -> None:
        super().__init__(stabilizer)

    def __repr__(self) -> str:
        return f"Norm(stabilizer={self.epsilon!r})"
