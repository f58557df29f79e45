"""The identity rule: relevance passes through an operation unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.rule_function import carries_relevance


class PassFunction(torch.autograd.Function):
    """Forward: ``function(*inputs)``. Backward: ``R_i = share_i * R`` for each receiving input.

    Used for elementwise maps treated as identity (GELU, SiLU, sigmoid, ...), for products and
    quotients with tensors that carry no relevance, and for the uniform split of a product of
    two relevance-carrying tensors. Relevance of a broadcast input is summed back to its shape.
    """

    @staticmethod
    def forward(ctx, function: Callable[..., Tensor], shares: tuple[float, ...], *inputs: Any):
        ctx.shares = shares
        ctx.shapes = tuple(value.shape if isinstance(value, Tensor) else None for value in inputs)
        return function(*inputs)

    @staticmethod
    def backward(ctx, relevance: Tensor) -> tuple[Tensor | None, ...]:
        input_relevance = tuple(
            None if share == 0.0 else (relevance * share if share != 1.0 else relevance).sum_to_size(shape)
            for share, shape in zip(ctx.shares, ctx.shapes, strict=True)
        )
        return (None, None, *input_relevance)


def apply_pass(
    function: Callable[..., Tensor], receivers: tuple[int, ...] | None, *inputs: Any
) -> Tensor:
    """Run ``function(*inputs)``; relevance goes in equal shares to the ``receivers`` among the
    relevance-carrying inputs (all of them when ``receivers`` is None)."""
    positions = range(len(inputs)) if receivers is None else receivers
    carrying = [i for i in positions if carries_relevance(inputs[i])]
    if not torch.is_grad_enabled() or not carrying:
        return function(*inputs)
    shares = tuple(1.0 / len(carrying) if i in carrying else 0.0 for i in range(len(inputs)))
    return PassFunction.apply(function, shares, *inputs)
