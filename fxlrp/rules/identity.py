"""The identity rule, relevance handed through unchanged (:class:`Pass`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput, carries_relevance
from fxlrp.rules.rule import Relevance, Rule


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    return len(shape) <= len(target) and all(
        size in (1, wanted) for size, wanted in zip(reversed(shape), reversed(target), strict=False))


class Pass(Rule):
    r"""The identity rule: ``R_in = R_out``.

    The relevance is shared equally among several relevance-carrying inputs and summed back over
    broadcast dimensions. For operations whose output has the shape of its input, e.g.
    activations and BatchNorm, as zennit uses it.
    """

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        output = terms.original_output(layer, inputs)
        shapes = [value.shape if carries_relevance(value) else None for value in inputs]
        for shape in shapes:
            if shape is not None and not _broadcasts_to(shape, output.shape):
                raise ValueError(
                    f"the Pass rule hands relevance through unchanged, so it needs an output of the input's "
                    f"shape, but this operation maps {tuple(shape)} to {tuple(output.shape)}; "
                    "use Epsilon or Norm for it"
                )
        return output, shapes

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        share = 1.0 / sum(shape is not None for shape in state)
        return terms.shared_equally(relevance, [share] * len(state), state)
