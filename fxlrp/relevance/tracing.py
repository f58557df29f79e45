"""Whether relevance Functions may decide anything from tensor values: not for a trace
(:func:`fxlrp.compile`), and not on a GPU.

Some rules skip work that the values of one input make unnecessary: z+ and alpha-beta skip the
``x-`` terms where no input is negative, gamma the half of output signs that do not occur, a
linear layer's backward the rows and columns of a gradient that are all 0. (Where the graph shows
that no input can be negative - a ReLU before the layer - the ``x-`` terms are left out on every
device without a read: :attr:`fxlrp.relevance.AffineLayer.inputs_non_negative`.) Reading a
value on the host is a synchronisation on a GPU (the host waits until the device has computed
it, and the device then idles until the host queues the next kernels), which a trace cannot
record either, and a skip decided for the traced input would be wrong for the next one. So these
rules read values only on the CPU outside a trace (:func:`values_read_on_host`); elsewhere they
compute every term: the skipped terms are exact zeros, so relevance is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

_traces = 0
"""Traces running. A process-wide count, not a context variable: on a GPU the autograd engine runs
the backward, where most of these decisions are taken, on threads of its own. A trace on one
thread makes eager explanations on others compute every term too, which changes no relevance."""


@contextmanager
def traced() -> Iterator[None]:
    """Relevance Functions run inside this block record a graph for every input of its shapes.

    Yields
    ------
    None
    """
    global _traces
    _traces += 1
    try:
        yield
    finally:
        _traces -= 1


def values_are_traced() -> bool:
    """Whether rules must not decide anything from tensor values (see the module docstring).

    Returns
    -------
    bool
        True while a trace runs on any thread.
    """
    return _traces > 0


HOST_DEVICE_TYPES = frozenset({"cpu"})
"""Device types whose values the host reads without waiting for a device."""


def values_read_on_host(value: Tensor) -> bool:
    """Whether a rule may read ``value``'s values on the host to skip work they make unnecessary.

    Only on the CPU (no device synchronisation) and outside a trace or ``torch.compile``.

    Parameters
    ----------
    value : Tensor
        The tensor whose values would be read.

    Returns
    -------
    bool
        True where reading is cheap and allowed; False where the caller takes the general path
        (the work a read could let it skip).
    """
    return value.device.type in HOST_DEVICE_TYPES and _traces == 0 and not torch.compiler.is_compiling()
