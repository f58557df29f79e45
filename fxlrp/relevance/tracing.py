"""Whether relevance Functions run for a trace (:func:`fxlrp.compile`) rather than for values.

Some rules skip work that the values of one input make unnecessary: z+ and alpha-beta skip the
``x-`` terms behind a ReLU (no input is negative), gamma the half of output signs that do not
occur. Reading a value is a host synchronisation that a trace cannot record, and a skip decided
for the traced input would be wrong for the next one. While a trace runs, these rules compute
every term instead: the skipped terms are exact zeros, so relevance is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


def known_on_host(value: Tensor, check: Callable[[Tensor], Tensor]) -> bool:
    """Whether the one-element ``check(value)`` is true, asked only where that is cheap and allowed.

    It is asked on the CPU (no device synchronisation) and outside a trace.

    Parameters
    ----------
    value : Tensor
        The tensor to check.
    check : callable
        Maps ``value`` to a one-element tensor.

    Returns
    -------
    bool
        The check's answer; False where it is not asked, so that callers take the general path
        (the work a true answer would let them skip).
    """
    return value.device.type == "cpu" and not values_are_traced() and bool(check(value))
