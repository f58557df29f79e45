"""The explainer's GraphModule, which pickles as its graph instead of as code to trace again."""

from __future__ import annotations

import copy
from typing import Any

from torch import fx, nn


class ExplainedGraphModule(fx.GraphModule):
    """An ``fx.GraphModule`` that ``pickle`` and ``torch.save`` store with its graph.

    torch.fx pickles a GraphModule as its generated code and, when loading, traces that code again
    with the tracer class that made the graph: fxlrp's capture tracer, which needs the conversion's
    arguments (``RelevanceTracer.__init__() missing ... argument``), and which would trace into the
    library functions fxlrp records as single calls and lose the nodes' names and source lines
    that ``report()`` and ``attribute_nodes`` use. The graph itself is plain data
    (nodes, their targets by reference, their metadata), so it is stored as it is, as
    ``copy.deepcopy`` copies it.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        # A copy of the graph that does not refer back to this module, which is being pickled.
        state["_graph"] = copy.deepcopy(self.graph)
        state.pop("_code", None)
        return (_rebuilt, (state, type(self).__name__))


def _rebuilt(state: dict[str, Any], class_name: str) -> ExplainedGraphModule:
    """The module :meth:`ExplainedGraphModule.__reduce__` stored."""
    root = nn.Module()
    root.__dict__.update(state)
    graph_module = ExplainedGraphModule(root, state["_graph"], class_name=class_name)
    graph_module.meta = state.get("meta", {})
    return graph_module
