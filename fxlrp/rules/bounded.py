"""The rule for inputs within bounds, pixels of an image (:class:`ZBox`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance, gradient_root
from fxlrp.relevance.stabilise import constant_like
from fxlrp.relevance.terms import Parameters, ZeroParams
from fxlrp.rules.rule import Relevance, StabilisedRule, Stabiliser


def expand_bound(bound: float | Tensor, like: Tensor) -> Tensor:
    """zennit's expansion of an input bound to the input's shape.

    Parameters
    ----------
    bound : float or Tensor
        The bound. A number fills the shape; a tensor with fewer dimensions gets trailing
        singleton dimensions (``(1, 3)`` means per channel); a tensor with a larger first (batch)
        dimension is cut to the batch.
    like : Tensor
        The input whose shape, dtype and device the bound takes.

    Returns
    -------
    Tensor
        The bound, an expanded view of ``like``'s shape.

    Raises
    ------
    ValueError
        If the bound has more dimensions than the input or does not broadcast to it.
    """
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):  # (a number made once, not at each call)
        return constant_like(like, float(bound)).expand(like.shape)
    bound = torch.as_tensor(bound).to(like)
    if bound.dim() > like.dim():
        raise ValueError(
            f"ZBox bound of shape {tuple(bound.shape)} has more dimensions than the input {tuple(like.shape)}"
        )
    bound = bound.reshape(*bound.shape, *(1,) * (like.dim() - bound.dim()))
    if bound.dim() and bound.shape[0] > like.shape[0]:
        bound = bound[: like.shape[0]]
    try:
        return bound.expand(like.shape)
    except RuntimeError:
        raise ValueError(
            f"ZBox bound of shape {tuple(bound.shape)} does not fit the input of shape {tuple(like.shape)}; "
            "pass a number or a tensor such as shape (1, channels, 1, 1)"
        ) from None


class ZBox(StabilisedRule):
    r"""The z^B rule for inputs bounded by ``low <= x <= high`` (first layer on pixels).

    .. math::
        R_j = \sum_k \frac{x_j w_{jk} - l_j w_{jk}^+ - h_j w_{jk}^-}{s(z_k)} R_k,
        \qquad z = f(x; w, b) - f(l; w^+, b^+) - f(h; w^-, b^-)

    The three bias terms cancel (``b - b^+ - b^- = 0``), as in zennit.

    Parameters
    ----------
    low, high : float or Tensor
        The bounds ``l`` and ``h`` of the input: numbers or tensors (e.g. of shape
        ``(1, 3, 1, 1)`` per channel; see :func:`expand_bound`).
    stabilizer : float or callable, default 1e-6
        The stabiliser's ``epsilon``, or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.
    """

    shares_by_input_values = False

    def __init__(
        self, low: float | Tensor, high: float | Tensor, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None
    ) -> None:
        self.low, self.high = low, high
        super().__init__(stabilizer, zero_params)

    def prepare(self, layer: AffineLayer) -> dict[str, Parameters | None]:
        return {
            "own": terms.modified_parameters(layer, terms.identity, self._zero) if self._zero else None,
            "positive": terms.modified_parameters(layer, terms.positive_part, self._zero),
            "negative": terms.modified_parameters(layer, terms.negative_part, self._zero),
        }

    def keeps_output(self, prepared: Any) -> bool:
        return prepared["own"] is None

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        if self._closed(layer, inputs):
            # The layer's product in closed form: the terms are computed in backward, without autograd.
            own = terms.LayerGradient(layer, None if prepared["own"] is None else prepared["own"][0])
            value = next(value for value in inputs if carries_relevance(value))
            # (bounds that do not fit the input are refused here, in forward)
            bounds = (expand_bound(self.low, value), expand_bound(self.high, value))
            return terms.original_output(layer, inputs), (inputs, prepared, own, bounds)

        def bounds(bound: float | Tensor) -> list[Any]:
            # expanded views of the bound: no input-sized memory
            return terms.map_carrying(inputs, lambda value: expand_bound(bound, value).requires_grad_())

        if prepared["own"] is None:
            output = own = layer.forward(inputs)
            modified = None
        else:
            output, own = terms.original_output(layer, inputs), layer(inputs, *prepared["own"])
            modified = own
        # The bound terms are computed in backward, where they are used.
        return output, ([inputs, bounds(self.low), bounds(self.high)], prepared, gradient_root(own), modified)

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool:
        return not self._closed(layer, inputs)

    @staticmethod
    def _closed(layer: AffineLayer, inputs: Sequence[Any]) -> bool:
        """Whether the rule takes the layer's product in closed form: where it has one, for one
        relevance-carrying input (the bounds replace that input; a sum of several takes the
        inner graph)."""
        return terms.has_layer_gradient(layer, inputs) and sum(map(carries_relevance, inputs)) == 1

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        if isinstance(state[2], terms.LayerGradient):
            return self._closed_form(layer, state, relevance, output)
        (inputs, lows, highs), prepared, own_root, modified = state
        own = (modified if output is None else output.take()).detach()
        with torch.enable_grad():
            low_term, high_term = layer(lows, *prepared["positive"]), layer(highs, *prepared["negative"])
        scaled = self.scaled(relevance, own - low_term.detach() - high_term.detach(), layer)
        # one pass of autograd for the three terms (each reaches only its own leaves)
        shares = terms.input_times_gradient([own_root, low_term, high_term], [*inputs, *lows, *highs], [scaled] * 3)
        count = len(inputs)
        from_inputs, from_lows, from_highs = shares[:count], shares[count:2 * count], shares[2 * count:]
        return tuple(
            None if value is None else value - low - high
            for value, low, high in zip(from_inputs, from_lows, from_highs, strict=True)
        )

    def _closed_form(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        """The rule where the layer's product has a closed form (one relevance-carrying input):
        ``x J^T s - l J+^T s - h J-^T s``, with the terms computed without autograd."""
        inputs, prepared, own_root, (low, high) = state
        value = next(value for value in inputs if carries_relevance(value))
        with torch.no_grad():
            own = layer(inputs, *prepared["own"]) if output is None else output.take()
            low_term = layer([low if item is value else item for item in inputs], *prepared["positive"])
            high_term = layer([high if item is value else item for item in inputs], *prepared["negative"])
            denominator = own - low_term
        scaled = self.scaled(relevance, denominator.sub_(high_term), layer)
        low_root, high_root = (terms.LayerGradient(layer, prepared[name][0]) for name in ("positive", "negative"))
        relevance_of_value = (value * own_root.of(scaled, value) - low * low_root.of(scaled, value)
                              - high * high_root.of(scaled, value))
        return tuple(relevance_of_value if item is value else None for item in inputs)
