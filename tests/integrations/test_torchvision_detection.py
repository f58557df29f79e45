"""torchvision's detectors: strict conversion, their own outputs, a chosen detection explained.

References: RoIAlign's rule against the z-rule written out with the dense Jacobian of
``roi_align`` with respect to the features (boxes fixed), RoIPool's against the Jacobian's
routing ``J^T R``; every detector's boxes, labels, scores (masks, keypoints) bit for bit against
the model's own; LRP-0 of a detection's class logit against gradient x input of that logit in
float64 where the path is piecewise linear (ResNet-50 FPN Faster R-CNN and RetinaNet); explaining
a box is the error naming its decoding's ``torch.exp`` (no rule), as strict promises. Random
weights, no downloads, small images.
"""

from __future__ import annotations

import pytest
import torch
from support.references import epsilon_reference, explained_relevance, relative_error, routed_reference
from torch import Tensor, nn

import fxlrp
from fxlrp.graph.report import EXPLAINED
from fxlrp.rules import Epsilon

torchvision = pytest.importorskip("torchvision")
from torchvision.models import detection  # noqa: E402
from torchvision.models.detection._utils import BoxCoder  # noqa: E402
from torchvision.ops import MultiScaleRoIAlign, ps_roi_align, ps_roi_pool, roi_align, roi_pool  # noqa: E402

from fxlrp.integrations.torchvision import LOGIT_HEADS, detection_target, explain_detection  # noqa: E402
from fxlrp.integrations.torchvision.logit_positions import logit_positions  # noqa: E402

TOLERANCE = 1e-12
R_CNN = dict(box_score_thresh=0.0, box_detections_per_img=6, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=40)
ONE_STAGE = dict(score_thresh=0.0, detections_per_img=6, topk_candidates=40)
DETECTORS = {
    "fasterrcnn_resnet50_fpn": R_CNN,
    "fasterrcnn_resnet50_fpn_v2": R_CNN,
    "fasterrcnn_mobilenet_v3_large_fpn": R_CNN,
    "fasterrcnn_mobilenet_v3_large_320_fpn": R_CNN,
    "maskrcnn_resnet50_fpn": R_CNN,
    "maskrcnn_resnet50_fpn_v2": R_CNN,
    "keypointrcnn_resnet50_fpn": {**R_CNN, "num_keypoints": 5},
    "retinanet_resnet50_fpn": ONE_STAGE,
    "retinanet_resnet50_fpn_v2": ONE_STAGE,
    "ssd300_vgg16": ONE_STAGE,
    "ssdlite320_mobilenet_v3_large": ONE_STAGE,
    "fcos_resnet50_fpn": ONE_STAGE,
}
"""Every detector torchvision.models.detection builds (each with its settings for few, always
shown detections: a score threshold of 0, since random weights score low)."""
DECODES_WITH_EXP = set(DETECTORS) - {"fcos_resnet50_fpn"}
"""The detectors whose box decoding has ``torch.exp`` (FCOS's is linear)."""


def build(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    settings = dict(weights=None, weights_backbone=None, num_classes=2 if "keypoint" in name else 4, **DETECTORS[name])
    if not name.startswith("ssd"):
        settings.update(min_size=96, max_size=128)
    return getattr(detection, name)(**settings).eval().to(dtype)


def images(dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.rand(1, 3, 100, 120, dtype=dtype, generator=torch.Generator().manual_seed(1))


def random(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


BOXES = torch.tensor([[0, 1.0, 2.0, 9.5, 7.0], [1, 0.0, 0.5, 5.0, 11.0], [0, 3.2, 3.3, 6.1, 12.4]], dtype=torch.float64)
"""Boxes ``(image, x0, y0, x1, y1)`` on a ``[2, C, 8, 7]`` feature map at half the image's scale."""


class Pooling(nn.Module):
    """A convolution, then a pooling of fixed boxes (``function``), then a linear head."""

    def __init__(self, function, channels: int = 4, **settings) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.function, self.settings = function, settings
        self.register_buffer("boxes", BOXES.clone())

    def forward(self, x: Tensor) -> Tensor:
        return self.function(self.conv(x), self.boxes, **self.settings)


POOLINGS = {
    "roi_align": (roi_align, dict(output_size=(3, 2), spatial_scale=0.5, sampling_ratio=2)),
    "roi_align adaptive aligned": (roi_align, dict(output_size=3, spatial_scale=0.5, aligned=True)),
    "ps_roi_align": (ps_roi_align, dict(output_size=2, spatial_scale=0.5, sampling_ratio=2)),
    "ps_roi_pool": (ps_roi_pool, dict(output_size=2, spatial_scale=0.5)),
}


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_region_averages_are_the_z_rule_of_their_linear_map(pooling: str, capture: str) -> None:
    function, settings = POOLINGS[pooling]
    features = random(2, 8, 8, 7)
    relevance_out = random(*function(features, BOXES, **settings).shape, seed=2)

    class Pooled(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return function(x, BOXES, **settings)

    explain = fxlrp.convert(Pooled(), Epsilon(0.0), capture=capture, strict=True)
    assert torch.equal(explain(features), function(features, BOXES, **settings))
    [actual] = explained_relevance(explain, [features], relevance_out)
    # R_j = x_j sum_k J_kj R_k / z_k, J the Jacobian of the pooling with respect to the features
    [expected] = epsilon_reference(lambda value: function(value, BOXES, **settings), [features], relevance_out, 0.0)
    assert relative_error(actual, expected) < TOLERANCE
    row = next(row for row in explain.report().all_rows if row.operation == "roi_align")
    assert row.handling == "rule"


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_roi_pool_routes_relevance_to_the_largest_value_of_each_bin(capture: str) -> None:
    features = random(2, 4, 8, 7)

    class Pooled(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return roi_pool(x, BOXES, output_size=(2, 3), spatial_scale=0.5)

    relevance_out = random(3, 4, 2, 3, seed=2)
    explain = fxlrp.convert(Pooled(), Epsilon(0.0), capture=capture, strict=True)
    assert torch.equal(explain(features), Pooled()(features))
    [actual] = explained_relevance(explain, [features], relevance_out)
    [expected] = routed_reference(lambda value: roi_pool(value, BOXES, (2, 3), 0.5), [features], relevance_out)
    # (a feature the largest of several bins gets their relevance summed, in another order than J^T R's)
    assert relative_error(actual, expected) < TOLERANCE
    assert relevance_out.abs().sum() > 0 and actual.abs().sum() > 0


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_boxes_computed_from_the_input_get_no_relevance(capture: str) -> None:
    features, corners = random(2, 4, 8, 7), BOXES[:, 1:].clone()

    class Pooled(nn.Module):
        def forward(self, x: Tensor, corners: Tensor) -> Tensor:
            boxes = torch.cat([BOXES[:, :1], corners * 1.0], dim=1)
            return roi_align(x, boxes, output_size=2, spatial_scale=0.5, sampling_ratio=2)

    relevance_out = random(3, 4, 2, 2, seed=2)
    explain = fxlrp.convert(Pooled(), Epsilon(0.0), capture=capture, strict=True)
    actual, of_corners = explained_relevance(explain, [features, corners], relevance_out)
    [expected] = epsilon_reference(lambda value: roi_align(value, BOXES, 2, 0.5, 2), [features], relevance_out, 0.0)
    assert relative_error(actual, expected) < TOLERANCE
    assert torch.equal(of_corners, torch.zeros_like(corners))


def test_multi_scale_roi_align_is_the_z_rule_over_its_levels() -> None:
    pooler = MultiScaleRoIAlign(["a", "b"], output_size=2, sampling_ratio=2)
    boxes = [torch.tensor([[1.0, 2.0, 30.0, 25.0], [4.0, 4.0, 200.0, 180.0]], dtype=torch.float64)]
    sizes = [(256, 224)]  # (the small box pools from level a, 1/4 of the image, the large one from b, 1/8)

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pooler = pooler

        def forward(self, a: Tensor, b: Tensor) -> Tensor:
            return self.pooler({"a": a, "b": b}, boxes, sizes)

    a, b = random(1, 3, 64, 56), random(1, 3, 32, 28, seed=1)
    relevance_out = random(2, 3, 2, 2, seed=2)
    explain = fxlrp.convert(Pooled(), Epsilon(0.0), strict=True)
    assert torch.equal(explain(a, b), Pooled()(a, b))
    actual = explained_relevance(explain, [a, b], relevance_out)
    expected = epsilon_reference(lambda x, y: Pooled()(x, y), [a, b], relevance_out, 0.0)
    assert all(relative_error(mine, theirs) < TOLERANCE for mine, theirs in zip(actual, expected, strict=True))
    # (a box on each level: each feature map has relevance)
    assert actual[0].abs().sum() > 0 and actual[1].abs().sum() > 0


SLOW = {"ssd300_vgg16", "ssdlite320_mobilenet_v3_large"}
"""Detectors whose test takes ~20 s on two shared cores (300 and 320 pixel images)."""


def _marked(names: list[str]) -> list:
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in names]


@pytest.mark.parametrize("name", _marked(list(DETECTORS)))
def test_every_detector_converts_strictly_and_gives_its_own_outputs(name: str) -> None:
    model, x = build(name), images()
    explain = fxlrp.convert(model, strict=True)
    expected = model(x)
    for leaf in (x, x.clone().requires_grad_()):  # (without and with relevance flowing)
        outputs = explain(leaf)
        assert len(outputs) == len(expected)
        for mine, theirs in zip(outputs, expected, strict=True):
            assert mine.keys() == theirs.keys()
            assert theirs["scores"].numel() > 0
            for key in theirs:
                assert torch.equal(mine[key], theirs[key]), key
    report = explain.report()
    assert {row.handling for row in report.all_rows} <= EXPLAINED
    assert not [row for row in report.all_rows if row.handling == "unreached"]
    decoding = {row.handling for row in report.all_rows if row.operation == "box_decoding"}
    assert decoding == ({"rule"} if name in DECODES_WITH_EXP else set())  # (FCOS's decoding is linear)


REGRESSION_HEADS = {"fasterrcnn_resnet50_fpn": lambda model: model.roi_heads.box_predictor,
                    "retinanet_resnet50_fpn": lambda model: model.head.regression_head}
"""The module whose output holds the predicted box offsets (the R-CNNs' predictor: its second)."""


def _own_box_gradient(model: nn.Module, name: str, x: Tensor, index: int,
                      seed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model's own run: its boxes, its box offsets (the regression head's output), and the
    gradients of ``seed . boxes[index]`` by the offsets and by the input."""
    module = REGRESSION_HEADS[name](model)
    outputs: list[Tensor] = []
    handle = module.register_forward_hook(
        lambda module, args, output: outputs.append(output[1] if isinstance(output, tuple) else output))
    leaf = x.clone().requires_grad_()
    try:
        boxes = model(leaf)[0]["boxes"]
    finally:
        handle.remove()
    [codes] = outputs
    by_codes, by_input = torch.autograd.grad((boxes[index] * seed).sum(), [codes, leaf])
    return boxes.detach(), codes.detach(), by_codes, by_input


def _explained_box(explain: nn.Module, x: Tensor, index: int, seed: Tensor) -> tuple[Tensor, Tensor]:
    """The boxes, and the relevance of ``x`` for R = seed * box at detection ``index``'s box."""
    leaf = x.clone().requires_grad_()
    boxes = explain(leaf)[0]["boxes"]
    start = torch.zeros_like(boxes)
    start[index] = boxes[index].detach() * seed
    (relevance,) = torch.autograd.grad(boxes, leaf, start)
    return boxes.detach(), relevance


class Decoding(nn.Module):
    """Box offsets of two classes from a linear layer, decoded against fixed reference boxes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.offsets = nn.Linear(5, 8).double()
        self.coder = BoxCoder((10.0, 10.0, 5.0, 5.0), bbox_xform_clip=0.05)
        self.register_buffer("reference", torch.tensor([[2.0, 3.0, 30.0, 20.0], [10.0, 1.0, 14.0, 40.0],
                                                        [0.0, 0.0, 8.0, 8.0]], dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return self.coder.decode_single(self.offsets(x), self.reference)


def test_box_decoding_shares_each_coordinate_among_shift_and_resize() -> None:
    # The reference is independent of the rule's code: LRP-0 of the linear layer from offsets t
    # with relevance R_t is x * W^T (R_t / t), R_t / t the decoding's own gradient for a shift and
    # the gradient times (1 - e^{-d}) / d for a resize (e^d - 1 where the gradient has e^d); an
    # offset clipped by the coder (d > 0.05 here) is a constant and gets none.
    model = Decoding()
    x = random(3, 5, seed=3)
    relevance_out = random(3, 8, seed=4)
    explain = fxlrp.convert(model, Epsilon(0.0), strict=True)  # (run eagerly: the coder is no tensor)
    assert torch.equal(explain(x), model(x))
    [actual] = explained_relevance(explain, [x], relevance_out)
    codes = model.offsets(x).detach().requires_grad_()
    decoded = model.coder.decode_single(codes, model.reference)
    deltas = codes.detach().reshape(3, 2, 4) / torch.tensor(model.coder.weights, dtype=x.dtype)
    factor = torch.ones_like(deltas)
    factor[..., 2:] = -torch.expm1(-deltas[..., 2:]) / deltas[..., 2:]
    assert (deltas[..., 2:] > 0.05).any() and (deltas[..., 2:] <= 0.05).any()  # (clipped and not)
    (by_codes,) = torch.autograd.grad(decoded, codes, relevance_out / decoded.detach())
    shares = (by_codes.reshape(3, 2, 4) * factor).reshape(3, 8)
    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(model.offsets(leaf), leaf, shares)
    assert relative_error(actual, expected * x) < TOLERANCE
    assert {row.handling for row in explain.report().all_rows if row.operation == "box_decoding"} == {"rule"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGRESSION_HEADS))
def test_lrp0_of_a_boxs_centre_is_gradient_times_input(name: str) -> None:
    # R = x0 / 2 at x0 and x1 / 2 at x1 explains the centre (x0 + x1) / 2, linear in the offsets
    # (the resize terms cancel): LRP-0 = gradient x input on a piecewise-linear network
    model, x = build(name, torch.float64), images(torch.float64)
    seed = torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=x.dtype)
    boxes, relevance = _explained_box(fxlrp.convert(model, Epsilon(0.0), strict=True), x, 1, seed)
    own, _, _, gradient = _own_box_gradient(model, name, x, 1, seed)
    assert torch.equal(own, boxes)
    assert relative_error(relevance, gradient * x) < 1e-12 and relevance.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize(("name", "coordinate"), [("fasterrcnn_resnet50_fpn", 0), ("retinanet_resnet50_fpn", 3)])
def test_a_box_coordinate_is_explained_as_its_offset_from_the_reference_box(name: str, coordinate: int) -> None:
    # LRP-0 of x0 (or y1), R = x0 there: the shift's share goes to t_x, the resize's
    # (-w/2 (e^{d_w} - 1), d_w = t_w / w_w) to t_w. Reference: on a piecewise-linear network,
    # LRP-0 from offsets t with relevance R_t is x * J_t^T (R_t / t); here R_t / t is the model's
    # own gradient of x0 by t for the shift, and that gradient times (1 - e^{-d}) / d for the
    # resize (the change e^d - 1 where the gradient has e^d).
    model, x = build(name, torch.float64), images(torch.float64)
    seed = torch.zeros(4, dtype=x.dtype)
    seed[coordinate] = 1.0
    boxes, relevance = _explained_box(fxlrp.convert(model, Epsilon(0.0), strict=True), x, 2, seed)
    own, codes, by_codes, _ = _own_box_gradient(model, name, x, 2, seed)
    assert torch.equal(own, boxes)
    coder = model.roi_heads.box_coder if hasattr(model, "roi_heads") else model.box_coder
    deltas = codes.reshape(-1, 4) / torch.tensor(coder.weights, dtype=x.dtype)
    factor = torch.ones_like(deltas)
    factor[:, 2:] = -torch.expm1(-deltas[:, 2:]) / deltas[:, 2:]
    assert (by_codes != 0).sum() == 2  # (one shift and one resize offset make the coordinate)

    leaf = x.clone().requires_grad_()
    shares = (by_codes.reshape(-1, 4) * factor).reshape(codes.shape)
    (expected,) = torch.autograd.grad(_regression_output(model, name, leaf), leaf, shares)
    assert relative_error(relevance, expected * x) < 1e-12 and relevance.abs().sum() > 0


def _regression_output(model: nn.Module, name: str, x: Tensor) -> Tensor:
    """The regression head's output in the model's run on ``x``."""
    outputs: list[Tensor] = []
    handle = REGRESSION_HEADS[name](model).register_forward_hook(
        lambda module, args, output: outputs.append(output[1] if isinstance(output, tuple) else output))
    try:
        model(x)
    finally:
        handle.remove()
    return outputs[0]


@pytest.mark.parametrize("name", ["fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn"])
@pytest.mark.parametrize("index", [0, 3])
def test_lrp0_of_a_detections_class_logit_is_gradient_times_input(name: str, index: int) -> None:
    model, x = build(name, torch.float64), images(torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    explained = explain_detection(explain, x, index)
    # (found from the relevance of the score; the model's own gradient finds the same element)
    assert logit_positions(explain, x, 0, index, explained.label, LOGIT_HEADS) == [(0, explained.position)]
    # the same logit of the model itself: the classification head's output at that position
    outputs: list[Tensor] = []
    handles = [module.register_forward_hook(
        lambda module, args, output: outputs.append(output[0] if isinstance(output, tuple) else output))
        for module in model.modules() if isinstance(module, tuple(LOGIT_HEADS))]
    leaf = x.clone().requires_grad_()
    try:
        detections = model(leaf)[0]
    finally:
        for handle in handles:
            handle.remove()
    [logits] = outputs
    assert explained.label == int(detections["labels"][index]) and explained.score == detections["scores"][index]
    assert explained.explained == logits[explained.position].item()
    (gradient,) = torch.autograd.grad(logits[explained.position], leaf)
    assert relative_error(explained.relevance, gradient * x) < 1e-12
    assert torch.isfinite(explained.relevance).all() and explained.relevance.abs().sum() > 0


def test_fcos_scores_carry_no_relevance_its_logits_do() -> None:
    # (its score is the square root of a product, which the rules hold constant, as a norm's)
    model, x = build("fcos_resnet50_fpn"), images()
    explain = fxlrp.convert(model)
    explained = explain_detection(explain, x, 1)
    assert torch.isfinite(explained.relevance).all() and explained.relevance.abs().sum() > 0
    with pytest.raises(ValueError, match="carry no relevance"):
        explain_detection(explain, x, 1, score="score")


@pytest.mark.parametrize("name", _marked(["ssd300_vgg16", "maskrcnn_resnet50_fpn"]))
def test_a_detection_is_explained_by_its_logit_and_by_its_score(name: str) -> None:
    # (not SSDlite: with random weights its class logits are 0 to 1e-16, which is what it explains)
    model, x = build(name), images()
    explain = fxlrp.convert(model)
    by_logit = explain_detection(explain, x, 1)
    by_score = explain_detection(explain, list(x), 1, score="score")
    assert by_logit.position is not None and by_score.position is None
    assert by_logit.index == by_score.index == 1 and by_logit.label == by_score.label
    assert isinstance(by_score.relevance, list) and by_score.relevance[0].shape == x.shape[1:]
    for relevance in (by_logit.relevance, by_score.relevance[0]):
        assert torch.isfinite(relevance).all() and relevance.abs().sum() > 0


def test_the_model_is_not_modified() -> None:
    model, x = build("fasterrcnn_mobilenet_v3_large_fpn"), images()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    explain_detection(fxlrp.convert(model), x, 0)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())
    assert not model.training


def test_a_detection_is_chosen_by_index_or_by_class_and_box() -> None:
    detections = {"boxes": torch.tensor([[0.0, 0, 10, 10], [5, 5, 20, 20], [0, 0, 9, 11], [30, 30, 40, 40]]),
                  "labels": torch.tensor([1, 2, 2, 1]), "scores": torch.tensor([0.9, 0.8, 0.7, 0.6])}
    assert detection_target(detections, index=2) == 2
    assert detection_target(detections, index=-1) == 3
    assert detection_target(detections, label=2, box=[0, 0, 10, 10]) == 2  # IoU 0.83 beats 0.08
    assert detection_target(detections, label=1, box=torch.tensor([29.0, 31, 41, 40])) == 3
    with pytest.raises(ValueError, match="out of range"):
        detection_target(detections, index=4)
    with pytest.raises(ValueError, match="no detection of class 3"):
        detection_target(detections, label=3, box=[0, 0, 1, 1])
    with pytest.raises(ValueError, match="index=, or label= and box="):
        detection_target(detections, label=1)


def test_a_detection_of_the_second_image_of_a_list() -> None:
    model = build("fasterrcnn_resnet50_fpn", torch.float64)
    generator = torch.Generator().manual_seed(4)
    pictures = [torch.rand(3, 90, 110, dtype=torch.float64, generator=generator),
                torch.rand(3, 100, 120, dtype=torch.float64, generator=generator)]
    explained = explain_detection(fxlrp.convert(model, Epsilon(0.0)), pictures, 2, image=1)
    outputs: list[Tensor] = []
    handles = [module.register_forward_hook(lambda module, args, output: outputs.append(output[0]))
               for module in model.modules() if isinstance(module, tuple(LOGIT_HEADS))]
    leaves = [picture.clone().requires_grad_() for picture in pictures]
    try:
        model(leaves)
    finally:
        for handle in handles:
            handle.remove()
    gradients = torch.autograd.grad(outputs[0][explained.position], leaves)
    for relevance, gradient, picture in zip(explained.relevance, gradients, pictures, strict=True):
        assert relative_error(relevance, gradient * picture) < 1e-12 or not gradient.any() and not relevance.any()
    assert not explained.relevance[0].any() and explained.relevance[1].abs().sum() > 0  # (only image 1's)
    assert explained.region.shape == (100, 120) and explained.region.any()  # (its box, on image 1)


def test_a_detection_whose_score_has_saturated_is_explained_by_its_logit() -> None:
    # A confident detector's softmax gives 1.0 in float32: the score's derivative is 0 there, so
    # neither the score's relevance nor its gradient shows which logit it came from.
    model = build("fasterrcnn_mobilenet_v3_large_320_fpn")
    with torch.no_grad():  # (random features are small: a bias makes class 2 certain)
        model.roi_heads.box_predictor.cls_score.bias[2] += 40.0
    x = images()
    detections = model(x)[0]
    assert detections["scores"][0] == 1.0  # saturated
    logits: list[Tensor] = []
    handle = model.roi_heads.box_predictor.register_forward_hook(lambda module, args, output: logits.append(output[0]))
    try:
        explained = explain_detection(fxlrp.convert(model), x, 0)
    finally:
        handle.remove()
    row, label = explained.position
    assert label == explained.label == int(detections["labels"][0])
    # the logit's row is one the detection can come from: its softmax gives the class the score
    probabilities = torch.softmax(logits[-1][row].detach().double(), -1)
    assert probabilities.argmax() == label and probabilities[label].float() == 1.0
    assert explained.explained == logits[-1][row, label].item()
    assert torch.isfinite(explained.relevance).all() and explained.relevance.abs().sum() > 0
