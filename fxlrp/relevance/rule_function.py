"""One autograd Function for every rule on every affine operation."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.layer import AffineLayer


def carries_relevance(value: Any) -> bool:
    """Relevance flows only along tensors that depend on the explained inputs.

    The explainer detaches every parameter, so ``requires_grad`` marks exactly those tensors.
    """
    return isinstance(value, Tensor) and value.requires_grad


def _holds(state: Any, tensor: Tensor) -> bool:
    """Whether ``tensor`` itself is among the (nested tuple/list/dict) values of ``state``."""
    if state is tensor:
        return True
    if isinstance(state, (tuple, list)):
        return any(_holds(value, tensor) for value in state)
    if isinstance(state, dict):
        return any(_holds(value, tensor) for value in state.values())
    return False


class RuleFunction(torch.autograd.Function):
    """Forward: the layer's own operation. Backward: the rule's relevance.

    The rule runs the operation (and any modified copies its formula needs) once in forward,
    under autograd, so backward gets native vector-Jacobian products from
    ``torch.autograd.grad`` without recomputing anything.
    """

    @staticmethod
    def forward(ctx, layer: AffineLayer, rule: Any, prepared: Any, *inputs: Any) -> Tensor:
        leaves = tuple(
            value.detach().requires_grad_() if carries_relevance(value) else value
            for value in inputs
        )
        with torch.enable_grad():
            output, state = rule.forward(layer, leaves, prepared)
        ctx.layer, ctx.rule, ctx.state = layer, rule, state
        ctx.carrying = tuple(carries_relevance(value) for value in inputs)
        if _holds(state, output):
            # Saved only so that autograd reports an in-place change of the output instead of
            # silently using a modified denominator. Rules whose backward does not read the
            # output (z+, gamma, ...) do not keep it alive: that would be an activation per layer.
            output = output.detach()
            ctx.save_for_backward(output)
            return output
        return output.detach()

    @staticmethod
    def backward(ctx, relevance: Tensor) -> tuple[Tensor | None, ...]:
        _ = ctx.saved_tensors  # raises if the output was modified in place since forward
        input_relevance = ctx.rule.backward(ctx.layer, ctx.state, relevance)
        ctx.state = None  # free the inner graph as soon as relevance has passed
        routed = tuple(
            relevance_of_input if carrying else None
            for relevance_of_input, carrying in zip(input_relevance, ctx.carrying, strict=False)
        )
        return (None, None, None, *routed)


def apply_rule(layer: AffineLayer, rule: Any, prepared: Any, *inputs: Any) -> Tensor:
    """Compute ``layer`` on ``inputs``; in backward, propagate relevance by ``rule``.

    Without any relevance-carrying input (constants, parameters, integer shapes) the operation
    runs natively.
    """
    if not torch.is_grad_enabled() or not any(carries_relevance(value) for value in inputs):
        return layer.forward(inputs)
    return RuleFunction.apply(layer, rule, prepared, *inputs)
