"""examples/ba_shapes.py in fast mode: accuracy, AUC against GNNExplainer. (Its speed against
GNNExplainer is a measurement the example prints, not a bound for a test: timings depend on
the machine and its load.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_ba_shapes_fast():
    environment = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ba_shapes.py"), "--fast"],
                            capture_output=True, text=True, env=environment, timeout=600)  # (only against hanging)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", output).group(1))
    row = re.compile(r"^(fxlrp|GNNExplainer).*?\s([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", flags=re.MULTILINE)
    rows = {name: (float(given), float(magnitude), float(ms)) for name, given, magnitude, ms in row.findall(output)}
    assert accuracy >= 0.95, output
    lrp, gnn = rows["fxlrp"], rows["GNNExplainer"]
    assert lrp[1] >= gnn[1], output  # edge-mask AUC by magnitude at least GNNExplainer's
