"""Sliding patches: ``F.unfold`` / ``nn.Unfold`` gather them, ``F.fold`` / ``nn.Fold`` sum them back.

- **unfold** copies each patch of the (zero-padded) input into a column: a gather. Its native
  backward routes relevance as it routes the gradient: each column entry's relevance goes to the
  value it was copied from, summed over the patches that share it (padding receives none),
  ``R_j = sum_{k: src(k) = j} R_k``. It runs natively, like indexing.
- **fold** adds the columns into an image, overlapping entries summed (padding cropped): a sum
  ``z_k = sum_{j: dst(j) = k} x_j``. The node's rule, by default the proportional z-rule:

  .. math:: R_j = \\frac{x_j}{z_{dst(j)}} R_{dst(j)}

  (entries that fall into the cropped padding get none; non-overlapping patches give
  ``R_j = R_{dst(j)}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import NATIVE_UNDER_NATIVE_RULE, affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Native, Operation, Spelling, register


def fold_module(module: nn.Fold, parameters: dict[str, Any]) -> tuple[Callable[..., Tensor], dict[str, Any]]:
    return F.fold, {
        "output_size": module.output_size,
        "kernel_size": module.kernel_size,
        "dilation": module.dilation,
        "padding": module.padding,
        "stride": module.stride,
    }


register(
    Operation(
        "unfold",
        Spelling(functions=(F.unfold,), modules=(nn.Unfold,)),
        Native(),
        description="sliding patches gathered into columns: native backward routes relevance to the copied values",
    )
)
register(
    Operation(
        "fold",
        Spelling(functions=(F.fold,), modules=(nn.Fold,), module_function=fold_module),
        Affine(affine, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        description="columns summed into an image (overlaps added): z-rule",
    )
)
