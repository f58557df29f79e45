"""Heatmaps of handwritten digits under two composites.

A small CNN learns scikit-learn's bundled 8x8 digits in a few seconds (no download). fxlrp
explains the true class of some test digits twice: with the epsilon rule on every layer and with
zennit's EpsilonGammaBox composite (ZBox on the first convolution, Gamma on the others, Epsilon
on the dense layers). It writes one PNG per digit and composite (bwr colours: red for the class,
blue against it, white neutral) and a figure with all of them, and prints how much of the
positive relevance lies on inked pixels.

    python examples/digits_heatmaps.py [--fast] [--out out/digits]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

import fxlrp
from fxlrp.toys.digits import DigitsCNN, accuracy, load_digits_split, positive_relevance_on_ink, train_classifier
from fxlrp.viz import image

SHOWN = 8
"""How many test digits get a picture (the first ones of the test split)."""


def composites() -> dict[str, Any]:
    """Epsilon everywhere, and zennit's EpsilonGammaBox with the bounds of grey values in [0, 1]."""
    return {"epsilon": fxlrp.rules.Epsilon(1e-6),
            "epsilon_gamma_box": fxlrp.composites.EpsilonGammaBox(low=0.0, high=1.0)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="3 training epochs instead of 8 (for CI)")
    parser.add_argument("--out", type=Path, default=Path("out/digits"))
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    data = load_digits_split()
    model = train_classifier(DigitsCNN(), data.train_images, data.train_labels, epochs=3 if args.fast else 8)
    print(f"test accuracy {accuracy(model, data.test_images, data.test_labels):.1%}")

    shown = slice(0, SHOWN)
    fractions: dict[str, float] = {}
    relevances = []
    for name, composite in composites().items():
        explain = fxlrp.convert(model, composite)  # the model itself stays untouched
        relevance = fxlrp.attribute(explain, data.test_images, target=data.test_labels)
        fractions[name] = positive_relevance_on_ink(relevance[:, 0], data.ink()).mean().item()
        print(f"{name:18s}: {fractions[name]:.1%} of the positive relevance lies on inked pixels")
        image.save_pngs(image.heatmap(relevance[shown]), args.out,
                        [f"digit{index}_{name}" for index in range(SHOWN)], scale=16)
        relevances.append(relevance[shown])
    random = positive_relevance_on_ink(torch.randn(data.ink().shape), data.ink()).mean().item()
    print(f"{'random heatmap':18s}: {random:.1%} (ink covers {data.ink().float().mean().item():.1%} of the pixels)")

    figure = image.figure_grid(data.test_images[shown], relevances, ["input", *composites()],
                               args.out / "digits_heatmaps.png",
                               sample_labels=[f"label {int(label)}" for label in data.test_labels[shown]],
                               samples_in_columns=True)
    print(f"pictures in {args.out}/ (overview: {figure})")
    return fractions


if __name__ == "__main__":
    main()
