"""Make every in-place operation out-of-place, so each value in the graph is written once.

Relevance Functions keep their outputs for backward; an in-place ReLU or ``+=`` on such an
output would change it under their feet. ``x += y`` becomes ``x + y``, ``x.relu_()`` becomes
``x.relu()``, ``F.relu(x, inplace=True)`` gets ``inplace=False`` and
``zeros.scatter_add_(...)`` becomes ``zeros.scatter_add(...)``; every later use of the mutated
tensor is pointed at the new result, so the graph computes the same values.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
from torch import fx, nn

OUT_OF_PLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.imatmul: operator.matmul,
    operator.ipow: operator.pow,
}
# In-place methods without an out-of-place twin, or that only set flags, stay as they are.
KEEP_IN_PLACE = {"requires_grad_", "share_memory_", "fill_", "zero_", "copy_", "set_"}


_TENSOR_METHOD_NAMES = {id(value): name for name, value in vars(torch.Tensor).items() if callable(value)}
"""torch.Tensor's methods written in Python, by identity: two are wrappers named after another
method (``x ** 2`` calls ``Tensor.__pow__``, whose ``__name__`` is ``pow``; ``x **= 2`` calls
``Tensor.__ipow__``, named ``pow_``)."""


def tensor_method_name(function: Any) -> str | None:
    """The name under which torch.Tensor holds ``function``; None for a function that is no
    Tensor method."""
    name = getattr(function, "__name__", None)
    if name is not None and getattr(torch.Tensor, name, None) is function:
        return name
    return _TENSOR_METHOD_NAMES.get(id(function))


def out_of_place_method(name: str) -> str | None:
    """``add_`` -> ``add``; None if ``name`` is not an in-place Tensor method with a twin."""
    if not name.endswith("_") or name.endswith("__") or name in KEEP_IN_PLACE:
        return None
    twin = name[:-1]
    return twin if callable(getattr(torch.Tensor, twin, None)) else None


def without_inplace_flag(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's keyword arguments with ``inplace=False`` if it asked for ``inplace=True``."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    if bound.arguments.get("inplace") is not True:
        return None
    bound.arguments["inplace"] = False
    return dict(bound.arguments)


def canonicalise_in_place(graph: fx.Graph, modules: dict[str, nn.Module]) -> set[str]:
    """Rewrite in-place nodes of ``graph``; return names of call_module nodes whose module runs
    in place (the rewrite gives them an out-of-place copy)."""
    order = {node: position for position, node in enumerate(graph.nodes)}
    in_place_modules: set[str] = set()
    for node in list(graph.nodes):
        mutated = None
        if node.op == "call_function" and node.target in OUT_OF_PLACE_OPERATORS:
            node.target = OUT_OF_PLACE_OPERATORS[node.target]
            mutated = node.args[0]
        elif node.op == "call_method" and out_of_place_method(node.target):
            node.target = out_of_place_method(node.target)
            mutated = node.args[0]
        elif node.op == "call_function" and callable(node.target):
            arguments = without_inplace_flag(node.target, node.args, node.kwargs)
            if arguments is not None:
                node.args, node.kwargs = (), arguments
                mutated = next(iter(arguments.values()))
        elif node.op == "call_module" and getattr(modules.get(node.target), "inplace", False) is True:
            in_place_modules.add(node.name)
            mutated = node.args[0] if node.args else None
        if isinstance(mutated, fx.Node):
            for user in list(mutated.users):
                if user is not node and order[user] > order[node]:
                    user.replace_input_with(mutated, node)
    return in_place_modules
