"""The runner of a part run eagerly: the module's forward with detached parameters, the user's
model left as it was, and what its runs did (for the report)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import fx, nn

from fxlrp.capture.module_state import run_with_detached_parameters


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
        return run_with_detached_parameters(self.module, args, kwargs, evaluation=True)


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


class EagerPart(NamedTuple):
    """A part of the model run eagerly: one node of the explainer's graph."""

    name: str
    """The module's qualified name in the model (``""``: the whole model)."""
    module: nn.Module
    """The user's module."""
    node: str
    """Its node's name in ``explain.report()`` (whose rows ``node › module`` name what its runs did)."""


def eager_parts(graph_module: fx.GraphModule) -> list[EagerPart]:
    """The parts of the model run eagerly.

    Parameters
    ----------
    graph_module : fx.GraphModule
        The explainer's graph.

    Returns
    -------
    list of EagerPart
        One entry per part.
    """
    parts = []
    for _, node_module in graph_module.named_children():
        runner = getattr(node_module, "function", None)
        site = getattr(getattr(node_module, "call", None), "site", None)
        if isinstance(runner, LayerRunner) and site is not None:
            parts.append(EagerPart(site.module_name or "", runner.module, site.node_name))
    return parts
