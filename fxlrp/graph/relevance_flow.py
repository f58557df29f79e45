"""Which nodes of a captured graph relevance can reach.

An operation without an LRP rule is only a problem if relevance can reach it. Relevance starts at
the model's inputs and flows along the values operations pass on; it does not flow into indices
(``x[index]``, ``scatter_add(dim, index, src)``), shapes, comparisons or freshly created tensors.
A GCN's degree normalisation computed in forward from ``edge_index`` (``pow``, ``rsqrt``) is
therefore outside the flow and needs no rule.

In backward, relevance comes back only along the same paths: a value that enters relevance-free
operations alone (``x.pow(2).mean(-1)`` in an RMSNorm, read by ``rsqrt``, whose output is held
constant) carries relevance forward, but none ever returns to it, so its operations need no rule
either and run as the model runs them.

An operation without a rule that relevance comes back to from some of the model's outputs but not
from all of them (a ``torch.exp`` in one of two heads, when the other head's output is explained) cannot
be judged when the graph is captured: which output is explained is known only when an
explanation runs. It runs as the model runs it, behind :func:`unreached`, whose backward is the
error naming it if relevance of an explanation does arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.utils import _pytree

from fxlrp.errors import UnsupportedOperationError
from fxlrp.graph.canonicalise import may_write
from fxlrp.registry import REGISTRY, Kind, Operation, RoleFrom


def find_operation(node: fx.Node, modules: dict[str, nn.Module]) -> Operation | None:
    """The registered operation a call node performs, if any.

    Parameters
    ----------
    node : fx.Node
        A node of the graph.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    Operation or None
        The registry's entry; None for nodes that call nothing registered, or nothing.
    """
    if node.op == "call_module":
        return REGISTRY.for_module(modules[node.target])
    if node.op == "call_function":
        return REGISTRY.for_function(node.target)
    if node.op == "call_method":
        return REGISTRY.for_method(node.target)
    return None


RELEVANCE_FREE_OPERATIONS = {"constant", "step", "statistic"}
"""Operations whose outputs carry no relevance whatever their inputs (shapes, indices,
comparisons, tensor creation, piecewise-constant maps such as sign and floor, statistics held
constant such as norms and standard deviations)."""
SHAPE_ATTRIBUTES = {"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"}


def nodes_that_may_carry_relevance(graph: fx.Graph, modules: dict[str, nn.Module],
                                   input_relevance: dict[str, bool] | None = None) -> set[fx.Node]:
    """Nodes relevance may reach.

    Those are the nodes that depend on a model input through operations that pass values on.
    Constants, parameters, shapes and what is computed from them alone are out. Inputs count as
    carrying (their dtype is unknown when the graph is captured), so this is an
    over-approximation: an operation outside the set can never see relevance.

    Parameters
    ----------
    graph : fx.Graph
        The graph.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.
    input_relevance : dict of str to bool, optional
        For a graph recorded from a run, which knows its inputs: whether each input (by
        placeholder name) carries relevance. Relevance then also starts at every embedding
        lookup (a source), as in the run.

    Returns
    -------
    set of fx.Node
        The nodes relevance may reach.
    """
    carrying: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if input_relevance is None or input_relevance.get(node.name, True):
                carrying.add(node)
            continue
        if node.op in ("get_attr", "output"):
            continue
        operation = find_operation(node, modules)
        if operation is not None and operation.name in RELEVANCE_FREE_OPERATIONS:
            continue
        reads_shape = node.op == "call_function" and node.target is getattr and len(node.args) > 1
        if reads_shape and node.args[1] in SHAPE_ATTRIBUTES:
            continue
        if any(source in carrying for source in value_arguments(node, operation)) or (
                input_relevance is not None and operation is not None and operation.propagation.source):
            carrying.add(node)
    return carrying


def nodes_relevance_returns_to(graph: fx.Graph, modules: dict[str, nn.Module], carrying: set[fx.Node]) -> set[fx.Node]:
    """The ``carrying`` nodes relevance comes back to in backward.

    Those are the nodes with a path of values to the graph's output through relevance-carrying
    nodes. Calls that may write into their inputs, and values nothing reads, count as returning
    (what they affect is not in the graph's edges).

    Parameters
    ----------
    graph : fx.Graph
        The graph.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.
    carrying : set of fx.Node
        The nodes relevance may reach (:func:`nodes_that_may_carry_relevance`).

    Returns
    -------
    set of fx.Node
        The nodes relevance comes back to.
    """
    returning: set[fx.Node] = set()
    for node in reversed(graph.nodes):  # users come after the values they read
        if node not in carrying:
            continue
        if not node.users or node.op != "placeholder" and may_write(node) or any(
                user.op == "output"
                or user in returning and node in value_arguments(user, find_operation(user, modules))
                for user in node.users):
            returning.add(node)
    return returning


def outputs_reached(graph: fx.Graph, modules: dict[str, nn.Module], carrying: set[fx.Node]) -> dict[fx.Node, set[int]]:
    """Which of the graph's relevance-carrying outputs each node has a path of values to.

    Parameters
    ----------
    graph : fx.Graph
        The graph.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.
    carrying : set of fx.Node
        The nodes relevance may reach (:func:`nodes_that_may_carry_relevance`).

    Returns
    -------
    dict of fx.Node to set of int
        For each node of ``carrying``, the positions (among the distinct relevance-carrying nodes
        the output returns, in order) of the outputs relevance may come back from; see
        :func:`carrying_outputs` for the outputs.
    """
    outputs = carrying_outputs(graph, carrying)
    reached: dict[fx.Node, set[int]] = {node: set() for node in carrying}
    for position, output in enumerate(outputs):
        reached[output].add(position)
    for node in reversed(graph.nodes):  # users come after the values they read
        positions = reached.get(node)
        if not positions or node.op == "placeholder":
            continue
        for source in value_arguments(node, find_operation(node, modules)):
            if source in reached:
                reached[source] |= positions
    return reached


def carrying_outputs(graph: fx.Graph, carrying: set[fx.Node]) -> list[fx.Node]:
    """The distinct relevance-carrying nodes the graph returns, in the order of its output.

    Parameters
    ----------
    graph : fx.Graph
        The graph.
    carrying : set of fx.Node
        The nodes relevance may reach.

    Returns
    -------
    list of fx.Node
        The nodes, each once.
    """
    found: list[fx.Node] = []
    for node in graph.nodes:
        if node.op == "output":
            fx.node.map_arg(node.args, found.append)
    return [node for node in dict.fromkeys(found) if node in carrying]


class _Unreached(torch.autograd.Function):
    """Forward: a copy of ``x``. Backward: the error ``message`` if relevance that is not 0 arrives,
    else the (zero) relevance handed on."""

    @staticmethod
    def forward(ctx: Any, message: str, x: Tensor) -> Tensor:
        ctx.message = message
        return x.clone()  # (a copy: a view made in a Function may not be written in place)

    @staticmethod
    def backward(ctx: Any, relevance: Tensor) -> tuple[None, Tensor]:
        if relevance is not None and bool((relevance != 0).any()):  # (NaN counts as arriving)
            raise UnsupportedOperationError(ctx.message)
        return None, relevance


def unreached(value: Any, message: str) -> Any:
    """``value`` with each relevance-carrying tensor behind a guard that is ``message``'s error in
    backward, should relevance of an explanation arrive there.

    An operation without an LRP rule that relevance reaches for some of the model's outputs but not
    for others runs as the model runs it, its output behind this guard: explaining an output that
    does not depend on it works, explaining one that does is an error naming it, never relevance
    silently following its gradient.

    Parameters
    ----------
    value : Any
        The operation's output: a tensor or a structure of them.
    message : str
        The error, naming the operation and its source line.

    Returns
    -------
    Any
        ``value``, its floating-point tensors that require gradients copied behind the guard.
    """
    def guarded(item: Any) -> Any:
        if isinstance(item, Tensor) and item.requires_grad and item.is_floating_point():
            return _Unreached.apply(message, item)
        return item

    return _pytree.tree_map(guarded, value)


def unreached_message(operation: str, where: str) -> str:
    """The error of an operation without a rule that an explanation's relevance reached.

    Parameters
    ----------
    operation : str
        The operation, as the user writes it.
    where : str
        Its source line (``file:line: code``), or ``""``.

    Returns
    -------
    str
        The message.
    """
    at = f"  at {where}" if where else ""
    return (f"fxlrp has no LRP rule for {operation}{at}, and the relevance of this explanation reaches it "
            "(the relevance of the model's other outputs does not, so it ran as the model runs it).\n"
            "Explain an output that does not depend on it, register a rule for it (see docs/extending.md), or "
            "pass strict=False to let relevance follow its gradient (gradient x input locally, no LRP rule).")


def nodes_that_may_hold_roles(graph: fx.Graph, operation_of: Callable[[fx.Node], Operation | None],
                              carrying: set[fx.Node]) -> set[fx.Node]:
    """Relevance-carrying nodes whose values may have a role (:mod:`fxlrp.relevance.roles`).

    Those are the outputs of operations that give one, of parts that run code of their own and
    the graph's inputs (either may hand on a marked tensor), and what takes its values from such
    a node through operations without a rule of their own (views, copies, writes, containers) or
    that share their arguments' role (``1 - gate``); another rule's output is a fresh tensor.
    Only these roles can matter: products and attention read the roles of their
    relevance-carrying factors alone.

    Parameters
    ----------
    graph : fx.Graph
        The graph.
    operation_of : callable
        The registered operation of a node, or None.
    carrying : set of fx.Node
        The nodes relevance may reach.

    Returns
    -------
    set of fx.Node
        The nodes whose values may have a role.
    """
    holding: set[fx.Node] = set()
    for node in graph.nodes:
        if node not in carrying:
            continue
        operation = operation_of(node) if node.op != "placeholder" else None
        if node.op == "placeholder" or operation is not None and (
                operation.flow.gives_role or operation.propagation.holds_layers):
            holding.add(node)
        elif (operation is None or operation.propagation.kind is Kind.NATIVE
              or operation.flow.role is RoleFrom.SHARED) and any(source in holding for source in node.all_input_nodes):
            holding.add(node)
    return holding


NEUTRAL_ARGUMENTS = (type(None), str, torch.dtype, torch.device, torch.layout, torch.memory_format)
"""Arguments that are no values (a dtype, a device, a mode's name): they cannot make an output negative."""


def nodes_known_non_negative(graph: fx.Graph, operation_of: Callable[[fx.Node], Operation | None],
                             modules: dict[str, nn.Module]) -> set[fx.Node]:
    """Nodes whose values are never negative, known from the graph alone, without reading a value.

    A node is if its registered operation says so of the call
    (:attr:`~fxlrp.registry.ValueFlow.non_negative`) given what is known of its arguments: a
    ReLU's, softmax's or sigmoid's output; a pooling, sum, product, concatenation or view of such
    values. The graph is in canonical form (every value written once), so a value known here is
    the value every later reader sees, unless code the graph does not show may write into it: a
    value read by a call without a registered operation or by a part that runs code of its own
    (a propagation that ``holds_layers``) is not known. The graph's inputs and
    constants are not known either.

    Parameters
    ----------
    graph : fx.Graph
        The graph, in canonical form.
    operation_of : callable
        The registered operation of a node, or None.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    set of fx.Node
        The nodes known never to be negative.
    """
    known_nodes: set[fx.Node] = set()

    def known(value: Any) -> bool:
        if isinstance(value, fx.Node):
            return value in known_nodes
        if isinstance(value, (bool, int, float)):
            return value >= 0
        if isinstance(value, (list, tuple)):
            return all(known(item) for item in value)
        return isinstance(value, NEUTRAL_ARGUMENTS)

    for node in graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        operation = operation_of(node)
        if operation is None or operation.propagation.holds_layers:
            known_nodes.difference_update(node.all_input_nodes)  # (it may write into them)
            continue
        spelling = modules[node.target] if node.op == "call_module" else node.target
        non_negative = operation.flow.non_negative
        if non_negative is not None and non_negative(spelling, node.args, node.kwargs, known):
            known_nodes.add(node)
    return known_nodes


def relevance_factors(node: fx.Node, operation: Operation, carrying: set[fx.Node]) -> int:
    """How many factors of a product node relevance may reach.

    Two or more make the node a product of relevance-carrying tensors, whose rule the composite
    turns into a product rule.

    Parameters
    ----------
    node : fx.Node
        The node.
    operation : Operation
        Its registered operation, whose :attr:`~fxlrp.registry.Operation.factors` names the
        factors.
    carrying : set of fx.Node
        The nodes relevance may reach.

    Returns
    -------
    int
        The number of relevance-carrying factors; 0 for operations that are no products.
    """
    if operation.propagation.factors is None:
        return 0
    factors = operation.propagation.factors(node.args, node.kwargs)
    return sum(isinstance(factor, fx.Node) and factor in carrying for factor in factors)


# Keyword arguments that are indices whatever the operation: an index selects values but
# contributes none of its own.
_INDEX_KEYWORDS = {"index", "indices", "indptr", "repeats", "dim_size", "batch", "ptr", "num_nodes", "size"}


def value_arguments(node: fx.Node, operation: Operation | None = None) -> list[fx.Node]:
    """The input nodes of ``node`` that contribute values (not indices) to its output.

    Parameters
    ----------
    node : fx.Node
        The node.
    operation : Operation, optional
        Its registered operation, whose :attr:`~fxlrp.registry.ValueFlow.index_arguments` name
        the positions of the index arguments.

    Returns
    -------
    list of fx.Node
        The nodes among its arguments that are no indices.
    """
    positions: tuple[int, ...] = ()
    if operation is not None and node.op in ("call_function", "call_method"):
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        positions = operation.flow.index_positions(name)
    arguments = [value for index, value in enumerate(node.args) if index not in positions]
    arguments += [value for key, value in node.kwargs.items() if key not in _INDEX_KEYWORDS]
    found: list[fx.Node] = []
    fx.node.map_arg((arguments,), found.append)
    return found
