"""How the registry entries call the relevance Functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.registry import NativeInGradientForm
from fxlrp.relevance import apply_pass
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance

NATIVE_UNDER_NATIVE_RULE = NativeInGradientForm()
"""Affine maps and layers (``affine``, ``weighted``): their own call in the gradient form under
LRP-0 or the z-rule."""
NATIVE_WITH_ONE_CARRIER = NativeInGradientForm(needs_native_rule=False)
"""Maps linear in their one relevance-carrying argument under the identity rule (a negation, a
product with constants): their own call in the gradient form."""


def never_negative(spelling: Any, args: Sequence[Any], kwargs: Mapping[str, Any], known: Callable[[Any], bool]) -> bool:
    """:attr:`~fxlrp.registry.ValueFlow.non_negative` of an operation whose output is never
    negative whatever its inputs (ReLU, softmax, sigmoid)."""
    return True


def non_negative_where_arguments_are(spelling: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                                     known: Callable[[Any], bool]) -> bool:
    """:attr:`~fxlrp.registry.ValueFlow.non_negative` of a sum, average, maximum, product or move
    of values: never negative where no argument is, numbers included (``x + 1`` is not negative
    where ``x`` is not, ``x - 1`` may be). Negative numbers that are no values (a dimension of
    -1) make it unknown, which only keeps the terms a rule could have left out."""
    return all(known(value) for value in args) and all(known(value) for value in kwargs.values())


def bind(function: Callable[..., Tensor], kwargs: dict[str, Any]) -> Callable[..., Tensor]:
    return partial(function, **kwargs) if kwargs else function


def affine(call: RelevanceCall, function: Callable[..., Tensor], *args: Any,
           input_gradient: Callable[[Tensor, Tensor | None, Tensor], Tensor] | None = None, **kwargs: Any) -> Tensor:
    """A parameterless operation that is linear in every relevance-carrying argument (sum,
    mean, add, pooling, scatter sums); other arguments act as constants (biases).
    ``input_gradient``: its vector-Jacobian product in each such argument, if it has one in
    closed form (see :attr:`fxlrp.relevance.AffineLayer.input_gradient`)."""
    if call.runs_natively():
        return function(*args, **kwargs)
    if call.site is not None and call.site.before_first_layer and "bias" in getattr(call.rule, "zero_params", ()):
        return _with_constants_as_bias(call, bind(function, kwargs), *args)
    return call.affine(call.layer(bind(function, kwargs), input_gradient=input_gradient), *args)


def _with_constants_as_bias(call: RelevanceCall, function: Callable[..., Tensor], *args: Any) -> Tensor:
    """``function(*args)`` as a layer whose bias is its output at zero relevance-carrying
    arguments, ``y_0``: the constants a sum adds (``x - mean``), which a rule's ``zero_params``
    then leaves out, ``R_x = x J^T (R_y / (y - y_0))``
    (:attr:`~fxlrp.rules.composites.Site.before_first_layer`)."""
    with torch.no_grad():
        offset = function(*(torch.zeros_like(value) if carries_relevance(value) else value for value in args))

    def layer_function(*arguments: Any) -> Tensor:
        # (y exactly, with the constant ``bias`` in the place of its own y_0)
        *inputs, _, bias = arguments
        return function(*inputs) + (bias - offset)

    return call.affine(call.layer(layer_function, None, offset, has_parameters=True), *args)


def weighted(
    call: RelevanceCall,
    function: Callable[..., Tensor],
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *settings: Any,
    input_gradient: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None,
    output_rows_dim: int | None = None,
    **kwargs: Any,
) -> Tensor:
    """A layer ``function(input, weight, bias, *settings, **kwargs)``: linear, convolution,
    transposed convolution; ``input_gradient``: its vector-Jacobian product in closed form, if it
    has one (see :attr:`fxlrp.relevance.AffineLayer.input_gradient`); ``output_rows_dim``: the
    output's dimension of the weight's rows, if known (:attr:`~fxlrp.relevance.AffineLayer.output_rows_dim`)."""
    if call.runs_natively():
        return function(input, weight, bias, *settings, **kwargs)

    def layer_function(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        return function(x, w, b, *settings, **kwargs)

    layer = call.layer(layer_function, weight, bias, has_parameters=True, input_gradient=input_gradient,
                       output_rows_dim=output_rows_dim)
    return call.affine(layer, input)


def passes(
    receivers: tuple[int, ...] | None, recomputable: bool = False, linear: bool = False
) -> Callable[..., Tensor]:
    """Identity rule: relevance goes unchanged to ``receivers`` (equal shares when several
    carry relevance; all relevance-carrying arguments when None). ``recomputable``: the operation
    is a pure elementwise map, whose output a following rule may recompute instead of keeping it.
    ``linear``: the operation is linear in each receiver (see :func:`~fxlrp.relevance.apply_pass`)."""

    def relevance(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any):
        return apply_pass(bind(function, kwargs), receivers, *args, recomputable=recomputable, linear=linear)

    return relevance


def native(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The native call: its backward already routes relevance (views, copies, indexing); the
    entry's role fields still apply (:meth:`fxlrp.registry.Operation.explained`)."""
    return function(*args, **kwargs)


def identity(call: RelevanceCall, function: Callable[..., Tensor], input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The operation is the identity at explanation time (dropout in eval)."""
    return input


def module_as_function(module: nn.Module, parameters: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """A parameterless module is its own functional form."""
    return module, {}


def held_constant(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the operation outside autograd: its output is a constant of the explanation and
    receives no relevance. For maps whose derivative is 0 almost everywhere (sign, floor: a
    product with them is a gate on the other factor) and for statistics a normalisation divides
    by (held constant as LayerNorm's sigma is)."""
    with torch.no_grad():
        return function(*args, **kwargs)
