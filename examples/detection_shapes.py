"""A detection explained: a small Faster R-CNN finds squares, disks and triangles on noise.

The images are made here (no download): two shapes of different kinds on grey noise, all of the
same brightness and of similar sizes, so the class of a detection is decided by the shape alone,
and the boxes are known by construction. A Faster R-CNN with a backbone of three convolutions
trains on them on a CPU (two shared cores: ``--fast``, 250 steps and 16 test images, 1.7 min;
the full run, 600 steps and 64 test images, 14 min). fxlrp then explains the class logit of the
detection of each test image's first shape (``detection_target`` picks it by the shape's class
and true box, ``explain_detection`` explains it) with its default rules and with EpsilonPlus,
and prints how much of the positive relevance lies inside the detected box and on the shape,
against gradient x input and a map of random numbers (whose share is about the box's area
fraction). It saves a picture: images with the detected box, beside the heatmaps.

    python examples/detection_shapes.py [--fast] [--out out/detection_shapes]

Measured (the full run): all 64 test shapes detected; the detected box covers 8.7% of the image,
the shape 6.8%; of the positive relevance, fxlrp's default rules put 68% in the box and 59% on
the shape (the same as gradient x input, which they equal on this network up to epsilon),
EpsilonPlus 66% and 49%, a random map 8.8% and 6.9%.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.ops import MultiScaleRoIAlign, box_iou

import fxlrp
from fxlrp.integrations.torchvision import detection_target, explain_detection
from fxlrp.viz import image

SIZE = 64
"""Images are SIZE x SIZE pixels."""
KINDS = ("square", "disk", "triangle")
"""The classes 1, 2, 3 (0 is the background)."""
BRIGHTNESS = 0.9
"""Every shape's grey value (over a background of 0.45 +- 0.15)."""
SHOWN = 4
"""How many test images get a picture."""


def shape_mask(kind: str, centre: tuple[float, float], size: float) -> Tensor:
    """The pixels of a shape: a square of side ``size``, a disk of that diameter, a triangle with
    that base and height (its apex up), about the same area each."""
    rows, columns = torch.meshgrid(torch.arange(SIZE) + 0.5, torch.arange(SIZE) + 0.5, indexing="ij")
    y, x = rows - centre[0], columns - centre[1]
    half = size / 2
    if kind == "square":
        return (x.abs() <= half) & (y.abs() <= half)
    if kind == "disk":
        return x**2 + y**2 <= half**2
    # a triangle: from the apex at y = -half to the base at y = +half, width growing with y
    return (y.abs() <= half) & (x.abs() <= (y + half) / 2)


def make_images(count: int, generator: torch.Generator) -> tuple[Tensor, list[dict[str, Tensor]], Tensor]:
    """``count`` images with two shapes each of two different kinds, their targets (boxes in
    pixels, ``x0, y0, x1, y1``, and labels) and the shapes' masks ``[count, 2, SIZE, SIZE]``."""
    images = (0.45 + 0.15 * torch.randn(count, 1, SIZE, SIZE, generator=generator)).clamp(0, 1).repeat(1, 3, 1, 1)
    targets, masks = [], torch.zeros(count, 2, SIZE, SIZE, dtype=torch.bool)
    for number in range(count):
        kinds = torch.randperm(len(KINDS), generator=generator)[:2]
        boxes = []
        while len(boxes) < 2:
            size = 14 + 10 * torch.rand(1, generator=generator).item()
            centre = (size / 2 + 1 + (SIZE - size - 2) * torch.rand(2, generator=generator)).tolist()
            box = torch.tensor([centre[1] - size / 2, centre[0] - size / 2, centre[1] + size / 2, centre[0] + size / 2])
            if boxes and box_iou(box[None], boxes[0][None]).item() > 0 or boxes and _apart(box, boxes[0]) < 2:
                continue  # (the shapes must not touch)
            mask = shape_mask(KINDS[kinds[len(boxes)]], centre, size)
            images[number, :, mask] = BRIGHTNESS
            masks[number, len(boxes)] = mask
            boxes.append(_tight(mask))
        targets.append({"boxes": torch.stack(boxes), "labels": kinds + 1})
    return images, targets, masks


def _apart(first: Tensor, second: Tensor) -> float:
    """The gap between two boxes (negative when they overlap)."""
    return max(second[0] - first[2], first[0] - second[2], second[1] - first[3], first[1] - second[3]).item()


def _tight(mask: Tensor) -> Tensor:
    """The box around a mask's pixels, ``x0, y0, x1, y1`` (pixel edges)."""
    rows, columns = mask.nonzero(as_tuple=True)
    return torch.stack([columns.min(), rows.min(), columns.max() + 1, rows.max() + 1]).float()


def detector() -> FasterRCNN:
    """Faster R-CNN on a backbone of three convolutions (stride 4, 32 channels), anchors of the
    shapes' sizes, and a small box head."""
    backbone = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
    )
    backbone.out_channels = 32
    return FasterRCNN(
        backbone, min_size=SIZE, max_size=SIZE, image_mean=[0.5] * 3, image_std=[0.25] * 3,
        rpn_anchor_generator=AnchorGenerator(((12, 18, 26),), ((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        box_head=TwoMLPHead(32 * 7 * 7, 128), box_predictor=FastRCNNPredictor(128, len(KINDS) + 1),
        rpn_pre_nms_top_n_train=300, rpn_post_nms_top_n_train=100, rpn_pre_nms_top_n_test=100,
        rpn_post_nms_top_n_test=30, rpn_batch_size_per_image=64, box_batch_size_per_image=64,
        box_detections_per_img=10,
    )


def train(model: FasterRCNN, steps: int, generator: torch.Generator, batch: int = 8) -> FasterRCNN:
    """Adam on fresh images at every step (the generator makes as many as wanted)."""
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.train()
    for step in range(steps):
        images, targets, _ = make_images(batch, generator)
        losses = model(list(images), targets)
        loss = sum(losses.values())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}: loss {loss.item():.3f}", flush=True)
    return model.eval()


def positive_share(relevance: Tensor, region: Tensor) -> float:
    """The share of the positive relevance (summed over colour channels) inside a region of pixels."""
    positive = relevance.sum(0).clamp(min=0)
    return (positive[region].sum() / positive.sum()).item() if positive.sum() > 0 else 0.0


def box_region(box: Tensor) -> Tensor:
    """The pixels whose centres lie inside a box ``x0, y0, x1, y1``."""
    centres = torch.arange(SIZE) + 0.5
    inside_y = (centres >= box[1]) & (centres <= box[3])
    inside_x = (centres >= box[0]) & (centres <= box[2])
    return inside_y[:, None] & inside_x[None, :]


def gradient_times_input(model: FasterRCNN, x: Tensor, position: tuple[int, ...]) -> Tensor:
    """Gradient x input of the class logit at ``position`` of the box predictor's output."""
    logits: list[Tensor] = []
    handle = model.roi_heads.box_predictor.register_forward_hook(lambda module, args, out: logits.append(out[0]))
    leaf = x.clone().requires_grad_()
    try:
        model(leaf[None])
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(logits[0][position], leaf)
    return gradient * x


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer training steps and test images (for the tests)")
    parser.add_argument("--out", type=Path, default=Path("out/detection_shapes"))
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = train(detector(), 250 if args.fast else 600, generator)

    images, targets, masks = make_images(16 if args.fast else 64, torch.Generator().manual_seed(1))
    # fxlrp's default (the epsilon rule on layers; on this network of convolutions, ReLU, RoIAlign
    # and linear layers it equals gradient x input up to epsilon) and EpsilonPlus (z+ on the
    # convolutions: only positive contributions, as recommended for CNNs' lower layers)
    explainers = {"fxlrp default (epsilon)": fxlrp.convert(model),
                  "fxlrp EpsilonPlus": fxlrp.convert(model, fxlrp.composites.EpsilonPlus())}
    methods = [*explainers, "gradient x input", "random map"]
    shares: dict[str, dict[str, list[float]]] = {method: {"box": [], "shape": []} for method in methods}
    found, area, shown = 0, [], []
    random = torch.Generator().manual_seed(2)
    for number, (x, target) in enumerate(zip(images, targets, strict=True)):
        detections = explainers["fxlrp default (epsilon)"](x[None])[0]
        # the detection of the first shape's class that overlaps its true box most
        label, true_box = int(target["labels"][0]), target["boxes"][0]
        same = detections["labels"] == label
        if not same.any() or box_iou(detections["boxes"][same].detach(), true_box[None]).max() < 0.5:
            continue
        found += 1
        index = detection_target(detections, label=label, box=true_box)
        box = detections["boxes"][index].detach()
        region = box_region(box)
        area.append(region.float().mean().item())
        maps = {}
        for method, explain in explainers.items():
            explained = explain_detection(explain, x[None], index)
            maps[method] = explained.relevance[0]
        maps["gradient x input"] = gradient_times_input(model, x, explained.position)
        maps["random map"] = torch.randn(x.shape, generator=random)
        for method, relevance in maps.items():
            shares[method]["box"].append(positive_share(relevance, region))
            shares[method]["shape"].append(positive_share(relevance, masks[number, 0]))
        if len(shown) < SHOWN:
            shown.append((x, box, KINDS[label - 1], maps))

    mean = {method: {where: sum(values) / max(len(values), 1) for where, values in measured.items()}
            for method, measured in shares.items()}
    fraction = sum(area) / max(len(area), 1)
    print(f"\ndetected (class right, IoU >= 0.5): {found} of {len(images)} test shapes")
    print(f"the detected box covers {fraction:.1%} of the image on average; the shape "
          f"{masks[:, 0].float().mean().item():.1%}")
    print(f"{'share of positive relevance':30s} {'inside the box':>15s} {'on the shape':>13s}")
    for method, value in mean.items():
        print(f"{method:30s} {value['box']:15.1%} {value['shape']:13.1%}")
    path = picture(shown, args.out / "detection_shapes.png")
    print(f"picture: {path}")
    return {"found": found, "tested": len(images), "area": fraction, "shares": mean}


def picture(shown: list[tuple[Tensor, Tensor, str, dict[str, Tensor]]], path: Path) -> Path:
    """Each image with its detected box, beside the heatmaps of each method (red: for the class,
    blue: against it), the box drawn on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    columns = 1 + len(shown[0][3])
    figure, axes = plt.subplots(len(shown), columns, figsize=(2.2 * columns, 2.3 * len(shown)), squeeze=False)
    for row, (x, box, kind, maps) in enumerate(shown):
        pictures = [("input: " + kind, image.image_to_rgb(x, 0.0, 1.0))]
        pictures += [(method, image.heatmap(relevance)) for method, relevance in maps.items()]
        for axis, (title, rgb) in zip(axes[row], pictures, strict=True):
            axis.imshow(rgb, interpolation="nearest")
            x0, y0, x1, y1 = box.tolist()
            axis.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, edgecolor="lime",
                                     linewidth=1.5))
            axis.set_title(title, fontsize=8)
            axis.axis("off")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


if __name__ == "__main__":
    main()
