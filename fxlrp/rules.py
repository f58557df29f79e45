"""LRP rules for affine operations.

A rule says how the relevance ``R_k`` of the outputs ``z_k = sum_j x_j w_jk + b_k`` of an affine
operation is shared among its inputs ``x_j``. Rules know nothing of tracing: they receive an
:class:`~fxlrp.relevance.AffineLayer` and its inputs, run what their formula needs in forward
(under autograd) and turn the output relevance into input relevance in backward with native
vector-Jacobian products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.stabilise import divide_dropping_zeros, stabilise


class Rule:
    """Base class of the rules for affine operations.

    Subclasses implement :meth:`forward` and :meth:`backward`; :meth:`prepare` may compute
    parameter transforms once per conversion.
    """

    def prepare(self, layer: AffineLayer) -> Any:
        """Work done once per conversion (modified weights); passed to :meth:`forward`."""
        return None

    def forward(
        self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any
    ) -> tuple[Tensor, Any]:
        """Return the layer's output and the state :meth:`backward` needs."""
        raise NotImplementedError

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        """Return the relevance of each input (``None`` for inputs that carry none)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"{type(self).__name__}({fields})"


def input_times_gradient(
    output: Tensor, inputs: Sequence[Any], scaled_relevance: Tensor
) -> tuple[Tensor | None, ...]:
    """``R_j = x_j * sum_k w_jk s_k`` for each relevance-carrying input, with the native VJP."""
    carrying = [value for value in inputs if carries_relevance(value)]
    gradients = iter(torch.autograd.grad(output, carrying, scaled_relevance))
    return tuple(
        value * next(gradients) if carries_relevance(value) else None for value in inputs
    )


class Epsilon(Rule):
    r"""The epsilon rule (LRP-epsilon; LRP-0 for ``epsilon=0``).

    .. math::
        R_j = \sum_k \frac{x_j w_{jk}}{z_k + \epsilon \cdot (\operatorname{sign}(z_k) + [z_k = 0])} R_k,
        \qquad z_k = \sum_j x_j w_{jk} + b_k

    The bias takes part in ``z_k`` and absorbs its share of the relevance, as in zennit.
    Relevance of an output with a zero denominator (only possible for ``epsilon=0``) is dropped.
    """

    def __init__(self, epsilon: float = 1e-6) -> None:
        self.epsilon = float(epsilon)

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        output = layer.forward(inputs)
        return output, (inputs, output)

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor) -> tuple[Tensor | None, ...]:
        inputs, output = state
        denominator = stabilise(output.detach(), self.epsilon)
        scaled = divide_dropping_zeros(relevance, denominator, layer.warn_lost_relevance)
        return input_times_gradient(output, inputs, scaled)
