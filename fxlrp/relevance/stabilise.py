"""Division of relevance by pre-activations without NaN or Inf."""

import warnings

import torch
from torch import Tensor

from fxlrp.relevance.tracing import values_are_traced

LOST_RELEVANCE_MESSAGE = (
    "fxlrp: relevance arriving at an output of 0 is dropped (it cannot be divided among the "
    "contributions of that output)"
)


def stabilise(denominator: Tensor, epsilon: float) -> Tensor:
    """zennit's stabiliser: ``z + epsilon * (sign(z) + [z == 0])``, so ``z = 0`` moves to ``+epsilon``.

    Computed as ``z + copysign(epsilon, z)`` in two passes, which moves ``z = -0.0`` to
    ``-epsilon`` instead. That changes no relevance: an output of exactly ``-0.0`` has only
    contributions ``x_j w_jk = -0.0`` and a bias of 0, so every share ``x_j w_jk R_k / s(z_k)``
    is 0 whatever the sign of ``s(z_k)`` (and a ReLU that follows passes it no relevance).

    Parameters
    ----------
    denominator : Tensor
        The denominator ``z``.
    epsilon : float
        The stabiliser's ``epsilon``; 0 leaves ``z`` as it is.

    Returns
    -------
    Tensor
        ``s(z)``, a fresh tensor unless ``epsilon`` is 0.
    """
    if epsilon == 0.0:
        return denominator
    step = constant_like(denominator, epsilon)
    if denominator.requires_grad and torch.is_grad_enabled():  # out=/in-place ops cannot be recorded by autograd
        return torch.copysign(step, denominator) + denominator
    # One buffer for both passes (a fresh allocation per pass costs as much as the pass).
    return torch.copysign(step, denominator).add_(denominator)


_constants: dict[tuple[float | tuple[float, ...], tuple[int, ...], torch.dtype, torch.device], Tensor] = {}
"""Numbers as tensors of no dimensions, by dtype and device: made once, not once per layer and call
(a kernel launch each on a GPU). Read only."""


def constant_like(tensor: Tensor, value: float | tuple[float, ...], shape: tuple[int, ...] = ()) -> Tensor:
    """``value`` as a tensor of no dimensions of ``tensor``'s dtype and device, made once (numbers:
    as a tensor of ``shape``).

    An operation with it converts no Python number: ``z + 1e-6`` wraps the number in a tensor of
    float64 and converts it to ``z``'s dtype at every call (four operations on the host). One is
    made for this call while a trace runs, whose graph must not hold a tensor of another call, and
    while a CUDA graph is captured, whose kernels - the one filling the tensor too - run only at
    replay.

    Parameters
    ----------
    tensor : Tensor
        The tensor whose dtype and device the constant takes.
    value : float or tuple of float
        The number (the stabiliser's epsilon, with its sign), or numbers.
    shape : tuple of int, default ()
        For numbers: the constant's shape (as many entries, ones elsewhere, to broadcast).

    Returns
    -------
    Tensor
        The constant; read only.
    """
    if (values_are_traced() or torch.compiler.is_compiling()
            or tensor.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _made(tensor, value, shape)
    key = (value, shape, tensor.dtype, tensor.device)
    constant = _constants.get(key)
    if constant is None:
        constant = _constants[key] = _made(tensor, value, shape)
    return constant


def _made(tensor: Tensor, value: float | tuple[float, ...], shape: tuple[int, ...]) -> Tensor:
    """:func:`constant_like`'s tensor, made now."""
    return tensor.new_tensor(value).view(shape) if isinstance(value, tuple) else tensor.new_full((), value)


def divide_dropping_zeros(relevance: Tensor, denominator: Tensor, warn: bool = False,
                          in_place: bool = False) -> Tensor:
    """``relevance / denominator`` with 0 wherever the denominator is 0.

    Relevance that reaches an output of 0 has no contributions to be shared among, so it is
    dropped.

    Parameters
    ----------
    relevance : Tensor
        The numerator.
    denominator : Tensor
        The denominator.
    warn : bool, default False
        Whether to warn when relevance that is not 0 is dropped.
    in_place : bool, default False
        Whether the quotient is written into ``relevance`` (a tensor the caller owns and no longer
        needs: no second tensor of its size), instead of a new tensor.

    Returns
    -------
    Tensor
        The quotient, 0 where the denominator is 0.
    """
    zero = denominator == 0
    if warn and not values_are_traced() and bool((zero & (relevance != 0)).any()):
        warnings.warn(LOST_RELEVANCE_MESSAGE, stacklevel=2)
    quotient = relevance.div_(denominator) if in_place else relevance / denominator
    # The quotient's Inf and NaN at zero denominators are overwritten in place: three operations
    # and no read on the host (whether there are any zeros would be a device synchronisation).
    return quotient.masked_fill_(zero, 0.0)
