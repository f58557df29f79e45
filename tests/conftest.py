"""Fixtures for every test. The shared references and models the tests import live in the
``support`` package (``tests/support``; ``tests`` is on the path, pyproject.toml's ``pythonpath``)."""

from __future__ import annotations

import pytest
import torch

# Kept importable as before the tests moved into folders (``from conftest import relative_error``);
# tests import them from support.references.
from support.references import (  # noqa: F401
    LRP0,
    DispatchedKernels,
    dense_jacobians,
    dispatched_kernels,
    epsilon_reference,
    explained_relevance,
    gradient_times_input,
    onehot_relevance,
    randomise_batch_norm_statistics,
    recordings,
    relative_error,
    routed_reference,
)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)
