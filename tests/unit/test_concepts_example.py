"""examples/concepts_shapes.py in fast mode: the concepts conditional relevance finds for a
prediction lie on the shape that decides it, by construction of the data, and peak on it in their
reference samples; the measurement is checked to mean something (random heatmaps score chance)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "concepts_shapes.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_concepts_shapes", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # trains a CNN: about 30 s on two busy cores
def test_top_concepts_lie_on_the_deciding_shape(tmp_path: Path) -> None:
    example = load_example()
    found = example.main(["--fast", "--out", str(tmp_path)])
    print({key: value for key, value in found.items() if key != "graph"})
    assert found["accuracy"] >= 0.95
    assert found["shape_swap_changes"] >= 0.9 and found["texture_swap_changes"] <= 0.05  # the shape decides
    images, labels, masks, _ = example.make_images(200, torch.Generator().manual_seed(5))
    regions = example.shape_regions(masks)
    random_maps = torch.randn(200, 1, 20, 20, generator=torch.Generator().manual_seed(6))
    random_share = example.positive_share(random_maps, regions).mean().item()
    assert abs(random_share - found["chance"]) < 0.05  # random heatmaps score chance: the share can fail
    assert found["shape_share_top_concepts"] >= 0.8 and found["shape_share_top_concepts"] >= 5 * found["chance"]
    assert found["top_concept_consistency"] >= 0.8
    # the top concepts peak on the shape in their reference samples, far above chance
    assert found["reference_peaks_on_shape"] >= 0.8 and found["reference_peaks_on_shape"] >= 5 * found["chance"]
    assert (tmp_path / "concepts.png").stat().st_size > 0 and (tmp_path / "graph.png").stat().st_size > 0
    assert (tmp_path / "top_concepts.png").stat().st_size > 0
    assert "attribution graph of concept" in found["graph"]
