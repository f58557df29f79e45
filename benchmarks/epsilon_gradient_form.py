"""The epsilon rule in the gradient form, counted: what a linear layer would cost there (issue 58).

In the gradient form (:mod:`fxlrp.relevance.form`) ``g = R / x`` is carried instead of relevance.
The epsilon rule ``R_x = x * W^T (R_z / s(z))``, ``s(z) = z + eps sign(z)``, becomes
``g_x = W^T (g_z z / s(z))``, and with ``a = |z| + eps`` kept from forward in the place of ``z``,
``g_z z / s(z) = g_z - eps g_z / a``: one ``addcdiv``. A prototype Function (not fxlrp's: fxlrp
runs the gradient form for epsilon 0 only) on a stack of linear layers on three-dimensional
inputs, as a transformer's: its relevance against ``fxlrp.attribute`` under ``Epsilon(eps)`` in
float64, and the ATen operations of one explanation against the plain gradient's, with a
``TorchDispatchMode``.

    python benchmarks/epsilon_gradient_form.py [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.dispatch_proxies import DispatchCounter  # noqa: E402

EPSILON = 1e-3


class EpsilonLinearGradient(torch.autograd.Function):
    """Forward ``F.linear``, keeping ``|z| + eps``; backward ``(g - eps g / (|z| + eps)) @ W``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        z = F.linear(x, weight, bias)
        ctx.save_for_backward(z.abs().add_(EPSILON))
        ctx.weight = weight
        return z

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor, None, None]:
        (stabilised,) = ctx.saved_tensors
        return torch.addcdiv(gradient, gradient, stabilised, value=-EPSILON).matmul(ctx.weight), None, None


def input_times_gradient(layers: list[nn.Linear], x: Tensor, target: int,
                         layer: Callable[[nn.Linear, Tensor], Tensor]) -> Tensor:
    """``x * g`` for ``g`` the gradient (of ``layer``'s kind) of the output ``target`` at ``x``: the
    relevance of ``R = y * onehot`` in the gradient form (``g = R / y`` at the output)."""
    leaf = x.detach().requires_grad_()
    output = leaf
    for module in layers:
        output = layer(module, output)
    start = torch.zeros_like(output)
    start[..., target] = 1.0
    (gradient,) = torch.autograd.grad(output, leaf, start)
    return x * gradient


def main() -> None:
    import fxlrp

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    arguments = parser.parse_args()
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16).double() for _ in range(arguments.layers)]
    model = nn.Sequential(*layers).eval().requires_grad_(False)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    expected = fxlrp.attribute(fxlrp.convert(model, fxlrp.rules.Epsilon(EPSILON)), x, target=2)
    ways = {
        "epsilon in the gradient form": lambda module, value: EpsilonLinearGradient.apply(
            value, module.weight, module.bias),
        "plain gradient": lambda module, value: module(value),
    }
    found = input_times_gradient(layers, x, 2, ways["epsilon in the gradient form"])
    print(f"relevance against fxlrp's Epsilon({EPSILON}), float64: "
          f"{float((found - expected).abs().max() / expected.abs().max()):.1e} relative")
    for name, way in ways.items():
        input_times_gradient(layers, x, 2, way)
        with DispatchCounter() as dispatched:
            input_times_gradient(layers, x, 2, way)
        counts: Counter[str] = dispatched.counts
        print(f"{name}: {sum(counts.values())} operations for {arguments.layers} layers:",
              ", ".join(f"{op[6:]} {count}" for op, count in counts.most_common()))


if __name__ == "__main__":
    main()
