"""One prediction's top concepts (fxlrp.concepts.top_concepts): the shares are the top k of the
layer's normalised concept relevance, computed here from the node relevance of
``fxlrp.attribute_nodes``; the heatmaps are the conditional heatmaps; the references are the
concepts' reference crops; the picture shows those numbers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from PIL import Image
from support.concepts import separated, small_cnn
from support.references import relative_error

import fxlrp
from fxlrp.concepts import conditional_relevance, reference_crops, relevance_maximisation, top_concepts, with_boxes

LAYER = "5"


def test_top_concepts_are_the_largest_shares_with_their_conditional_heatmaps_and_references(tmp_path: Path) -> None:
    model = small_cnn()
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    generator = torch.Generator().manual_seed(4)
    images = torch.randn(12, 3, 10, 10, dtype=torch.float64, generator=generator)
    image = images[:1]
    with torch.no_grad():
        predicted = int(model(image).argmax())
    found = top_concepts(explain, image, LAYER, k=3)
    assert found.target == predicted

    _, nodes = fxlrp.attribute_nodes(explain, image, ["_5"], target=predicted)
    channels = nodes["_5"][0].sum(dim=(1, 2))
    shares = channels / (channels.abs().sum() + 1e-10)
    expected = torch.sort(shares, descending=True, stable=True)
    assert relative_error(found.shares, expected.values[:3]) < 1e-12
    distinct = separated(expected.values[None, :4])[0, :3]
    assert distinct.all() and found.concepts == expected.indices[:3].tolist()
    for heatmap, concept in zip(found.heatmaps, found.concepts, strict=True):
        alone = conditional_relevance(explain, image, [{LAYER: [concept], "y": [predicted]}]).heatmap[0, 0]
        assert relative_error(heatmap, alone) < 1e-12
    assert relative_error(found.heatmap, fxlrp.attribute(explain, image, target=predicted)[0]) < 1e-12

    references = relevance_maximisation(explain, [images], [LAYER], k=4)[LAYER]
    boxed = with_boxes(explain, references, lambda index: images[index])
    with_references = top_concepts(explain, image, LAYER, k=3, references=boxed, sample=lambda index: images[index],
                                   count=2)
    for concept, crops in zip(with_references.concepts, with_references.references, strict=True):
        samples = references.relevance.samples[concept, :2]
        expected_crops = reference_crops(explain, images[samples], LAYER, concept, references.relevance.positions[
            concept, :2])
        assert len(crops) == 2 and all(torch.equal(crop, other) for crop, other in zip(crops, expected_crops,
                                                                                       strict=True))

    figure = with_references.picture(tmp_path / "top.png")
    titles = [axis.get_title() for axis in figure.axes]
    for concept, share in zip(found.concepts, found.shares.tolist(), strict=True):
        assert f"#{concept}: {share:+.1%}" in titles
    assert Image.open(tmp_path / "top.png").format == "PNG"
    figure.clf()


def test_top_concepts_explains_one_sample() -> None:
    explain = fxlrp.convert(small_cnn(), fxlrp.composites.EpsilonPlusFlat())
    with pytest.raises(ValueError, match=r"one sample, inputs of shape \[1, ...\]; got \[2, 3, 10, 10\]"):
        top_concepts(explain, torch.randn(2, 3, 10, 10, dtype=torch.float64), LAYER)
    with pytest.raises(ValueError, match="pass sample=lambda index"):
        top_concepts(explain, torch.randn(1, 3, 10, 10, dtype=torch.float64), LAYER,
                     references=relevance_maximisation(explain, [torch.randn(2, 3, 10, 10, dtype=torch.float64)],
                                                       [LAYER], k=1)[LAYER])


def test_the_concepts_package_imports_pictures_only_inside_functions() -> None:
    """``import fxlrp.concepts`` works without the pictures extra: matplotlib, pillow and
    fxlrp.viz are imported where a picture is drawn, never at a module's top."""
    folder = Path(fxlrp.__file__).parent / "concepts"
    top_level = []
    for path in sorted(folder.glob("*.py")):
        for statement in ast.parse(path.read_text()).body:
            if isinstance(statement, ast.Import):
                top_level += [(path.name, alias.name) for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom):
                top_level.append((path.name, statement.module or ""))
    pictures = [(name, module) for name, module in top_level
                if module.split(".")[0] in ("matplotlib", "PIL") or module.startswith("fxlrp.viz")]
    assert not pictures and len(top_level) > 20, pictures
