"""The message-passing steps of a converted model, for relevant walks: which node states ``H_1, ...,
H_L`` it computes and which rows of ``H_{t-1}`` each row of ``H_t`` is computed from
(:mod:`fxlrp.integrations.pyg.walks`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx

from fxlrp.explain.explainer import Explainer
from fxlrp.graph.nodes import REWRITTEN_PREFIX

AGGREGATIONS = frozenset({"scatter_sum", "scatter", "scatter_max", "scatter_reduce", "index_add", "pyg_scatter"})
"""Canonical operations that aggregate rows by an index (a message aggregation or a pooling)."""

_GATHER_TARGETS = {"operator.getitem": 1, ".index_select()": 2, "torch.index_select": 2}
"""How a gather of rows is reported, and the position of its index argument."""

OUTPUT = "output"
"""The state name standing for the model's output (a node-level model's last state)."""


@dataclass(frozen=True)
class Step:
    """One message-passing step: the node state it computes and where its edges are read."""

    state: str
    """Name of the ``explain.report()`` row whose output is ``H_t`` (``"output"``: the output)."""
    layer: str | None = None
    """PyG: the layer's module path; the edges of its recorded messages are the step's edges."""
    aggregation: str | None = None
    """Scatter models: the aggregation node; its index and the gathers' indices give the edges."""
    gathers: tuple[tuple[str, int], ...] = ()
    """Scatter models: the step's gathers, each with the position of its index argument."""


def walk_steps(explain: Explainer) -> list[str]:
    """The node states ``H_1, ..., H_L`` of a converted model, as names of ``explain.report()`` rows.

    PyG models: the outputs of the message-passing layers, in the order they run. Models
    without PyG layers (torch_scatter, PyG's ``scatter``): a step is an aggregation whose
    messages gather rows of a node tensor along the edges (``h[senders]``,
    ``h.index_select(0, receivers)``) that no earlier aggregation gathered; ``H_t`` for
    ``t < L`` is the tensor step ``t + 1`` gathers from, and ``H_L`` the input of an aggregation
    after the last step (a pooling) or else ``"output"``, the model's output (node-level). Give
    ``steps=`` to the functions here where this does not describe the model.
    """
    return [step.state for step in detect_steps(explain)]


def detect_steps(explain: Explainer) -> list[Step]:
    report = explain.report()
    layers = [row for row in report.rows if row.operation == "message_passing"]
    if layers:
        return [Step(row.name, layer=row.target) for row in layers]
    rows = {row.name: row for row in report.rows}
    graph = explain.graph_module.graph
    nodes = {_report_name(node): node for node in graph.nodes}
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if not placeholders:
        raise ValueError("the explained model has no inputs")
    carrying = _descendants(placeholders[0])
    ancestors: dict[fx.Node, set[fx.Node]] = {}

    def above(node: fx.Node) -> set[fx.Node]:
        if node not in ancestors:
            found: set[fx.Node] = set()
            for parent in node.all_input_nodes:
                found |= {parent} | above(parent)
            ancestors[node] = found
        return ancestors[node]

    gathers: dict[fx.Node, tuple[fx.Node, int]] = {}  # gather -> (the node tensor it reads, index position)
    for name, row in rows.items():
        position = _GATHER_TARGETS.get(row.target)
        node = nodes.get(name)
        if position is None or node is None or len(node.args) <= position:
            continue
        source, index = node.args[0], node.args[position]
        if isinstance(source, fx.Node) and source in carrying and isinstance(index, fx.Node) \
                and index not in carrying:
            gathers[node] = (source, position)
    aggregations = [node for name, node in nodes.items()
                    if name in rows and rows[name].operation in AGGREGATIONS and node in carrying]
    found_steps: list[tuple[fx.Node, set[fx.Node]]] = []
    after_last: list[fx.Node] = []
    seen: set[fx.Node] = set()
    for node in aggregations:
        new = {gather for gather in gathers if gather in above(node)} - seen
        if new:
            found_steps.append((node, new))
            seen |= new
            after_last = []
        elif found_steps:
            after_last.append(node)
    if not found_steps:
        raise ValueError("found no message-passing step in the model (no PyG layer, no aggregation of "
                         "gathered rows); name the node states with steps=[...] (rows of explain.report())")
    states = []
    for step, (_, new) in enumerate(found_steps[1:], start=2):
        read = {gathers[gather][0] for gather in new}
        if len(read) != 1:
            names = ", ".join(sorted(_report_name(node) for node in read))
            raise ValueError(f"message-passing step {step} gathers rows of several tensors ({names}); name the "
                             "node states with steps=[...] (rows of explain.report())")
        states.append(_report_name(next(iter(read))))
    pooled = after_last[0].args[0] if after_last else None
    states.append(_report_name(pooled) if isinstance(pooled, fx.Node) else OUTPUT)
    return [
        Step(state, aggregation=_report_name(aggregation),
             gathers=tuple(sorted((_report_name(gather), gathers[gather][1]) for gather in new)))
        for state, (aggregation, new) in zip(states, found_steps, strict=True)
    ]


def _report_name(node: fx.Node) -> str:
    if node.op == "call_module" and str(node.target).startswith(REWRITTEN_PREFIX):
        return str(node.target)[len(REWRITTEN_PREFIX):]
    return node.name


def _descendants(node: fx.Node) -> set[fx.Node]:
    found, stack = {node}, [node]
    while stack:
        for user in stack.pop().users:
            if user not in found:
                found.add(user)
                stack.append(user)
    return found




class Neighbourhoods:
    """For one step, the rows of ``H_{t-1}`` each row ``k`` of ``H_t`` is computed from: ``k``
    and the senders of the messages ``k`` receives (a superset of where ``B_t`` can send the
    relevance of row ``k``)."""

    def __init__(self, senders: Tensor, receivers: Tensor, nodes: int) -> None:
        loops = torch.arange(nodes, device=senders.device)
        senders, receivers = torch.cat([senders, loops]), torch.cat([receivers, loops])
        order = torch.argsort(receivers, stable=True)
        self.senders = senders[order].tolist()
        self.starts = torch.cat([receivers.new_zeros(1), torch.bincount(receivers, minlength=nodes).cumsum(0)]).tolist()
        self._sets: dict[int, frozenset[int]] = {}

    def of(self, node: int) -> frozenset[int]:
        rows = self._sets.get(node)
        if rows is None:
            rows = self._sets[node] = frozenset(self.senders[self.starts[node]:self.starts[node + 1]])
        return rows
