"""Layers with weights: linear, convolution, transposed convolution, BatchNorm, matmul."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.call import RelevanceCall
from fxlrp.operations.helpers import weighted
from fxlrp.registry import Kind, Operation, register
from fxlrp.relevance.rule_function import carries_relevance


def linear_module(module: nn.Linear, parameters: dict[str, Any]):
    return F.linear, {"weight": parameters["weight"], "bias": parameters.get("bias")}


register(
    Operation(
        "linear",
        Kind.AFFINE,
        functions=(F.linear,),
        modules=(nn.Linear,),
        relevance=weighted,
        module_function=linear_module,
        weighted=True,
        description="y = x W^T + b",
    )
)


def _padded_convolution(
    convolution, padding_mode: str, border: tuple[int, ...], input, weight, bias, *settings, **keywords
):
    # Non-zero padding modes are a copy of border values: linear, so it belongs to the layer.
    # ``keywords`` holds the convolution's own settings (stride, padding=0, ...).
    return convolution(F.pad(input, border, mode=padding_mode), weight, bias, *settings, **keywords)


def convolution_module(module: nn.modules.conv._ConvNd, parameters: dict[str, Any]):
    function = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(module.kernel_size)]
    padding = module.padding
    if module.padding_mode != "zeros":
        function = partial(
            _padded_convolution, function, module.padding_mode, module._reversed_padding_repeated_twice
        )
        padding = 0
    return function, {
        "weight": parameters["weight"],
        "bias": parameters.get("bias"),
        "stride": module.stride,
        "padding": padding,
        "dilation": module.dilation,
        "groups": module.groups,
    }


register(
    Operation(
        "conv",
        Kind.AFFINE,
        functions=(F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d),
        modules=(nn.Conv1d, nn.Conv2d, nn.Conv3d),
        relevance=weighted,
        module_function=convolution_module,
        weighted=True,
        description="convolution, any dimension, groups, stride, padding, dilation",
    )
)


def transposed_convolution_module(module: nn.modules.conv._ConvTransposeNd, parameters: dict[str, Any]):
    function = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(module.kernel_size)]
    return function, {
        "weight": parameters["weight"],
        "bias": parameters.get("bias"),
        "stride": module.stride,
        "padding": module.padding,
        "output_padding": module.output_padding,
        "groups": module.groups,
        "dilation": module.dilation,
    }


register(
    Operation(
        "conv_transpose",
        Kind.AFFINE,
        functions=(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d),
        modules=(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
        relevance=weighted,
        module_function=transposed_convolution_module,
        weighted=True,
        description="transposed convolution",
    )
)


def batch_norm(
    call: RelevanceCall,
    function: Any,
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """BatchNorm with running statistics, an affine map ``x * scale + shift`` per channel."""
    if running_mean is None or running_var is None:
        raise ValueError(
            "fxlrp explains BatchNorm with its running statistics, but this BatchNorm has none "
            "(track_running_stats=False); LRP needs a fixed affine map here."
        )
    def scale_and_shift() -> tuple[Tensor, Tensor]:
        # Explanations are of the model at inference: statistics are never updated.
        scale = torch.rsqrt(running_var + eps)
        scale = scale if weight is None else scale * weight
        shift = -running_mean * scale
        return scale, shift if bias is None else shift + bias

    # Once per conversion: the same tensors each call also let the rule's weight transforms be reused.
    scale, shift = call.cached("batch_norm", (running_mean, running_var, weight, bias), scale_and_shift)

    def affine_per_channel(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return torch.addcmul(b.view(shape), x, w.view(shape))

    return call.affine(call.layer(affine_per_channel, scale, shift, has_parameters=True), input)


def batch_norm_module(module: nn.modules.batchnorm._BatchNorm, parameters: dict[str, Any]):
    return F.batch_norm, {
        "running_mean": parameters.get("running_mean"),
        "running_var": parameters.get("running_var"),
        "weight": parameters.get("weight"),
        "bias": parameters.get("bias"),
        "eps": module.eps,
    }


register(
    Operation(
        "batch_norm",
        Kind.AFFINE,
        functions=(F.batch_norm,),
        modules=(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
        relevance=batch_norm,
        module_function=batch_norm_module,
        weighted=True,
        description="BatchNorm with running statistics: per-channel affine map",
    )
)


def addmm(call: RelevanceCall, function: Any, bias: Any, left: Any, right: Any, *, beta=1, alpha=1) -> Tensor:
    """``beta * bias + alpha * left @ right`` with a constant ``right``: a linear layer."""
    if carries_relevance(right) or carries_relevance(bias):
        raise NotImplementedError("fxlrp: addmm is explained with a constant right factor and bias only")

    def layer_function(x, w, b):
        return function(b, x, w, beta=beta, alpha=alpha)

    return call.affine(call.layer(layer_function, right, bias, has_parameters=True), left)


register(
    Operation(
        "addmm",
        Kind.AFFINE,
        functions=(torch.addmm,),
        methods=("addmm",),
        relevance=addmm,
        weighted=True,
        description="bias + input @ weight",
    )
)
