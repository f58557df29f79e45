"""Elementwise operations: activations, quotients, negation.

ReLU and its piecewise-linear relatives keep their native backward, which passes relevance where
the unit is active. Smooth activations pass relevance unchanged (the identity rule). A quotient
by a tensor that carries no relevance is a rescaling: relevance passes to the numerator
unchanged. Products are in ``products.py``, sigmoid-like gates in ``gating.py``.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import NATIVE_WITH_ONE_CARRIER, module_as_function, never_negative, passes
from fxlrp.registry import Operation, Pass, RoleFrom, Routed, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import require_relevance_form
from fxlrp.relevance.roles import ACTIVATION, role_of
from fxlrp.relevance.rule_function import hand_over_activation, rectify_in_place


def rectified(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Any:
    """ReLU, native backward: relevance passes where the unit is active. On the output of a rule
    that nothing else reads, ReLU works in place as in the model's own ``ReLU(inplace=True)``."""
    if call.sole_consumer and isinstance(input, Tensor) and rectify_in_place(input):
        return input
    return clipping(call, function, input, *args, **kwargs)


def clipping(call: RelevanceCall, function: Callable[..., Tensor], input: Any, *args: Any, **kwargs: Any) -> Any:
    """The activation itself, native backward: relevance passes where the unit is active. Where
    the activation is its input's only consumer, the rule that computed the input reads its
    denominator from the activation's output instead of keeping its own output alive."""
    output = function(input, *args, **kwargs)
    if call.sole_consumer and isinstance(input, Tensor) and input.requires_grad:
        hand_over_activation(input, output)
    return output


register(
    Operation(
        "relu",
        Spelling(
            functions=(F.relu, torch.relu),
            methods=("relu",),
            modules=(nn.ReLU,),
            module_function=module_as_function,
        ),
        Routed(rectified),
        ValueFlow(non_negative=never_negative, keeps_rank=True),
        description="ReLU: native backward passes relevance where the unit is active",
    )
)
register(
    Operation(
        "clip",
        Spelling(
            functions=(F.relu6, F.hardtanh, F.threshold, torch.threshold, torch.clamp, torch.clip, F.hardshrink,
                       torch.hardshrink),
            methods=("clamp", "clip", "clamp_min", "clamp_max", "hardshrink"),
            modules=(nn.ReLU6, nn.Hardtanh, nn.Threshold, nn.Hardshrink),
            module_function=module_as_function,
        ),
        Routed(clipping),
        ValueFlow(keeps_rank=True),
        description="activations that clip (output = input or a constant): native backward passes "
        "relevance where the output is the input",
    )
)
def slope_scaled(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Any:
    """PReLU, native backward: relevance scaled by the slope where the input is negative. That
    scaling applies to relevance, not to ``R / x``: no gradient form (:mod:`fxlrp.relevance.form`)."""
    require_relevance_form("PReLU")
    return function(*args, **kwargs)


def prelu_module(module: nn.PReLU, parameters: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    return F.prelu, {"weight": parameters["weight"]}


register(
    Operation(
        "prelu",
        Spelling(functions=(F.prelu, torch.prelu), modules=(nn.PReLU,), module_function=prelu_module),
        Routed(slope_scaled),
        description="parametric ReLU: native backward (relevance scaled by the slope where negative)",
    )
)
register(
    Operation(
        "leaky_relu",
        Spelling(
            functions=(F.leaky_relu, torch._C._nn.leaky_relu),
            modules=(nn.LeakyReLU,),
            module_function=module_as_function,
        ),
        Pass(passes((0,), recomputable=True)),
        ValueFlow(keeps_rank=True),
        description="leaky ReLU: identity rule, R_in = R_out (its native backward would scale "
        "relevance by the negative slope; for y = a x the z-rule gives x a / y R = R)",
    )
)

register(
    Operation(
        "abs",
        Spelling(
            functions=(torch.abs, torch.absolute, operator.abs, builtins.abs),
            methods=("abs", "absolute", "__abs__"),
        ),
        Pass(passes((0,), recomputable=True)),
        ValueFlow(non_negative=never_negative),
        description="absolute value, piecewise linear: identity rule, R_in = R_out (for y = sign(x) x "
        "the z-rule gives x sign(x) / |x| R = R, which is also gradient x input)",
    )
)

SMOOTH_ACTIVATION_MODULES = (
    nn.GELU, nn.SiLU, nn.Tanh, nn.ELU, nn.CELU, nn.SELU, nn.Softplus, nn.Mish,
    nn.Hardswish, nn.LogSigmoid, nn.Softsign, nn.Tanhshrink,
)
register(
    Operation(
        "activation",
        Spelling(
            functions=(
                F.gelu, F.silu, F.tanh, F.elu, F.celu, F.selu, F.softplus, F.mish,
                F.hardswish, F.logsigmoid, F.softsign, F.tanhshrink,
                torch.tanh, torch.selu, torch.celu, torch.nn.functional.elu,
            ),
            methods=("tanh",),
            modules=SMOOTH_ACTIVATION_MODULES,
            module_function=module_as_function,
        ),
        Pass(passes((0,), recomputable=True)),
        ValueFlow(role=ACTIVATION, keeps_rank=True),
        description="smooth activations: identity rule, R_in = R_out",
    )
)
def numerator_role(result: Any, numerator: Any, *args: Any, **kwargs: Any) -> str | None:
    """A gate or attention weights divided (renormalised) are still one: Mixtral's router divides
    its top-k weights, a softmax's largest values, by their sum, and the experts' loop
    (``experts_implementation="eager"``) multiplies each expert's output by them, a product whose
    rule holds a gate constant, as the batched experts do (:mod:`fxlrp.integrations.transformers`)."""
    return role_of(numerator)


register(
    Operation(
        "div",
        Spelling(
            functions=(operator.truediv, torch.div, torch.true_divide, torch.divide),
            methods=("div", "divide", "true_divide", "__truediv__"),
        ),
        Pass(passes((0,))),
        ValueFlow(role=numerator_role),
        description="quotient: the denominator is treated as a constant, relevance passes to the numerator "
        "(a gate or attention weights divided keep their role)",
    )
)
register(
    Operation(
        "neg",
        Spelling(functions=(operator.neg, torch.neg, torch.negative), methods=("neg", "negative", "__neg__")),
        Pass(passes((0,), linear=True), gradient_native=NATIVE_WITH_ONE_CARRIER),
        ValueFlow(role=RoleFrom.SHARED),
        description="negation: R_in = R_out",
    )
)
