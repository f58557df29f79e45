"""Integrations plug into the one registry; the core never imports them, and one that fails to
load is a warning for the models that need it, never a failure for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from support.references import LRP0, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp
from fxlrp.explain import loader
from fxlrp.registry import integrations

ROOT = Path(__file__).resolve().parents[2]


def test_an_integration_that_fails_to_load_is_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    # "json" is imported in every test run; its (made-up) integration does not exist.
    monkeypatch.setitem(integrations.INTEGRATIONS, "json", "fxlrp.no_such_integration")
    monkeypatch.setattr(loader, "_attempted", set())
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    with pytest.warns(UserWarning, match="json .* could not be loaded"):
        explain = fxlrp.convert(model, LRP0)
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once, not at every conversion
        fxlrp.convert(model, LRP0)


def test_import_fxlrp_imports_no_integration_library() -> None:
    code = ("import sys, fxlrp; print(sorted(name for name in ('torchvision', 'torch_geometric', 'matplotlib', "
            "'transformers', 'timm', 'fxlrp.integrations.pyg', 'fxlrp.viz.text') if name in sys.modules))")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # this clone's fxlrp, from any working directory
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT,
                            env=environment, timeout=120).stdout
    assert loaded.strip() == "[]"
