"""Fold BatchNorm into the adjacent linear or convolutional layer, in the captured graph.

With its running statistics BatchNorm is the per-channel affine map ``y = s x + t``,
``s = gamma / sqrt(var + eps)``, ``t = beta - mean s``. LRP rules treat a layer's bias as a
contribution of its own, so a composite gives the numbers it is defined for (and zennit's, whose
canonizers do the same) only when BatchNorm is part of the layer next to it:

- after a layer ``z = W x + b``: ``W' = s W`` (per output channel), ``b' = s b + t``;
- where no layer precedes it, before a dense layer or a convolution whose padding does not
  insert zeros (``padding=0`` or a copying ``padding_mode``): ``W' = W s`` (per input channel),
  ``b' = b + W t``.

The folded layers are copies of the model's modules with new parameter tensors, owned by the
explainer; the model is untouched. BatchNorm is folded with its running statistics whether the
model is in training mode or not: explanations use inference semantics throughout. A layer or
BatchNorm module called several times is folded only when every call pairs the same two modules;
BatchNorm that cannot be folded stays an affine layer of its own (zennit's composites give it
the Pass rule). ``Linear -> BatchNorm1d`` is folded assuming 2-D activations ``(batch, features)``,
the shape in which BatchNorm1d normalises a dense layer's outputs. BatchNorm without running
statistics (``track_running_stats=False``) normalises by the batch's statistics, which is no fixed
affine map: it is never folded and is explained as a normalisation (``fxlrp/operations/layers.py``).
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch
from torch import Tensor, fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_CONVOLUTIONS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
LAYERS = (nn.Linear, *CONVOLUTIONS, *TRANSPOSED_CONVOLUTIONS)


def _exactly(module: nn.Module, types: tuple[type[nn.Module], ...]) -> bool:
    """An instance of one of ``types`` that computes that type's forward (not a custom one)."""
    return any(isinstance(module, kind) and type(module).forward is kind.forward for kind in types)


def _is_batch_norm(module: nn.Module) -> bool:
    return (
        isinstance(module, _BatchNorm)
        and type(module).forward is _BatchNorm.forward
        and module.running_mean is not None
        and module.running_var is not None
    )


def batch_norm_affine(batch_norm: _BatchNorm) -> tuple[Tensor, Tensor]:
    """``(s, t)`` with ``batch_norm(x) = s x + t`` per channel, from the running statistics.

    Parameters
    ----------
    batch_norm : _BatchNorm
        A BatchNorm module with running statistics.

    Returns
    -------
    scale, shift : Tensor
        ``s = gamma / sqrt(var + eps)`` and ``t = beta - mean s``, one value per channel.
    """
    scale = torch.rsqrt(batch_norm.running_var.detach() + batch_norm.eps)
    if batch_norm.weight is not None:
        scale = scale * batch_norm.weight.detach()
    shift = -batch_norm.running_mean.detach() * scale
    if batch_norm.bias is not None:
        shift = shift + batch_norm.bias.detach()
    return scale, shift


def _output_channel_view(layer: nn.Module, weight: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """``weight`` viewed so that dimension 1 of the result indexes output channels within a
    group: ``(groups, out/groups, ...)``; and the shape per-channel vectors need to broadcast."""
    spatial = (1,) * (weight.dim() - 2)
    if _exactly(layer, TRANSPOSED_CONVOLUTIONS):  # weight: (in, out/groups, *kernel)
        groups = layer.groups
        view = weight.reshape(groups, weight.shape[0] // groups, weight.shape[1], *weight.shape[2:])
        return view, (groups, 1, weight.shape[1], *spatial)
    return weight, (weight.shape[0], *(1,) * (weight.dim() - 1))


def fold_after(layer: nn.Module, batch_norm: _BatchNorm) -> tuple[Tensor, Tensor]:
    """Parameters of ``batch_norm(layer(x))`` as one layer: ``W' = s W``, ``b' = s b + t``.

    Parameters
    ----------
    layer : nn.Module
        A dense layer, a convolution or a transposed convolution.
    batch_norm : _BatchNorm
        The BatchNorm after it.

    Returns
    -------
    weight, bias : Tensor
        ``W'`` and ``b'``.
    """
    scale, shift = batch_norm_affine(batch_norm)
    weight = layer.weight.detach()
    view, shape = _output_channel_view(layer, weight)
    folded_weight = (view * scale.reshape(shape)).reshape(weight.shape)
    bias = shift if layer.bias is None else layer.bias.detach() * scale + shift
    return folded_weight, bias


def fold_before(layer: nn.Module, batch_norm: _BatchNorm) -> tuple[Tensor, Tensor]:
    """Parameters of ``layer(batch_norm(x))`` as one layer: ``W' = W s``, ``b' = b + W t``.

    Parameters
    ----------
    layer : nn.Module
        A dense layer, or a convolution that pads by copying or not at all.
    batch_norm : _BatchNorm
        The BatchNorm before it.

    Returns
    -------
    weight, bias : Tensor
        ``W'`` and ``b'``.
    """
    scale, shift = batch_norm_affine(batch_norm)
    weight = layer.weight.detach()
    if isinstance(layer, nn.Linear):
        bias = weight @ shift
        folded_weight = weight * scale
    else:  # weight: (out, in/groups, *kernel); input channel c = group * in/groups + i
        groups = layer.groups
        per_group = weight.shape[1]
        view = weight.reshape(groups, weight.shape[0] // groups, per_group, *weight.shape[2:])
        shape = (groups, 1, per_group, *(1,) * (weight.dim() - 2))
        folded_weight = (view * scale.reshape(shape)).reshape(weight.shape)
        bias = (view * shift.reshape(shape)).sum(dim=tuple(range(2, view.dim()))).reshape(-1)
    if layer.bias is not None:
        bias = layer.bias.detach() + bias
    return folded_weight, bias


def _pads_without_zeros(layer: nn.Module) -> bool:
    """Whether a constant shift of the input stays constant after the layer's padding."""
    if isinstance(layer, nn.Linear) or layer.padding_mode != "zeros" or layer.padding == "valid":
        return True
    return not isinstance(layer.padding, str) and all(pad == 0 for pad in layer.padding)


def with_parameters(layer: nn.Module, weight: Tensor, bias: Tensor) -> nn.Module:
    """A copy of ``layer`` that computes with ``weight`` and ``bias``; ``layer`` is unchanged.

    Parameters
    ----------
    layer : nn.Module
        The layer.
    weight, bias : Tensor
        The copy's parameters (which require no gradients).

    Returns
    -------
    nn.Module
        A shallow copy of ``layer`` with a parameter table of its own.
    """
    twin = copy.copy(layer)
    twin._parameters = dict(layer._parameters)  # its own table: the user's module keeps its own
    twin._parameters["weight"] = nn.Parameter(weight, requires_grad=False)
    twin._parameters["bias"] = nn.Parameter(bias, requires_grad=False)
    return twin


def _calls(graph: fx.Graph, modules: dict[str, nn.Module], accept) -> dict[str, list[fx.Node]]:
    calls: dict[str, list[fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        if node.op == "call_module" and accept(modules[node.target]):
            calls[node.target].append(node)
    return calls


def _single_input(node: fx.Node) -> fx.Node | None:
    """The one tensor argument of a call without other arguments."""
    if len(node.args) == 1 and not node.kwargs and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _every_call_of_one_layer(nodes: list[fx.Node], layer_calls: dict[str, list[fx.Node]]) -> str | None:
    """The module all ``nodes`` call, if they are (distinct) calls of one layer and all its calls."""
    targets = {node.target for node in nodes}
    if len(targets) != 1:
        return None
    target = targets.pop()
    if target not in layer_calls or len(layer_calls[target]) != len(nodes):
        return None
    return target


def _pairs_after(norm_calls: list[fx.Node], layer_calls: dict[str, list[fx.Node]]) -> str | None:
    """The layer whose every call feeds only these BatchNorm calls, one each; else None."""
    sources = [_single_input(node) for node in norm_calls]
    if any(source is None or source.op != "call_module" or len(source.users) != 1 for source in sources):
        return None
    return _every_call_of_one_layer(sources, layer_calls)


def _pairs_before(norm_calls: list[fx.Node], layer_calls: dict[str, list[fx.Node]]) -> str | None:
    """The layer whose every call takes its input only from these BatchNorm calls; else None."""
    users = []
    for node in norm_calls:
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        if user.op != "call_module" or _single_input(user) is not node:
            return None
        users.append(user)
    return _every_call_of_one_layer(users, layer_calls)


def fold_batch_norms(graph: fx.Graph, modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Remove foldable BatchNorm calls from ``graph``, folding them into their layers.

    Folding into the preceding layer comes first; a BatchNorm left over is folded into the
    following layer, which may already hold a BatchNorm folded after it (both are exact).

    Parameters
    ----------
    graph : fx.Graph
        The captured graph, changed in place.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    dict of str to nn.Module
        ``modules`` with the layers BatchNorm was folded into replaced by folded copies (the
        mapping the rewrite looks modules up in); the given dict is unchanged.
    """
    modules = dict(modules)
    norms = _calls(graph, modules, _is_batch_norm)
    layers = _calls(graph, modules, lambda module: _exactly(module, LAYERS))
    leftover = {}
    for norm_target, norm_calls in norms.items():
        layer_target = _pairs_after(norm_calls, layers)
        if layer_target is None:
            leftover[norm_target] = norm_calls
            continue
        modules[layer_target] = with_parameters(
            modules[layer_target], *fold_after(modules[layer_target], modules[norm_target]))
        for node in norm_calls:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    followers = _calls(
        graph, modules, lambda module: _exactly(module, (nn.Linear, *CONVOLUTIONS)) and _pads_without_zeros(module))
    for norm_target, norm_calls in leftover.items():
        layer_target = _pairs_before(norm_calls, followers)
        if layer_target is None:
            continue
        modules[layer_target] = with_parameters(
            modules[layer_target], *fold_before(modules[layer_target], modules[norm_target]))
        for node in norm_calls:
            next(iter(node.users)).replace_input_with(node, node.args[0])
            graph.erase_node(node)
    return modules
