"""Reading pictures back: what a test can check of a PNG fxlrp drew."""

from __future__ import annotations

import numpy as np

from fxlrp.viz import image


def colour_bars(picture: np.ndarray) -> list[tuple[int, int, int]]:
    """``(column, top, bottom)`` of each colour bar in a picture of bwr maps: a vertical run that
    falls smoothly (steps under 0.05) from above +0.95 to below -0.95. A heatmap's blocks jump
    between values, and the white between panels reads 0, so only a bar runs so."""
    values = image.signed_values_from_bwr(picture)
    found = []
    for column in range(values.shape[1]):
        steps = np.diff(values[:, column])
        smooth = (steps <= 0) & (steps > -0.05)
        top = 0
        for row in range(len(steps) + 1):
            if row < len(steps) and smooth[row]:
                continue
            if values[top, column] > 0.95 and values[row, column] < -0.95:
                found.append((column, top, row))
            top = row + 1
    return found
