"""Scatter reductions (torch_scatter and native) and index-add.

torch_scatter's functions are leaves: a captured graph records each call as one node, and code
run eagerly hands each call to its rule whole (inside, ``segment_csr`` and the max/min
reductions call compiled operations that no rule reaches).

Sums and means follow the proportional (z) rule: an edge message gets the share of a node's
relevance it contributed to the node's sum. Max and min are winner-take-all, which their native
backward already does. Native ``scatter_add``/``index_add``/``scatter_reduce`` are affine in both
``self`` and ``src``: on a fresh zeros tensor, as PyG writes them, all relevance goes to ``src``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fxlrp.operations.helpers import NATIVE_UNDER_NATIVE_RULE, affine, bind
from fxlrp.operations.scatter_library import (
    INDEX_FUNCTIONS,
    MAX_FUNCTIONS,
    MEAN_FUNCTIONS,
    REDUCE_FUNCTIONS,
    SUM_FUNCTIONS,
    scatter_functions,
)
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Native, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall

AFFINE_REDUCTIONS = {"sum", "add", "mean"}
WINNER_TAKE_ALL_REDUCTIONS = {"max", "min", "amax", "amin"}


def reduction_of(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The ``reduce`` argument of torch_scatter's ``scatter``/``segment_*`` or of
    ``Tensor.scatter_reduce``, wherever it was passed."""
    if "reduce" in kwargs:
        return kwargs["reduce"]
    strings = [value for value in args if isinstance(value, str)]
    if strings:
        return strings[0]
    return "sum"


def reduce_by_argument(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Sum and mean by the proportional rule, max and min winner-take-all (native)."""
    reduction = reduction_of(function, args, kwargs)
    if reduction in AFFINE_REDUCTIONS:
        return affine(call, function, *args, **kwargs)
    if reduction in WINNER_TAKE_ALL_REDUCTIONS:
        return bind(function, kwargs)(*args)
    raise NotImplementedError(
        f"fxlrp: scatter reduction {reduction!r} has no LRP rule; use sum, mean, max or min"
    )


register(
    Operation(
        "scatter_sum",
        Spelling(functions=scatter_functions(SUM_FUNCTIONS + MEAN_FUNCTIONS), leaf=True),
        Affine(affine, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        ValueFlow(index_arguments=(1,)),
        description="torch_scatter sum/mean aggregation",
    )
)
register(
    Operation(
        "scatter_reduce",
        Spelling(functions=(torch.scatter_reduce,), methods=("scatter_reduce",)),
        Affine(reduce_by_argument, default_rule=proportional),
        ValueFlow(index_arguments=(2,)),
        description="scatter with a reduce argument: sum/mean proportional, max/min winner-take-all",
    )
)
register(
    Operation(
        "scatter",
        Spelling(functions=scatter_functions(REDUCE_FUNCTIONS), leaf=True),
        Affine(reduce_by_argument, default_rule=proportional),
        ValueFlow(index_arguments=(1,)),
        description="torch_scatter scatter/segment with a reduce argument: sum/mean proportional, "
        "max/min winner-take-all",
    )
)
register(
    Operation(
        "scatter_max",
        Spelling(functions=scatter_functions(MAX_FUNCTIONS + INDEX_FUNCTIONS), leaf=True),
        Native(),
        ValueFlow(index_arguments=(1,)),
        description="torch_scatter max/min (winner-take-all) and gathers",
    )
)
register(
    Operation(
        "index_add",
        Spelling(functions=(torch.scatter_add, torch.index_add), methods=("scatter_add", "index_add")),
        Affine(affine, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        ValueFlow(index_arguments=(2,)),
        description="native scatter_add/index_add (PyG's zeros(...).scatter_add_(...))",
    )
)
