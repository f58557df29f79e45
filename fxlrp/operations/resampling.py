"""Resampling: ``F.interpolate`` and ``nn.Upsample`` in every mode, ``F.grid_sample``.

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

``F.grid_sample(input, grid)`` (deformable attention: Deformable DETR, RT-DETR, Mask2Former's pixel
decoder) samples ``input`` at the positions ``grid`` gives, which the model computes from its
queries. The positions are held constant, as a gate's values or MambaLRP's selective parameters
are: they say where to read, not what is read, and receive no relevance (the queries' relevance
comes through the attention weights the sampled values are multiplied by). For a fixed grid the
sampling is a linear map of ``input`` in every mode and padding mode, explained as above: nearest
natively, bilinear and bicubic by the node's rule (the z-rule by default).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall

COPYING_MODES = ("nearest", "nearest-exact")
_FIXED_MODE = {F.upsample_nearest: "nearest", F.upsample_bilinear: "bilinear"}


def mode_of(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The interpolation mode of a call (all its arguments) of ``F.interpolate``, one of its
    aliases or ``F.grid_sample``."""
    if function in _FIXED_MODE:
        return _FIXED_MODE[function]
    signature = _signature(function)
    return signature.bind(*args, **kwargs).arguments.get("mode", signature.parameters["mode"].default)


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    """Read once per function: every explained call asks for its mode, and reading a signature
    costs tens of microseconds."""
    return inspect.signature(function)


def resample(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Nearest modes natively (relevance routed to the copied value); the others by the node's
    rule (the z-rule by default)."""
    if mode_of(function, (input, *args), kwargs) in COPYING_MODES:
        return function(input, *args, **kwargs)
    return affine(call, function, input, *args, **kwargs)


def sample(call: RelevanceCall, function: Callable[..., Tensor], input: Any, grid: Tensor, *args: Any,
           **kwargs: Any) -> Tensor:
    """``grid_sample`` with its sampling positions held constant: a linear map of ``input``."""
    return resample(call, function, input, grid.detach(), *args, **kwargs)


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
        Spelling(
            functions=(F.interpolate, F.upsample, F.upsample_nearest, F.upsample_bilinear),
            modules=(nn.Upsample,),  # UpsamplingNearest2d and UpsamplingBilinear2d keep its forward
            module_function=upsample_module,
        ),
        Affine(resample, default_rule=proportional),
        description="interpolation, a linear map: z-rule (linear, bilinear, bicubic, trilinear, area); "
        "nearest modes copy values, native backward routes relevance to the source",
    )
)
register(
    Operation(
        "grid_sample",
        Spelling(functions=(F.grid_sample,)),
        Affine(sample, default_rule=proportional),
        ValueFlow(index_arguments=(1,)),
        description="sampling at given positions, held constant: a linear map of the input, z-rule (bilinear, "
        "bicubic); nearest copies values, native backward routes relevance to the source",
    )
)
