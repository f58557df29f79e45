"""The affine operation a rule is applied to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass(frozen=True, eq=False)
class AffineLayer:
    """An operation that is affine in each of its relevance-carrying inputs.

    ``function(*inputs, weight, bias)`` computes the output when the layer has parameters
    (linear, convolution, folded BatchNorm, matmul with a constant); parameterless operations
    (add, sum, mean, pooling, scatter sums) are called as ``function(*inputs)``. Rules that
    modify parameters (z+, gamma, ...) call ``function`` again with their modified ``weight``
    and ``bias``.
    """

    function: Callable[..., Tensor]
    """The operation: ``function(*inputs, weight, bias)``, or ``function(*inputs)`` without parameters."""
    weight: Tensor | None = None
    """The layer's own weight; None for parameterless operations."""
    bias: Tensor | None = None
    """The layer's own bias; None where it has none."""
    has_parameters: bool = False
    """Whether ``function`` takes ``weight`` and ``bias``."""
    warn_lost_relevance: bool = False
    """Whether relevance dropped at outputs of 0 warns."""
    recomputable: bool = False
    """Cheap to compute again from its input (a normalisation), so its output need not be kept."""
    softmax_dim: int | None = None
    """For a softmax: the dimension it normalises over (non-negative), which lets a rule use the
    softmax's Jacobian in closed form; None elsewhere or where it is not known."""
    input_gradient: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
    """Its vector-Jacobian product in each relevance-carrying input, ``(gradient of the output,
    weight, input) -> gradient of the input`` (the input for its shape and layout, not its values;
    the weight None without parameters), where it has a closed form (``F.linear``: ``g @ W``; a
    convolution: its own ``convolution_backward`` for the input alone; a sum: ``g`` summed to the
    summand's shape): a rule that uses the layer's own parameters then builds no inner autograd
    graph in forward and runs no nested ``torch.autograd.grad`` in backward (see
    :func:`fxlrp.relevance.terms.output_and_root`)."""
    inputs_non_negative: bool = False
    """Whether its relevance-carrying inputs are known never to be negative, from the graph (a
    ReLU's output, a pooling of it): rules that treat positive and negative inputs apart leave
    out the terms of negative inputs, exact zeros, without reading a value."""
    output_rows_dim: int | None = None
    """The dimension of the output whose entries are the weight's rows (its first dimension), one
    each in order - a batched convolution's channels (1), a linear layer's features (-1) - so that
    the layer run on a weight of two stacked copies gives the two outputs stacked along it; None
    where that does not hold or is not known (a grouped convolution, parameterless operations)."""

    def __call__(
        self, inputs: Sequence[Any], weight: Tensor | None = None, bias: Tensor | None = None
    ) -> Tensor:
        """The operation on ``inputs`` with the given parameters.

        Parameters
        ----------
        inputs : sequence
            The operation's inputs.
        weight, bias : Tensor, optional
            The parameters to use (a rule's modified ones); ignored for parameterless operations.

        Returns
        -------
        Tensor
            The output.
        """
        if self.has_parameters:
            return self.function(*inputs, weight, bias)
        return self.function(*inputs)

    def forward(self, inputs: Sequence[Any]) -> Tensor:
        """The original operation with the layer's own parameters.

        Parameters
        ----------
        inputs : sequence
            The operation's inputs.

        Returns
        -------
        Tensor
            The output.
        """
        return self(inputs, self.weight, self.bias)
