r"""One prediction's top concepts: the ``k`` concepts of a layer with the largest share of its
relevance, each with its conditional heatmap and its reference samples (Achtibat et al. 2023,
Fig. 1: "what" and "where" of a decision).

A concept's share is its entry in the layer's normalised concept relevance vector,

    share_c = R_c / (sum_c' |R_c'| + 1e-10),   R_c = sum over the positions of concept c of R,

for the explained class (zennit-crp's ``ChannelConcept().attribute(relevance, abs_norm=True)``);
the top ``k`` are the largest shares. Each one's heatmap is the conditional relevance of the input
under ``{layer: [c], "y": [class]}`` (:func:`~fxlrp.concepts.conditional_relevance`); its
references are the best samples of a :class:`~fxlrp.concepts.ReferenceSamples`, cut to the
receptive region of the concept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fxlrp.concepts.concept import Concept
from fxlrp.concepts.conditional import conditional_relevance
from fxlrp.concepts.maximisation import ReferenceSamples, reference_images
from fxlrp.explain.explainer import Explainer


@dataclass(frozen=True)
class TopConcepts:
    """What :func:`top_concepts` found for one prediction; :meth:`picture` draws it."""

    layer: str
    target: int
    """The explained class."""
    input: Tensor
    """The sample, ``[channels, height, width]``."""
    heatmap: Tensor
    """Its heatmap through all concepts, of the input's shape."""
    concepts: list[int]
    """The ``k`` concepts of largest share, largest first."""
    shares: Tensor
    """``[k]``: their shares of the layer's relevance (normalised concept relevance)."""
    heatmaps: Tensor
    """``[k, *input.shape]``: the conditional heatmap of each."""
    references: list[list[Tensor]]
    """Per concept its reference samples, cut to their receptive regions (empty lists without
    references)."""

    def picture(self, path: str | Path | None = None, cmap: str = "bwr") -> Any:
        """Draw it: the input and its heatmap on top, then one row per concept, its share, its
        conditional heatmap and its reference samples.

        Needs matplotlib and pillow (``pip install fxlrp[pictures]``).

        Parameters
        ----------
        path : str or Path, optional
            Where to save the picture (PNG, SVG, PDF by suffix).
        cmap : str, default "bwr"
            The colour map of the heatmaps (:func:`fxlrp.viz.image.colour_map`).

        Returns
        -------
        matplotlib.figure.Figure
            The figure.
        """
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        from fxlrp.viz import image

        columns = 1 + max([2, *(len(crops) for crops in self.references)])
        figure, axes = plt.subplots(1 + len(self.concepts), columns, figsize=(1.5 * columns,
                                                                              1.5 * (1 + len(self.concepts)) + 0.4),
                                    squeeze=False, layout="constrained")
        for axis in axes.flat:
            axis.set_axis_off()

        def show(axis: Any, picture: Any, title: str = "") -> None:
            axis.set_axis_on()
            axis.set_xticks([])
            axis.set_yticks([])
            axis.imshow(picture, interpolation="nearest")
            if title:
                axis.set_title(title, fontsize=8)

        show(axes[0][0], image.image_to_rgb(self.input), "input")
        show(axes[0][1], image.heatmap(self.heatmap, cmap), "all concepts")
        for row, (concept, share, heatmap, crops) in enumerate(
                zip(self.concepts, self.shares.tolist(), self.heatmaps, self.references, strict=True), start=1):
            show(axes[row][0], image.heatmap(heatmap, cmap), f"#{concept}: {share:+.1%}")
            axes[row][0].set_ylabel(f"concept {concept}", fontsize=8)
            for column, crop in enumerate(crops, start=1):
                show(axes[row][column], image.image_to_rgb(crop), "references" if column == 1 else "")
        figure.suptitle(f"{self.layer}: top {len(self.concepts)} concepts of class {self.target}", fontsize=9)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, dpi=120)
        return figure


def top_concepts(
    explain: Explainer,
    inputs: Tensor,
    layer: str,
    *,
    k: int = 4,
    target: int | None = None,
    concept: Concept | None = None,
    references: ReferenceSamples | None = None,
    sample: Callable[[int], Tensor] | None = None,
    mode: str = "relevance",
    count: int = 4,
) -> TopConcepts:
    r"""The ``k`` concepts of ``layer`` with the largest share of one prediction's relevance, their
    conditional heatmaps and reference samples (see :mod:`fxlrp.concepts.prediction`).

    Parameters
    ----------
    explain : Explainer
        The explainer :func:`fxlrp.convert` returned.
    inputs : Tensor
        One sample, ``[1, channels, height, width]``.
    layer : str
        The layer (a module's qualified name or a row of ``explain.report()``).
    k : int, default 4
        How many concepts.
    target : int, optional
        The explained class (None: the predicted class).
    concept : Concept, optional
        The layer's concepts (``ChannelConcept()``: channels).
    references : ReferenceSamples, optional
        The layer's reference samples (:func:`~fxlrp.concepts.relevance_maximisation` or
        :func:`~fxlrp.concepts.read_references`), shown beside each concept.
    sample : callable, optional
        ``sample(index)``: the input of a data set index (needed with ``references``).
    mode : {"relevance", "activation"}, default "relevance"
        Which references.
    count : int, default 4
        Reference samples per concept.

    Returns
    -------
    TopConcepts
        The concepts, shares, heatmaps and reference crops; ``.picture(path)`` draws them.
    """
    if not isinstance(inputs, Tensor) or inputs.dim() < 2 or inputs.shape[0] != 1:
        shape = list(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise ValueError(f"top_concepts explains one sample, inputs of shape [1, ...]; got {shape}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if references is not None and sample is None:
        raise ValueError("references are shown from the data set: pass sample=lambda index: dataset[index][0]")
    if target is None:
        with torch.no_grad():
            output = explain(inputs)
        if not isinstance(output, Tensor) or output.dim() != 2:
            raise ValueError("target=None takes the predicted class of a classifier's [1, classes] output; "
                             "pass target=")
        target = int(output.argmax(dim=1))
    found = conditional_relevance(explain, inputs, [{}], record=[layer], concepts=concept, target=target)
    shares = found.concept_relevance(layer, abs_norm=True)[0, 0]
    ranked = torch.argsort(shares, descending=True, stable=True)[:k]
    chosen = [int(index) for index in ranked]
    conditional = conditional_relevance(explain, inputs, [{layer: [c], "y": [target]} for c in chosen],
                                        concepts=concept)
    crops = [reference_images(references, c, sample, explain, mode=mode, count=count)  # type: ignore[arg-type]
             if references is not None else [] for c in chosen]
    return TopConcepts(layer, target, inputs[0].detach(), found.heatmap[0, 0].detach(), chosen,
                       shares[ranked].detach(), conditional.heatmap[:, 0].detach(), crops)
