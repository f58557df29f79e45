"""The cost of explaining one detection against the model's own gradient of the same logit.

    python benchmarks/detection_cost.py                  # both detectors, 7 pairs each
    python benchmarks/detection_cost.py --pairs 11 --detectors retinanet_resnet50_fpn
    python benchmarks/detection_cost.py --profile retinanet_resnet50_fpn   # where the time goes

For each detector (random weights, one 256 x 320 image, one thread), a pair is: the model's own
forward and backward of one detection's class logit to the image (``torch.autograd.grad`` of the
logit, taken from the classification head's output in that run), and
:func:`fxlrp.integrations.torchvision.explain_detection` of the same detection (its forward,
finding the logit, and the relevance backward). The two alternate; the ratio is the median of
the explanation's times over the median of the gradient's. ``--profile`` prints the largest
entries of ``cProfile`` over a few explanations instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from torch import Tensor, nn
from torchvision.models import detection

import fxlrp
from fxlrp.integrations.torchvision import LOGIT_HEADS, explain_detection

SETTINGS = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": dict(box_score_thresh=0.0, box_detections_per_img=10),
    "retinanet_resnet50_fpn": dict(score_thresh=0.0, detections_per_img=10),
}
"""The detectors timed, with settings that keep 10 detections with random weights."""


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(detection, name)(weights=None, weights_backbone=None, num_classes=5, min_size=256, max_size=320,
                                    **SETTINGS[name]).eval()


def gradient_of_logit(model: nn.Module, x: Tensor, position: tuple[int, ...]) -> Tensor:
    """The model's own forward, and the gradient of the logit at ``position`` of its
    classification head's output with respect to the image."""
    outputs: list[Tensor] = []
    handles = [module.register_forward_hook(
        lambda module, args, output: outputs.append(output[0] if isinstance(output, tuple) else output))
        for module in model.modules() if isinstance(module, tuple(LOGIT_HEADS))]
    leaf = x.clone().requires_grad_()
    try:
        model(leaf)
    finally:
        for handle in handles:
            handle.remove()
    (gradient,) = torch.autograd.grad(outputs[0][position], leaf)
    return gradient


def paired(name: str, pairs: int) -> tuple[float, float]:
    """The medians of the gradient's and the explanation's times, over ``pairs`` alternations."""
    model = build(name)
    x = torch.rand(1, 3, 256, 320, generator=torch.Generator().manual_seed(1))
    explain = fxlrp.convert(model)
    position = explain_detection(explain, x, 0).position  # (warm-up of both)
    gradient_of_logit(model, x, position)
    gradients, explanations = [], []
    for _ in range(pairs):
        start = time.perf_counter()
        gradient_of_logit(model, x, position)
        gradients.append(time.perf_counter() - start)
        start = time.perf_counter()
        explain_detection(explain, x, 0)
        explanations.append(time.perf_counter() - start)
    return statistics.median(gradients), statistics.median(explanations)


def profile(name: str) -> None:
    model = build(name)
    x = torch.rand(1, 3, 256, 320, generator=torch.Generator().manual_seed(1))
    explain = fxlrp.convert(model)
    explain_detection(explain, x, 0)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        explain_detection(explain, x, 0)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--detectors", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--profile", choices=list(SETTINGS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.profile:
        profile(args.profile)
        return
    print(f"{'detector':40s} {'gradient s':>11s} {'explanation s':>14s} {'ratio':>6s}")
    for name in args.detectors:
        gradient, explanation = paired(name, args.pairs)
        print(f"{name:40s} {gradient:11.3f} {explanation:14.3f} {explanation / gradient:6.2f}")


if __name__ == "__main__":
    main()
