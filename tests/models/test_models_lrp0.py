"""LRP-0 equals gradient x input on torchvision CNNs, at the input and at every intermediate node.

For networks of affine layers, ReLU, max/average pooling, eval BatchNorm, add and cat, LRP-0
with ``R_out = out * onehot`` gives ``R_a = a * d(out_target)/da`` for every activation ``a``
(biases included). The reference is computed on the original model, captured with plain
``torch.fx.symbolic_trace`` (node names agree with ``explain.report()``), in float64.
Without biases (and BatchNorm without shift) relevance is conserved: the input total equals
the output relevance.
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from support.references import LRP0, randomise_batch_norm_statistics, relative_error
from torch import Tensor, fx, nn

import fxlrp

MODELS = ["vgg11_bn", "resnet18", "densenet121"]
TARGETS = torch.tensor([3, 7])
TOLERANCE = 1e-9


def build(name: str, *, bias_free: bool = False) -> nn.Module:
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = getattr(torchvision.models, name)(num_classes=10)
    randomise_batch_norm_statistics(model, generator)
    if bias_free:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.running_mean.zero_()
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
    return model.double().eval()


def image(seed: int = 2) -> Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class _Recording(fx.Interpreter):
    """Runs a plain fx capture of the model and keeps every tensor a node produces."""

    def __init__(self, graph_module: fx.GraphModule) -> None:
        super().__init__(graph_module)
        self.values: dict[str, Tensor] = {}

    def run_node(self, node: fx.Node):
        value = super().run_node(node)
        if isinstance(value, Tensor) and node.op not in ("placeholder", "output"):
            self.values[node.name] = value
        return value


def gradient_times_activation(
    model: nn.Module, x: Tensor, targets: Tensor
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """``a * d(sum_i out[i, target_i])/da`` for the input and every node of the original model,
    and the activations ``a`` of the nodes."""
    # Recorded activations must keep their values: in-place ReLUs run out of place meanwhile
    # (toggled and restored rather than copying VGG's 100M parameters).
    in_place = [module for module in model.modules() if getattr(module, "inplace", False) is True]
    for module in in_place:
        module.inplace = False
    try:
        return _gradient_times_activation(model, x, targets)
    finally:
        for module in in_place:
            module.inplace = True


def _gradient_times_activation(model: nn.Module, x: Tensor, targets: Tensor):
    graph_module = fx.symbolic_trace(model)
    for node in graph_module.graph.nodes:
        if node.kwargs.get("inplace") is True:
            node.kwargs = {**node.kwargs, "inplace": False}
    graph_module.recompile()
    leaf = x.clone().requires_grad_()
    recording = _Recording(graph_module)
    output = recording.run(leaf)
    picked = output.gather(1, targets[:, None]).sum()
    names = list(recording.values)
    grads = torch.autograd.grad(picked, [leaf] + [recording.values[name] for name in names], allow_unused=True)
    node_relevance = {
        name: recording.values[name].detach() * (torch.zeros_like(recording.values[name]) if grad is None else grad)
        for name, grad in zip(names, grads[1:], strict=True)
    }
    values = {name: value.detach() for name, value in recording.values.items()}
    return leaf.detach() * grads[0], node_relevance, values


@pytest.mark.parametrize("name", MODELS)
def test_lrp0_is_gradient_times_input_at_every_node(name: str) -> None:
    model = build(name)
    x = image()
    expected_input, expected_nodes, _ = gradient_times_activation(model, x, TARGETS)

    # BatchNorm as a layer of its own: every node of the model is in the explainer.
    explain = fxlrp.convert(model, LRP0, fold_batch_norm=False)
    node_names = [row.name for row in explain.report().rows if row.name in expected_nodes]
    assert len(node_names) == len(expected_nodes)
    assert_lrp0_matches(explain, x, node_names, expected_input, expected_nodes)

    # Folded into the layer before it (the default), BatchNorm's shift joins that layer's bias.
    folded = fxlrp.attribute(fxlrp.convert(model, LRP0), x, TARGETS)
    assert relative_error(folded, expected_input) < TOLERANCE


def assert_lrp0_matches(explain, x, node_names, expected_input, expected_nodes) -> None:
    relevance, node_relevance = fxlrp.attribute_nodes(explain, x, node_names, TARGETS)
    assert relative_error(relevance, expected_input) < TOLERANCE
    errors = {node: relative_error(node_relevance[node], expected_nodes[node]) for node in node_names}
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOLERANCE, f"{worst}: relative error {errors[worst]:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_lrp0_conserves_relevance_without_biases(name: str) -> None:
    model = build(name, bias_free=True)
    x = image(seed=5)
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        output = model(x)
    relevance = fxlrp.attribute(explain, x, TARGETS)
    expected = output.gather(1, TARGETS[:, None]).squeeze(1)
    assert torch.isfinite(relevance).all()
    per_sample = relevance.sum(dim=(1, 2, 3))
    assert relative_error(per_sample, expected) < TOLERANCE


def test_explainer_outputs_equal_model_outputs() -> None:
    model = build("resnet18")
    x = image()
    with torch.no_grad():
        assert relative_error(fxlrp.convert(model)(x), model(x)) < 1e-13
