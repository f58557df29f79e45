"""Relevance maximisation (fxlrp.concepts.maximisation): the reference samples of each concept
against a brute-force reference (every sample's scores computed at once and sorted), against
zennit-crp 0.6.0's ``FeatureVisualization`` (its relevance and activation maxima on the same CNN,
composite and labels), shards merged against one pass, receptive crops against the receptive
field of a neuron, and the atlas picture."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from support.concepts import at_peak, separated, small_cnn
from support.references import relative_error
from torch import Tensor

import fxlrp
from fxlrp.concepts import ChannelConcept, conditional_relevance
from fxlrp.concepts.maximisation import concept_atlas, reference_crops, relevance_maximisation, scores_of

LAYERS = ["2", "5"]


def data_set(count: int = 20) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(count, 3, 10, 10, dtype=torch.float64, generator=generator), \
        torch.randint(0, 4, (count,), generator=generator)


def batches(images: Tensor, labels: Tensor, size: int) -> list[tuple[Tensor, Tensor]]:
    return [(images[start:start + size], labels[start:start + size]) for start in range(0, len(images), size)]


@pytest.mark.parametrize("max_target", ["sum", "max"])
def test_references_are_the_top_samples_of_all_scores(max_target: str) -> None:
    """Per concept the k samples of largest score, best first (ties: the earlier sample), with the
    position of the concept's peak; scores as the formula says (sum or max over the channel's
    positions, normalised by the absolute sum over channels), computed here from one explanation
    of the whole data set."""
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    images, labels = data_set()
    found = relevance_maximisation(explain, batches(images, labels, 6), LAYERS, k=5, max_target=max_target)
    whole = conditional_relevance(explain, images, [{}], target=labels, record=LAYERS)
    for layer in LAYERS:
        for mode, values in (("relevance", whole.relevance[layer][0]), ("activation", whole.activation[layer])):
            flat = values.reshape(*values.shape[:2], -1)
            scores = flat.sum(-1) if max_target == "sum" else flat.amax(-1)
            scores = scores / (scores.abs().sum(-1, keepdim=True) + 1e-10)
            top = getattr(found[layer], mode)
            expected = torch.sort(scores.T, dim=1, descending=True, stable=True)
            assert relative_error(top.scores, expected.values[:, :5]) < 1e-12
            # (the data set in batches of 6 against one batch: other kernels, so ties within rounding
            # may order otherwise; where scores are separated the samples are the same)
            distinct = separated(expected.values[:, :5])
            assert distinct.sum() > distinct.numel() // 2
            assert torch.equal(top.samples[distinct], expected.indices[:, :5][distinct])
            assert relative_error(scores.T.gather(1, top.samples), expected.values[:, :5]) < 1e-12
            value, peak = at_peak(flat, top.samples, top.positions)
            assert relative_error(value, peak) < 1e-12
        assert found[layer].seen == 20


def test_shards_merge_to_one_pass() -> None:
    """Two shards (the second numbered from its first index), merged in either order, give what
    one pass gives, exactly; so do other batch sizes."""
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    images, labels = data_set()
    one = relevance_maximisation(explain, batches(images, labels, 7), LAYERS, k=4)
    first = relevance_maximisation(explain, batches(images[:9], labels[:9], 4), LAYERS, k=4)
    second = relevance_maximisation(explain, batches(images[9:], labels[9:], 5), LAYERS, k=4, first_index=9)
    whole = conditional_relevance(explain, images, [{}], target=labels, record=LAYERS)
    for layer in LAYERS:
        for merged in (first[layer].merged(second[layer]), second[layer].merged(first[layer])):
            for mode, values in (("relevance", whole.relevance[layer][0]), ("activation", whole.activation[layer])):
                expected, got = getattr(one[layer], mode), getattr(merged, mode)
                # (batches of 7 against 4 and 5: other kernels; see test_references_are_the_top_samples)
                distinct = separated(expected.scores)
                assert distinct.sum() > distinct.numel() // 2
                assert torch.equal(got.samples[distinct], expected.samples[distinct])
                assert relative_error(got.scores, expected.scores) < 1e-12
                value, peak = at_peak(values.reshape(*values.shape[:2], -1), got.samples, got.positions)
                assert relative_error(value, peak) < 1e-12
            assert merged.seen == 20


@pytest.mark.slow
def test_references_equal_zennit_crp_feature_visualization(tmp_path: Path) -> None:
    """zennit-crp's ``FeatureVisualization.run`` (relevance and activation maxima, ``max_target="sum"``,
    ``abs_norm=True``, each sample explained for its label) on the same CNN with EpsilonPlusFlat:
    the same scores per concept and, where scores differ, the same samples and peak positions."""
    from crp.attribution import CondAttribution
    from crp.concepts import ChannelConcept as CrpChannelConcept
    from crp.helper import load_maximization
    from crp.visualization import FeatureVisualization
    from zennit.composites import EpsilonPlusFlat

    model = small_cnn()
    images, labels = data_set(16)
    dataset = [(images[index], int(labels[index])) for index in range(len(images))]
    visualization = FeatureVisualization(CondAttribution(model, no_param_grad=False), dataset,
                                         {layer: CrpChannelConcept() for layer in LAYERS}, path=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        visualization.run(EpsilonPlusFlat(), 0, len(dataset), batch_size=6)
    model.requires_grad_(True)
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    ours = relevance_maximisation(explain, batches(images, labels, 6), LAYERS, k=16)
    whole = conditional_relevance(explain, images, [{}], target=labels, record=LAYERS)
    for layer in LAYERS:
        for mode, folder in (("relevance", visualization.RelMax.PATH), ("activation", visualization.ActMax.PATH)):
            saved = load_maximization(folder, layer)  # [samples, concepts] each
            samples, scores, positions = (torch.from_numpy(array.copy()).T for array in saved)
            top = getattr(ours[layer], mode)
            assert relative_error(top.scores, scores.to(top.scores.dtype)) < 1e-10, (layer, mode)
            distinct = separated(top.scores) & (top.scores != 0)  # no tie with a neighbour within rounding
            assert distinct.sum() > top.scores.numel() // 2
            assert torch.equal(top.samples[distinct], samples.long()[distinct]), (layer, mode)
            # zennit-crp's peak, read from fxlrp's maps: the same position, or one of the same value
            values = whole.relevance[layer][0] if mode == "relevance" else whole.activation[layer]
            value, peak = at_peak(values.reshape(*values.shape[:2], -1), samples.long(), positions.long())
            assert relative_error(value[distinct], peak[distinct]) < 1e-10, (layer, mode)


def test_receptive_crops_lie_in_the_receptive_field() -> None:
    """A neuron of the second convolution (two 3x3 convolutions deep) sees at most 5x5 pixels
    around its position: its crop is a part of that window of the image; the atlas is drawn."""
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    images, labels = data_set()
    found = relevance_maximisation(explain, batches(images, labels, 10), ["2"], k=3)
    top = found["2"].relevance
    for concept_id in range(3):
        chosen = top.samples[concept_id]
        crops = reference_crops(explain, images[chosen], "2", concept_id, top.positions[concept_id], threshold=0.0)
        for crop, image, position in zip(crops, images[chosen], top.positions[concept_id].tolist(), strict=True):
            row, column = divmod(position, 10)
            assert 1 <= crop.shape[-2] <= 5 and 1 <= crop.shape[-1] <= 5
            window = image[:, max(0, row - 2):row + 3, max(0, column - 2):column + 3]
            assert any(torch.equal(crop, window[:, r:r + crop.shape[-2], c:c + crop.shape[-1]])
                       for r in range(window.shape[-2] - crop.shape[-2] + 1)
                       for c in range(window.shape[-1] - crop.shape[-1] + 1))
    figure = concept_atlas(found["2"], lambda index: images[index], explain, count=3)
    assert len(figure.axes) == 6 * 3  # every concept of the layer (six channels), three samples each
    figure.clf()


def test_scores_of_heads_group_their_features() -> None:
    from fxlrp.concepts import HeadConcept

    values = torch.randn(2, 5, 12, dtype=torch.float64)  # [batch, tokens, 3 heads of 4]
    scores, peaks = scores_of(HeadConcept(3), values, "sum", abs_norm=False)
    assert relative_error(scores, values.reshape(2, 5, 3, 4).sum(dim=(1, 3))) < 1e-14
    scores, _ = scores_of(ChannelConcept(), values.transpose(1, 2), "max", abs_norm=False)
    assert relative_error(scores, values.amax(dim=1)) < 1e-14


def test_boxes_follow_their_samples_through_merges_and_files(tmp_path: Path) -> None:
    """Boxes that name their sample (each box is ``[sample, sample + 1, 2 * sample, 2 * sample + 1]``)
    still name it after merging shards in either order, and after writing and reading the file."""
    from fxlrp.concepts import ReferenceSamples, TopSamples, read_references, save_references

    generator = torch.Generator().manual_seed(5)

    def shard(samples: Tensor) -> ReferenceSamples:
        scores = torch.rand(3, len(samples), dtype=torch.float64, generator=generator).round(decimals=1)  # ties
        boxes = torch.stack([samples, samples + 1, 2 * samples, 2 * samples + 1], dim=-1).expand(3, -1, -1)
        top = TopSamples(samples.expand(3, -1).clone(), scores, torch.zeros(3, len(samples), dtype=torch.long), boxes)
        return ReferenceSamples("layer", ChannelConcept(), top, top, len(samples))

    first, second = shard(torch.arange(0, 6)), shard(torch.arange(6, 10))
    merged = [first.merged(second), second.merged(first)]
    for references in merged:
        top = references.relevance
        assert torch.equal(top.boxes[..., 0], top.samples) and torch.equal(top.boxes[..., 2], 2 * top.samples)
        ordered = torch.cat([first.relevance.scores, second.relevance.scores], dim=1)
        k = top.samples.shape[1]  # the first's (6, then 4)
        assert torch.equal(top.scores, torch.sort(ordered, dim=1, descending=True).values[:, :k])
    # ties go to the earlier sample in either order
    assert torch.equal(merged[0].relevance.samples[:, :4], merged[1].relevance.samples)
    top = merged[0].relevance
    tied = top.scores[:, 1:] == top.scores[:, :-1]
    assert tied.any() and (top.samples[:, 1:][tied] > top.samples[:, :-1][tied]).all()
    save_references(merged[0], tmp_path / "layer.npz")
    back = read_references(tmp_path / "layer.npz")
    for name in ("samples", "scores", "positions", "boxes"):
        assert torch.equal(getattr(back.activation, name), getattr(merged[0].activation, name))
    assert back.layer == "layer" and repr(back.concept) == "ChannelConcept(dim=1)" and back.seen == 10


def test_an_atlas_leaves_out_references_that_score_0_and_marks_dead_concepts() -> None:
    """A reference that scores 0 (any sample would: a channel that never fires) shows nothing of
    its concept: its cell stays empty, and a concept with only such references is marked dead."""
    from fxlrp.concepts import ReferenceSamples, TopSamples

    scores = torch.tensor([[3.0, 2.0, 0.0], [0.0, 0.0, 0.0], [1.5, 1.0, 0.5]], dtype=torch.float64)
    top = TopSamples(torch.arange(9).reshape(3, 3), scores, torch.zeros(3, 3, dtype=torch.long))
    references = ReferenceSamples("layer", ChannelConcept(), top, top, 9)
    images = torch.rand(9, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    figure = concept_atlas(references, lambda index: images[index], count=3)
    assert [len(axis.images) for axis in figure.axes] == [1, 1, 0, 0, 0, 0, 1, 1, 1]
    assert [axis.get_ylabel() for axis in figure.axes[::3]] == ["#0", "#1\ndead: 0 on\nevery sample", "#2"]
    figure.clf()
