"""A detector's box score as the target of perturbation curves (:class:`DetectionScore`): against
hand-made detections with known overlaps, against a brute-force match (each perturbed image run
alone, the detections matched by a loop with the IoU written out), and the batched curves against a
loop over steps. A tiny Faster R-CNN with random weights in float64 (every class gets a detection:
no score threshold)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from fxlrp.evaluate import DetectionScore, EvaluationInputError, image_baseline, image_curves

torchvision = pytest.importorskip("torchvision")
from torchvision.models.detection import FasterRCNN  # noqa: E402
from torchvision.models.detection.anchor_utils import AnchorGenerator  # noqa: E402
from torchvision.ops import MultiScaleRoIAlign  # noqa: E402

BOUND = 1e-12  # float64: one image at a time or in a batch, the same detector; batching changes the rounding only
SIZE, PATCH = 32, 8


def tiny_detector() -> nn.Module:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
    backbone.out_channels = 8
    return FasterRCNN(backbone, num_classes=3, min_size=SIZE, max_size=SIZE,
                      rpn_anchor_generator=AnchorGenerator(sizes=((8, 16),), aspect_ratios=((1.0,),)),
                      box_roi_pool=MultiScaleRoIAlign(["0"], 4, 2), representation_size=16, box_score_thresh=0.0,
                      box_detections_per_img=12, rpn_pre_nms_top_n_test=40, rpn_post_nms_top_n_test=12).eval().double()


def pictures(count: int) -> Tensor:
    generator = torch.Generator().manual_seed(1)
    images = 0.4 + 0.1 * torch.rand(count, 3, SIZE, SIZE, dtype=torch.float64, generator=generator)
    images[:, :, 6:18, 10:22] = 0.9  # a bright square
    return images


def iou_by_hand(first: list[float], second: list[float]) -> float:
    width = max(0.0, min(first[2], second[2]) - max(first[0], second[0]))
    height = max(0.0, min(first[3], second[3]) - max(first[1], second[1]))
    inside = width * height
    area = (first[2] - first[0]) * (first[3] - first[1]) + (second[2] - second[0]) * (second[3] - second[1])
    return inside / (area - inside)


def matched_by_hand(detections: dict[str, Tensor], label: int, box: list[float], min_iou: float = 0.5) -> float:
    """The score of the first detection of ``label`` with the largest IoU with ``box``, 0 below ``min_iou``."""
    best, score = -1.0, 0.0
    for found, kind, value in zip(detections["boxes"].tolist(), detections["labels"].tolist(),
                                  detections["scores"].tolist(), strict=True):
        overlap = iou_by_hand(found, box)
        if kind == label and overlap > best:
            best, score = overlap, value
    return score if best >= min_iou else 0.0


def test_the_match_is_the_same_class_with_the_largest_overlap_above_the_threshold() -> None:
    explained = DetectionScore(torch.tensor([1, 1]), torch.tensor([[0.0, 0.0, 10.0, 10.0]] * 2))
    output = [
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 6.0], [0.0, 0.0, 10.0, 7.0]]),
         "labels": torch.tensor([2, 1, 1]), "scores": torch.tensor([0.9, 0.3, 0.2])},   # IoU 1 (other class), .6, .7
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 4.0], [20.0, 20.0, 30.0, 30.0]]),
         "labels": torch.tensor([1, 1]), "scores": torch.tensor([0.8, 0.7])},           # IoU .4, 0: vanished
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0)},
    ]
    scores = explained(output, torch.tensor([0, 1, 0]))
    assert scores.tolist() == [pytest.approx(0.2), 0.0, 0.0]
    assert DetectionScore(explained.labels, explained.boxes, min_iou=0.4)(output[1:2], torch.tensor([1])).tolist() \
        == [pytest.approx(0.8)]


def test_box_score_equals_a_brute_force_match_of_each_perturbed_image() -> None:
    model, images = tiny_detector(), pictures(2)
    with torch.no_grad():
        detections = [model(image[None])[0] for image in images]
    explained = DetectionScore.of(detections, [0, 8])  # (of class 1 and 2)
    generator = torch.Generator().manual_seed(3)
    perturbed, samples = [], []
    for sample, sigma in ((0, 0.0), (1, 0.01), (0, 0.03), (1, 0.1), (0, 0.3), (1, 1.0)):  # ever more noise
        perturbed.append(images[sample] + sigma * torch.randn(images[sample].shape, generator=generator,
                                                              dtype=torch.float64))
        samples.append(sample)
    with torch.no_grad():
        scores = explained(model(torch.stack(perturbed)), torch.tensor(samples))
        expected = [matched_by_hand(model(image[None])[0], int(detections[sample]["labels"][index]),
                                    detections[sample]["boxes"][index].tolist())
                    for image, sample, index in zip(perturbed, samples, [0, 8] * 3, strict=True)]
    assert torch.allclose(scores, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=BOUND)
    assert expected[0] == pytest.approx(float(detections[0]["scores"][0]), abs=BOUND)  # (unperturbed: itself)
    assert 0.0 in expected and sum(value > 0 for value in expected) >= 3  # both kinds of rows are checked


def test_detection_curves_equal_a_loop_over_steps() -> None:
    model, images = tiny_detector(), pictures(2)
    with torch.no_grad():
        detections = [model(image[None])[0] for image in images]
    explained = DetectionScore.of(detections, [2, 9])
    relevance = torch.randn(2, 1, SIZE, SIZE, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    curves = image_curves(model, images, relevance, explained, patch=PATCH, baseline="mean", features_per_step=8,
                          batch_size=5, progress=False)
    filled = image_baseline(images, "mean").expand_as(images)
    patches = [(row, column) for row in range(0, SIZE, PATCH) for column in range(0, SIZE, PATCH)]
    for sample in range(2):
        values = [float(relevance[sample, :, row:row + PATCH, column:column + PATCH].sum()) for row, column in patches]
        label = int(detections[sample]["labels"][[2, 9][sample]])
        box = detections[sample]["boxes"][[2, 9][sample]].tolist()
        for order in ("morf", "lerf"):
            ranked = sorted(range(len(patches)), key=lambda i: -values[i] if order == "morf" else values[i])
            expected = []
            for count in (0, 8, 16):
                image = images[sample].clone()
                for feature in ranked[:count]:
                    row, column = patches[feature]
                    image[:, row:row + PATCH, column:column + PATCH] = filled[sample, :, row:row + PATCH,
                                                                              column:column + PATCH]
                with torch.no_grad():
                    expected.append(matched_by_hand(model(image[None])[0], label, box))
            got = curves.scores[order][sample]
            assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=BOUND), (order, sample)
    assert bool((curves.morf[:, 1:] > 0).any()) and bool((curves.morf == 0).any())  # kept and vanished, both checked


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, x, t: image_curves(m, x, torch.zeros(2, SIZE, SIZE), t, score="probability", progress=False),
     "a callable target returns the score itself"),
    (lambda m, x, t: image_curves(m, x, torch.zeros(2, SIZE, SIZE), lambda output, rows: torch.zeros(1),
                                  progress=False), "one score per input"),
    (lambda m, x, t: image_curves(lambda batch: batch.sum(dim=(2, 3)), x, torch.zeros(2, SIZE, SIZE), t,
                                  progress=False), "one dict of boxes, labels and scores per image"),
    (lambda m, x, t: image_curves(m, x[:1].expand(3, -1, -1, -1), torch.zeros(3, SIZE, SIZE), t, progress=False),
     "boxes of 2 images"),
    (lambda m, x, t: DetectionScore(torch.tensor([1]), torch.zeros(2, 4)), r"\[1, 4\]"),
])
def test_bad_input_is_named(call, message: str) -> None:
    model, images = tiny_detector(), pictures(2)
    target = DetectionScore(torch.tensor([1, 2]), torch.tensor([[6.0, 6.0, 18.0, 18.0]] * 2))
    with pytest.raises(EvaluationInputError, match=message):
        call(model, images, target)
