"""Sigmoid-like squashing functions, which gated blocks multiply with a signal.

They pass relevance unchanged to their input (the identity rule, like every smooth activation)
and mark their output as a gate, so that a product ``x * gate`` (squeeze-excitation in
EfficientNet, RegNetY, MobileNetV3, MaxViT) gives the gate no relevance by default; see
:class:`fxlrp.attention_rules.Product` for the choices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.call import RelevanceCall
from fxlrp.operations.helpers import bind, module_as_function
from fxlrp.registry import Kind, Operation, register
from fxlrp.relevance import apply_pass
from fxlrp.relevance.roles import GATE


def gate(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Tensor:
    """``R_in = R_out`` (the output is a gate: the entry's role)."""
    return apply_pass(bind(function, kwargs), (0,), input, *args)


register(
    Operation(
        "gate",
        Kind.PASS,
        functions=(F.sigmoid, torch.sigmoid, F.hardsigmoid),
        methods=("sigmoid",),
        modules=(nn.Sigmoid, nn.Hardsigmoid),
        relevance=gate,
        role=GATE,
        module_function=module_as_function,
        description="sigmoid, hardsigmoid: identity rule; the output is a gate (no relevance in x * gate by default)",
    )
)
