"""``fxlrp.jax.convert`` and ``fxlrp.jax.attribute``: LRP for JAX functions by rewriting their jaxpr.

:func:`convert` traces the function with ``jax.make_jaxpr``, flattens nested calls and groups the
equations into operations (:mod:`fxlrp.jax.graph`). The function it returns evaluates the jaxpr:
equations of moves, selections, ReLU and max pooling run as they are (their vector-Jacobian
products route relevance); each affine operation (a dense layer or convolution with its bias, a
sum, an average pooling) and each activation or rescaling runs as a function with a
``jax.custom_vjp`` whose backward is its rule, read from the composite
(:meth:`fxlrp.rules.composites.Composite.resolve`, as on the PyTorch side) and computed by
:mod:`fxlrp.jax.formulas`. So ``jax.vjp`` of the explanation, started from the output relevance,
gives the relevance of the inputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fxlrp.explain.loader  # noqa: F401  (registers the operations found by name below)
from fxlrp.errors import ExplanationInputError, UnsupportedOperationError
from fxlrp.jax import formulas
from fxlrp.jax.graph import (
    FLAX_NORMALISATIONS,
    HELD,
    Group,
    Program,
    Var,
    flatten,
    groups,
    is_floating,
    source_line,
    value_of,
)
from fxlrp.jax.loops import unrolled
from fxlrp.registry import registered_operation
from fxlrp.relevance.roles import GATE
from fxlrp.rules import Pass, Product, Rule
from fxlrp.rules.composites import Composite, Site, as_composite


class Explanation:
    """A JAX function whose outputs are the original function's and whose ``jax.vjp`` gives relevance.

    Made by :func:`convert`; call it as the function (it composes with ``jax.jit``).
    """

    def __init__(self, fn: Callable[..., Any], composite: Composite, closed: Any, program: Program,
                 plan: list[tuple[Group, Rule | None]], in_tree: Any, out_tree: Any) -> None:
        self.fn, self.composite, self.jaxpr = fn, composite, closed
        self._program, self._plan, self._in_tree, self._out_tree = program, plan, in_tree, out_tree
        self._shapes = [(var.aval.shape, var.aval.dtype) for var in program.inputs]

    def __call__(self, *args: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != self._in_tree or [(np.shape(leaf), jnp.result_type(leaf)) for leaf in leaves] != self._shapes:
            raise ExplanationInputError(
                "fxlrp.jax: the explanation was traced for inputs of shapes "
                f"{[shape for shape, _ in self._shapes]}; call fxlrp.jax.convert again for inputs of another "
                "shape, dtype or structure"
            )
        return jax.tree_util.tree_unflatten(self._out_tree, evaluate(self._program, self._plan, leaves))

    def report(self) -> str:
        """Each operation that has a rule, its rule and the user's source line.

        Returns
        -------
        str
            One line per operation.
        """
        lines = []
        for group, rule in self._plan:
            if group.kind in ("affine", "pass"):
                lines.append(f"{group.operation:10s} {rule!r:60s} {source_line(group.equations[0].source_info)}")
        return "\n".join(lines)


def convert(fn: Callable[..., Any], composite: Composite | Rule | None = None, *example_args: Any) -> Callable:
    """Make a JAX function explainable by LRP.

    ``convert(fn, composite)`` returns a converter to call with example inputs, or, given them,
    the explanation itself: ``explain = convert(fn, composite, x)``. The inputs fix the shapes the
    jaxpr is traced for; floating-point inputs carry relevance, integer inputs (indices,
    segment ids) do not.

    Parameters
    ----------
    fn : callable
        A pure function of arrays: ``functools.partial(model.apply, variables)`` for Flax linen,
        an NNX module (``nnx.split``/``merge`` or the module itself), any function.
    composite : Composite, Rule or None
        The rules, as for :func:`fxlrp.convert`: a composite of :mod:`fxlrp.rules.composites`,
        a single rule for every layer, or None (``Epsilon(1e-6)``).
    *example_args
        Example inputs (arrays or pytrees of arrays).

    Returns
    -------
    callable
        An :class:`Explanation` (with ``example_args``), else ``lambda *args: convert(fn,
        composite, *args)``.

    Raises
    ------
    UnsupportedOperationError
        If a primitive without a rule receives relevance; it names the primitive and your source
        line.
    """
    if not example_args:
        return lambda *args: convert(fn, composite, *args)
    composite = as_composite(composite)
    leaves, in_tree = jax.tree_util.tree_flatten(example_args)
    closed, out_shape = jax.make_jaxpr(lambda *flat: fn(*jax.tree_util.tree_unflatten(in_tree, flat)),
                                       return_shape=True)(*leaves)
    out_tree = jax.tree_util.tree_structure(out_shape)
    program = flatten(unrolled(closed, leaves))
    carrying = [is_floating(var.aval) for var in program.inputs]
    plan = _plan(groups(program, carrying), composite, program)
    return Explanation(fn, composite, closed, program, plan, in_tree, out_tree)


_NO_RULE_IN_PYTORCH = ("no LRP rule, as on the PyTorch side (fxlrp.convert refuses it too); inside jax.nn's "
                       "activations and softmax it is explained with them")
WHY_NO_RULE = {
    "while": "a while loop (jax.lax.while_loop, or fori_loop with bounds that are arrays) whose number of steps "
             "depends on the inputs (or exceeds 1000): it is known only when the loop runs, and JAX cannot "
             "differentiate such a loop backwards; give fori_loop Python int bounds or write the loop with "
             "jax.lax.scan (both are explained step by step)",
    "pow": "a power whose exponent depends on the input (x ** y, 2 ** x) has no LRP rule, as on the PyTorch side; "
           "compute the exponent from constants (x ** 2, x ** 0.5 take the identity rule)",
    **{name: _NO_RULE_IN_PYTORCH for name in ("exp", "exp2", "expm1", "log", "log1p")},
    **{name: "a square root outside Flax's LayerNorm and RMSNorm (a normalisation written by hand) has no rule; "
             "fxlrp holds the root of those modules constant: hold yours constant with jax.lax.stop_gradient"
       for name in ("sqrt", "rsqrt")},
}
"""Why a primitive has no rule, and what to do, for the primitives models use most."""


def _plan(found: list[Group], composite: Composite, program: Program) -> list[tuple[Group, Rule | None]]:
    """The rule of each group; the first layer is found as on the PyTorch side."""
    missing = [group for group in found if group.kind == "unsupported"]
    if missing:
        lines = "\n".join(f"  {group.operation} at {source_line(group.equations[0].source_info)}"
                          + (f": {WHY_NO_RULE[group.operation]}" if group.operation in WHY_NO_RULE else "")
                          for group in missing)
        raise UnsupportedOperationError(
            "fxlrp.jax: these primitives receive relevance but have no rule:\n" + lines + "\n"
            "Treat their inputs as constants (jax.lax.stop_gradient) if they should receive no relevance, or "
            "write the computation with operations fxlrp.jax explains (see docs/jax.md, 'What is covered')."
        )
    after_first: set[int] = set()
    plan: list[tuple[Group, Rule | None]] = []
    for number, group in enumerate(found):
        rule: Rule | None = None
        if group.kind == "pass":
            rule = Pass()
        elif group.kind == "affine":
            operation = registered_operation(group.operation)
            weighted = operation.propagation.weighted
            candidate = composite.counts_as_first_layer(group.operation, weighted)
            first = candidate and not any(id(var) in after_first for var in group.carrying)
            site = Site(f"{group.operation}_{number}", group.operation, weighted, None, None, first,
                        relevance_factors=len(group.carrying) if group.operation in ("mul", "matmul") else 0)
            rule = composite.resolve(site, operation)
            if rule is None:
                raise UnsupportedOperationError(f"fxlrp.jax: no rule for {group.operation}")
            formulas.formula_of(rule)  # a rule without a JAX formula is refused here, not in backward
            if isinstance(rule, Product) and len(group.carrying) > 1 and set(rule.constants) - {GATE}:
                raise UnsupportedOperationError(
                    f"fxlrp.jax: {rule!r} treats factors of the roles {rule.constants} as constants, but a jaxpr "
                    f"does not say which factor of the {group.operation} at "
                    f"{source_line(group.equations[0].source_info)} is attention weights or a gate; use AttnLRP "
                    "(the uniform product rule) or jax.lax.stop_gradient on the factor that should get no relevance"
                )
            if candidate or any(id(var) in after_first for var in group.carrying):
                after_first.add(id(group.output))
        if group.kind != "constant":
            sources = {id(atom) for eqn in group.equations for atom in eqn.inputs}
            if sources & after_first:
                after_first.update(id(var) for eqn in group.equations for var in eqn.outputs)
        plan.append((group, rule))
    return plan


def _bind(eqn: Any, values: Sequence[Any]) -> list[Any]:
    primitive = eqn.primitive
    params = primitive.get_bind_params(eqn.params)
    subfuns: list[Any] = []
    if isinstance(params, tuple):  # jax before 0.7: (subfuns, params)
        subfuns, params = params
    result = primitive.bind(*subfuns, *values, **params)
    return list(result) if primitive.multiple_results else [result]


def _run(equations: Sequence[Any], inputs: dict[int, Any], held: frozenset[str] = frozenset()) -> Any:
    """Run equations on values keyed by ``id(Var)``; the last equation's first output. Outputs of
    the primitives named in ``held`` are constants (``jax.lax.stop_gradient``)."""
    env = dict(inputs)
    for eqn in equations:
        values = _bind(eqn, [value_of(atom, env) for atom in eqn.inputs])
        if eqn.primitive.name in held:
            values = [jax.lax.stop_gradient(value) for value in values]
        for var, value in zip(eqn.outputs, values, strict=True):
            env[id(var)] = value
    return env[id(equations[-1].outputs[0])]


def _layer(group: Group, env: dict[int, Any]) -> formulas.Layer:
    """The affine map of a group as ``f(xs, w, b)``, with its constants read from ``env``."""
    first = group.equations[0]
    if group.operation in FLAX_NORMALISATIONS.values():  # sigma held constant: an affine map of x, parameters inside
        def linearised(xs: Sequence[Any], w: Any, b: Any) -> Any:
            values = {id(var): x for var, x in zip(group.carrying, xs, strict=True)}
            values.update({id(atom): env[id(atom)] for eqn in group.equations for atom in eqn.inputs
                           if isinstance(atom, Var) and id(atom) in env and id(atom) not in values})
            return _run(group.equations, values, HELD)

        return formulas.Layer(linearised, None, None)
    constants = {id(atom): value_of(atom, env) for eqn in group.equations for atom in eqn.inputs
                 if not any(atom is var for var in group.carrying)
                 and not any(atom is var for e in group.equations for var in e.outputs)}
    weight = None
    if group.weight_position is not None:
        weight = value_of(first.inputs[group.weight_position], env)
    bias = None if group.bias is None else value_of(group.bias, env)
    if group.epilogue:
        weight, bias = _folded(group, weight, bias, env)

    def apply(xs: Sequence[Any], w: Any, b: Any) -> Any:
        values = dict(constants)
        values.update({id(var): x for var, x in zip(group.carrying, xs, strict=True)})
        arguments = [value_of(atom, values) for atom in first.inputs]
        if group.weight_position is not None:
            arguments[group.weight_position] = w
        out = _bind(first, arguments)[0]
        if group.scale is not None:
            how, factor = group.scale
            factor = value_of(factor, values)
            out = out / factor if how == "div" else out * factor
        if b is not None:
            out = b + out if group.bias_first else out + b
        return out

    return formulas.Layer(apply, weight, bias, nonnegative=group.nonnegative)


def _folded(group: Group, weight: Any, bias: Any, env: dict[int, Any]) -> tuple[Any, Any]:
    """The weight and bias of a layer with the BatchNorm after it folded in, as on the PyTorch side.

    The BatchNorm's steps map the layer's output ``z`` to ``a z + d`` per output feature, so the
    folded layer has the weight ``a w`` (scaled along its output features) and the bias ``a b + d``.
    """
    output_axis, weight_axis = group.feature_axes
    shape = group.equations[0].outputs[0].aval.shape
    per_feature = [1] * len(shape)
    per_feature[output_axis] = shape[output_axis]
    factor: Any = 1.0
    shift: Any = 0.0
    for name, atom, constant_first in group.epilogue:
        value = value_of(atom, env)
        if name == "add":
            shift = shift + value
        elif name == "sub":
            factor, shift = (-factor, value - shift) if constant_first else (factor, shift - value)
        elif name == "mul":
            factor, shift = factor * value, shift * value
        else:
            factor, shift = factor / value, shift / value
    dtype = jnp.result_type(weight)
    factor = jnp.broadcast_to(jnp.asarray(factor, dtype), per_feature)
    shift = jnp.broadcast_to(jnp.asarray(shift, dtype), per_feature)
    along_weight = [1] * np.ndim(weight)
    along_weight[weight_axis] = shape[output_axis]
    folded_bias = shift if bias is None else factor * bias + shift
    return weight * factor.reshape(along_weight), folded_bias


def _explained(group: Group, rule: Rule, env: dict[int, Any]) -> Callable[..., Any]:
    """The group's computation as a function of its relevance-carrying inputs whose VJP is the rule."""
    formula = formulas.formula_of(rule)
    constant_atoms = [atom for eqn in group.equations for atom in eqn.inputs
                      if isinstance(atom, Var) and not any(atom is var for var in group.carrying)
                      and not any(atom is var for e in group.equations for var in e.outputs)]
    constants = [env[id(atom)] for atom in constant_atoms]

    def forward(xs: Sequence[Any], constant_values: Sequence[Any]) -> Any:
        local = {id(atom): value for atom, value in zip(constant_atoms, constant_values, strict=True)}
        local.update({id(var): x for var, x in zip(group.carrying, xs, strict=True)})
        return _run(group.equations, local)

    @jax.custom_vjp
    def explained(xs: tuple[Any, ...], constant_values: tuple[Any, ...]) -> Any:
        return forward(xs, constant_values)

    def explained_forward(xs: tuple[Any, ...], constant_values: tuple[Any, ...]) -> tuple[Any, Any]:
        output = forward(xs, constant_values)
        return output, (xs, constant_values, output)

    def explained_backward(saved: Any, relevance: Any) -> tuple[Any, Any]:
        xs, constant_values, output = saved
        local = {id(atom): value for atom, value in zip(constant_atoms, constant_values, strict=True)}
        if group.operation == "softmax":
            layer = formulas.Layer(None, None, None, axes=group.axes)
        else:
            layer = _layer(group, local) if group.kind == "affine" else None
        shares = formula(rule, layer, list(xs), output, relevance)
        shares = tuple(share.astype(x.dtype) for share, x in zip(shares, xs, strict=True))
        zeros = tuple(_zero_cotangent(value) for value in constant_values)
        return shares, zeros

    explained.defvjp(explained_forward, explained_backward)
    return lambda xs: explained(tuple(xs), tuple(constants))


def _zero_cotangent(value: Any) -> Any:
    if jnp.issubdtype(jnp.result_type(value), jnp.inexact):
        return jnp.zeros_like(value)
    return np.zeros(np.shape(value), dtype=jax.dtypes.float0)


def evaluate(program: Program, plan: list[tuple[Group, Rule | None]], arguments: Sequence[Any]) -> list[Any]:
    """Evaluate the program with each rule's group replaced by its explained function.

    Parameters
    ----------
    program : Program
        The flattened jaxpr.
    plan : list of (Group, Rule or None)
        The groups and their rules.
    arguments : sequence
        The input values.

    Returns
    -------
    list
        The output values.
    """
    env: dict[int, Any] = {id(var): value for var, value in zip(program.inputs, arguments, strict=True)}
    for group, rule in plan:
        if rule is None:
            for eqn in group.equations:
                values = _bind(eqn, [value_of(atom, env) for atom in eqn.inputs])
                for var, value in zip(eqn.outputs, values, strict=True):
                    env[id(var)] = value
            continue
        xs = [env[id(var)] for var in group.carrying]
        env[id(group.output)] = _explained(group, rule, env)(xs)
    return [value_of(atom, env) for atom in program.outputs]


def start_relevance(output: Any, target: Any) -> Any:
    """The relevance to start from: the output times a one-hot mask of ``target``.

    Parameters
    ----------
    output : array
        The explained output, ``[batch, classes]`` (or a scalar, or one value per sample).
    target : int, sequence of int, array or None
        A class index for every sample; one index per sample; None for each sample's highest
        output; or a float array of the output's shape, taken as the relevance itself.

    Returns
    -------
    array
        Of the output's shape.

    Raises
    ------
    ExplanationInputError
        For a float target of another shape than the output's, or a class index out of range
        (where the index is known: not while traced).
    """
    relevance, out_of_range = _start_relevance(output, target)
    if out_of_range is not None and not isinstance(out_of_range, jax.core.Tracer) and bool(out_of_range):
        raise _out_of_range(target, jnp.shape(output)[-1])
    return relevance


def _out_of_range(target: Any, classes: int) -> ExplanationInputError:
    return ExplanationInputError(f"fxlrp.jax: target {target} is out of range for {classes} classes")


def _start_relevance(output: Any, target: Any) -> tuple[Any, Any]:
    """:func:`start_relevance`'s relevance, and whether a class index is out of range (a boolean
    array, traced under ``jax.jit``; None where there is no class index to check)."""
    output = jnp.asarray(output)
    if isinstance(target, (list, tuple)):
        target = np.asarray(target)
    if target is not None and not isinstance(target, int) and jnp.issubdtype(jnp.result_type(target), jnp.floating):
        target = jnp.asarray(target, output.dtype)
        if target.shape != output.shape:
            raise ExplanationInputError(
                f"fxlrp.jax: a float target is the output relevance itself and needs the output's shape "
                f"{output.shape}, not {target.shape}; pass class indices as integers"
            )
        return target, None
    if output.ndim <= 1:
        if target is None:
            return output, None
        return jnp.zeros_like(output).at[target].set(output[target]), None
    classes = output.shape[-1]
    index = jnp.argmax(output, axis=-1) if target is None else jnp.broadcast_to(jnp.asarray(target), output.shape[:-1])
    mask = jax.nn.one_hot(index % classes, classes, dtype=output.dtype)
    return output * mask, jnp.any((index >= classes) | (index < -classes))


def _pulled_back(explain: Callable[..., Any], arguments: tuple[Any, ...], target: Any) -> tuple[Any, Any]:
    """The relevance of ``arguments`` (a tuple, one per argument) and whether the target's class
    index is out of range (see :func:`_start_relevance`)."""
    output, pull_back = jax.vjp(explain, *arguments)
    start, out_of_range = _start_relevance(output, target)
    return pull_back(start), out_of_range


_COMPILED: weakref.WeakKeyDictionary[Any, dict[bool, Callable[..., Any]]] = weakref.WeakKeyDictionary()
"""Per explanation, :func:`_pulled_back` under ``jax.jit`` (for a target of None, and for any other)."""


def _compiled(explain: Callable[..., Any], predicted: bool) -> Callable[..., Any] | None:
    """:func:`_pulled_back` of ``explain`` compiled by ``jax.jit``, made once per explanation
    (None where ``explain`` cannot be held by a weak reference: it is then run as it is)."""
    try:
        by_target = _COMPILED.setdefault(explain, {})
    except TypeError:
        return None
    if predicted not in by_target:
        if predicted:
            by_target[predicted] = jax.jit(lambda arguments: _pulled_back(explain, arguments, None))
        else:
            by_target[predicted] = jax.jit(lambda arguments, target: _pulled_back(explain, arguments, target))
    return by_target[predicted]


def attribute(explain: Callable[..., Any], inputs: Any, target: Any = None) -> Any:
    """The relevance of every input for ``target``.

    Called with arrays, the explanation runs compiled by ``jax.jit`` (once per explanation and
    shapes): run operation by operation, JAX would compile each operation of the first call
    separately, which takes many times longer. Called inside ``jax.jit``, ``jax.vmap`` or another
    transformation (traced inputs), it is traced as a part of the caller's function.

    Parameters
    ----------
    explain : callable
        What :func:`convert` returned (or a function of it, e.g. ``jax.jit(explain)``).
    inputs : array, tuple or list of arrays
        The inputs; a tuple or list is passed as positional arguments.
    target : int, sequence of int, array or None, default None
        As in :func:`start_relevance`: a class index, one per sample, None for the predicted
        class, or the output relevance itself.

    Returns
    -------
    array or tuple
        The relevance of ``inputs``, of their shapes (a tuple for several inputs; integer inputs
        get JAX's ``float0`` zeros).

    Raises
    ------
    ExplanationInputError
        As :func:`start_relevance`.
    """
    arguments = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if isinstance(target, (list, tuple)):
        target = np.asarray(target)
    traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves((arguments, target)))
    compiled = None if traced else _compiled(explain, target is None)
    if compiled is None:
        relevance, out_of_range = _pulled_back(explain, arguments, target)
    else:
        relevance, out_of_range = compiled(arguments) if target is None else compiled(arguments, target)
    if out_of_range is not None and not isinstance(out_of_range, jax.core.Tracer) and bool(out_of_range):
        raise _out_of_range(target, jax.eval_shape(explain, *arguments).shape[-1])
    return relevance if isinstance(inputs, (tuple, list)) else relevance[0]


__all__ = ["Explanation", "attribute", "convert", "start_relevance"]
