"""InstanceNorm (RAFT's encoders, style transfer): ``sigma`` of each sample and channel held
constant (the identity rule), the composite's rule on the affine map that is left, as for
LayerNorm and GroupNorm.

References: the epsilon rule written out with the linearised map's dense Jacobian; LRP-0 of a
network against gradient x input of the same network with each ``sigma`` detached (float64);
conservation of the z-rule without a bias; the model's own outputs bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.references import epsilon_reference, explained_relevance, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon

TOLERANCE = 1e-12


def random(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def linearised_instance_norm(value: Tensor, reference: Tensor, weight: Tensor | None, bias: Tensor | None,
                             eps: float) -> Tensor:
    """``(value - mean(value)) / sigma(reference) * weight + bias`` over the spatial dimensions."""
    spatial = tuple(range(2, value.dim()))
    sigma = torch.sqrt(reference.detach().var(spatial, unbiased=False, keepdim=True) + eps)
    centred = (value - value.mean(spatial, keepdim=True)) / sigma
    shape = (1, -1) + (1,) * (value.dim() - 2)
    if weight is not None:
        centred = centred * weight.view(shape)
    if bias is not None:
        centred = centred + bias.view(shape)
    return centred


def affine_norm(dimensions: int, channels: int, *, affine: bool = True) -> nn.Module:
    norm = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[dimensions](
        channels, eps=1e-3, affine=affine).double().eval()
    if affine:
        with torch.no_grad():
            norm.weight.copy_(random(channels, seed=3))
            norm.bias.copy_(random(channels, seed=4))
    return norm


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("dimensions", [1, 2, 3])
def test_the_epsilon_rule_on_the_map_with_sigma_constant(dimensions: int, capture: str) -> None:
    norm = affine_norm(dimensions, 4)
    shape = (2, 4) + (5, 3, 2)[:dimensions]
    x, relevance = random(*shape), random(*shape, seed=1)
    explain = fxlrp.convert(nn.Sequential(norm), capture=capture)  # (a module of the model: a leaf)
    assert torch.equal(explain(x), norm(x))  # the native kernel's values
    [expected] = epsilon_reference(
        lambda value: linearised_instance_norm(value, x, norm.weight.detach(), norm.bias.detach(), 1e-3),
        [x], relevance, 0.0)
    [actual] = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, expected) < TOLERANCE


def test_the_z_rule_conserves_without_a_bias() -> None:
    norm = affine_norm(2, 4, affine=False)
    x, relevance = random(2, 4, 5, 6), random(2, 4, 5, 6, seed=1)
    [actual] = explained_relevance(fxlrp.convert(nn.Sequential(norm), Epsilon(0.0)), [x], relevance)
    assert abs(actual.sum() - relevance.sum()) < 1e-12 * relevance.abs().sum()
    assert relative_error(actual.sum((1, 2, 3)), relevance.sum((1, 2, 3))) < 1e-12  # per sample
    assert torch.isfinite(actual).all()


class StyleBlock(nn.Module):
    """Conv, instance norm (module and functional spellings), ReLU, pooled linear head."""

    def __init__(self, track_running_stats: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.InstanceNorm2d(6, affine=True, track_running_stats=track_running_stats)
        self.conv2 = nn.Conv2d(6, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)
        with torch.no_grad():
            self.norm.weight.normal_()
            self.norm.bias.normal_()
            if track_running_stats:
                self.norm.running_mean.normal_()
                self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.norm(self.conv(x)))
        h = torch.relu(F.instance_norm(self.conv2(h), eps=1e-4))
        return self.head(h.mean((2, 3)))


def block_with_sigma_detached(block: StyleBlock, x: Tensor) -> Tensor:
    """The block with each instance norm's ``sigma`` a constant: the map LRP-0 explains."""
    z = block.conv(x)
    h = torch.relu(linearised_instance_norm(z, z, block.norm.weight, block.norm.bias, block.norm.eps))
    z = block.conv2(h)
    h = torch.relu(linearised_instance_norm(z, z, None, None, 1e-4))
    return block.head(h.mean((2, 3)))


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_lrp0_is_gradient_times_input_of_the_network_with_sigma_constant(capture: str) -> None:
    block = StyleBlock().double().eval()
    x = random(3, 3, 8, 7)
    explain = fxlrp.convert(block, Epsilon(0.0), capture=capture)
    for _ in range(2):  # (eager: the second call records the run)
        assert torch.equal(explain(x), block(x))
        relevance = fxlrp.attribute(explain, x, target=2)
        leaf = x.clone().requires_grad_()
        (gradient,) = torch.autograd.grad(block_with_sigma_detached(block, leaf)[:, 2].sum(), leaf)
        assert relative_error(relevance, gradient * x) < TOLERANCE
    report = explain.report()
    assert sum(row.operation == "instance_norm" and row.handling == "rule" for row in report.all_rows) == 2


def test_with_running_statistics_the_map_is_affine_and_lrp0_is_gradient_times_input() -> None:
    block = StyleBlock(track_running_stats=True).double().eval()
    x = random(3, 3, 8, 7)
    explain = fxlrp.convert(block, Epsilon(0.0))
    assert torch.equal(explain(x), block(x))
    relevance = fxlrp.attribute(explain, x, target=1)

    def with_running_norm(value: Tensor) -> Tensor:  # the first norm uses running statistics
        norm = block.norm
        z = block.conv(value)
        shape = (1, -1, 1, 1)
        h = torch.relu((z - norm.running_mean.view(shape)) / torch.sqrt(norm.running_var.view(shape) + norm.eps)
                       * norm.weight.view(shape) + norm.bias.view(shape))
        z = block.conv2(h)
        h = torch.relu(linearised_instance_norm(z, z, None, None, 1e-4))
        return block.head(h.mean((2, 3)))

    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(with_running_norm(leaf)[:, 1].sum(), leaf)
    assert relative_error(relevance, gradient * x) < TOLERANCE


def test_an_input_without_a_batch_is_a_batch_of_one() -> None:
    norm = affine_norm(1, 4)
    x, relevance = random(4, 6), random(4, 6, seed=1)
    explain = fxlrp.convert(nn.Sequential(norm))
    assert torch.equal(explain(x), norm(x))
    [expected] = explained_relevance(explain, [x[None]], relevance[None])
    [actual] = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, expected[0]) < TOLERANCE  # (other shapes: the kernels may round otherwise)
