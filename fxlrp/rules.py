"""LRP rules for affine operations.

A rule says how the relevance ``R_k`` of the outputs ``z_k = sum_j x_j w_jk + b_k`` of an affine
operation is shared among its inputs ``x_j``. Rules know nothing of tracing: they receive an
:class:`~fxlrp.relevance.AffineLayer` and its inputs, run what their formula needs in forward
(under autograd) and turn the output relevance into input relevance in backward with native
vector-Jacobian products.

The definitions are zennit 0.5.1's, bias handling included. Notation used in the docstrings:
``x+ = max(x, 0)``, ``x- = min(x, 0)``, likewise ``w+``, ``w-``, ``b+``, ``b-``; ``f(x; w, b)`` is
the layer with parameters ``(w, b)``, and ``s(z)`` the stabiliser (``z + eps (sign(z) + [z = 0])``
for a number ``eps``, or any callable). ``zero_params`` (``"weight"``, ``"bias"`` or both) sets
those parameters to 0 in every modified copy of the layer, as zennit does. Parameter transforms
are computed once per weight tensor (:meth:`Rule.prepare`), each when first needed; each term of
a formula costs one run of the operation, and terms that are 0 for the given input (the ``x-``
terms behind a ReLU, the negative half of alpha-beta with ``beta = 0``) are not computed at all.
Terms with modified parameters are computed in backward, where they are used, so that no
activation-sized term is held from forward to backward (zennit too recomputes them there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.roles import GATE
from fxlrp.relevance.rule_function import carries_relevance, gradient_root, graph_reused
from fxlrp.relevance.stabilise import divide_dropping_zeros, stabilise

Stabiliser = float | Callable[[Tensor], Tensor]
"""A number ``eps`` (zennit's sign-preserving shift) or a function ``z -> stabilised z``."""
ZeroParams = str | Iterable[str] | None
Parameters = tuple[Tensor | None, Tensor | None]
"""``(weight, bias)`` of a modified copy of a layer."""

Root = Tensor | GradientEdge
"""Where a vector-Jacobian product starts: an output, or its gradient edge (which does not keep
the output's values alive)."""

PARAMETER_NAMES = ("weight", "bias")
DEFAULT_PRODUCT_EPSILON = 1e-6
"""The epsilon of :class:`Product` where none is given or followed."""


class Rule:
    """Base class of the rules for affine operations.

    Subclasses implement :meth:`forward` and :meth:`backward`; :meth:`prepare` may compute
    parameter transforms once per conversion.

    A state that holds the returned output itself may see it replaced by a ReLU's output when a
    ReLU is the output's only consumer (:func:`~fxlrp.relevance.rule_function.hand_over_activation`):
    the two are equal wherever relevance arrives. Rules therefore read the output's values from
    the state, and start vector-Jacobian products from a
    :func:`~fxlrp.relevance.rule_function.gradient_root` kept beside it.
    """

    def prepare(self, layer: AffineLayer) -> Any:
        """Work done once per conversion (modified weights); passed to :meth:`forward`."""
        return None

    def forward(
        self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any
    ) -> tuple[Tensor, Any]:
        """Return the layer's output and the state :meth:`backward` needs."""
        raise NotImplementedError

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        """Return the relevance of each input (``None`` for inputs that carry none)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items() if not name.startswith("_"))
        return f"{type(self).__name__}({fields})"


def input_times_gradient(
    output: Root | Sequence[Root], inputs: Sequence[Any], scaled_relevance: Tensor | Sequence[Tensor]
) -> tuple[Tensor | None, ...]:
    """``R_j = x_j * sum_k w_jk s_k`` for each relevance-carrying input, with the native VJP.

    ``output`` (a tensor or its :func:`~fxlrp.relevance.rule_function.gradient_root`) and
    ``scaled_relevance`` may be sequences (one ``s`` per term of a formula); the gradients of all
    terms are summed by autograd in one call. ``scaled_relevance`` must be the caller's own fresh
    tensors (as :func:`_scaled` makes them): the products may be written into them.
    """
    carrying = [value for value in inputs if carries_relevance(value)]
    # A graph reused for several explanations (reusable_graph) keeps the inner graph for the next.
    gradients = torch.autograd.grad(output, carrying, scaled_relevance, retain_graph=graph_reused())
    products = iter(
        gradient.mul_(value) if in_place else value * gradient
        for value, gradient, in_place in zip(carrying, gradients, _writable(gradients), strict=True)
    )
    return tuple(next(products) if carries_relevance(value) else None for value in inputs)


def _writable(gradients: Sequence[Tensor]) -> list[bool]:
    """Which gradients may take their product in place, in order: fresh tensors (not views, not
    recorded) whose memory no later gradient reads. An addition's VJP hands one tensor (the
    scaled relevance) to both inputs; the last of them overwrites it after the others have read
    it. Each product made in place saves an input-sized allocation (and its page faults) per
    layer."""
    def storage(tensor: Tensor) -> int:
        return tensor.untyped_storage().data_ptr()

    last_reader = {storage(gradient): index for index, gradient in enumerate(gradients)}
    recording = torch.is_grad_enabled()  # a double backward would need the gradient unchanged
    return [
        not recording and not gradient.requires_grad and not gradient._is_view()
        and last_reader[storage(gradient)] == index
        for index, gradient in enumerate(gradients)
    ]


def stabiliser_function(stabiliser: Stabiliser) -> Callable[[Tensor], Tensor]:
    """A number becomes zennit's stabiliser ``z + eps (sign(z) + [z = 0])``; a callable is kept."""
    if callable(stabiliser):
        return stabiliser
    if isinstance(stabiliser, bool) or not isinstance(stabiliser, (int, float)):
        raise TypeError(f"a stabiliser is a number or a function of the denominator, not {stabiliser!r}")
    return partial(stabilise, epsilon=float(stabiliser))


def zero_parameter_names(zero_params: ZeroParams) -> frozenset[str]:
    """zennit's ``zero_params`` as a set of names, checked against the parameters layers have."""
    names = frozenset() if zero_params is None else frozenset(
        [zero_params] if isinstance(zero_params, str) else zero_params)
    unknown = names - set(PARAMETER_NAMES)
    if unknown:
        raise ValueError(f"zero_params may name {PARAMETER_NAMES}, got {sorted(unknown)}")
    return names


def modified_parameters(
    layer: AffineLayer, transform: Callable[[Tensor], Tensor], zero: frozenset[str] = frozenset()
) -> Parameters:
    """``(weight, bias)`` of ``layer`` with ``transform`` applied; parameters named in ``zero``
    become zeros. A missing parameter (``bias=None``) stays missing."""

    def modify(name: str, tensor: Tensor | None) -> Tensor | None:
        if tensor is None:
            return None
        return torch.zeros_like(tensor) if name in zero else transform(tensor)

    return modify("weight", layer.weight), modify("bias", layer.bias)


class ParameterVariants:
    """Modified copies of a layer's parameters by name, each made on first use and then kept.

    ``recipes`` maps a name to ``(transform, zero)`` for :func:`modified_parameters`. A rule's
    :meth:`Rule.prepare` returns one per layer (cached per conversion), so that copies a call
    never needs (the ``w-`` of z+ behind a ReLU) cost neither time nor memory.
    """

    def __init__(
        self, layer: AffineLayer, recipes: dict[str, tuple[Callable[[Tensor], Tensor], frozenset[str]]]
    ) -> None:
        self._layer, self._recipes, self._made = layer, recipes, {}

    def __getitem__(self, name: str) -> Parameters:
        if name not in self._made:
            transform, zero = self._recipes[name]
            self._made[name] = modified_parameters(self._layer, transform, zero)
        return self._made[name]


def _identity(tensor: Tensor) -> Tensor:
    return tensor


def _positive_part(tensor: Tensor) -> Tensor:
    return tensor.clamp(min=0)


def _negative_part(tensor: Tensor) -> Tensor:
    return tensor.clamp(max=0)


def _map_carrying(inputs: Sequence[Any], transform: Callable[[Tensor], Tensor]) -> list[Any]:
    """Apply ``transform`` to the relevance-carrying inputs; constants stay as they are."""
    return [transform(value) if carries_relevance(value) else value for value in inputs]


def _has_negative_inputs(inputs: Sequence[Any]) -> bool:
    """Whether any ``x-`` term can be non-zero (behind a ReLU none can, and none is computed).
    One read-only reduction per input (a comparison would first write a mask of the input's size)."""
    return any(value.numel() > 0 and bool(value.amin() < 0) for value in inputs if carries_relevance(value))


def _split_inputs(inputs: Sequence[Any], has_negative: bool) -> tuple[Sequence[Any], Sequence[Any] | None]:
    """``(x+, x-)`` under autograd. Without negative inputs (behind a ReLU) ``x+`` is the inputs
    themselves, which saves a copy of each input, its clamp and the clamp's backward, and ``x-``
    is None: its terms are 0 and not computed."""
    if not has_negative:
        return inputs, None
    with torch.enable_grad():
        return _map_carrying(inputs, _positive_part), _map_carrying(inputs, _negative_part)


def _signed_terms(
    layer: AffineLayer, split: tuple[Sequence[Any], Sequence[Any] | None], prepared: ParameterVariants,
    for_positive: str, for_negative: str,
) -> list[Tensor]:
    """``f(x+; p)`` and, with negative inputs, ``f(x-; n)`` under autograd, for the parameter
    variants named ``for_positive`` (p) and ``for_negative`` (n): the terms of z+ and of each
    alpha-beta or gamma half, computed in backward where they are used."""
    positive_inputs, negative_inputs = split
    with torch.enable_grad():
        terms = [layer(positive_inputs, *prepared[for_positive])]
        if negative_inputs is not None:
            terms.append(layer(negative_inputs, *prepared[for_negative]))
    return terms


def _total(terms: Sequence[Tensor]) -> Tensor:
    """The sum of the terms' values (no copy for a single term)."""
    return terms[0].detach() if len(terms) == 1 else sum(term.detach() for term in terms)


def _original_output(layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
    """The layer's own output, when the rule's terms are modified copies (no graph needed)."""
    with torch.no_grad():
        return layer.forward(inputs)


def _scaled(
    relevance: Tensor, output: Tensor, layer: AffineLayer, stabilise: Callable[[Tensor], Tensor],
    sign: float | None = None, owned: bool = False,
) -> Tensor:
    """``R / stabilise(z)``; relevance of a zero denominator is dropped.

    A stabiliser with ``epsilon > 0`` never gives 0 (``|z| + epsilon``), so the zero check, a
    pass over the output and a host synchronisation per layer, is skipped for it (unless the
    dtype flushes epsilon). ``sign``: ``+1`` (``-1``) when ``z >= 0`` (``z <= 0``) by
    construction, as for the positive (negative) contributions of z+ and alpha-beta; the
    stabiliser is then ``z + epsilon`` (``z - epsilon``) in one pass. That is zennit's value for
    ``z != 0``; an output of exactly 0 has only zero contributions, which get 0 either way.
    ``owned``: ``output`` is the rule's own term, computed in backward and read by nothing else
    (affine operations do not keep their output for their VJP): the stabiliser and the quotient
    are written into it, and backward allocates no buffer for them.
    """
    epsilon = stabilise.keywords.get("epsilon", 0.0) if isinstance(stabilise, partial) else 0.0
    if epsilon < torch.finfo(output.dtype).tiny:  # no epsilon, a callable, or flushed to 0 in this dtype
        return divide_dropping_zeros(relevance, stabilise(output), layer.warn_lost_relevance)
    if sign is None:
        denominator = stabilise(output)
    else:
        denominator = output.add_(sign * epsilon) if owned else output + sign * epsilon
    if denominator.shape != relevance.shape or denominator.dtype != relevance.dtype or denominator.requires_grad:
        return relevance / denominator
    # The denominator is a fresh tensor: the quotient overwrites it, so that backward's peak holds
    # one activation-sized buffer fewer (the largest layers set the peak).
    return torch.div(relevance, denominator, out=denominator)


class Epsilon(Rule):
    r"""The epsilon rule (LRP-epsilon; LRP-0 for ``epsilon=0``).

    .. math::
        R_j = \sum_k \frac{x_j w_{jk}}{s(z_k)} R_k,
        \qquad z_k = \sum_j x_j w_{jk} + b_k,
        \qquad s(z) = z + \epsilon \cdot (\operatorname{sign}(z) + [z = 0])

    The bias takes part in ``z_k`` and absorbs its share of the relevance, as in zennit.
    ``epsilon`` may also be a function ``z -> s(z)``. Relevance of an output with a zero
    denominator (only possible for ``epsilon=0``) is dropped.
    """

    def __init__(self, epsilon: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        self.epsilon = epsilon if callable(epsilon) else float(epsilon)
        self.zero_params = sorted(zero_parameter_names(zero_params))
        self._stabilise = stabiliser_function(self.epsilon)

    def prepare(self, layer: AffineLayer) -> Parameters | None:
        if not self.zero_params or not layer.has_parameters:
            return None
        return modified_parameters(layer, _identity, frozenset(self.zero_params))

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        if prepared is None:
            output = layer.forward(inputs)
            # The output's values (the denominator) and where its gradient starts, separately: a
            # following ReLU may hand over its own output for the values (hand_over_activation).
            return output, (inputs, gradient_root(output), output)
        modified = layer(inputs, *prepared)
        return _original_output(layer, inputs), (inputs, gradient_root(modified), modified)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs, root, output = state
        del state
        # The sign of the kept output is known once a ReLU rectified it (never with zero_params,
        # whose denominator is another tensor that is not kept as the output).
        scaled = _scaled(relevance, output.detach(), layer, self._stabilise, sign=layer.output_sign)
        del output  # read: without other holders its memory is free before the VJP's result is made
        return input_times_gradient(root, inputs, scaled)


class Norm(Epsilon):
    r"""Normalise by the output and weight by the contributions, zennit's rule for sums and
    average pooling: the epsilon rule with ``epsilon`` used only as a stabiliser.

    .. math:: R_j = \frac{x_j \, \partial z / \partial x_j}{s(z)} R

    for ``z = x_1 + x_2`` (a residual add), a sum or a mean over dimensions, or average pooling.
    """

    def __init__(self, stabilizer: Stabiliser = 1e-6) -> None:
        super().__init__(stabilizer)

    def __repr__(self) -> str:
        return f"Norm(stabilizer={self.epsilon!r})"


class ZPlus(Rule):
    r"""The z+ rule (alpha=1, beta=0), zennit's version that also admits negative inputs.

    .. math::
        R_j = \frac{x_j^+ w_{jk}^+ + x_j^- w_{jk}^-}{s(z_k^+)} R_k,
        \qquad z_k^+ = f(x^+; w^+, b^+)_k + f(x^-; w^-, 0)_k

    Only the positive part of the bias enters the denominator.
    """

    def __init__(self, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        self.stabilizer = stabilizer
        self.zero_params = sorted(zero_parameter_names(zero_params))
        self._stabilise = stabiliser_function(stabilizer)

    def prepare(self, layer: AffineLayer) -> ParameterVariants:
        zero = frozenset(self.zero_params)
        return ParameterVariants(layer, {
            "positive": (_positive_part, zero), "negative": (_negative_part, zero | {"bias"}),
        })

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        # The terms are computed in backward, where they are used: the same work, but no
        # activation-sized term is held from forward to backward.
        return _original_output(layer, inputs), (inputs, prepared, _has_negative_inputs(inputs))

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs, prepared, has_negative = state
        terms = _signed_terms(layer, _split_inputs(inputs, has_negative), prepared, "positive", "negative")
        scaled = _scaled(relevance, _total(terms), layer, self._stabilise, sign=1.0, owned=True)
        return input_times_gradient(terms, inputs, [scaled] * len(terms))


class _TwoHalves(Rule):
    r"""Rules that normalise two halves of the contributions separately and weight them.

    With parameter transforms "more" (``w^>``) and "less" (``w^<``), the first half is
    ``f(x^+; w^>, b^>) + f(x^-; w^<, 0)`` and the second ``f(x^+; w^<, b^<) + f(x^-; w^>, 0)``;
    each term's contributions get the half's weight times ``R / s(half)``. A half whose weight is
    None is not computed.
    """

    def __init__(self, stabilizer: Stabiliser, zero_params: ZeroParams) -> None:
        self.stabilizer = stabilizer
        self.zero_params = sorted(zero_parameter_names(zero_params))
        self._stabilise = stabiliser_function(stabilizer)

    half_signs: tuple[float | None, float | None] = (None, None)
    """The sign each half has by construction (``+1``: never negative), if any: lets the
    stabiliser skip its sign test (see ``_scaled``)."""

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        """The "more" and "less" transforms of the parameters."""
        raise NotImplementedError

    reads_output = False
    """Whether :meth:`half_weights` reads the layer's output, which is then kept for backward."""

    def half_weights(self, output: Tensor | None) -> tuple[float | Tensor | None, float | Tensor | None]:
        """Weights of the first and second half given the layer's output (None unless
        :attr:`reads_output`); None skips a half."""
        raise NotImplementedError

    def prepare(self, layer: AffineLayer) -> ParameterVariants:
        zero = frozenset(self.zero_params)
        more, less = self.parameter_transforms()
        return ParameterVariants(layer, {
            "more": (more, zero),
            "less": (less, zero),
            "more_without_bias": (more, zero | {"bias"}),
            "less_without_bias": (less, zero | {"bias"}),
        })

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        # The halves' terms are computed in backward, where they are used (as in ZPlus). So are
        # weights that read the output: behind a ReLU, the kept output is the rectified one the
        # next layer keeps anyway (rectify_in_place), and the half of negative outputs, which
        # receive no relevance there, is skipped.
        output = _original_output(layer, inputs)
        kept = output if self.reads_output else None
        return output, (inputs, prepared, _has_negative_inputs(inputs), kept)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs, prepared, has_negative, output = state
        del state
        weights = self.half_weights(output)
        del output
        split = _split_inputs(inputs, has_negative)
        outputs, scaled = [], []
        for weight, sign, for_positive_inputs, for_negative_inputs in zip(
            weights, self.half_signs, ("more", "less"), ("less_without_bias", "more_without_bias"), strict=True
        ):
            if weight is None:
                continue
            terms = _signed_terms(layer, split, prepared, for_positive_inputs, for_negative_inputs)
            share = _scaled(relevance, _total(terms), layer, self._stabilise, sign, owned=True)
            if not (isinstance(weight, float) and weight == 1.0):
                share.mul_(weight)
            outputs += terms
            scaled += [share] * len(terms)
        if not outputs:  # every output is 0: all relevance is dropped
            return tuple(torch.zeros_like(value) if carries_relevance(value) else None for value in inputs)
        return input_times_gradient(outputs, inputs, scaled)


class AlphaBeta(_TwoHalves):
    r"""The alpha-beta rule: positive and negative contributions normalised separately.

    .. math::
        R_j = \sum_k \left( \alpha \frac{(x_j w_{jk})^+}{s(z_k^+)} - \beta \frac{(x_j w_{jk})^-}{s(z_k^-)} \right) R_k

    with ``(x w)^+ = x^+ w^+ + x^- w^-``, ``(x w)^- = x^+ w^- + x^- w^+``,
    ``z^+ = f(x^+; w^+, b^+) + f(x^-; w^-, 0)`` and ``z^- = f(x^+; w^-, b^-) + f(x^-; w^+, 0)``:
    the positive part of the bias counts as a positive contribution, the negative part as a
    negative one. As in zennit, ``alpha, beta >= 0`` and ``alpha - beta = 1``.
    """

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

    # x+ w+ + x- w- >= 0 and x+ w- + x- w+ <= 0, with b+ >= 0 and b- <= 0.
    half_signs = (1.0, -1.0)

    def parameter_transforms(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        return _positive_part, _negative_part

    def half_weights(self, output: Tensor | None) -> tuple[float, float | None]:
        return self.alpha, (-self.beta if self.beta != 0 else None)


class Gamma(_TwoHalves):
    r"""The generalised gamma rule: positive contributions amplified by ``1 + gamma``.

    With ``w^\uparrow = w + \gamma w^+`` and ``w^\downarrow = w + \gamma w^-`` (biases alike),
    outputs ``z_k > 0`` are explained by

    .. math::
        R_j = \frac{x_j^+ w_{jk}^\uparrow + x_j^- w_{jk}^\downarrow}
                   {s\left(f(x^+; w^\uparrow, b^\uparrow)_k + f(x^-; w^\downarrow, 0)_k\right)} R_k

    and outputs ``z_k < 0`` by the same with the roles of ``\uparrow`` and ``\downarrow`` swapped;
    relevance of outputs ``z_k = 0`` is dropped. ``z = f(x; w, b)`` is the layer's own output.
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

    reads_output = True

    def half_weights(self, output: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        # An output sign that never occurs receives no relevance: its half is not computed.
        positive, negative = output > 0, output < 0
        return (positive if bool(positive.any()) else None, negative if bool(negative.any()) else None)


def expand_bound(bound: float | Tensor, like: Tensor) -> Tensor:
    """zennit's expansion of an input bound to the input's shape: a number fills the shape; a
    tensor with fewer dimensions gets trailing singleton dimensions (``(1, 3)`` means per
    channel); a tensor with a larger first (batch) dimension is cut to the batch."""
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


class ZBox(Rule):
    r"""The z^B rule for inputs bounded by ``low <= x <= high`` (first layer on pixels).

    .. math::
        R_j = \sum_k \frac{x_j w_{jk} - l_j w_{jk}^+ - h_j w_{jk}^-}{s(z_k)} R_k,
        \qquad z = f(x; w, b) - f(l; w^+, b^+) - f(h; w^-, b^-)

    The three bias terms cancel (``b - b^+ - b^- = 0``), as in zennit. ``low`` and ``high`` are
    numbers or tensors (e.g. of shape ``(1, 3, 1, 1)`` per channel).
    """

    def __init__(
        self, low: float | Tensor, high: float | Tensor, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None
    ) -> None:
        self.low, self.high = low, high
        self.stabilizer = stabilizer
        self.zero_params = sorted(zero_parameter_names(zero_params))
        self._stabilise = stabiliser_function(stabilizer)

    def prepare(self, layer: AffineLayer) -> dict[str, Parameters | None]:
        zero = frozenset(self.zero_params)
        return {
            "own": modified_parameters(layer, _identity, zero) if zero else None,
            "positive": modified_parameters(layer, _positive_part, zero),
            "negative": modified_parameters(layer, _negative_part, zero),
        }

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        def bounds(bound: float | Tensor) -> list[Any]:
            # expanded views of the bound: no input-sized memory
            return _map_carrying(inputs, lambda value: expand_bound(bound, value).requires_grad_())

        lows, highs = bounds(self.low), bounds(self.high)
        if prepared["own"] is None:
            output = own = layer.forward(inputs)
        else:
            output, own = _original_output(layer, inputs), layer(inputs, *prepared["own"])
        # The bound terms are computed in backward, where they are used (as in ZPlus).
        return output, ([inputs, lows, highs], prepared, gradient_root(own), own)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        (inputs, lows, highs), prepared, own_root, own = state
        with torch.enable_grad():
            low_term, high_term = layer(lows, *prepared["positive"]), layer(highs, *prepared["negative"])
        scaled = _scaled(relevance, own.detach() - low_term.detach() - high_term.detach(), layer, self._stabilise)
        # one pass of autograd for the three terms (each reaches only its own leaves)
        shares = input_times_gradient([own_root, low_term, high_term], [*inputs, *lows, *highs], [scaled] * 3)
        count = len(inputs)
        from_inputs, from_lows, from_highs = shares[:count], shares[count:2 * count], shares[2 * count:]
        return tuple(
            None if value is None else value - low - high
            for value, low, high in zip(from_inputs, from_lows, from_highs, strict=True)
        )


class _UniformInput(Rule):
    r"""Rules that ignore the input's values: ``R_j = \sum_k \frac{m_{jk}}{s(\sum_j m_{jk})} R_k`` for
    modified weights ``m`` (and modified bias in the denominator), computed with an input of ones."""

    def __init__(self, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        self.stabilizer = stabilizer
        self.zero_params = sorted(zero_parameter_names(zero_params))
        self._stabilise = stabiliser_function(stabilizer)

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        # The layer on ones is computed in backward, where it is used (as in ZPlus).
        return _original_output(layer, inputs), (inputs, prepared)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs, prepared = state
        ones = _map_carrying(inputs, lambda value: torch.ones_like(value).requires_grad_())
        with torch.enable_grad():
            output = layer(ones, *prepared)
        # x_j = 1: the input-times-gradient product is the gradient itself.
        return input_times_gradient(output, ones, _scaled(relevance, output.detach(), layer, self._stabilise))


class Flat(_UniformInput):
    r"""The flat rule: relevance spread uniformly over each output's receptive field.

    .. math:: R_j = \sum_k \frac{1}{s\left(\sum_{j'} 1\right)} R_k

    where the sum runs over the inputs connected to output ``k`` (``f(1; 1, 0)``: all weights
    one, bias left out).
    """

    def prepare(self, layer: AffineLayer) -> Parameters:
        return modified_parameters(layer, torch.ones_like, frozenset(self.zero_params) | {"bias"})


class WSquare(_UniformInput):
    r"""The w^2 rule: relevance shared by squared weights, independent of the input.

    .. math:: R_j = \sum_k \frac{w_{jk}^2}{s\left(\sum_{j'} w_{j'k}^2 + b_k^2\right)} R_k

    As in zennit, the bias enters the denominator squared.
    """

    def prepare(self, layer: AffineLayer) -> Parameters:
        return modified_parameters(layer, torch.square, frozenset(self.zero_params))


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    return len(shape) <= len(target) and all(
        size in (1, wanted) for size, wanted in zip(reversed(shape), reversed(target), strict=False))


class Pass(Rule):
    r"""The identity rule: ``R_in = R_out`` (shared equally among several relevance-carrying
    inputs; summed back over broadcast dimensions). For operations whose output has the shape of
    its input, e.g. activations and BatchNorm, as zennit uses it."""

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        output = _original_output(layer, inputs)
        shapes = [value.shape if carries_relevance(value) else None for value in inputs]
        for shape in shapes:
            if shape is not None and not _broadcasts_to(shape, output.shape):
                raise ValueError(
                    f"the Pass rule hands relevance through unchanged, so it needs an output of the input's "
                    f"shape, but this operation maps {tuple(shape)} to {tuple(output.shape)}; "
                    "use Epsilon or Norm for it"
                )
        return output, shapes

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        receiving = sum(shape is not None for shape in state)
        return tuple(
            None if shape is None else (relevance / receiving).sum_to_size(shape) for shape in state
        )


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


class AttentionAsConstant(Rule):
    """CP-LRP for attention: the softmax's output is a constant, ``R(logits) = 0`` and products
    with the coefficients pass their relevance to the other factor unchanged."""

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        return layer.forward(inputs).detach(), None

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        raise RuntimeError("fxlrp: attention treated as a constant receives no relevance")

    def __repr__(self) -> str:
        return "AttentionAsConstant()"
