"""Assign a rule to every node and substitute relevance Functions into the graph."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import torch
from torch import fx, nn

from fxlrp.capture import INSIDE_FUNCTION
from fxlrp.capture.source import function_name, source_line
from fxlrp.errors import UnsupportedOperationError
from fxlrp.graph.canonicalise import may_write
from fxlrp.graph.graph_module import ExplainedGraphModule
from fxlrp.graph.nodes import (
    NativeModuleNode,
    PlainCallNode,
    RelevanceNode,
    detached_state,
    method,
    out_of_place,
    rewritten_module_name,
)
from fxlrp.graph.relevance_flow import (
    find_operation,
    nodes_known_non_negative,
    nodes_relevance_returns_to,
    nodes_that_may_carry_relevance,
    nodes_that_may_hold_roles,
    outputs_reached,
    relevance_factors,
    unreached,
    unreached_message,
    value_arguments,
)
from fxlrp.graph.report import NodeReport, handling_of
from fxlrp.registry import REGISTRY, Kind, Operation, called
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules.composites import INPUT_OFFSETS, Composite, Site
from fxlrp.rules.first_layer import meets_inputs


def describe_target(node: fx.Node) -> str:
    """What a node calls, as the report shows it.

    Parameters
    ----------
    node : fx.Node
        The node.

    Returns
    -------
    str
        ``.name()`` for a method, the function's name, or the node's target.
    """
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        return function_name(node.target)
    return str(node.target) or "(the whole model)"


def is_container_method(node: fx.Node) -> bool:
    """Whether a node calls a method that no tensor has.

    Such a method belongs to a container input (``graphs.evolve(...)``) and moves tensors
    around without computing on them.

    Parameters
    ----------
    node : fx.Node
        The node.

    Returns
    -------
    bool
        True for a call_method node whose method ``torch.Tensor`` lacks.
    """
    return node.op == "call_method" and not hasattr(torch.Tensor, node.target)


def is_container_construction(node: fx.Node) -> bool:
    """Whether a node builds a dict of the model's own type from its items.

    See :func:`fxlrp.capture.keeps_its_type`: such a dict holds tensors and computes nothing.

    Parameters
    ----------
    node : fx.Node
        The node.

    Returns
    -------
    bool
        True for a call of a ``dict`` subclass.
    """
    return node.op == "call_function" and isinstance(node.target, type) and issubclass(node.target, dict)


def enclosing_module(node: fx.Node, modules: dict[str, nn.Module]) -> tuple[str | None, type | None]:
    """The module a node belongs to: the one it calls, or the innermost one whose code made it.

    Parameters
    ----------
    node : fx.Node
        The node.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    name : str or None
        The module's qualified name; None where the node belongs to no module.
    type : type or None
        The module's type; None where it is unknown.
    """
    if node.op == "call_module":
        return node.target, type(modules[node.target])
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None, None
    qualified_name, module_type = list(stack.values())[-1]
    return qualified_name, module_type if isinstance(module_type, type) else None


@dataclasses.dataclass(frozen=True)
class RewriteOptions:
    """How a graph is rewritten.

    Parameters
    ----------
    strict : bool, default True
        Whether an operation without a rule on a relevance-carrying tensor is an error (else it
        follows its gradient, with a warning).
    warn_lost_relevance : bool, default False
        Whether rules warn when relevance reaches an output of 0 and is dropped.
    input_relevance : dict of str to bool, optional
        For a recorded run (:mod:`fxlrp.eager.replay`), which inputs carry relevance; relevance
        then also starts at every embedding lookup, as in code run eagerly.
    first_layer : bool, default True
        Whether the graph's inputs are where the composite's first layer may be.
    named_nodes : bool, default True
        Whether every node of an operation with a relevance function stays a module named after
        the node, which hooks can reach (relevant walks record node states by name); else a node
        whose relevance function is a plain call and whose output can hold no role is that call
        (a recorded run's graph, whose nodes are nobody's rows: hundreds of nodes per Llama call,
        each a Python call less): see :meth:`Rewriter._plain_call`.
    gradient_form : bool, default False
        Whether the graph runs in the gradient form alone (a run recorded in it, whose signature
        holds the form).
    """

    strict: bool = True
    warn_lost_relevance: bool = False
    input_relevance: dict[str, bool] | None = None
    first_layer: bool = True
    named_nodes: bool = True
    gradient_form: bool = False


class Rewriter:
    """Builds the explainer's GraphModule from the captured graph.

    The new root owns everything the graph refers to: detached copies of the model's parameters
    and buffers (sharing storage) and one module per rewritten node. The user's model is only
    read.
    """

    def __init__(self, model: nn.Module, graph: fx.Graph, composite: Composite, options: RewriteOptions, *,
                 in_place_modules: set[str], modules: dict[str, nn.Module] | None = None,
                 constants: dict[str, Any] | None = None, eager_modules: dict[str, str] | None = None) -> None:
        """Prepare the rewrite of ``graph`` with what it refers to.

        Parameters
        ----------
        model : nn.Module
            The user's model, only read.
        graph : fx.Graph
            The graph captured from ``model``, in canonical form.
        composite : Composite
            Chooses each node's rule.
        options : RewriteOptions
            How the graph is rewritten.
        in_place_modules : set of str
            The names of call_module nodes whose module writes its input in place.
        modules : dict of str to nn.Module, optional
            The modules the graph's ``call_module`` nodes name: the model's own unless a pipeline
            stage (BatchNorm folding) substituted some by modules owned by the explainer.
        constants : dict, optional
            The constants the capture kept, by attribute name.
        eager_modules : dict of str to str, optional
            The modules run eagerly, with the reason.
        """
        self.model = model
        self.options = options
        self.holding: set[fx.Node] = set()
        self.constants = constants or {}
        self.eager_modules = eager_modules or {}
        self.graph = graph
        self.composite = composite
        self.in_place_modules = in_place_modules
        self.modules = dict(model.named_modules()) if modules is None else dict(modules)
        self.root = nn.Module()
        self.reports: list[NodeReport] = []

    def run(self) -> fx.GraphModule:
        """Rewrite every node and build the explainer's GraphModule.

        Returns
        -------
        fx.GraphModule
            An :class:`~fxlrp.graph.graph_module.ExplainedGraphModule`; the node reports are in
            :attr:`reports`.

        Raises
        ------
        UnsupportedOperationError
            With ``strict``, if relevance reaches operations without a rule.
        """
        unsupported: list[fx.Node] = []
        carrying = nodes_that_may_carry_relevance(self.graph, self.modules, self.options.input_relevance)
        # (the rest compute constants of the explanation: relevance never reaches them, or never
        # comes back from what they compute)
        returning = nodes_relevance_returns_to(self.graph, self.modules, carrying)
        reached = outputs_reached(self.graph, self.modules, carrying)
        outputs = set().union(*reached.values()) if reached else set()
        first_layers, input_offsets = self._first_layer_calls(carrying)
        nodes = list(self.graph.nodes)
        # Read before any node is replaced: a product's factors are nodes of the captured graph.
        factors = {node: relevance_factors(node, operation, carrying)
                   for node in nodes if (operation := self._operation_of(node)) is not None}
        non_negative = nodes_known_non_negative(self.graph, self._operation_of, self.modules)
        inputs_non_negative = {node for node in factors if _inputs_known_non_negative(
            node, self._operation_of(node), carrying, non_negative)}
        if not self.options.named_nodes:
            self.holding = nodes_that_may_hold_roles(self.graph, self._operation_of, carrying)
        for node in nodes:
            if node.op in ("placeholder", "output"):
                role = "input" if node.op == "placeholder" else "output"
                self._report(node, role, role)
                continue
            if node.op == "get_attr":
                self._own_attribute(node)
                continue
            operation = self._operation_of(node)
            if operation is None:
                if (node.op == "call_function" and node.target is getattr or is_container_method(node)
                        or is_container_construction(node)):
                    self._report(node, "container", "container")
                    continue
                if node not in returning:
                    # Computed from constants, parameters, shapes or indices only (a GCN's degree
                    # normalisation), or for them only (an RMSNorm's mean square): no relevance
                    # passes through it, so it needs no rule.
                    self._keep_native(node, operation=None, handling="no relevance")
                    continue
                if self.options.strict and node.users and not may_write(node) and set() < reached[node] < outputs:
                    # Relevance comes back to it from some outputs only: whether it does depends on
                    # the output explained, known when an explanation runs.
                    self._guard(node)
                    continue
                unsupported.append(node)
                self._keep_native(node, operation=None)
                continue
            if operation.propagation.relevance is None:
                self._keep_native(node, operation)
            elif node not in returning and self._native_equals_explained(node, operation):
                # A parameter transform (weight standardisation's F.batch_norm on the weights), a
                # norm's statistic: no relevance passes through it, so it runs as the model does.
                self._keep_native(node, operation, handling="no relevance")
            else:
                self._substitute(node, operation, node in first_layers, factors[node], node in inputs_non_negative,
                                 before_first_layer=node in input_offsets)
        if unsupported:
            self._unsupported(unsupported)
        self.graph.lint()
        return ExplainedGraphModule(self.root, self.graph, class_name=f"Explained{type(self.model).__name__}")

    def _operation_of(self, node: fx.Node) -> Operation | None:
        if node.op == "call_module" and node.target in self.eager_modules:
            return REGISTRY.operations["eager"]
        return find_operation(node, self.modules)

    def _first_layer_calls(self, carrying: set[fx.Node]) -> tuple[set[fx.Node], set[fx.Node]]:
        """The calls of layers the composite counts as a first layer that the model's inputs meet
        (:func:`~fxlrp.rules.first_layer.meets_inputs`), and the sums of
        :data:`~fxlrp.rules.composites.INPUT_OFFSETS` they meet before them where the composite
        gives those a rule of their own (:attr:`~fxlrp.rules.composites.Site.before_first_layer`).
        A node that runs a module's own code may hold the first layer inside, found as the code
        runs the same way."""
        if not self.options.first_layer:
            return set(), set()
        layers = {node for node in carrying if node.op != "placeholder"
                  and (operation := self._operation_of(node)) is not None
                  and self.composite.may_hold_first_layer(operation)}

        def predecessors(node: fx.Node) -> list[fx.Node] | None:
            if node in layers:
                return None
            return [source for source in node.all_input_nodes if source in carrying]

        def met(node: fx.Node) -> bool:
            return meets_inputs([source for source in node.all_input_nodes if source in carrying], predecessors)

        offsets: set[fx.Node] = set()
        if self.composite.rules_input_maps():
            offsets = {node for node in carrying if node not in layers and node.op != "placeholder"
                       and (operation := self._operation_of(node)) is not None
                       and operation.name in INPUT_OFFSETS and met(node)}
        return {node for node in layers if met(node)}, offsets

    def _native_equals_explained(self, node: fx.Node, operation: Operation) -> bool:
        """Whether the native call computes the values the operation's relevance function would.

        Rules and the identity rule compute the original operation; the exceptions are
        explanation-time semantics: operations that are the identity then (dropout, Kind.NATIVE
        with a relevance function), modules in training mode, and a call in training form handed
        running statistics, which it would update (BatchNorm is explained with them)."""
        if operation.propagation.kind is Kind.NATIVE:
            return False
        if node.op == "call_module":
            return not any(module.training for module in self.modules[node.target].modules())
        arguments = _arguments_by_name(node)
        return not (arguments.get("training") is True
                    and any(arguments.get(name) is not None for name in ("running_mean", "running_var")))

    def _own_attribute(self, node: fx.Node) -> None:
        value = self.constants[node.target] if node.target in self.constants else _resolve(self.model, node.target)
        name = "fxlrp_constant_" + node.target.replace(".", "_")
        if isinstance(value, torch.Tensor):
            if not hasattr(self.root, name):
                self.root.register_buffer(name, value.detach(), persistent=False)
        else:
            setattr(self.root, name, value)
        node.target = name
        self._report(node, "constant", "constant")

    def _keep_native(self, node: fx.Node, operation: Operation | None, handling: str | None = None) -> None:
        if node.op == "call_module":
            self._install(node, NativeModuleNode(self.modules[node.target]))
        handling = handling or ("native" if operation is not None else "gradient")
        self._report(node, operation.name if operation else "?", handling)

    def _substitute(self, node: fx.Node, operation: Operation, is_first_layer: bool, factors: int,
                    inputs_non_negative: bool, *, before_first_layer: bool = False) -> None:
        """Install the node's relevance function with the rule the composite resolves for it;
        ``factors``: how many factors of a product may carry relevance; ``inputs_non_negative``:
        whether those that may carry relevance are known never to be negative."""
        module_name, module_type = enclosing_module(node, self.modules)
        site = Site(node.name, operation.name, operation.propagation.weighted, module_name, module_type,
                    is_first_layer, is_module_call=node.op == "call_module", relevance_factors=factors,
                    before_first_layer=before_first_layer)
        rule = self.composite.resolve(site, operation)
        call = RelevanceCall(rule, self.options.warn_lost_relevance, site=site, composite=self.composite,
                             strict=self.options.strict, sole_consumer=self._sole_consumer_of_rule_output(node),
                             inputs_non_negative=inputs_non_negative)
        if node.op == "call_module":
            module = out_of_place(self.modules[node.target])
            to_function = operation.spelling.module_function or (lambda module, state: (module, {}))
            function, keywords = to_function(module, detached_state(module))
        elif node.op == "call_method":
            function, keywords = method(node.target), {}
        else:
            function, keywords = node.target, {}
        plain = self._plain_call(node, operation, rule, factors)
        if plain is None:
            self._install(node, RelevanceNode(operation, call, function, keywords))
        elif node.op == "call_module" or plain is not called:
            self._install(node, PlainCallNode(plain, function, keywords))
        if operation.name == "eager":
            self._report(node, operation.name, "eager", "chosen per operation as it runs")
            return
        handling = handling_of(operation.propagation.kind)
        self._report(node, operation.name, handling, rule)

    def _plain_call(self, node: fx.Node, operation: Operation, rule: Any, factors: int) -> Any:
        """The call ``(function, *args, **kwargs)`` that is all the node's relevance function under
        ``rule`` does in this graph, or None: with ``named_nodes=False``, for a node whose output
        can hold no role (:func:`~fxlrp.graph.relevance_flow.nodes_that_may_hold_roles`; products read
        their factors' roles), the native call of an operation that moves values (a view, a
        cast: most nodes of a transformer's replayed graph), and in the gradient form
        the call its entry names (:class:`~fxlrp.registry.NativeInGradientForm`: layers, sums,
        products with one relevance-carrying factor under LRP-0)."""
        if self.options.named_nodes or node in self.holding:
            return None
        if operation.flow.moves_values:
            return called
        plain = operation.propagation.gradient_native
        if (self.options.gradient_form and plain is not None and factors < 2
                and plain.holds(rule, self.options.warn_lost_relevance)):
            return plain.call
        return None

    def _sole_consumer_of_rule_output(self, node: fx.Node) -> bool:
        """Whether ``node``'s first argument is the output of a rewritten rule node that no other
        node reads. The producer must be the rule node itself: a tensor reached through a
        container (``graphs.node_features``) may have other readers the graph does not show."""
        producer = node.args[0] if node.args else None
        if not isinstance(producer, fx.Node) or len(producer.users) != 1 or producer.op != "call_module":
            return False
        module = getattr(self.root, producer.target, None)
        if not isinstance(module, RelevanceNode) or module.operation.propagation.kind is not Kind.AFFINE:
            return False
        # Rectified in place, the output must be one its own backward does not read.
        propagation = module.operation.propagation
        return propagation.weighted or propagation.output_free_backward


    def _install(self, node: fx.Node, module: nn.Module) -> None:
        name = rewritten_module_name(node.name)
        self.root.add_module(name, module)
        with self.graph.inserting_before(node):
            replacement = self.graph.call_module(name, node.args, node.kwargs)
        replacement.meta = node.meta
        node.replace_all_uses_with(replacement)
        self.graph.erase_node(node)

    def _describe_call(self, node: fx.Node) -> str:
        """What a user recognises: a module's path and its type (``up (torch.nn.Upsample)``)."""
        if node.op != "call_module":
            return describe_target(node)
        module_type = type(self.modules[node.target])
        home = "torch.nn" if module_type.__module__.startswith("torch.nn.modules.") else module_type.__module__
        return f"{node.target} ({home}.{module_type.__qualname__})"

    def _report(self, node: fx.Node, operation: str, handling: str, rule: Any = None) -> None:
        self.reports.append(NodeReport(
            node.name, describe_target(node), operation, handling,
            "" if rule is None else rule if isinstance(rule, str) else repr(rule), source_line(node),
            node.meta.get(INSIDE_FUNCTION, "")))

    def _guard(self, node: fx.Node) -> None:
        """Keep ``node`` (no rule; relevance reaches it for some outputs only) native, its output
        behind :func:`~fxlrp.graph.relevance_flow.unreached`: an error in backward naming it, should
        relevance of an explanation arrive."""
        message = unreached_message(self._describe_call(node), source_line(node))
        with self.graph.inserting_after(node):
            guard = self.graph.call_function(unreached, (node, message))
        guard.meta = dict(node.meta)
        node.replace_all_uses_with(guard, delete_user_cb=lambda user: user is not guard)
        self._keep_native(node, operation=None, handling="unreached")

    def _unsupported(self, nodes: list[fx.Node]) -> None:
        listing = "\n".join(
            f"  - {node.name}: {self._describe_call(node)}" + (f"  at {source_line(node)}" if source_line(node) else "")
            for node in nodes
        )
        if self.options.strict:
            raise UnsupportedOperationError(
                f"fxlrp has no LRP rule for {len(nodes)} operation(s) of {type(self.model).__name__} "
                f"and does not know them to be relevance-neutral:\n{listing}\n"
                "Register a rule for them (see docs/extending.md), or pass strict=False to let "
                "relevance follow their gradient (gradient x input locally, no LRP rule)."
            )
        warnings.warn(
            f"fxlrp: relevance follows the gradient through {len(nodes)} operation(s) with no LRP "
            f"rule (strict=False):\n{listing}",
            stacklevel=3,
        )


def _inputs_known_non_negative(node: fx.Node, operation: Operation, carrying: set[fx.Node],
                               non_negative: set[fx.Node]) -> bool:
    """Whether every argument of ``node`` that may carry relevance is known never to be negative
    (:func:`~fxlrp.graph.relevance_flow.nodes_known_non_negative`), and some may."""
    carried = [source for source in value_arguments(node, operation) if source in carrying]
    return bool(carried) and all(source in non_negative for source in carried)


def _arguments_by_name(node: fx.Node) -> dict[str, Any]:
    """The call's arguments by parameter name, where the target's signature is known."""
    try:
        return dict(inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments)
    except (TypeError, ValueError):  # builtins without a signature, methods (a name)
        return dict(node.kwargs)


def _resolve(model: nn.Module, target: str) -> Any:
    value: Any = model
    for part in target.split("."):
        value = getattr(value, part)
    return value
