"""LRP rules for affine operations, declared over the term engine (:mod:`fxlrp.relevance.terms`).

A rule says how the relevance ``R_k`` of the outputs ``z_k = sum_j x_j w_jk + b_k`` of an affine
operation is shared among its inputs ``x_j``. Rules know nothing of tracing: they receive an
:class:`~fxlrp.relevance.AffineLayer` and its inputs, run what their formula needs in forward and
turn the output relevance into input relevance in backward with native vector-Jacobian products.
Memory is the engine's business (:mod:`fxlrp.relevance.rule_function`): a rule that reads its
output's values in backward says so (:meth:`Rule.keeps_output`) and receives them as a
:class:`~fxlrp.relevance.rule_function.KeptOutput`.

The definitions are zennit 0.5.1's, bias handling included. Notation used in the docstrings:
``x+ = max(x, 0)``, ``x- = min(x, 0)``, likewise ``w+``, ``w-``, ``b+``, ``b-``; ``f(x; w, b)`` is
the layer with parameters ``(w, b)``, and ``s(z)`` the stabiliser (``z + eps (sign(z) + [z = 0])``
for a number ``eps``, or any callable). ``zero_params`` (``"weight"``, ``"bias"`` or both) sets
those parameters to 0 in every modified copy of the layer, as zennit does.

Beside them: :mod:`fxlrp.rules.composites` (which rule each operation of a model gets) and
:mod:`fxlrp.rules.attention` (the conventions for attention and gating, CP-LRP).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.form import scaled_gradient
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.roles import GATE
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance, gradient_root
from fxlrp.relevance.terms import Parameters, ParameterVariants, ZeroParams
from fxlrp.relevance.tracing import values_read_on_host

Stabiliser = float | Callable[[Tensor], Tensor]
"""A number ``eps`` (zennit's sign-preserving shift) or a function ``z -> stabilised z``."""
DEFAULT_PRODUCT_EPSILON = 1e-6
"""The epsilon of :class:`Product` where none is given or followed."""
Relevance = tuple[Tensor | None, ...]


class Rule:
    """Base class of the rules for affine operations.

    The engine's contract is :class:`~fxlrp.relevance.rule_function.AffineRule`: ``prepare``
    computes parameter transforms once per conversion; ``forward`` returns the layer's output and
    the state ``backward`` needs; ``backward`` returns the relevance of each input (None for
    inputs that carry none), given the output relevance and, if :meth:`keeps_output`, the kept
    output (which a ReLU may have rectified; equal to the output wherever relevance arrives).
    Subclasses override these methods; their documentation here holds for the overrides.
    """

    def prepare(self, layer: AffineLayer) -> Any:
        """Compute what the rule needs of the layer's parameters, once per conversion.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation with its parameters.

        Returns
        -------
        Any
            The prepared state (modified parameters, for instance), handed to :meth:`forward`,
            :meth:`keeps_output` and :meth:`has_gradient_form`; None if the rule needs none.
        """
        return None

    def keeps_output(self, prepared: Any) -> bool:
        """Whether ``backward`` reads the output's values (its denominator or signs).

        Parameters
        ----------
        prepared : Any
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        bool
            True if :meth:`backward` receives the kept output.
        """
        return False

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        """Run the layer and keep what the rule's backward needs.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        inputs : sequence
            The operation's inputs (tensors that carry relevance, and other values).
        prepared : Any
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        output : Tensor
            The layer's output, as the layer computes it.
        state : Any
            What :meth:`backward` receives as ``state``.
        """
        raise NotImplementedError

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        """Share the output's relevance among the inputs.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        state : Any
            What :meth:`forward` returned as its state.
        relevance : Tensor
            The relevance of the output, of the output's shape.
        output : KeptOutput or None
            The kept output if :meth:`keeps_output`, else None.

        Returns
        -------
        tuple of (Tensor or None)
            The relevance of each input, None for inputs that carry none.
        """
        raise NotImplementedError

    def has_gradient_form(self, prepared: Any = None) -> bool:
        """Whether the rule is a modified gradient, ``R_x = x * (modified J)^T (R / z)``.

        See :mod:`fxlrp.relevance.form`; a rule in the gradient form runs
        :meth:`gradient_forward`.

        Parameters
        ----------
        prepared : Any, optional
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        bool
            True if :meth:`gradient_forward` runs the rule.
        """
        return False

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        """The layer's output, whose autograd backward is the rule in the gradient form.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        inputs : sequence
            The operation's inputs.

        Returns
        -------
        Tensor
            The output, recorded so that its gradient is the modified gradient of the rule.
        """
        raise NotImplementedError

    def gradient_is_native(self) -> bool:
        """Whether :meth:`gradient_forward` is the layer's own operation.

        Its native gradient is then the rule in the gradient form, and the operation runs as it
        is, with no rule machinery.

        Returns
        -------
        bool
            True if the layer's native gradient is the rule.
        """
        return False

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items() if not name.startswith("_"))
        return f"{type(self).__name__}({fields})"


class StabilisedRule(Rule):
    """A rule with a stabiliser and zennit's ``zero_params``.

    The stabiliser is named ``stabilizer`` as in zennit, ``epsilon`` for the epsilon rule.

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        A number ``eps`` (``s(z) = z + eps (sign(z) + [z = 0])``) or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.
    """

    stabiliser_name = "stabilizer"

    def __init__(self, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        setattr(self, self.stabiliser_name, stabilizer if callable(stabilizer) else float(stabilizer))
        self.zero_params = sorted(terms.zero_parameter_names(zero_params))
        self._stabiliser = terms.Stabiliser.of(stabilizer)
        self._zero = frozenset(self.zero_params)

    def scaled(self, relevance: Tensor, denominator: Tensor, layer: AffineLayer, **how: Any) -> Tensor:
        """``R / s(z)`` with this rule's stabiliser ``s``, a fresh tensor.

        Parameters
        ----------
        relevance : Tensor
            The output relevance ``R``.
        denominator : Tensor
            The denominator ``z``.
        layer : AffineLayer
            The operation; its ``warn_lost_relevance`` decides whether dropped relevance warns.
        **how
            Passed on to :func:`fxlrp.relevance.terms.scaled` (``sign``, ``owned``).

        Returns
        -------
        Tensor
            ``R / s(z)``, a tensor the caller owns.
        """
        return terms.scaled(relevance, denominator, self._stabiliser, warn_lost_relevance=layer.warn_lost_relevance,
                            **how)


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
        if prepared is None:
            output, root = terms.output_and_root(layer, inputs)
            return output, (inputs, root, None)
        modified = layer(inputs, *prepared)
        return terms.original_output(layer, inputs), (inputs, gradient_root(modified), modified)

    def has_gradient_form(self, prepared: Any = None) -> bool:
        # epsilon = 0: R_x = x * J^T (R / z), i.e. g_x = J^T g_z (zero_params change J)
        return self._stabiliser.epsilon == 0.0 and not self._zero

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        return layer.forward(inputs)

    def gradient_is_native(self) -> bool:
        return self.has_gradient_form()  # LRP-0: g_x = J^T g_z

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, root, _ = state
        return terms.input_times_gradient(root, inputs, self._quotient(layer, state, relevance, output))

    def _quotient(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Tensor:
        """``R / s(z)``, a fresh tensor of the output's size."""
        _, _, modified = state
        if output is None:
            denominator, sign = modified, None
        else:  # the sign of the kept output is known once a ReLU rectified it
            sign = output.sign
            denominator = output.take()
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

    def half_weights(self, output: Tensor | None) -> tuple[float | Tensor | None, float | Tensor | None]:
        """Weights of the first and second half given the layer's output.

        Parameters
        ----------
        output : Tensor or None
            The layer's kept output; None unless the rule keeps its output.

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
        return terms.original_output(layer, inputs), (inputs, prepared, terms.has_negative_inputs(inputs))

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, variants, has_negative = state
        # Behind a ReLU the kept output is the rectified one the next layer keeps anyway, and the
        # half of negative outputs, which receive no relevance there, is skipped.
        weights = self.half_weights(None if output is None else output.take())
        split = terms.split_inputs(inputs, has_negative)
        outputs, scaled = [], []
        for weight, sign, for_positive_inputs, for_negative_inputs in zip(
            weights, self.half_signs, ("more", "less"), ("less_without_bias", "more_without_bias"), strict=True
        ):
            if weight is None:
                continue
            half = terms.signed_terms(layer, split, variants, for_positive_inputs, for_negative_inputs)
            share = self.scaled(relevance, terms.total(half), layer, sign=sign, owned=True)
            if not (isinstance(weight, float) and weight == 1.0):
                share.mul_(weight)
            outputs += half
            scaled += [share] * len(half)
        if not outputs:  # every output is 0: all relevance is dropped
            return tuple(torch.zeros_like(value) if carries_relevance(value) else None for value in inputs)
        return terms.input_times_gradient(outputs, inputs, scaled)


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

    def half_weights(self, output: Tensor | None) -> tuple[float, float | None]:
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

    def __init__(self, gamma: float = 0.25, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        self.gamma = float(gamma)
        super().__init__(stabilizer, zero_params)

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        def raised(tensor: Tensor) -> Tensor:
            return tensor + self.gamma * tensor.clamp(min=0)

        def lowered(tensor: Tensor) -> Tensor:
            return tensor + self.gamma * tensor.clamp(max=0)

        return raised, lowered

    def keeps_output(self, prepared: Any) -> bool:
        return True  # which half explains an output depends on its sign

    def half_weights(self, output: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        # An output sign that never occurs receives no relevance: its half is not computed.
        positive, negative = output > 0, output < 0
        if not values_read_on_host(output):  # a half without outputs gets zero weights: its terms add zeros
            return positive, negative
        return (positive if bool(positive.any()) else None, negative if bool(negative.any()) else None)


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

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
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


class InputIndependent(StabilisedRule):
    r"""Rules that ignore the input's values.

    ``R_j = \sum_k \frac{m_{jk}}{s(\sum_j m_{jk})} R_k`` for modified weights ``m`` (and modified
    bias in the denominator), computed with an input of ones in backward, where it is used.
    """

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        return terms.original_output(layer, inputs), (inputs, prepared)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        inputs, parameters = state
        ones = terms.map_carrying(inputs, lambda value: torch.ones_like(value).requires_grad_())
        with torch.enable_grad():
            on_ones = layer(ones, *parameters)
        # x_j = 1: the input-times-gradient product is the gradient itself.
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


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    return len(shape) <= len(target) and all(
        size in (1, wanted) for size, wanted in zip(reversed(shape), reversed(target), strict=False))


class Pass(Rule):
    r"""The identity rule: ``R_in = R_out``.

    The relevance is shared equally among several relevance-carrying inputs and summed back over
    broadcast dimensions. For operations whose output has the shape of its input, e.g.
    activations and BatchNorm, as zennit uses it.
    """

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        output = terms.original_output(layer, inputs)
        shapes = [value.shape if carries_relevance(value) else None for value in inputs]
        for shape in shapes:
            if shape is not None and not _broadcasts_to(shape, output.shape):
                raise ValueError(
                    f"the Pass rule hands relevance through unchanged, so it needs an output of the input's "
                    f"shape, but this operation maps {tuple(shape)} to {tuple(output.shape)}; "
                    "use Epsilon or Norm for it"
                )
        return output, shapes

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        share = 1.0 / sum(shape is not None for shape in state)
        return terms.shared_equally(relevance, [share] * len(state), state)


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
        return self.epsilon == 0.0 and super().has_gradient_form(prepared)

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        receivers = sum(carries_relevance(value) for value in inputs)
        return scaled_gradient(layer.forward(inputs), 1.0 / receivers)

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
    def closed_form(relevance: Tensor, weights: Tensor, logits: Tensor, dim: int, owned: bool = False) -> Tensor:
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
        return _zero_where_infinite(share, logits)

    def __repr__(self) -> str:
        return "SoftmaxRule()"


def _zero_where_infinite(share: Tensor, value: Tensor) -> Tensor:
    """``share`` with 0 where ``value`` is not finite (masked logits of ``-inf``)."""
    finite = torch.isfinite(value)
    return share.masked_fill_(finite.logical_not_(), 0.0) if not share.requires_grad else torch.where(
        finite, share, torch.zeros_like(share))


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
