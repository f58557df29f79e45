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
from fxlrp.relevance.stabilise import constant_like, divide_dropping_zeros, stabilise
from fxlrp.relevance.tracing import values_are_traced, values_read_on_host

Parameters = tuple[Tensor | None, Tensor | None]
"""``(weight, bias)`` of a modified copy of a layer."""


@dataclass(frozen=True)
class LayerGradient:
    """A rule's gradient root where the layer gives its vector-Jacobian product in closed form.

    The product is :attr:`AffineLayer.input_gradient`, with the layer's own weight or a rule's
    modified one (``w+``, ``w + gamma w+``, ones), of a term computed on the whole input or on
    its positive or negative part, for each relevance-carrying input (a weighted layer has one;
    a sum may have several): no inner graph is kept.
    """

    layer: AffineLayer
    """The layer, which has an ``input_gradient``."""
    weight: Tensor | None = None
    """The weight of the term (a rule's modified one); None for the layer's own."""
    part: float | None = None
    """The part of the input the term was computed on: ``+1.0`` for ``x+``, ``-1.0`` for ``x-``;
    None for the whole input."""

    def of(self, gradient: Tensor, input: Tensor) -> Tensor:
        """The gradient of the term's input.

        Parameters
        ----------
        gradient : Tensor
            The gradient of the term's output.
        input : Tensor
            The layer's input (for its shape and layout).

        Returns
        -------
        Tensor
            ``input_gradient(gradient, weight, input)``.
        """
        weight = self.layer.weight if self.weight is None else self.weight
        return self.layer.input_gradient(gradient, weight, input)


Root = Tensor | GradientEdge | LayerGradient
"""Where a vector-Jacobian product starts: an output, or its gradient edge (which does not keep
the output's values alive), or the layer's own product in closed form (:class:`LayerGradient`)."""
ZeroParams = str | Iterable[str] | None
"""zennit's ``zero_params``: ``"weight"``, ``"bias"``, both, or None."""
PARAMETER_NAMES = ("weight", "bias")


@dataclass(frozen=True)
class Stabiliser:
    """The denominator's stabiliser ``s(z)``.

    zennit's ``z + eps (sign(z) + [z = 0])`` for a number ``epsilon``, or any function
    ``z -> s(z)`` (then ``epsilon`` is None).
    """

    epsilon: float | None
    """The number ``eps``; None for a function."""
    function: Callable[[Tensor], Tensor] | None = None
    """The function ``z -> s(z)``; None for a number."""

    @classmethod
    def of(cls, stabiliser: float | Callable[[Tensor], Tensor]) -> Stabiliser:
        """The stabiliser a rule was given.

        Parameters
        ----------
        stabiliser : float or callable
            A number ``eps`` or a function ``z -> s(z)``.

        Returns
        -------
        Stabiliser
            The stabiliser.

        Raises
        ------
        TypeError
            If ``stabiliser`` is neither (a bool, a string, ...).
        """
        if callable(stabiliser):
            return cls(None, stabiliser)
        if isinstance(stabiliser, bool) or not isinstance(stabiliser, (int, float)):
            raise TypeError(f"a stabiliser is a number or a function of the denominator, not {stabiliser!r}")
        return cls(float(stabiliser))

    def __call__(self, denominator: Tensor) -> Tensor:
        """``s(z)``.

        Parameters
        ----------
        denominator : Tensor
            The denominator ``z``.

        Returns
        -------
        Tensor
            The stabilised denominator.
        """
        return self.function(denominator) if self.function is not None else stabilise(denominator, self.epsilon)


def zero_parameter_names(zero_params: ZeroParams) -> frozenset[str]:
    """zennit's ``zero_params`` as a set of names, checked against the parameters layers have.

    Parameters
    ----------
    zero_params : str, iterable of str or None
        ``"weight"``, ``"bias"``, both, or None.

    Returns
    -------
    frozenset of str
        The names.

    Raises
    ------
    ValueError
        If a name is neither ``"weight"`` nor ``"bias"``.
    """
    names = frozenset() if zero_params is None else frozenset(
        [zero_params] if isinstance(zero_params, str) else zero_params)
    unknown = names - set(PARAMETER_NAMES)
    if unknown:
        raise ValueError(f"zero_params may name {PARAMETER_NAMES}, got {sorted(unknown)}")
    return names


def identity(tensor: Tensor) -> Tensor:
    """The parameter transform that leaves parameters as they are.

    Parameters
    ----------
    tensor : Tensor
        A parameter.

    Returns
    -------
    Tensor
        ``tensor``.
    """
    return tensor


def positive_part(tensor: Tensor) -> Tensor:
    """``x+ = max(x, 0)``.

    Parameters
    ----------
    tensor : Tensor
        A parameter or an input.

    Returns
    -------
    Tensor
        Its positive part.
    """
    return tensor.clamp(min=0)


def negative_part(tensor: Tensor) -> Tensor:
    """``x- = min(x, 0)``.

    Parameters
    ----------
    tensor : Tensor
        A parameter or an input.

    Returns
    -------
    Tensor
        Its negative part.
    """
    return tensor.clamp(max=0)


def modified_parameters(
    layer: AffineLayer, transform: Callable[[Tensor], Tensor], zero: frozenset[str] = frozenset()
) -> Parameters:
    """``(weight, bias)`` of ``layer`` with ``transform`` applied.

    Parameters
    ----------
    layer : AffineLayer
        The layer whose own parameters are modified.
    transform : callable
        Applied to weight and bias.
    zero : frozenset of str, optional
        Names of the parameters that become zeros instead.

    Returns
    -------
    tuple of (Tensor or None)
        The modified ``(weight, bias)``; a missing parameter (``bias=None``) stays missing.
    """

    def modify(name: str, tensor: Tensor | None) -> Tensor | None:
        if tensor is None:
            return None
        return torch.zeros_like(tensor) if name in zero else transform(tensor)

    return modify("weight", layer.weight), modify("bias", layer.bias)


class ParameterVariants:
    """Modified copies of a layer's parameters by name, each made on first use and then kept.

    A rule's ``prepare`` returns one per layer (cached per conversion), so that copies a call
    never needs (the ``w-`` of z+ behind a ReLU) cost neither time nor memory. ``variants[name]``
    gives the ``(weight, bias)`` of a name.

    Parameters
    ----------
    layer : AffineLayer
        The layer whose parameters are modified.
    recipes : dict
        Maps a name to ``(transform, zero)`` for :func:`modified_parameters`.
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

    def shifted(self, name: str, shift: float) -> Parameters:
        """The variant ``name`` with ``shift`` added to its bias (a bias of ``shift`` where it has
        none), made on first use and then kept: the layer's output then holds a stabiliser
        (:func:`stabilising_shift`).

        Only for the layers whose product has a closed form (:func:`has_layer_gradient`): linear
        layers and convolutions, whose bias has one entry per row of the weight.

        Parameters
        ----------
        name : str
            The variant.
        shift : float
            What is added to its bias.

        Returns
        -------
        tuple of Tensor
            ``(weight, bias + shift)``.
        """
        key = f"{name} shifted by {shift!r}"
        if key not in self._made:
            weight, bias = self[name]
            self._made[key] = weight, _shifted_bias(weight, bias, shift)
        return self._made[key]

    def stacked(self, halves: Sequence[tuple[str, float]]) -> Parameters:
        """The variants of ``halves``, ``(name, shift)`` each, with the shift added to the bias as in
        :meth:`shifted`, as one weight and one bias of their rows stacked in order; made on first
        use and then kept (the variants themselves are not kept).

        The layer run on them computes every variant's output in one operation, stacked along
        :attr:`~fxlrp.relevance.AffineLayer.output_rows_dim` (only for layers that have one), and
        its vector-Jacobian product in that weight sums the products of the variants.

        Parameters
        ----------
        halves : sequence of (str, float)
            The variants' names and shifts.

        Returns
        -------
        tuple of Tensor
            ``(cat(weights), cat(biases + shifts))``.
        """
        key = ("stacked", tuple(halves))
        if key not in self._made:
            weights, biases = [], []
            for name, shift in halves:
                weight, bias = self._made.get(name) or modified_parameters(self._layer, *self._recipes[name])
                weights.append(weight)
                biases.append(_shifted_bias(weight, bias, shift))
            self._made[key] = torch.cat(weights), torch.cat(biases)
            rows = 0
            for index, weight in enumerate(weights):  # (each variant's rows, views made once)
                self._made[key + (index,)] = tuple(tensor.narrow(0, rows, len(weight)) for tensor in self._made[key])
                rows += len(weight)
        return self._made[key]

    def stacked_part(self, halves: Sequence[tuple[str, float]], index: int) -> Parameters:
        """The rows of the variant ``halves[index]`` in :meth:`stacked`'s parameters (views of
        them: no copy of its own).

        Parameters
        ----------
        halves : sequence of (str, float)
            The variants' names and shifts, as given to :meth:`stacked`.
        index : int
            Which of them.

        Returns
        -------
        tuple of Tensor
            Its ``(weight, bias + shift)``.
        """
        self.stacked(halves)
        return self._made[("stacked", tuple(halves), index)]


def _shifted_bias(weight: Tensor, bias: Tensor | None, shift: float) -> Tensor:
    """``bias + shift``; a bias of ``shift`` (one entry per row of the weight; a 1-D weight's linear
    map gives one number) where there is none."""
    return weight.new_full(weight.shape[:1] if weight.dim() > 1 else (), shift) if bias is None else bias + shift


def map_carrying(inputs: Sequence[Any], transform: Callable[[Tensor], Tensor]) -> list[Any]:
    """Apply ``transform`` to the relevance-carrying inputs; constants stay as they are.

    Parameters
    ----------
    inputs : sequence
        The operation's inputs.
    transform : callable
        Applied to each relevance-carrying input.

    Returns
    -------
    list
        The inputs, transformed where they carry relevance.
    """
    return [transform(value) if carries_relevance(value) else value for value in inputs]


def has_negative_inputs(inputs: Sequence[Any]) -> bool:
    """Whether any ``x-`` term can be non-zero (behind a ReLU none can, and none is computed).

    One read-only reduction per input (a comparison would first write a mask of the input's size).
    Where values are not read on the host (:func:`~fxlrp.relevance.tracing.values_read_on_host`:
    on a GPU, while traced for compilation) the ``x-`` terms are kept: zeros here.

    Parameters
    ----------
    inputs : sequence
        The operation's inputs.

    Returns
    -------
    bool
        True if some relevance-carrying input has a negative value (always where values are not read).
    """
    carrying = [value for value in inputs if carries_relevance(value)]
    if not all(values_read_on_host(value) for value in carrying):
        return bool(carrying)
    return any(value.numel() > 0 and bool(value.amin() < 0) for value in carrying)


def split_inputs(
    inputs: Sequence[Any], has_negative: bool, graph: bool = True
) -> tuple[Sequence[Any], Sequence[Any] | None]:
    """``(x+, x-)``, under autograd where ``graph``.

    Parameters
    ----------
    inputs : sequence
        The operation's inputs.
    has_negative : bool
        What :func:`has_negative_inputs` said of them.
    graph : bool, default True
        Whether the terms are computed on an inner graph (False: in closed form,
        :func:`signed_terms`), whose leaves the parts then come from.

    Returns
    -------
    positive : sequence
        ``x+``; without negative inputs (behind a ReLU) the inputs themselves, which saves a
        copy of each input, its clamp and the clamp's backward.
    negative : sequence or None
        ``x-``; None without negative inputs: its terms are 0 and not computed.
    """
    if not has_negative:
        return inputs, None
    with torch.enable_grad() if graph else torch.no_grad():
        return map_carrying(inputs, positive_part), map_carrying(inputs, negative_part)


def signed_terms(
    layer: AffineLayer, split: tuple[Sequence[Any], Sequence[Any] | None], variants: ParameterVariants,
    for_positive: str, for_negative: str, closed: bool = False, shift: float | None = None,
) -> tuple[list[Root], Tensor]:
    """The terms of a half of the contributions, ``f(x+; p)`` and ``f(x-; n)``, and their sum.

    The halves are those of z+, alpha-beta or gamma; they are computed in backward, where they
    are used.

    Parameters
    ----------
    layer : AffineLayer
        The layer.
    split : tuple
        ``(x+, x-)`` from :func:`split_inputs`.
    variants : ParameterVariants
        The layer's parameter variants.
    for_positive : str
        The name of the variant ``p`` applied to ``x+``.
    for_negative : str
        The name of the variant ``n`` applied to ``x-``.
    closed : bool, default False
        Whether the layer's vector-Jacobian product is taken in closed form
        (:func:`has_layer_gradient`): the terms are then computed without autograd, and each is
        represented by the :class:`LayerGradient` of its weight and part of the input.
    shift : float, optional
        In closed form, a stabiliser the first term's bias adds (:func:`stabilising_shift`).

    Returns
    -------
    roots : list of Root
        Where the pull-back of each term starts: ``f(x+; p)``, and ``f(x-; n)`` after it where
        there are negative inputs (the terms under autograd, or their :class:`LayerGradient`).
    denominator : Tensor
        The sum of the terms' values, out of autograd's records: the term itself for a single
        term in a backward that records nothing (the rule then writes its stabiliser and
        quotient into it, which the term's own gradient does not read), else a fresh sum.
    """
    positive_inputs, negative_inputs = split
    if closed:
        with torch.no_grad():
            denominator = layer(positive_inputs, *(
                variants[for_positive] if shift is None else variants.shifted(for_positive, shift)))
            roots: list[Root] = [LayerGradient(layer, variants[for_positive][0],
                                               None if negative_inputs is None else 1.0)]
            if negative_inputs is not None:
                denominator = denominator.add_(layer(negative_inputs, *variants[for_negative]))
                roots.append(LayerGradient(layer, variants[for_negative][0], -1.0))
        return roots, denominator
    with torch.enable_grad():
        terms = [layer(positive_inputs, *variants[for_positive])]
        if negative_inputs is not None:
            terms.append(layer(negative_inputs, *variants[for_negative]))
    if torch.is_grad_enabled():  # (a backward that records, create_graph=True)
        return terms, terms[0].detach() if len(terms) == 1 else sum(term.detach() for term in terms)
    summed = terms[0]
    for term in terms[1:]:
        summed = summed + term
    return terms, summed


def output_and_root(layer: AffineLayer, inputs: Sequence[Any]) -> tuple[Tensor, Root]:
    """The layer's output and where :func:`input_times_gradient` starts from for it.

    Parameters
    ----------
    layer : AffineLayer
        The layer.
    inputs : sequence
        Its inputs.

    Returns
    -------
    output : Tensor
        The layer's output.
    root : Root
        The layer's own vector-Jacobian product (:class:`LayerGradient`) where
        :func:`has_layer_gradient` (the output is then computed without an inner graph), else the
        output's gradient edge.
    """
    if has_layer_gradient(layer, inputs):
        with torch.no_grad():
            return layer.forward(inputs), LayerGradient(layer)
    output = layer.forward(inputs)
    return output, gradient_root(output)


def has_layer_gradient(layer: AffineLayer, inputs: Sequence[Any]) -> bool:
    """Whether :func:`output_and_root` takes the layer's own vector-Jacobian product in closed
    form (:class:`LayerGradient`) and builds no inner graph.

    Parameters
    ----------
    layer : AffineLayer
        The layer.
    inputs : sequence
        Its inputs.

    Returns
    -------
    bool
        True where the layer has an ``input_gradient``, an input carries relevance, and autocast
        (whose casts an inner graph would record) is off.
    """
    if layer.input_gradient is None:
        return False
    carrying = next((value for value in inputs if carries_relevance(value)), None)
    return carrying is not None and not torch.is_autocast_enabled(carrying.device.type)


def original_output(layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
    """The layer's own output, where a rule's terms are modified copies (no graph needed).

    Parameters
    ----------
    layer : AffineLayer
        The layer.
    inputs : sequence
        Its inputs.

    Returns
    -------
    Tensor
        The output, computed without recording a graph.
    """
    with torch.no_grad():
        return layer.forward(inputs)


def stabilising_shift(stabiliser: Stabiliser, sign: float | None, dtype: torch.dtype) -> float | None:
    """``sign * epsilon``, where a denominator of known sign may get its stabiliser from the bias of
    the layer that computes it (:meth:`ParameterVariants.shifted`): one operation per layer less
    than adding it to the layer's output.

    Parameters
    ----------
    stabiliser : Stabiliser
        The rule's stabiliser.
    sign : float or None
        The sign the denominator has by construction (see :func:`scaled`); None if unknown.
    dtype : torch.dtype
        The denominator's dtype.

    Returns
    -------
    float or None
        The shift; None where :func:`scaled` must stabilise itself: a sign not known, a function
        or no epsilon, an epsilon the dtype flushes, or one whose quotient would overflow it
        (float16).
    """
    epsilon = stabiliser.epsilon or 0.0
    if sign is None or epsilon < torch.finfo(dtype).tiny or torch.finfo(dtype).max * epsilon < 1.0:
        return None
    return sign * epsilon


def scaled(
    relevance: Tensor, denominator: Tensor, stabiliser: Stabiliser, *, sign: float | None = None,
    owned: bool = False, warn_lost_relevance: bool = False, shifted: bool = False,
) -> Tensor:
    """``s = R / stabiliser(z)``; relevance of a zero denominator is dropped.

    A stabiliser with ``epsilon > 0`` never gives 0 (``|z| + epsilon``), so the zero check, a
    pass over the output and a host synchronisation per layer, is skipped for it (unless the
    dtype flushes epsilon).

    Parameters
    ----------
    relevance : Tensor
        The output relevance ``R``.
    denominator : Tensor
        The denominator ``z``.
    stabiliser : Stabiliser
        The rule's stabiliser.
    sign : float, optional
        ``+1`` (``-1``) when ``z >= 0`` (``z <= 0``) by construction - the positive (negative)
        contributions of z+ and alpha-beta, an output a ReLU rectified - so the stabiliser is
        ``z + epsilon`` (``z - epsilon``) in one pass: zennit's value for ``z != 0``; an output
        of exactly 0 has only zero contributions, which get 0 either way.
    owned : bool, default False
        Whether ``denominator`` is the rule's own term, computed in backward and read by nothing
        else, so that stabiliser and quotient are written into it.
    warn_lost_relevance : bool, default False
        Whether to warn when relevance of a zero denominator is dropped.
    shifted : bool, default False
        Whether the denominator holds ``z + sign * epsilon`` already, the layer having added
        the stabiliser with its bias (where :func:`stabilising_shift` allows it): only the
        quotient is taken.

    Returns
    -------
    Tensor
        ``s``, a fresh tensor the caller owns.
    """
    if shifted:
        return _quotient_into(relevance, denominator)
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
        shift = constant_like(denominator, sign * epsilon)
        stabilised = denominator.add_(shift) if owned else denominator + shift
    return _quotient_into(relevance, stabilised)


def _quotient_into(relevance: Tensor, stabilised: Tensor) -> Tensor:
    """``relevance / stabilised``, written into ``stabilised`` (a fresh tensor) where it may be."""
    # (out= is not recorded by autograd; a compiler plans buffers itself, and out= keeps layouts it
    # may not infer)
    if (stabilised.shape != relevance.shape or stabilised.dtype != relevance.dtype
            or stabilised.requires_grad and torch.is_grad_enabled() or values_are_traced()):
        return relevance / stabilised
    # The denominator is a fresh tensor: the quotient overwrites it, so that backward's peak holds
    # one activation-sized buffer fewer (the largest layers set the peak).
    return torch.div(relevance, stabilised, out=stabilised)


def input_times_gradient(
    output: Root | Sequence[Root], inputs: Sequence[Any], scaled_relevance: Tensor | Sequence[Tensor]
) -> tuple[Tensor | None, ...]:
    """``R_j = x_j * sum_k w_jk s_k`` for each relevance-carrying input, with the native VJP.

    The layer's own VJP is used where the root is a :class:`LayerGradient`. The gradients of all
    terms are summed by autograd in one call.

    Parameters
    ----------
    output : Root or sequence of Root
        Where the VJP starts (a tensor, its gradient edge or a :class:`LayerGradient`); a
        sequence for one term per entry of a formula.
    inputs : sequence
        The operation's inputs (the leaves of the rule's inner graph).
    scaled_relevance : Tensor or sequence of Tensor
        ``s``, one per term. These must be the caller's own fresh tensors (as :func:`scaled`
        makes them): the products may be written into them.

    Returns
    -------
    tuple of (Tensor or None)
        The relevance of each input; None for inputs that carry none.
    """
    carrying = [value for value in inputs if carries_relevance(value)]
    closed = _layer_gradients(output)
    if closed is not None:
        shares = scaled_relevance if isinstance(scaled_relevance, (list, tuple)) else [scaled_relevance]
        gradients = tuple(_closed_form_gradient(closed, shares, value) for value in carrying)
    else:
        # A graph reused for several explanations (reusable_graph) keeps the inner graph for the next.
        gradients = torch.autograd.grad(output, carrying, scaled_relevance, retain_graph=graph_reused())
    products = iter(
        gradient.mul_(value) if in_place else _product(value, gradient)
        for value, gradient, in_place in zip(carrying, gradients, _writable(gradients), strict=True)
    )
    return tuple(next(products) if carries_relevance(value) else None for value in inputs)


def _layer_gradients(output: Root | Sequence[Root]) -> list[LayerGradient] | None:
    """The roots as a list of :class:`LayerGradient` where every one is; else None."""
    if isinstance(output, LayerGradient):
        return [output]
    if isinstance(output, list) and all(isinstance(root, LayerGradient) for root in output):
        return output
    return None


def _closed_form_gradient(roots: Sequence[LayerGradient], shares: Sequence[Tensor], value: Tensor) -> Tensor:
    """``sum_t J_t^T s_t`` at a relevance-carrying input, chained through the part of the
    input each term was computed on: where terms of ``x+`` and of ``x-`` are summed, the input's
    gradient is the positive terms' where it is positive and the negative terms' elsewhere (the
    gradients of ``max(x, 0)`` and ``min(x, 0)``; at ``x = 0`` the product with ``x`` is 0 either
    way)."""
    recording = torch.is_grad_enabled()  # (a backward that records: no in-place sum)
    by_part: dict[float | None, Tensor] = {}
    for root, share in zip(roots, shares, strict=True):
        gradient = root.of(share, value)
        summed = by_part.get(root.part)
        if summed is None:
            by_part[root.part] = gradient
        elif recording or any(summed is share for share in shares):
            # (a sum's product may be the share itself, which the other summands still read)
            by_part[root.part] = summed + gradient
        else:
            summed.add_(gradient)
    if None in by_part:
        return by_part[None]
    return torch.where(value > 0, by_part[1.0], by_part[-1.0])


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
    """The identity rule's relevance: ``share * R`` for each receiving input.

    Parameters
    ----------
    relevance : Tensor
        The output relevance ``R``.
    shares : sequence of float
        Each input's share; 0 for inputs that receive none.
    shapes : sequence of (torch.Size or None)
        Each input's shape; None for inputs that are no tensors.

    Returns
    -------
    tuple of (Tensor or None)
        ``share * R`` summed back over the dimensions the input was broadcast along; None for
        share 0.
    """
    return tuple(
        None if share == 0.0 or shape is None else (relevance * share if share != 1.0 else relevance).sum_to_size(shape)
        for share, shape in zip(shares, shapes, strict=True)
    )
