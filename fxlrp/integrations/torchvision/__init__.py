"""fxlrp for torchvision.

Imported automatically by :func:`fxlrp.convert` when ``torchvision`` is in use; import it
yourself to explain one detection of a detector: :func:`explain_detection` (its class logit or
score), :func:`explain_mask`, :func:`explain_keypoint`, with :func:`detection_target` choosing
it by class and box.

Its modules, by job: :mod:`~fxlrp.integrations.torchvision.architectures` (the functions of
Swin, Swin3D, MViT and stochastic depth that capture records as single calls),
:mod:`~fxlrp.integrations.torchvision.regions` (RoIAlign and RoIPool over fixed boxes),
:mod:`~fxlrp.integrations.torchvision.boxes` (box decoding),
:mod:`~fxlrp.integrations.torchvision.image_transform` (a detector's normalising, resizing and
batching), :mod:`~fxlrp.integrations.torchvision.detections` (explaining one detection) and
:mod:`~fxlrp.integrations.torchvision.logit_positions` (where its class logit is).
"""

from fxlrp.integrations.torchvision import architectures  # noqa: F401  (registers Swin's, MViT's, stochastic depth)
from fxlrp.integrations.torchvision.boxes import box_decoding
from fxlrp.integrations.torchvision.detections import (
    LOGIT_HEADS,
    DetectionExplanation,
    detection_target,
    explain_detection,
    explain_keypoint,
    explain_mask,
)
from fxlrp.integrations.torchvision.image_transform import transformed_images
from fxlrp.integrations.torchvision.regions import multi_scale_region_average, region_average, region_maximum

__all__ = ["LOGIT_HEADS", "DetectionExplanation", "box_decoding", "detection_target", "explain_detection",
           "explain_keypoint", "explain_mask", "multi_scale_region_average", "region_average", "region_maximum",
           "transformed_images"]
