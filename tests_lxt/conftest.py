"""Parity with LXT (https://github.com/rachtibat/LRP-eXplains-Transformers), in its own environment.

These tests live apart from ``tests/`` because LXT 2.1 patches transformers' model code and
runs with transformers 4.x only, while fxlrp's main environment has transformers 5:
``make test-lxt`` builds ``.venv-lxt`` (torch, transformers 4.54, lxt 2.1, fxlrp) and runs
``pytest tests_lxt``; the main run (``testpaths = ["tests"]``) does not collect them.
"""

from __future__ import annotations

import pytest
from families import FAMILIES
from lxt_harness import library_state


@pytest.fixture(autouse=True)
def library_left_unpatched():
    """Every test leaves transformers and torch as it found them (LXT patches them globally)."""
    families = list(FAMILIES.values())
    before = library_state(families)
    yield
    after = library_state(families)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"LXT's patches were not undone: {changed[:10]}"
