"""Explain library code by running it: every torch operation is routed through the registry.

Some code cannot be captured by torch.fx. A PyG layer's forward and ``propagate`` check types,
ranks and sizes of their inputs and pick code paths by them (``isinstance(edge_index, Tensor)``,
``int(index.max()) + 1``, torch_scatter or native scatters); torchvision's
``shifted_window_attention`` branches on tensor shapes. Such a module or function stays one node
of the captured graph and, at explanation time, runs its real code on real tensors inside
:class:`RelevanceMode`, a ``TorchFunctionMode`` that sends each torch function, Tensor method and
operator whose arguments carry relevance to the relevance function the registry holds for it.
Operations explained through a decomposition written in plain torch (attention) run the same
way. Library functions registered as ``leaf`` (PyG's ``scatter``, ``softmax``, the global pools)
are intercepted by identity and explained as a whole. Every decision of the code is taken on the
input at hand, so nothing is baked from an earlier input; the same rules apply inside as in the
graph.

Operations on tensors that carry no relevance (degree normalisation computed from
``edge_index``, masks, position biases, shapes) run natively. An operation without a rule on a
relevance-carrying tensor is an :class:`~fxlrp.UnsupportedOperationError` (``strict=False``:
its gradient is used, with a warning).
"""

from __future__ import annotations

import dataclasses
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

import fxlrp
from fxlrp.call import RelevanceCall
from fxlrp.canonicalise import out_of_place_method
from fxlrp.errors import UnsupportedOperationError
from fxlrp.leaf_functions import intercepted_calls
from fxlrp.nodes import detached_state
from fxlrp.registry import REGISTRY, Kind, Operation
from fxlrp.relevance.rule_function import carries_relevance

AUGMENTED_ASSIGNMENTS = {"__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__",
                         "__itruediv__": "__truediv__"}
_LIBRARY_FILES = (torch.__file__.rsplit("/", 1)[0], fxlrp.__file__.rsplit("/", 1)[0])


def _tensors(value: Any) -> list[Tensor]:
    """Tensors inside nested tuples, lists and dicts (a plain walk: this runs for every torch call)."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return found


def _carries(value: Any) -> bool:
    """Whether a relevance-carrying tensor is inside nested tuples, lists and dicts (stops at the
    first one: this runs for every torch call)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Tensor):
            if item.requires_grad:
                return True
        elif isinstance(item, (tuple, list)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return False


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and fxlrp (the library or user code)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(_LIBRARY_FILES):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "?"


class LayerRunner:
    """A module's forward with its parameters and buffers detached (shared storage)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.state = detached_state(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self.module, self.state, args, kwargs)


def layer_runner(module: torch.nn.Module, parameters: dict[str, Any]) -> tuple[LayerRunner, dict[str, Any]]:
    """``module_function`` of library modules explained by running them."""
    return LayerRunner(module), {}


class Interpretation:
    """Rules and bookkeeping for one run of library code under :class:`RelevanceMode`."""

    def __init__(self, call: RelevanceCall) -> None:
        self.call = call
        self.active = True
        self._calls: dict[tuple[str, int], tuple[Any, RelevanceCall]] = {}
        # Ids of tensors computed from the output of a weighted operation (kept alive while
        # the run lasts): only a weighted operation that reads none of them is a first layer.
        self._after_layer: set[int] = set()
        self._kept: list[Tensor] = []

    @contextmanager
    def paused(self) -> Iterator[None]:
        active, self.active = self.active, False
        try:
            yield
        finally:
            self.active = active

    def rule_for(self, operation: Operation, inputs: Any) -> Any:
        site, composite = self.call.site, self.call.composite
        if operation.kind is not Kind.AFFINE:
            return None
        if site is None or composite is None:
            return self.call.rule if operation.weighted else (operation.default_rule or (lambda: None))()
        counts = getattr(composite, "counts_as_first_layer", lambda name, weighted: weighted)
        first = (site.is_first_layer and counts(operation.name, operation.weighted)
                 and not any(id(tensor) in self._after_layer for tensor in _tensors(inputs)))
        inner = dataclasses.replace(site, node_name=f"{site.node_name}.{operation.name}", operation=operation.name,
                                    weighted=operation.weighted, is_first_layer=first, is_module_call=False)
        rule = composite.rule_for(inner)
        if rule is None:
            rule = operation.default_rule() if operation.default_rule else composite.layer_rule
        return rule

    def call_for(self, operation: Operation, inputs: Any) -> RelevanceCall:
        rule = self.rule_for(operation, inputs)
        key = (operation.name, id(rule))
        if key not in self._calls:
            call = RelevanceCall(rule, self.call.warn_lost_relevance, site=self.call.site,
                                 composite=self.call.composite, strict=self.call.strict)
            self._calls[key] = (rule, call)
        return self._calls[key][1]

    def track(self, operation: Operation | None, inputs: Any, result: Any) -> None:
        if self.call.site is None or not self.call.site.is_first_layer:
            return
        downstream = (operation is not None and operation.weighted) or any(
            id(tensor) in self._after_layer for tensor in _tensors(inputs))
        if downstream:
            for tensor in _tensors(result):
                self._after_layer.add(id(tensor))
                self._kept.append(tensor)

    def run(self, operation: Operation, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``operation``'s relevance function on this call, or the native call without one."""
        if operation.relevance is None:
            result = function(*args, **kwargs)
        else:
            result = operation.relevance(self.call_for(operation, (args, kwargs)), function, *args, **kwargs)
        self.track(operation, (args, kwargs), result)
        return result

    def unsupported(self, name: str, result: Any) -> Any:
        where = _caller()
        if self.call.strict:
            raise UnsupportedOperationError(
                f"fxlrp has no LRP rule for {name} on a relevance-carrying tensor inside "
                f"{self.call.site.module_name if self.call.site else 'a library call'}\n  at {where}\n"
                "Register a rule for it (see docs/extending.md), or pass strict=False to let relevance "
                "follow its gradient."
            )
        warnings.warn(f"fxlrp: relevance follows the gradient through {name} (no LRP rule) at {where}",
                      stacklevel=2)
        return result


def _lookup(function: Any) -> tuple[Operation | None, Any, str | None]:
    """The operation of a torch function or Tensor method, the callable to run for it, and for
    an in-place method the name of its out-of-place twin."""
    operation = REGISTRY.for_function(function)
    if operation is not None:
        return operation, function, None
    name = getattr(function, "__name__", None)
    if name is None or getattr(torch.Tensor, name, None) is not function:
        return None, function, None
    operation = REGISTRY.for_method(name)
    if operation is not None:
        return operation, function, None
    twin = AUGMENTED_ASSIGNMENTS.get(name) or out_of_place_method(name)
    if twin is not None and REGISTRY.for_method(twin) is not None:
        return REGISTRY.for_method(twin), getattr(torch.Tensor, twin), name
    return None, function, None


class RelevanceMode(TorchFunctionMode):
    """Routes torch calls on relevance-carrying tensors to the registry's relevance functions."""

    def __init__(self, interpretation: Interpretation) -> None:
        super().__init__()
        self.interpretation = interpretation

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        interpretation = self.interpretation
        if not interpretation.active or not _carries((args, kwargs)):
            result = function(*args, **kwargs)
            if interpretation.active:
                interpretation.track(None, (args, kwargs), result)
            return result
        operation, runnable, in_place = _lookup(function)
        if operation is None:
            result = function(*args, **kwargs)
            if _carries(result):
                return interpretation.unsupported(getattr(function, "__qualname__", repr(function)), result)
            return result
        if in_place is None:
            return interpretation.run(operation, runnable, args, kwargs)
        return self._in_place(operation, runnable, in_place, args, kwargs)

    def _in_place(self, operation: Operation, runnable: Any, name: str, args: tuple, kwargs: dict) -> Any:
        target = args[0]
        result = self.interpretation.run(operation, runnable, args, kwargs)
        if name in AUGMENTED_ASSIGNMENTS:
            return result  # ``a += b`` rebinds ``a`` to the result
        if carries_relevance(target):
            raise UnsupportedOperationError(
                f"fxlrp: in-place {name} on a relevance-carrying tensor at {_caller()}: relevance "
                "functions keep their inputs for backward, so the tensor cannot be overwritten. Use the "
                "out-of-place form."
            )
        # A fresh buffer filled in place (``zeros.scatter_add_(...)``): it takes the result,
        # and relevance reaches the result through the copy's identity backward.
        return target.copy_(result)


def _leaf_function_handler(interpretation: Interpretation):
    def handle(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
        if not interpretation.active or not _carries((args, kwargs)):
            return original(*args, **kwargs)
        operation = REGISTRY.for_function(function)
        with interpretation.paused():
            return interpretation.run(operation, original, args, kwargs)

    return handle


def intercepted_functions() -> tuple[Callable[..., Any], ...]:
    """Library functions explained as a whole when library code calls them."""
    return (*REGISTRY.leaf_functions(), *REGISTRY.operations["graph_softmax"].functions)


def interpret(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Relevance function of library modules and functions: run ``function`` with every torch
    operation on relevance-carrying tensors explained by its registry entry."""
    if not torch.is_grad_enabled() or not _carries((args, kwargs)):
        return function(*args, **kwargs)
    interpretation = Interpretation(call)
    with intercepted_calls(intercepted_functions(), _leaf_function_handler(interpretation)):
        with RelevanceMode(interpretation):
            return function(*args, **kwargs)
