"""A tiny Faster R-CNN (two convolutions as its backbone) in float64, and images for it: a whole
torchvision detector, transform, RPN, RoIAlign and box head included, explained in a second."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign


def tiny_detector() -> nn.Module:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
    backbone.out_channels = 8
    return FasterRCNN(backbone, num_classes=3, min_size=64, max_size=80,  # (50x60 images resized to 64x77)
                      rpn_anchor_generator=AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),)),
                      box_roi_pool=MultiScaleRoIAlign(["0"], 4, 2), representation_size=16, box_score_thresh=0.0,
                      box_detections_per_img=6, rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20).eval().double()


def pictures() -> Tensor:
    return torch.rand(1, 3, 50, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
