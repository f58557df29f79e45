"""Sums without weights: add, sub, sum, mean, differences, average pooling. The proportional (z)
rule by default: each summand gets the share of the relevance it contributed to the sum."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import (
    NATIVE_UNDER_NATIVE_RULE,
    affine,
    module_as_function,
    non_negative_where_arguments_are,
)
from fxlrp.registry import Affine, Operation, RoleFrom, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules import Epsilon


def proportional() -> Epsilon:
    """The z-rule ``R_j = x_j / z * R`` (relevance of ``z = 0`` is dropped)."""
    return Epsilon(0.0)


SUM = Affine(affine, default_rule=proportional, output_free_backward=True, gradient_native=NATIVE_UNDER_NATIVE_RULE)
"""How relevance crosses a sum: the z-rule by default, autograd's own gradient under LRP-0; its
backward leaves its output unread."""


def summand_gradient(gradient: Tensor, weight: None, summand: Tensor) -> Tensor:
    """A sum's vector-Jacobian product in one summand: the output's gradient, summed over the
    dimensions the summand was broadcast along, in the summand's dtype (as autograd hands it)."""
    if gradient.shape != summand.shape:
        gradient = gradient.sum_to_size(summand.shape)
    return gradient if gradient.dtype == summand.dtype else gradient.to(summand.dtype)


def add(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """``a + b`` as :data:`SUM` takes it, with its vector-Jacobian product in closed form
    (:func:`summand_gradient`): rules that need only that product build no inner graph. With
    ``alpha`` (which scales the second summand) through an inner graph."""
    return affine(call, function, *args, input_gradient=None if kwargs else summand_gradient, **kwargs)


register(
    Operation(
        "add",
        Spelling(functions=(operator.add, torch.add), methods=("add", "__add__", "__radd__")),
        replace(SUM, relevance=add),
        ValueFlow(non_negative=non_negative_where_arguments_are, role=RoleFrom.SHARED),
        description="a + b (broadcasting; constants act as a bias)",
    )
)
register(
    Operation(
        "sub",
        Spelling(
            functions=(operator.sub, torch.sub, torch.subtract, torch.rsub),
            methods=("sub", "subtract", "__sub__", "__rsub__"),
        ),
        SUM,
        ValueFlow(role=RoleFrom.SHARED),
        description="a - b",
    )
)
register(
    Operation(
        "sum",
        Spelling(functions=(torch.sum,), methods=("sum",)),
        SUM,
        ValueFlow(non_negative=non_negative_where_arguments_are),
        description="sum over dimensions",
    )
)
register(
    Operation(
        "mean",
        Spelling(functions=(torch.mean,), methods=("mean",)),
        SUM,
        ValueFlow(non_negative=non_negative_where_arguments_are),
        description="mean over dimensions",
    )
)
register(
    Operation(
        "cumsum",
        Spelling(functions=(torch.cumsum,), methods=("cumsum",)),
        Affine(affine, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        description="cumulative sum",
    )
)
def _diff_arguments(
    input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None, append: Tensor | None = None
) -> tuple[Tensor, int, int, Tensor | None, Tensor | None]:
    return input, n, dim, prepend, append


def differences(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    r"""``torch.diff(input, n, dim, prepend, append)`` (or ``input.diff(...)``): the ``n``-th
    differences ``v[1:] - v[:-1]`` of ``v = cat([prepend, input, append], dim)``, a linear map
    ``z = D v``. It is affine in each of ``input``, ``prepend`` and ``append``, given by position or
    by keyword: those that carry relevance are the inputs of the rule, the others constants (a
    bias). Under the epsilon rule (the z-rule, epsilon 0, by default)

    .. math:: R_{v_j} = \sum_k \frac{v_j D_{kj}}{s(z_k)} R_k,
        \qquad s(z) = z + \epsilon (\operatorname{sign}(z) + [z = 0]).
    """
    input, n, dim, prepend, append = _diff_arguments(*args, **kwargs)
    if call.runs_natively():
        return function(*args, **kwargs)

    def layer_function(x: Tensor, before: Tensor | None, after: Tensor | None) -> Tensor:
        return function(x, n, dim, before, after)

    return call.affine(call.layer(layer_function), input, prepend, append)


register(
    Operation(
        "diff",
        Spelling(functions=(torch.diff,), methods=("diff",)),
        Affine(
            differences,
            default_rule=proportional,
            output_free_backward=True,
            gradient_native=NATIVE_UNDER_NATIVE_RULE,
        ),
        description="n-th differences along a dimension, with prepend/append (linear in all three)",
    )
)
register(
    Operation(
        "avg_pool",
        Spelling(
            functions=(
                F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
                F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
                torch.avg_pool1d, torch.adaptive_avg_pool1d,
            ),
            modules=(
                nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
            ),
            module_function=module_as_function,
        ),
        SUM,
        ValueFlow(non_negative=non_negative_where_arguments_are, keeps_rank=True),
        description="average pooling (fixed and adaptive)",
    )
)
