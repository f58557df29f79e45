"""Shared references for the tests: dense LRP formulas, gradient x input, relative errors.

Every reference here is computed without fxlrp: explicit Jacobians from
``torch.autograd.functional.jacobian`` and the rules' formulas written out by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import fxlrp


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (absolute error when expected is all 0)."""
    scale = expected.abs().max().item()
    difference = (actual - expected).abs().max().item()
    return difference / scale if scale > 0 else difference


class DispatchedKernels(TorchDispatchMode):
    """The ATen kernels a computation runs, in order, each with the shapes, strides and dtypes of
    its tensor arguments and its other arguments: what decides which kernel code computes a value.

    Two computations with the same list run the same kernels on inputs of the same layout; torch
    gives bit-identical results then only where the kernels are deterministic on the machine (a
    math library may not be: oneMKL and oneDNN can sum in another order at another memory
    alignment, docs/faq.md). So a test of "fxlrp computes the same thing again" compares these
    lists exactly, and the values within a bound measured on the machine.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        described = tuple(
            (tuple(value.shape), value.stride(), value.dtype) if isinstance(value, Tensor) else repr(value)
            for value in tree_flatten((args, kwargs))[0])
        self.calls.append((str(func), described))
        return func(*args, **kwargs)


def dispatched_kernels(function: Callable[[], Any]) -> tuple[Any, list[tuple[str, tuple[Any, ...]]]]:
    """``function()``'s result and the kernels it ran (:class:`DispatchedKernels`)."""
    with DispatchedKernels() as kernels:
        result = function()
    return result, kernels.calls


def dense_jacobians(function: Callable[..., Tensor], inputs: Sequence[Tensor]) -> list[Tensor]:
    """One matrix ``J[k, j] = d output_k / d input_j`` per input (output and input flattened)."""
    jacobians = torch.autograd.functional.jacobian(function, tuple(inputs))
    output_size = function(*inputs).numel()
    return [jacobian.reshape(output_size, value.numel()) for jacobian, value in zip(jacobians, inputs, strict=True)]


def epsilon_reference(
    function: Callable[..., Tensor], inputs: Sequence[Tensor], relevance: Tensor, epsilon: float = 0.0
) -> list[Tensor]:
    r"""The epsilon rule by hand for an operation affine in each input:

    .. math:: R_j = x_j \sum_k J_{kj} \frac{R_k}{z_k + \epsilon (\operatorname{sign}(z_k) + [z_k = 0])}

    ``z = function(*inputs)`` includes every constant (bias) term; outputs with ``z = 0`` and
    ``epsilon = 0`` pass no relevance. ``epsilon = 0`` is the z-rule / LRP-0.
    """
    with torch.no_grad():
        output = function(*inputs).reshape(-1)
    denominator = output + epsilon * (output.sign() + (output == 0).to(output.dtype))
    flat_relevance = relevance.reshape(-1)
    scaled = torch.where(denominator == 0, torch.zeros_like(flat_relevance), flat_relevance / denominator)
    return [
        (value.reshape(-1) * (jacobian.T @ scaled)).reshape(value.shape)
        for value, jacobian in zip(inputs, dense_jacobians(function, inputs), strict=True)
    ]


def routed_reference(function: Callable[..., Tensor], inputs: Sequence[Tensor], relevance: Tensor) -> list[Tensor]:
    """``R_in = J^T R``: relevance routed as the gradient is (views, indexing, max, ReLU)."""
    flat_relevance = relevance.reshape(-1)
    return [
        (jacobian.T @ flat_relevance).reshape(value.shape)
        for value, jacobian in zip(inputs, dense_jacobians(function, inputs), strict=True)
    ]


def explained_relevance(
    explain: nn.Module, inputs: Sequence[Tensor], relevance: Tensor | Callable[[Tensor], Tensor]
) -> list[Tensor]:
    """Input relevance from ``explain`` for a given output relevance (or a function of the output)."""
    leaves = [value.detach().clone().requires_grad_() for value in inputs]
    output = explain(*leaves)
    start = relevance(output) if callable(relevance) else relevance
    grads = torch.autograd.grad(output, leaves, start, allow_unused=True)
    return [torch.zeros_like(leaf) if grad is None else grad for grad, leaf in zip(grads, leaves, strict=True)]


def gradient_times_input(
    model: nn.Module, inputs: Sequence[Tensor], pick: Callable[[Any], Tensor], relevance: Callable[[Tensor], Tensor]
) -> list[Tensor]:
    """``x * d<R_out/out, out>/dx`` with ``R_out = relevance(out)`` held constant: what LRP-0
    gives for piecewise-linear networks when ``R_out = out * onehot``."""
    leaves = [value.detach().clone().requires_grad_() for value in inputs]
    output = pick(model(*leaves))
    weights = relevance(output).detach() / torch.where(output == 0, torch.ones_like(output), output).detach()
    grads = torch.autograd.grad(output, leaves, weights, allow_unused=True)
    return [
        leaf.detach() * (torch.zeros_like(leaf) if grad is None else grad)
        for grad, leaf in zip(grads, leaves, strict=True)
    ]


def onehot_relevance(output: Tensor, target: int = 0) -> Tensor:
    """``R_out = out * onehot(target)`` over the last dimension."""
    mask = torch.zeros_like(output)
    mask[..., target] = 1.0
    return output.detach() * mask


def randomise_batch_norm_statistics(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Random running statistics and affine parameters, so folding BatchNorm is really tested."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.1)
    return model


LRP0 = fxlrp.rules.Epsilon(0.0)


def recordings(explain: nn.Module) -> list[Any]:
    """The recordings (:class:`fxlrp.eager.replay.Recordings`) of the explainer's parts run eagerly,
    made at their first run."""
    return [module.function.recordings for module in explain.modules()
            if getattr(getattr(module, "function", None), "recordings", None) is not None]


def stabilised(z: Tensor, epsilon: float = 1e-6) -> Tensor:
    return z + epsilon * (z.sign() + (z == 0).to(z.dtype))


def pos(t: Tensor) -> Tensor:
    return t.clamp(min=0)


def neg(t: Tensor) -> Tensor:
    return t.clamp(max=0)


# References: J (outputs x inputs), c (bias per output), x, R flattened; low/high as x.
def epsilon_dense(J, c, x, R, epsilon=1e-6, zero_bias=False, **_):
    c = torch.zeros_like(c) if zero_bias else c
    return x * (J.T @ (R / stabilised(J @ x + c, epsilon)))


def zplus_dense(J, c, x, R, zero_bias=False, **_):
    c = torch.zeros_like(c) if zero_bias else c
    scaled = R / stabilised(pos(J) @ pos(x) + neg(J) @ neg(x) + pos(c))
    return pos(x) * (pos(J).T @ scaled) + neg(x) * (neg(J).T @ scaled)


def alpha_beta_dense(J, c, x, R, alpha, beta, **_):
    positive = R / stabilised(pos(J) @ pos(x) + neg(J) @ neg(x) + pos(c))
    negative = R / stabilised(neg(J) @ pos(x) + pos(J) @ neg(x) + neg(c))
    return (alpha * (pos(x) * (pos(J).T @ positive) + neg(x) * (neg(J).T @ positive))
            - beta * (pos(x) * (neg(J).T @ negative) + neg(x) * (pos(J).T @ negative)))


def gamma_dense(J, c, x, R, gamma, zero_bias=False, **_):
    z = J @ x + c  # the layer's own output decides which half explains an output
    c = torch.zeros_like(c) if zero_bias else c
    up, down = J + gamma * pos(J), J + gamma * neg(J)
    c_up, c_down = c + gamma * pos(c), c + gamma * neg(c)
    positive = (z > 0) * R / stabilised(up @ pos(x) + down @ neg(x) + c_up)
    negative = (z < 0) * R / stabilised(down @ pos(x) + up @ neg(x) + c_down)
    return pos(x) * (up.T @ positive + down.T @ negative) + neg(x) * (down.T @ positive + up.T @ negative)


def zbox_dense(J, c, x, R, low, high, **_):
    z = (J @ x + c) - (pos(J) @ low + pos(c)) - (neg(J) @ high + neg(c))
    scaled = R / stabilised(z)
    return x * (J.T @ scaled) - low * (pos(J).T @ scaled) - high * (neg(J).T @ scaled)


def flat_dense(J, c, x, R, **_):
    connected = (J != 0).to(J.dtype)
    return connected.T @ (R / stabilised(connected.sum(dim=1)))


def wsquare_dense(J, c, x, R, **_):
    squared = J**2
    return squared.T @ (R / stabilised(squared.sum(dim=1) + c**2))
