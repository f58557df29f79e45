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

from collections.abc import Callable
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
from fxlrp.relevance.rule_function import carries_relevance

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


TORCH_SCATTER_SUMS = scatter_functions(("scatter_sum", "scatter_add"))
"""torch_scatter's sums, ``scatter_sum(src, index, dim=-1, out=None, dim_size=None)``."""
InputGradient = Callable[[Tensor, None, Tensor], Tensor]


def gathered(index: Any, dim: int, src: Tensor) -> InputGradient | None:
    r"""The vector-Jacobian product in ``src`` of a sum of ``src`` into slots along ``dim`` by
    ``index`` (``out[..., index[e], ...] += src[..., e, ...]``), in closed form: the output's gradient
    read back at each summand's slot, ``g_src = g[..., index[e], ...]`` - ``index_select`` for an
    index of one dimension (which the sum broadcasts over the other dimensions, as torch_scatter
    and ``index_add`` do), ``gather`` for an index of ``src``'s shape (``scatter_add``), the copies
    autograd's own backward makes. A rule that needs only this product (the z-rule's
    ``R_src = src * g_src`` at ``g = R / z``) then builds no inner graph.

    Parameters
    ----------
    index : Any
        The sum's index; a tensor that carries no relevance, else no closed form.
    dim : int
        The dimension summed along (negative counts from the end).
    src : Tensor
        The summands.

    Returns
    -------
    callable or None
        ``(gradient, weight, input) -> gradient of src`` (:attr:`~fxlrp.relevance.AffineLayer.input_gradient`);
        None for other indices, which keep the inner graph.
    """
    if not isinstance(index, Tensor) or carries_relevance(index) or not isinstance(src, Tensor) or src.dim() == 0:
        return None
    dim = dim % src.dim()
    if index.dim() == 1:
        return lambda gradient, weight, input: gradient.index_select(dim, index)
    if index.shape == src.shape:
        return lambda gradient, weight, input: gradient.gather(dim, index)
    return None


def scatter_sum_gradient(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InputGradient | None:
    """The vector-Jacobian product in ``src`` of torch_scatter's ``scatter_sum`` / ``scatter_add``
    (:func:`gathered`), where ``src`` alone carries relevance and nothing is added to an ``out``
    given; None for its other functions and calls (means, segments: an inner graph)."""
    if function not in TORCH_SCATTER_SUMS or len(args) < 2 or set(kwargs) - {"dim", "out", "dim_size"}:
        return None
    src, index = args[:2]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    out = args[3] if len(args) > 3 else kwargs.get("out")
    if out is not None or not isinstance(dim, int) or not carries_relevance(src):
        return None
    return gathered(index, dim, src)


def scatter_sum(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Tensor:
    """torch_scatter's sums and means by the proportional rule, the sums' vector-Jacobian product
    in closed form where :func:`scatter_sum_gradient` gives one."""
    return affine(call, function, *args, input_gradient=scatter_sum_gradient(function, args, kwargs), **kwargs)


def native_sum_gradient(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InputGradient | None:
    """The vector-Jacobian product in ``src`` of ``scatter_add(self, dim, index, src)`` and
    ``index_add(self, dim, index, source)`` (:func:`gathered`), where ``src`` alone carries relevance
    (PyG's ``zeros(...).scatter_add_(...)``) and ``index_add`` has no ``alpha``; None otherwise."""
    name = getattr(function, "__name__", None)
    if name not in ("scatter_add", "index_add") or len(args) != 4 or kwargs:
        return None
    target, dim, index, src = args
    if carries_relevance(target) or not isinstance(dim, int) or not carries_relevance(src):
        return None
    if name == "scatter_add" and not (isinstance(index, Tensor) and index.shape == src.shape):
        return None
    return gathered(index, dim, src)


def native_sum(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Native ``scatter_add`` and ``index_add`` by the proportional rule, their vector-Jacobian
    product in closed form where :func:`native_sum_gradient` gives one."""
    return affine(call, function, *args, input_gradient=native_sum_gradient(function, args, kwargs), **kwargs)


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
        Affine(scatter_sum, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
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
        Affine(native_sum, default_rule=proportional, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        ValueFlow(index_arguments=(2,)),
        description="native scatter_add/index_add (PyG's zeros(...).scatter_add_(...))",
    )
)
