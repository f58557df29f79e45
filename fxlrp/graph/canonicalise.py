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

from torch import fx, nn

from fxlrp.capture import GRADIENTS_OFF
from fxlrp.registry import REGISTRY
from fxlrp.registry.spellings import OUT_OF_PLACE_OPERATORS, VIEW_METADATA_METHODS, out_of_place_method
from fxlrp.registry.writes import WRITTEN_COPIES, items_set, view_of_written, written_through_view


def without_inplace_flag(function: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call's arguments with ``inplace=False`` where it asked for ``inplace=True``.

    Parameters
    ----------
    function : callable
        The called function.
    args : tuple
        The call's positional arguments.
    kwargs : dict
        The call's keyword arguments.

    Returns
    -------
    tuple of (tuple, dict) or None
        ``(args, kwargs)`` with ``inplace=False`` where the call passed ``inplace=True``, by
        position or keyword (every other argument stays where it was given: relevance functions
        take their inputs by position); None if it did not ask.
    """
    if not any(value is True for value in (*args, *kwargs.values())):
        return None  # (binding a signature costs; most calls pass no True at all)
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    if bound.arguments.get("inplace") is not True:
        return None
    if "inplace" in kwargs:
        return args, {**kwargs, "inplace": False}
    position = list(bound.signature.parameters).index("inplace")
    return (*args[:position], False, *args[position + 1:]), kwargs


def may_write(node: fx.Node) -> bool:
    """Whether a call writes into its first argument, or may; such a node is kept even if nothing reads it.

    Parameters
    ----------
    node : fx.Node
        The node.

    Returns
    -------
    bool
        True for in-place methods and operators, ``out=``, ``inplace=True`` (``F.relu(x,
        inplace=True)`` returns its input, so nothing reads the node) and module calls (a
        module's code may write).
    """
    if "out" in node.kwargs:
        return True
    if node.op == "call_method":
        name = node.target
    elif node.op == "call_function":
        if node.target is operator.setitem or without_inplace_flag(node.target, node.args, node.kwargs) is not None:
            return True
        name = getattr(node.target, "__name__", "")
    else:
        return node.op == "call_module"
    return name.endswith("_") and not name.endswith("__")


def canonicalise(graph: fx.Graph, modules: dict[str, nn.Module]) -> set[str]:
    """The canonical form of a captured or recorded graph, in place.

    Values read into a block run with gradients off are detached
    (:func:`cut_where_gradients_were_off`); in-place operations are made out of place
    (:func:`canonicalise_in_place`).

    Parameters
    ----------
    graph : fx.Graph
        The graph, changed in place.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    set of str
        The names of call_module nodes whose module runs in place (the rewrite gives them an
        out-of-place copy).
    """
    cut_where_gradients_were_off(graph)
    return canonicalise_in_place(graph, modules)


def cut_where_gradients_were_off(graph: fx.Graph) -> None:
    """Make calls run with gradients off read values from outside their block through ``detach``.

    Neither a torch.fx graph nor a recording keeps the grad mode, and relevance, like the
    gradient, must not pass where the model turned gradients off (as it does not in code run
    eagerly).

    Parameters
    ----------
    graph : fx.Graph
        The graph, changed in place; nodes made with gradients off carry
        :data:`~fxlrp.capture.GRADIENTS_OFF` in their metadata.
    """
    detached: dict[fx.Node, fx.Node] = {}
    for node in list(graph.nodes):
        if not node.meta.get(GRADIENTS_OFF):
            continue

        def through_detach(value: fx.Node, before: fx.Node = node) -> fx.Node:
            if value.meta.get(GRADIENTS_OFF) or value.op == "get_attr":
                return value
            if value not in detached:
                with graph.inserting_before(before):
                    detached[value] = graph.call_method("detach", (value,))
                detached[value].meta[GRADIENTS_OFF] = True
            return detached[value]

        node.args, node.kwargs = fx.map_arg((node.args, node.kwargs), through_detach)


def canonicalise_in_place(graph: fx.Graph, modules: dict[str, nn.Module]) -> set[str]:
    """Rewrite the in-place nodes of ``graph`` out of place.

    Parameters
    ----------
    graph : fx.Graph
        The graph, changed in place.
    modules : dict of str to nn.Module
        The modules its call_module nodes name.

    Returns
    -------
    set of str
        The names of call_module nodes whose module runs in place (the rewrite gives them an
        out-of-place copy).
    """
    order = {node: position for position, node in enumerate(graph.nodes)}
    in_place_modules: set[str] = set()
    for node in list(graph.nodes):
        mutated = None
        if node.op == "call_function" and node.target in OUT_OF_PLACE_OPERATORS:
            node.target = OUT_OF_PLACE_OPERATORS[node.target]
            mutated = node.args[0]
        elif (node.op == "call_method" and node.target in WRITTEN_COPIES
              or node.op == "call_function" and node.target is operator.setitem):
            node.op, node.target = "call_function", WRITTEN_COPIES.get(node.target, items_set)
            mutated = node.args[0]
        elif node.op == "call_method" and out_of_place_method(node.target):
            view_metadata = node.target in VIEW_METADATA_METHODS
            node.target = out_of_place_method(node.target)
            mutated = None if view_metadata else node.args[0]
            if view_metadata:  # ``v.unsqueeze_(0)`` changes ``v`` alone, never what it views
                _redirect_later_users(node.args[0], node, node, order)
        elif node.op == "call_function" and callable(node.target):
            arguments = without_inplace_flag(node.target, node.args, node.kwargs)
            if arguments is not None:
                node.args, node.kwargs = arguments
                mutated = next((value for value in (*node.args, *node.kwargs.values()) if isinstance(value, fx.Node)),
                               None)
        elif node.op == "call_module" and getattr(modules.get(node.target), "inplace", False) is True:
            in_place_modules.add(node.name)
            mutated = node.args[0] if node.args else None
        if isinstance(mutated, fx.Node):
            _redirect_later_users(mutated, node, node, order)
            _write_through_views(graph, mutated, node, order)
    return in_place_modules


def _redirect_later_users(old: fx.Node, new: fx.Node, after: fx.Node, order: dict[fx.Node, float]) -> None:
    """Point the users of ``old`` that come after ``after`` at ``new``."""
    for user in list(old.users):
        if user is not new and order[user] > order[after]:
            user.replace_input_with(old, new)


def _may_alias(node: Any) -> bool:
    """Whether ``node``'s result may share memory with its first argument (a view, or the tensor
    itself), so that an in-place write into the result writes into the argument: what the
    registry says of its spelling (:meth:`fxlrp.registry.ValueFlow.may_alias`)."""
    if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    if node.op == "call_method":
        operation = REGISTRY.for_method(node.target)
    elif node.op == "call_function":
        operation = REGISTRY.for_function(node.target)
    else:
        return False
    return operation is not None and operation.flow.may_alias(node.target)


def _write_through_views(graph: fx.Graph, mutated: fx.Node, node: fx.Node, order: dict[fx.Node, float]) -> None:
    """An in-place write (``node``, now out of place) into ``mutated``, which may be a view of an
    earlier value (``h[:, :2].mul_(2)``, ``x.t().add_(y)``): the earlier value's later users read
    it with the view's elements written (:func:`written_through_view`), and later users of its
    other views read them again from the written value. Whether a node is a view is decided when
    the graph runs (indexing by a tensor copies)."""
    base = mutated
    while _may_alias(base):
        base = base.args[0]
    if base is mutated:
        return
    aliases = []
    pending = [base]
    while pending:
        for user in pending.pop().users:
            if (_may_alias(user) and order[user] < order[node] and user is not mutated
                    and user.args[0] in (base, *aliases) and user not in aliases):
                aliases.append(user)
                pending.append(user)
    # The nodes added here follow ``node`` and take its place in ``order``: the users redirected
    # are the ones after it, and later writes find the added nodes before themselves.
    with graph.inserting_after(node):
        written = graph.call_function(written_through_view, (base, mutated, node))
    order[written] = order[node]
    _redirect_later_users(base, written, node, order)
    anchor = written
    for alias in aliases:
        if any(order[user] > order[node] for user in alias.users):
            with graph.inserting_after(anchor):
                anchor = graph.call_function(view_of_written, (written, alias, base))
            order[anchor] = order[node]
            _redirect_later_users(alias, anchor, node, order)
