"""Fixtures for every test. The shared references and models the tests import live in the
``support`` package (``tests/support``; ``tests`` is on the path, pyproject.toml's ``pythonpath``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)
