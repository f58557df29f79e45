"""The formulas of fxlrp's rules for JAX arrays: one function per rule type.

The rules are :mod:`fxlrp.rules`' objects; this module reads their parameters (``epsilon``,
``alpha``, ``beta``, ``gamma``, ``low``, ``high``, ``zero_params``) and computes their formulas
(see each rule's docstring there) on JAX arrays, with JAX's own vector-Jacobian products. A rule
is applied to a :class:`Layer`, the affine map ``z = f(x; w, b)`` of one group of jaxpr equations
(a ``dot_general`` or ``conv_general_dilated`` with its bias ``add``, a sum, a pooling).

Notation as in :mod:`fxlrp.rules`: ``x+ = max(x, 0)``, ``x- = min(x, 0)``, ``s(z) = z + eps
(sign(z) + [z = 0])``; relevance of an output with a zero denominator (``eps = 0``) is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fxlrp.rules import AlphaBeta, Epsilon, Flat, Gamma, Pass, Product, Rule, SoftmaxRule, WSquare, ZBox

Array = Any
"""A JAX array (or a value JAX takes as one)."""


@dataclass(frozen=True)
class Layer:
    """The affine map ``z = f(x; w, b)`` that a rule explains.

    Parameters
    ----------
    apply : callable
        ``apply(xs, w, b)``: the output for the relevance-carrying inputs ``xs`` (a sequence),
        the weight ``w`` and the bias (or constant addend) ``b``; ``w`` and ``b`` may be None.
    weight : array or None
        The layer's weight (a ``dot_general``'s or convolution's constant operand).
    bias : array or None
        The constant added to the output (a bias; the constant operand of ``x + c``).
    """

    apply: Callable[[Sequence[Array], Array | None, Array | None], Array] | None
    weight: Array | None
    bias: Array | None
    axes: tuple[int, ...] | None = None
    """The axes of a softmax."""
    nonnegative: tuple[bool, ...] = ()
    """Whether each input is known never to be negative (behind a ReLU): terms of ``x-`` are 0."""

    def __call__(self, xs: Sequence[Array], weight: Array | None, bias: Array | None) -> Array:
        return self.apply(xs, weight, bias)


def _zero_params(rule: Rule) -> frozenset[str]:
    return frozenset(getattr(rule, "zero_params", ()) or ())


def _params(layer: Layer, transform: Callable[[Array], Array], zero: frozenset[str]) -> tuple[Array, Array]:
    """The layer's parameters transformed, with those in ``zero`` set to 0 (zennit's ``zero_params``)."""

    def one(name: str, value: Array | None) -> Array | None:
        if value is None:
            return None
        return jnp.zeros_like(value) if name in zero else transform(value)

    return one("weight", layer.weight), one("bias", layer.bias)


def _epsilon(rule: Rule) -> float:
    value = getattr(rule, "epsilon", getattr(rule, "stabilizer", 0.0))
    if callable(value):
        raise TypeError(
            f"fxlrp.jax: {rule!r} has a stabiliser function written for torch tensors; give the rule a number "
            "(e.g. Epsilon(1e-6)) to use it with JAX"
        )
    return 0.0 if value is None else float(value)


def scaled(relevance: Array, denominator: Array, epsilon: float, sign: float | None = None) -> Array:
    r"""``R / s(z)``, 0 where the stabilised denominator is 0.

    .. math:: s(z) = z + \epsilon \cdot (\operatorname{sign}(z) + [z = 0])

    computed as ``z + copysign(eps, z)`` (``sign``: the sign ``z`` has by construction).

    Parameters
    ----------
    relevance : array
        The output relevance ``R``.
    denominator : array
        The denominator ``z``.
    epsilon : float
        The stabiliser's ``epsilon``.
    sign : float, optional
        ``+1`` or ``-1`` when ``z >= 0`` or ``z <= 0`` by construction.

    Returns
    -------
    array
        The quotient.
    """
    if epsilon != 0.0:
        step = sign * epsilon if sign is not None else jnp.copysign(jnp.asarray(epsilon, denominator.dtype),
                                                                     denominator)
        denominator = denominator + step
    zero = denominator == 0
    return jnp.where(zero, 0.0, relevance / jnp.where(zero, 1.0, denominator)).astype(relevance.dtype)


def pulled_back(layer: Layer, xs: Sequence[Array], weight: Array | None, bias: Array | None,
                quotient: Array) -> list[Array]:
    """``x * J^T q`` for each input: the contributions of ``f(x; w, b)`` weighted by ``q``.

    Parameters
    ----------
    layer : Layer
        The affine map.
    xs : sequence of array
        The points the inputs take (the inputs, their positive or negative parts, bounds, ones).
    weight, bias : array or None
        The (modified) parameters.
    quotient : array
        ``q``, of the output's shape.

    Returns
    -------
    list of array
        ``x_j * sum_k (d f_k / d x_j) q_k`` for each input.
    """
    _, vjp = jax.vjp(lambda *values: layer(values, weight, bias), *xs)
    return [x * g for x, g in zip(xs, vjp(quotient), strict=True)]


def epsilon_rule(rule: Epsilon, layer: Layer, xs: Sequence[Array], output: Array, relevance: Array) -> list[Array]:
    r"""The epsilon rule (LRP-0, Norm, Product: divided among ``N`` relevance-carrying factors).

    .. math:: R_j = \frac{1}{N} \sum_k \frac{x_j w_{jk}}{s(z_k)} R_k, \qquad z = f(x; w, b)

    With ``zero_params``, ``z`` and the weights are those of the modified layer.
    """
    zero = _zero_params(rule)
    weight, bias = _params(layer, lambda value: value, zero) if zero else (layer.weight, layer.bias)
    denominator = layer(xs, weight, bias) if zero else output
    shares = pulled_back(layer, xs, weight, bias, scaled(relevance, denominator, _epsilon(rule)))
    if isinstance(rule, Product) and len(xs) > 1:
        shares = [share / len(xs) for share in shares]
    return shares


def _positive(value: Array) -> Array:
    return jnp.maximum(value, 0)


def _negative(value: Array) -> Array:
    return jnp.minimum(value, 0)


def two_halves_rule(rule: AlphaBeta | Gamma, layer: Layer, xs: Sequence[Array], output: Array,
                    relevance: Array) -> list[Array]:
    r"""Alpha-beta, z+ and gamma: two halves of the contributions, normalised separately.

    With transforms "more" ``w^>`` and "less" ``w^<`` (alpha-beta: ``w+``, ``w-``; gamma:
    ``w + gamma w+``, ``w + gamma w-``), the halves are
    ``z^1 = f(x+; w^>, b^>) + f(x-; w^<, 0)`` and ``z^2 = f(x+; w^<, b^<) + f(x-; w^>, 0)``, and

    .. math::
        R_j = \sum_k \left(c^1_k \frac{(x_j w_{jk})^1}{s(z^1_k)} + c^2_k \frac{(x_j w_{jk})^2}{s(z^2_k)}\right) R_k

    with weights ``c = (alpha, -beta)`` for alpha-beta and ``c = ([z > 0], [z < 0])`` for gamma.
    """
    zero = _zero_params(rule)
    epsilon = _epsilon(rule)
    if isinstance(rule, Gamma):
        gamma = rule.gamma
        more, less = (lambda value: value + gamma * _positive(value)), (lambda value: value + gamma * _negative(value))
        weights: tuple[Any, Any] = (output > 0, output < 0)
        signs: tuple[float | None, float | None] = (None, None)
    else:
        more, less = _positive, _negative
        weights = (rule.alpha, -rule.beta if rule.beta != 0 else None)
        signs = (1.0, -1.0)
    # Inputs behind a ReLU have no negative part: its terms are 0 and are not computed.
    skip_negative = bool(layer.nonnegative) and all(layer.nonnegative)
    positive_inputs = list(xs) if skip_negative else [_positive(x) for x in xs]
    negative_inputs = [_negative(x) for x in xs]
    shares = [jnp.zeros_like(x) for x in xs]
    for weight, sign, for_positive, for_negative in zip(weights, signs, (more, less), (less, more), strict=True):
        if weight is None:
            continue
        positive_params = _params(layer, for_positive, zero)
        negative_params = _params(layer, for_negative, zero | {"bias"})
        total = layer(positive_inputs, *positive_params)
        if not skip_negative:
            total = total + layer(negative_inputs, *negative_params)
        quotient = scaled(relevance, total, epsilon, sign) * weight
        from_positive = pulled_back(layer, positive_inputs, *positive_params, quotient)
        from_negative = [0.0] * len(xs) if skip_negative else pulled_back(layer, negative_inputs, *negative_params,
                                                                           quotient)
        shares = [share + a + b for share, a, b in zip(shares, from_positive, from_negative, strict=True)]
    return shares


def z_box_rule(rule: ZBox, layer: Layer, xs: Sequence[Array], output: Array, relevance: Array) -> list[Array]:
    r"""The z^B rule for inputs bounded by ``l <= x <= h``.

    .. math::
        R_j = \sum_k \frac{x_j w_{jk} - l_j w_{jk}^+ - h_j w_{jk}^-}{s(z_k)} R_k,
        \qquad z = f(x; w, b) - f(l; w^+, b^+) - f(h; w^-, b^-)

    The bounds broadcast NumPy-style against the input (per channel of an NHWC image: shape
    ``(1, 1, 1, C)``).
    """
    zero = _zero_params(rule)
    epsilon = _epsilon(rule)
    own = _params(layer, lambda value: value, zero) if zero else (layer.weight, layer.bias)
    positive, negative = _params(layer, _positive, zero), _params(layer, _negative, zero)
    lows = [jnp.broadcast_to(jnp.asarray(np.asarray(rule.low), x.dtype), x.shape) for x in xs]
    highs = [jnp.broadcast_to(jnp.asarray(np.asarray(rule.high), x.dtype), x.shape) for x in xs]
    own_output = layer(xs, *own) if zero else output
    denominator = own_output - layer(lows, *positive) - layer(highs, *negative)
    quotient = scaled(relevance, denominator, epsilon)
    from_inputs = pulled_back(layer, xs, *own, quotient)
    from_lows = pulled_back(layer, lows, *positive, quotient)
    from_highs = pulled_back(layer, highs, *negative, quotient)
    return [a - b - c for a, b, c in zip(from_inputs, from_lows, from_highs, strict=True)]


def input_independent_rule(rule: Flat | WSquare, layer: Layer, xs: Sequence[Array], output: Array,
                           relevance: Array) -> list[Array]:
    r"""Flat and w^2: the relevance shared by modified weights ``m``, whatever the input.

    .. math:: R_j = \sum_k \frac{m_{jk}}{s\left(\sum_{j'} m_{j'k} + b'_k\right)} R_k

    with ``m = 1, b' = 0`` (flat) or ``m = w^2, b' = b^2`` (w^2), computed on an input of ones.
    """
    zero = _zero_params(rule)
    if isinstance(rule, Flat):
        # Flat's weights and denominator depend on shapes only: computed once while tracing, they
        # are constants of the compiled explanation (unless the layer holds values known only when
        # it runs).
        with jax.ensure_compile_time_eval():
            ones = [jnp.ones(np.shape(x), jnp.result_type(x)) for x in xs]
            bias = None
            weight = None if layer.weight is None else \
                jnp.full(np.shape(layer.weight), 0.0 if "weight" in zero else 1.0, jnp.result_type(layer.weight))
            on_ones = None if weight is None else layer(ones, weight, bias)
    else:
        ones = [jnp.ones_like(x) for x in xs]
        weight, bias = _params(layer, jnp.square, zero)
        on_ones = None if weight is None else layer(ones, weight, bias)
    if weight is None:
        raise ValueError(f"fxlrp.jax: {rule!r} needs a layer with weights; this operation has none")
    return pulled_back(layer, ones, weight, bias, scaled(relevance, on_ones, _epsilon(rule)))


def unbroadcast(relevance: Array, shape: tuple[int, ...]) -> Array:
    """``relevance`` summed over the dimensions along which an input of ``shape`` was broadcast.

    Parameters
    ----------
    relevance : array
        Relevance of the output's shape.
    shape : tuple of int
        The input's shape.

    Returns
    -------
    array
        Relevance of ``shape``.
    """
    extra = relevance.ndim - len(shape)
    if extra:
        relevance = relevance.sum(axis=tuple(range(extra)))
    axes = tuple(axis for axis, size in enumerate(shape) if size == 1 and relevance.shape[axis] != 1)
    return relevance.sum(axis=axes, keepdims=True) if axes else relevance


def pass_rule(rule: Pass | None, layer: Layer | None, xs: Sequence[Array], output: Array,
              relevance: Array) -> list[Array]:
    r"""The identity rule: ``R_in = R_out / N`` for ``N`` relevance-carrying inputs.

    .. math:: R_j = \frac{1}{N} \sum_{k \text{ broadcast from } j} R_k
    """
    return [unbroadcast(relevance, x.shape) / len(xs) for x in xs]


def softmax_rule(rule: SoftmaxRule, layer: Layer, xs: Sequence[Array], output: Array,
                 relevance: Array) -> list[Array]:
    r"""AttnLRP's softmax rule, the softmax linearised at its input (over the softmax's axes).

    .. math:: R_{x_i} = x_i \left(R_i - s_i \sum_j R_j\right), \qquad s = \operatorname{softmax}(x)

    Inputs of ``-inf`` (masked positions) get no relevance.
    """
    x = xs[0]
    share = x * (relevance - output * relevance.sum(axis=layer.axes, keepdims=True))
    return [jnp.where(jnp.isfinite(x), share, 0.0)]


FORMULAS: list[tuple[type[Rule], Callable[..., list[Array]]]] = [
    (SoftmaxRule, softmax_rule),
    (ZBox, z_box_rule),
    (AlphaBeta, two_halves_rule),  # ZPlus too
    (Gamma, two_halves_rule),
    (Flat, input_independent_rule),
    (WSquare, input_independent_rule),
    (Pass, pass_rule),
    (Epsilon, epsilon_rule),  # LRP-0, Norm, Product
]
"""Rule type -> formula ``(rule, layer, xs, output, relevance) -> relevance of xs``; the first
type the rule is an instance of applies."""


def formula_of(rule: Rule) -> Callable[..., list[Array]]:
    """The JAX formula of ``rule``.

    Parameters
    ----------
    rule : Rule
        One of :mod:`fxlrp.rules`' rules.

    Returns
    -------
    callable
        ``formula(rule, layer, xs, output, relevance)``.

    Raises
    ------
    NotImplementedError
        For a rule type with no JAX formula (the attention rules, a rule of your own).
    """
    for kind, formula in FORMULAS:
        if isinstance(rule, kind):
            return formula
    raise NotImplementedError(
        f"fxlrp.jax has no formula for {type(rule).__name__} yet (it has: "
        f"{', '.join(kind.__name__ for kind, _ in FORMULAS)} and their subclasses); choose one of those for this "
        "operation in the composite"
    )
