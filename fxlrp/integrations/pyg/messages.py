"""Record the per-edge messages of message-passing layers during an explanation.

Edge relevance is the relevance that reaches a layer's messages (the output of its ``message``),
so the messages and the ``edge_index`` they were sent along (after the layer added or removed
self-loops) are recorded while :func:`recording_messages` is active. The layer's own
propagate hooks are used for the duration of its call and removed right after.

A layer is recorded in either of two ways: the captured graph's message-passing node enters
:func:`messages_of` around the layer's call, and, for layers called inside code that runs eagerly
(a model torch.fx cannot trace, ``HeteroConv``'s loop over edge types), global module hooks
held only while :func:`recording_messages` is active and acting only on its thread enter it at
the layer's call. A layer is never recorded twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch_geometric.nn.conv import MessagePassing

from fxlrp.capture.interception import module_calls_followed


@dataclass
class Messages:
    """The messages one call of a message-passing layer sent."""

    layer: str
    """Qualified name of the layer in the model."""
    edge_index: Tensor
    """``[2, E']``: the edges the messages were sent along, self-loops added by the layer included."""
    messages: Tensor
    """The output of the layer's ``message``: one row per edge along ``edge_dim``."""
    edge_dim: int
    """The dimension of :attr:`messages` that runs along the edges."""
    source_to_target: bool
    """Whether the layer's flow is ``"source_to_target"``."""
    given: Any = None
    """The edges the layer was called with (its ``edge_index`` argument: a tensor, or a dict of
    edge types for layers that take whole heterogeneous graphs, as ``HGTConv``); None if unknown."""


_RECORDERS = threading.local()


def given_edges(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The edge argument of a message-passing layer's call: ``layer(x, edge_index, ...)``.

    Parameters
    ----------
    args : tuple
        The call's positional arguments.
    kwargs : dict
        The call's keyword arguments.

    Returns
    -------
    Any
        The second positional argument, or ``edge_index`` (``edge_index_dict``) by keyword;
        None if neither is given.
    """
    if len(args) > 1:
        return args[1]
    return kwargs.get("edge_index", kwargs.get("edge_index_dict"))


@contextmanager
def recording_messages(names: dict[int, str] | None = None) -> Iterator[list[Messages]]:
    """Collects :class:`Messages` of every message-passing layer called while active.

    Parameters
    ----------
    names : dict of int to str, optional
        Qualified names of the model's modules by ``id``, for layers called inside code that runs
        eagerly (else their type names).

    Yields
    ------
    list of Messages
        The records, filled as the layers are called.
    """
    records: list[Messages] = []
    previous = getattr(_RECORDERS, "records", None)
    _RECORDERS.records = records
    entered: list[tuple[nn.Module, ExitStack]] = []

    def enter(module: nn.Module, args: tuple[Any, ...]) -> None:
        if (isinstance(module, MessagePassing) and getattr(_RECORDERS, "records", None) is records
                and id(module) not in _recorded()):
            stack = ExitStack()
            name = (names or {}).get(id(module), type(module).__name__)
            stack.enter_context(messages_of(module, name, given_edges(args, {})))
            entered.append((module, stack))

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if entered and entered[-1][0] is module:
            entered.pop()[1].close()

    try:
        with module_calls_followed(enter, leave):
            yield records
    finally:
        while entered:
            entered.pop()[1].close()
        _RECORDERS.records = previous


def _recorded() -> set[int]:
    layers = getattr(_RECORDERS, "layers", None)
    if layers is None:
        layers = _RECORDERS.layers = set()
    return layers


@contextmanager
def messages_of(layer: nn.Module, name: str, given: Any = None) -> Iterator[None]:
    """While active, the messages of ``layer`` are recorded if a recording is on.

    Parameters
    ----------
    layer : nn.Module
        The message-passing layer.
    name : str
        Its qualified name.
    given : Any, optional
        The edges the layer is called with (see :attr:`Messages.given`).

    Yields
    ------
    None
    """
    records = getattr(_RECORDERS, "records", None)
    if records is None or id(layer) in _recorded():
        yield
        return
    sent_along: list[Any] = []

    def before_propagate(module: nn.Module, inputs: tuple[Any, ...]) -> None:
        sent_along.append(inputs[0])

    def after_message(module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
        edge_index = sent_along[-1]
        if isinstance(edge_index, Tensor) and isinstance(output, Tensor) and output.requires_grad:
            edge_dim = module.node_dim if module.node_dim >= 0 else output.dim() + module.node_dim
            records.append(Messages(name, edge_index, output, edge_dim, module.flow == "source_to_target", given))

    handles = [layer.register_propagate_forward_pre_hook(before_propagate),
               layer.register_message_forward_hook(after_message)]
    _recorded().add(id(layer))
    try:
        yield
    finally:
        _recorded().discard(id(layer))
        for handle in handles:
            handle.remove()
