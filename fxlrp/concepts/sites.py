"""Where a condition acts: the output of a node of the explainer's graph, or of a module that
runs inside a part of the model run eagerly.

A condition names a place by

- a row of ``explain.report()`` (a torch.fx node name: ``"features_40"``, ``"layer1_0_relu_1"``,
  ``"add_3"``), or
- a module's qualified name in the model, as zennit-crp names layers (``"features.40"``,
  ``"layer4.1"``, ``"bert.encoder.layer.0.intermediate"``): a module the graph calls as one node is
  that node; a module the graph traced through (a residual block) is the node that computes its
  output; a module inside a part run eagerly is followed as it runs.

The output is observed by a forward hook: on the graph's node module (captured graphs), or on
every module call of the thread (parts run eagerly, which then run under the relevance mode at
every call, not from their recorded graphs, so that their modules are called). Nothing of the
user's model is changed; the hooks on the explainer's node modules live for one explanation.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, fx, nn

from fxlrp.capture.interception import module_calls_followed
from fxlrp.eager.rule_choice import operations_observed
from fxlrp.eager.runner import eager_parts
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.model_rejection import model_of
from fxlrp.graph.nodes import original_node_name

OUTPUT = "y"
"""The key of a condition that names classes of the explained output (zennit-crp's ``"y"``)."""


@dataclass(frozen=True)
class Site:
    """The place a condition key names."""

    key: str
    """The key as given."""
    node: str | None = None
    """The graph node (a row of ``explain.report()``) whose output it is; None inside a part run eagerly."""
    module: nn.Module | None = None
    """Inside a part run eagerly: the user's module whose output it is."""

    def describe(self) -> str:
        """How messages name the site."""
        if self.node is not None and self.node != self.key:
            return f"{self.key!r} (node {self.node!r})"
        return repr(self.key)


def resolve(explainer: Explainer, key: str) -> Site:
    """The :class:`Site` a condition key names (see the module's docstring).

    Parameters
    ----------
    explainer : Explainer
        The explainer whose graph the explained call runs.
    key : str
        A row of ``explain.report()`` or a module's qualified name.

    Returns
    -------
    Site
        The site.

    Raises
    ------
    ValueError
        If the key names nothing that computes a tensor, or a module the graph calls more than
        once (each call is a node of its own: name one).
    """
    if not isinstance(key, str):
        raise TypeError(f"a condition's keys are node or module names (str), got {key!r}")
    graph_module = explainer.graph_module
    nodes = _node_modules(graph_module)
    rows = {row.name: row for row in explainer.report().rows}
    if key in nodes:
        return Site(key, node=key)
    if key in rows and rows[key].handling in ("input", "output"):
        raise ValueError(
            f"{key!r} is the model's {rows[key].handling}: conditions name the operations whose output relevance "
            f"they restrict; the explained output's classes are the condition key {OUTPUT!r}"
        )
    calls = [name for name, row in rows.items() if row.target == key and name in nodes]
    if len(calls) == 1:
        return Site(key, node=calls[0])
    if len(calls) > 1:
        raise ValueError(
            f"the model calls module {key!r} {len(calls)} times, each call a node of its own "
            f"({', '.join(calls)}): name the node whose output the condition is about"
        )
    traced = _traced_module_output(graph_module.graph, key)
    if traced is not None:
        return Site(key, node=traced)
    inside = _module_run_eagerly(graph_module, key)
    if inside is not None:
        return Site(key, module=inside)
    raise ValueError(_unknown(explainer, key, list(nodes)))


def _node_modules(graph_module: fx.GraphModule) -> dict[str, nn.Module]:
    """The explainer's module of each graph node that has one, by the node's report name."""
    found = {}
    for name, module in graph_module.named_children():
        original = original_node_name(name)
        if original is not None:
            found[original] = module
    return found


def _traced_module_output(graph: fx.Graph, path: str) -> str | None:
    """The node computing the output of module ``path`` where the trace went through it (its
    operations are nodes carrying it in their ``nn_module_stack``): the node of the module's call
    whose value is used outside the call. None if no node belongs to the module."""
    calls: dict[str, list[fx.Node]] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        for call, (module_path, _) in stack.items():
            if module_path == path:
                calls.setdefault(call, []).append(node)
    if not calls:
        return None
    if len(calls) > 1:
        outputs = ", ".join(_report_name(_call_output(path, nodes)) for nodes in calls.values())
        raise ValueError(
            f"the model calls module {path!r} {len(calls)} times (outputs: {outputs}): name the node whose output "
            "the condition is about"
        )
    return _report_name(_call_output(path, next(iter(calls.values()))))


def _call_output(path: str, members: list[fx.Node]) -> fx.Node:
    inside = set(members)
    leaving = [node for node in members if any(user not in inside for user in node.users)]
    if len(leaving) != 1:
        names = ", ".join(_report_name(node) for node in leaving) or "none"
        raise ValueError(
            f"module {path!r} hands {len(leaving)} values out of its call (nodes {names}), not one output: name the "
            "node whose output the condition is about"
        )
    return leaving[0]


def _report_name(node: fx.Node) -> str:
    original = original_node_name(str(node.target)) if node.op == "call_module" else None
    return original or node.name


def _module_run_eagerly(graph_module: fx.GraphModule, path: str) -> nn.Module | None:
    for prefix, module, _ in eager_parts(graph_module):
        if prefix and path != prefix and not path.startswith(prefix + "."):
            continue
        relative = path[len(prefix) + 1:] if prefix else path
        try:
            return module.get_submodule(relative) if relative else module
        except AttributeError:
            continue
    return None


def _unknown(explainer: Explainer, key: str, nodes: list[str]) -> str:
    model = model_of(explainer)
    module = None
    if model is not None:
        try:
            module = model.get_submodule(key)
        except AttributeError:
            module = None
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return (f"module {key!r} is a BatchNorm that fxlrp folded into the layer before it (explain.report() shows "
                "that layer's node with the BatchNorm's output, as zennit's canonizers merge them): condition on that "
                "layer")
    if module is not None:
        return (f"module {key!r} computes no node of the explained graph (it takes no part in the explained forward, "
                "or it is inlined into another node): name a row of explain.report()")
    names = list(dict.fromkeys([*nodes, *(name for name, _ in model.named_modules() if name)]
                               if model is not None else nodes))
    close = difflib.get_close_matches(key, names, n=5, cutoff=0.6)
    shown = f"close names: {', '.join(close)}" if close else f"e.g. {', '.join(nodes[:12])}, ..."
    return (f"no node or module named {key!r} in the explained model ({shown}); a condition names a row of "
            "explain.report() or a module's qualified name (model.named_modules())")


def tensor_of(site: Site, output: Any) -> Tensor:
    """The tensor a site's output is: the output, or its first element where it is a tuple or
    list (a module returning ``(output, attention weights)``, as zennit-crp takes ``output[0]``).

    Parameters
    ----------
    site : Site
        The site.
    output : Any
        What the node or module returned.

    Returns
    -------
    Tensor
        The tensor conditions act on.
    """
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    if isinstance(output, Tensor):
        return output
    raise ValueError(
        f"{site.describe()} outputs {type(output).__name__}, not a tensor: name the node that takes the tensor out "
        "of it (its getitem or attribute node in explain.report())"
    )


OutputObserver = Callable[[Site, Tensor], Tensor | None]
"""``observer(site, tensor)``: called with a site's output tensor each time the site computes it;
what it returns (not None) replaces the output of a graph node for the nodes that read it."""


@contextmanager
def outputs_observed(explainer: Explainer, sites: Sequence[Site], observer: OutputObserver) -> Iterator[None]:
    """Call ``observer`` with the output of each site when the explained forward computes it.

    Only on the thread that entered; the hooks are removed on exit, also when the body raises.

    Parameters
    ----------
    explainer : Explainer
        The explainer whose graph the forward runs.
    sites : sequence of Site
        The sites to observe.
    observer : OutputObserver
        Called as ``observer(site, tensor)``; a tensor it returns replaces a graph node's output
        (of the same values) for the nodes that read it.

    Yields
    ------
    None
    """
    thread = threading.get_ident()
    node_modules = _node_modules(explainer.graph_module)
    eager = {id(site.module): site for site in sites if site.module is not None}
    with ExitStack() as stack:
        for site in sites:
            if site.node is None:
                continue

            def hook(module: nn.Module, args: Any, output: Any, site: Site = site) -> Any:
                if threading.get_ident() != thread:
                    return None
                replaced = observer(site, tensor_of(site, output))
                return replaced if replaced is not None and isinstance(output, Tensor) else None

            stack.callback(node_modules[site.node].register_forward_hook(hook).remove)
        if eager:
            def after(module: nn.Module, args: Any, output: Any) -> None:
                site = eager.get(id(module))
                if site is not None:
                    observer(site, tensor_of(site, output))

            stack.enter_context(module_calls_followed(after=after))
            # A recorded replay of a part makes no module calls: run every part under the relevance mode.
            stack.enter_context(operations_observed(_ignore))
        yield


def _ignore(*_: Any) -> None:
    """An observer of operations that looks at none."""
