"""The gradient form: relevance carried as ``R / x``, so that an explanation costs about a gradient.

Relevance Functions pass relevance ``R`` backward (the *relevance form*). The epsilon rule is a
modified gradient instead: ``R_x = x * J^T (R_z / s(z))`` with ``s(z) = z + eps sign(z)``, so with
``g = R / value`` carried in its place, ``g_x = J^T (g_z z / s(z))`` - for ``eps = 0`` (LRP-0, the
z-rule on sums) the plain gradient, for ``eps > 0`` the gradient scaled by ``|z| / (|z| + eps)``
on its way into the layer (:class:`~fxlrp.relevance.rule_function.StabilisedGradient`). So are
AttnLRP's softmax rule (``g_x = J_s^T g_s``), the uniform rule of an ``N``-factor product (``g_a =
J_a^T g z / s(z) / N``) and every operation the native backward already routes (ReLU, max
pooling, views). The identity rule of an activation ``y = f(x)`` becomes ``g_x = g_y f(x) / x``.
With epsilon 0 this is LXT's "efficient" implementation of AttnLRP, and LRP-0 = gradient x input.

An explanation whose rules all have such a form runs with native autograd and one conversion at
each end: ``g = R / y`` at the explained output and ``R = x g`` at the inputs (and at the outputs
of embedding lookups); no rule multiplies by its input, and only the rules with a stabiliser keep
their output. :func:`fxlrp.attribute` chooses it when the composite allows
(:func:`composite_has_gradient_form`); a rule or operation without a gradient form met on the
way (:func:`require_relevance_form`) makes it explain that model in the relevance form from then
on, with the same result. The two forms differ only where relevance reaches a value of exactly 0
through a rule that gives zero values relevance (the identity rule of an activation with
``f(0) != 0``): the gradient form carries none there (``R = 0 * g``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.stabilise import divide_dropping_zeros

_active: ContextVar[bool] = ContextVar("fxlrp_gradient_form", default=False)


class GradientFormUnavailable(Exception):  # noqa: N818 - a signal to the explainer, not an error shown
    """A rule or operation without a gradient form was met while explaining in the gradient form.

    :func:`fxlrp.attribute` catches it and explains in the relevance form.
    """


@contextmanager
def gradient_form(active: bool = True) -> Iterator[None]:
    """Relevance Functions created while active pass ``R / value`` backward (see the module).

    Parameters
    ----------
    active : bool, default True
        Whether the block runs in the gradient form (False: in the relevance form).

    Yields
    ------
    None
    """
    token = _active.set(active)
    try:
        yield
    finally:
        _active.reset(token)


def gradient_form_active() -> bool:
    """Whether Relevance Functions created now pass ``R / value`` backward.

    Returns
    -------
    bool
        True inside :func:`gradient_form` (with ``active=True``).
    """
    return _active.get()


def require_relevance_form(what: str) -> None:
    """Stop an explanation in the gradient form at ``what``, which has none.

    Parameters
    ----------
    what : str
        The rule or operation, as the signal names it.

    Raises
    ------
    GradientFormUnavailable
        If the gradient form is active.
    """
    if _active.get():
        raise GradientFormUnavailable(what)


def gradient_is_native(rule: Any) -> bool:
    """Whether ``rule``'s gradient form is the layer's native gradient.

    Parameters
    ----------
    rule : Rule or None
        The rule (LRP-0 and the z-rule say yes: :meth:`~fxlrp.rules.Rule.gradient_is_native`).

    Returns
    -------
    bool
        The rule's answer; False for None and for a rule of the user's that does not say.
    """
    native = getattr(rule, "gradient_is_native", None)
    return native is not None and native()


def rules_of(composite: Any) -> list[Any]:
    """Every rule a composite names.

    Parameters
    ----------
    composite : Composite
        The composite.

    Returns
    -------
    list
        Its layer rule, first-layer rule (None if it has none), name, type and operation rules.
    """
    return [
        composite.layer_rule, composite.first_layer, *composite.name_rules.values(),
        *(rule for _, rule in composite.type_rules), *composite.operation_rules.values(),
    ]


def composite_has_gradient_form(composite: Any) -> bool:
    """Whether every rule ``composite`` names has a gradient form.

    That is the epsilon rule with a number ``epsilon >= 0`` and no ``zero_params`` throughout, as
    in LRP-0, ``Epsilon``, ``AttnLRP`` and ``CPLRP``. Operations' own defaults are checked when they
    run.

    Parameters
    ----------
    composite : Composite
        The composite.

    Returns
    -------
    bool
        True if every rule it names has a gradient form.
    """
    def resolved(rule: Any) -> Any:  # a product rule may follow the layer rule's epsilon
        return rule.following(composite.layer_rule) if hasattr(rule, "following") else rule

    return all(rule is None or resolved(rule).has_gradient_form() for rule in rules_of(composite))


class ScaledGradient(torch.autograd.Function):
    """Forward: the identity. Backward: the gradient times ``scale`` (a product's uniform share)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, scale: float) -> Tensor:
        """The identity.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        tensor : Tensor
            The tensor.
        scale : float
            The factor its gradient is multiplied by.

        Returns
        -------
        Tensor
            A view of ``tensor``.
        """
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor, None]:
        """The gradient times ``scale``.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        gradient : Tensor
            The gradient of the output.

        Returns
        -------
        tuple
            The scaled gradient, and None for ``scale``.
        """
        return gradient * ctx.scale, None


def scaled_gradient(tensor: Tensor, scale: float) -> Tensor:
    """``tensor``, whose gradient is multiplied by ``scale`` on its way back.

    Parameters
    ----------
    tensor : Tensor
        The tensor.
    scale : float
        The factor.

    Returns
    -------
    Tensor
        ``tensor`` itself for ``scale == 1``, else a view of it through :class:`ScaledGradient`.
    """
    return tensor if scale == 1.0 else ScaledGradient.apply(tensor, scale)


class IdentityRuleGradient(torch.autograd.Function):
    """The identity rule in the gradient form.

    ``R_i = share_i R`` becomes ``g_i = share_i (g y) / x_i`` (summed back over broadcast
    dimensions), for ``y = function(*inputs)``. Inputs of exactly 0 get 0: their relevance
    ``x_i g_i`` is 0, and a rule before them drops the relevance of a zero output, as in the
    relevance form.

    For one receiving input ``x`` of the output's shape and dtype (an activation: SiLU, GELU, a
    gate's sigmoid) the ratio ``y / x`` is computed in forward, where ``x`` and ``y`` have just
    been read and written, and kept in the place of ``x`` (one tensor either way; LXT keeps the
    same ratio): backward is one multiplication, where recomputing ``f(x)`` there would take two
    to four passes over memory gone cold. Otherwise the inputs are kept and the output is
    recomputed in backward.
    """

    @staticmethod
    def forward(ctx, function: Callable[..., Tensor], shares: tuple[float, ...], *inputs: Any) -> Tensor:
        """Run ``function(*inputs)`` and keep what backward needs.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        function : callable
            The operation.
        shares : tuple of float
            Each input's share of the relevance; 0 for inputs that receive none.
        *inputs
            The operation's inputs.

        Returns
        -------
        Tensor
            ``function(*inputs)``.
        """
        output = function(*inputs)
        ctx.shares = shares
        receivers = [index for index, share in enumerate(shares) if share != 0.0]
        ctx.ratio_of = receivers[0] if len(receivers) == 1 else None
        x = inputs[ctx.ratio_of] if ctx.ratio_of is not None else None
        if (isinstance(x, Tensor) and isinstance(output, Tensor) and output.shape == x.shape
                and output.dtype == x.dtype and output.data_ptr() != x.data_ptr()):
            ctx.save_for_backward(divide_dropping_zeros(output, x))  # (0 / 0 at x = 0: 0)
            ctx.inputs = len(inputs)
            return output
        ctx.ratio_of, ctx.function = None, function
        ctx.positions = [index for index, value in enumerate(inputs) if isinstance(value, Tensor)]
        ctx.others = [None if isinstance(value, Tensor) else value for value in inputs]
        ctx.save_for_backward(*(inputs[index] for index in ctx.positions))
        return output

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor | None, ...]:
        """``g_i = share_i (g y) / x_i`` for each receiving input.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        gradient : Tensor
            ``g``, the relevance of the output divided by the output.

        Returns
        -------
        tuple of (Tensor or None)
            None for ``function`` and ``shares``, then each input's ``g_i`` (None where it
            receives nothing).
        """
        if ctx.ratio_of is not None:  # g share f(x) / x
            (ratio,) = ctx.saved_tensors
            share = ctx.shares[ctx.ratio_of]
            weighted = gradient * ratio
            result: list[Tensor | None] = [None] * ctx.inputs
            result[ctx.ratio_of] = weighted.mul_(share) if share != 1.0 else weighted
            return (None, None, *result)
        inputs = list(ctx.others)
        for index, value in zip(ctx.positions, ctx.saved_tensors, strict=True):
            inputs[index] = value
        with torch.no_grad():
            output = ctx.function(*inputs)
        weighted = output.mul_(gradient)
        result = []
        for share, value in zip(ctx.shares, inputs, strict=True):
            if share == 0.0 or not isinstance(value, Tensor):
                result.append(None)
                continue
            quotient = divide_dropping_zeros(weighted.sum_to_size(value.shape), value)  # x = 0: dropped
            result.append(quotient.mul_(share) if share != 1.0 else quotient)
        return (None, None, *result)


def relevance_at(value: Tensor, gradient: Tensor | None) -> Tensor | None:
    """The relevance ``value * g`` of a tensor that received ``g`` in the gradient form.

    Parameters
    ----------
    value : Tensor
        The tensor (an input, or an embedding lookup's output).
    gradient : Tensor or None
        The ``g`` it received; None if it received none.

    Returns
    -------
    Tensor or None
        ``value * g``; None where ``gradient`` is None.
    """
    return None if gradient is None else gradient * value
