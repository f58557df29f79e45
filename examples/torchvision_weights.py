"""A torchvision model loaded from your own weights file, explained from Python and from the shell.

Without network access there are no pretrained weights, so the example makes a weights file
itself: a torchvision ResNet-18 for 10 classes whose last layer is fitted to scikit-learn's
digits (scaled to 32x32, three channels). For speed the convolutional layers keep their random
initialisation; the heatmaps therefore show what a linear read-out of random features uses, not
what a fully trained ResNet would. With your own file, skip to step 2.

1. ``torch.save(model.state_dict(), "resnet18_digits.pt")``
2. reload it into ``torchvision.models.resnet18(num_classes=10)`` and explain with
   ``fxlrp.convert``;
3. the same from the command line:
   ``fxlrp explain --model torchvision:resnet18 --weights resnet18_digits.pt --size 32 IMAGE... --out DIR``
   (``--weights`` decides the number of classes).

    python examples/torchvision_weights.py [--fast] [--out out/torchvision]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

import fxlrp
from fxlrp.app import cli
from fxlrp.toys.digits import load_digits_split
from fxlrp.viz import image

SIZE = 32
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)


def as_rgb_32(digits: torch.Tensor) -> torch.Tensor:
    """8x8 grey digits in [0, 1] -> [n, 3, 32, 32] pixels in [0, 1]."""
    return F.interpolate(digits, size=SIZE, mode="bilinear", align_corners=False).clamp(0, 1).repeat(1, 3, 1, 1)


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """What ``fxlrp explain`` does to torchvision inputs: ImageNet mean and std per channel."""
    return (pixels - IMAGENET_MEAN) / IMAGENET_STD


def fit_last_layer(model: torchvision.models.ResNet, images: torch.Tensor, labels: torch.Tensor,
                   steps: int) -> None:
    """Fit ``model.fc`` on the (fixed) features of the rest of the network."""
    head, model.fc = model.fc, torch.nn.Identity()
    with torch.no_grad():
        features = model.eval()(images)
    model.fc = head
    optimiser = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = F.cross_entropy(head(features), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer training images and steps (for CI)")
    parser.add_argument("--out", type=Path, default=Path("out/torchvision"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    data = load_digits_split()
    train_count = 300 if args.fast else 1000
    train = normalise(as_rgb_32(data.train_images[:train_count]))
    test_pixels = as_rgb_32(data.test_images[:200])

    # 1. a model and its weights file, as a user would have them
    model = torchvision.models.resnet18(num_classes=10)
    fit_last_layer(model, train, data.train_labels[:train_count], steps=100 if args.fast else 300)
    weights = args.out / "resnet18_digits.pt"
    torch.save(model.state_dict(), weights)

    # 2. reload the file into a fresh torchvision model and explain it from Python
    reloaded = torchvision.models.resnet18(num_classes=10)
    reloaded.load_state_dict(torch.load(weights, weights_only=True))
    reloaded.eval()
    test = normalise(test_pixels)
    with torch.no_grad():
        correct = (reloaded(test).argmax(1) == data.test_labels[:200]).float().mean().item()
    print(f"weights {weights}: test accuracy {correct:.1%} (random convolutions, fitted last layer)")
    explain = fxlrp.convert(reloaded)
    relevance = fxlrp.attribute(explain, test[:4], target=data.test_labels[:4])
    path = image.figure_grid(test_pixels[:4], [relevance], ["input", "epsilon"], args.out / "python_heatmaps.png")
    print(f"heatmaps from Python -> {path}")

    # 3. the same model from the command line, on PNG files
    files = []
    for index in range(4):
        files.append(str(image.save_png(image.image_to_rgb(test_pixels[index], 0.0, 1.0),
                                        args.out / "inputs" / f"digit{index}.png")))
    exit_code = cli.main(["explain", "--model", "torchvision:resnet18", "--weights", str(weights),
                          "--size", str(SIZE), "--batch-size", "2", *files, "--out", str(args.out / "cli")])
    print(f"fxlrp explain exit code {exit_code}; heatmaps in {args.out / 'cli'}/")
    return correct


if __name__ == "__main__":
    main()
