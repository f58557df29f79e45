"""The gradient form: relevance carried as ``R / x``, so that rules with epsilon 0 cost a gradient.

Relevance Functions pass relevance ``R`` backward (the *relevance form*). Every rule whose
stabiliser is 0 is a modified gradient instead: the epsilon rule with ``epsilon = 0`` (LRP-0, the
z-rule on sums) gives ``R_x = x * J^T (R_z / z)``, so with ``g = R / value`` carried in its place,
``g_x = J^T g_z`` - the plain gradient. So are AttnLRP's softmax rule (``g_x = J_s^T g_s``), the
uniform rule of an ``N``-factor product (``g_a = J_a^T g / N``) and every operation the native
backward already routes (ReLU, max pooling, views). The identity rule of an activation
``y = f(x)`` becomes ``g_x = g_y f(x) / x``. This is LXT's "efficient" implementation of AttnLRP,
and LRP-0 = gradient x input.

An explanation whose rules all have such a form runs with native autograd and one conversion at
each end: ``g = R / y`` at the explained output and ``R = x g`` at the inputs (and at the outputs
of embedding lookups); no rule divides by its output or multiplies by its input, and no rule
keeps its output. :func:`fxlrp.attribute` chooses it when the composite allows
(:func:`composite_has_gradient_form`); a rule or operation without a gradient form met on the
way (:func:`require_relevance_form`) makes it explain that model in the relevance form from then
on, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.relevance.tracing import known_on_host

_active: ContextVar[bool] = ContextVar("fxlrp_gradient_form", default=False)


class GradientFormUnavailable(Exception):  # noqa: N818 - a signal to the explainer, not an error shown
    """A rule or operation without a gradient form was met while explaining in the gradient form;
    :func:`fxlrp.attribute` catches it and explains in the relevance form."""


@contextmanager
def gradient_form(active: bool = True) -> Iterator[None]:
    """Relevance Functions created while active pass ``R / value`` backward (see the module)."""
    token = _active.set(active)
    try:
        yield
    finally:
        _active.reset(token)


def gradient_form_active() -> bool:
    return _active.get()


def require_relevance_form(what: str) -> None:
    """Stop an explanation in the gradient form at ``what``, which has none."""
    if _active.get():
        raise GradientFormUnavailable(what)


def gradient_is_native(rule: Any) -> bool:
    """Whether ``rule``'s gradient form is the layer's native gradient (LRP-0, the z-rule:
    :meth:`~fxlrp.rules.Rule.gradient_is_native`); False for None and for a rule of the user's
    that does not say."""
    native = getattr(rule, "gradient_is_native", None)
    return native is not None and native()


def rules_of(composite: Any) -> list[Any]:
    """Every rule a composite names."""
    return [
        composite.layer_rule, composite.first_layer, *composite.name_rules.values(),
        *(rule for _, rule in composite.type_rules), *composite.operation_rules.values(),
    ]


def composite_has_gradient_form(composite: Any) -> bool:
    """Whether every rule ``composite`` names has a gradient form (epsilon 0 throughout: LRP-0,
    AttnLRP(0), CP-LRP(0)). Operations' own defaults are checked when they run."""
    def resolved(rule: Any) -> Any:  # a product rule may follow the layer rule's epsilon
        return rule.following(composite.layer_rule) if hasattr(rule, "following") else rule

    return all(rule is None or resolved(rule).has_gradient_form() for rule in rules_of(composite))


class ScaledGradient(torch.autograd.Function):
    """Forward: the identity. Backward: the gradient times ``scale`` (a product's uniform share)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor, None]:
        return gradient * ctx.scale, None


def scaled_gradient(tensor: Tensor, scale: float) -> Tensor:
    """``tensor``, whose gradient is multiplied by ``scale`` on its way back."""
    return tensor if scale == 1.0 else ScaledGradient.apply(tensor, scale)


def sigmoid_times(x: Tensor, gradient: Tensor) -> Tensor:
    """``gradient * sigmoid(x)`` in one pass (a fresh tensor): softplus's backward, whose
    derivative is the sigmoid. Beyond ``threshold`` that kernel passes the gradient unchanged;
    it is set where the sigmoid rounds to 1 in the dtype, and ``exp(x)`` below it is finite."""
    threshold = 40.0 if x.dtype == torch.float64 else 20.0
    return torch.ops.aten.softplus_backward(gradient, x, 1.0, threshold)


RATIOS: dict[Any, Callable[[Tensor, Tensor], Tensor]] = {F.silu: sigmoid_times, nn.SiLU: sigmoid_times}
"""``g * f(x) / x`` in closed form (a fresh tensor) for activations (functions, or module types)
whose identity rule is common enough to save the passes of recomputing ``f(x)``, dividing by
``x`` and multiplying by ``g``: SiLU's ratio is ``sigmoid(x)`` (Llama, Qwen, Gemma's gated MLPs;
LXT keeps ``f(x) / (x + 1e-10)`` from forward)."""


def _ratio_of(function: Any) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The closed-form ``g * f(x) / x`` of ``function`` (possibly bound to keyword arguments), if known."""
    if isinstance(function, partial):
        if function.args or any(value is not False for value in function.keywords.values()):
            return None  # only ``inplace=False`` leaves the map as it is
        function = function.func
    if isinstance(function, nn.Module):
        return RATIOS.get(type(function))
    return RATIOS.get(function)


class IdentityRuleGradient(torch.autograd.Function):
    """The identity rule in the gradient form: ``R_i = share_i R`` becomes
    ``g_i = share_i (g y) / x_i`` (summed back over broadcast dimensions), for ``y =
    function(*inputs)``. Inputs of exactly 0 get 0: their relevance ``x_i g_i`` is 0, and a rule
    before them drops the relevance of a zero output, as in the relevance form. The output is
    recomputed in backward from the kept inputs (what the function's own backward keeps), or
    the ratio ``f(x) / x`` computed directly where :data:`RATIOS` knows it."""

    @staticmethod
    def forward(ctx, function: Callable[..., Tensor], shares: tuple[float, ...], *inputs: Any) -> Tensor:
        ctx.function, ctx.shares = function, shares
        ctx.positions = [index for index, value in enumerate(inputs) if isinstance(value, Tensor)]
        ctx.others = [None if isinstance(value, Tensor) else value for value in inputs]
        ctx.save_for_backward(*(inputs[index] for index in ctx.positions))
        return function(*inputs)

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor | None, ...]:
        inputs = list(ctx.others)
        for index, value in zip(ctx.positions, ctx.saved_tensors, strict=True):
            inputs[index] = value
        receivers = [index for index, share in enumerate(ctx.shares) if share != 0.0]
        weighted, output = _weighted_by_ratio(ctx, inputs, receivers, gradient)
        if weighted is not None:  # one receiver of the output's shape: g f(x) / x
            share = ctx.shares[receivers[0]]
            result: list[Tensor | None] = [None] * len(inputs)
            result[receivers[0]] = weighted.mul_(share) if share != 1.0 else weighted
            return (None, None, *result)
        if output is None:
            with torch.no_grad():
                output = ctx.function(*inputs)
        weighted = output.mul_(gradient)
        result = []
        for share, value in zip(ctx.shares, inputs, strict=True):
            if share == 0.0 or not isinstance(value, Tensor):
                result.append(None)
                continue
            quotient = weighted.sum_to_size(value.shape) / value
            quotient = torch.nan_to_num_(quotient, nan=0.0, posinf=0.0, neginf=0.0)  # x = 0: dropped
            result.append(quotient.mul_(share) if share != 1.0 else quotient)
        return (None, None, *result)


def _weighted_by_ratio(
    ctx: Any, inputs: list[Any], receivers: list[int], gradient: Tensor,
) -> tuple[Tensor | None, Tensor | None]:
    """``(g f(x) / x, None)`` (0 where ``x = 0``) in a fresh buffer, for a function of one receiving
    input of the output's shape (an activation); else ``(None, the recomputed output or None)``."""
    if len(receivers) != 1 or not isinstance(inputs[receivers[0]], Tensor):
        return None, None
    x = inputs[receivers[0]]
    if x.shape != gradient.shape:
        return None, None
    # Looked up here, where it is used: the relevance of many activations never comes back (the
    # square inside a norm's statistic, which is held constant).
    closed_form = _ratio_of(ctx.function) if len(inputs) == 1 else None
    if closed_form is not None:
        weighted = closed_form(x, gradient)
        # An input of exactly 0 gets 0, as f(x) / x does (the rule before it drops the relevance
        # of a zero output): looked for by a read-only pass, written only where there are any.
        # (count_nonzero reads x as it is; torch.all first copies a float tensor to booleans,
        # which took twice as long on the Llama benchmark's activations.)
        if not known_on_host(x, lambda x: torch.count_nonzero(x) == x.numel()):
            weighted.masked_fill_(x == 0, 0.0)
        return weighted, None
    with torch.no_grad():
        output = ctx.function(*inputs)
    if output.shape != x.shape or output.data_ptr() == x.data_ptr():
        return None, output  # broadcasting, or worked in place: the general path
    # in the recomputed output's buffer; 0 / 0 and overflow to 0
    return torch.nan_to_num_(output.div_(x), nan=0.0, posinf=0.0, neginf=0.0).mul_(gradient), None


def relevance_at(value: Tensor, gradient: Tensor | None) -> Tensor | None:
    """The relevance ``value * g`` of a tensor that received ``g`` in the gradient form."""
    return None if gradient is None else gradient * value
