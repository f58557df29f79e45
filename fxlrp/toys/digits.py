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
    """Training images ``[n, 1, 8, 8]``."""
    train_labels: Tensor
    """Their labels ``[n]``, 0 to 9."""
    test_images: Tensor
    """Test images ``[m, 1, 8, 8]``."""
    test_labels: Tensor
    """Their labels ``[m]``."""

    def ink(self) -> Tensor:
        """Boolean mask of the inked pixels of the test images.

        Returns
        -------
        Tensor
            ``[m, 8, 8]``, True where the grey value is above :data:`INK_THRESHOLD`.
        """
        return self.test_images[:, 0] > INK_THRESHOLD


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> DigitsSplit:
    """The 1797 digits of ``sklearn.datasets.load_digits``, shuffled and split.

    Parameters
    ----------
    test_fraction : float, default 0.25
        The fraction of the digits in the test split.
    seed : int, default 0
        The seed of the shuffle.

    Returns
    -------
    DigitsSplit
        Training and test images and labels.

    Raises
    ------
    ImportError
        If scikit-learn is not installed.
    """
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
    """Two 3x3 convolutions, max pooling and two linear layers: ~97% test accuracy on digits.

    Parameters
    ----------
    classes : int, default 10
        The number of classes.
    """

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, images: Tensor) -> Tensor:
        """The class logits.

        Parameters
        ----------
        images : Tensor
            ``[n, 1, 8, 8]``.

        Returns
        -------
        Tensor
            ``[n, classes]``.
        """
        return self.classifier(self.features(images))


def train_classifier(model: nn.Module, images: Tensor, labels: Tensor, epochs: int = 8,
                     batch_size: int = 64, learning_rate: float = 3e-3, seed: int = 0) -> nn.Module:
    """Train a classifier with Adam on cross-entropy.

    Parameters
    ----------
    model : nn.Module
        The classifier, trained in place.
    images : Tensor
        Training images.
    labels : Tensor
        Their labels.
    epochs : int, default 8
        Passes over the images.
    batch_size : int, default 64
        Images per step.
    learning_rate : float, default 3e-3
        Adam's learning rate.
    seed : int, default 0
        The seed of the batches' order.

    Returns
    -------
    nn.Module
        ``model``, in eval mode.
    """
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
    """The fraction of images whose largest logit is their label.

    Parameters
    ----------
    model : nn.Module
        The classifier.
    images : Tensor
        Images.
    labels : Tensor
        Their labels.

    Returns
    -------
    float
        The accuracy, in ``[0, 1]``.
    """
    return (model(images).argmax(dim=1) == labels).float().mean().item()


def positive_relevance_on_ink(relevance: Tensor, ink: Tensor) -> Tensor:
    """Per image, the share of positive relevance that lies on inked pixels.

    That is ``sum_{p inked} max(R_p, 0) / sum_p max(R_p, 0)``.

    Parameters
    ----------
    relevance : Tensor
        Relevance maps ``[n, 8, 8]``.
    ink : Tensor
        Boolean masks ``[n, 8, 8]`` of the inked pixels (:meth:`DigitsSplit.ink`).

    Returns
    -------
    Tensor
        ``[n]``; 0 for a map without positive relevance.
    """
    positive = relevance.clamp(min=0).flatten(1)
    total = positive.sum(dim=1)
    on_ink = (positive * ink.flatten(1)).sum(dim=1)
    return torch.where(total > 0, on_ink / total.clamp(min=1e-30), torch.zeros_like(total))
