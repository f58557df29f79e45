"""Division of relevance by pre-activations without NaN or Inf."""

import warnings

import torch
from torch import Tensor

LOST_RELEVANCE_MESSAGE = (
    "fxlrp: relevance arriving at an output of 0 is dropped (it cannot be divided among the "
    "contributions of that output)"
)


def stabilise(denominator: Tensor, epsilon: float) -> Tensor:
    """zennit's stabiliser: ``z + epsilon * (sign(z) + [z == 0])``, so ``z = 0`` moves to ``+epsilon``."""
    if epsilon == 0.0:
        return denominator
    # epsilon * (sign(z) + [z == 0]) is exactly -epsilon where z < 0 and +epsilon elsewhere,
    # which is copysign(epsilon, z + 0.0) (adding +0.0 turns -0.0 into +0.0): the same bits in
    # three cheap passes instead of six.
    # One buffer for all three (a fresh allocation per pass costs as much as the pass).
    step = denominator.new_full((), epsilon)
    stabilised = denominator + 0.0
    if stabilised.requires_grad:  # out= cannot be recorded by autograd
        return torch.copysign(step, stabilised) + denominator
    return torch.copysign(step, stabilised, out=stabilised).add_(denominator)


def divide_dropping_zeros(relevance: Tensor, denominator: Tensor, warn: bool = False) -> Tensor:
    """``relevance / denominator`` with 0 wherever the denominator is 0.

    Relevance that reaches an output of 0 has no contributions to be shared among, so it is
    dropped, as the seed notebooks do; ``warn=True`` says so when it happens.
    """
    if int(torch.count_nonzero(denominator)) == denominator.numel():
        return relevance / denominator  # the common case (epsilon > 0): no mask, no masked copy
    zero = denominator == 0
    if warn and bool((zero & (relevance != 0)).any()):
        warnings.warn(LOST_RELEVANCE_MESSAGE, stacklevel=2)
    # Dividing by +inf gives an exact 0 without the NaN that 0/0 would produce.
    return relevance / denominator.masked_fill(zero, float("inf"))
