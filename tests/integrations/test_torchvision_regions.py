"""Dense targets (issue 48): a class over a region of a segmentation output (``fxlrp.Region``, the
command line's ``--region``), a Mask R-CNN detection's mask, a Keypoint R-CNN keypoint, and the
picture of each.

References: a region's explanation against the sum of its pixels' explanations, each pixel
explained on its own with the same composite (relevance is linear in where it starts: exact up
to float64 rounding); LRP-0 of a region of FCN-ResNet-50 against gradient x input of the class's
logits summed over the region; the mask's LRP-0 against the model's own gradient with the
sigmoid's identity rule written out; a keypoint's LRP-0 against gradient x input of its score;
the command line's relevance against ``fxlrp.attribute`` with the same region. Random weights,
small inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.app import cli
from fxlrp.explain.targets import box_pixels
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import EpsilonPlus

torchvision = pytest.importorskip("torchvision")
from torchvision.models import detection, segmentation  # noqa: E402

from fxlrp.integrations.torchvision import explain_keypoint, explain_mask  # noqa: E402
from fxlrp.viz import image  # noqa: E402

TOLERANCE = 1e-12


class Segmenter(nn.Module):
    """A small segmentation network: convolutions, BatchNorm, ReLU, a strided stage and a bilinear
    resize back to the input's size; ``{"out": ...}`` as torchvision's, or the tensor itself."""

    def __init__(self, classes: int = 4, as_dict: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                                  nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))
        self.as_dict = as_dict
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.body[1].running_mean.copy_(torch.randn(6, generator=generator) * 0.1)
            self.body[1].running_var.copy_(torch.rand(6, generator=generator) + 0.5)
        self.eval()

    def forward(self, x: Tensor) -> Tensor | dict[str, Tensor]:
        out = nn.functional.interpolate(self.body(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return {"out": out} if self.as_dict else out


def picture(batch: int = 2, height: int = 10, width: int = 12) -> Tensor:
    return torch.randn(batch, 3, height, width, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


def per_pixel_sum(explain: nn.Module, x: Tensor, classes: Tensor, pixels: Tensor) -> Tensor:
    """Each pixel of ``pixels`` ``[batch, H, W]`` explained on its own (a one-hot float target:
    that sample's class's logit at that pixel), the explanations summed."""
    with torch.no_grad():
        out = explain(x)["out"]
    starts = []
    for sample, row, column in pixels.nonzero().tolist():
        start = torch.zeros_like(out)
        start[sample, classes[sample], row, column] = out[sample, classes[sample], row, column]
        starts.append(start)
    return fxlrp.attribute(explain, x, target=starts, output=lambda result: result["out"]).sum(dim=0)


@pytest.mark.parametrize("kind", ["box", "mask"])
def test_a_region_is_the_sum_of_its_pixels_explanations(kind: str) -> None:
    model, x = Segmenter().double(), picture()
    explain = fxlrp.convert(model, EpsilonPlus())
    classes = torch.tensor([1, 3])
    if kind == "box":
        region = fxlrp.Region(classes, box=(2.0, 1.0, 5.0, 3.0))  # columns 2..4, rows 1..2
        pixels = torch.zeros(2, 10, 12, dtype=torch.bool)
        pixels[:, 1:3, 2:5] = True
    else:  # a mask per sample, not a rectangle
        pixels = torch.rand(2, 10, 12, generator=torch.Generator().manual_seed(3)) > 0.94
        region = fxlrp.Region(classes, mask=pixels)
    actual = fxlrp.attribute(explain, x, target=region, output=lambda result: result["out"])
    expected = per_pixel_sum(explain, x, classes, pixels)
    assert relative_error(actual, expected) < TOLERANCE and actual.abs().sum() > 0


def test_a_fractional_box_takes_the_pixels_whose_centres_it_holds() -> None:
    mask = box_pixels((1.4, 0.6, 3.5, 2.49), 4, 5)
    expected = torch.zeros(4, 5, dtype=torch.bool)
    expected[1, 1:4] = True  # centres 0.5, 1.5, ...: rows 1.5 (2.5 > 2.49), columns 1.5, 2.5, 3.5
    assert torch.equal(mask, expected)
    output = torch.randn(1, 3, 4, 5)
    assert torch.equal(fxlrp.Region(2, box=(1.4, 0.6, 3.5, 2.49)).relevance(output),
                       output * (torch.arange(3) == 2)[:, None, None] * expected)


def test_lrp0_of_a_region_of_fcn_resnet50_is_gradient_times_input() -> None:
    torch.manual_seed(0)
    model = segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=3,
                                      aux_loss=False).double().eval()
    x = picture(1, 16, 20)
    box = (5, 4, 13, 11)
    relevance = fxlrp.attribute(fxlrp.convert(model, Epsilon(0.0), strict=True), x,
                                target=fxlrp.Region(2, box=box), output=lambda result: result["out"])
    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)["out"][0, 2, 4:11, 5:13].sum(), leaf)
    assert relative_error(relevance, gradient * x) < TOLERANCE and relevance.abs().sum() > 0


def test_a_region_is_refused_where_it_means_nothing() -> None:
    classifier = fxlrp.convert(nn.Linear(5, 3))
    with pytest.raises(fxlrp.ExplanationInputError, match=r"needs an image-shaped output .* shape \[2, 3\]"):
        fxlrp.attribute(classifier, torch.randn(2, 5), target=fxlrp.Region(1, box=(0, 0, 1, 1)))
    explain = fxlrp.convert(Segmenter(as_dict=False))
    x = picture(2).float()
    with pytest.raises(fxlrp.ExplanationInputError, match="holds no pixel of the explained output's 12 columns"):
        fxlrp.attribute(explain, x, target=fxlrp.Region(1, box=(20, 20, 30, 30)))
    with pytest.raises(fxlrp.ExplanationInputError, match=r"needs a mask of \[10, 12\] or \[2, 10, 12\]"):
        fxlrp.attribute(explain, x, target=fxlrp.Region(1, mask=torch.ones(3, 10, 12, dtype=torch.bool)))
    with pytest.raises(fxlrp.ExplanationInputError, match="selects no pixel"):
        fxlrp.attribute(explain, x, target=fxlrp.Region(1, mask=torch.zeros(10, 12, dtype=torch.bool)))
    with pytest.raises(fxlrp.ExplanationInputError, match="give a bool tensor"):
        fxlrp.Region(1, mask=torch.ones(10, 12))
    with pytest.raises(fxlrp.ExplanationInputError, match="is empty"):
        fxlrp.Region(1, box=(4, 0, 2, 3))
    with pytest.raises(fxlrp.ExplanationInputError, match="one of them"):
        fxlrp.Region(1)
    with pytest.raises(fxlrp.ExplanationInputError, match="four numbers"):
        fxlrp.Region(1, box="0,0,2,2")


# ---------------------------------------------------------------------------------------------
# the command line


def save_pictures(directory: Path, count: int = 2) -> list[str]:
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    paths = []
    for index in range(count):
        path = directory / f"{index}.png"
        Image.fromarray(generator.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of model factories the command line can load (``segmenters:as_dict``, ...)."""
    (tmp_path / "segmenters.py").write_text(
        "from integrations.test_torchvision_regions import Segmenter\n"
        "def as_dict():\n    return Segmenter(as_dict=True)\n"
        "def plain():\n    return Segmenter(as_dict=False)\n"
        "def classifier():\n    import torch\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(360, 3))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("segmenters", None)
    return "segmenters"


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("factory", ["as_dict", "plain"])
def test_the_command_line_explains_a_class_over_a_region(factory: str, factories: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    paths = save_pictures(tmp_path / "images")
    out = tmp_path / "out"
    code, stdout, stderr = run(["explain", "--model", f"{factories}:{factory}", *paths, "--region", "2,1,6,4",
                                "--out", str(out)], capsys)
    assert code == 0, stderr
    model = Segmenter(as_dict=factory == "as_dict")
    inputs = torch.stack([torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float() / 255
                          for path in paths])
    with torch.no_grad():
        result = model(inputs)
    logits = result["out"] if isinstance(result, dict) else result
    summed = logits[:, :, 1:4, 2:6].sum(dim=(2, 3))
    classes = summed.argmax(dim=1)  # (the default: the largest logits summed over the box)
    expected = fxlrp.attribute(fxlrp.convert(model, fxlrp.rules.Epsilon(1e-6)), inputs,
                               target=fxlrp.Region(classes, box=(2, 1, 6, 4)),
                               output=lambda result: result["out"] if isinstance(result, dict) else result)
    heatmaps = image.heatmap(expected)
    for index, path in enumerate(paths):
        assert f"{path}: class {int(classes[index])} (logits summed over the box (2, 1, 6, 4) " \
               f"{summed[index, classes[index]]:.3g}), relevance sum {expected[index].sum():.3g}" in stdout
        written = image.read_png(out / f"{index}.heatmap.png")  # (at a short side of 256 pixels)
        shown = image.at_size(heatmaps[index], *image.shown_size(*heatmaps[index].shape[:2]))
        assert np.abs(written.astype(int) - shown.astype(int)).max() <= 1
        picture, heatmap = _region_panels(out / f"{index}.region.png", 10, 12)
        border = picture[1:4, 2:6].reshape(-1, 3)  # (the box's pixels on the image's side: its border green)
        assert (picture[1, 2] == image.REGION_COLOUR).all() and (heatmap[2, 2] == image.REGION_COLOUR).all()
        assert (border == image.REGION_COLOUR).all(axis=1).sum() == 10  # (12 pixels, 2 inside)


def _region_panels(path: Path, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The image and heatmap panels of a ``NAME.region.png`` at the input's size: saved enlarged
    (each pixel ``readable_scale`` times), side by side 2 white columns apart (enlarged too), under
    a title's line."""
    scale = image.readable_scale(height, width)
    saved = image.read_png(path)
    panels = saved[saved.shape[0] - height * scale:]
    assert (saved[:saved.shape[0] - height * scale] != 255).any()  # (the title)
    return panels[::scale, :width * scale:scale], panels[::scale, (width + 2) * scale::scale][:, :width]


def test_the_command_lines_region_is_in_the_image_files_pixels(factories: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # The files are 10 x 12; --size 20 resizes them to 20 x 20, and the output is at that size: the
    # box (2, 1, 6, 4) of the file is (2 * 20/12, 1 * 2, 6 * 20/12, 4 * 2) of the output.
    from PIL import Image

    paths = save_pictures(tmp_path / "images")
    out = tmp_path / "out"
    code, stdout, stderr = run(["explain", "--model", f"{factories}:plain", *paths, "--size", "20", "--target", "2",
                                "--region", "2,1,6,4", "--out", str(out)], capsys)
    assert code == 0, stderr
    model = Segmenter(as_dict=False)
    inputs = torch.stack([torch.from_numpy(np.array(Image.open(path).convert("RGB").resize(
        (20, 20), Image.Resampling.BILINEAR), dtype=np.float32) / 255).permute(2, 0, 1) for path in paths])
    mask = box_pixels((2 * 20 / 12, 2.0, 6 * 20 / 12, 8.0), 20, 20)
    expected = fxlrp.attribute(fxlrp.convert(model, fxlrp.rules.Epsilon(1e-6)), inputs,
                               target=fxlrp.Region(2, mask=mask))
    for index in range(len(paths)):
        assert f"relevance sum {expected[index].sum():.3g}" in stdout
        written = image.read_png(out / f"{index}.heatmap.png")  # (at the 10 x 12 files' aspect)
        shown = image.at_size(image.heatmap(expected)[index], *image.shown_size(10, 12))
        assert np.abs(written.astype(int) - shown.astype(int)).max() <= 1
        picture, _ = _region_panels(out / f"{index}.region.png", 20, 20)
        outline = (picture == image.REGION_COLOUR).all(axis=-1)
        assert (outline == np.asarray(image.outline(mask))).all() and outline.any()


def test_the_command_lines_region_is_refused_in_one_line(factories: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    paths = save_pictures(tmp_path / "images", 1)
    cases = {
        ("classifier", "2,1,6,4"): "--region takes a region of a segmentation model's output",
        ("plain", "2,1,6"): "--region takes four numbers X0,Y0,X1,Y1",
        ("plain", "6,1,2,4"): "--region: a Region's box (6.0, 1.0, 2.0, 4.0) is empty",
        ("plain", "30,30,40,40"): "--region: the box (30, 30, 40, 40) holds no pixel",
    }
    for (factory, box), message in cases.items():
        code, _, stderr = run(["explain", "--model", f"{factories}:{factory}", *paths, "--region", box,
                               "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and message in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1
    for other, message in ((["--compile", *paths], "--region explains image files without --compile"),
                           (["--data", str(tmp_path / "images")], "not --text or --data")):
        code, _, stderr = run(["explain", "--model", f"{factories}:plain", "--region", "2,1,6,4", *other,
                               "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_region_picture_sets_the_image_beside_its_heatmap_with_the_region_outlined() -> None:
    x, relevance = picture(1, 6, 7)[0], picture(1, 6, 7)[0] * 2 - 1
    mask = box_pixels((1, 1, 5, 5), 6, 7)  # a 4 x 4 square: 12 border pixels, 4 inside
    beside = image.with_region(x, relevance, mask, gap=3)
    assert beside.shape == (6, 17, 3)
    border = image.outline(mask)
    assert int(border.sum()) == 12 and not border[2:4, 2:4].any()
    for side, plain in ((beside[:, :7], image.image_to_rgb(x)), (beside[:, 10:], image.heatmap(relevance))):
        assert (side[border] == image.REGION_COLOUR).all()
        assert (side[~border] == plain[~border]).all()
    assert (beside[:, 7:10] == 255).all()


# ---------------------------------------------------------------------------------------------
# a detection's mask and a keypoint


R_CNN = dict(box_score_thresh=0.0, box_detections_per_img=4, rpn_pre_nms_top_n_test=60, rpn_post_nms_top_n_test=20,
             min_size=64, max_size=80)


def detector(name: str, **settings) -> nn.Module:
    torch.manual_seed(0)
    return getattr(detection, name)(weights=None, weights_backbone=None, **R_CNN, **settings).double().eval()


def images() -> Tensor:
    return torch.rand(1, 3, 64, 72, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def hooked(model: nn.Module, module: nn.Module, x: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """The model's detections and ``module``'s output in the same run."""
    outputs: list[Tensor] = []
    handle = module.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:
        detections = model(x)[0]
    finally:
        handle.remove()
    return detections, outputs[0]


@pytest.mark.slow
def test_lrp0_of_a_mask_against_its_pasting_and_the_sigmoids_identity_rule() -> None:
    # R = m [m > 0.5] on the pasted mask m = A p, p = sigmoid(L) the mask head's logits of the
    # detection's class. The paste is linear (z-rule): R_p = p * A^T 1_region; the sigmoid passes
    # it (identity rule): R_L = R_p; below, LRP-0 on a piecewise-linear network is
    # x * J_L^T (R_L / L). A^T 1_region is the gradient of torchvision's own paste.
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    model, x = detector("maskrcnn_resnet50_fpn", num_classes=3), images()
    explained = explain_mask(fxlrp.convert(model, Epsilon(0.0), strict=True), x, 1)
    leaf = x.clone().requires_grad_()
    detections, logits = hooked(model, model.roi_heads.mask_predictor, leaf)
    label = int(detections["labels"][1])
    probability = logits[1, label].detach().sigmoid().requires_grad_()
    pasted = paste_masks_in_image(probability[None, None], detections["boxes"][1:2].detach(), x.shape[-2:])[0]
    assert torch.equal(pasted, detections["masks"][1].detach())  # (the same map as the model's)
    inside = pasted.detach() > 0.5
    assert explained.label == label and torch.equal(explained.region, inside[0])
    assert explained.explained == pytest.approx(float((pasted * inside).sum()), rel=1e-14)
    (adjoint,) = torch.autograd.grad((pasted * inside).sum(), probability)
    seed = torch.zeros_like(logits)
    seed[1, label] = probability.detach() * adjoint / logits[1, label].detach()
    (expected,) = torch.autograd.grad(logits, leaf, seed)
    assert relative_error(explained.relevance, expected * x) < TOLERANCE
    assert explained.relevance.abs().sum() > 0


@pytest.mark.slow
def test_lrp0_of_a_keypoint_is_gradient_times_input_of_its_score() -> None:
    # the score is the heatmap (resized to the box, bicubic: linear) at the keypoint: the path is
    # piecewise linear. torchvision keeps the scores in float32: the relevance is gradient x input
    # times s_32 / s (the score rounded to float32 over the float64 value it starts from).
    model, x = detector("keypointrcnn_resnet50_fpn", num_classes=2, num_keypoints=5), images()
    explained = explain_keypoint(fxlrp.convert(model, Epsilon(0.0), strict=True), x, 0, 3)
    leaf = x.clone().requires_grad_()
    detections = model(leaf)[0]
    (gradient,) = torch.autograd.grad(detections["keypoints_scores"][0, 3], leaf)
    reference = gradient * x
    scale = float((explained.relevance * reference).sum() / (reference * reference).sum())
    assert abs(scale - 1) <= 2.0 ** -24  # (float32 rounding of the score)
    assert relative_error(explained.relevance, scale * reference) < TOLERANCE
    assert explained.explained == float(detections["keypoints_scores"][0, 3])
    column, row = (int(value) for value in detections["keypoints"][0, 3, :2])
    assert explained.region[row, column] and int(explained.region.sum()) <= 9


def test_mask_and_keypoint_helpers_refuse_other_detectors() -> None:
    class Boxes(nn.Module):  # (a detector's output without masks or keypoints)
        def forward(self, x: Tensor) -> list[dict[str, Tensor]]:
            return [{"boxes": torch.tensor([[0.0, 0, 4, 4]]), "labels": torch.tensor([1]),
                     "scores": x.mean().reshape(1)}]

    x = images()
    with pytest.raises(ValueError, match="hold no 'masks'.*explain_mask explains Mask R-CNN's masks"):
        explain_mask(Boxes(), x, 0)
    with pytest.raises(ValueError, match="hold no 'keypoints_scores'"):
        explain_keypoint(Boxes(), x, 0, 1)
