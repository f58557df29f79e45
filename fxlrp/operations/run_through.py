"""Explain a library function by running it with every torch call on relevance-carrying tensors
replaced by its registered relevance function.

Some functions cannot be captured as a graph (torchvision's ``shifted_window_attention`` branches
on tensor shapes and is recorded as one call); some operations are explained through a
decomposition written in plain torch (attention). Both run under :class:`RelevanceMode`, a
``TorchFunctionMode`` that looks every torch function and Tensor method up in the registry, so
the same rules apply inside as in the graph. Calls on tensors that carry no relevance (masks,
position biases, shapes) run natively.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fxlrp.attention_rules import PRODUCT_OPERATIONS
from fxlrp.call import RelevanceCall
from fxlrp.errors import UnsupportedOperationError
from fxlrp.registry import REGISTRY, Kind, Operation
from fxlrp.relevance.rule_function import carries_relevance


def any_carries_relevance(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(any_carries_relevance(item) for item in value)
    if isinstance(value, dict):
        return any(any_carries_relevance(item) for item in value.values())
    return carries_relevance(value)


def operation_of(function: Callable[..., Any]) -> Operation | None:
    """The registered operation of a torch function or Tensor method as ``TorchFunctionMode`` sees it."""
    name = getattr(function, "__name__", "")
    if getattr(torch.Tensor, name, None) is function:
        return REGISTRY.for_method(name)
    return REGISTRY.for_function(function)


class RelevanceMode(TorchFunctionMode):
    """While active, torch calls on relevance-carrying tensors run as relevance functions.

    Rules: the composite of the enclosing node decides each inner operation's rule as it would
    for a node of the enclosing module (weighted layers and products get the module's rules,
    softmax and sums their defaults); without a composite the enclosing node's rule is used for
    weighted layers and products. Calls with no rule raise :class:`UnsupportedOperationError`.
    """

    def __init__(self, call: RelevanceCall, where: str) -> None:
        super().__init__()
        self.call = call
        self.where = where

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(function, "__name__", "") == "__get__" or not any_carries_relevance((args, kwargs)):
            return function(*args, **kwargs)  # attribute reads and calls without relevance
        operation = operation_of(function)
        if operation is None:
            raise UnsupportedOperationError(
                f"fxlrp has no LRP rule for {getattr(function, '__qualname__', function)} called on "
                f"relevance-carrying tensors inside {self.where}; register a rule for it "
                "(see docs/extending.md)."
            )
        if operation.relevance is None:
            return function(*args, **kwargs)
        call = RelevanceCall(self.rule_for(operation), self.call.warn_lost_relevance)
        return operation.relevance(call, function, *args, **kwargs)

    def rule_for(self, operation: Operation) -> Any:
        if operation.kind is not Kind.AFFINE:
            return None
        composite, site = getattr(self.call, "composite", None), getattr(self.call, "site", None)
        rule = None
        if composite is not None and site is not None:
            inner = dataclasses.replace(site, operation=operation.name, weighted=operation.weighted,
                                        is_first_layer=False, is_module_call=False)
            rule = composite.rule_for(inner)
        elif operation.weighted or operation.name in PRODUCT_OPERATIONS:
            rule = self.call.rule
        if rule is None and operation.default_rule is not None:
            rule = operation.default_rule()
        return self.call.rule if rule is None else rule


def run_through(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` with relevance functions for every torch call inside."""
    with RelevanceMode(call, getattr(function, "__qualname__", repr(function))):
        return function(*args, **kwargs)
