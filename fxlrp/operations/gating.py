"""Sigmoid-like squashing functions, which gated blocks multiply with a signal.

They pass relevance unchanged to their input (the identity rule, like every smooth activation)
and mark their output as a gate, so that a product ``x * gate`` (squeeze-excitation in
EfficientNet, RegNetY, MobileNetV3, MaxViT) gives the gate no relevance by default; see
:class:`fxlrp.rules.attention.Product` for the choices. The gated linear unit (GLU,
``a * sigmoid(b)`` for the two halves of its input: the convolution module of Conformers) is
explained as that product.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import bind, module_as_function, never_negative
from fxlrp.registry import Operation, Pass, Spelling, ValueFlow, register
from fxlrp.relevance import apply_pass
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.roles import GATE
from fxlrp.relevance.straight_through import decomposed_in_backward


def gate(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Tensor:
    """``R_in = R_out`` (the output is a gate: the entry's role)."""
    return apply_pass(bind(function, kwargs), (0,), input, *args)


register(
    Operation(
        "gate",
        Spelling(
            functions=(F.sigmoid, torch.sigmoid, F.hardsigmoid),
            methods=("sigmoid",),
            modules=(nn.Sigmoid, nn.Hardsigmoid),
            module_function=module_as_function,
        ),
        Pass(gate),
        ValueFlow(non_negative=never_negative, role=GATE, keeps_rank=True, saturates=True),
        description="sigmoid, hardsigmoid: identity rule; the output is a gate (no relevance in x * gate by default)",
    )
)


def gated_linear_unit(call: RelevanceCall, function: Callable[..., Tensor], input: Tensor, *args: Any,
                      **kwargs: Any) -> Tensor:
    """GLU, ``a * sigmoid(b)`` for the halves ``a, b`` of ``input`` along ``dim``: that product
    under its rule, the sigmoid a gate (no relevance by default: ``R_a = R``), with the values of
    the model's own call (:func:`~fxlrp.relevance.straight_through.decomposed_in_backward`)."""
    return decomposed_in_backward(bind(function, kwargs), partial(call.decompose, bind(_glu, kwargs)), input, *args)


def _glu(input: Tensor, dim: int = -1) -> Tensor:
    signal, gate = input.chunk(2, dim)
    return signal * torch.sigmoid(gate)


def glu_module(module: nn.GLU, parameters: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    return F.glu, {"dim": module.dim}


register(
    Operation(
        "glu",
        Spelling(functions=(F.glu,), modules=(nn.GLU,), module_function=glu_module),
        Pass(gated_linear_unit),
        description="gated linear unit a * sigmoid(b): the product, the sigmoid a gate",
    )
)
