"""A tiny Faster R-CNN (two convolutions as its backbone) in float64, its Mask and Keypoint
R-CNN twins with heads of two 16-channel convolutions, and images for them: whole torchvision
detectors, transform, RPN, RoIAlign and heads included, explained in a second."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection import FasterRCNN, KeypointRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign


def tiny_detector(kind: str = "faster") -> nn.Module:
    """``kind``: ``"faster"``, ``"mask"`` (3 classes) or ``"keypoint"`` (5 keypoints)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
    backbone.out_channels = 8
    settings = dict(min_size=64, max_size=80,  # (50x60 images resized to 64x77)
                    rpn_anchor_generator=AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),)),
                    box_roi_pool=MultiScaleRoIAlign(["0"], 4, 2), representation_size=16, box_score_thresh=0.0,
                    box_detections_per_img=6, rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20)
    if kind == "mask":
        model = MaskRCNN(backbone, box_head=TwoMLPHead(8 * 4 * 4, 16), box_predictor=FastRCNNPredictor(16, 3),
                         mask_roi_pool=MultiScaleRoIAlign(["0"], 14, 2), mask_head=MaskRCNNHeads(8, (16, 16), 1),
                         mask_predictor=MaskRCNNPredictor(16, 16, 3), **settings)
    elif kind == "keypoint":
        model = KeypointRCNN(backbone, num_classes=2, keypoint_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),
                             keypoint_head=KeypointRCNNHeads(8, (16, 16)),
                             keypoint_predictor=KeypointRCNNPredictor(16, 5), **settings)
    else:
        model = FasterRCNN(backbone, num_classes=3, **settings)
    return model.eval().double()


def pictures() -> Tensor:
    return torch.rand(1, 3, 50, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
