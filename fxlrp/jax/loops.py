"""Loops unrolled: a jaxpr with ``scan`` traced again with each scan written out step by step.

The number of steps of a ``scan`` is static, so its body can be evaluated once per step on the
step's slices, the carry passed on and the outputs stacked: the program JAX then traces holds the
body's equations once per step, each of which the rules explain as any other equation (a
recurrent layer's matrix products, its sums). Equations keep the user's source lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

LOOPS = ("scan",)


def has_loops(jaxpr: Any) -> bool:
    """Whether a jaxpr (or a nested call in it) holds a ``scan``.

    Parameters
    ----------
    jaxpr : jax.extend.core.Jaxpr
        The jaxpr.

    Returns
    -------
    bool
        True if it holds one.
    """
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in LOOPS:
            return True
        for inner in _inner_jaxprs(eqn):
            if has_loops(inner.jaxpr):
                return True
    return False


def _inner_jaxprs(eqn: Any) -> list[Any]:
    return [value for key, value in eqn.params.items() if key in ("jaxpr", "call_jaxpr") and hasattr(value, "jaxpr")]


def _user_context(eqn: Any) -> Any:
    try:
        from jax._src import source_info_util
    except ImportError:  # pragma: no cover - a JAX without it: source lines point here
        return contextlib.nullcontext()
    return source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack)


def evaluate_unrolled(jaxpr: Any, consts: Sequence[Any], *args: Any) -> list[Any]:
    """Evaluate a jaxpr with every ``scan`` unrolled (for tracing with ``jax.make_jaxpr``).

    Parameters
    ----------
    jaxpr : jax.extend.core.Jaxpr
        The jaxpr.
    consts : sequence
        Its constants.
    *args
        Its inputs.

    Returns
    -------
    list
        Its outputs.
    """
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if type(atom).__name__ == "Literal" else env[atom]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        values = [read(atom) for atom in eqn.invars]
        with _user_context(eqn):
            inner = _inner_jaxprs(eqn)
            if eqn.primitive.name == "scan":
                outputs = _scan_unrolled(eqn.params, values)
            elif eqn.primitive.name in ("jit", "pjit") and inner and has_loops(inner[0].jaxpr):
                outputs = evaluate_unrolled(inner[0].jaxpr, inner[0].consts, *values)
            else:
                params = eqn.primitive.get_bind_params(eqn.params)
                subfuns: list[Any] = []
                if isinstance(params, tuple):  # jax before 0.7
                    subfuns, params = params
                result = eqn.primitive.bind(*subfuns, *values, **params)
                outputs = list(result) if eqn.primitive.multiple_results else [result]
        for var, value in zip(eqn.outvars, outputs, strict=True):
            env[var] = value
    return [read(atom) for atom in jaxpr.outvars]


def _scan_input_counts(params: dict[str, Any]) -> tuple[int, int]:
    """How many of a scan's inputs are constants and how many the carry (the rest are sequences)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    # JAX 0.11 and later describe the flat inputs by a tree (constants, carry, sequences), each
    # group's length its number of flat inputs
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def _scan_unrolled(params: dict[str, Any], values: Sequence[Any]) -> list[Any]:
    body, length = params["jaxpr"], params["length"]
    consts_count, carry_count = _scan_input_counts(params)
    consts, carry = list(values[:consts_count]), list(values[consts_count:consts_count + carry_count])
    sequences = values[consts_count + carry_count:]
    steps = range(length - 1, -1, -1) if params.get("reverse", False) else range(length)
    stacked: list[list[Any]] = []
    for step in steps:
        slices = [lax.index_in_dim(sequence, step, keepdims=False) for sequence in sequences]
        outputs = evaluate_unrolled(body.jaxpr, body.consts, *consts, *carry, *slices)
        carry = list(outputs[:carry_count])
        stacked.append(list(outputs[carry_count:]))
    if params.get("reverse", False):
        stacked.reverse()
    per_output = zip(*stacked, strict=True) if stacked else []
    return carry + [jnp.stack(values) for values in per_output]


def unrolled(closed: Any, leaves: Sequence[Any]) -> Any:
    """``closed`` traced again with its scans unrolled, or ``closed`` itself if it has none.

    Parameters
    ----------
    closed : jax.extend.core.ClosedJaxpr
        The traced function.
    leaves : sequence
        Example inputs.

    Returns
    -------
    jax.extend.core.ClosedJaxpr
        A jaxpr without scans.
    """
    if not has_loops(closed.jaxpr):
        return closed
    return jax.make_jaxpr(lambda *flat: evaluate_unrolled(closed.jaxpr, closed.consts, *flat))(*leaves)
