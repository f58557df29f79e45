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
    boxes: Tensor | None = None
    """``[concepts, k, 4]``: the receptive region of the concept's peak in each sample,
    ``(row_start, row_stop, column_start, column_stop)``, the sample cut as
    ``sample[..., row_start:row_stop, column_start:column_stop]`` (-1 where no sample); None where
    not found (:func:`with_boxes` finds them)."""

    @staticmethod
    def empty(concepts: int, k: int, dtype: torch.dtype) -> TopSamples:
        """No samples yet."""
        return TopSamples(torch.full((concepts, k), -1, dtype=torch.long),
                          torch.full((concepts, k), float("-inf"), dtype=dtype),
                          torch.full((concepts, k), -1, dtype=torch.long))

    def merged(self, other: TopSamples) -> TopSamples:
        """The top ``k`` of both (ties: the smaller sample index first); with boxes where both have them."""
        k = self.samples.shape[1]
        samples = torch.cat([self.samples, other.samples], dim=1)
        scores = torch.cat([self.scores, other.scores.to(self.scores.dtype)], dim=1)
        positions = torch.cat([self.positions, other.positions], dim=1)
        unseen = samples < 0
        by_index = torch.argsort(torch.where(unseen, torch.iinfo(torch.long).max, samples), dim=1, stable=True)
        scores, samples, positions = (torch.gather(t, 1, by_index) for t in (scores, samples, positions))
        by_score = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]
        boxes = None
        if self.boxes is not None and other.boxes is not None:
            order = torch.gather(by_index, 1, by_score)
            boxes = torch.gather(torch.cat([self.boxes, other.boxes], dim=1), 1, order[..., None].expand(-1, -1, 4))
        return TopSamples(torch.gather(samples, 1, by_score), torch.gather(scores, 1, by_score),
                          torch.gather(positions, 1, by_score), boxes)


@dataclass(frozen=True)
class ReferenceSamples:
    """The reference samples of the concepts of one layer, by relevance and by activation."""

    layer: str
    concept: Concept
    relevance: TopSamples
    activation: TopSamples
    seen: int
    """How many samples were analysed."""

    @staticmethod
    def empty(layer: str, concept: Concept, concepts: int, k: int, dtype: torch.dtype) -> ReferenceSamples:
        """No samples yet.

        Parameters
        ----------
        layer : str
            The layer's name.
        concept : Concept
            Its concepts.
        concepts : int
            How many concepts it has.
        k : int
            Reference samples kept per concept.
        dtype : torch.dtype
            The dtype of the scores.

        Returns
        -------
        ReferenceSamples
            Every entry unseen (index -1, score -inf).
        """
        empty = TopSamples.empty(concepts, k, dtype)
        return ReferenceSamples(layer, concept, empty, empty, 0)

    @staticmethod
    def of_batch(layer: str, concept: Concept, relevance: Tensor, activation: Tensor, samples: Tensor,
                 max_target: str = "sum", abs_norm: bool = True) -> ReferenceSamples:
        """Every sample of a batch as a reference of every concept (to be merged into the top ``k``).

        Parameters
        ----------
        layer : str
            The layer's name.
        concept : Concept
            Its concepts.
        relevance, activation : Tensor
            The layer's relevance and output for the batch, ``[batch, ...]``.
        samples : Tensor
            ``[batch]``: the data set index of each sample.
        max_target : {"sum", "max"}, default "sum"
            How a concept's values are scored (:func:`scores_of`).
        abs_norm : bool, default True
            Normalise each sample's scores by their absolute sum.

        Returns
        -------
        ReferenceSamples
            ``k`` = the batch's size.
        """
        parts = []
        for values in (relevance, activation):
            scores, peaks = scores_of(concept, values.detach(), max_target, abs_norm)
            parts.append(TopSamples(samples.cpu().expand(scores.shape[1], -1).clone(), scores.T.cpu(), peaks.T.cpu()))
        return ReferenceSamples(layer, concept, parts[0], parts[1], int(samples.numel()))

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
            batch_references = ReferenceSamples.of_batch(layer, concept, result.relevance[layer][0],
                                                         result.activation[layer], samples, max_target, abs_norm)
            if layer not in found:
                found[layer] = ReferenceSamples.empty(layer, concept, batch_references.relevance.scores.shape[0], k,
                                                      batch_references.relevance.scores.dtype)
            found[layer] = found[layer].merged(batch_references)
        index += size
    if not found:
        raise ValueError("the data gave no batches")
    return found


def receptive_boxes(
    explain: Explainer,
    inputs: Tensor,
    layer: str,
    concept_ids: Tensor | Sequence[int],
    positions: Tensor | Sequence[int],
    *,
    concept: Concept | None = None,
    threshold: float = 0.1,
) -> Tensor:
    r"""The receptive region of one neuron of ``layer`` in each input: the rows and columns where
    the heatmap of that neuron alone, started at its activation (``start=layer``, masked to the
    neuron, zennit-crp's ``mask_rf``), is not zero and reaches ``threshold`` of its largest absolute
    value (summed over the input's channels). One explanation of the batch, each sample masked to
    its own neuron.

    Parameters
    ----------
    explain : Explainer
        The explainer.
    inputs : Tensor
        ``[n, channels, height, width]`` images (or ``[n, height, width]``), one per neuron.
    layer : str
        The layer.
    concept_ids : Tensor or sequence of int
        ``[n]``: the concept of each neuron.
    positions : Tensor or sequence of int
        ``[n]``: its position among the concept's positions (:attr:`TopSamples.positions`).
    concept : Concept, optional
        The layer's concepts (``ChannelConcept()`` by default).
    threshold : float, default 0.1
        The share of the largest absolute heatmap value that bounds the region.

    Returns
    -------
    Tensor
        ``[n, 4]`` (long): ``(row_start, row_stop, column_start, column_stop)`` per input; the
        whole input where the heatmap is zero.
    """
    concept = concept or ChannelConcept()
    if inputs.dim() not in (3, 4):
        raise ValueError(f"receptive regions are rows and columns of images [n, channels, height, width] or "
                         f"[n, height, width]; got inputs of shape {list(inputs.shape)}")
    concept_ids, positions = torch.as_tensor(concept_ids).tolist(), torch.as_tensor(positions).tolist()
    if not len(concept_ids) == len(positions) == inputs.shape[0]:
        raise ValueError(f"one concept id and one position per input: got {len(concept_ids)} and {len(positions)} "
                         f"for {inputs.shape[0]} inputs")
    return _boxes(explain, inputs, layer, concept_ids, positions, concept, threshold,
                  _output_of(explain, inputs[:1], layer, concept))


def _output_of(explain: Explainer, inputs: Tensor, layer: str, concept: Concept) -> Tensor:
    """The layer's output for ``inputs`` (its shape and dtype make the masks)."""
    return conditional_relevance(explain, inputs, [{}], record=[layer], concepts=concept,
                                 start=layer).activation[layer]


def _boxes(explain: Explainer, inputs: Tensor, layer: str, concept_ids: list[int], positions: list[int],
           concept: Concept, threshold: float, activation: Tensor) -> Tensor:
    """:func:`receptive_boxes` given the layer's output for one input."""
    per_concept = grouped(concept, activation).shape[1:]
    masks = []
    for concept_id, position in zip(concept_ids, positions, strict=True):
        mask = torch.zeros(per_concept, dtype=activation.dtype, device=activation.device)
        mask[concept_id, position] = 1.0
        masks.append(_ungrouped(concept, mask, activation.shape))
    heatmaps = conditional_relevance(explain, inputs, [{layer: torch.stack(masks)}], start=layer).heatmap[0]
    boxes = []
    for heatmap in heatmaps:
        strength = heatmap.abs().sum(dim=0) if heatmap.dim() == 3 else heatmap.abs()
        rows, columns = ((strength >= threshold * strength.max()) & (strength > 0)).nonzero(as_tuple=True)
        if rows.numel() == 0:
            boxes.append([0, strength.shape[0], 0, strength.shape[1]])
        else:
            boxes.append([int(rows.min()), int(rows.max()) + 1, int(columns.min()), int(columns.max()) + 1])
    return torch.tensor(boxes, dtype=torch.long)


def cut(sample: Tensor, box: Tensor | Sequence[int]) -> Tensor:
    """``sample[..., row_start:row_stop, column_start:column_stop]`` for a box of :func:`receptive_boxes`.

    Parameters
    ----------
    sample : Tensor
        ``[channels, height, width]`` or ``[height, width]``.
    box : Tensor or sequence of int
        ``(row_start, row_stop, column_start, column_stop)``.

    Returns
    -------
    Tensor
        The crop.
    """
    row_start, row_stop, column_start, column_stop = (int(value) for value in box)
    return sample[..., row_start:row_stop, column_start:column_stop]


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
    r"""The inputs cut to the receptive region of a concept's peak in each (:func:`receptive_boxes`).

    Parameters
    ----------
    explain : Explainer
        The explainer.
    inputs : Tensor
        ``[n, channels, height, width]`` images.
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
    boxes = receptive_boxes(explain, inputs, layer, [concept_id] * inputs.shape[0], positions, concept=concept,
                            threshold=threshold)
    return [cut(image, box) for image, box in zip(inputs, boxes, strict=True)]


def with_boxes(
    explain: Explainer,
    references: ReferenceSamples,
    sample: Callable[[int], Tensor],
    *,
    threshold: float = 0.1,
    batch_size: int = 16,
) -> ReferenceSamples:
    """The references with the receptive region of every reference sample (:attr:`TopSamples.boxes`).

    The neurons (sample, concept, peak position) are taken by relevance, then by activation,
    concept by concept, each once (a sample that is a reference by relevance and by activation
    with the same peak is explained once), and explained ``batch_size`` at a time
    (:func:`receptive_boxes`): the same references give the same boxes.

    Parameters
    ----------
    explain : Explainer
        The explainer.
    references : ReferenceSamples
        A layer's references (:func:`relevance_maximisation`).
    sample : callable
        ``sample(index)``: the input of a data set index as the model takes it, ``[channels,
        height, width]`` or ``[height, width]``.
    threshold : float, default 0.1
        The share of the largest absolute heatmap value that bounds a region.
    batch_size : int, default 16
        Neurons explained at once.

    Returns
    -------
    ReferenceSamples
        The same references, with boxes.
    """
    tops = (references.relevance, references.activation)
    neurons = list(dict.fromkeys((int(top.samples[c, j]), c, int(top.positions[c, j]))
                                 for top in tops for c, j in (top.samples >= 0).nonzero().tolist()))
    regions: dict[tuple[int, int, int], Tensor] = {}
    activation = None
    for first in range(0, len(neurons), batch_size):
        chunk = neurons[first:first + batch_size]
        read: dict[int, Tensor] = {}
        for index, _, _ in chunk:
            if index not in read:
                read[index] = sample(index)
        inputs = torch.stack([read[index] for index, _, _ in chunk])
        if activation is None:
            activation = _output_of(explain, inputs[:1], references.layer, references.concept)
        found_boxes = _boxes(explain, inputs, references.layer, [c for _, c, _ in chunk], [p for _, _, p in chunk],
                             references.concept, threshold, activation)
        regions.update(zip(chunk, found_boxes, strict=True))
    found = []
    for top in tops:
        boxes = torch.full((*top.samples.shape, 4), -1, dtype=torch.long)
        for c, j in (top.samples >= 0).nonzero().tolist():
            boxes[c, j] = regions[(int(top.samples[c, j]), c, int(top.positions[c, j]))]
        found.append(TopSamples(top.samples, top.scores, top.positions, boxes))
    return ReferenceSamples(references.layer, references.concept, found[0], found[1], references.seen)


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


def reference_images(
    references: ReferenceSamples,
    concept_id: int,
    sample: Callable[[int], Tensor],
    explain: Explainer | None = None,
    *,
    mode: str = "relevance",
    count: int = 6,
) -> list[Tensor]:
    """A concept's ``count`` best reference samples, cut to their receptive regions: by the
    references' boxes where they have them, else found with ``explain`` where it is given
    (:func:`reference_crops`), else whole.

    Parameters
    ----------
    references : ReferenceSamples
        The layer's references.
    concept_id : int
        The concept.
    sample : callable
        ``sample(index)``: the input of a data set index, ``[channels, height, width]``.
    explain : Explainer, optional
        Finds the receptive regions where the references have no boxes.
    mode : {"relevance", "activation"}, default "relevance"
        Which references.
    count : int, default 6
        How many (fewer where fewer samples were seen).

    Returns
    -------
    list of Tensor
        The crops, best first.
    """
    if mode not in ("relevance", "activation"):
        raise ValueError(f"mode must be 'relevance' or 'activation', got {mode!r}")
    top = references.relevance if mode == "relevance" else references.activation
    chosen = [(int(index), int(position)) for index, position in
              zip(top.samples[concept_id, :count], top.positions[concept_id, :count], strict=True) if index >= 0]
    images = [sample(index) for index, _ in chosen]
    if top.boxes is not None:
        return [cut(image, box) for image, box in zip(images, top.boxes[concept_id], strict=False)]
    if explain is not None and images:
        return reference_crops(explain, torch.stack(images), references.layer, concept_id,
                               torch.tensor([position for _, position in chosen]), concept=references.concept)
    return images


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
    """A picture of reference samples: one row per concept, its ``count`` best samples, cut to
    their receptive regions: by the references' boxes where they have them (:func:`with_boxes`,
    :func:`read_references`), else found with ``explain`` where it is given
    (:func:`reference_crops`), else shown whole. A reference that scores 0 is left out (an empty
    cell): any sample would score that, so it shows nothing of the concept; a concept whose
    references all score 0 (a dead channel) is marked so on its row.

    Needs matplotlib.

    Parameters
    ----------
    references : ReferenceSamples
        The layer's references (:func:`relevance_maximisation`).
    sample : callable
        ``sample(index)``: the input of a data set index, ``[channels, height, width]`` (as the model
        takes it; shown rescaled to its own range).
    explain : Explainer, optional
        Find the receptive region of the concept's peak in each sample (where the references have
        no boxes).
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
    figure, axes = plt.subplots(len(concept_ids), columns, figsize=(1.3 * columns, 1.3 * len(concept_ids) + 0.3),
                                squeeze=False, layout="constrained")
    for row, concept_id in enumerate(concept_ids):
        images = reference_images(references, concept_id, sample, explain, mode=mode, count=columns)
        scores = [float(score) for score in top.scores[concept_id, :len(images)]]
        dead = not any(score != 0 for score in scores)
        for column in range(columns):
            axis = axes[row][column]
            axis.set_xticks([])
            axis.set_yticks([])
            if column < len(images) and scores[column] != 0:
                shown = images[column].detach().float()
                shown = (shown - shown.min()) / (shown.max() - shown.min()).clamp_min(1e-12)
                axis.imshow(shown.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray" if shown.shape[0] == 1 else None)
                axis.set_title(f"{float(top.scores[concept_id, column]):+.2f}", fontsize=7)
            if column == 0:
                axis.set_ylabel(f"#{concept_id}" + ("\ndead: 0 on\nevery sample" if dead else ""), fontsize=8)
    figure.suptitle(f"{references.layer}: reference samples by {mode}", fontsize=9)
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=150)
    return figure
