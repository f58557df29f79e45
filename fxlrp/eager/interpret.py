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
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import repeat
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import Function
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree

from fxlrp.capture.interception import (
    checkpoints_run_their_function,
    forward_of,
    intercepted_applications,
    intercepted_calls,
    module_calls_followed,
)
from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.capture.source import calling_line, function_name
from fxlrp.errors import UnsupportedOperationError
from fxlrp.graph.canonicalise import without_inplace_flag
from fxlrp.graph.relevance_flow import unreached, unreached_message
from fxlrp.graph.report import handling_of
from fxlrp.registry import REGISTRY, Kind, Operation
from fxlrp.registry.spellings import (
    AUGMENTED_ASSIGNMENTS,
    VIEW_METADATA_METHODS,
    WRITES,
    out_of_place_method,
    tensor_method_name,
    tensor_property_name,
)
from fxlrp.registry.writes import view_of_written, written_through_view
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import require_relevance_form
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.rules import Rule
from fxlrp.rules.composites import Composite, Site
from fxlrp.rules.first_layer import meets_inputs


def _arguments_carry(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a relevance-carrying tensor: :func:`_carries`, with the
    tensors among the positional arguments looked at first (the usual place; this runs for every
    torch call)."""
    for item in args:
        if isinstance(item, Tensor):
            if item.requires_grad and type(item) is not nn.Parameter:
                return True
        elif isinstance(item, (tuple, list, dict)) and _carries(item):
            return True
    return bool(kwargs) and _carries(kwargs)


def _carries(value: Any) -> bool:
    """Whether a relevance-carrying tensor (:func:`~fxlrp.relevance.rule_function.carries_relevance`)
    is inside nested tuples, lists and dicts (stops at the first one)."""
    if isinstance(value, Tensor):
        return value.requires_grad and type(value) is not nn.Parameter
    if type(value) is torch.Size or not isinstance(value, (tuple, list, dict)):
        return False  # (a shape, a dtype: what most property reads of tensors return)
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, Tensor):
            if item.requires_grad and type(item) is not nn.Parameter:
                return True
        elif isinstance(item, (tuple, list)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return False


@dataclasses.dataclass
class OperationRun:
    """Calls of one operation in one module, with one handling and rule, in a run of a part run eagerly."""

    source: str
    """``file:line: code`` of the first such call."""
    calls: int
    """How many such calls one run made (the most of any run)."""


class LayerRunner:
    """A module's forward with its parameters and buffers detached (shared storage).

    What the forward writes into the module's modules (caches, counters, ``nn.LSTM``'s flat
    weights, which swapping the parameters rebuilds) is taken back afterwards: the user's model
    stays as it was.

    Parameters
    ----------
    module : nn.Module
        The user's module.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._names: dict[str, dict[int, str]] = {}
        self.recordings: Any = None
        """Graphs recorded from runs, by input signature (:class:`fxlrp.eager.replay.Recordings`,
        which imports this module): made at the first run, replayed from the second run of a
        signature on."""
        self.operations_run: dict[tuple[str, str, str, str], OperationRun] = {}
        """What runs under the relevance mode have done, by module, operation, handling and rule
        (the rows :meth:`fxlrp.explain.explainer.Explainer.report` shows for the part)."""

    def __getstate__(self) -> dict[str, Any]:
        # Names are kept by the ids of this object's modules: a copy (copy.deepcopy, pickle) has
        # modules of its own and names them again, or its composite's name rules would miss them.
        return {**self.__dict__, "_names": {}, "recordings": None, "operations_run": {}}

    def module_names(self, prefix: str) -> dict[int, str]:
        """Qualified name of each of the module's modules, by id; made once per prefix.

        Parameters
        ----------
        prefix : str
            The module's own qualified name in the model, with a trailing dot (``""`` for the
            model itself).

        Returns
        -------
        dict of int to str
            The names under ``prefix``, by the modules' ids.
        """
        if prefix not in self._names:
            self._names[prefix] = {id(module): (prefix + name).rstrip(".")
                                   for name, module in self.module.named_modules()}
        return self._names[prefix]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module's forward in evaluation mode, with detached parameters.

        Parameters
        ----------
        *args, **kwargs
            The module's arguments.

        Returns
        -------
        Any
            The module's output.
        """
        with MODEL_WRITES:
            written = ModuleState(self.module)
            try:
                _detach_parameters(written.modules)
                in_evaluation_mode(written.modules)
                return self.module(*args, **kwargs)
            finally:
                written.restore()


def _detach_parameters(modules: list[nn.Module]) -> None:
    """Put detached twins (shared storage) in the place of the modules' parameters and buffers
    that require gradients, for one run: they carry no relevance and get no gradient. Tied
    parameters get one twin, so they stay tied. The caller's :class:`ModuleState` puts the
    originals back. (What ``torch.func.functional_call`` does, at a small part of its cost: it
    runs at every run of an eager part, and parameters that require no gradient are left alone.)"""
    twins: dict[int, Tensor] = {}
    for module in modules:
        swapped = False
        for tensors in (module._parameters, module._buffers):
            for name, value in tensors.items():
                if value is not None and value.requires_grad:
                    twin = twins.get(id(value))
                    if twin is None:
                        twin = twins[id(value)] = value.detach()
                    tensors[name] = twin
                    swapped = True
        if swapped and isinstance(module, nn.RNNBase):
            # A recurrent layer hands its kernel its own list of its parameters, made when they
            # are set: made again from the twins (ModuleState puts the module's list back).
            module._init_flat_weights()


def layer_runner(module: torch.nn.Module, parameters: dict[str, Any]) -> tuple[LayerRunner, dict[str, Any]]:
    """``module_function`` of library modules explained by running them.

    Parameters
    ----------
    module : nn.Module
        The module.
    parameters : dict of str to Tensor
        Its detached parameters and buffers (unused: :class:`LayerRunner` detaches them for
        each run).

    Returns
    -------
    runner : LayerRunner
        The module's runner.
    keywords : dict
        No keyword arguments.
    """
    return LayerRunner(module), {}


class ModuleContext:
    """Which of the model's modules is running, in code that runs eagerly.

    The composite's name and type rules thereby reach the operations inside code that runs
    eagerly, as they reach a captured graph's nodes. Module calls are followed by forward hooks
    registered for the time of one run and acting only for the modules in ``names`` on the
    thread that made them; the model itself gets no hook.

    Parameters
    ----------
    names : dict of int to str
        The qualified names of the followed modules, by id.
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.stack: list[nn.Module] = []

    @contextmanager
    def followed(self) -> Iterator[None]:
        """Follow the module calls of this thread while active (the running ones are on :attr:`stack`).

        Yields
        ------
        None
        """

        def enter(module: nn.Module, args: Any) -> None:
            if id(module) in self.names:
                self.stack.append(module)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] is module:
                self.stack.pop()

        try:
            with module_calls_followed(enter, leave):
                yield
        finally:
            self.stack.clear()


OperationObserver = Callable[["Interpretation", str, bool], None]
"""``observer(interpretation, name, has_rule)``: see :func:`operations_observed`."""

_OBSERVER: contextvars.ContextVar[OperationObserver | None] = contextvars.ContextVar("fxlrp_observer", default=None)


@contextmanager
def operations_observed(observer: OperationObserver) -> Iterator[None]:
    """Observe every torch call under :class:`RelevanceMode` whose arguments and result carry relevance.

    Code run eagerly has no graph to count, so this is how its coverage is counted
    (benchmarks/timm_sweep.py). While active (in this thread or task), parts run eagerly run
    under the relevance mode at every call, not from their recordings
    (:mod:`fxlrp.eager.replay`): a replayed graph makes no calls to observe.

    Parameters
    ----------
    observer : OperationObserver
        Called as ``observer(interpretation, name, has_rule)``: the interpretation (``.site``
        says which node runs), the operation's name and whether the registry has it (``False``:
        its gradient is used, or strict names it).

    Yields
    ------
    None
    """
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def current_observer() -> OperationObserver | None:
    """The observer of :func:`operations_observed` active here, if any.

    Returns
    -------
    OperationObserver or None
        The observer; None outside :func:`operations_observed`.
    """
    return _OBSERVER.get()


class Interpretation:
    """Rules and bookkeeping for one run of library code under :class:`RelevanceMode`.

    Parameters
    ----------
    call : RelevanceCall
        The call of the part run eagerly (or of the library function): its rule, site and
        composite, and the calls kept for the operations inside.
    context : ModuleContext, optional
        Which of the model's modules is running, where the composite chooses by module.
    observer : OperationObserver, optional
        See :func:`operations_observed`.
    """

    def __init__(self, call: RelevanceCall, context: ModuleContext | None = None,
                 observer: OperationObserver | None = None) -> None:
        self.call = call
        self.context = context
        self.observer = observer
        self.unsupported_calls: dict[tuple[str, str], None] = {}
        self.guards: list[tuple[Any, str, str]] = []
        """The guards of operations without a rule (with ``strict``): autograd node, name, line."""
        # A library call outside a conversion has no site: its own rule goes to layers.
        self.composite = call.composite or Composite(call.rule if isinstance(call.rule, Rule) else None)
        self.site = call.site or Site("library call", "", False, None, None, False)
        self.active = True
        # Whether this run may hold first layers: then every call the composite counts as a first
        # layer that the run's inputs meet is one, as in the captured graph (Rewriter._first_layer_calls):
        # found by following the autograd graph of its arguments back to the inputs (entry) without
        # passing the output of another such call (layer_outputs).
        self.holds_first_layer = self.site.is_first_layer and self.composite.may_choose_first_layer()
        self.entry_nodes: set[int] = set()
        self.entry_leaves: set[int] = set()
        self.layer_outputs: dict[int, Any] = {}
        self.ran: dict[tuple[str, str, str, int], list[Any]] | None = None
        """With a part's runner: per (module, operation, handling, rule id), ``[calls, source,
        rule]`` of this run (see :meth:`note`)."""
        self.rules_by_module = False
        """Whether the module a call belongs to can change its rule (else :attr:`context` only
        names modules for the report)."""
        self.runs_module = False
        """Whether this runs a module's own code (a part run eagerly), not a decomposition of
        fxlrp's (fused attention's, in backward)."""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Let torch calls run natively while active (inside a relevance function fxlrp runs).

        Yields
        ------
        None
        """
        active, self.active = self.active, False
        try:
            yield
        finally:
            self.active = active

    def rule_for(self, operation: Operation, module: nn.Module | None, first: bool, relevance_factors: int) -> Any:
        """The composite's rule for ``operation`` run by ``module``.

        Parameters
        ----------
        operation : Operation
            The registered operation.
        module : nn.Module or None
            The innermost running module, or None.
        first : bool
            Whether the call is a first layer.
        relevance_factors : int
            How many of its factors carry relevance.

        Returns
        -------
        Rule or None
            What :meth:`fxlrp.rules.composites.Composite.resolve` gives; None for operations
            that are not affine.
        """
        if operation.kind is not Kind.AFFINE:
            return None
        site, composite = self.site, self.composite
        if module is None:
            module_name, module_type, is_module_call = site.module_name, site.module_type, False
        else:
            # the operation a registered module (nn.Conv2d, nn.AvgPool2d) performs is that module's call
            module_name, module_type = self.context.names[id(module)], type(module)
            is_module_call = REGISTRY.for_module(module) is operation
        inner = dataclasses.replace(site, node_name=f"{site.node_name}.{operation.name}", operation=operation.name,
                                    weighted=operation.weighted, module_name=module_name, module_type=module_type,
                                    is_first_layer=first, is_module_call=is_module_call,
                                    relevance_factors=relevance_factors)
        return composite.resolve(inner, operation)

    def call_for(self, operation: Operation, args: tuple, kwargs: dict[str, Any]) -> RelevanceCall:
        """The :class:`RelevanceCall` of this call of ``operation``.

        There is one per module, operation, first-layer flag and, for a product, whether several
        of its factors carry relevance; it is kept by the enclosing call across runs, so that the
        rule is chosen once (not at every call of a torch function) and parameter transforms
        (z+'s ``w+``) are made once.

        Parameters
        ----------
        operation : Operation
            The registered operation.
        args : tuple
            The call's positional arguments.
        kwargs : dict
            The call's keyword arguments.

        Returns
        -------
        RelevanceCall
            The call's rule and settings.
        """
        first = self.holds_first_layer and self.composite.may_hold_first_layer(operation) and self._meets_input(args)
        context = self.context  # the innermost running module, read inline: this runs for every torch call
        module = context.stack[-1] if self.rules_by_module and context.stack else None
        factors = operation.factors
        relevance_factors = 0
        if factors is not None:  # a product: several relevance-carrying factors take a Product rule
            for value in factors(args, kwargs):
                if isinstance(value, Tensor) and value.requires_grad:
                    relevance_factors += 1
        key = (id(module), operation.name, first, relevance_factors > 1)
        entry = self.call.inner_calls.get(key)
        if entry is None or entry[0] is not module:
            rule = self.rule_for(operation, module, first, relevance_factors)
            site = self.call.site
            if site is not None and site.is_first_layer != first:
                # An operation that chooses rules for parts of its own (fused attention's q k^T, a
                # message-passing layer run inside) asks its call whether it holds the first layer:
                # this call's answer, not that of the part run eagerly as a whole.
                site = dataclasses.replace(site, is_first_layer=first)
            call = RelevanceCall(rule, self.call.warn_lost_relevance, site=site,
                                 composite=self.call.composite, strict=self.call.strict)
            entry = self.call.inner_calls[key] = (module, call)
        return entry[1]

    def run(self, operation: Operation, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``operation``'s relevance function on this call, or the native call without one.

        Parameters
        ----------
        operation : Operation
            The registered operation.
        function : callable
            The called function.
        args : tuple
            The call's positional arguments.
        kwargs : dict
            The call's keyword arguments.

        Returns
        -------
        Any
            The call's output.
        """
        if operation.relevance is None:
            if self.ran is not None:
                self.note(operation.name, "native", None)
            return function(*args, **kwargs)
        call = self.call_for(operation, args, kwargs)
        if self.ran is not None:
            self.note(operation.name, handling_of(operation.kind), call.rule)
        result = operation.explained(call, function, *args, **kwargs)
        if self.holds_first_layer and isinstance(result, Tensor) and result.grad_fn is not None \
                and self.composite.may_hold_first_layer(operation):
            self.layer_outputs[id(result.grad_fn)] = result.grad_fn  # (kept: ids stay unique)
        return result

    def note(self, operation: str, handling: str, rule: Any) -> None:
        """Count a call for the report of the part run eagerly.

        Calls are counted by the innermost running module, the operation, its handling and rule;
        the source line is read at the first such call of the run only (it walks the stack).

        Parameters
        ----------
        operation : str
            The operation's name.
        handling : str
            As in the report's rows (``rule``, ``identity``, ``native``, ``gradient``).
        rule : Any
            The call's rule, or None.
        """
        context = self.context
        module = context.names[id(context.stack[-1])] if context is not None and context.stack \
            else self.site.module_name
        key = (module, operation, handling, id(rule))
        seen = self.ran.get(key)
        if seen is None:
            self.ran[key] = [1, calling_line(), rule]
        else:
            seen[0] += 1

    def noted(self) -> dict[tuple[str, str, str, str], OperationRun]:
        """This run's counts.

        Returns
        -------
        dict of tuple to OperationRun
            The counts, keyed by module, operation, handling and the rule's ``repr``.
        """
        rows: dict[tuple[str, str, str, str], OperationRun] = {}
        for (module, operation, handling, _), (calls, source, rule) in (self.ran or {}).items():
            key = (module, operation, handling, "" if rule is None else repr(rule))
            if key in rows:
                rows[key].calls += calls
            else:
                rows[key] = OperationRun(source, calls)
        return rows

    def enter(self, args: tuple, kwargs: dict) -> None:
        """Record where relevance starts in the run, for the first layers that meet it.

        Relevance starts at the run's relevance-carrying inputs and at the outputs of source
        operations (an embedding lookup).

        Parameters
        ----------
        args : tuple
            Positional inputs (or a source's output).
        kwargs : dict
            Keyword inputs.
        """
        if not self.holds_first_layer:
            return
        pending = [*args, *kwargs.values()]
        while pending:
            value = pending.pop()
            if isinstance(value, (tuple, list)):
                pending.extend(value)
            elif isinstance(value, dict):
                pending.extend(value.values())
            elif carries_relevance(value):
                if value.grad_fn is None:
                    self.entry_leaves.add(id(value))
                else:
                    self.entry_nodes.add(id(value.grad_fn))

    def _meets_input(self, args: tuple) -> bool:
        """Whether the call, with relevance-carrying arguments ``args``, is a first layer
        (:func:`~fxlrp.rules.first_layer.meets_inputs`), walking back through autograd's record of
        the run: the run's inputs, and nodes whose inputs carry no relevance (an embedding
        lookup's), are where relevance starts."""
        starts: list[Any] = []
        for value in args:
            values = value if isinstance(value, (tuple, list)) else (value,)
            starts.extend(item.grad_fn if item.grad_fn is not None else item
                          for item in values if carries_relevance(item))
        return meets_inputs(starts, self._autograd_predecessors)

    def _autograd_predecessors(self, item: Any) -> list[Any] | None:
        if isinstance(item, Tensor):  # a leaf: an input of the run, or a value from outside it
            return [] if id(item) in self.entry_leaves else None
        if id(item) in self.layer_outputs:
            return None
        if id(item) in self.entry_nodes:
            return []
        leaf = getattr(item, "variable", None)  # (autograd's node of a leaf)
        if leaf is not None:
            return [] if id(leaf) in self.entry_leaves else None
        return [node for node, _ in item.next_functions if node is not None]

    def unsupported(self, name: str, result: Any) -> Any:
        """Handle an operation without a rule on a relevance-carrying tensor.

        With ``strict`` its output is put behind a guard
        (:func:`~fxlrp.graph.relevance_flow.unreached`): an error naming it and its line if the
        relevance of an explanation arrives there in backward. :meth:`raise_unsupported` names at
        the end of the run every such call that all of the run's relevance-carrying outputs
        depend on (whatever is explained, relevance reaches it), as conversion does for a graph;
        the others (box decoding when a class score is explained) are listed in the report as
        ``unreached``. An in-place call (a name ending in ``_``), whose output is its argument,
        is named at the end of the run. Without ``strict`` its gradient is used, with a warning.

        Parameters
        ----------
        name : str
            The operation's name, as the user writes it.
        result : Any
            The operation's native output.

        Returns
        -------
        Any
            ``result``, behind the guard with ``strict``.

        Raises
        ------
        GradientFormUnavailable
            In the gradient form, which such an operation has none of.
        """
        require_relevance_form(name)  # "follows the gradient" means relevance, not R / x
        where = calling_line()
        if not self.call.strict:
            if self.ran is not None:
                self.note(name, "gradient", None)
            warnings.warn(f"fxlrp: relevance follows the gradient through {name} (no LRP rule) at {where}",
                          stacklevel=2)
            return result
        if self.ran is not None:
            self.note(name, "unreached", None)
        if name.endswith("_"):
            self.unsupported_calls[(name, where)] = None
            return result
        with self.paused():  # (the guard is fxlrp's Function, not the code's)
            guarded = unreached(result, unreached_message(f"{name} (run eagerly)", where))
        self.guards.extend((item.grad_fn, name, where) for item in _pytree.tree_leaves(guarded)
                           if isinstance(item, Tensor) and item.grad_fn is not None
                           and type(item.grad_fn).__name__ == "_UnreachedBackward")
        return guarded

    def raise_unsupported(self, result: Any = None) -> None:
        """Name every operation without a rule met in the run (with ``strict``) that relevance
        reaches whatever is explained: every relevance-carrying tensor of ``result`` depends on
        it (see :meth:`unsupported`).

        Parameters
        ----------
        result : Any, optional
            What the run returns.

        Raises
        ------
        UnsupportedOperationError
            If the run met any.
        """
        if self.guards:
            leaves = _pytree.tree_leaves(result)
            outputs = [item for item in leaves if _carries(item)]
            reached = [_autograd_ancestors(item.grad_fn) for item in outputs if item.grad_fn is not None]
            # (a container pytree does not know may hold outputs: then each guard counts as reached)
            opaque = any(not isinstance(item, (Tensor, int, float, bool, str, type(None))) for item in leaves)
            for node, name, where in self.guards:
                if opaque or reached and all(id(node) in ancestors for ancestors in reached):
                    self.unsupported_calls[(name, where)] = None
            self.guards.clear()
        if not self.unsupported_calls:
            return
        inside = self.call.site.module_name if self.call.site and self.call.site.module_name else "the model"
        listing = "\n".join(f"  - {name}  at {where}" for name, where in self.unsupported_calls)
        raise UnsupportedOperationError(
            f"fxlrp has no LRP rule for {len(self.unsupported_calls)} operation(s) on relevance-carrying "
            f"tensors inside {inside} (run eagerly):\n{listing}\n"
            "Register a rule for them (see docs/extending.md), or pass strict=False to let relevance "
            "follow their gradient."
        )


def _autograd_ancestors(node: Any) -> set[int]:
    """The ids of ``node`` and every autograd node before it."""
    seen: set[int] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        pending.extend(next_node for next_node, _ in current.next_functions)
    return seen


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
        return Dispatch(operation, source=operation.source)
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
        if not _arguments_carry(args, kwargs):
            if dispatch.source:  # an embedding lookup: relevance starts here
                result = interpretation.run(dispatch.operation, function, args, kwargs)
                interpretation.enter((result,), {})
                return result
            return function(*args, **kwargs)
        if dispatch.write:
            return _write(function, args, kwargs, self.views)
        operation, in_place = dispatch.operation, dispatch.in_place
        runnable = function if in_place is None else dispatch.twin
        observer = interpretation.observer
        if operation is None:
            result = function(*args, **kwargs)
            if _carries(result):
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
            if operation.moves_values and isinstance(result, Tensor) and result._is_view():
                self.views.note(result)
        else:
            result = self._in_place(operation, runnable, in_place, args, kwargs)
        if observer is not None and _carries(result):
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
            _swap(target, result)
            return target
        if carries:
            return replace_values(target, result, self.views)
        if name in AUGMENTED_ASSIGNMENTS:
            return result  # ``a += b`` rebinds ``a`` to the result
        # The buffer (perhaps a module's) keeps its memory and takes the values, and relevance
        # reaches the result through the copy's identity backward.
        return target.copy_(result)


def _write(function: Any, args: tuple, kwargs: dict, views: Views) -> Any:
    """``target[index] = value``, ``target.copy_(source)``, ...: natively when ``target`` carries no
    relevance (a buffer being filled), else on a copy of ``target`` that then replaces it."""
    target = args[0]
    if not carries_relevance(target):
        return function(*args, **kwargs)
    written = target.clone()
    result = function(written, *args[1:], **kwargs)
    replace_values(target, written, views)
    return None if result is None else target


class Views:
    """The views of relevance-carrying tensors taken in one run, by their base.

    After a write has replaced a base (:func:`replace_values`) each view taken before it is
    taken again of the written base, as it would see the write in memory.
    """

    def __init__(self) -> None:
        self.of_base: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}

    def note(self, view: Tensor) -> None:
        """Note a view (held weakly).

        Parameters
        ----------
        view : Tensor
            A view of a relevance-carrying tensor.
        """
        base = view._base
        entry = self.of_base.get(id(base))
        if entry is None or entry[0]() is not base:
            entry = self.of_base[id(base)] = (weakref.ref(base), [])
        entry[1].append(weakref.ref(view))

    def taken_of(self, base: Tensor) -> list[Tensor]:
        """The views of ``base`` still alive.

        Parameters
        ----------
        base : Tensor
            A base tensor.

        Returns
        -------
        list of Tensor
            Its noted views that are alive.
        """
        entry = self.of_base.get(id(base))
        if entry is None or entry[0]() is not base:
            return []
        return [view for view in (reference() for reference in entry[1]) if view is not None]

    def take_again(self, views: list[Tensor], base: Tensor, old: Tensor) -> None:
        """Make ``views`` of ``old`` views of ``base``, which replaced it.

        Parameters
        ----------
        views : list of Tensor
            The views, changed in place.
        base : Tensor
            The written base.
        old : Tensor
            The tensor the views were taken of.
        """
        for view in views:
            _swap(view, view_of_written(base, view, old))


def replace_values(target: Tensor, new: Tensor, views: Views | None = None) -> Tensor:
    """Make ``target`` hold ``new``'s values and relevance, as an in-place write into ``target`` would.

    Nothing is written into memory that a relevance function keeps for its backward (its input,
    or its output as the epsilon rule's denominator; writing there would change the relevance or
    fail). The Python object ``target`` is given ``new``'s tensor (the mechanism of
    ``torch.utils.swap_tensors``, without its check that nothing else holds ``target``'s tensor:
    what holds it is exactly the relevance functions, which keep the old values); code holding
    ``target`` sees the new values, as after an in-place write. A write into a view reaches its
    base the same way: the base is replaced by a copy with the view's region written.

    Parameters
    ----------
    target : Tensor
        The tensor written into.
    new : Tensor
        The values it takes, of its shape (cast to its dtype).
    views : Views, optional
        The run's views; those of the base taken before are taken again of the copy.

    Returns
    -------
    Tensor
        ``target``, now standing for the new values.

    Raises
    ------
    RuntimeError
        If ``new`` has another shape than ``target``.
    """
    if new.shape != target.shape:
        raise RuntimeError(f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                           f"{list(new.shape)}")
    new = new.to(target.dtype)
    base = target._base if target._is_view() else target
    taken = [] if views is None else [view for view in views.taken_of(base) if view is not target]
    if base is target and not taken:
        _swap(target, new)
        return target
    written = written_through_view(base, target, new)  # (laid out as ``base``: its views are taken again)
    _swap(base, written)  # (``written`` now stands for the old base)
    if views is not None:
        views.take_again(taken, base, written)
    if base is not target:
        _swap(target, view_of_written(base, target, written))
    return target


def _swap(tensor: Tensor, other: Tensor) -> None:
    """Exchange the tensors two Python objects stand for, with their attributes (roles)."""
    tensor.__dict__, other.__dict__ = other.__dict__, tensor.__dict__
    torch._C._swap_tensor_impl(tensor, other)


def _leaf_function_handler(interpretation: Interpretation):
    def handle(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
        if not interpretation.active or not _arguments_carry(args, kwargs):
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
                and _arguments_carry(args, kwargs)):
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
    if _carries(output):
        return output
    return interpretation.unsupported(f"{function.__name__}.apply (a custom autograd Function)", own(*args, **kwargs))


def intercepted_functions() -> tuple[Callable[..., Any], ...]:
    """Library functions explained as a whole when library code calls them.

    Returns
    -------
    tuple of callable
        The registry's leaf functions and graph softmax's functions.
    """
    return (*REGISTRY.leaf_functions(), *REGISTRY.operations["graph_softmax"].functions)


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
    if not torch.is_grad_enabled() or not _arguments_carry(args, kwargs):
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
        context = interpretation.context = ModuleContext(function.module_names(prefix))
        interpretation.rules_by_module = interpretation.composite.chooses_by_module()
        interpretation.ran = {}
    else:
        context = None
    with contextlib.ExitStack() as stack:
        if context is not None:
            stack.enter_context(context.followed())
        stack.enter_context(intercepted_calls(intercepted_functions(), _leaf_function_handler(interpretation)))
        stack.enter_context(checkpoints_run_their_function())
        mode = RelevanceMode(interpretation)
        stack.enter_context(intercepted_applications(_custom_function_handler(interpretation, mode)))
        stack.enter_context(mode)
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
