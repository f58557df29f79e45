"""Faithfulness side by side: ABPC of fxlrp's composites, Captum's attributions, zennit and a
random map on the same trained model, inputs and perturbation curves (``fxlrp.evaluate``).

Digits: ``fxlrp.toys.digits.DigitsCNN`` trained here (8 epochs, seconds) on scikit-learn's bundled
8x8 digits; the first ``--samples`` test images, each explained for its predicted class. Curves:
pixels deleted most / least relevant first in 16 steps (4 pixels each), zero baseline (the
background of the digits), the class logit. ABPC = AUC(LeRF) - AUC(MoRF) over the fraction
deleted (in logits), the mean over the images with its 95% percentile bootstrap interval.

Methods: fxlrp (Epsilon 1e-6, EpsilonPlus, EpsilonPlusFlat, EpsilonAlpha2Beta1, EpsilonGammaBox
with the pixel range [0, 1]); Captum (Saliency with absolute gradients, InputXGradient,
IntegratedGradients with 32 steps from the zero image, LRP with its default rules and the identity
on Flatten, which stops with an error in a backward hook on this model); zennit 0.5.1
(EpsilonPlusFlat); a Gaussian random map.

Run: ``python benchmarks/faithfulness.py [--samples 200] [--markdown]``.
"""

from __future__ import annotations

import argparse
import copy
import platform
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.evaluate import image_curves, ranked, table
from fxlrp.toys.digits import DigitsCNN, accuracy, load_digits_split, train_classifier


def captum_methods(model: nn.Module) -> dict[str, Callable[[Tensor, Tensor], Tensor]]:
    from captum.attr import LRP, InputXGradient, IntegratedGradients, Saliency
    from captum.attr._utils.lrp_rules import IdentityRule

    lrp_model = copy.deepcopy(model)  # Captum's LRP reads a rule from each module: Flatten has none
    for module in lrp_model.modules():
        if isinstance(module, nn.Flatten):
            module.rule = IdentityRule()
    return {
        "Captum saliency": lambda x, t: Saliency(model).attribute(x, target=t, abs=True),
        "Captum gradient x input": lambda x, t: InputXGradient(model).attribute(x, target=t),
        "Captum integrated gradients": lambda x, t: IntegratedGradients(model).attribute(x, target=t, n_steps=32),
        "Captum LRP": lambda x, t: LRP(lrp_model).attribute(x, target=t),
    }


def attributed(method: Callable[[Tensor, Tensor], Tensor], images: Tensor, targets: Tensor) -> Tensor | str:
    """The method's relevance, or the first line of the error it raises."""
    try:
        return method(images.clone().requires_grad_(True), targets).detach()
    except (RuntimeError, TypeError) as error:
        return str(error).splitlines()[0]


def zennit_methods(model: nn.Module) -> dict[str, Callable[[Tensor, Tensor], Tensor]]:
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat

    def epsilon_plus_flat(x: Tensor, t: Tensor) -> Tensor:
        with Gradient(model=model, composite=EpsilonPlusFlat()) as attributor:
            return attributor(x, torch.eye(10)[t])[1]

    return {"zennit EpsilonPlusFlat": epsilon_plus_flat}


def fxlrp_methods(model: nn.Module) -> dict[str, Callable[[Tensor, Tensor], Tensor]]:
    composites = {"Epsilon": fxlrp.rules.Epsilon(1e-6), "EpsilonPlus": fxlrp.composites.EpsilonPlus(),
                  "EpsilonPlusFlat": fxlrp.composites.EpsilonPlusFlat(),
                  "EpsilonAlpha2Beta1": fxlrp.composites.EpsilonAlpha2Beta1(),
                  "EpsilonGammaBox": fxlrp.composites.EpsilonGammaBox(0.0, 1.0)}
    methods = {}
    for name, composite in composites.items():
        explain = fxlrp.convert(model, composite)
        methods[f"fxlrp {name}"] = lambda x, t, explain=explain: fxlrp.attribute(explain, x, target=t)
    return methods


def digits(samples: int) -> tuple[str, dict[str, Tensor]]:
    torch.manual_seed(0)
    split = load_digits_split()
    model = DigitsCNN()
    train_classifier(model, split.train_images, split.train_labels)
    model.eval()
    images = split.test_images[:samples]
    with torch.no_grad():
        targets = model(images).argmax(dim=1)
    methods = {**fxlrp_methods(model), **captum_methods(model), **zennit_methods(model),
               "random": lambda x, t: torch.randn(x.shape, generator=torch.Generator().manual_seed(1))}
    results = {}
    for name, method in methods.items():
        relevance = attributed(method, images, targets)
        if isinstance(relevance, str):
            print(f"{name}: fails on this model: {relevance}")
            continue
        curves = image_curves(model, images, relevance, targets, features_per_step=4, progress=False)
        results[name] = curves.abpc()
    heading = (f"digits CNN ({accuracy(model, split.test_images, split.test_labels):.1%} test accuracy), "
               f"{samples} test images, 16 steps of 4 pixels, zero baseline, logit")
    return heading, results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    print(f"{platform.machine()}, torch {torch.__version__}")
    heading, results = digits(args.samples)
    rows = ranked(results)
    print(heading)
    if args.markdown:
        print("| method | ABPC | 95% interval |\n|---|---:|---|")
        for name, interval in rows:
            print(f"| {name} | {interval.mean:.2f} | [{interval.low:.2f}, {interval.high:.2f}] |")
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
