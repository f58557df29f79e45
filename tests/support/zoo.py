"""torchvision's models as the sweeps use them: names, smallest inputs, builders, and the checks.

The classification zoo: ``INPUT_SIZE`` is the smallest square input (from 16, 24, 32, 48, 64, 75,
..., 224) each model's default configuration runs on: the vision transformers and MaxViT fix
their input size at 224; swin_t runs at 64 so that one model takes the shifted-window path with
its attention mask (smaller inputs give windows larger than the feature map, which switches the
shift off).

Every family of ``torchvision.models.list_models()`` (classification, segmentation, detection,
video, optical flow, quantized): :func:`case` builds a model with random weights and its
smallest input, :func:`check` converts it strictly, compares its outputs with the model's own
and checks its relevance against an exact reference where one exists (below). The sweep
(``benchmarks/torchvision_sweep.py``, docs/torchvision-coverage.md) and the slow test
(``tests/models/test_torchvision_families.py``) run the same checks.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import torchvision
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map
from torchvision.models.optical_flow import raft
from torchvision.models.optical_flow._utils import make_coords_grid as _make_coords_grid

import fxlrp
from fxlrp.rules.attention import cp_lrp
from fxlrp.rules.composites import Composite
from support.references import gradient_times_input, relative_error

NAMES = tuple(torchvision.models.list_models(module=torchvision.models))

_SIZES = {
    "alexnet": 64, "inception_v3": 75, "maxvit_t": 224, "squeezenet1_0": 24, "squeezenet1_1": 24, "swin_t": 64,
}
_SIZES.update({name: 32 for name in NAMES if name.startswith(("convnext", "densenet", "vgg"))})
_SIZES.update({name: 224 for name in NAMES if name.startswith("vit_")})
INPUT_SIZE = {name: _SIZES.get(name, 16) for name in NAMES}

PIECEWISE_LINEAR = tuple(
    name for name in NAMES
    if name.startswith(("alexnet", "vgg", "resnet", "resnext", "wide_resnet", "densenet", "squeezenet",
                        "googlenet", "inception", "mnasnet", "mobilenet_v2", "shufflenet", "regnet_x"))
)
"""Models built only from affine layers, ReLU/ReLU6, max and average pooling, BatchNorm, add, cat
and views: LRP-0 equals gradient x input on them."""


def liven(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Random BatchNorm statistics and affine parameters, and random values for weights that are
    initialised to zero (ViT's head): with default initialisation some models' logits are ~1e-15
    or exactly 0, which would make "relevance not all zero" meaningless."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.1)
        for parameter in model.parameters():
            if parameter.dim() >= 2 and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """The model with random weights (no downloads), in eval mode."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # googlenet / inception_v3 weight-initialisation notice
        model = torchvision.models.get_model(name, weights=None)
    return liven(model, torch.Generator().manual_seed(seed)).to(dtype).eval()


def image(name: str, dtype: torch.dtype = torch.float32, seed: int = 1) -> Tensor:
    size = INPUT_SIZE[name]
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# Every family ------------------------------------------------------------------------------------

FAMILY_MODULES = {
    "classification": torchvision.models, "segmentation": torchvision.models.segmentation,
    "detection": torchvision.models.detection, "video": torchvision.models.video,
    "optical_flow": torchvision.models.optical_flow, "quantization": torchvision.models.quantization,
}
FAMILIES = {family: tuple(torchvision.models.list_models(module=module)) for family, module in FAMILY_MODULES.items()}
"""Each family's model names; together ``torchvision.models.list_models()``."""

PIECEWISE_LINEAR_BEYOND_CLASSIFICATION = (
    "fcn_resnet50", "fcn_resnet101", "deeplabv3_resnet50", "deeplabv3_resnet101",
    "r3d_18", "mc3_18", "r2plus1d_18", "s3d",
    "fasterrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn_v2", "maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2",
    "keypointrcnn_resnet50_fpn", "retinanet_resnet50_fpn",
)
"""Segmentation, video and detection models whose path to the explained output is piecewise linear
(ResNet, VGG-like and 3D CNNs, BatchNorm, ReLU, pooling, bilinear resizing, FPN, RoIAlign, the
box heads): LRP-0 equals gradient x input of that output. A detector's transform normalises
and resizes its images (affine), its RPN's proposals and the box decoding only say where to pool."""

SEGMENTATION_SIZE = 16
VIDEO_SHAPE = {"s3d": (16, 224, 224), "mvit_v1_b": (16, 224, 224), "mvit_v2_s": (16, 224, 224),
               "swin3d_t": (2, 64, 64), "swin3d_s": (2, 64, 64), "swin3d_b": (2, 64, 64)}
"""``(frames, height, width)`` where it is not (1, 16, 16), the smallest the other video models
take: S3D's last pooling and MViT's position embeddings fix 16 x 224 x 224; Swin3D runs at
2 x 64 x 64 so that its windows shift (at 16 pixels they cover the whole feature map)."""
FLOW_SIZE = 128
"""RAFT's correlation pyramid needs feature maps of 16 pixels, 1/8 of the image."""
FLOW_UPDATES = 2
DETECTION_SETTINGS = {
    "r_cnn": dict(box_score_thresh=0.0, box_detections_per_img=6, rpn_pre_nms_top_n_test=100,
                  rpn_post_nms_top_n_test=40),
    "one_stage": dict(score_thresh=0.0, detections_per_img=6, topk_candidates=40),
}
"""Few detections, always some (random weights score low: threshold 0). The detectors resize the
images to 96-128 pixels, except SSD, SSDlite and the 320 Faster R-CNN, whose size (300 or 320
pixels) is what sets them apart."""

CONSERVING = Composite(fxlrp.rules.Epsilon(0.0), operation_rules=cp_lrp(0.0))
"""LRP-0 on layers and products (CP-LRP), the z-rule on sums and norms, identity rules on gates
and smooth activations: with biases zeroed, the input relevance sums to the explained output."""
ZEROED = ("bias", "class_token", "pos_embedding", "spatial_pos", "temporal_pos", "class_pos")
"""Parameters and buffers set to zero for conservation (with BatchNorm's running means)."""
REFERENCE_TOLERANCE = 1e-9
"""float64: LRP-0 against gradient x input, and the input relevance's sum against the output's."""


def family_of(name: str) -> str:
    return next(family for family, names in FAMILIES.items() if name in names)


@dataclasses.dataclass
class Case:
    """A model with random weights, its input, and what of its output is explained."""

    name: str
    family: str
    model: nn.Module
    inputs: tuple[Tensor, ...]
    settings: dict[str, Any]
    """Keyword arguments of the model's call (RAFT's number of flow updates)."""

    def run(self, module: Callable[..., Any], inputs: tuple[Tensor, ...] | None = None) -> Any:
        inputs = self.inputs if inputs is None else inputs
        if self.family != "optical_flow" or inputs[0].dtype == torch.float32:
            return module(*inputs, **self.settings)
        # RAFT makes its grid of pixel coordinates in float32 (``.float()``): in the dtype of the images
        with mock.patch.object(raft, "make_coords_grid", lambda *args, **kwargs:
                               _make_coords_grid(*args, **kwargs).to(inputs[0].dtype)):
            return module(*inputs, **self.settings)


def _random(*shape: int, dtype: torch.dtype, seed: int = 1, uniform: bool = False) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand if uniform else torch.randn)(*shape, generator=generator, dtype=dtype)


def case(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Case:
    """Model ``name`` of any family with random weights (no downloads), in eval mode, and its input."""
    family = family_of(name)
    settings: dict[str, Any] = {}
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weight-initialisation notices
        if family == "classification":
            return Case(name, family, build(name, dtype, seed), (image(name, dtype),), settings)
        if family == "segmentation":
            model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
            inputs = (_random(1, 3, SEGMENTATION_SIZE, SEGMENTATION_SIZE, dtype=dtype),)
        elif family == "video":
            model = torchvision.models.get_model(name, weights=None)
            inputs = (_random(1, 3, *VIDEO_SHAPE.get(name, (1, 16, 16)), dtype=dtype),)
        elif family == "detection":
            kind = "one_stage" if name.startswith(("retinanet", "ssd", "fcos")) else "r_cnn"
            extra = dict(DETECTION_SETTINGS[kind])
            if not name.startswith("ssd") and not name.endswith("_320_fpn"):
                extra.update(min_size=96, max_size=128)
            if name.startswith("keypoint"):
                extra["num_keypoints"] = 5
            model = torchvision.models.get_model(name, weights=None, weights_backbone=None,
                                                 num_classes=2 if name.startswith("keypoint") else 4, **extra)
            inputs = (_random(1, 3, 100, 120, dtype=dtype, uniform=True),)
        elif family == "optical_flow":
            model = torchvision.models.get_model(name, weights=None)
            inputs = (_random(1, 3, FLOW_SIZE, FLOW_SIZE, dtype=dtype, uniform=True),
                      _random(1, 3, FLOW_SIZE, FLOW_SIZE, dtype=dtype, seed=2, uniform=True))
            settings = {"num_flow_updates": FLOW_UPDATES}
        else:  # quantized: int8 weights, quantised with random weights on a random calibration batch
            model = torchvision.models.get_model(name, weights=None, quantize=True)
            inputs = (image(name.removeprefix("quantized_")),)
            return Case(name, family, model.eval(), inputs, settings)
    model = liven(model, torch.Generator().manual_seed(seed)).to(dtype).eval()
    return Case(name, family, model, inputs, settings)


def bias_free(model: nn.Module) -> nn.Module:
    """Biases, BatchNorm running means, class tokens, position embeddings and a detector's image
    mean set to zero: the model is then linear in its input up to its rules' gates and norms."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.rsplit(".", 1)[-1].endswith(ZEROED) or name.endswith("running_mean"):
                tensor.zero_()
    transform = getattr(model, "transform", None)
    if transform is not None and hasattr(transform, "image_mean"):
        transform.image_mean = [0.0 for _ in transform.image_mean]
    return model


def picked(family: str, output: Any) -> Tensor:
    """The explained tensor of a model's output: a segmentation's ``out``, RAFT's last flow."""
    return output["out"] if family == "segmentation" else output[-1] if family == "optical_flow" else output


def start_relevance(family: str, picked: Tensor) -> Tensor:
    """``R_out``: the top class of a classifier or video model (the logit, ``R = z``), class 1 at
    every pixel of a segmentation, the horizontal flow of a region of RAFT's last flow (the rest 0)."""
    start = torch.zeros_like(picked)
    if family == "optical_flow":
        region = slice(FLOW_SIZE // 4, FLOW_SIZE // 2)
        start[:, 0, region, region] = picked[:, 0, region, region].detach()
    elif family == "segmentation":
        start[:, 1] = picked[:, 1].detach()
    else:
        top = picked.detach().argmax(-1, keepdim=True)
        start.scatter_(-1, top, picked.detach().gather(-1, top))
    return start


def _explain(case: Case, explain: nn.Module) -> tuple[list[Tensor], float]:
    """The input relevance of the explained output (a detector: its detection 0's class logit),
    and the total relevance it started from."""
    from fxlrp.integrations.torchvision import explain_detection

    if case.family == "detection":
        explained = explain_detection(explain, case.inputs[0], 0)
        return [explained.relevance], explained.explained
    leaves = tuple(value.detach().clone().requires_grad_() for value in case.inputs)
    output = picked(case.family, case.run(explain, leaves))
    start = start_relevance(case.family, output)
    relevance = torch.autograd.grad(output, leaves, start, allow_unused=True)
    return [torch.zeros_like(leaf) if each is None else each for each, leaf in zip(relevance, leaves, strict=True)], \
        start.sum().item()


def _detection_gradient_times_input(case: Case, index: int, position: tuple[int, ...]) -> Tensor:
    """Gradient x input of the class logit at ``position`` of the detector's classification head."""
    from fxlrp.integrations.torchvision import LOGIT_HEADS

    outputs: list[Tensor] = []
    handles = [module.register_forward_hook(
        lambda module, args, output: outputs.append(output[0] if isinstance(output, tuple) else output))
        for module in case.model.modules() if isinstance(module, tuple(LOGIT_HEADS))]
    leaf = case.inputs[0].clone().requires_grad_()
    try:
        case.model(leaf)
    finally:
        for handle in handles:
            handle.remove()
    [logits] = outputs
    (gradient,) = torch.autograd.grad(logits[position], leaf)
    return gradient * case.inputs[0]


def lrp0_against_gradient_times_input(name: str) -> float:
    """``max|LRP-0 - gradient x input| / max|gradient x input|`` in float64."""
    from fxlrp.integrations.torchvision import explain_detection

    double = case(name, torch.float64)
    explain = fxlrp.convert(double.model, fxlrp.rules.Epsilon(0.0), strict=True)
    if double.family == "detection":
        explained = explain_detection(explain, double.inputs[0], 0)
        return relative_error(explained.relevance, _detection_gradient_times_input(double, 0, explained.position))
    relevance, _ = _explain(double, explain)
    reference = gradient_times_input(lambda *values: double.run(double.model, values), double.inputs,
                                     lambda output: picked(double.family, output),
                                     lambda output: start_relevance(double.family, output))
    return max(relative_error(mine, theirs) for mine, theirs in zip(relevance, reference, strict=True))


def conservation_error(name: str) -> tuple[float, float]:
    """``|sum R_in - sum R_out| / |sum R_out|`` of the bias-free model in float64 under
    :data:`CONSERVING`, and ``sum R_out``."""
    double = case(name, torch.float64)
    bias_free(double.model)
    explain = fxlrp.convert(double.model, CONSERVING, strict=True)
    relevance, total = _explain(double, explain)
    found = sum(each.sum().item() for each in relevance)
    return abs(found - total) / abs(total) if total else float("inf"), total


OUTPUT_TOLERANCE = 1e-9
"""float64: the explainer's outputs against the model's, relative to their largest value. The
explainer computes some outputs by other kernels for the same sums (the rules compute BatchNorm as
its affine map), which round differently: by float32 rounding that no bound holds for on every
CPU (and a detector's few scores, far out on a softmax's tail, amplify it), so outputs that are
not bit for bit in float32 are compared in float64, where two orders of the same sums agree far
below this bound and a wrong output (another box, a score of another class) is off by far more."""


def in_order(output: Any) -> Any:
    """A detector's detections of each image in the order of their scores, then labels and boxes:
    detections of equal scores (random weights make many) come in an order that depends on the
    sorting kernel, not on the values."""
    if not (isinstance(output, list) and output and isinstance(output[0], dict) and "scores" in output[0]):
        return output
    ordered = []
    for detections in output:
        rows = [(-score, label, box) for score, label, box in zip(
            detections["scores"].tolist(), detections["labels"].tolist(), detections["boxes"].tolist(), strict=True)]
        order = torch.tensor(sorted(range(len(rows)), key=rows.__getitem__), dtype=torch.long)
        ordered.append({key: value[order] for key, value in detections.items()})
    return ordered


def _flat_outputs(output: Any) -> list[Any]:
    return tree_flatten(in_order(output))[0]


def _differ(mine: list[Any], theirs: list[Any]) -> str | None:
    """What differs in kind between two flattened outputs: other outputs or shapes, or integer
    outputs (a detector's labels) that are not equal; ``None`` if nothing does."""
    if len(mine) != len(theirs) or any(isinstance(a, Tensor) != isinstance(b, Tensor) or isinstance(b, Tensor)
                                       and a.shape != b.shape for a, b in zip(mine, theirs, strict=True)):
        return "other outputs or shapes"
    if any(isinstance(b, Tensor) and not b.is_floating_point() and not torch.equal(a, b)
           for a, b in zip(mine, theirs, strict=True)):
        return "integer outputs"
    return None


def _detached(output: Any) -> Any:
    return tree_map(lambda value: value.detach() if isinstance(value, Tensor) else value, output)


def outputs_compared(name: str, explained: Any, expected: Any) -> dict[str, Any]:
    """The explainer's float32 outputs while relevance flows (``explained``) against the model's
    (``expected``): bit for bit where every output tensor is the model's; else both in float64:
    the same outputs and shapes (how many detections), the same integer outputs (a detector's
    labels) and floating-point outputs within :data:`OUTPUT_TOLERANCE`. Reported as well: the
    float32 explainer's error against the model in float64 over the model's own float32 error (a
    measurement, not the criterion). The float64 model is built here, from the same seed: the
    caller frees the float32 one first, so that one model is in memory at a time (a float64 copy
    of regnet_y_128gf or vit_h_14 is 5 GB)."""
    mine, theirs = _flat_outputs(explained), _flat_outputs(expected)
    if _differ(mine, theirs) is None and all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)
                                             if isinstance(b, Tensor)):
        return {"outputs": "bit for bit", "outputs_equal": True}
    double = case(name, torch.float64)
    leaves = tuple(value.clone().requires_grad_() for value in double.inputs)
    explain = fxlrp.convert(double.model, strict=True)
    with torch.no_grad():
        exact = _flat_outputs(double.run(double.model))
    explained_exactly = _flat_outputs(_detached(double.run(explain, leaves)))
    del double, leaves, explain
    difference = _differ(explained_exactly, exact)
    if difference is not None:
        return {"outputs": f"differ in float64: {difference}", "outputs_equal": False}
    largest = max((relative_error(a, b) for a, b in zip(explained_exactly, exact, strict=True)
                   if isinstance(b, Tensor) and b.is_floating_point() and b.numel()), default=0.0)
    worst = 0.0
    if _differ(theirs, exact) is not None:
        # (the float32 model itself keeps other detections than the float64 one - a score on the
        # threshold rounds to either side - so there is no float32 error to measure against)
        measured = f"float32 not measured: the float32 and float64 models' outputs have {_differ(theirs, exact)}"
    elif _differ(mine, theirs) is None:
        for a, b, c in zip(mine, theirs, exact, strict=True):
            if isinstance(b, Tensor) and b.is_floating_point() and b.numel() and not torch.equal(a, b):
                own, error = relative_error(b.double(), c), relative_error(a.double(), c)
                worst = max(worst, error / own if own else float("inf"))
        measured = f"float32 within rounding ({worst:.2f}x the model's own)"
    else:
        measured = f"float32: {_differ(mine, theirs)} differ"
    return {"outputs": f"{measured}; float64 {largest:.0e}", "outputs_equal": largest <= OUTPUT_TOLERANCE,
            "output_rounding_ratio": worst, "output_error": largest}


def check(name: str, conservation: bool = True) -> dict[str, Any]:
    """Convert model ``name`` strictly (the default composite), compare its outputs, explain its
    output (finite, not all zero relevance), and check the relevance against the reference: LRP-0
    = gradient x input for piecewise-linear models, conservation for the others (bias-free, float64;
    left out with ``conservation=False``). One model is in memory at a time: the float32 model is
    freed before the float64 ones are built. Returns what was found (``converts``, ``coverage``,
    ``outputs_equal``, ``relevance_ok``, ``reference``, ``reference_ok``, ``seconds``); errors
    are recorded, not raised."""
    start = time.perf_counter()
    record: dict[str, Any] = {"family": family_of(name), "model": name}
    try:
        built = case(name)
        record["input"] = " + ".join("x".join(str(size) for size in value.shape[1:]) for value in built.inputs)
        try:
            explain = fxlrp.convert(built.model, strict=True)
            record["converts"] = True
        except fxlrp.UnsupportedOperationError as error:
            record.update(converts=False, detail=str(error).splitlines()[0])
            return record
        record["coverage"] = explain.report().coverage
        with torch.no_grad():
            expected = built.run(built.model)
        leaves = tuple(value.clone().requires_grad_() for value in built.inputs)
        explained = _detached(built.run(explain, leaves))
        relevance, _ = _explain(built, explain)
        record["relevance_ok"] = all(torch.isfinite(each).all() for each in relevance) and \
            any(each.abs().sum() > 0 for each in relevance)
        del built, explain, leaves, relevance
        gc.collect()  # (the explainer's graph holds cycles: the float32 model goes before a float64 one comes)
        record.update(outputs_compared(name, explained, expected))
        gc.collect()
        if name in PIECEWISE_LINEAR or name in PIECEWISE_LINEAR_BEYOND_CLASSIFICATION:
            error = lrp0_against_gradient_times_input(name)
            record.update(reference="LRP-0 = gradient x input", reference_error=error,
                          reference_ok=error < REFERENCE_TOLERANCE)
        elif conservation:
            error, total = conservation_error(name)
            record.update(reference="conservation (bias-free)", reference_error=error, reference_total=total,
                          reference_ok=error < REFERENCE_TOLERANCE)
            if record["family"] == "optical_flow":  # (measured; RAFT's rules do not conserve, docs/torchvision.md)
                record.update(reference="no exact reference; bias-free sum measured", reference_ok=None)
    except Exception as error:  # noqa: BLE001 (the sweep records every failure as a row)
        lines = str(error).strip().splitlines()
        record["error"] = f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
    finally:
        record["seconds"] = time.perf_counter() - start
    return record


LARGE = ("regnet_y_128gf", "vit_h_14", "vit_l_16", "vit_l_32")
"""The classifiers whose float64 copy takes more than 2 GB (645, 632, 304 and 306 million
parameters; the next largest, regnet_y_32gf and vgg19, 145 million: 1.2 GB): checked in a process
of their own (:func:`check_in_subprocess`), so that a process's peak memory is one such model's."""


def check_in_subprocess(name: str, conservation: bool = True, timeout: float = 1800) -> dict[str, Any]:
    """:func:`check` in a fresh Python process (its memory goes back to the system when it ends),
    on as many threads as this process."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")]),
                   "OMP_NUM_THREADS": str(torch.get_num_threads())}
    code = ("import json, sys\nfrom support.zoo import check\n"
            "print(json.dumps(check(sys.argv[1], sys.argv[2] == 'True')))")
    finished = subprocess.run([sys.executable, "-c", code, name, str(conservation)], env=environment, cwd=root,
                              capture_output=True, text=True, timeout=timeout)
    lines = finished.stdout.strip().splitlines()
    if finished.returncode != 0 or not lines:
        tail = (finished.stderr.strip().splitlines() or [""])[-1]
        return {"model": name, "error": f"the check's process ended with {finished.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])
