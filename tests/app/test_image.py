"""fxlrp.viz.image and fxlrp.viz.graph_image: numbers in, the right colours out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fxlrp.viz import image
from fxlrp.viz.graph_image import save_graph_relevance
from tests.support.pictures import colour_bars

ROOT = Path(__file__).resolve().parents[2]


def test_channel_reductions_by_hand() -> None:
    relevance = torch.tensor([[[1.0, -2.0]], [[-3.0, 0.5]], [[0.5, 1.0]]])  # [3 channels, 1, 2]
    assert np.allclose(image.reduce_channels(relevance, "sum"), [[-1.5, -0.5]])
    assert np.allclose(image.reduce_channels(relevance, "abs_sum"), [[4.5, 3.5]])
    assert np.allclose(image.reduce_channels(relevance, "max_abs"), [[-3.0, -2.0]])
    batch = relevance[None].repeat(2, 1, 1, 1)
    assert image.reduce_channels(batch).shape == (2, 1, 2)
    with pytest.raises(ValueError, match="unknown channel reduction"):
        image.reduce_channels(relevance, "median")


def test_symmetric_normalisation_keeps_zero_and_sign_per_map() -> None:
    maps = np.array([[[2.0, -4.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]])
    normalised = image.normalise_symmetric(maps)
    assert np.allclose(normalised[0], [[0.5, -1.0], [0.0, 0.25]])
    assert np.all(normalised[1] == 0) and np.isfinite(normalised).all()  # all-zero map: no NaN
    shared = image.normalise_symmetric(maps * np.array([1.0, 0.0])[:, None, None] + np.array([0, 1])[:, None, None],
                                       per_map=False)
    assert np.isclose(np.abs(shared).max(), 1.0) and np.isclose(shared[1, 0, 0], 1.0 / 4.0)
    clipped = image.normalise_symmetric(np.arange(100.0).reshape(10, 10), percentile=50)
    assert clipped.max() == 1.0 and (clipped == 1.0).sum() > 40


def test_bwr_and_cold_and_hot_colours() -> None:
    values = np.array([[-1.0, 0.0, 1.0]])
    bwr = image.colourise(values, "bwr")
    assert bwr[0, 0].tolist() == [0, 0, 255] and bwr[0, 2].tolist() == [255, 0, 0]
    assert (bwr[0, 1] >= 254).all()  # white at zero
    hot = image.colourise(values, "cold_and_hot")
    assert hot[0, 1].tolist() == [0, 0, 0] and hot[0, 2].tolist() == [255, 255, 0]
    assert hot[0, 0, 2] == 255 and hot[0, 0, 0] < hot[0, 0, 2]  # cold end is cyan-ish
    with pytest.raises(ValueError, match="unknown colour map"):
        image.colour_map("no-such-map")


def test_bwr_pictures_can_be_read_back(tmp_path: Path) -> None:
    relevance = torch.randn(3, 2, 5, 7, generator=torch.Generator().manual_seed(1))
    pictures = image.heatmap(relevance)
    assert pictures.shape == (3, 5, 7, 3) and pictures.dtype == np.uint8
    paths = image.save_pngs(pictures, tmp_path, ["a", "b", "c"], scale=3)
    back = image.read_png(paths[1])
    assert back.shape == (15, 21, 3)
    expected = image.normalise_symmetric(image.reduce_channels(relevance))[1]
    recovered = image.signed_values_from_bwr(back[::3, ::3])
    assert np.abs(recovered - expected).max() < 2.5 / 255


@pytest.mark.parametrize("samples_in_columns", [False, True])
def test_each_heatmap_of_a_figure_grid_has_a_colour_bar_of_its_scale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, samples_in_columns: bool) -> None:
    """The demo's grid of digits (issue 59, point 5): each heatmap's colour bar runs from blue
    at the bottom to red at the top and is labelled with the map's own largest ``|R|``."""
    import matplotlib.figure

    torch.manual_seed(0)
    images = torch.rand(2, 1, 8, 8)
    relevances = [torch.randn(2, 1, 8, 8), 5 * torch.randn(2, 1, 8, 8)]
    saved = []
    savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda figure, *args, **kwargs: saved.append(figure) or savefig(figure, *args, **kwargs))
    path = image.figure_grid(images, relevances, ["input", "a", "b"], tmp_path / "grid.png",
                             samples_in_columns=samples_in_columns)
    bars = colour_bars(image.read_png(path))
    columns = sorted({column for column, _, _ in bars})
    groups = 1 + int((np.diff(columns) > 1).sum())
    runs = {(top, bottom) for _, top, bottom in bars}
    # 4 bars: samples in rows, 2 groups of columns with 2 runs each; in columns, 2 groups x 2 runs
    assert groups * len({top for top, _ in runs}) == 4, bars
    assert all(bottom - top > 60 for top, bottom in runs)  # (as tall as the heatmap beside it)
    [figure] = saved
    labels = [[label.get_text() for label in axis.get_yticklabels()] for axis in figure.axes if axis.axison
              and axis.get_yticklabels()]
    largest = [float(relevance[sample].abs().max()) for relevance in relevances for sample in range(2)]
    expected = [[f"{-end:+.3g}", "0", f"{end:+.3g}"] for end in largest]
    assert sorted(labels) == sorted(expected)


def test_overlay_shows_the_image_where_relevance_is_zero() -> None:
    picture = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    relevance = torch.zeros(2, 3, 4, 4)
    relevance[0, :, 1, 2] = 1.0
    blended = image.overlay(picture, relevance, strength=1.0)
    grey = image.image_to_rgb(picture).astype(float).mean(axis=-1)
    untouched = np.ones((2, 4, 4), dtype=bool)
    untouched[0, 1, 2] = False
    assert np.abs(blended[..., 0][untouched] - grey[untouched]).max() <= 0.5
    assert blended[0, 1, 2].tolist() == [255, 0, 0]  # full strength at max |R|: the colour itself
    with pytest.raises(ValueError, match="differ in size"):
        image.overlay(picture, torch.zeros(2, 3, 5, 4))


def test_graph_picture_shows_positive_and_negative_relevance(tmp_path: Path) -> None:
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    path = save_graph_relevance(tmp_path / "graph.png", edge_index, torch.tensor([2.0, -1.0, 0.0, 0.5]),
                                torch.tensor([0.0, 1.0, -3.0, 0.2]), highlight=[0], dashed=[False, True, False, True])
    colours = image.read_png(path).reshape(-1, 3).astype(int)
    assert ((colours[:, 0] - colours[:, 2]) > 100).sum() > 200  # red: positive
    assert ((colours[:, 2] - colours[:, 0]) > 100).sum() > 200  # blue: negative
    with pytest.raises(ValueError, match="edge relevances for 4 edges"):
        save_graph_relevance(tmp_path / "bad.png", edge_index, torch.zeros(4), torch.zeros(3))


def test_import_fxlrp_needs_no_matplotlib() -> None:
    code = "import sys, fxlrp; assert 'matplotlib' not in sys.modules and 'networkx' not in sys.modules"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=environment, timeout=120)
