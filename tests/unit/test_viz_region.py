"""Region pictures (``fxlrp.viz.image.with_region``) with a title and the region's label.

Reference: the same picture without text, enlarged pixel by pixel (``enlarge``): the text changes
only the title's line above it and the label's place just above the region's top-left corner, on
both panels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fxlrp.viz import image

HEIGHT, WIDTH, GAP, SCALE = 10, 12, 2, 20


def test_a_region_picture_takes_a_title_and_its_label_at_the_regions_corner() -> None:
    generator = torch.Generator().manual_seed(0)
    picture = torch.rand(3, HEIGHT, WIDTH, generator=generator)
    relevance = torch.randn(3, HEIGHT, WIDTH, generator=generator)
    region = torch.zeros(HEIGHT, WIDTH, dtype=torch.bool)
    region[4:8, 3:9] = True
    plain = image.with_region(picture, relevance, region)
    written = image.with_region(picture, relevance, region, title="model, class 2, epsilon", label="class 2",
                                scale=SCALE)
    line = written.shape[0] - HEIGHT * SCALE
    assert line > 0 and (written[:line] != 255).any()  # (the title's line)
    panels = written[line:, :plain.shape[1] * SCALE]
    changed = (panels != image.enlarge(plain, SCALE)).any(axis=-1)
    rows, columns = np.nonzero(changed)
    second = columns >= (WIDTH + GAP) * SCALE
    assert rows.max() < 4 * SCALE  # (above the region's top)
    assert columns[~second].min() >= 3 * SCALE and columns[second].min() >= (WIDTH + GAP + 3) * SCALE
    for side in (~second, second):  # (the label in the region's colour on both panels)
        assert (panels[rows[side], columns[side]] == image.REGION_COLOUR).all(axis=-1).any()
    with pytest.raises(ValueError, match="on one picture; got 2: call it per picture"):
        image.with_region(picture.expand(2, -1, -1, -1), relevance.expand(2, -1, -1, -1), region, title="a")
