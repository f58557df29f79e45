"""Powers of a relevance-carrying tensor by a constant exponent: ``x ** 2``, ``x.pow(p)``,
``torch.square(x)``.

An elementwise power is an activation (squared ReLU, MetaFormer's StarReLU
``scale * relu(x) ** 2 + bias``) and takes the identity rule of the smooth activations:

.. math:: R_{x_i} = R_{y_i}, \\qquad y_i = x_i^p

A power whose exponent carries relevance (``2 ** x``, ``x ** y``) is not an activation of one
input and has no rule. A power of values that carry no relevance (a GCN's degree normalisation
``deg.pow(-0.5)``) runs natively.

``torch.sqrt`` and ``torch.rsqrt`` are not here: models write them for the root of a variance or
mean square, a normaliser, and ``statistics.py`` holds them constant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import UnsupportedOperationError
from fxlrp.registry import Operation, Pass, Spelling, register
from fxlrp.relevance import apply_pass
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance


def power(call: RelevanceCall, function: Callable[..., Tensor], base: Any, *exponent: Any, **kwargs: Any) -> Any:
    """``R_base = R_out`` for a constant exponent; an error where the exponent carries relevance
    (under ``strict=False`` relevance then follows the gradient there, as for operations without
    a rule)."""
    if any(carries_relevance(value) for value in (*exponent, *kwargs.values())):
        if not call.strict:
            return function(base, *exponent, **kwargs)
        raise UnsupportedOperationError(
            "fxlrp explains a power x ** p of the explained input by a constant exponent p (x ** 2, "
            "x.pow(0.5), torch.square(x)) with the identity rule; here the exponent depends on the "
            "input (x ** y, 2 ** x), for which fxlrp has no LRP rule. Compute the exponent from "
            "constants, or convert with strict=False to let relevance follow the gradient there."
        )

    def elementwise(value: Tensor) -> Tensor:
        return function(value, *exponent, **kwargs)

    # One input with the exponent bound: an elementwise map that a following rule may recompute.
    return apply_pass(elementwise, (0,), base, recomputable=True)


register(
    Operation(
        "pow",
        Spelling(functions=(operator.pow, torch.pow, torch.square), methods=("pow", "__pow__", "square")),
        Pass(power),
        description="x ** p by a constant exponent (squared ReLU, StarReLU): identity rule, R_in = R_out",
    )
)
