r"""Relevance maximisation: the reference samples of each concept of a layer over a data set
(Achtibat et al. 2023; zennit-crp's ``FeatureVisualization``), and their receptive regions.

Each sample ``b`` is explained for its class (the label the data gives, else ``target``), and for
each concept ``c`` of each layer two scores are kept, from the layer's relevance ``R`` and from its
activation ``A``:

    s_c(b) = sum over the positions p of concept c of R(b, p)      (``max_target="sum"``)
    s_c(b) = max over the positions p of concept c of R(b, p)      (``max_target="max"``)

divided, with ``abs_norm`` (zennit-crp's default), by ``sum_c' |s_c'(b)| + 1e-10``; the same for
``A``. Per concept the ``k`` samples of the largest score are kept with the position where the
concept's relevance (activation) peaks in them - the neuron whose receptive region
:func:`reference_crops` cuts out.

**Merging.** The top ``k`` of a union of samples is the top ``k`` of the union of the parts' top
``k``. Candidates are ordered by score, then by sample index (ties go to the earlier sample), so
a data set split into shards (each with its ``first_index``) and merged (:meth:`ReferenceSamples.merged`)
gives exactly what one pass over it gives, in any order of merging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fxlrp.concepts.concept import ABS_NORM_STABILIZER, ChannelConcept, Concept
from fxlrp.concepts.conditional import conditional_relevance
from fxlrp.explain.explainer import Explainer


@dataclass(frozen=True)
class TopSamples:
    """The ``k`` samples of largest score per concept, best first; ``[concepts, k]`` each (where
    fewer than ``k`` samples were seen: index -1, score -inf)."""

    samples: Tensor
    """Data set indices (long)."""
    scores: Tensor
    """Their scores."""
    positions: Tensor
    """Where the concept peaks in each sample: a flat index into the concept's positions (for a
    channel of ``[channels, height, width]``, ``row * width + column``)."""

    @staticmethod
    def empty(concepts: int, k: int, dtype: torch.dtype) -> TopSamples:
        """No samples yet."""
        return TopSamples(torch.full((concepts, k), -1, dtype=torch.long),
                          torch.full((concepts, k), float("-inf"), dtype=dtype),
                          torch.full((concepts, k), -1, dtype=torch.long))

    def merged(self, other: TopSamples) -> TopSamples:
        """The top ``k`` of both (ties: the smaller sample index first)."""
        k = self.samples.shape[1]
        samples = torch.cat([self.samples, other.samples], dim=1)
        scores = torch.cat([self.scores, other.scores.to(self.scores.dtype)], dim=1)
        positions = torch.cat([self.positions, other.positions], dim=1)
        unseen = samples < 0
        by_index = torch.argsort(torch.where(unseen, torch.iinfo(torch.long).max, samples), dim=1, stable=True)
        scores, samples, positions = (torch.gather(t, 1, by_index) for t in (scores, samples, positions))
        by_score = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]
        return TopSamples(torch.gather(samples, 1, by_score), torch.gather(scores, 1, by_score),
                          torch.gather(positions, 1, by_score))


@dataclass(frozen=True)
class ReferenceSamples:
    """The reference samples of the concepts of one layer, by relevance and by activation."""

    layer: str
    concept: Concept
    relevance: TopSamples
    activation: TopSamples
    seen: int
    """How many samples were analysed."""

    def merged(self, other: ReferenceSamples) -> ReferenceSamples:
        """This shard's references joined with another's (of other samples of the same data set).

        Parameters
        ----------
        other : ReferenceSamples
            References of the same layer from other samples.

        Returns
        -------
        ReferenceSamples
            The references of all samples.
        """
        if other.layer != self.layer:
            raise ValueError(f"references of layer {other.layer!r} cannot be merged into those of {self.layer!r}")
        return ReferenceSamples(self.layer, self.concept, self.relevance.merged(other.relevance),
                                self.activation.merged(other.activation), self.seen + other.seen)


def grouped(concept: Concept, values: Tensor) -> Tensor:
    """``[batch, concepts, positions]``: each concept's values side by side (for a channel
    concept, ``values.view(batch, channels, -1)``, zennit-crp's layout).

    Parameters
    ----------
    concept : Concept
        The concepts (each the same number of indices along its dimension).
    values : Tensor
        A layer's relevance or activation, batch first.

    Returns
    -------
    Tensor
        The values grouped by concept.
    """
    dim = concept._dimension(values.shape)
    moved = values if dim == 1 else values.movedim(dim, 1)
    moved = moved.reshape(*moved.shape[:2], -1)
    positions = concept.positions(values.shape).to(values.device)
    count = concept.count(values.shape)
    if torch.equal(positions, torch.arange(count, device=values.device)):
        return moved
    order = torch.argsort(positions, stable=True)
    return moved[:, order].reshape(moved.shape[0], count, -1)


def scores_of(concept: Concept, values: Tensor, max_target: str = "sum",
              abs_norm: bool = True) -> tuple[Tensor, Tensor]:
    r"""Each sample's score per concept and where the concept peaks (see the module).

    Parameters
    ----------
    concept : Concept
        The concepts.
    values : Tensor
        A layer's relevance or activation, ``[batch, ...]``.
    max_target : {"sum", "max"}
        Sum over the concept's positions, or their largest value.
    abs_norm : bool, default True
        Divide by ``sum_c |s_c| + 1e-10`` per sample.

    Returns
    -------
    tuple of Tensor
        Scores ``[batch, concepts]`` and peak positions ``[batch, concepts]``.
    """
    if max_target not in ("sum", "max"):
        raise ValueError(f"max_target must be 'sum' or 'max', got {max_target!r}")
    values = grouped(concept, values)
    peaks = torch.argmax(values, dim=-1)
    if max_target == "sum":
        scores = torch.sum(values, dim=-1)
    else:
        scores = torch.gather(values, -1, peaks.unsqueeze(-1)).squeeze(-1)
    if abs_norm:
        scores = scores / (torch.abs(scores).sum(-1).view(-1, 1) + ABS_NORM_STABILIZER)
    return scores, peaks


def relevance_maximisation(
    explain: Explainer,
    data: Iterable[Any],
    layers: Sequence[str],
    *,
    k: int = 8,
    concepts: Concept | Mapping[str, Concept] | None = None,
    target: Any = None,
    output: Callable[[Any], Tensor] | None = None,
    max_target: str = "sum",
    abs_norm: bool = True,
    first_index: int = 0,
) -> dict[str, ReferenceSamples]:
    r"""The ``k`` reference samples of every concept of ``layers`` over a data set, by relevance
    and by activation (see :mod:`fxlrp.concepts.maximisation` for the scores).

    Parameters
    ----------
    explain : Explainer
        The explainer :func:`fxlrp.convert` returned.
    data : iterable
        Batches, as a ``DataLoader`` gives them: a tensor of inputs, or ``(inputs, labels)``
        (each sample explained for its label). Samples are numbered in order from ``first_index``.
    layers : sequence of str
        The layers (node or module names, as in :func:`~fxlrp.concepts.conditional_relevance`).
    k : int, default 8
        Reference samples per concept.
    concepts : Concept or dict of str to Concept, optional
        The concepts of the layers (``ChannelConcept()`` by default).
    target : optional
        What batches without labels explain (:func:`fxlrp.attribute`'s ``target``; None: the
        predicted class).
    output : callable, optional
        Picks the explained tensor from the model's output.
    max_target : {"sum", "max"}, default "sum"
        Score a concept by the sum of its relevance (activation) or by its largest value.
    abs_norm : bool, default True
        Normalise the scores of each sample by their absolute sum (zennit-crp's default).
    first_index : int, default 0
        The index of the first sample (for a shard of a data set).

    Returns
    -------
    dict of str to ReferenceSamples
        Per layer.
    """
    if isinstance(layers, str) or not layers:
        raise ValueError("layers must be a non-empty list of layer names, e.g. ['features.40']")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    found: dict[str, ReferenceSamples] = {}
    index = first_index
    for batch in data:
        inputs, labels = (batch[0], batch[1]) if isinstance(batch, (tuple, list)) and len(batch) == 2 else (batch, None)
        if not isinstance(inputs, Tensor):
            raise TypeError(f"each batch is a tensor of inputs or (inputs, labels), got {type(inputs).__name__}")
        size = inputs.shape[0]
        explained = target if labels is None else torch.as_tensor(labels, dtype=torch.long)
        result = conditional_relevance(explain, inputs, [{}], record=list(layers), concepts=concepts,
                                       target=explained, output=output)
        samples = torch.arange(index, index + size)
        for layer in layers:
            concept = result.concepts.get(layer) or ChannelConcept()
            parts = []
            for values in (result.relevance[layer][0], result.activation[layer]):
                scores, peaks = scores_of(concept, values.detach(), max_target, abs_norm)
                count = scores.shape[1]
                parts.append(TopSamples(samples.expand(count, size).clone(), scores.T.cpu(), peaks.T.cpu()))
            if layer not in found:
                empty = TopSamples.empty(parts[0].scores.shape[0], k, parts[0].scores.dtype)
                found[layer] = ReferenceSamples(layer, concept, empty, empty, 0)
            found[layer] = found[layer].merged(ReferenceSamples(layer, concept, parts[0], parts[1], size))
        index += size
    if not found:
        raise ValueError("the data gave no batches")
    return found


def reference_crops(
    explain: Explainer,
    inputs: Tensor,
    layer: str,
    concept_id: int,
    positions: Tensor,
    *,
    concept: Concept | None = None,
    threshold: float = 0.1,
) -> list[Tensor]:
    r"""The receptive region of a concept's peak in each input: the input cut to the rows and
    columns where the heatmap of that one neuron, started at its activation (``start=layer``,
    masked to the neuron, zennit-crp's ``mask_rf``), is not zero and reaches ``threshold`` of its
    largest absolute value (summed over the input's channels).

    Parameters
    ----------
    explain : Explainer
        The explainer.
    inputs : Tensor
        ``[n, channels, height, width]`` images (each explained alone).
    layer : str
        The layer.
    concept_id : int
        The concept.
    positions : Tensor
        ``[n]``: the peak position of the concept in each input (:attr:`TopSamples.positions`).
    concept : Concept, optional
        The layer's concepts (``ChannelConcept()`` by default).
    threshold : float, default 0.1
        The share of the largest absolute heatmap value that bounds the region.

    Returns
    -------
    list of Tensor
        One crop per input, ``[channels, rows, columns]``.
    """
    concept = concept or ChannelConcept()
    crops = []
    for image, position in zip(inputs, positions.tolist(), strict=True):
        one = image.unsqueeze(0)
        activation = conditional_relevance(explain, one, [{}], record=[layer], concepts=concept).activation[layer]
        mask = torch.zeros(grouped(concept, activation).shape[1:], dtype=activation.dtype, device=activation.device)
        mask[concept_id, position] = 1.0
        mask = _ungrouped(concept, mask, activation.shape)
        heatmap = conditional_relevance(explain, one, [{layer: mask}], start=layer).heatmap[0, 0]
        strength = heatmap.abs().sum(dim=0) if heatmap.dim() == 3 else heatmap.abs()
        rows, columns = ((strength >= threshold * strength.max()) & (strength > 0)).nonzero(as_tuple=True)
        if strength.max() <= 0 or rows.numel() == 0:
            crops.append(image)
            continue
        crops.append(image[..., int(rows.min()):int(rows.max()) + 1, int(columns.min()):int(columns.max()) + 1])
    return crops


def _ungrouped(concept: Concept, mask: Tensor, shape: Sequence[int]) -> Tensor:
    """A ``[concepts, positions]`` mask of one sample (:func:`grouped`'s layout) laid out as the
    layer's output per sample, ``shape[1:]``."""
    dim = concept._dimension(shape)
    moved_shape = [shape[dim], *(size for axis, size in enumerate(shape[1:], start=1) if axis != dim)]
    per_index = mask.reshape(shape[dim], -1)
    positions = concept.positions(shape)
    if not torch.equal(positions, torch.arange(concept.count(shape))):
        restored = torch.empty_like(per_index)
        restored[torch.argsort(positions, stable=True).to(mask.device)] = per_index
        per_index = restored
    moved = per_index.reshape(moved_shape)
    return moved if dim == 1 else moved.movedim(0, dim - 1)


def concept_atlas(
    references: ReferenceSamples,
    sample: Callable[[int], Tensor],
    explain: Explainer | None = None,
    *,
    concept_ids: Sequence[int] | None = None,
    mode: str = "relevance",
    count: int = 6,
    path: str | Path | None = None,
) -> Any:
    """A picture of reference samples: one row per concept, its ``count`` best samples (cut to
    their receptive regions where ``explain`` is given, :func:`reference_crops`).

    Needs matplotlib.

    Parameters
    ----------
    references : ReferenceSamples
        The layer's references (:func:`relevance_maximisation`).
    sample : callable
        ``sample(index)``: the input of a data set index, ``[channels, height, width]`` (as the model
        takes it; shown rescaled to its own range).
    explain : Explainer, optional
        Cut each sample to the receptive region of the concept's peak.
    concept_ids : sequence of int, optional
        The concepts shown (by default the first eight).
    mode : {"relevance", "activation"}, default "relevance"
        Which references.
    count : int, default 6
        Samples per concept.
    path : str or Path, optional
        Where to save the figure.

    Returns
    -------
    matplotlib.figure.Figure
        The figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if mode not in ("relevance", "activation"):
        raise ValueError(f"mode must be 'relevance' or 'activation', got {mode!r}")
    top = references.relevance if mode == "relevance" else references.activation
    concept_ids = list(range(min(8, top.samples.shape[0]))) if concept_ids is None else list(concept_ids)
    columns = min(count, top.samples.shape[1])
    figure, axes = plt.subplots(len(concept_ids), columns, figsize=(1.3 * columns, 1.3 * len(concept_ids)),
                                squeeze=False)
    for row, concept_id in enumerate(concept_ids):
        chosen = [(int(index), int(position)) for index, position in
                  zip(top.samples[concept_id, :columns], top.positions[concept_id, :columns], strict=True)
                  if index >= 0]
        images = [sample(index) for index, _ in chosen]
        if explain is not None and images:
            images = reference_crops(explain, torch.stack(images), references.layer, concept_id,
                                     torch.tensor([position for _, position in chosen]), concept=references.concept)
        for column in range(columns):
            axis = axes[row][column]
            axis.set_xticks([])
            axis.set_yticks([])
            if column < len(images):
                shown = images[column].detach().float()
                shown = (shown - shown.min()) / (shown.max() - shown.min()).clamp_min(1e-12)
                axis.imshow(shown.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray" if shown.shape[0] == 1 else None)
                axis.set_title(f"{float(top.scores[concept_id, column]):+.2f}", fontsize=7)
            if column == 0:
                axis.set_ylabel(f"#{concept_id}", fontsize=8)
    figure.suptitle(f"{references.layer}: reference samples by {mode}", fontsize=9)
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=150)
    return figure
