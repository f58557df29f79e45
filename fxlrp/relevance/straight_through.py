"""Exact values from the original kernel, relevance from an equivalent decomposition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.form import gradient_form, gradient_form_active
from fxlrp.relevance.rule_function import carries_relevance


class DecomposedInBackward(torch.autograd.Function):
    """Forward: the original kernel's outputs. Backward: relevance through a decomposition of
    the same operation, which is computed there.

    The decomposition is mathematically the same operation but not bit-identical (fused attention
    kernels, LayerNorm's fused statistics): the model's outputs stay exactly the model's.

    Computing the decomposition in backward rather than beside the kernel in forward is the same
    work, but its intermediates (attention's ``length x length`` scores and weights, one set per
    layer) live only while relevance passes through that layer instead of from forward to
    backward.
    """

    @staticmethod
    def forward(ctx, exact: Callable[..., Any], path: Callable[..., Any], *inputs: Any) -> Any:
        ctx.path = path
        ctx.gradient_form = gradient_form_active()  # backward may run on another thread (CUDA)
        ctx.positions = [index for index, value in enumerate(inputs) if carries_relevance(value)]
        # (aliases: the Python objects may be given other tensors later, see RuleFunction.forward)
        ctx.inputs = [None if index in ctx.positions else value.detach() if isinstance(value, Tensor) else value
                      for index, value in enumerate(inputs)]
        ctx.save_for_backward(*(inputs[index] for index in ctx.positions))  # in-place changes are errors
        outputs = exact(*inputs)
        ctx.single = isinstance(outputs, Tensor)
        return outputs

    @staticmethod
    def backward(ctx, *relevance: Tensor | None) -> tuple[Tensor | None, ...]:
        inputs = list(ctx.inputs)
        leaves = [value.detach().requires_grad_() for value in ctx.saved_tensors]
        for index, leaf in zip(ctx.positions, leaves, strict=True):
            inputs[index] = leaf
        with torch.enable_grad(), gradient_form(ctx.gradient_form):
            outputs = ctx.path(*inputs)
        outputs = (outputs,) if ctx.single else tuple(outputs)
        pairs = [
            (output, share) for output, share in zip(outputs, relevance, strict=True)
            if share is not None and isinstance(output, Tensor) and output.requires_grad
        ]
        shares = torch.autograd.grad(
            [output for output, _ in pairs], leaves, [share for _, share in pairs], allow_unused=True
        ) if pairs else [None] * len(leaves)
        result: list[Tensor | None] = [None] * len(inputs)
        for index, share in zip(ctx.positions, shares, strict=True):
            result[index] = share
        return (None, None, *result)


def decomposed_in_backward(exact: Callable[..., Any], path: Callable[..., Any], *inputs: Any) -> Any:
    """``exact(*inputs)``, whose relevance in backward is that of ``path(*inputs)`` (the same
    operation decomposed into explained parts), computed in backward; see
    :class:`DecomposedInBackward`."""
    return DecomposedInBackward.apply(exact, path, *inputs)
