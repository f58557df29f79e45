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

import contextlib
import contextvars
import dataclasses
import operator
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import Function
from torch.overrides import TorchFunctionMode

from fxlrp.capture.interception import (
    CHECKPOINT,
    checkpointed_call,
    forward_of,
    intercepted_applications,
    intercepted_calls,
)
from fxlrp.capture.module_state import parameters_detached
from fxlrp.capture.source import function_name
from fxlrp.eager.in_place import replace_values, write
from fxlrp.eager.rule_choice import (
    Interpretation,
    ModuleContext,
    OperationObserver,
    arguments_carry,
    current_observer,
    holds_relevance,
)
from fxlrp.eager.runner import LayerRunner, OperationRun
from fxlrp.eager.views import Views, swap
from fxlrp.graph.canonicalise import without_inplace_flag
from fxlrp.registry import REGISTRY, Operation
from fxlrp.registry.spellings import (
    AUGMENTED_ASSIGNMENTS,
    VIEW_METADATA_METHODS,
    WRITES,
    out_of_place_method,
    tensor_method_name,
    tensor_property_name,
)
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.rule_function import carries_relevance


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """How :class:`RelevanceMode` handles the calls of one torch function or Tensor method."""

    operation: Operation | None
    """Its operation in the registry (for an in-place method, its out-of-place twin's)."""
    twin: Any = None
    """For an in-place method (``add_``, ``+=``): the out-of-place method run in its place."""
    in_place: str | None = None
    """For an in-place method: its name."""
    write: bool = False
    """An in-place write that replaces or moves values (:data:`WRITES`)."""
    source: bool = False
    """Relevance starts at its output even when no argument carries any (an embedding lookup)."""


def _lookup(function: Any) -> Dispatch:
    """How calls of a torch function or Tensor method are handled."""
    name = tensor_method_name(function) or tensor_property_name(function)
    method = name is not None
    if method and name in WRITES:
        return Dispatch(None, write=True)
    operation = REGISTRY.for_function(function)
    if operation is not None:
        return Dispatch(operation, source=operation.propagation.source)
    if not method:
        return Dispatch(None)
    operation = REGISTRY.for_method(name)
    if operation is not None:
        return Dispatch(operation)
    augmented = AUGMENTED_ASSIGNMENTS.get(name)
    twin = augmented.operator_method if augmented is not None else out_of_place_method(name)
    operation = None if twin is None else REGISTRY.for_method(twin)
    return Dispatch(None) if operation is None else Dispatch(operation, getattr(torch.Tensor, twin), name)


_dispatches: dict[Any, Dispatch] = {}
_dispatches_version = -1
"""The registry's version :data:`_dispatches` were made from."""


def dispatch_of(function: Any) -> Dispatch:
    """How calls of a torch function or Tensor method are handled.

    Made once per function (this runs at every torch call of code run eagerly); made again once
    the registry has changed.

    Parameters
    ----------
    function : Any
        The function a torch function mode sees.

    Returns
    -------
    Dispatch
        The handling.
    """
    global _dispatches_version
    if _dispatches_version != REGISTRY.version:
        _dispatches.clear()
        _dispatches_version = REGISTRY.version
    try:
        dispatch = _dispatches.get(function)
    except TypeError:  # not hashable
        return _lookup(function)
    if dispatch is None:
        dispatch = _dispatches[function] = _lookup(function)
    return dispatch


class RelevanceMode(TorchFunctionMode):
    """Routes torch calls on relevance-carrying tensors to the registry's relevance functions.

    Parameters
    ----------
    interpretation : Interpretation
        The run's rules and bookkeeping.
    """

    def __init__(self, interpretation: Interpretation) -> None:
        super().__init__()
        self.interpretation = interpretation
        self.views = Views()

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        interpretation = self.interpretation
        if not interpretation.active:
            return function(*args, **kwargs)
        dispatch = dispatch_of(function)
        if not arguments_carry(args, kwargs):
            if dispatch.source:  # an embedding lookup: relevance starts here
                result = interpretation.run(dispatch.operation, function, args, kwargs)
                interpretation.enter((result,), {})
                return result
            return function(*args, **kwargs)
        if dispatch.write:
            return write(function, args, kwargs, self.views)
        operation, in_place = dispatch.operation, dispatch.in_place
        runnable = function if in_place is None else dispatch.twin
        observer = interpretation.observer
        if operation is None:
            result = function(*args, **kwargs)
            if holds_relevance(result):
                if observer is not None:
                    observer(interpretation, function_name(function), False)
                return interpretation.unsupported(function_name(function), result)
            return result
        if in_place is None:
            # ``F.relu(x, inplace=True)`` (an activation module built with inplace=True) would
            # overwrite a tensor a rule keeps: it runs out of place, as capture makes it in a graph,
            # and its input then takes the result as an in-place write's target does (code may
            # read the input, or what it views, rather than the result).
            # A signature is bound only for a flag given by position (binding costs, and most
            # calls have no flag).
            written = None
            if kwargs.get("inplace") is True:
                kwargs, written = {**kwargs, "inplace": False}, args[0] if args else None
            elif len(args) > 1 and any(map(operator.is_, args[1:], repeat(True))):
                arguments = without_inplace_flag(runnable, args, kwargs)
                if arguments is not None:
                    (args, kwargs), written = arguments, args[0]
            result = interpretation.run(operation, runnable, args, kwargs)
            if isinstance(written, Tensor) and isinstance(result, Tensor):
                result = replace_values(written, result, self.views)
            if operation.flow.moves_values and isinstance(result, Tensor) and result._is_view():
                self.views.note(result)
        else:
            result = self._in_place(operation, runnable, in_place, args, kwargs)
        if observer is not None and holds_relevance(result):
            observer(interpretation, operation.name, True)
        return result

    def _in_place(self, operation: Operation, runnable: Any, name: str, args: tuple, kwargs: dict) -> Any:
        """``target.op_(...)`` / ``target op= ...``: the out-of-place twin with its rule, written back."""
        target = args[0]
        carries = carries_relevance(target)
        if not carries and name not in AUGMENTED_ASSIGNMENTS and name not in VIEW_METADATA_METHODS:
            # A buffer filled in place (``zeros.scatter_reduce_(...)``) takes the result below;
            # the twin's backward may keep its first argument (scatter_reduce's does): a copy.
            args = (target.clone(), *args[1:])
        result = self.interpretation.run(operation, runnable, args, kwargs)
        if name in VIEW_METADATA_METHODS:  # ``v.unsqueeze_(0)``: ``v`` takes the new shape, what it views stays
            swap(target, result)
            return target
        if carries:
            return replace_values(target, result, self.views)
        if name in AUGMENTED_ASSIGNMENTS:
            return result  # ``a += b`` rebinds ``a`` to the result
        # The buffer (perhaps a module's) keeps its memory and takes the values, and relevance
        # reaches the result through the copy's identity backward.
        return target.copy_(result)



def _leaf_function_handler(interpretation: Interpretation):
    def handle(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
        if not interpretation.active or not arguments_carry(args, kwargs):
            return original(*args, **kwargs)
        operation = REGISTRY.for_function(function)
        with interpretation.paused():
            return interpretation.run(operation, original, args, kwargs)

    return handle


def _custom_function_handler(interpretation: Interpretation, mode: RelevanceMode):
    """A custom ``torch.autograd.Function`` that the code run eagerly applies to relevance-carrying
    tensors is explained by the operations of its ``forward``, as a captured graph explains it
    (torch.fx traces through ``forward``): its ``backward`` is a rule of training - a
    straight-through estimator, a gradient reversal - that relevance would otherwise follow. Only
    for calls the code itself makes (the mode on top of the thread's stack, the interpretation
    active), not for the relevance Functions fxlrp applies while it handles a call."""

    def handle(function: type[Function], args: tuple, kwargs: dict, own: Callable[..., Any]) -> Any:
        depth = torch._C._len_torch_function_stack()
        if (interpretation.active and depth and torch._C._get_function_stack_at(depth - 1) is mode
                and arguments_carry(args, kwargs)):
            operation = REGISTRY.for_function(function)
            if operation is not None:  # its own backward declared its rule
                with interpretation.paused():
                    return interpretation.run(operation, own, args, kwargs)
            return _forward_explained(interpretation, function, args, kwargs, own)
        return own(*args, **kwargs)

    return handle


def _forward_explained(interpretation: Interpretation, function: type[Function], args: tuple, kwargs: dict,
                       own: Callable[..., Any]) -> Any:
    """``function``'s forward run with autograd on, so the relevance mode explains its operations.
    An output that carries no relevance although the inputs do (an operation the mode does not
    see, such as a compiled extension's) makes the Function an operation without a rule: its own
    backward is used (``strict=False``) or it is named."""
    output = forward_of(function, args, kwargs)
    if holds_relevance(output):
        return output
    return interpretation.unsupported(f"{function.__name__}.apply (a custom autograd Function)", own(*args, **kwargs))


def intercepted_functions() -> tuple[Callable[..., Any], ...]:
    """Library functions explained as a whole when library code calls them.

    Returns
    -------
    tuple of callable
        The registry's leaf functions and graph softmax's functions.
    """
    return (*REGISTRY.leaf_functions(), *REGISTRY.operations["graph_softmax"].spelling.functions)


def _enter_relevance_mode(stack: contextlib.ExitStack, interpretation: Interpretation, runner: LayerRunner | None,
                          running: tuple[torch.nn.Module, ...]) -> None:
    """Enter on ``stack`` what a run under the relevance mode runs in: module calls followed (from
    the modules ``running`` at its start), library functions and custom Functions intercepted,
    checkpoints honoured, :class:`RelevanceMode`."""
    context = interpretation.context
    if context is not None:
        stack.enter_context(context.followed())
        context.stack.extend(running)
    stack.enter_context(intercepted_calls(intercepted_functions(), _leaf_function_handler(interpretation)))
    stack.enter_context(intercepted_calls((CHECKPOINT,), _checkpoint_handler(interpretation, runner)))
    mode = RelevanceMode(interpretation)
    stack.enter_context(intercepted_applications(_custom_function_handler(interpretation, mode)))
    stack.enter_context(mode)


def _checkpoint_handler(interpretation: Interpretation, runner: LayerRunner | None):
    """Activation checkpointing honoured: ``checkpoint(f, *inputs)`` that the code run eagerly
    calls on relevance-carrying inputs (a transformers layer after
    ``model.gradient_checkpointing_enable()``, which the runner puts in training mode for it, in
    whatever mode the model is; or the model's own call) runs ``f`` under torch's non-reentrant
    checkpoint. Its forward keeps only ``f``'s inputs; backward recomputes ``f`` under the same
    relevance mode - the part's parameters detached and its modules in evaluation mode again, the
    modules running at the checkpoint followed, fxlrp's context (the gradient form) as it was - so
    that the relevance Functions made again save what their first run saved, and an explanation's
    activations are those of the checkpointed gradient's. The whole of ``f`` is recomputed (no
    early stop: a rule may rectify a tensor it saved after saving it). The call's own options are
    kept, but reentrant checkpointing, whose recomputation runs its function as a plain autograd
    Function's forward, is run as non-reentrant."""

    def handle(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
        checkpointed, inputs, keywords, options = checkpointed_call(args, kwargs)
        if not interpretation.active or not torch.is_grad_enabled() or not arguments_carry(inputs, keywords):
            return checkpointed(*inputs, **keywords)
        context = interpretation.context
        running = tuple(context.stack) if context is not None else ()
        variables = contextvars.copy_context()
        own_contexts = options.pop("context_fn", None)

        @contextlib.contextmanager
        def recomputation(own: Any) -> Iterator[None]:
            with contextlib.ExitStack() as stack:
                stack.enter_context(own)
                if runner is not None:
                    stack.enter_context(parameters_detached(runner.module, evaluation=True))
                _enter_relevance_mode(stack, interpretation, runner, running)
                yield

        def contexts() -> tuple[Any, Any]:
            forward, recompute = own_contexts() if own_contexts is not None else (contextlib.nullcontext(),) * 2
            return forward, recomputation(recompute)

        def run(*values: Any, **named: Any) -> Any:  # (in fxlrp's context of the checkpoint's call, both times)
            return variables.run(checkpointed, *values, **named)

        options.update(use_reentrant=False, early_stop=False, context_fn=contexts)
        return original(run, *inputs, **options, **keywords)

    return handle


def interpret(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Relevance function of library modules and functions, run with every torch operation explained.

    Each torch operation on relevance-carrying tensors is explained by its registry entry.

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        The library module or function.
    *args, **kwargs
        Its arguments.

    Returns
    -------
    Any
        What ``function`` returns (natively run where no argument carries relevance).
    """
    if not torch.is_grad_enabled() or not arguments_carry(args, kwargs):
        return function(*args, **kwargs)
    return run_interpreted(call, function, args, kwargs, current_observer())


def run_interpreted(call: RelevanceCall, function: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                    observer: OperationObserver | None = None) -> Any:
    """Run ``function(*args, **kwargs)`` under :class:`RelevanceMode`.

    For a :class:`LayerRunner` the composite's name and type rules follow the module calls
    inside it (where it has any: following costs a hook call at every module call).

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    function : callable
        A :class:`LayerRunner`, or a library function.
    args : tuple
        Positional arguments.
    kwargs : dict
        Keyword arguments.
    observer : OperationObserver, optional
        See :func:`operations_observed`.

    Returns
    -------
    Any
        What ``function`` returns.

    Raises
    ------
    UnsupportedOperationError
        With ``call.strict``, naming together every operation without a rule, once the run is
        over.
    """
    interpretation = Interpretation(call, observer=observer)
    interpretation.runs_module = isinstance(function, LayerRunner)
    interpretation.enter(args, kwargs)
    if interpretation.runs_module:
        # Module calls are followed for the report of the part; for rules only where the module
        # a call belongs to can change its rule.
        prefix = call.site.module_name + "." if call.site is not None and call.site.module_name else ""
        interpretation.context = ModuleContext(function.module_names(prefix))
        interpretation.rules_by_module = interpretation.composite.chooses_by_module()
        interpretation.ran = {}
    runner = function if interpretation.runs_module else None
    with contextlib.ExitStack() as stack:
        _enter_relevance_mode(stack, interpretation, runner, running=())
        result = function(*args, **kwargs)
    if interpretation.runs_module:
        _merge_run(function.operations_run, interpretation.noted())
    interpretation.raise_unsupported(result)
    return result


def _merge_run(kept: dict[tuple[str, str, str, str], OperationRun],
               run: dict[tuple[str, str, str, str], OperationRun]) -> None:
    """Add a run's rows to those kept: new rows, and the most calls any run made of each."""
    for key, row in run.items():
        if key not in kept:
            kept[key] = row
        elif row.calls > kept[key].calls:
            kept[key] = dataclasses.replace(kept[key], calls=row.calls)
