"""Which calls are the first layer: one definition for a captured graph and for code run eagerly.

A composite may give the layer that meets the input a rule of its own (zennit's ``Flat`` or
``ZBox`` there). A call of a layer the composite counts as a first layer
(:meth:`~fxlrp.rules.composites.Composite.may_hold_first_layer`) is one when every path back from
its relevance-carrying arguments reaches a place where relevance starts - an input of the model,
or an operation whose output carries relevance though its arguments do not (an embedding lookup
of token ids) - without passing the output of another such call. In a chain that is the first
such layer; a shared encoder called on two inputs, or parallel layers on one input, are first at
each call; the second call of a recurrent layer, which reads the first one's output, is not.

The rewrite asks it of the nodes of a captured graph (:mod:`fxlrp.graph.rewrite`); code run
eagerly asks it of autograd's record of the run, as each call is made
(:mod:`fxlrp.eager.interpret`). Each says how to step back from a value; the walk is this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

Value = TypeVar("Value")


def meets_inputs(starts: Iterable[Value], predecessors: Callable[[Value], Iterable[Value] | None]) -> bool:
    """Whether every path back from ``starts`` reaches a place where relevance starts.

    A path must reach it without passing the output of a layer.

    Parameters
    ----------
    starts : iterable
        The values to walk back from (a call's relevance-carrying arguments). None at all:
        relevance starts at the call itself, which then meets the input.
    predecessors : callable
        ``predecessors(value)``: the relevance-carrying values ``value`` is computed from; empty
        where relevance starts at ``value``; None where ``value`` is the output of a layer that
        may be a first layer, or comes from outside the inputs (then the call is no first layer).

    Returns
    -------
    bool
        True if no path back passes a layer's output or leaves the inputs.
    """
    pending = list(starts)
    seen: set[int] = set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        before = predecessors(value)
        if before is None:
            return False
        pending.extend(before)
    return True
