"""Sums without weights: add, sub, sum, mean, average pooling. The proportional (z) rule by
default: each summand gets the share of the relevance it contributed to the sum."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from fxlrp.operations.helpers import NATIVE_UNDER_NATIVE_RULE, affine, module_as_function
from fxlrp.registry import Kind, Operation, register
from fxlrp.rules import Epsilon


def proportional() -> Epsilon:
    """The z-rule ``R_j = x_j / z * R`` (relevance of ``z = 0`` is dropped)."""
    return Epsilon(0.0)


register(
    Operation(
        "add",
        Kind.AFFINE,
        functions=(operator.add, torch.add),
        methods=("add", "__add__", "__radd__"),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        default_rule=proportional,
        shares_role=True,
        output_free_backward=True,
        description="a + b (broadcasting; constants act as a bias)",
    )
)
register(
    Operation(
        "sub",
        Kind.AFFINE,
        functions=(operator.sub, torch.sub, torch.subtract, torch.rsub),
        methods=("sub", "subtract", "__sub__", "__rsub__"),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        default_rule=proportional,
        shares_role=True,
        output_free_backward=True,
        description="a - b",
    )
)
register(
    Operation(
        "sum",
        Kind.AFFINE,
        functions=(torch.sum,),
        methods=("sum",),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        default_rule=proportional,
        output_free_backward=True,
        description="sum over dimensions",
    )
)
register(
    Operation(
        "mean",
        Kind.AFFINE,
        functions=(torch.mean,),
        methods=("mean",),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        default_rule=proportional,
        output_free_backward=True,
        description="mean over dimensions",
    )
)
register(
    Operation(
        "cumsum",
        Kind.AFFINE,
        functions=(torch.cumsum,),
        methods=("cumsum",),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        default_rule=proportional,
        description="cumulative sum",
    )
)
register(
    Operation(
        "avg_pool",
        Kind.AFFINE,
        functions=(
            F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
            F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
            torch.avg_pool1d, torch.adaptive_avg_pool1d,
        ),
        modules=(
            nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
            nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
        ),
        relevance=affine,
        gradient_native=NATIVE_UNDER_NATIVE_RULE,
        module_function=module_as_function,
        default_rule=proportional,
        output_free_backward=True,
        description="average pooling (fixed and adaptive)",
    )
)
