"""A jaxpr as a flat list of equations, grouped into the operations fxlrp's rules explain.

:func:`flatten` inlines nested ``jit``/``pjit`` calls and ``custom_jvp``/``custom_vjp`` calls
(ReLU's ``custom_jvp`` becomes its ``max``), except smooth activations (``gelu``, ``silu``, ...),
which stay one equation each: the identity rule explains them as a whole. :func:`groups` then
finds the affine operations: a ``dot_general`` or ``conv_general_dilated`` with a constant
operand (the weight) and the ``add`` of a constant that follows it (the bias), sums
(``add``, ``sub``, ``reduce_sum``, ``reduce_window_sum``, ``scatter-add``) with the division by
a constant that makes them a mean or an average pooling.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SMOOTH_ACTIVATIONS = frozenset({
    "gelu", "silu", "swish", "elu", "celu", "selu", "softplus", "sigmoid", "tanh", "mish", "hard_tanh",
    "soft_sign", "log_sigmoid", "hard_swish", "hard_silu", "hard_sigmoid", "glu", "squareplus", "sparse_plus",
})
"""Names of jax.nn's smooth activations, explained by the identity rule as on the PyTorch side."""
KEPT_WHOLE = SMOOTH_ACTIVATIONS | {"softmax"}
"""jax.nn functions whose equations are grouped into one operation (``softmax``: AttnLRP's rule)."""
FLAX_NORMALISATIONS = {"LayerNorm.__call__": "layer_norm", "RMSNorm.__call__": "rms_norm"}
"""Flax modules whose equations are grouped into one operation, by the function that runs them."""
HELD = frozenset({"rsqrt"})
"""Primitives whose outputs a normalisation's linearised map holds constant (``1 / sigma``)."""

NATIVE = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice", "concatenate",
    "pad", "rev", "convert_element_type", "copy", "copy_p", "gather", "select_n", "max", "min", "reduce_max",
    "reduce_min", "reduce_window_max", "reduce_window_min", "reduce_precision", "stop_gradient", "sharding_constraint",
    "optimization_barrier", "stack", "split",
})
"""Primitives whose own vector-Jacobian product routes relevance (moves, copies, selections,
ReLU's ``max`` and max pooling: the winner takes all)."""
SUMS = {"add": "add", "add_any": "add", "sub": "sub", "reduce_sum": "sum", "reduce_window_sum": "avg_pool",
        "scatter-add": "sum", "scatter_add": "sum", "cumsum": "cumsum"}
"""Sum primitives and the canonical operation whose rule they get (``reduce_window_sum`` alone is
a sum pooling, explained as average pooling is)."""
POWERS = frozenset({"integer_pow", "square", "pow"})
"""Powers ``x ** p`` (``p`` constant): the identity rule of the registered operation ``pow``, as
``torch.pow`` on the PyTorch side (squared ReLU, StarReLU); an exponent that carries relevance
has no rule."""
SCALINGS = frozenset({"mul", "div", "neg"})
"""Rescalings by a constant: relevance passes (``R_x = R_z``), as on the PyTorch side."""


class Var:
    """A value of the flattened program (one per jaxpr variable, nested calls included)."""

    __slots__ = ("aval",)

    def __init__(self, aval: Any) -> None:
        self.aval = aval

    def __repr__(self) -> str:
        return f"Var({self.aval})"


@dataclass
class Constant:
    """A literal or a closed-over constant of the program."""

    value: Any


Atom = Var | Constant


@dataclass
class Equation:
    """One equation of the flattened program."""

    primitive: Any
    params: dict[str, Any]
    inputs: list[Atom]
    outputs: list[Var]
    source_info: Any
    activation: str | None = None
    """The smooth activation this equation (a call kept whole) is, or None."""
    effects: bool = False
    """Whether the equation has side effects (kept even if its results are unused)."""

    @property
    def name(self) -> str:
        return self.activation or self.primitive.name


@dataclass
class Program:
    """A flattened jaxpr."""

    inputs: list[Var]
    outputs: list[Atom]
    equations: list[Equation] = field(default_factory=list)


def _is_literal(atom: Any) -> bool:
    return type(atom).__name__ == "Literal"


def flatten(closed: Any) -> Program:
    """Flatten a ``ClosedJaxpr`` into one list of equations.

    Parameters
    ----------
    closed : jax.extend.core.ClosedJaxpr
        What ``jax.make_jaxpr`` returned.

    Returns
    -------
    Program
        The program with nested calls inlined.
    """
    inputs = [Var(var.aval) for var in closed.jaxpr.invars]
    program = Program(inputs, [])
    program.outputs = _inline(closed.jaxpr, closed.consts, inputs, program.equations)
    program.equations = _live(program.equations, program.outputs)
    return program


def _live(equations: list[Equation], outputs: list[Atom]) -> list[Equation]:
    """The equations whose results reach the outputs (or that have effects): values a function
    computes and drops (a scan's unused outputs) carry no relevance."""
    needed = {id(atom) for atom in outputs if isinstance(atom, Var)}
    kept: list[Equation] = []
    for eqn in reversed(equations):
        if eqn.effects or any(id(var) in needed for var in eqn.outputs):
            kept.append(eqn)
            needed.update(id(atom) for atom in eqn.inputs if isinstance(atom, Var))
    kept.reverse()
    return kept


def _activation_of(primitive: Any, params: dict[str, Any]) -> str | None:
    name = params.get("name")
    if primitive.name in ("jit", "pjit", "custom_jvp_call", "custom_vjp_call") and name in SMOOTH_ACTIVATIONS:
        return name
    return None


def _inline(jaxpr: Any, consts: Any, arguments: list[Atom], equations: list[Equation],
            caller: Any = None) -> list[Atom]:
    env: dict[Any, Atom] = {}
    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = Constant(value)
    for var, value in zip(jaxpr.invars, arguments, strict=True):
        env[var] = value

    def read(atom: Any) -> Atom:
        return Constant(atom.val) if _is_literal(atom) else env[atom]

    for eqn in jaxpr.eqns:
        inputs = [read(atom) for atom in eqn.invars]
        name = eqn.primitive.name
        inner = eqn.params.get("jaxpr") if name in ("jit", "pjit") else eqn.params.get("call_jaxpr") \
            if name in ("custom_jvp_call", "custom_vjp_call") else None
        source_info = eqn.source_info
        if caller is not None and source_line(source_info) == "unknown":
            source_info = caller  # a jitted function of JAX's (jnp.cumsum): the line that called it
        if inner is not None and _activation_of(eqn.primitive, eqn.params) is None:
            results = _inline(inner.jaxpr, inner.consts, inputs, equations, source_info)
            for var, value in zip(eqn.outvars, results, strict=True):
                env[var] = value
            continue
        outputs = [Var(var.aval) for var in eqn.outvars]
        for var, value in zip(eqn.outvars, outputs, strict=True):
            env[var] = value
        equations.append(Equation(eqn.primitive, dict(eqn.params), inputs, outputs, source_info,
                                  _activation_of(eqn.primitive, eqn.params), bool(eqn.effects)))
    return [read(atom) for atom in jaxpr.outvars]


def _nn_activation_frame(source_info: Any) -> tuple[str, str] | None:
    """The jax.nn smooth activation whose code made an equation, and where it was called."""
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return None
    frames = traceback.frames
    for index, frame in enumerate(frames):
        path = frame.file_name.replace("\\", "/")
        name = None
        if path.endswith("jax/_src/nn/functions.py") and frame.function_name in KEPT_WHOLE:
            name = frame.function_name
        elif path.endswith("flax/linen/normalization.py") and frame.function_name in FLAX_NORMALISATIONS:
            name = FLAX_NORMALISATIONS[frame.function_name]
        if name is not None:
            caller = frames[index + 1] if index + 1 < len(frames) else frame
            return name, f"{caller.file_name}:{caller.line_num}"
    return None


def is_floating(aval: Any) -> bool:
    """Whether values of ``aval`` can carry relevance (floating point)."""
    return jnp.issubdtype(aval.dtype, jnp.floating) or jnp.issubdtype(aval.dtype, jnp.complexfloating)


@dataclass
class Group:
    """Equations explained together by one rule (or natively)."""

    kind: str
    """``"native"``, ``"constant"`` (no relevance-carrying input), ``"affine"``, ``"pass"`` or
    ``"unsupported"``."""
    equations: list[Equation]
    operation: str = ""
    """The canonical operation (``"linear"``, ``"conv"``, ``"add"``, ``"avg_pool"``, ...)."""
    carrying: list[Var] = field(default_factory=list)
    """The relevance-carrying inputs, in order."""
    output: Var | None = None
    weight_position: int | None = None
    """Position of the weight among the first equation's inputs (``dot_general``, convolution)."""
    bias: Atom | None = None
    """The constant added after the first equation (a bias), if any."""
    bias_first: bool = False
    axes: tuple[int, ...] | None = None
    """The axes a softmax normalises over."""
    nonnegative: tuple[bool, ...] = ()
    """Whether each relevance-carrying input is never negative (behind a ReLU), known from the
    program: the rules' terms of negative inputs are then left out."""
    scale: tuple[str, Atom] | None = None
    """``("mul" | "div", constant)`` applied after a sum (a mean, average pooling)."""
    feature_axes: tuple[int, int] | None = None
    """The output's feature axis and the weight's axis of output features (a dense layer or a
    convolution whose weight is its second operand), along which a BatchNorm is folded."""
    epilogue: list[tuple[str, Atom, bool]] = field(default_factory=list)
    """A folded BatchNorm: ``(primitive, constant, constant first)`` for each of its ``sub``,
    ``mul``, ``div`` and ``add`` of a constant per output feature, in order."""


def source_line(source_info: Any) -> str:
    """The user's source line of an equation, as ``file:line (function)``.

    Parameters
    ----------
    source_info : jax source info
        An equation's ``source_info``.

    Returns
    -------
    str
        The innermost frame outside JAX, Flax, jraph and fxlrp, or ``"unknown"``.
    """
    traceback = getattr(source_info, "traceback", None)
    frames = [] if traceback is None else traceback.frames
    for frame in frames:
        if os.path.abspath(frame.file_name).startswith(_library_folders()):
            continue
        return f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
    return "unknown"


@cache
def _library_folders() -> tuple[str, ...]:
    """The folders of JAX, jaxlib, Flax, jraph (those installed) and fxlrp's JAX package, each with a
    trailing separator: frames in their files are never the user's. (Folders, not names in the
    path: a user's project under a folder named ``jax`` is still the user's.)"""
    folders = [os.path.dirname(os.path.abspath(__file__))]
    for library in ("jax", "jaxlib", "flax", "jraph"):
        spec = importlib.util.find_spec(library)
        if spec is not None and spec.submodule_search_locations:
            folders.extend(os.path.abspath(location) for location in spec.submodule_search_locations)
    return tuple(folder.rstrip(os.sep) + os.sep for folder in folders)


def groups(program: Program, carrying_inputs: list[bool]) -> list[Group]:
    """Group the program's equations into the operations that rules explain.

    Parameters
    ----------
    program : Program
        The flattened program.
    carrying_inputs : list of bool
        Which of the program's inputs carry relevance.

    Returns
    -------
    list of Group
        In program order.
    """
    uses: Counter[int] = Counter()
    for eqn in program.equations:
        for atom in eqn.inputs:
            if isinstance(atom, Var):
                uses[id(atom)] += 1
    for atom in program.outputs:
        if isinstance(atom, Var):
            uses[id(atom)] += 1
    carries: set[int] = {id(var) for var, flag in zip(program.inputs, carrying_inputs, strict=True) if flag}

    def carrying(atom: Atom) -> bool:
        return isinstance(atom, Var) and id(atom) in carries

    def constant(atom: Atom) -> bool:
        return not carrying(atom)

    equations = _activation_runs(program.equations)
    result: list[Group] = []
    index = 0
    while index < len(equations):
        run = equations[index]
        index += 1
        eqn = run[0]
        outputs = [var for e in run for var in e.outputs]
        inputs = [atom for e in run for atom in e.inputs if not any(atom is var for var in outputs)]
        carried = [atom for atom in inputs if carrying(atom)]
        if not carried or (len(run) == 1 and eqn.primitive.name == "stop_gradient"):
            result.append(Group("constant", run))  # stop_gradient: a constant of the explanation
            continue
        if not any(is_floating(var.aval) for var in outputs):
            result.append(Group("native", run))  # comparisons, argmax: their integer results carry no relevance
            continue
        for var in outputs:
            if is_floating(var.aval):
                carries.add(id(var))
        if eqn.activation == "softmax":
            sums = [e for e in run if e.primitive.name == "reduce_sum"]
            axes = tuple(sums[0].params["axes"]) if len(sums) == 1 else None
            group = Group("affine" if axes is not None else "unsupported", run, "softmax", _unique(carried),
                          run[-1].outputs[0], axes=axes)
            result.append(group)
            continue
        if eqn.activation in FLAX_NORMALISATIONS.values():
            result.append(Group("affine", run, eqn.activation, _unique(carried), run[-1].outputs[0]))
            continue
        if len(run) > 1 or eqn.activation is not None:
            last = run[-1].outputs[0]
            result.append(Group("pass", run, eqn.name, _unique(carried), last))
            continue
        name = eqn.primitive.name
        if name in NATIVE:
            result.append(Group("native", run))
            continue
        output = eqn.outputs[0]
        consumer = _consumer(equations, index, output, carrying) if uses[id(output)] == 1 else None
        following = None if consumer is None else equations[consumer][0]

        def follows(names: tuple[str, ...], ok: Any) -> bool:
            return following is not None and following.primitive.name in names and ok(following)

        def fuse(group: Group) -> int:
            """Emit the constant equations before the follower, then take the follower into ``group``."""
            for between in equations[index:consumer]:
                result.append(Group("constant", between))
            group.equations.append(following)
            group.output = following.outputs[0]
            carries.add(id(group.output))
            return consumer + 1

        if name in ("dot_general", "conv_general_dilated"):
            group = Group("affine", [eqn], "linear" if name == "dot_general" else "conv", _unique(carried), output)
            if len(carried) == 1 and constant(eqn.inputs[1 - eqn.inputs.index(carried[0])]):
                group.weight_position = 1 if eqn.inputs[0] is carried[0] else 0
                if follows(("add",), lambda e: sum(constant(atom) for atom in e.inputs) == 1):
                    other = [atom for atom in following.inputs if atom is not output][0]
                    group.bias, group.bias_first = other, following.inputs[0] is other
                    index = fuse(group)
                group.feature_axes = _feature_axes(eqn, group.weight_position)
                while group.feature_axes is not None:  # a BatchNorm in evaluation mode: folded into the layer
                    last = group.output
                    consumer = _consumer(equations, index, last, carrying) if uses[id(last)] == 1 else None
                    following = None if consumer is None else equations[consumer][0]
                    step = _batch_norm_step(following, last, constant, group.feature_axes[0])
                    if step is None:
                        break
                    group.epilogue.append(step)
                    index = fuse(group)
            else:
                group.operation = "matmul"
            result.append(group)
            continue
        if name in SUMS:
            group = Group("affine", [eqn], SUMS[name], _unique(carried), output)
            if name in ("reduce_sum", "reduce_window_sum") and follows(
                    ("div", "mul"), lambda e: len(e.inputs) == 2 and constant(e.inputs[1 if e.inputs[0] is output
                                                                                      else 0])
                    and (e.primitive.name == "mul" or e.inputs[0] is output)):
                other = [atom for atom in following.inputs if atom is not output][0]
                group.scale = (following.primitive.name, other)
                group.operation = "mean" if name == "reduce_sum" else "avg_pool"
                index = fuse(group)
            result.append(group)
            continue
        if name == "mul":
            if all(carrying(atom) for atom in eqn.inputs):
                result.append(Group("affine", [eqn], "mul", _unique(carried), output))
            else:
                result.append(Group("pass", [eqn], "mul", carried, output))
            continue
        if name in ("tanh", "logistic"):
            result.append(Group("pass", [eqn], name, carried, output))
            continue
        if name in POWERS and all(constant(atom) for atom in eqn.inputs[1:]):
            result.append(Group("pass", [eqn], "pow", carried, output))
            continue
        if name in ("div", "neg") and (name == "neg" or constant(eqn.inputs[1])):
            result.append(Group("pass", [eqn], name, carried, output))
            continue
        result.append(Group("unsupported", [eqn], name, carried, output))
    _mark_nonnegative(result)
    return result


NONNEGATIVE_SUMS = frozenset({"add", "sum", "avg_pool", "mean", "cumsum"})
"""Operations of sums whose output is never negative where none of their operands is."""


def _mark_nonnegative(found: list[Group]) -> None:
    """Set each group's ``nonnegative``: which relevance-carrying inputs are known never to be negative.

    A value is never negative if it is a constant that is not, ReLU's ``max(x, 0)``, a move or
    maximum of such values, or a sum, average or rescaling by a constant of values none of which
    is negative (an average pooling after a ReLU). The rules then leave out the terms of negative
    inputs, which are 0 (z+ after a pooling needs no convolution with the negative weights).
    """
    nonnegative: set[int] = set()

    def known(atom: Atom) -> bool:
        if isinstance(atom, Constant):  # a value traced by an enclosing jit is not known
            return not isinstance(atom.value, jax.core.Tracer) and bool(np.all(np.asarray(atom.value) >= 0))
        return id(atom) in nonnegative

    for group in found:
        group.nonnegative = tuple(id(var) in nonnegative for var in group.carrying)
        if group.kind in ("native", "constant"):
            for eqn in group.equations:
                if _keeps_nonnegative(eqn, known):
                    nonnegative.add(id(eqn.outputs[0]))
        elif (group.kind == "affine" and group.operation in NONNEGATIVE_SUMS) or (
                group.kind == "pass" and group.operation in ("mul", "div") and len(group.equations) == 1):
            inside = {id(var) for eqn in group.equations for var in eqn.outputs}
            if all(known(atom) for eqn in group.equations for atom in eqn.inputs
                   if not (isinstance(atom, Var) and id(atom) in inside)):
                nonnegative.add(id(group.output))


MOVES = frozenset({"reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice",
                   "reduce_max", "reduce_window_max", "gather", "rev", "convert_element_type", "copy", "copy_p"})


def _keeps_nonnegative(eqn: Equation, known: Any) -> bool:
    """Whether an equation's output is never negative: ReLU's ``max(x, 0)``, or a move or
    maximum of values that are never negative (``known(atom)``)."""
    if eqn.primitive.name == "max":
        return any(known(atom) for atom in eqn.inputs)
    if eqn.primitive.name in MOVES:
        return known(eqn.inputs[0])
    if eqn.primitive.name == "concatenate":
        return all(known(atom) for atom in eqn.inputs)
    return False


BATCH_NORM_FRAMES = (("flax/linen/normalization.py", "BatchNorm.__call__"),
                     ("flax/nnx/nn/normalization.py", "BatchNorm.__call__"))
"""Where Flax's BatchNorm modules run (file, function)."""


def _feature_axes(eqn: Equation, weight_position: int | None) -> tuple[int, int] | None:
    """The output's feature axis and the weight's output-feature axis of a dense layer or a
    convolution whose weight is its second operand, or None (a weight first, batched products)."""
    if weight_position != 1:
        return None
    output_rank = len(eqn.outputs[0].aval.shape)
    if eqn.primitive.name == "conv_general_dilated":
        if eqn.params.get("batch_group_count", 1) != 1:
            return None
        numbers = eqn.params["dimension_numbers"]
        return numbers.out_spec[1], numbers.rhs_spec[0]
    (_, contracting), (_, batch) = eqn.params["dimension_numbers"]
    free = [axis for axis in range(len(_shape(eqn.inputs[1]))) if axis not in contracting]
    if batch or len(free) != 1:
        return None
    return output_rank - 1, free[0]


def _shape(atom: Atom) -> tuple[int, ...]:
    return tuple(np.shape(atom.value)) if isinstance(atom, Constant) else tuple(atom.aval.shape)


def _batch_norm_step(eqn: Equation | None, last: Var, constant: Any,
                     feature_axis: int) -> tuple[str, Atom, bool] | None:
    """``(primitive, constant, constant first)`` if ``eqn`` is a step of a Flax BatchNorm in
    evaluation mode on ``last``: a subtraction, product, quotient or sum with a constant that is
    one value per feature (the running mean, the scale over the running deviation, the bias)."""
    if eqn is None or eqn.primitive.name not in ("add", "sub", "mul", "div") or len(eqn.inputs) != 2:
        return None
    frames = getattr(getattr(eqn.source_info, "traceback", None), "frames", None) or []
    if not any(frame.file_name.replace("\\", "/").endswith(path) and frame.function_name == function
               for frame in frames for path, function in BATCH_NORM_FRAMES):
        return None
    first = eqn.inputs[0] is last
    other = eqn.inputs[1] if first else eqn.inputs[0]
    if other is last or not constant(other) or (eqn.primitive.name == "div" and not first):
        return None
    shape, rank = _shape(other), len(last.aval.shape)
    if len(shape) > rank or any(size != 1 and axis != feature_axis
                                for axis, size in zip(range(rank - len(shape), rank), shape, strict=True)):
        return None
    return eqn.primitive.name, other, not first


def _consumer(equations: list[list[Equation]], start: int, output: Var, carrying: Any) -> int | None:
    """The index of the run that consumes ``output`` if only constant single equations come before it."""
    for position in range(start, len(equations)):
        run = equations[position]
        if len(run) != 1:
            return None
        if any(atom is output for atom in run[0].inputs):
            return position
        if any(carrying(atom) for atom in run[0].inputs):
            return None
    return None


def _unique(atoms: list[Atom]) -> list[Var]:
    seen: list[Var] = []
    for atom in atoms:
        if not any(atom is var for var in seen):
            seen.append(atom)  # type: ignore[arg-type]
    return seen


def _activation_runs(equations: list[Equation]) -> list[list[Equation]]:
    """Equations in runs: the consecutive equations of one call of a jax.nn smooth activation
    (``gelu`` inlined by JAX) form one run, every other equation a run of its own."""
    runs: list[list[Equation]] = []
    previous: tuple[str, str] | None = None
    for eqn in equations:
        key = _nn_activation_frame(eqn.source_info) if eqn.activation is None else None
        if key is not None and key == previous:
            runs[-1].append(eqn)
        else:
            runs.append([eqn])
        previous = key
    for run in runs:
        if len(run) > 1:
            run[0].activation = run[0].activation or _nn_activation_frame(run[0].source_info)[0]
    return runs


def value_of(atom: Atom, env: dict[int, Any]) -> Any:
    """The value of an atom in an environment keyed by ``id(Var)``."""
    return np.asarray(atom.value) if isinstance(atom, Constant) and np.isscalar(atom.value) else \
        atom.value if isinstance(atom, Constant) else env[id(atom)]
