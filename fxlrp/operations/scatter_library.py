"""torch_scatter's public functions, when torch_scatter is installed (it is optional)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

SUM_FUNCTIONS = (
    "scatter_sum", "scatter_add", "segment_sum_csr", "segment_add_csr", "segment_sum_coo", "segment_add_coo",
)
MEAN_FUNCTIONS = ("scatter_mean", "segment_mean_csr", "segment_mean_coo")
MAX_FUNCTIONS = (
    "scatter_max", "scatter_min", "segment_max_csr", "segment_min_csr", "segment_max_coo", "segment_min_coo",
)
REDUCE_FUNCTIONS = ("scatter", "segment_csr", "segment_coo")
INDEX_FUNCTIONS = ("gather_csr", "gather_coo")
UNSUPPORTED_FUNCTIONS = ("scatter_mul", "scatter_softmax", "scatter_log_softmax", "scatter_std", "scatter_logsumexp")


def scatter_functions(names: tuple[str, ...]) -> tuple[Callable[..., Any], ...]:
    """The torch_scatter functions of these names that exist; none without torch_scatter."""
    try:
        torch_scatter = importlib.import_module("torch_scatter")
    except ImportError:
        return ()
    found = []
    for name in names:
        function = getattr(torch_scatter, name, None)
        if function is None:
            composite = importlib.import_module("torch_scatter.composite")
            function = getattr(composite, name, None)
        if function is not None:
            found.append(function)
    return tuple(found)


def all_scatter_functions() -> tuple[Callable[..., Any], ...]:
    """Every torch_scatter function capture records as one call (they cannot be traced
    through: they branch on shapes and index values)."""
    return scatter_functions(
        SUM_FUNCTIONS + MEAN_FUNCTIONS + MAX_FUNCTIONS + REDUCE_FUNCTIONS + INDEX_FUNCTIONS + UNSUPPORTED_FUNCTIONS
    )
