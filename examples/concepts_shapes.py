"""Concepts known by construction: does conditional relevance find the concepts of the deciding shape?

Generated images (no download), 1x20x20: a background texture - stripes, horizontal or vertical,
of random phase, with noise - and one shape of 5x5 pixels at a random position: a filled square, a
plus or a ring. The class is the shape; the texture is drawn independently of it, so it carries no
evidence and is, by construction, a concept the decision must not use. A small CNN learns the task
in seconds.

For held-out images, explained for their class with EpsilonPlus, the channels of the last
convolution are ranked by their relevance (the concept relevance vector), and the conditional
heatmaps of the three most relevant channels (:func:`fxlrp.concepts.conditional_relevance`) are
measured: the share of their positive relevance that lies on the shape (its box grown by a pixel,
where a 3x3 filter reads its edge), against the same share of the unconditional heatmap and chance
(the region's area over the image's); and whether the images of one shape share their top concept
(a detector of that shape). Turning the image (the stripes change orientation; the three shapes are
symmetric) leaves the prediction, and replacing the shape by another changes it (checked): the
shape is the evidence. A figure shows images with their top concepts' heatmaps, and an
attribution graph decomposes the top concept of one prediction into channels of the convolution
below.

Relevance maximisation (:func:`fxlrp.concepts.relevance_maximisation`) over further generated
images finds each channel's reference samples; for the top concept of each shape, the share of
its reference samples in which it peaks on the shape (against chance, the shape's share of the
image) is measured, and a picture of one prediction's top
concepts (:func:`fxlrp.concepts.top_concepts`) shows each with its share, conditional heatmap and
reference crops.

    python examples/concepts_shapes.py [--fast] [--out out/concepts_shapes]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.concepts import attribution_graph, conditional_relevance, relevance_maximisation, top_concepts, with_boxes
from fxlrp.viz import image

SIZE, SHAPE = 20, 5
SHAPES = ("square", "plus", "ring")
LAST = "features.4"
"""The last convolution (``features`` index 4)."""


def shape_pattern(kind: int) -> Tensor:
    pattern = torch.zeros(SHAPE, SHAPE)
    if kind == 0:
        pattern[:] = 1.0
    elif kind == 1:
        pattern[SHAPE // 2, :] = 1.0
        pattern[:, SHAPE // 2] = 1.0
    else:
        pattern[[0, -1], :] = 1.0
        pattern[:, [0, -1]] = 1.0
    return pattern


def make_images(count: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Images ``[count, 1, 20, 20]``, labels (the shape), the shapes' pixel masks and the textures'
    orientation (0 horizontal, 1 vertical)."""
    labels = torch.randint(0, len(SHAPES), (count,), generator=generator)
    orientation = torch.randint(0, 2, (count,), generator=generator)
    images, masks = torch.zeros(count, 1, SIZE, SIZE), torch.zeros(count, SIZE, SIZE, dtype=torch.bool)
    rows = torch.arange(SIZE).float()
    for index in range(count):
        phase = float(torch.rand(1, generator=generator)) * 4
        stripes = 0.5 * (torch.sin((rows + phase) * torch.pi / 2) > 0).float()
        texture = (stripes[:, None] if orientation[index] == 0 else stripes[None, :]).expand(SIZE, SIZE)
        images[index, 0] = texture + 0.1 * torch.randn(SIZE, SIZE, generator=generator)
        top, left = torch.randint(0, SIZE - SHAPE + 1, (2,), generator=generator).tolist()
        pattern = shape_pattern(int(labels[index]))
        region = images[index, 0, top:top + SHAPE, left:left + SHAPE]
        images[index, 0, top:top + SHAPE, left:left + SHAPE] = torch.where(pattern > 0, 1.5, region)
        masks[index, top:top + SHAPE, left:left + SHAPE] = pattern > 0
    return images, labels, masks, orientation


class ShapeNet(nn.Module):
    """Three convolutions, a global max pool, a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.classifier = nn.Linear(16, len(SHAPES))

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images).amax(dim=(2, 3)))


def make_model() -> nn.Module:
    return ShapeNet()


def train(model: nn.Module, steps: int, generator: torch.Generator, lr: float = 0.01) -> None:
    """Adam on ``steps`` batches of 64 fresh images (the generator makes as many as wanted)."""
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        images, labels, _, _ = make_images(64, generator)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()


def shape_regions(masks: Tensor) -> Tensor:
    """Each shape's 5x5 box grown by one pixel (a 3x3 filter reads the shape's edge from there)."""
    grown = nn.functional.max_pool2d(masks.float()[:, None], 3, stride=1, padding=1)[:, 0]
    boxes = torch.zeros_like(masks)
    for index, mask in enumerate(grown > 0):
        rows, columns = mask.nonzero(as_tuple=True)
        boxes[index, rows.min():rows.max() + 1, columns.min():columns.max() + 1] = True
    return boxes


def positive_share(relevance: Tensor, masks: Tensor) -> Tensor:
    """Per map: the share of positive relevance on the shape's pixels (0 where there is none)."""
    positive = relevance.clamp_min(0).sum(dim=-3)  # over the input channel
    total = positive.sum(dim=(-2, -1))
    return torch.where(total > 0, (positive * masks).sum(dim=(-2, -1)) / total.clamp_min(1e-30), 0.0)


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Returns the test accuracy, the mean shape share of the top concepts' heatmaps and of the
    unconditional heatmaps, chance, the top concept (channel) of each shape and how often an image
    of that shape has it as its top concept, how often these concepts peak on the shape in their
    reference samples, and the shares of predictions a texture swap or a shape swap changes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer training steps and test images (for CI)")
    parser.add_argument("--out", type=Path, default=Path("out/concepts_shapes"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs fastest on one thread
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.manual_seed(args.seed)
    model = make_model()
    started = time.perf_counter()
    train(model, 250 if args.fast else 600, torch.Generator().manual_seed(args.seed))
    seconds = time.perf_counter() - started
    images, labels, masks, orientation = make_images(40 if args.fast else 200, torch.Generator().manual_seed(999))
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)
        accuracy = (predicted == labels).float().mean().item()
        swapped_texture = images.transpose(-2, -1)  # stripes turned, shape transposed (all three are symmetric)
        texture_changes = (model(swapped_texture).argmax(dim=1) != predicted).float().mean().item()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlus())
    correct = predicted == labels
    images, labels, masks = images[correct], labels[correct], masks[correct]

    found = conditional_relevance(explain, images, [{}], target=labels, record=[LAST])
    channels = found.concept_relevance(LAST)[0]  # [samples, 16]: the concept relevance vector
    top = channels.argsort(dim=1, descending=True)[:, :3]
    regions = shape_regions(masks)
    shares, top_maps = [], []
    for index in range(images.shape[0]):
        conditions = [{LAST: [int(c)], "y": [int(labels[index])]} for c in top[index]]
        maps = conditional_relevance(explain, images[index:index + 1], conditions).heatmap[:, 0]  # [3, 1, 20, 20]
        shares.append(positive_share(maps, regions[index]).mean().item())
        top_maps.append(maps)
    modal = [int(top[labels == kind, 0].mode().values) if (labels == kind).any() else -1 for kind in range(len(SHAPES))]
    consistency = [(top[labels == kind, 0] == modal[kind]).float().mean().item()
                   for kind in range(len(SHAPES)) if (labels == kind).any()]
    result: dict[str, object] = {
        "accuracy": accuracy, "training_seconds": seconds, "texture_swap_changes": texture_changes,
        "shape_share_top_concepts": sum(shares) / len(shares),
        "shape_share_unconditional": positive_share(found.heatmap[0], regions).mean().item(),
        "chance": regions.float().mean().item(),
        "top_concept_per_shape": {SHAPES[kind]: modal[kind] for kind in range(len(SHAPES))},
        "top_concept_consistency": sum(consistency) / len(consistency),
    }
    with torch.no_grad():  # another shape at the same place changes the prediction
        other = images.clone()
        for index in range(other.shape[0]):
            rows, columns = masks[index].nonzero(as_tuple=True)
            top_row, left = int(rows.min()), int(columns.min())
            region = other[index, 0, top_row:top_row + SHAPE, left:left + SHAPE]
            region[region > 1.2] = 0.25  # the shape removed, its area grey
            replacement = shape_pattern((int(labels[index]) + 1) % len(SHAPES))
            region[replacement > 0] = 1.5
        result["shape_swap_changes"] = (model(other).argmax(dim=1) != labels).float().mean().item()

    args.out.mkdir(parents=True, exist_ok=True)
    shown = min(6, images.shape[0])
    stacked = torch.stack(top_maps[:shown])  # [shown, 3, 1, 20, 20]
    image.figure_grid(images[:shown], [found.heatmap[0][:shown]] + [stacked[:, k] for k in range(3)],
                      ["input", "all concepts", "concept 1", "concept 2", "concept 3"], args.out / "concepts.png",
                      sample_labels=[f"{SHAPES[int(labels[i])]}: channels {top[i].tolist()}" for i in range(shown)])
    reference_images, reference_labels, reference_masks, _ = make_images(100 if args.fast else 400,
                                                                          torch.Generator().manual_seed(7))
    batches = [(reference_images[start:start + 50], reference_labels[start:start + 50])
               for start in range(0, len(reference_images), 50)]
    references = relevance_maximisation(explain, batches, [LAST], k=8)[LAST]
    on_shape = shape_regions(reference_masks)
    peaks = []  # where each top concept peaks in its reference samples: on the shape?
    for concept in sorted({kind for kind in modal if kind >= 0}):
        samples, positions = references.relevance.samples[concept], references.relevance.positions[concept]
        peaks += [bool(on_shape[sample, position // SIZE, position % SIZE])
                  for sample, position in zip(samples.tolist(), positions.tolist(), strict=True)]
    result["reference_peaks_on_shape"] = sum(peaks) / len(peaks)
    references = with_boxes(explain, references, lambda index: reference_images[index])
    top = top_concepts(explain, images[:1], LAST, k=3, target=int(labels[0]), references=references,
                       sample=lambda index: reference_images[index], count=4)
    top.picture(args.out / "top_concepts.png").clf()
    graph = attribution_graph(explain, images[:1], [LAST, "features.2"], width=3, target=int(labels[0]))
    graph.picture(args.out / "graph.png").clf()
    result["graph"] = str(graph)
    return result


if __name__ == "__main__":
    found = main()
    print(found.pop("graph"))
    for key, value in found.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
