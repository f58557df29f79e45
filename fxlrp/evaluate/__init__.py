"""Faithfulness of explanations, measured: perturbation curves and their summaries.

Perturb an input's features in the order an explanation ranks them and follow the model's score:
removing the most relevant features first (MoRF) should drop it fast, the least relevant first
(LeRF) should keep it. The curves are computed for many samples and steps in batches, in torch,
on the inputs' device; the relevance can come from fxlrp, Captum, zennit or a NumPy array.

- :func:`image_curves`: pixels or patches of images (pixel flipping, region perturbation);
  baselines zeros, the mean, blur, noise (seeded);
- :func:`token_curves`: tokens, deleted or inserted with a baseline token;
- :func:`graph_curves`: edges or nodes of a graph, for a node's class;
- :class:`DetectionScore`: a detector's score of an explained box (the detection of its class
  that overlaps it most, 0 once none does), the target of :func:`image_curves` for detectors;
- :class:`PerturbationCurves`: the curves with ``auc``, ``abpc`` (area between LeRF and MoRF)
  and ``aopc`` per sample; :func:`mean_interval` and :func:`ranked` summarise them over samples.

This package builds on the explainer and is not imported by it.
"""

from fxlrp.evaluate.curves import EvaluationInputError, PerturbationCurves
from fxlrp.evaluate.detections import DetectionScore
from fxlrp.evaluate.graphs import graph_curves
from fxlrp.evaluate.images import gaussian_blur, image_baseline, image_curves, patch_grid
from fxlrp.evaluate.summaries import Interval, mean_interval, ranked, table
from fxlrp.evaluate.tokens import token_curves

__all__ = [
    "DetectionScore",
    "EvaluationInputError",
    "Interval",
    "PerturbationCurves",
    "gaussian_blur",
    "graph_curves",
    "image_baseline",
    "image_curves",
    "mean_interval",
    "patch_grid",
    "ranked",
    "table",
    "token_curves",
]
