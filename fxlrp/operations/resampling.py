"""Resampling: ``F.interpolate`` and ``nn.Upsample`` in every mode.

Every mode is a fixed linear map of the input, ``z_k = sum_j a_kj x_j`` with interpolation
weights ``a`` (nearest, linear, bilinear, bicubic, trilinear, area; ``align_corners`` either way;
antialiased downsampling). Two cases:

- **nearest, nearest-exact**: each output is a copy of one input value (``a_kj`` is 0 or 1, one
  1 per output). The native backward already routes relevance: each copy's relevance goes back to
  its source, and a value copied to several outputs receives the sum of theirs,
  ``R_j = sum_{k: src(k) = j} R_k``. That is the z-rule ``R_j = sum_k x_j a_kj / z_k R_k`` of the
  copy wherever ``x_j != 0`` (``z_k = x_j``), and unlike it keeps the relevance of zero values. The
  operation runs natively; a rule the composite names for it is not used.
- **linear, bilinear, bicubic, trilinear, area**: outputs mix several inputs, like average
  pooling. The node's rule, by default the proportional z-rule of the sums:

  .. math:: R_j = \\sum_k \\frac{x_j a_{kj}}{z_k} R_k

  which conserves relevance (bicubic weights may be negative: shares may then exceed ``R_k``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.call import RelevanceCall
from fxlrp.operations.helpers import affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Kind, Operation, register

COPYING_MODES = ("nearest", "nearest-exact")
_FIXED_MODE = {F.upsample_nearest: "nearest", F.upsample_bilinear: "bilinear"}


def mode_of(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The interpolation mode of a call of ``F.interpolate`` or one of its aliases."""
    if function in _FIXED_MODE:
        return _FIXED_MODE[function]
    arguments = inspect.signature(function).bind(None, *args, **kwargs).arguments
    return arguments.get("mode", "nearest")


def resample(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Nearest modes natively (relevance routed to the copied value); the others by the node's
    rule (the z-rule by default)."""
    if mode_of(function, args, kwargs) in COPYING_MODES:
        return function(input, *args, **kwargs)
    return affine(call, function, input, *args, **kwargs)


def upsample_module(module: nn.Upsample, parameters: dict[str, Any]) -> tuple[Callable[..., Tensor], dict[str, Any]]:
    return F.interpolate, {
        "size": module.size,
        "scale_factor": module.scale_factor,
        "mode": module.mode,
        "align_corners": module.align_corners,
        "recompute_scale_factor": module.recompute_scale_factor,
    }


register(
    Operation(
        "interpolate",
        Kind.AFFINE,
        functions=(F.interpolate, F.upsample, F.upsample_nearest, F.upsample_bilinear),
        modules=(nn.Upsample,),  # UpsamplingNearest2d and UpsamplingBilinear2d keep its forward
        relevance=resample,
        module_function=upsample_module,
        default_rule=proportional,
        description="interpolation, a linear map: z-rule (linear, bilinear, bicubic, trilinear, area); "
        "nearest modes copy values, native backward routes relevance to the source",
    )
)
