"""The small CNN of the concept tests, and comparing reference samples of concepts
(fxlrp.concepts.relevance_maximisation, fxlrp explain --concepts) found by other kernels: where
scores are tied within rounding the order may differ."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def small_cnn() -> nn.Module:
    """Three convolutions, max and average pooling, a linear layer; float64, seed 1."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(20, 4),
    ).double().eval()


def separated(scores: Tensor, tolerance: float = 1e-9) -> Tensor:
    """Where a row's sorted scores differ from both neighbours by more than rounding (relative to
    the row's largest): there the order of samples is the same whatever kernels computed them."""
    gap = tolerance * scores.abs().amax(-1, keepdim=True)
    distinct = torch.ones_like(scores, dtype=torch.bool)
    distinct[:, 1:] &= (scores[:, 1:] - scores[:, :-1]).abs() > gap
    distinct[:, :-1] &= (scores[:, :-1] - scores[:, 1:]).abs() > gap
    return distinct


def at_peak(values: Tensor, samples: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """``values [samples, concepts, positions]`` at each concept's chosen sample and position, and
    the largest value of that sample's concept: a peak found from other kernels' values may be
    another position of (within rounding) the same value."""
    concepts = torch.arange(samples.shape[0])[:, None].expand_as(samples)
    return values[samples, concepts, positions], values[samples, concepts].amax(-1)
