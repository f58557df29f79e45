"""torchvision's model families beyond classification, strictly: segmentation, detection, video,
optical flow, and the quantized models' clear refusal.

``support.zoo.check`` converts each model with random weights at its smallest input (strict, the
default composite), compares its outputs with the model's own (bit for bit in float32, or else
both in float64 within 1e-9 relative: ``OUTPUT_TOLERANCE``) and checks the relevance of its
explained output against a reference in float64: LRP-0 = gradient x input on piecewise-linear
paths, conservation with biases zeroed on the others. The sweep over every model of
``torchvision.models.list_models()`` is ``benchmarks/torchvision_sweep.py``
(docs/torchvision-coverage.md); this test runs the same checks on a subset that has each family,
each kind of reference and each detector architecture, in about a minute and a half on two cores
(the classifiers have their own sweep, test_torchvision_zoo.py).
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from support.zoo import FAMILIES, case, check

import fxlrp

SUBSET = {
    "segmentation": ["fcn_resnet50", "deeplabv3_resnet50", "lraspp_mobilenet_v3_large"],
    "detection": ["fasterrcnn_resnet50_fpn", "fasterrcnn_mobilenet_v3_large_320_fpn", "keypointrcnn_resnet50_fpn",
                  "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn",
                  "ssdlite320_mobilenet_v3_large"],
    "video": ["r3d_18", "r2plus1d_18", "swin3d_t"],
}
"""Piecewise-linear paths (gradient x input: FCN, DeepLabV3, Faster and Keypoint R-CNN, RetinaNet,
3D CNNs) and conserving ones (LR-ASPP's and MobileNet's gates, GroupNorm heads, window attention).
Left to the sweep: the ResNet-101 variants, Mask R-CNN and the v2 detectors of the same heads,
SSD300 (20 s), MViT and S3D (16 x 224 x 224 clips: a minute each)."""


def test_the_families_are_every_torchvision_model() -> None:
    listed = torchvision.models.list_models()
    assert sorted(name for names in FAMILIES.values() for name in names) == sorted(listed)
    assert {family: len(names) for family, names in FAMILIES.items()} == {
        "classification": 80, "segmentation": 6, "detection": 12, "video": 9, "optical_flow": 2, "quantization": 12}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for names in SUBSET.values() for name in names])
def test_a_model_converts_strictly_gives_its_outputs_and_its_reference(name: str) -> None:
    record = check(name)
    assert "error" not in record, record
    assert record["converts"] and record["outputs_equal"] and record["relevance_ok"], record
    assert record["reference_ok"], record


@pytest.mark.slow
def test_raft_converts_strictly_and_gives_its_flows() -> None:
    # (no exact reference: its explanation is checked for finite, non-zero relevance on both frames)
    record = check("raft_small")
    assert "error" not in record, record
    assert record["converts"] and record["outputs_equal"] and record["relevance_ok"], record


@pytest.mark.slow  # (quantising the model and tracing it: ~8 s)
def test_a_quantized_model_is_refused_in_one_line_naming_the_float_model() -> None:
    quantized = case("quantized_mobilenet_v2")
    with pytest.raises(fxlrp.UnsupportedOperationError) as error:
        fxlrp.convert(quantized.model)
    message = str(error.value)
    int8 = [name for name, module in quantized.model.named_modules()
            if type(module).__module__.startswith("torch.ao.nn.") and ".quantized" in type(module).__module__]
    assert len(message.splitlines()) == 1
    assert f"the model is quantized ({len(int8)} int8 modules, e.g. features.0.0: ConvReLU2d)" in message
    assert "quantize=False" in message
    with torch.no_grad():  # (the model itself runs: the refusal is fxlrp's, for want of int8 rules)
        assert quantized.run(quantized.model).shape == (1, 1000)
