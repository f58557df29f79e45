"""scikit-learn's bundled 8x8 digits and a small CNN that learns them in a few seconds."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.toys import single_thread

INK_THRESHOLD = 0.25
"""A pixel is inked when its grey value is above this fraction of the maximum (16)."""


@dataclass(frozen=True)
class DigitsSplit:
    """Images ``[n, 1, 8, 8]`` with grey values in ``[0, 1]`` and their labels.

    The background is exactly 0: "no ink" is the reference the LRP rules measure against (a
    pixel with value 0 contributes ``x w = 0``). Centring the data instead (background -1) makes
    the background a signal of its own, and the heatmaps then highlight where ink is missing.
    """

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor

    def ink(self) -> Tensor:
        """Boolean mask ``[n, 8, 8]`` of the inked pixels of the test images."""
        return self.test_images[:, 0] > INK_THRESHOLD


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> DigitsSplit:
    """The 1797 digits of ``sklearn.datasets.load_digits``, shuffled and split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("the digits need scikit-learn: pip install scikit-learn") from error
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    images, labels = images[order], labels[order]
    test_count = int(len(labels) * test_fraction)
    return DigitsSplit(images[test_count:], labels[test_count:], images[:test_count], labels[:test_count])


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, max pooling and two linear layers: ~97% test accuracy on digits."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))


def train_classifier(model: nn.Module, images: Tensor, labels: Tensor, epochs: int = 8,
                     batch_size: int = 64, learning_rate: float = 3e-3, seed: int = 0) -> nn.Module:
    """Adam on cross-entropy; returns the model in eval mode."""
    with single_thread():
        generator = torch.Generator().manual_seed(seed)
        optimiser = torch.optim.Adam(model.parameters(), lr=learning_rate)
        model.train()
        for _ in range(epochs):
            for batch in torch.randperm(len(labels), generator=generator).split(batch_size):
                loss = F.cross_entropy(model(images[batch]), labels[batch])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    return (model(images).argmax(dim=1) == labels).float().mean().item()


def positive_relevance_on_ink(relevance: Tensor, ink: Tensor) -> Tensor:
    """Per image, the share of positive relevance that lies on inked pixels:
    ``sum_{p inked} max(R_p, 0) / sum_p max(R_p, 0)`` for ``[n, 8, 8]`` maps (0 if none positive)."""
    positive = relevance.clamp(min=0).flatten(1)
    total = positive.sum(dim=1)
    on_ink = (positive * ink.flatten(1)).sum(dim=1)
    return torch.where(total > 0, on_ink / total.clamp(min=1e-30), torch.zeros_like(total))
