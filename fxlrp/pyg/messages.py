"""Record the per-edge messages of message-passing layers during an explanation.

Edge relevance is the relevance that reaches a layer's messages (the output of its ``message``),
so the messages and the ``edge_index`` they were sent along (after the layer added or removed
self-loops) are recorded while :func:`recording_messages` is active. The layer's own
propagate hooks are used for the duration of its call and removed right after.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn


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
    source_to_target: bool


_RECORDERS = threading.local()


@contextmanager
def recording_messages() -> Iterator[list[Messages]]:
    """Collects :class:`Messages` of every message-passing layer called while active."""
    records: list[Messages] = []
    previous = getattr(_RECORDERS, "records", None)
    _RECORDERS.records = records
    try:
        yield records
    finally:
        _RECORDERS.records = previous


@contextmanager
def messages_of(layer: nn.Module, name: str) -> Iterator[None]:
    """While active, the messages of ``layer`` are recorded if a recording is on."""
    records = getattr(_RECORDERS, "records", None)
    if records is None:
        yield
        return
    sent_along: list[Any] = []

    def before_propagate(module: nn.Module, inputs: tuple[Any, ...]) -> None:
        sent_along.append(inputs[0])

    def after_message(module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
        edge_index = sent_along[-1]
        if isinstance(edge_index, Tensor) and isinstance(output, Tensor) and output.requires_grad:
            edge_dim = module.node_dim if module.node_dim >= 0 else output.dim() + module.node_dim
            records.append(Messages(name, edge_index, output, edge_dim, module.flow == "source_to_target"))

    handles = [layer.register_propagate_forward_pre_hook(before_propagate),
               layer.register_message_forward_hook(after_message)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
