"""Which layer absorbed the relevance that vanished on its way to the inputs.

Asked only once :func:`~fxlrp.explain.finite_checks.warn_of_vanished_relevance` warns (an
explanation without vanished relevance pays nothing for it): one more forward and backward pass
of the explainer, recording the relevance of every layer's output and of the nodes that feed it
(:func:`fxlrp.attribute_nodes`' machinery, without its checks). The layer named is the one that
absorbed the most: the largest fall of the absolute relevance from its output to its inputs,

.. math:: \\arg\\max_k \\Big( \\sum |R_{\\text{out}(k)}| - \\sum_{p \\in \\text{in}(k)} \\sum |R_p| \\Big),

rather than, say, the layer nearest the output below the warning's share: where every layer
absorbs part of the relevance (biases that make up most of each layer's output), the largest
fall is where most of it went, and a fall of rounding noise (relevance already at 1e-12 falling
to 0) never outweighs it. ``R_p`` is what reaches the output of a node ``p`` feeding layer ``k``
from all its consumers (a node feeding a residual branch too passes on more than ``k`` alone
gets): the fall is then underestimated, never overestimated, so no layer is named for relevance
another one passed on.

A model run eagerly as a whole (a detector, whose code loops over images and branches on their
sizes) has no layers in its graph: :func:`absorbing_module` runs the explanation once more while
following the calls of the modules of its parts run eagerly, and records ``sum |R|`` of what
reaches each call's output and positional inputs (tensor hooks, registered as the call is made),
summed over the calls of each module (a head applied to every level of a feature pyramid is one
layer), and names the largest fall as above. Its layers are the modules without submodules (a
container's fall is its layers' falls together); a call whose positional inputs carry no
relevance (ids of an embedding, tensors passed by keyword, which a module call's hooks do not
see) is no layer's, and relevance absorbed by operations in a container's own code is no
layer's either.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, fx, nn

from fxlrp.capture.interception import module_calls_followed
from fxlrp.eager.rule_choice import operations_observed
from fxlrp.eager.runner import eager_parts
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.finite_checks import absolute_total
from fxlrp.graph.nodes import original_node_name
from fxlrp.rules.composites import Site

LAYERS = ("rule", "eager")
"""The report's handlings of nodes that may absorb relevance: a rule's (epsilon's stabiliser, a
bias's share) or a module run eagerly, with rules inside."""


def absorbing_layer(explainer: Explainer, relevance_of_nodes: Callable[[list[str]], dict[str, Tensor | None]]
                    ) -> str | None:
    """The layer that absorbed the most relevance (see the module's docstring), in the user's
    terms: its module's path and type (``backbone.body.layer4.2.conv3 (Conv2d)``), or the
    operation and the module whose code made it, with its node of ``explain.report()``.

    Parameters
    ----------
    explainer
        The explainer whose graph the explained call runs (:meth:`Explainer.explainer_for`).
    relevance_of_nodes
        The relevance of the named nodes' outputs for the explained target (the second part of
        :func:`fxlrp.attribute_nodes`' result).

    Returns
    -------
    str or None
        A clause naming the layer and the relevance at its output and inputs; None where no layer
        can be named (a model run eagerly as a whole has none in its graph) or none absorbed any.
    """
    names = _report_names(explainer)
    layers = {node: inputs for node, inputs in _layers(explainer, names).items() if inputs}
    if not layers:
        return None
    wanted = sorted({names[node] for node in layers} | {names[p] for inputs in layers.values() for p in inputs})
    relevance = relevance_of_nodes(wanted)
    with torch.no_grad():
        totals = dict(zip(wanted, _read_on_host([_total(relevance.get(name)) for name in wanted]), strict=True))
    return _largest_fall({_described(explainer, node): (totals[names[node]], sum(totals[names[p]] for p in inputs))
                          for node, inputs in layers.items()})


def absorbing_module(explain: nn.Module, explain_again: Callable[[], Any]) -> str | None:
    """The module that absorbed the most relevance in the parts of a model run eagerly (a model run
    eagerly as a whole: see the module's docstring), in the user's terms: its path, type and row
    of ``explain.report()`` (``backbone.2 (Conv2d, row 'model › backbone.2' of
    explain.report())``), with the relevance at its output and inputs.

    Parameters
    ----------
    explain
        The explainer (of :func:`fxlrp.convert`).
    explain_again
        Runs the explanation once more, forward and backward (the model's call and one backward
        pass from the explained value to the inputs, no other backward pass: each would be
        counted).

    Returns
    -------
    str or None
        A clause naming the module and the relevance at its output and inputs (as
        :func:`absorbing_layer`'s); None where the explainer runs no part eagerly or no module
        absorbed any.
    """
    graph_module = getattr(explain, "graph_module", None)
    parts = eager_parts(graph_module) if graph_module is not None else []
    layers = {id(module): (name, module, part.node) for part in parts
              for name, module in part.module.named_modules(prefix=part.name) if next(module.children(), None) is None}
    if not layers:
        return None
    totals: dict[int, tuple[list[Tensor], list[Tensor]]] = {}
    """Per module followed: ``sum |R|`` at its calls' outputs, and at their inputs."""
    calls: list[bool] = []
    """Per call of a layer under way: whether its inputs carry relevance (its output is followed)."""

    def follow(tensors: Any, side: int, module: nn.Module) -> bool:
        # (past the relevance mode: reading requires_grad and registering a hook are no
        # operations of the model's)
        with torch._C.DisableTorchFunction():
            carrying = list({id(tensor): tensor for tensor in _tensors_in(tensors)
                             if tensor.requires_grad and tensor.is_floating_point()}.values())
            if carrying:
                found = totals.setdefault(id(module), ([], []))[side]
                for tensor in carrying:
                    tensor.register_hook(functools.partial(_add_total, found))
        return bool(carrying)

    def before(module: nn.Module, args: Any) -> None:
        if id(module) in layers:
            calls.append(follow(args, 1, module))

    def after(module: nn.Module, args: Any, output: Any) -> None:
        if id(module) in layers and calls.pop():
            follow(output, 0, module)

    with operations_observed(_follow_nothing), module_calls_followed(before=before, after=after):
        explain_again()
    if not totals:
        return None
    read = iter(_read_on_host([torch.stack(found).sum() if found else None
                               for sides in totals.values() for found in sides]))
    return _largest_fall({_module_described(*layers[key]): (next(read), next(read)) for key in totals})


def _read_on_host(totals: list[Tensor | None]) -> list[float]:
    """``totals`` (None: 0) as numbers, read from their device in one transfer."""
    device = next((total.device for total in totals if total is not None), torch.device("cpu"))
    zero = torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([zero if total is None else total.to(device) for total in totals]).tolist()


def _module_described(name: str, module: nn.Module, node: str) -> str:
    """``backbone.2 (Conv2d, row 'model › backbone.2' of explain.report())``: a module of a part
    run eagerly, whose operations are the rows ``node › module`` of the report."""
    return f"{name} ({type(module).__name__}, row {f'{node} › {name}'!r} of explain.report())"


def _add_total(found: list[Tensor], relevance: Tensor | None) -> None:
    """A tensor hook: ``sum |R|`` of the relevance reaching the tensor, kept on its device (None:
    none reaches it)."""
    if relevance is not None:
        found.append(absolute_total(relevance).double())


def _tensors_in(value: Any, depth: int = 3) -> list[Tensor]:
    """The tensors in a module call's arguments or output: tensors, in tuples, lists and dicts,
    and the attributes of other objects (a detector's ``ImageList``), ``depth`` levels deep."""
    if isinstance(value, Tensor):
        return [value]
    if depth == 0 or isinstance(value, nn.Module):
        return []
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    else:
        items = list(getattr(value, "__dict__", {}).values())
    return [tensor for item in items for tensor in _tensors_in(item, depth - 1)]


def _follow_nothing(*_: Any) -> None:
    """An observer of operations that looks at none: the parts run eagerly run under the relevance
    mode at every call (a recorded replay calls no modules)."""


def _largest_fall(layers: dict[str, tuple[float, float]]) -> str | None:
    """The clause naming the layer whose absolute relevance falls most from its output to its
    inputs, given each layer's description and its totals ``(sum |R_out|, sum |R_in|)``; None
    where no layer is given or none absorbed any (the first of equal falls is named)."""
    if not layers:
        return None
    layer = max(layers, key=lambda name: layers[name][0] - layers[name][1])
    output, inputs = layers[layer]
    if not output - inputs > 0:
        return None
    return f"{layer}: {output:.2g} reached its output, {inputs:.2g} its inputs"


def _report_names(explainer: Explainer) -> dict[fx.Node, str]:
    """Each graph node's name in ``explain.report()`` (a rewritten node stands for the node of
    the name its module carries)."""
    rows = {row.name for row in explainer.report().rows}
    names = {}
    for node in explainer.graph_module.graph.nodes:
        name = (original_node_name(node.target) if node.op == "call_module" else None) or node.name
        if name in rows:
            names[node] = name
    return names


def _layers(explainer: Explainer, names: dict[fx.Node, str]) -> dict[fx.Node, list[fx.Node]]:
    """The nodes that may absorb relevance (:data:`LAYERS`), each with the nodes feeding it
    relevance: its arguments computed in the graph (not parameters and constants). Nodes
    whose output is a tuple (taken apart by getitem) have no one relevance tensor and are left out."""
    handling = {row.name: row.handling for row in explainer.report().rows}
    layers = {}
    for node, name in names.items():
        site = _site(explainer, node)
        if handling[name] not in LAYERS or site is None or _is_tuple(explainer, node):
            continue
        if handling[name] == "eager" and not site.module_name:
            continue  # (the whole model run eagerly: no layer of it is a node)
        inputs = [p for p in node.all_input_nodes if p.op != "get_attr" and p in names]
        if not any(_is_tuple(explainer, p) for p in inputs):
            layers[node] = inputs
    return layers


def _site(explainer: Explainer, node: fx.Node) -> Site | None:
    if node.op != "call_module":
        return None
    call = getattr(explainer.graph_module.get_submodule(node.target), "call", None)
    return getattr(call, "site", None)


def _is_tuple(explainer: Explainer, node: fx.Node) -> bool:
    """Whether the node's output is taken apart by getitem (a tuple: attention's output and weights)."""
    return any((user.op == "call_function" and user.target is operator.getitem) or
               (user.op == "call_module" and getattr(explainer.graph_module.get_submodule(user.target), "function",
                                                     None) is operator.getitem)
               for user in node.users)


def _total(relevance: Tensor | None) -> Tensor | None:
    """``sum |R|`` in float64 on the relevance's device (read with the others in one transfer);
    None for a node no relevance reaches (a total of 0: no tensor, or integer values such as
    indices, whose zeros ``attribute_nodes`` returns)."""
    return absolute_total(relevance).double() if isinstance(relevance, Tensor) and relevance.is_floating_point() \
        else None


def _described(explainer: Explainer, node: fx.Node) -> str:
    """``body.0 (Linear, node 'body_0' of explain.report())``, or for an operation inside a
    module's code ``linear in body (node 'linear' of explain.report())``."""
    site = _site(explainer, node)
    report_name = original_node_name(node.target) or node.name
    where = f"node {report_name!r} of explain.report()"
    if site.is_module_call and site.module_name:
        kind = f"{site.module_type.__name__}, " if site.module_type is not None else ""
        return f"{site.module_name} ({kind}{where})"
    inside = f" in {site.module_name}" if site.module_name else ""
    return f"{site.operation}{inside} ({where})"
