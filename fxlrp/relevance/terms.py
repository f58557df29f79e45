"""The term engine the LRP rules are declared over.

A rule's formula is a sum of *terms*: the layer ``f(x; w, b)`` run on modified inputs (``x+``,
``x-``, ones, bounds) with modified parameters (``w+``, ``w-``, ``w + gamma w+``, ``w^2``),
each normalised by a stabilised denominator and pulled back to the inputs as
``R_j = x_j * sum_k dterm_k/dx_j * s_k`` with the native vector-Jacobian product. This module
holds those pieces; :mod:`fxlrp.rules` says, per rule, which terms and how they combine.

Cost rules of the engine: parameter transforms are made once per conversion and only when a
term needs them (:class:`ParameterVariants`); a term that is 0 for the given input (the ``x-``
terms behind a ReLU) is not computed; terms are computed in backward, where they are used, so no
activation-sized term is held from forward to backward; stabiliser and quotient are written into
buffers the term owns; the VJPs of all terms run in one autograd call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import carries_relevance, gradient_root, graph_reused, writable_recomputation
from fxlrp.relevance.stabilise import divide_dropping_zeros, stabilise
from fxlrp.relevance.tracing import values_are_traced

Parameters = tuple[Tensor | None, Tensor | None]
"""``(weight, bias)`` of a modified copy of a layer."""


@dataclass(frozen=True)
class LayerGradient:
    """A rule's gradient root where the layer gives its vector-Jacobian product in closed form
    (:attr:`AffineLayer.input_gradient`, with the layer's own weight): no inner graph is kept."""

    layer: AffineLayer

    def of(self, gradient: Tensor) -> Tensor:
        return self.layer.input_gradient(gradient, self.layer.weight)


Root = Tensor | GradientEdge | LayerGradient
"""Where a vector-Jacobian product starts: an output, or its gradient edge (which does not keep
the output's values alive), or the layer's own product in closed form (:class:`LayerGradient`)."""
ZeroParams = str | Iterable[str] | None
PARAMETER_NAMES = ("weight", "bias")


@dataclass(frozen=True)
class Stabiliser:
    """The denominator's stabiliser ``s(z)``: zennit's ``z + eps (sign(z) + [z = 0])`` for a number
    ``epsilon``, or any function ``z -> s(z)`` (then ``epsilon`` is None)."""

    epsilon: float | None
    function: Callable[[Tensor], Tensor] | None = None

    @classmethod
    def of(cls, stabiliser: float | Callable[[Tensor], Tensor]) -> Stabiliser:
        if callable(stabiliser):
            return cls(None, stabiliser)
        if isinstance(stabiliser, bool) or not isinstance(stabiliser, (int, float)):
            raise TypeError(f"a stabiliser is a number or a function of the denominator, not {stabiliser!r}")
        return cls(float(stabiliser))

    def __call__(self, denominator: Tensor) -> Tensor:
        return self.function(denominator) if self.function is not None else stabilise(denominator, self.epsilon)


def zero_parameter_names(zero_params: ZeroParams) -> frozenset[str]:
    """zennit's ``zero_params`` as a set of names, checked against the parameters layers have."""
    names = frozenset() if zero_params is None else frozenset(
        [zero_params] if isinstance(zero_params, str) else zero_params)
    unknown = names - set(PARAMETER_NAMES)
    if unknown:
        raise ValueError(f"zero_params may name {PARAMETER_NAMES}, got {sorted(unknown)}")
    return names


def identity(tensor: Tensor) -> Tensor:
    return tensor


def positive_part(tensor: Tensor) -> Tensor:
    return tensor.clamp(min=0)


def negative_part(tensor: Tensor) -> Tensor:
    return tensor.clamp(max=0)


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
    ``prepare`` returns one per layer (cached per conversion), so that copies a call never needs
    (the ``w-`` of z+ behind a ReLU) cost neither time nor memory.
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


def map_carrying(inputs: Sequence[Any], transform: Callable[[Tensor], Tensor]) -> list[Any]:
    """Apply ``transform`` to the relevance-carrying inputs; constants stay as they are."""
    return [transform(value) if carries_relevance(value) else value for value in inputs]


def has_negative_inputs(inputs: Sequence[Any]) -> bool:
    """Whether any ``x-`` term can be non-zero (behind a ReLU none can, and none is computed).
    One read-only reduction per input (a comparison would first write a mask of the input's size).
    Traced for compilation (:mod:`fxlrp.relevance.tracing`) the ``x-`` terms are kept: zeros here."""
    if values_are_traced():
        return any(carries_relevance(value) for value in inputs)
    return any(value.numel() > 0 and bool(value.amin() < 0) for value in inputs if carries_relevance(value))


def split_inputs(inputs: Sequence[Any], has_negative: bool) -> tuple[Sequence[Any], Sequence[Any] | None]:
    """``(x+, x-)`` under autograd. Without negative inputs (behind a ReLU) ``x+`` is the inputs
    themselves, which saves a copy of each input, its clamp and the clamp's backward, and ``x-``
    is None: its terms are 0 and not computed."""
    if not has_negative:
        return inputs, None
    with torch.enable_grad():
        return map_carrying(inputs, positive_part), map_carrying(inputs, negative_part)


def signed_terms(
    layer: AffineLayer, split: tuple[Sequence[Any], Sequence[Any] | None], variants: ParameterVariants,
    for_positive: str, for_negative: str,
) -> list[Tensor]:
    """``f(x+; p)`` and, with negative inputs, ``f(x-; n)`` under autograd, for the parameter
    variants named ``for_positive`` (p) and ``for_negative`` (n): the terms of a half of the
    contributions (z+, each alpha-beta or gamma half), computed in backward where they are used."""
    positive_inputs, negative_inputs = split
    with torch.enable_grad():
        terms = [layer(positive_inputs, *variants[for_positive])]
        if negative_inputs is not None:
            terms.append(layer(negative_inputs, *variants[for_negative]))
    return terms


def total(terms: Sequence[Tensor]) -> Tensor:
    """The sum of the terms' values (no copy for a single term)."""
    return terms[0].detach() if len(terms) == 1 else sum(term.detach() for term in terms)


def output_and_root(layer: AffineLayer, inputs: Sequence[Any]) -> tuple[Tensor, Root]:
    """The layer's output and where :func:`input_times_gradient` starts from for it: the
    layer's own vector-Jacobian product where it has one in closed form and the first input is
    the only one carrying relevance (computed without an inner graph), else the output's
    gradient edge. Not under autocast, whose casts the inner graph records."""
    if (layer.input_gradient is not None and carries_relevance(inputs[0])
            and not any(carries_relevance(value) for value in inputs[1:])
            and not torch.is_autocast_enabled(inputs[0].device.type)):
        with torch.no_grad():
            return layer.forward(inputs), LayerGradient(layer)
    output = layer.forward(inputs)
    return output, gradient_root(output)


def original_output(layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
    """The layer's own output, where a rule's terms are modified copies (no graph needed)."""
    with torch.no_grad():
        return layer.forward(inputs)


def scaled(
    relevance: Tensor, denominator: Tensor, stabiliser: Stabiliser, *, sign: float | None = None,
    owned: bool = False, warn_lost_relevance: bool = False,
) -> Tensor:
    """``s = R / stabiliser(z)``; relevance of a zero denominator is dropped.

    A stabiliser with ``epsilon > 0`` never gives 0 (``|z| + epsilon``), so the zero check, a
    pass over the output and a host synchronisation per layer, is skipped for it (unless the
    dtype flushes epsilon). ``sign``: ``+1`` (``-1``) when ``z >= 0`` (``z <= 0``) by
    construction - the positive (negative) contributions of z+ and alpha-beta, an output a ReLU
    rectified - so the stabiliser is ``z + epsilon`` (``z - epsilon``) in one pass: zennit's value
    for ``z != 0``; an output of exactly 0 has only zero contributions, which get 0 either way.
    ``owned``: ``denominator`` is the rule's own term, computed in backward and read by nothing
    else, so stabiliser and quotient are written into it.
    """
    epsilon = stabiliser.epsilon or 0.0
    if sign is not None and epsilon > 0.0 and torch.finfo(denominator.dtype).max * epsilon < 1.0:
        # float16: R / epsilon overflows for R > 0.07 (epsilon 1e-6), and the pull-back's Inf x 0
        # (a weight whose positive part is 0) is NaN. An output of exactly 0 has only zero
        # contributions here, so its relevance is lost whatever the quotient: it is dropped.
        zero = denominator == 0
        return (relevance / (denominator + sign * epsilon)).masked_fill_(zero, 0.0)
    if epsilon < torch.finfo(denominator.dtype).tiny:  # no epsilon, a function, or flushed in this dtype
        return divide_dropping_zeros(relevance, stabiliser(denominator), warn_lost_relevance)
    if sign is None:
        stabilised = stabiliser(denominator)
    else:
        stabilised = denominator.add_(sign * epsilon) if owned else denominator + sign * epsilon
    if (stabilised.shape != relevance.shape or stabilised.dtype != relevance.dtype or stabilised.requires_grad
            or values_are_traced()):  # a compiler plans buffers itself, and out= keeps layouts it may not infer
        return relevance / stabilised
    # The denominator is a fresh tensor: the quotient overwrites it, so that backward's peak holds
    # one activation-sized buffer fewer (the largest layers set the peak).
    return torch.div(relevance, stabilised, out=stabilised)


def input_times_gradient(
    output: Root | Sequence[Root], inputs: Sequence[Any], scaled_relevance: Tensor | Sequence[Tensor]
) -> tuple[Tensor | None, ...]:
    """``R_j = x_j * sum_k w_jk s_k`` for each relevance-carrying input, with the native VJP (or the
    layer's own, :class:`LayerGradient`).

    ``output`` (a tensor or its gradient edge) and ``scaled_relevance`` may be sequences (one
    ``s`` per term of a formula); the gradients of all terms are summed by autograd in one call.
    ``scaled_relevance`` must be the caller's own fresh tensors (as :func:`scaled` makes them):
    the products may be written into them.
    """
    carrying = [value for value in inputs if carries_relevance(value)]
    if isinstance(output, LayerGradient):
        gradients = (output.of(scaled_relevance),)
    else:
        # A graph reused for several explanations (reusable_graph) keeps the inner graph for the next.
        gradients = torch.autograd.grad(output, carrying, scaled_relevance, retain_graph=graph_reused())
    products = iter(
        gradient.mul_(value) if in_place else _product(value, gradient)
        for value, gradient, in_place in zip(carrying, gradients, _writable(gradients), strict=True)
    )
    return tuple(next(products) if carries_relevance(value) else None for value in inputs)


def _product(value: Tensor, gradient: Tensor) -> Tensor:
    """``value * gradient``, written into ``value`` where it was recomputed for this rule alone
    (the activation before an MLP's second layer): one input-sized buffer less at backward's peak."""
    own = writable_recomputation(value)
    if own is not None and not values_are_traced() and (own.shape, own.dtype) == (gradient.shape, gradient.dtype):
        return own.mul_(gradient)
    return value * gradient


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


def shared_equally(relevance: Tensor, shares: Sequence[float], shapes: Sequence[torch.Size | None]) -> tuple:
    """The identity rule's relevance: ``share * R`` for each receiving input (share 0: None),
    summed back over the dimensions it was broadcast along."""
    return tuple(
        None if share == 0.0 or shape is None else (relevance * share if share != 1.0 else relevance).sum_to_size(shape)
        for share, shape in zip(shares, shapes, strict=True)
    )
