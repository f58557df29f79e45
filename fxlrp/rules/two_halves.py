"""Rules that treat the positive and negative contributions apart: :class:`TwoHalves`,
:class:`AlphaBeta`, :class:`ZPlus`, :class:`Gamma`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance
from fxlrp.relevance.terms import ParameterVariants, ZeroParams
from fxlrp.relevance.tracing import values_are_traced, values_read_on_host
from fxlrp.rules.rule import Relevance, StabilisedRule, Stabiliser


class TwoHalves(StabilisedRule):
    r"""Rules that normalise two halves of the contributions separately and weight them.

    With parameter transforms "more" (``w^>``) and "less" (``w^<``), the first half is
    ``f(x^+; w^>, b^>) + f(x^-; w^<, 0)`` and the second ``f(x^+; w^<, b^<) + f(x^-; w^>, 0)``;
    each term's contributions get the half's weight times ``R / s(half)``. A half whose weight is
    None is not computed. The halves' terms are computed in backward, where they are used.
    """

    half_signs: tuple[float | None, float | None] = (None, None)
    """The sign each half has by construction (``+1``: never negative), if any: lets the
    stabiliser skip its sign test."""

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        """The "more" and "less" transforms of the parameters.

        Returns
        -------
        more, less : callable
            The transforms ``w -> w^>`` and ``w -> w^<``, applied to weight and bias alike.
        """
        raise NotImplementedError

    def half_weights(
        self, output: Tensor | None, sign: float | None = None
    ) -> tuple[float | Tensor | None, float | Tensor | None]:
        """Weights of the first and second half given the layer's output.

        Parameters
        ----------
        output : Tensor or None
            The layer's kept output; None unless the rule keeps its output.
        sign : float, optional
            The sign every value of the kept output has, where known (``+1.0`` once a ReLU that
            alone reads it rectified it: relevance reaches none of the outputs that were negative).

        Returns
        -------
        first, second : float, Tensor or None
            The weight of each half (a number, or a tensor of the output's shape); None skips
            that half.
        """
        raise NotImplementedError

    def prepare(self, layer: AffineLayer) -> ParameterVariants:
        more, less = self.parameter_transforms()
        return ParameterVariants(layer, {
            "more": (more, self._zero), "less": (less, self._zero),
            "more_without_bias": (more, self._zero | {"bias"}), "less_without_bias": (less, self._zero | {"bias"}),
        })

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        has_negative = not layer.inputs_non_negative and terms.has_negative_inputs(inputs)
        closed = terms.has_layer_gradient(layer, inputs)
        return terms.original_output(layer, inputs), (inputs, prepared, has_negative, closed)

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool:
        # With the layer's product in closed form the terms are computed without autograd.
        return not terms.has_layer_gradient(layer, inputs)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, variants, has_negative, closed = state
        # Behind a ReLU the kept output is the rectified one the next layer keeps anyway, and the
        # half of negative outputs, which receive no relevance there, is skipped.
        weights = self.half_weights(None, None) if output is None else self.half_weights(output.take(), output.sign)
        split = terms.split_inputs(inputs, has_negative, graph=not closed)
        roots, scaled = [], []
        for weight, sign, for_positive_inputs, for_negative_inputs in zip(
            weights, self.half_signs, ("more", "less"), ("less_without_bias", "more_without_bias"), strict=True
        ):
            if weight is None:
                continue
            # (in closed form a weighted layer adds a stabiliser of known sign with its bias; a sum
            # has no bias to add it with)
            shift = (terms.stabilising_shift(self._stabiliser, sign, relevance.dtype)
                     if closed and layer.weight is not None else None)
            half, denominator = terms.signed_terms(layer, split, variants, for_positive_inputs, for_negative_inputs,
                                                   closed, shift)
            share = self.scaled(relevance, denominator, layer, sign=sign, owned=True, shifted=shift is not None)
            if not (isinstance(weight, float) and weight == 1.0):
                share.mul_(weight)
            roots += half
            scaled += [share] * len(half)
        if not roots:  # every output is 0: all relevance is dropped
            return tuple(torch.zeros_like(value) if carries_relevance(value) else None for value in inputs)
        return terms.input_times_gradient(roots, inputs, scaled)


class AlphaBeta(TwoHalves):
    r"""The alpha-beta rule: positive and negative contributions normalised separately.

    .. math::
        R_j = \sum_k \left( \alpha \frac{(x_j w_{jk})^+}{s(z_k^+)} - \beta \frac{(x_j w_{jk})^-}{s(z_k^-)} \right) R_k

    with ``(x w)^+ = x^+ w^+ + x^- w^-``, ``(x w)^- = x^+ w^- + x^- w^+``,
    ``z^+ = f(x^+; w^+, b^+) + f(x^-; w^-, 0)`` and ``z^- = f(x^+; w^-, b^-) + f(x^-; w^+, 0)``:
    the positive part of the bias counts as a positive contribution, the negative part as a
    negative one.

    Parameters
    ----------
    alpha : float, default 2.0
        The weight of the positive half; ``alpha >= 0``.
    beta : float, default 1.0
        The weight of the negative half; ``beta >= 0`` and, as in zennit, ``alpha - beta = 1``.
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.

    Raises
    ------
    ValueError
        If ``alpha`` or ``beta`` is negative, or ``alpha - beta != 1``.
    """

    half_signs = (1.0, -1.0)  # x+ w+ + x- w- >= 0 and x+ w- + x- w+ <= 0, with b+ >= 0 and b- <= 0

    def __init__(
        self, alpha: float = 2.0, beta: float = 1.0, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None
    ) -> None:
        if alpha < 0 or beta < 0:
            raise ValueError(f"AlphaBeta needs alpha >= 0 and beta >= 0, got alpha={alpha}, beta={beta}")
        if alpha - beta != 1:
            raise ValueError(
                f"AlphaBeta needs alpha - beta = 1 so that relevance is conserved, got alpha={alpha}, beta={beta}"
            )
        self.alpha, self.beta = float(alpha), float(beta)
        super().__init__(stabilizer, zero_params)

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        return terms.positive_part, terms.negative_part

    def half_weights(self, output: Tensor | None, sign: float | None = None) -> tuple[float, float | None]:
        return self.alpha, (-self.beta if self.beta != 0 else None)


class ZPlus(AlphaBeta):
    r"""The z+ rule: :class:`AlphaBeta` with ``alpha = 1, beta = 0``.

    This is zennit's version, which also admits negative inputs:

    .. math::
        R_j = \frac{x_j^+ w_{jk}^+ + x_j^- w_{jk}^-}{s(z_k^+)} R_k,
        \qquad z_k^+ = f(x^+; w^+, b^+)_k + f(x^-; w^-, 0)_k

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.
    """

    def __init__(self, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        super().__init__(1.0, 0.0, stabilizer, zero_params)

    def __repr__(self) -> str:
        return f"ZPlus(stabilizer={self.stabilizer!r}, zero_params={self.zero_params!r})"


class Gamma(TwoHalves):
    r"""The generalised gamma rule: positive contributions amplified by ``1 + gamma``.

    With ``w^\uparrow = w + \gamma w^+`` and ``w^\downarrow = w + \gamma w^-`` (biases alike),
    outputs ``z_k > 0`` are explained by

    .. math::
        R_j = \frac{x_j^+ w_{jk}^\uparrow + x_j^- w_{jk}^\downarrow}
                   {s\left(f(x^+; w^\uparrow, b^\uparrow)_k + f(x^-; w^\downarrow, 0)_k\right)} R_k

    and outputs ``z_k < 0`` by the same with the roles of ``\uparrow`` and ``\downarrow`` swapped;
    relevance of outputs ``z_k = 0`` is dropped. ``z = f(x; w, b)`` is the layer's own output.

    Parameters
    ----------
    gamma : float, default 0.25
        The amplification ``gamma`` of the positive (for ``z_k > 0``) contributions.
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.
    """

    gates_rectified_relevance = True  # (after the quotient: see _one_term)

    def __init__(self, gamma: float = 0.25, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        self.gamma = float(gamma)
        super().__init__(stabilizer, zero_params)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, variants, has_negative, closed = state
        # On inputs that are never negative, with the layer's own parameters modified, the half that
        # explains an output has that output's sign: z_up = z + gamma f(x; w+, b+) >= z where z > 0,
        # and z_down = z + gamma f(x; w-, b-) <= z where z < 0. Its stabiliser is then a shift of known sign
        # in the bias, and where the layer's product has a closed form each output's half is
        # chosen after the quotient, by a gate on its sign (one kernel), not by masks before it.
        shift = None
        if closed and not has_negative and layer.weight is not None and self.gamma >= 0.0 and not self._zero \
                and not torch.is_grad_enabled():
            shift = terms.stabilising_shift(self._stabiliser, 1.0, relevance.dtype)
        if shift is not None and output.sign == 1.0:
            return self._one_term(layer, inputs, variants, relevance, output.take(), shift)
        if shift is not None and layer.output_rows_dim is not None:
            return self._stacked_halves(layer, inputs, variants, relevance, output.take(), shift)
        if output.ungated:
            relevance = torch.ops.aten.threshold_backward(relevance, output.values, 0)
        return super().backward(layer, state, relevance, output)

    def _one_term(self, layer: AffineLayer, inputs: Sequence[Any], variants: ParameterVariants, relevance: Tensor,
                  output: Tensor, shift: float) -> Relevance:
        """Behind a ReLU that alone reads the output (``output >= 0``: rectified), the first half:
        ``R_x = x * J_up^T [z > 0] R / (z_up + epsilon)`` (``J_up``, ``z_up``: the layer with
        ``w + gamma w+``, ``b + gamma b+``), the stabiliser in the bias of ``z_up``'s layer and the
        ReLU's gate after the quotient, so that a ``z_up + epsilon`` of 0 at an output the ReLU cut
        off gives a share of 0, not NaN."""
        weight, bias = variants.shifted("more", shift)
        with torch.no_grad():
            denominator = layer(inputs, weight, bias)
        share = torch.ops.aten.threshold_backward(self.scaled(relevance, denominator, layer, shifted=True), output, 0)
        return terms.input_times_gradient(terms.LayerGradient(layer, weight), inputs, share)

    def _stacked_halves(self, layer: AffineLayer, inputs: Sequence[Any], variants: ParameterVariants,
                        relevance: Tensor, output: Tensor, shift: float) -> Relevance:
        """Both halves from one product beside the layer's own output ``z``: ``f`` is linear in its
        parameters and ``w = w+ + w-``, ``b = b+ + b-``, so with
        ``z_up + epsilon = f(x; w + gamma w+, b + gamma b+ + epsilon)``,
        ``z_down - epsilon = z + gamma (z - f(x; w+, b+)) - epsilon = (2 + gamma) z - (z_up + epsilon)``;
        the quotients of ``R`` by both, gated by ``z > 0`` and ``z < 0`` (each output's share from
        the half of its sign; outputs of 0 get none), and one vector-Jacobian product in the two
        weights' rows stacked (:meth:`ParameterVariants.stacked`, ``[w_up; w_down]``, whose first
        rows the product uses) for the sum of the halves' products. One product of the layer's
        size where the halves' own would be two."""
        halves = (("more", shift), ("less", -shift))
        weight, bias = variants.stacked_part(halves, 0)
        with torch.no_grad():
            up = layer(inputs, weight, bias)
        traced = values_are_traced()  # (a traced graph records no writes into its own results)
        down = torch.mul(output, 2.0 + self.gamma)
        down = down - up if traced else down.sub_(up)
        if not traced and relevance.dtype == up.dtype:  # (each quotient written into its denominator)
            up, down = torch.div(relevance, up, out=up), torch.div(relevance, down, out=down)
        else:
            up, down = relevance / up, relevance / down
        shares = (torch.ops.aten.threshold_backward(up, output, 0), torch.ops.aten.threshold_backward(down, -output, 0))
        stacked, _ = variants.stacked(halves)
        return terms.input_times_gradient(terms.LayerGradient(layer, stacked), inputs,
                                          torch.cat(shares, layer.output_rows_dim % output.dim()))

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        def raised(tensor: Tensor) -> Tensor:
            return tensor + self.gamma * tensor.clamp(min=0)

        def lowered(tensor: Tensor) -> Tensor:
            return tensor + self.gamma * tensor.clamp(max=0)

        return raised, lowered

    def keeps_output(self, prepared: Any) -> bool:
        return True  # which half explains an output depends on its sign

    def half_weights(self, output: Tensor | None, sign: float | None = None) -> tuple[Tensor | float | None,
                                                                                     Tensor | None]:
        # An output sign that never occurs receives no relevance: its half is not computed.
        if sign == 1.0:
            # Rectified by the ReLU that alone reads it, whose backward gave the outputs that were
            # not positive no relevance: the first half alone, unmasked (its shares there are 0).
            return 1.0, None
        positive, negative = output > 0, output < 0
        if not values_read_on_host(output):  # a half without outputs gets zero weights: its terms add zeros
            return positive, negative
        return (positive if bool(positive.any()) else None, negative if bool(negative.any()) else None)
