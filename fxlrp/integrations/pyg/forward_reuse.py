"""One forward for many explanations of the same inputs.

PyG's ``Explainer`` calls its algorithm once per explained node, each time with the same graph.
The forward of the converted model (and the message records, and the matching of messages to
input edges) does not depend on the explained node, so :class:`ForwardReuse` keeps the last one
and hands it out again while nothing it depends on has changed; only the backward pass runs per
node. The key is exact, never a guess from values: the converted model's identity, every
parameter and buffer of the user's model by identity and version (``optimizer.step()`` and other
in-place changes bump the version), the inputs by identity and version (for heterogeneous
graphs, each node and edge type's tensor, the dicts copied so the tensors stay referenced), and
the other keywords by identity and version (tensors, dicts of tensors) or by value (``None``,
numbers, strings). Calls with any other keyword value, or with a module of the model in
training mode (dropout would draw anew), are never reused. The kept tensors stay referenced, so
their identities cannot be taken by new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from fxlrp.integrations.pyg.relevance import GraphForward

_PLAIN_VALUES = (type(None), bool, int, float, str)


def _tensor_key(tensor: Tensor) -> tuple[Any, ...]:
    return id(tensor), tensor._version


def _value_key(value: Any) -> tuple[Any, ...] | None:
    if isinstance(value, Tensor):
        return ("tensor", *_tensor_key(value))
    if isinstance(value, dict):  # by node or edge type (heterogeneous graphs)
        items = [(name, _value_key(item)) for name, item in value.items()]
        return None if any(key is None for _, key in items) else ("dict", tuple(items))
    if type(value) in _PLAIN_VALUES:
        return ("value", type(value), value)
    return None


def forward_key(model: nn.Module, explain: nn.Module, x: Tensor | dict, edge_index: Tensor | dict,
                kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the forward of ``explain(x, edge_index, **kwargs)`` depends on.

    Parameters
    ----------
    model : nn.Module
        The user's model.
    explain : nn.Module
        Its conversion.
    x : Tensor or dict
        Node features (by node type for heterogeneous graphs).
    edge_index : Tensor or dict
        Edges (by edge type for heterogeneous graphs).
    kwargs : dict
        The other keywords of the call.

    Returns
    -------
    tuple or None
        The key; None when a call must not be reused (a module in training mode, a keyword
        value that is neither a tensor nor a plain value).
    """
    if any(module.training for module in model.modules()):
        return None
    keywords = []
    for name in sorted(kwargs):
        value = _value_key(kwargs[name])
        if value is None:
            return None
        keywords.append((name, value))
    graph = _value_key(x), _value_key(edge_index)
    if None in graph:
        return None
    state = [*model.parameters(), *model.buffers()]
    return (id(explain), *graph, tuple(keywords),
            tuple(_tensor_key(tensor) for tensor in state))


class ForwardReuse:
    """Keeps the last :class:`~fxlrp.integrations.pyg.relevance.GraphForward` and its key."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._forward: GraphForward | None = None
        self._kept: tuple[Any, ...] = ()

    def get(self, model: nn.Module, explain: nn.Module, x: Tensor | dict, edge_index: Tensor | dict,
            kwargs: dict[str, Any],
            run: Callable[[bool], GraphForward]) -> GraphForward:
        """The kept forward if its key matches; else ``run(reusable)``, kept when it has a key.

        Parameters
        ----------
        model : nn.Module
            The user's model.
        explain : nn.Module
            Its conversion.
        x : Tensor or dict
            Node features.
        edge_index : Tensor or dict
            Edges.
        kwargs : dict
            The other keywords of the call.
        run : callable
            ``run(reusable)`` runs the forward; ``reusable`` says whether it is to be kept
            (:func:`forward_key` gave a key).

        Returns
        -------
        GraphForward
            The forward.
        """
        key = forward_key(model, explain, x, edge_index, kwargs)
        if key is not None and key == self._key and self._forward is not None:
            return self._forward
        self.clear()  # free the previous graph before building the next one
        forward = run(key is not None)
        if key is not None:
            self._key, self._forward = key, forward
            kept_dicts = [dict(value) for value in (x, edge_index, *kwargs.values()) if isinstance(value, dict)]
            self._kept = (explain, x, edge_index, dict(kwargs), kept_dicts, [*model.parameters(), *model.buffers()])
        return forward

    def clear(self) -> None:
        """Drop the kept forward (and the memory of its graph)."""
        self._key, self._forward, self._kept = None, None, ()
