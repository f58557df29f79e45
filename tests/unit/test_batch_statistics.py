"""BatchNorm without running statistics normalises by the batch's: explained like LayerNorm, the
native kernel's values and the node's rule on the affine map with each channel's sigma held
constant. References: that map written out by hand, its Jacobian from
``torch.autograd.functional.jacobian`` and the epsilon rule's formula (support.references), float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.references import epsilon_reference, explained_relevance, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon

TOLERANCE = 1e-10


def random(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def batch_statistics_reference(x: Tensor, weight: Tensor | None, bias: Tensor | None, relevance: Tensor,
                               eps: float, epsilon: float) -> Tensor:
    """The epsilon rule on ``(x - mean_c x) / sigma_c * w_c + b_c``, statistics over every
    dimension but the channels (1), ``sigma_c = sqrt(var_c(x) + eps)`` fixed at ``x``."""
    dimensions = (0, *range(2, x.dim()))
    channel = (1, -1) + (1,) * (x.dim() - 2)
    sigma = torch.sqrt(x.var(dimensions, unbiased=False, keepdim=True) + eps)

    def linearised(value: Tensor) -> Tensor:
        normalised = (value - value.mean(dimensions, keepdim=True)) / sigma
        if weight is not None:
            normalised = normalised * weight.view(channel)
        return normalised if bias is None else normalised + bias.view(channel)

    [expected] = epsilon_reference(linearised, [x], relevance, epsilon)
    return expected


class FunctionalBatchStatistics(nn.Module):
    """Weight standardisation's spelling: ``F.batch_norm`` with no running statistics."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(random(channels, seed=3) + 1.5)
        self.bias = nn.Parameter(random(channels, seed=4))

    def forward(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, None, None, self.weight, self.bias, training=True, momentum=0.0, eps=1e-3)


def module_without_statistics(kind: type[nn.Module], channels: int, affine: bool) -> nn.Module:
    norm = kind(channels, eps=1e-3, affine=affine, track_running_stats=False).double().eval()
    if affine:
        with torch.no_grad():
            norm.weight.copy_(random(channels, seed=3) + 1.5)
            norm.bias.copy_(random(channels, seed=4))
    return norm


CASES = {
    "BatchNorm1d (batch, features)": (lambda: module_without_statistics(nn.BatchNorm1d, 4, True), (5, 4)),
    "BatchNorm1d (batch, channels, length)": (lambda: module_without_statistics(nn.BatchNorm1d, 3, True), (2, 3, 5)),
    "BatchNorm2d": (lambda: module_without_statistics(nn.BatchNorm2d, 3, True), (2, 3, 4, 3)),
    "BatchNorm2d without affine": (lambda: module_without_statistics(nn.BatchNorm2d, 3, False), (2, 3, 3, 3)),
    "BatchNorm3d": (lambda: module_without_statistics(nn.BatchNorm3d, 2, True), (2, 2, 3, 2, 2)),
    "F.batch_norm(x, None, None, training=True)": (lambda: FunctionalBatchStatistics(3).double(), (3, 3, 2, 4)),
}


@pytest.mark.parametrize("epsilon", [0.0, 0.25])
@pytest.mark.parametrize("name", list(CASES))
def test_batch_statistics_norm_matches_dense_reference(name: str, epsilon: float) -> None:
    make, shape = CASES[name]
    norm = make()
    x, relevance = random(*shape), random(*shape, seed=1)
    explain = fxlrp.convert(nn.Sequential(norm), Epsilon(epsilon))  # a module called in a model
    with torch.no_grad():
        assert torch.equal(explain(x), norm(x))  # the native kernel's values
    [actual] = explained_relevance(explain, [x], relevance)
    weight = None if norm.weight is None else norm.weight.detach()
    bias = None if norm.bias is None else norm.bias.detach()
    expected = batch_statistics_reference(x, weight, bias, relevance, 1e-3, epsilon)
    assert relative_error(actual, expected) < TOLERANCE
    if bias is None and epsilon == 0.0:  # centring and scaling are linear: LRP-0 conserves
        assert abs(actual.sum() - relevance.sum()) < 1e-10 * relevance.abs().sum()


def test_batch_statistics_norm_between_layers_is_not_folded() -> None:
    """Conv -> BatchNorm without statistics -> ReLU -> Linear: the norm stays a layer of its own
    (folding needs running statistics), outputs equal the model's, and relevance of the head
    reaches the input through the norm's rule (checked against the model with that norm's map
    linearised by hand, all other layers being affine or ReLU: LRP-0 is gradient x input there)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    norm = module_without_statistics(nn.BatchNorm2d, 3, True)
    head = nn.Linear(3 * 4 * 4, 2).double()
    model = nn.Sequential(conv, norm, nn.ReLU(), nn.Flatten(), head).eval()
    x = random(3, 2, 4, 4, seed=5)
    explain = fxlrp.convert(model, Epsilon(0.0))
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    assert [row.operation for row in explain.report().rows].count("batch_norm") == 1

    with torch.no_grad():
        hidden = conv(x)
    sigma = torch.sqrt(hidden.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-3)

    def linearised_model(value: Tensor) -> Tensor:
        centred = conv(value) - conv(value).mean((0, 2, 3), keepdim=True)
        normalised = centred / sigma * norm.weight.view(1, -1, 1, 1) + norm.bias.view(1, -1, 1, 1)
        return head(torch.relu(normalised).flatten(1))

    leaf = x.clone().requires_grad_()
    output = linearised_model(leaf)
    start = torch.zeros_like(output)
    start[:, 1] = output[:, 1].detach()
    # LRP-0 through affine maps and ReLU: x * gradient of <R/out, out>, R = out * onehot
    [gradient] = torch.autograd.grad(output, leaf, start / output.detach())
    [actual] = explained_relevance(explain, [x], lambda out: out.detach() * torch.eye(2, dtype=out.dtype)[1])
    assert relative_error(actual, x * gradient) < 1e-9
