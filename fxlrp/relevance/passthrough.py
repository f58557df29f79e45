"""The identity rule: relevance passes through an operation unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.form import IdentityRuleGradient, gradient_form_active, scaled_gradient
from fxlrp.relevance.rule_function import carries_relevance, refuse_complex_relevance, storage_identity
from fxlrp.relevance.terms import shared_equally


class PassFunction(torch.autograd.Function):
    """Forward: ``function(*inputs)``. Backward: ``R_i = share_i * R`` for each receiving input.

    Used for elementwise maps treated as identity (GELU, SiLU, sigmoid, ...), for products and
    quotients with tensors that carry no relevance, and for the uniform split of a product of
    two relevance-carrying tensors. Relevance of a broadcast input is summed back to its shape.
    """

    @staticmethod
    def forward(ctx, function: Callable[..., Tensor], shares: tuple[float, ...], recomputable: bool, *inputs: Any):
        """Run ``function(*inputs)``.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        function : callable
            The operation.
        shares : tuple of float
            Each input's share of the relevance; 0 for inputs that receive none.
        recomputable : bool
            Whether ``function`` is a pure elementwise map that a rule reading the output may
            recompute from the input.
        *inputs
            The operation's inputs.

        Returns
        -------
        Tensor
            ``function(*inputs)``.
        """
        ctx.shares = shares
        ctx.shapes = tuple(value.shape if isinstance(value, Tensor) else None for value in inputs)
        output = function(*inputs)
        # How a relevance rule that reads this output may recompute it from the input instead of
        # keeping it (see rule_function.recomputation_of); only identities of the input are kept.
        single = len(inputs) == 1 and isinstance(inputs[0], Tensor)
        # (an activation that worked in place has no input left to recompute from)
        fresh = single and isinstance(output, Tensor) and output.data_ptr() != inputs[0].data_ptr()
        # A module is recomputed by its forward: its hooks (the user's) fire once per forward pass.
        own_forward = function.forward if isinstance(function, torch.nn.Module) else function
        ctx.recompute_with = own_forward if recomputable and fresh else None
        ctx.source_identity = storage_identity(inputs[0]) if ctx.recompute_with is not None else None
        return output

    @staticmethod
    def backward(ctx, relevance: Tensor) -> tuple[Tensor | None, ...]:
        """``R_i = share_i * R`` for each receiving input.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        relevance : Tensor
            The relevance ``R`` of the output.

        Returns
        -------
        tuple of (Tensor or None)
            None for ``function``, ``shares`` and ``recomputable``, then each input's relevance,
            summed back to its shape (None where it receives none).
        """
        return (None, None, None, *shared_equally(relevance, ctx.shares, ctx.shapes))


def apply_pass(
    function: Callable[..., Tensor], receivers: tuple[int, ...] | None, *inputs: Any, recomputable: bool = False,
    linear: bool = False,
) -> Tensor:
    """Run ``function(*inputs)``; relevance goes in equal shares to the receiving inputs.

    Parameters
    ----------
    function : callable
        The operation.
    receivers : tuple of int or None
        The positions of the inputs that may receive relevance; among them, those that carry
        relevance receive it. None: all of them.
    *inputs
        The operation's inputs.
    recomputable : bool, default False
        Whether ``function`` is a pure elementwise map (an activation), so that a rule reading
        the output may keep the input in its place and recompute the output in backward.
    linear : bool, default False
        Whether ``function`` is linear in each receiver when the other inputs are fixed (a
        product, a quotient by a constant, a negation), so that the identity rule's share is the
        gradient's share in the gradient form (:mod:`fxlrp.relevance.form`).

    Returns
    -------
    Tensor
        ``function(*inputs)``, whose backward shares the relevance.
    """
    positions = range(len(inputs)) if receivers is None else receivers
    carrying = [i for i in positions if carries_relevance(inputs[i])]
    if not torch.is_grad_enabled() or not carrying:
        return function(*inputs)
    gradient = gradient_form_active()
    if gradient and linear and len(carrying) == 1 and sum(map(carries_relevance, inputs)) == 1:
        return function(*inputs)  # the one relevance-carrying input takes its gradient unchanged
    refuse_complex_relevance(inputs)
    shares = tuple(1.0 / len(carrying) if i in carrying else 0.0 for i in range(len(inputs)))
    if gradient:
        if not linear:
            return IdentityRuleGradient.apply(function, shares, *inputs)
        # Linear in each receiver: R_i = share R is share times the gradient in the gradient form.
        held = [value.detach() if share == 0.0 and carries_relevance(value) else value
                for value, share in zip(inputs, shares, strict=True)]
        return scaled_gradient(function(*held), 1.0 / len(carrying))
    return PassFunction.apply(function, shares, recomputable, *inputs)
