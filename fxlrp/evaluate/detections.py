"""The score a detector gives an explained box, as a target of perturbation curves.

A detector's output is a set of detections, not a score per class: after a perturbation the
explained detection may move, change its score or vanish. :class:`DetectionScore` follows it by
matching: in each perturbed image, the detection of the explained class whose box overlaps the
explained box most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torchvision.ops import box_iou

from fxlrp.evaluate.curves import EvaluationInputError, as_relevance

DETECTION_KEYS = ("boxes", "labels", "scores")


@dataclass(frozen=True)
class DetectionScore:
    r"""The score of the detection matched to each image's explained box: a ``target`` of
    :func:`~fxlrp.evaluate.image_curves` for torchvision's detectors (and any detector whose output
    is one dict of ``boxes``, ``labels`` and ``scores`` per image).

    For image ``i`` with explained class :math:`c_i` and box :math:`b_i`, a perturbed image's
    detections :math:`(b_k, c_k, s_k)` give

    .. math:: f_i = s_{k^*}, \qquad k^* = \operatorname*{arg\,max}_{k:\, c_k = c_i}
              \mathrm{IoU}(b_k, b_i) \quad \text{if } \mathrm{IoU}(b_{k^*}, b_i) \ge
              \texttt{min\_iou}, \text{ else } f_i = 0,

    the score of the detection of the same class that overlaps the explained box most (the first
    of equal overlaps), 0 when none of that class overlaps it by ``min_iou`` (the detection has
    vanished or moved away).

    Attributes
    ----------
    labels : Tensor
        ``[images]`` int64: the explained detection's class per image.
    boxes : Tensor
        ``[images, 4]``: the explained detection's box per image, ``(x0, y0, x1, y1)`` in pixels.
    min_iou : float
        The least intersection over union of a match, in ``(0, 1]``.

    Examples
    --------
    >>> detections = [model(image[None])[0] for image in images]    # doctest: +SKIP
    >>> explained = DetectionScore.of(detections, indices)         # doctest: +SKIP
    >>> curves = image_curves(model, images, relevance, explained, patch=4, steps=16)  # doctest: +SKIP
    """

    labels: Tensor
    boxes: Tensor
    min_iou: float = 0.5

    def __post_init__(self) -> None:
        labels, boxes = torch.as_tensor(self.labels), as_relevance(self.boxes, torch.device("cpu"), "the boxes")
        if labels.dim() != 1 or labels.is_floating_point():
            raise EvaluationInputError(f"labels must be one class index per image [images], got "
                                       f"{list(labels.shape)} of {labels.dtype}")
        if tuple(boxes.shape) != (len(labels), 4):
            raise EvaluationInputError(f"boxes must be one (x0, y0, x1, y1) per image [{len(labels)}, 4], got "
                                       f"{list(boxes.shape)}")
        if not 0 < self.min_iou <= 1:
            raise EvaluationInputError(f"min_iou must lie in (0, 1], got {self.min_iou}")
        object.__setattr__(self, "labels", labels.to(torch.int64))
        object.__setattr__(self, "boxes", boxes)

    @classmethod
    def of(cls, detections: list[dict[str, Tensor]], indices: Any, min_iou: float = 0.5) -> DetectionScore:
        """The score of detection ``indices[i]`` of each image's ``detections[i]`` (a detector's
        output on the unperturbed images, e.g. the index from
        :func:`fxlrp.integrations.torchvision.detection_target`)."""
        chosen = [int(index) for index in indices]
        if len(chosen) != len(detections):
            raise EvaluationInputError(f"give one detection index per image: {len(chosen)} indices for "
                                       f"{len(detections)} images")
        for image, (found, index) in enumerate(zip(detections, chosen, strict=True)):
            count = len(checked_detections(found)["scores"])
            if not 0 <= index < count:
                raise EvaluationInputError(f"detection {index} of image {image} is out of range: it has {count}")
        return cls(torch.stack([found["labels"][index].detach().cpu() for found, index in zip(detections, chosen,
                                                                                                strict=True)]),
                   torch.stack([found["boxes"][index].detach().cpu().to(torch.float64)
                                for found, index in zip(detections, chosen, strict=True)]), min_iou)

    def __call__(self, output: Any, samples: Tensor) -> Tensor:
        """The matched score of each image of a batch ``[batch]`` float64 (on the CPU).

        Parameters
        ----------
        output : list of dict of str to Tensor
            The detector's output on a batch of perturbed images.
        samples : Tensor
            ``[batch]``: which explained image each perturbed image comes from.
        """
        if not isinstance(output, (list, tuple)) or len(output) != len(samples):
            returned = f"{len(output)} entries" if isinstance(output, (list, tuple)) else type(output).__name__
            raise EvaluationInputError(f"DetectionScore reads a detector's output, one dict of boxes, labels and "
                                       f"scores per image; for {len(samples)} images the model returned {returned}")
        if len(samples) and int(samples.max()) >= len(self.labels):
            raise EvaluationInputError(f"DetectionScore holds boxes of {len(self.labels)} images; the curves have "
                                       f"{int(samples.max()) + 1} or more: give one label and box per image")
        scores = torch.zeros(len(samples), dtype=torch.float64)
        for row, (found, sample) in enumerate(zip(output, samples.tolist(), strict=True)):
            found = checked_detections(found)
            same = (found["labels"].detach().cpu() == self.labels[sample]).nonzero().view(-1)
            if same.numel() == 0:
                continue
            overlap = box_iou(found["boxes"].detach().cpu().to(torch.float64)[same], self.boxes[sample][None])[:, 0]
            best = int(overlap.argmax())
            if float(overlap[best]) >= self.min_iou:
                scores[row] = float(found["scores"][same[best]])
        return scores


def checked_detections(found: Any) -> dict[str, Tensor]:
    """One image's detections, checked to hold boxes, labels and scores."""
    if not isinstance(found, dict) or any(key not in found for key in DETECTION_KEYS):
        keys = sorted(found) if isinstance(found, dict) else type(found).__name__
        raise EvaluationInputError(f"a detector's output per image must be a dict with boxes, labels and scores, got "
                                   f"{keys}")
    return found
