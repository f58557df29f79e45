"""The rules of one run of code under the relevance mode (:class:`Interpretation`): which rule
each operation gets, by the composite, the running module (:class:`ModuleContext`) and whether it
is a first layer; the calls kept across runs; operations without a rule (guards, errors). Also
whether a call's arguments carry relevance, asked at every torch call."""

from __future__ import annotations

import contextvars
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree

from fxlrp.capture.interception import (
    module_calls_followed,
)
from fxlrp.capture.source import calling_line
from fxlrp.eager.runner import OperationRun
from fxlrp.errors import UnsupportedOperationError
from fxlrp.graph.relevance_flow import unreached, unreached_message
from fxlrp.graph.report import handling_of
from fxlrp.registry import REGISTRY, Kind, Operation
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import require_relevance_form
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.rules import Rule
from fxlrp.rules.composites import INPUT_OFFSETS, Composite, Site
from fxlrp.rules.first_layer import meets_inputs


def arguments_carry(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a relevance-carrying tensor: :func:`holds_relevance`, with the
    tensors among the positional arguments looked at first (the usual place; this runs for every
    torch call)."""
    for item in args:
        if isinstance(item, Tensor):
            if item.requires_grad and type(item) is not nn.Parameter:
                return True
        elif isinstance(item, (tuple, list, dict)) and holds_relevance(item):
            return True
    return bool(kwargs) and holds_relevance(kwargs)


def holds_relevance(value: Any) -> bool:
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
        # Whether sums the inputs meet before the first layer (the model's own normalisation of its
        # raw input) get a rule of their own, found the same way (Site.before_first_layer).
        self.rules_input_offsets = self.holds_first_layer and self.composite.rules_input_maps()
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

    def rule_for(self, operation: Operation, module: nn.Module | None, first: bool, relevance_factors: int,
                 before_first_layer: bool = False) -> Any:
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
        before_first_layer : bool, default False
            Whether the call is a sum the inputs meet before the first layer
            (:attr:`~fxlrp.rules.composites.Site.before_first_layer`).

        Returns
        -------
        Rule or None
            What :meth:`fxlrp.rules.composites.Composite.resolve` gives; None for operations
            that are not affine.
        """
        if operation.propagation.kind is not Kind.AFFINE:
            return None
        site, composite = self.site, self.composite
        if module is None:
            module_name, module_type, is_module_call = site.module_name, site.module_type, False
        else:
            # the operation a registered module (nn.Conv2d, nn.AvgPool2d) performs is that module's call
            module_name, module_type = self.context.names[id(module)], type(module)
            is_module_call = REGISTRY.for_module(module) is operation
        inner = dataclasses.replace(site, node_name=f"{site.node_name}.{operation.name}", operation=operation.name,
                                    weighted=operation.propagation.weighted, module_name=module_name,
                                    module_type=module_type,
                                    is_first_layer=first, is_module_call=is_module_call,
                                    relevance_factors=relevance_factors, before_first_layer=before_first_layer)
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
        factors = operation.propagation.factors
        relevance_factors = 0
        if factors is not None:  # a product: several relevance-carrying factors take a Product rule
            for value in factors(args, kwargs):
                if isinstance(value, Tensor) and value.requires_grad:
                    relevance_factors += 1
        before = (self.rules_input_offsets and operation.name in INPUT_OFFSETS and not first
                  and self._meets_input(args))
        key = (id(module), operation.name, first, relevance_factors > 1, before)
        entry = self.call.inner_calls.get(key)
        if entry is None or entry[0] is not module:
            rule = self.rule_for(operation, module, first, relevance_factors, before)
            site = self.call.site
            if site is not None and site.is_first_layer != first:
                # An operation that chooses rules for parts of its own (fused attention's q k^T, a
                # message-passing layer run inside) asks its call whether it holds the first layer:
                # this call's answer, not that of the part run eagerly as a whole.
                site = dataclasses.replace(site, is_first_layer=first)
            if site is not None and before:
                # (the sum's own relevance function reads it: its constants are then its bias)
                site = dataclasses.replace(site, before_first_layer=True)
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
        if operation.propagation.relevance is None:
            if self.ran is not None:
                self.note(operation.name, "native", None)
            return function(*args, **kwargs)
        call = self.call_for(operation, args, kwargs)
        if self.ran is not None:
            self.note(operation.name, handling_of(operation.propagation.kind), call.rule)
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
            outputs = [item for item in leaves if holds_relevance(item)]
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
