"""How a model spells an operation beyond its registry entry: Tensor methods, operators, and their
in-place and augmented forms.

One table for every interceptor: the fx tracer records ``x + y`` as ``operator.add`` and
``x += y`` as ``operator.iadd``; the relevance mode of code run eagerly
(:mod:`fxlrp.eager.interpret`) and the recorder (:mod:`fxlrp.eager.record`) see the Tensor methods
Python calls (``Tensor.__add__``, ``Tensor.__iadd__``); canonicalisation
(:mod:`fxlrp.graph.canonicalise`) turns in-place forms into out-of-place ones. Each reads the
forms here, so a spelling means the same operation on every path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class AugmentedAssignment:
    """``x op= y`` in each of its spellings."""

    method: str
    """The Tensor method Python calls (``"__iadd__"``)."""
    operator_method: str
    """The Tensor method of the operator it applies (``"__add__"``): its operation in the registry."""
    operator: Callable[[Any, Any], Any]
    """The operator function torch.fx records ``x op y`` by (``operator.add``)."""
    in_place_operator: Callable[[Any, Any], Any]
    """The operator function torch.fx records ``x op= y`` by (``operator.iadd``)."""


AUGMENTED_ASSIGNMENTS: dict[str, AugmentedAssignment] = {
    f"__i{name}__": AugmentedAssignment(f"__i{name}__", f"__{name}__", getattr(operator, function),
                                        getattr(operator, "i" + function.rstrip("_")))
    for name, function in {
        "add": "add", "sub": "sub", "mul": "mul", "truediv": "truediv", "floordiv": "floordiv", "mod": "mod",
        "pow": "pow", "matmul": "matmul", "and": "and_", "or": "or_", "xor": "xor", "lshift": "lshift",
        "rshift": "rshift",
    }.items()
}
"""Every augmented assignment by the Tensor method Python calls for it."""

OUT_OF_PLACE_OPERATORS: dict[Callable[[Any, Any], Any], Callable[[Any, Any], Any]] = {
    spelling.in_place_operator: spelling.operator for spelling in AUGMENTED_ASSIGNMENTS.values()
}
"""``operator.iadd`` -> ``operator.add``, for each augmented assignment."""

OPERATORS: dict[str, tuple[Callable[..., Any], bool]] = {
    spelling.operator_method: (spelling.operator, False) for spelling in AUGMENTED_ASSIGNMENTS.values()
} | {
    spelling.operator_method.replace("__", "__r", 1): (spelling.operator, True)
    for spelling in AUGMENTED_ASSIGNMENTS.values()
} | {
    name: (getattr(operator, name.strip("_")), False)
    for name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__",
                 "__invert__", "__getitem__", "__setitem__")
}
"""Tensor's operator methods as the ``operator`` functions torch.fx records them by (``x + y`` is
``operator.add``); reflected ones (``2 - x``, ``__rsub__``) swap their operands."""

KEEP_IN_PLACE = frozenset({"requires_grad_", "share_memory_", "fill_", "zero_", "copy_", "set_"})
"""In-place methods without an out-of-place twin, or that only set flags."""

WRITES = frozenset({"__setitem__", "copy_", "fill_", "zero_", "fill_diagonal_"})
"""In-place writes that replace or move values: their gradient routes relevance (a replaced value
passes its relevance on to nothing, a copied one to where it came from)."""

VIEW_METADATA_METHODS = frozenset({"unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_",
                                   "as_strided_"})
"""In-place methods that change a tensor's shape, not its values (nor what it views)."""

_TENSOR_METHOD_NAMES = {id(value): name for name, value in vars(torch.Tensor).items() if callable(value)}
"""torch.Tensor's methods written in Python, by identity: some are wrappers named after another
method (``x ** 2`` calls ``Tensor.__pow__``, whose ``__name__`` is ``pow``; ``x **= 2`` calls
``Tensor.__ipow__``, named ``pow_``; ``x /= 2`` calls ``Tensor.__itruediv__``, named ``__idiv__``)."""


def tensor_method_name(function: Any) -> str | None:
    """The name under which torch.Tensor holds ``function``.

    Parameters
    ----------
    function : Any
        A called function.

    Returns
    -------
    str or None
        The method's name; None for a function that is no Tensor method.
    """
    name = getattr(function, "__name__", None)
    if name is not None and getattr(torch.Tensor, name, None) is function:
        return name
    return _TENSOR_METHOD_NAMES.get(id(function))


def tensor_property_name(function: Any) -> str | None:
    """The name of the property whose getter ``function`` is.

    A torch function mode sees such a getter for ``x.mT``: a new ``__get__`` wrapper at each
    read.

    Parameters
    ----------
    function : Any
        A called function.

    Returns
    -------
    str or None
        The property's name; None for any other function.
    """
    if getattr(function, "__name__", None) != "__get__":
        return None
    return getattr(getattr(function, "__self__", None), "__name__", None)


def out_of_place_method(name: str) -> str | None:
    """The out-of-place twin of an in-place Tensor method: ``add_`` -> ``add``.

    Parameters
    ----------
    name : str
        A Tensor method's name.

    Returns
    -------
    str or None
        The twin's name; None if ``name`` is not an in-place Tensor method with a twin.
    """
    if not name.endswith("_") or name.endswith("__") or name in KEEP_IN_PLACE:
        return None
    twin = name[:-1]
    return twin if callable(getattr(torch.Tensor, twin, None)) else None
