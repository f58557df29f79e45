"""LayerNorm, GroupNorm, InstanceNorm, RMSNorm and ``F.normalize``: the denominator is a constant.

``y = (x - mean(x)) / sigma * gamma + beta``. Following AttnLRP, the division by ``sigma`` takes
the identity rule (``sigma`` is treated as a constant of the input), which leaves an affine map of
``x``: the centring ``x - mean(x)`` is linear, then a per-feature scale and the shift ``beta``.
The composite's rule (by default the z-rule) is applied to that affine map as a whole:

.. math::
    R_{x_i} = x_i \\sum_k \\frac{\\partial y_k / \\partial x_i |_{\\sigma \\text{ const}}}{y_k} R_k

which, with ``beta = 0`` and LRP-0, conserves relevance. Forward values are the native kernel's;
the linearised map is computed in backward only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import passes
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Pass, Spelling, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.straight_through import decomposed_in_backward


def scaled_and_shifted(
    normalised: Tensor, weight: Tensor | None, bias: Tensor | None, feature_shape: Sequence[int]
) -> Tensor:
    if weight is not None:
        normalised = normalised * weight.view(feature_shape)
    if bias is not None:
        normalised = normalised + bias.view(feature_shape)
    return normalised


class HeldStatisticsGradient(torch.autograd.Function):
    """Forward: the native kernel, ``exact(x, w, b) -> (output, kept)``. Backward: ``vjp(kept, w,
    g)``, the vector-Jacobian product of the linearised map (statistics held constant) in closed
    form, from what the forward kept (LayerNorm: the kernel's own ``1 / sigma``; RMSNorm: ``x``).

    The same product :func:`~fxlrp.relevance.straight_through.decomposed_in_backward` gets by
    computing the linearised map again in backward and differentiating it (a nested autograd call
    and about twice the passes); rules read it either way (the epsilon rule's ``J^T``, the
    gradient form's backward)."""

    @staticmethod
    def forward(ctx, exact: Callable[..., tuple[Tensor, Tensor]], vjp: Callable[..., Tensor], x: Tensor,
                w: Tensor | None, b: Tensor | None) -> Tensor:
        ctx.vjp, ctx.weight = vjp, w
        output, kept = exact(x, w, b)
        ctx.save_for_backward(kept)  # in-place changes before backward are errors
        return output

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor | None, ...]:
        (kept,) = ctx.saved_tensors
        return None, None, ctx.vjp(kept, ctx.weight, gradient), None, None


def normalisation(
    call: RelevanceCall,
    exact: Callable[[Tensor, Tensor | None, Tensor | None], Tensor],
    linearised: Callable[[Tensor, Tensor | None, Tensor | None], Tensor],
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    held: tuple[Callable[..., tuple[Tensor, Tensor]], Callable[..., Tensor]] | None = None,
) -> Tensor:
    """Values of ``exact(x, w, b)``, relevance by the node's rule on ``linearised(x, w, b)``.

    Forward runs only the native kernel; the linearised map, which the rule's vector-Jacobian
    product goes through, is computed in backward (as for attention), or, where only ``x``
    carries relevance, its product is given in closed form by ``held = (kernel, vjp)``: recorded
    (:class:`HeldStatisticsGradient`) for rules that build a graph, and as the layer's own
    ``input_gradient`` (from what the kernel's last call kept) for those that take it so, which
    then record nothing."""
    kept: list[Tensor] = []  # (what the kernel kept at its last call outside autograd)

    def layer_function(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        if held is None or carries_relevance(w) or carries_relevance(b):
            return decomposed_in_backward(exact, linearised, x, w, b)
        if torch.is_grad_enabled() and x.requires_grad:
            return HeldStatisticsGradient.apply(*held, x, w, b)
        output, statistic = held[0](x, w, b)
        kept[:] = [None if statistic is x else statistic]  # (RMSNorm keeps x, which the rule holds anyway)
        return output

    def input_gradient(gradient: Tensor, w: Tensor | None, x: Tensor) -> Tensor:
        return held[1](x if kept[0] is None else kept[0], w, gradient)

    closed = held is not None and not carries_relevance(weight) and not carries_relevance(bias)
    layer = call.layer(layer_function, weight, bias, has_parameters=True, recomputable=True,
                       input_gradient=input_gradient if closed else None)
    return call.affine(layer, input)


def _dimensions(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    count = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(-count, 0))


def layer_norm(
    call: RelevanceCall, function: Any, input: Tensor, normalized_shape: Any,
    weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5,
) -> Tensor:
    """``F.layer_norm`` with ``sigma`` constant: centring over the normalised dimensions, scale, shift."""
    dimensions = _dimensions(normalized_shape)
    feature_shape = input.shape[len(input.shape) - len(dimensions):]

    def exact(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return function(x, normalized_shape, w, b, eps)

    def linearised(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        # 1 / sqrt(var + eps) as layer_norm's kernel computes it (one pass over x, where var takes two)
        inverse_sigma = torch.native_layer_norm(x.detach(), feature_shape, None, None, eps)[2]
        centred = x - x.mean(dimensions, keepdim=True)
        return scaled_and_shifted(centred * inverse_sigma, w, b, feature_shape)

    def kernel(x: Tensor, w: Tensor | None, b: Tensor | None) -> tuple[Tensor, Tensor]:
        # F.layer_norm's own kernel (the same values, also under autocast), with its 1 / sigma
        output, _, inverse_sigma = torch.native_layer_norm(x, feature_shape, w, b, eps)
        return output, inverse_sigma

    def vjp(inverse_sigma: Tensor, w: Tensor | None, gradient: Tensor) -> Tensor:
        # y = (x - mean x) / sigma * w + b: with h = g w / sigma, g_x = h - mean h
        scaled = gradient * inverse_sigma
        if w is not None:
            scaled.mul_(w)  # (of the normalised shape: it broadcasts over the last dimensions)
        return scaled.sub_(scaled.mean(dimensions, keepdim=True))

    plain = function in (F.layer_norm, torch.layer_norm)  # another spelling keeps its own kernel
    return normalisation(call, exact, linearised, input, weight, bias, (kernel, vjp) if plain else None)


def group_norm(
    call: RelevanceCall, function: Any, input: Tensor, num_groups: int,
    weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5,
) -> Tensor:
    """``F.group_norm`` with each group's ``sigma`` constant."""
    channel_shape = (1, -1) + (1,) * (input.dim() - 2)

    def exact(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return function(x, num_groups, w, b, eps)

    def linearised(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        grouped = x.reshape(x.shape[0], num_groups, -1)
        inverse_sigma = torch.rsqrt(grouped.detach().var(-1, unbiased=False, keepdim=True) + eps)
        centred = (grouped - grouped.mean(-1, keepdim=True)) * inverse_sigma
        return scaled_and_shifted(centred.reshape(x.shape), w, b, channel_shape)

    return normalisation(call, exact, linearised, input, weight, bias)


def instance_norm(
    call: RelevanceCall, function: Any, input: Tensor, running_mean: Tensor | None = None,
    running_var: Tensor | None = None, weight: Tensor | None = None, bias: Tensor | None = None,
    use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5, no_batch_dim: int | None = None,
) -> Tensor:
    r"""``F.instance_norm`` with each sample's and channel's ``sigma`` constant.

    ``y = (x - mean(x)) / sigma * gamma + beta``, mean and ``sigma`` over the spatial dimensions
    of each sample and channel (RAFT's encoders, style transfer). As for LayerNorm, ``sigma`` takes
    the identity rule and the composite's rule (by default the z-rule) is applied to the affine
    map that is left:

    .. math::
        R_{x_i} = x_i \sum_k \frac{\partial y_k / \partial x_i |_{\sigma \text{ const}}}{y_k} R_k

    With the running statistics (``use_input_stats=False``: ``track_running_stats`` in evaluation)
    the map is affine as it is: ``(x - running_mean) / sqrt(running_var + eps) * gamma + beta``.

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : Any
        ``F.instance_norm``.
    input : Tensor
        ``[batch, channels, *spatial]``.
    running_mean, running_var : Tensor, optional
        The running statistics.
    weight, bias : Tensor, optional
        The affine parameters ``gamma`` and ``beta``.
    use_input_stats : bool, default True
        Whether the input's own statistics normalise it (else the running ones).
    momentum : float, default 0.1
        As ``F.instance_norm`` takes it (the running statistics are not updated in evaluation).
    eps : float, default 1e-5
        Added to the variance.
    no_batch_dim : int, optional
        For a module (``nn.InstanceNorm2d``), the dimensions of an input without a batch, which
        it normalises as a batch of one.

    Returns
    -------
    Tensor
        ``function``'s output.
    """
    if no_batch_dim is not None and input.dim() == no_batch_dim:
        return instance_norm(call, function, input.unsqueeze(0), running_mean, running_var, weight, bias,
                             use_input_stats, momentum, eps).squeeze(0)
    channel_shape = (1, -1) + (1,) * (input.dim() - 2)
    spatial = tuple(range(2, input.dim()))

    def exact(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return function(x, running_mean, running_var, w, b, use_input_stats, momentum, eps)

    def linearised(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        if use_input_stats:
            inverse_sigma = torch.rsqrt(x.detach().var(spatial, unbiased=False, keepdim=True) + eps)
            centred = (x - x.mean(spatial, keepdim=True)) * inverse_sigma
        else:
            inverse_sigma = torch.rsqrt(running_var.view(channel_shape) + eps)
            centred = (x - running_mean.view(channel_shape)) * inverse_sigma
        return scaled_and_shifted(centred, w, b, channel_shape)

    return normalisation(call, exact, linearised, input, weight, bias)


def rms_norm(
    call: RelevanceCall, function: Any, input: Tensor, normalized_shape: Any,
    weight: Tensor | None = None, eps: float | None = None,
) -> Tensor:
    """``F.rms_norm``: no centring; the root mean square is constant, so it is a rescaling."""
    dimensions = _dimensions(normalized_shape)
    feature_shape = input.shape[len(input.shape) - len(dimensions):]
    stabiliser = torch.finfo(input.dtype).eps if eps is None else eps

    def exact(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return function(x, normalized_shape, w, eps)

    def inverse_rms_of(x: Tensor) -> Tensor:
        return torch.rsqrt(x.detach().pow(2).mean(dimensions, keepdim=True) + stabiliser)

    def linearised(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return scaled_and_shifted(x * inverse_rms_of(x), w, None, feature_shape)

    def kernel(x: Tensor, w: Tensor | None, b: Tensor | None) -> tuple[Tensor, Tensor]:
        return exact(x, w, b), x  # F.rms_norm returns no statistic: 1 / rms from x in backward

    def vjp(x: Tensor, w: Tensor | None, gradient: Tensor) -> Tensor:
        scaled = gradient * inverse_rms_of(x)  # y = x / rms * w: a per-element scaling
        return scaled.mul_(w) if w is not None else scaled

    return normalisation(call, exact, linearised, input, weight, None, (kernel, vjp))


def layer_norm_module(module: nn.LayerNorm, parameters: dict[str, Any]):
    return F.layer_norm, {"normalized_shape": module.normalized_shape, "weight": parameters.get("weight"),
                          "bias": parameters.get("bias"), "eps": module.eps}


def group_norm_module(module: nn.GroupNorm, parameters: dict[str, Any]):
    return F.group_norm, {"num_groups": module.num_groups, "weight": parameters.get("weight"),
                          "bias": parameters.get("bias"), "eps": module.eps}


def instance_norm_module(module: nn.modules.instancenorm._InstanceNorm, parameters: dict[str, Any]):
    # (the statistics of the input in evaluation unless the module tracks running ones)
    return F.instance_norm, {"running_mean": parameters.get("running_mean"),
                             "running_var": parameters.get("running_var"), "weight": parameters.get("weight"),
                             "bias": parameters.get("bias"),
                             "use_input_stats": module.training or not module.track_running_stats,
                             "momentum": module.momentum if module.momentum is not None else 0.0, "eps": module.eps,
                             "no_batch_dim": module._get_no_batch_dim()}


def rms_norm_module(module: nn.Module, parameters: dict[str, Any]):
    return F.rms_norm, {"normalized_shape": module.normalized_shape, "weight": parameters.get("weight"),
                        "eps": module.eps}


register(
    Operation(
        "layer_norm",
        Spelling(
            functions=(F.layer_norm, torch.layer_norm),
            modules=(nn.LayerNorm,),
            module_function=layer_norm_module,
        ),
        Affine(layer_norm, default_rule=proportional),
        description="LayerNorm: sigma constant (identity rule), centring, scale and shift as one affine map",
    )
)
register(
    Operation(
        "group_norm",
        Spelling(
            functions=(F.group_norm, torch.group_norm),
            modules=(nn.GroupNorm,),
            module_function=group_norm_module,
        ),
        Affine(group_norm, default_rule=proportional),
        description="GroupNorm: sigma constant per group, centring, scale and shift as one affine map",
    )
)
register(
    Operation(
        "instance_norm",
        Spelling(
            functions=(F.instance_norm,),
            modules=(nn.modules.instancenorm._InstanceNorm,),
            module_function=instance_norm_module,
        ),
        Affine(instance_norm, default_rule=proportional),
        description="InstanceNorm: sigma constant per sample and channel, centring, scale and shift as one affine map",
    )
)
if hasattr(F, "rms_norm"):  # torch >= 2.4
    register(
        Operation(
            "rms_norm",
            Spelling(functions=(F.rms_norm,), modules=(nn.RMSNorm,), module_function=rms_norm_module),
            Affine(rms_norm, default_rule=proportional),
            description="RMSNorm: the root mean square is constant, a per-feature rescaling",
        )
    )
register(
    Operation(
        "normalize",
        Spelling(functions=(F.normalize,)),
        Pass(passes((0,))),
        description="x / ||x||: the norm is treated as a constant, relevance passes unchanged",
    )
)
