"""Inputs fxlrp cannot explain as given, and NaN or Inf: errors that say where, not NaN heatmaps.

A NaN anywhere in an input spreads through every layer it reaches, and an activation that
overflows (float16's largest value is 65504) makes the explained output, or the relevance of
everything below it, Inf or NaN. Returned as relevance, either looks like an explanation. So
:func:`fxlrp.attribute` checks the floating-point inputs, the explained output and the relevance
(one pass over each, small next to the explanation), and reads the three answers on the host
together at the end of the call (:class:`FiniteChecks`: one device synchronisation per call);
``check_finite=False`` turns the checks off for inputs whose NaN and Inf are meant.

Inputs the model itself would not take (no batch dimension, another dtype or device than its
parameters) are the model's to refuse, in its own words, not a failure deep inside the relevance
machinery. Three checks, none of which costs an explanation of valid inputs a forward pass:

- before anything runs, what is not a tensor where the model takes one: a NumPy array, a list
  of numbers (``x.tolist()``, a tokenizer's output without ``return_tensors="pt"``), text
  (:func:`refuse_unusable_inputs`);
- before anything runs, the number of dimensions a BatchNorm near an input checks: the explainer
  computes BatchNorm as its affine map (or folds it into the layer before it), which broadcasts
  where the module raised ``expected 4D input (got 3D input)``, so a missing batch dimension could
  be explained where the model refuses it. :func:`recorded_rank_checks` records at conversion the
  BatchNorms an input reaches through layers that keep its number of dimensions (convolutions,
  linear layers, activations, pooling, dropout) with what each says to which number
  (:class:`RankCheck`), and :func:`refuse_ranks_the_model_refuses` compares;
- when the explanation fails anyway, the model is asked (:func:`input_rejection`): it runs once on
  the inputs as given (evaluation mode, no gradients, its modules' attributes put back), and if it
  fails too, the error is the model's own message with what to do (the input's dtype or device
  against the parameters', a missing batch dimension), raised from the model's own error; if the
  model takes the inputs, the explanation's error is raised as it was. An input on the meta device
  that the model takes (an embedding looks meta ids up without complaint) holds nothing to explain
  (:func:`refuse_inputs_without_values`).

These errors are :class:`~fxlrp.errors.ExplanationInputError`; the public functions raise them
from their own call (:func:`raised_from_the_call`), without the frames of fxlrp that found them.
"""

from __future__ import annotations

import cmath
import functools
import re
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.errors import ExplanationInputError, FxlrpError, VanishedRelevanceWarning
from fxlrp.explain.placement import tensors_used
from fxlrp.registry import REGISTRY

TURN_OFF = "pass check_finite=False to fxlrp.attribute to explain it as it is"


class FiniteChecks:
    """The NaN and Inf checks of one explanation and its check for vanished relevance, read on the
    host together at its end.

    Each check keeps, per checked tensor, a sum of its values on the tensor's device: NaN or Inf
    where one of the values is (or, for values near their dtype's largest, where the sum of finite
    values overflows). :meth:`refuse` reads every sum and total at once - one device
    synchronisation per call, one operation (a stack) per device - and where a sum is not finite
    calls the refusals in the order the checks were made (inputs, explained output, relevance);
    each refusal checks its values exactly, so the error is the first failing check's, with its
    counts, and an overflowed sum of finite values raises nothing. The relevance's check reuses
    the totals that the check for vanished relevance sums anyway (:meth:`compare_totals`).
    """

    def __init__(self) -> None:
        self._sums: list[Tensor] = []
        self._refusals: list[Callable[[], None]] = []
        self._totals: tuple[list[Tensor], list[Tensor]] = ([], [])

    def check(self, values: Any, refusal: Callable[[], None]) -> None:
        """Check the floating-point (and complex) tensors in ``values`` (a tensor, or tuples, lists
        and dicts of them); ``refusal`` raises their error."""
        with torch.no_grad():
            # One operation per tensor; 16-bit values summed in float32, where the sum of finite
            # values does not overflow.
            sums = [value.sum(dtype=torch.float32) if value.is_floating_point() and value.element_size() < 4
                    else value.sum() for value in _tensors(values)
                    if (value.is_floating_point() or value.is_complex()) and value.device.type != "meta"]
        self.check_sums(sums, refusal)

    def check_sums(self, sums: Sequence[Tensor], refusal: Callable[[], None]) -> None:
        """Check sums already made (one-element tensors, not finite where the values they sum are
        not); ``refusal`` raises the error of the values."""
        if sums:
            self._sums += sums
            self._refusals.append(refusal)

    def compare_totals(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor]) -> None:
        """Warn at :meth:`refuse` where, for some target, the relevance reaching the inputs has
        vanished (:func:`warn_of_vanished_relevance`); per target, the summed absolute relevance
        the explanation started from and the one reaching the inputs (one-element tensors)."""
        self._totals[0].extend(outputs)
        self._totals[1].extend(inputs)

    def refuse(self) -> None:
        """Raise the first failing check's error; else warn where relevance vanished. Every sum
        is read in one transfer per device."""
        outputs, inputs = self._totals
        read = _read_together(self._sums + outputs + inputs)
        if not all(cmath.isfinite(value) for value in read[:len(self._sums)]):
            for refusal in self._refusals:
                refusal()
        # (.real: a stack with a complex sum is complex)
        output_totals = [value.real for value in read[len(self._sums):len(self._sums) + len(outputs)]]
        input_totals = [value.real for value in read[len(self._sums) + len(outputs):]]
        vanished = [total < VANISHED_SHARE * output for output, total in zip(output_totals, input_totals, strict=True)]
        if inputs and any(vanished):
            warn_of_vanished_relevance(torch.tensor(output_totals), torch.tensor(input_totals), torch.tensor(vanished))


def _read_together(tensors: Sequence[Tensor]) -> list[Any]:
    """The values of one-element tensors as Python numbers, in order: one stack and one transfer
    per device."""
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    read: list[Any] = [None] * len(tensors)
    for indices in by_device.values():
        stacked = torch.stack([tensors[i] if tensors[i].dim() == 0 else tensors[i].reshape(()) for i in indices])
        for index, value in zip(indices, stacked.tolist(), strict=True):
            read[index] = value
    return read


def refuse_non_finite_inputs(explain: Any, inputs: Tensor | Sequence[Any]) -> None:
    """A :class:`ValueError` naming the first floating-point input with NaN or Inf."""
    single = isinstance(inputs, Tensor)
    values = (inputs,) if single else tuple(inputs)
    names = _input_names(explain, len(values))
    for position, value in enumerate(values):
        if not isinstance(value, Tensor) or not (value.is_floating_point() or value.is_complex()):
            continue
        if value.device.type == "meta":  # (no values to check; the model says whether it takes it)
            continue
        finite = torch.isfinite(value.detach())
        if bool(finite.all()):
            continue
        nan = int(torch.isnan(value.detach()).sum())
        infinite = int((~finite).sum()) - nan
        found = " and ".join(f"{count} {kind}" for count, kind in ((nan, "NaN"), (infinite, "Inf")) if count)
        where = "the input" if single else f"input {position}" + (f" ({names[position]!r})" if names else "")
        raise ValueError(
            f"{where} (shape {list(value.shape)}) contains {found} of its {value.numel()} values: its relevance, "
            f"and that of every value it meets in the model, would be NaN. Replace them (torch.nan_to_num, a "
            f"mask) or {TURN_OFF}"
        )


def refuse_inputs_without_values(explain: Any, inputs: Sequence[Any]) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` for an input on the meta device that the
    model took (an embedding looks meta ids up in a CPU table without complaint): it holds no
    values, so neither does its explanation. (Where the model refuses such an input, its own
    message is raised instead, see :func:`input_rejection`.)"""
    for position, value in enumerate(inputs):
        if isinstance(value, Tensor) and value.device.type == "meta":
            names = _model_names(explain)
            name = names[position] if position < len(names) else f"inputs[{position}]"
            _, devices = _model_placements(explain, model_of(explain))
            device = sorted(str(device) for device in devices if device.type != "meta")
            where = f": pass {name}.to({device[0]!r})" if device else ""
            raise ExplanationInputError(f"input {name!r} (shape {list(value.shape)}) is on the meta device, which "
                                        f"holds no values to explain; give it on the device of the model's "
                                        f"parameters{where}")


def refuse_non_finite_output(output: Tensor) -> None:
    """A :class:`ValueError` when the explained output has NaN or Inf: the model overflowed."""
    if bool(torch.isfinite(output.detach()).all()):
        return
    raise ValueError(
        f"the model's output is not finite (NaN or Inf in {int((~torch.isfinite(output.detach())).sum())} of its "
        f"{output.numel()} values) for finite inputs: an activation overflowed {_dtype_advice(output.dtype)}. "
        f"Its relevance would be NaN or Inf; {TURN_OFF}"
    )


def refuse_non_finite_relevance(relevance: Any) -> None:
    """A :class:`ValueError` when some relevance is NaN or Inf although inputs and output are
    finite: a quotient or a product overflowed in the backward pass."""
    for tensor in _tensors(relevance):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"the relevance came out NaN or Inf in {int((~torch.isfinite(tensor)).sum())} of {tensor.numel()} "
                f"values although inputs and output are finite: relevance divided by a near-zero output "
                f"overflowed {_dtype_advice(tensor.dtype)}. Use a larger stabiliser (epsilon), or {TURN_OFF}"
            )


VANISHED_SHARE = 1e-6
"""Below this share of the explained output's relevance (absolute values summed) the relevance
reaching the inputs has vanished: see :func:`warn_of_vanished_relevance`."""

_VANISHING_WARNED: ContextVar[list[bool] | None] = ContextVar("_VANISHING_WARNED", default=None)


def vanished_relevance(output_totals: Sequence[Tensor],
                       input_relevance: Sequence[Any]) -> tuple[Tensor | None, Callable[[], None]]:
    """Whether, for some target, the relevance reaching the inputs is a negligible share of the
    relevance the explanation started from, as a one-element flag on the device (no
    synchronisation), and the function that gives the warning
    (:func:`warn_of_vanished_relevance`).

    Parameters
    ----------
    output_totals
        Per target, the summed absolute relevance the explanation started from (0-dim tensors).
    input_relevance
        Per target, the relevance of the inputs (tensors, tuples or dicts of them, None).

    Returns
    -------
    tuple
        The flag (None where there is nothing to compare) and the warning.
    """
    if not output_totals:
        return None, lambda: None
    device = output_totals[0].device
    outputs = torch.stack([total.to(device) for total in output_totals])
    inputs = torch.stack([total.to(device) for total in relevance_totals(input_relevance, device)])
    vanished = inputs < VANISHED_SHARE * outputs
    return vanished.any(), lambda: warn_of_vanished_relevance(outputs, inputs, vanished)


def relevance_totals(input_relevance: Sequence[Any], device: torch.device) -> list[Tensor]:
    """Per target, the summed absolute relevance of the inputs, in float32 or wider: a one-element
    tensor (on the device of the relevance; ``device`` where there is none), NaN or Inf where the
    relevance has NaN or Inf.

    Parameters
    ----------
    input_relevance
        Per target, the relevance of the inputs (tensors, tuples or dicts of them, None).
    device : torch.device
        Where the total of a target without floating-point relevance is made (a zero).

    Returns
    -------
    list of Tensor
        One total per target.
    """
    totals = []
    with torch.no_grad():
        for found in input_relevance:
            sums = [tensor.abs().sum(dtype=torch.float32 if tensor.element_size() < 4 else None)
                    for tensor in _tensors(found) if tensor.is_floating_point()]
            totals.append(sums[0] if len(sums) == 1 else
                          torch.stack([total.to(device) for total in sums]).sum() if sums else
                          torch.zeros((), device=device))
    return totals


def warn_of_vanished_relevance(outputs: Tensor, inputs: Tensor, vanished: Tensor) -> None:
    """A :class:`~fxlrp.errors.VanishedRelevanceWarning` when, for some target, the relevance
    reaching the inputs is a negligible share of the relevance the explanation started from:
    ``sum |R_in| < 1e-6 sum |R_out|`` (absolute values summed over every input, and over the
    explained output).

    Why 1e-6: float32 resolves one part in 2^24 (6e-8), and an output computed by sums of
    many float32 products carries a relative rounding error of about that times the length of the
    sums; relevance below a millionth of the output's is at the scale of that rounding, so its
    pattern says nothing about the inputs, however plausible its max-normalised heatmap looks. The
    rules fxlrp uses conserve relevance (LRP-0, z+, alpha-beta, gamma, flat, w^2, the product
    and attention rules) or absorb a share of it on purpose - epsilon's stabiliser, and the bias
    terms, which take the part of the output they make up. On a trained or an ordinary randomly
    initialised model that share is far from all but a millionth; it comes close only when the
    biases make up practically the whole output (features of 1e-8 under weights left at a
    detector's random initialisation) or an epsilon dwarfs the layers' outputs. Absolute values,
    not signed sums: positive and negative relevance that cancel are no loss. An output whose
    relevance is 0 has nothing to lose and never warns.

    Warns at most once per call of :func:`fxlrp.attribute` (see :func:`one_vanishing_warning`);
    :func:`fxlrp.attribute` checks only under ``check_finite``, where the totals are read with the
    NaN and Inf checks' sums (:meth:`FiniteChecks.compare_totals`: one synchronisation in all).

    Parameters
    ----------
    outputs
        Per target, the summed absolute relevance the explanation started from.
    inputs
        Per target, the summed absolute relevance reaching the inputs.
    vanished
        Per target, whether ``inputs`` is under the share of ``outputs``.
    """
    warned = _VANISHING_WARNED.get()
    if warned is not None:
        if warned[0]:
            return
        warned[0] = True
    first = int(vanished.nonzero()[0, 0])
    which = "" if len(outputs) == 1 else f" (for {int(vanished.sum())} of {len(outputs)} targets)"
    warnings.warn(
        f"fxlrp: the relevance reaching the inputs is {float(inputs[first]):.2g} in all{which}, a negligible "
        f"share (under {VANISHED_SHARE:g}) of the explained output's {float(outputs[first]):.2g} (absolute values "
        "summed): the rules absorbed it on the way - biases that make up nearly all of the output (weights "
        "left at their random initialisation), an epsilon larger than the layers' outputs, or a rule that finds "
        "no contribution to share it by (z+ where none is positive) - so a heatmap of it shows rounding noise, "
        "not the model's reasons. Load the trained weights or use a smaller epsilon; "
        "to find the layer that absorbs it, compare the relevance sums of nodes of explain.report() from "
        "fxlrp.attribute_nodes(explain, inputs, nodes=[...], target=...)",
        VanishedRelevanceWarning,
        stacklevel=_caller_stacklevel(),
    )


@contextmanager
def one_vanishing_warning() -> Iterator[None]:
    """:func:`warn_of_vanished_relevance` warns at most once inside (one call explaining its
    targets in several passes)."""
    token = _VANISHING_WARNED.set([False]) if _VANISHING_WARNED.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _VANISHING_WARNED.reset(token)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside fxlrp from the caller of ``warnings.warn``:
    the user's call, however deep inside fxlrp the warning is raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _dtype_advice(dtype: torch.dtype) -> str:
    if torch.finfo(dtype).max < 1e6:
        return (f"({dtype} holds values up to {torch.finfo(dtype).max:g}); explain in float32 or bfloat16, or "
                f"under torch.autocast, which keeps the inputs and the relevance in float32")
    return f"in {dtype}"


def _input_names(explain: Any, count: int) -> list[str]:
    """The model's names of its inputs (its graph's inputs), where the explainer knows them."""
    graph_module = getattr(explain, "graph_module", None)
    if graph_module is None:
        return []
    names = [node.name for node in graph_module.graph.nodes if node.op == "placeholder"]
    return names if len(names) >= count else []


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []


def no_floating_input_error(inputs: Tensor | Sequence[Any], error: Exception, ids_looked_up: bool) -> Exception:
    """The error for a model that failed on inputs none of which is floating-point (an image as
    ``uint8``, a mask as ``bool``): relevance is explained for floating-point inputs, and the
    model's own message (``Input type (unsigned char) and bias type (float)``) does not say so.
    Other failures are the model's own and are raised as they are: so are those after the model
    looked up the inputs in an embedding (``ids_looked_up``): they are token ids, as explained."""
    values = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    tensors = [value for value in values if isinstance(value, Tensor)]
    if (ids_looked_up or not tensors
            or any(value.is_floating_point() or value.is_complex() for value in tensors)):
        return error
    dtypes = ", ".join(str(value.dtype) for value in tensors)
    return ValueError(
        f"the model failed on inputs of dtype {dtypes} ({type(error).__name__}: {error}). fxlrp explains "
        "floating-point inputs, and token ids the model looks up in an embedding: give an image or features "
        "as floats as the model expects them (e.g. images.float() / 255, normalised as in training)"
    )


# Inputs of the wrong kind, checked before anything runs.


def _numpy_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")  # (a value cannot be an array unless NumPy is imported)
    return numpy is not None and isinstance(value, numpy.ndarray)


def _number(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return (isinstance(value, (int, float, complex))
            or (numpy is not None and isinstance(value, (numpy.number, numpy.bool_))))


def _numbers_shape(value: Any) -> list[int] | None:
    """The shape of a (nested) list or tuple of numbers, read along its first elements (as
    ``torch.tensor`` would take it); None for anything else."""
    shape = []
    while isinstance(value, (list, tuple)) and value:
        shape.append(len(value))
        value = value[0]
    return shape if shape and _number(value) else None


def _model_names(explain: Any) -> tuple[str, ...]:
    """The names of the model's inputs in the order of its ``forward``, where the explainer knows them."""
    return tuple(getattr(explain, "input_names", ()) or ())


def _placements(tensors: Iterator[Tensor]) -> tuple[set[torch.dtype], set[torch.device]]:
    """The floating-point dtypes and the devices of ``tensors``."""
    dtypes, devices = set(), set()
    for tensor in tensors:
        devices.add(tensor.device)
        if tensor.is_floating_point():
            dtypes.add(tensor.dtype)
    return dtypes, devices


def _model_placements(explain: Any, model: nn.Module | None) -> tuple[set[torch.dtype], set[torch.device]]:
    """The dtypes and devices of the model's parameters and buffers (of those the explainer holds,
    for an explainer without its model: a copy)."""
    if model is not None:
        return _placements(iter([*model.parameters(), *model.buffers()]))
    return _placements(tensors_used(explain))


def _shown(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _from_numpy(name: str, array: Any, explain: Any) -> str:
    """What to write instead of a NumPy array: ``torch.from_numpy(x)``, cast to the model's dtype
    where the array is floating-point and of another one."""
    try:
        dtype = torch.as_tensor(array.reshape(-1)[:0]).dtype
    except (TypeError, ValueError, RuntimeError):  # (an array of objects or strings)
        return f"torch.tensor({name})"
    if not dtype.is_floating_point:
        return f"torch.from_numpy({name})"
    dtypes, _ = _model_placements(explain, model_of(explain))
    if len(dtypes) == 1 and dtype not in dtypes:
        return f"torch.from_numpy({name}).to(torch.{_shown(next(iter(dtypes)))})"
    return f"torch.from_numpy({name})"


def _tensor_from_numbers(name: str, numbers: Any, explain: Any) -> str:
    """What to write instead of a list of numbers: ``torch.tensor(x)``, of the model's dtype where
    they are floats (integers stay integers: token ids, indices)."""
    while isinstance(numbers, (list, tuple)):
        numbers = numbers[0]
    if not isinstance(numbers, float) and not _number_of_kind(numbers, "fc"):
        return f"torch.tensor({name})"
    dtypes, _ = _model_placements(explain, model_of(explain))
    dtype = f", dtype=torch.{_shown(next(iter(dtypes)))}" if len(dtypes) == 1 else ""
    return f"torch.tensor({name}{dtype})"


def _number_of_kind(value: Any, kinds: str) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in kinds


def refuse_unusable_inputs(explain: Any, inputs: Any) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` for inputs given as something other than
    what :func:`fxlrp.attribute` takes (a tensor, a sequence of the model's inputs, a mapping of
    them by name), or holding a NumPy array or, where no input is a tensor, a list of numbers: the
    model takes tensors, and an array would be taken for a sequence of inputs, one per row.

    Parameters
    ----------
    explain
        The explainer (its model's input names and parameters make the advice concrete).
    inputs
        The inputs as given to :func:`fxlrp.attribute`.

    Raises
    ------
    ExplanationInputError
        Naming the input, what it is and what to pass instead.
    """
    if isinstance(inputs, Tensor):
        if inputs.layout is not torch.strided:
            names = _model_names(explain)
            _refuse_sparse("the input", names[0] if names else "inputs", inputs)
        return
    names = _model_names(explain)
    single = names[0] if names else "inputs"  # (a tensor given alone is the forward's first input)
    if _numpy_array(inputs):
        raise ExplanationInputError(
            f"the input is a NumPy array (shape {list(inputs.shape)}, {inputs.dtype}); fxlrp explains the torch "
            f"tensors the model takes: pass {_from_numpy(single, inputs, explain)}")
    if isinstance(inputs, (str, bytes)):
        raise ExplanationInputError(
            "the input is text; the model takes tensors: tokenize it first (tokenizer(text, return_tensors='pt')) "
            "and give the tokenizer's output, or its input_ids")
    if isinstance(inputs, Mapping):
        named = [(f"input {name!r}", str(name), value) for name, value in inputs.items()]
    elif isinstance(inputs, Sequence):
        shape = _numbers_shape(inputs)
        if shape is not None:
            raise ExplanationInputError(
                f"the input is a {type(inputs).__name__} of numbers (shape {shape}); fxlrp explains the torch tensors "
                f"the model takes: pass {_tensor_from_numbers(single, inputs, explain)}")
        named = [(f"input {position}" + (f" ({names[position]!r})" if position < len(names) else ""),
                  names[position] if position < len(names) else f"inputs[{position}]", value)
                 for position, value in enumerate(inputs)]
    else:
        raise ExplanationInputError(
            f"the inputs are a {type(inputs).__name__}; give a tensor, a list or tuple of the model's inputs in the "
            "order of its forward, or a dict of them by name (as a tokenizer returns them)")
    for label, name, value in named:
        if _numpy_array(value):
            raise ExplanationInputError(
                f"{label} is a NumPy array (shape {list(value.shape)}, {value.dtype}); fxlrp explains the torch "
                f"tensors the model takes: pass {_from_numpy(name, value, explain)}")
        if isinstance(value, Tensor):
            _refuse_sparse(label, name, value)
    if any(isinstance(value, Tensor) for *_, value in named):
        return
    for label, name, value in named:
        shape = _numbers_shape(value)
        if shape is not None:
            tokenizer = " (a tokenizer gives tensors with return_tensors='pt')" if isinstance(inputs, Mapping) else ""
            raise ExplanationInputError(
                f"{label} is a {type(value).__name__} of numbers (shape {shape}); fxlrp explains the torch tensors "
                f"the model takes: pass {_tensor_from_numbers(name, value, explain)}{tokenizer}")


def _refuse_sparse(label: str, name: str, value: Tensor) -> None:
    """Sparse tensors as inputs are not explained (relevance at the inputs is dense); a model may
    build a sparse matrix inside from index and value tensors, which is explained."""
    if value.layout is not torch.strided:
        raise ExplanationInputError(
            f"{label} is a sparse tensor ({str(value.layout).replace('torch.', '')}, shape {list(value.shape)}); "
            f"fxlrp takes dense inputs: pass {name}.to_dense(), or give the model the indices and values and "
            "build the sparse matrix inside its forward (torch.sparse_coo_tensor), where it is explained")


def refuse_unusable_arguments(arguments: Mapping[str, Any], lists_refused: Sequence[str] = ()) -> None:
    """:func:`refuse_unusable_inputs` for inputs given by name, as the graph functions take them
    (``x``, ``edge_index``, keywords): a NumPy array anywhere, a list of numbers where a tensor is
    needed (``lists_refused``); dicts (a heterogeneous graph's, by type) are checked per entry.

    Parameters
    ----------
    arguments
        ``{name: value}`` as the user passed them.
    lists_refused
        The names whose value must be a tensor (or a dict of tensors), never a list.

    Raises
    ------
    ExplanationInputError
        Naming the argument, what it is and what to pass instead.
    """
    for name, value in arguments.items():
        entries = value.items() if isinstance(value, dict) else [(None, value)]
        for key, entry in entries:
            shown = name if key is None else f"{name}[{key!r}]"
            if _numpy_array(entry):
                integer = entry.dtype.kind in "iu"
                advice = f"torch.from_numpy({shown})" + (".long()" if integer and name == "edge_index" else "")
                raise ExplanationInputError(
                    f"{shown} is a NumPy array (shape {list(entry.shape)}, {entry.dtype}); the model takes torch "
                    f"tensors: pass {advice}")
            shape = _numbers_shape(entry) if name in lists_refused else None
            if shape is not None:
                dtype = "torch.long" if name == "edge_index" else "torch.float32"
                raise ExplanationInputError(
                    f"{shown} is a {type(entry).__name__} of numbers (shape {shape}); the model takes torch tensors: "
                    f"pass torch.tensor({shown}, dtype={dtype})")


# The number of dimensions BatchNorm checks, recorded at conversion.


@dataclass(frozen=True)
class RankCheck:
    """What a BatchNorm of the model says to the number of dimensions of an input it is reached by
    through layers that keep that number (recorded by :func:`recorded_rank_checks`).

    ``position``, ``name``: the input's place and name in the model's ``forward``; ``module``,
    ``kind``: the BatchNorm's path in the model and its class; ``accepted``: the numbers of
    dimensions it takes; ``said``: its message for each number of dimensions up to 8 it refuses.
    """

    position: int
    name: str
    module: str
    kind: str
    accepted: tuple[int, ...]
    said: tuple[tuple[int, str], ...]

    def refusal(self, value: Tensor) -> str | None:
        """The error message for ``value`` in the user's terms; None if the BatchNorm takes it."""
        rank = value.dim()
        if rank in self.accepted:
            return None
        expected = " or ".join(f"{accepted}D" for accepted in self.accepted)
        said = dict(self.said).get(rank, f"expected {expected} input (got {rank}D input)")
        advice = (f"a single sample needs its batch dimension: pass {self.name}.unsqueeze(0)"
                  if rank + 1 in self.accepted else f"give it with {expected.replace('D', '')} dimensions")
        return (f"the model itself rejects input {self.name!r} (shape {list(value.shape)}): its {self.kind} "
                f"{self.module!r} raises ValueError: {said}; {advice}")


def _checks_rank(module: nn.Module) -> bool:
    return (isinstance(module, _BatchNorm) and type(module).forward is _BatchNorm.forward
            and hasattr(module, "_check_input_dim"))


def _keeps_rank(node: fx.Node, module: nn.Module | None) -> bool:
    """Whether the node's output has as many dimensions as its input, batched or not: what the
    registry says of its spelling (:meth:`fxlrp.registry.ValueFlow.keeps_rank_of`)."""
    if node.op == "call_module":
        operation, spelled = REGISTRY.for_module(module), type(module)
    elif node.op == "call_function":
        operation, spelled = REGISTRY.for_function(node.target), node.target
    elif node.op == "call_method":
        operation, spelled = REGISTRY.for_method(node.target), node.target
    else:
        return False
    return operation is not None and operation.flow.keeps_rank_of(spelled)


def _rank_check(module: nn.Module, path: str, position: int, name: str) -> RankCheck | None:
    accepted, said = [], []
    for rank in range(9):
        try:
            module._check_input_dim(torch.empty((1,) * rank, device="meta"))
        except ValueError as error:
            said.append((rank, str(error)))
        else:
            accepted.append(rank)
    if not said or not accepted:
        return None
    return RankCheck(position, name, path, type(module).__name__, tuple(accepted), tuple(said))


def recorded_rank_checks(graph: fx.Graph, modules: Mapping[str, nn.Module],
                         positional: Sequence[str]) -> tuple[RankCheck, ...]:
    """The BatchNorms each input reaches with its own number of dimensions, through call_module,
    function and method nodes that keep it (convolutions, linear layers, activations, pooling,
    dropout), as :class:`RankCheck` s in the order the graph runs them.

    Parameters
    ----------
    graph
        The captured graph, before BatchNorm is folded.
    modules
        The model's modules by qualified name.
    positional
        The names of the model's inputs that may be given by position, in order.

    Returns
    -------
    tuple of RankCheck
        Empty where no input reaches a BatchNorm that way (transformers, graph networks, models
        run eagerly).
    """
    order = {node: index for index, node in enumerate(graph.nodes)}
    found: list[tuple[int, RankCheck]] = []
    for placeholder in graph.nodes:
        if placeholder.op != "placeholder" or placeholder.target not in positional:
            continue
        position = list(positional).index(placeholder.target)
        pending, seen = [placeholder], {placeholder}
        while pending:
            current = pending.pop()
            for user in current.users:
                if user in seen or not user.args or user.args[0] is not current or len(user.all_input_nodes) != 1:
                    continue
                seen.add(user)
                module = modules.get(user.target) if user.op == "call_module" else None
                if module is not None and _checks_rank(module):
                    check = _rank_check(module, user.target, position, placeholder.target)
                    if check is not None:
                        found.append((order[user], check))
                elif _keeps_rank(user, module):
                    pending.append(user)
    return tuple(check for _, check in sorted(found, key=lambda item: item[0]))


def refuse_ranks_the_model_refuses(explain: Any, values: Sequence[Any]) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` with the model's BatchNorm's own message for
    an input with a number of dimensions it refuses (see :func:`recorded_rank_checks`). No more
    than a look at each checked input's ``dim()``.

    Parameters
    ----------
    explain
        The explainer; one without recorded checks (a plain module) checks nothing.
    values
        The model's inputs by position.

    Raises
    ------
    ExplanationInputError
        Naming the input, its shape, the BatchNorm and what it says, and what to do.
    """
    conversion = getattr(explain, "conversion", None)
    for check in getattr(conversion, "rank_checks", ()):
        if check.position < len(values) and isinstance(values[check.position], Tensor):
            refusal = check.refusal(values[check.position])
            if refusal is not None:
                raise ExplanationInputError(refusal)


# When the explanation fails: does the model itself take the inputs?


FAILURES = (RuntimeError, TypeError, ValueError, LookupError, AttributeError, AssertionError)
"""What a forward raises for inputs it does not take: torch's checks of shapes, dtypes and devices,
a shape that does not unpack, an attribute a list lacks, a library's assertion."""


def model_of(explain: Any) -> nn.Module | None:
    """The model an explainer was converted from (None for a copy, which holds only its graph, or
    for a module not made by :func:`fxlrp.convert`)."""
    return getattr(getattr(explain, "conversion", None), "model", None)


def _labelled(args: Sequence[Any], kwargs: Mapping[str, Any],
              names: Sequence[str]) -> list[tuple[str, str, Tensor]]:
    """``(label, name in code, tensor)`` of each tensor among the arguments."""
    found = []
    for position, value in enumerate(args):
        if isinstance(value, Tensor):
            name = names[position] if position < len(names) else f"inputs[{position}]"
            label = f"input {name!r}" if position < len(names) else f"input {position}"
            found.append((label, name, value))
    found += [(f"input {name!r}", name, value) for name, value in kwargs.items() if isinstance(value, Tensor)]
    return found


def _advice(tensors: list[tuple[str, str, Tensor]], placements: tuple[set[torch.dtype], set[torch.device]],
            said: str) -> list[str]:
    """What to do: an input's device or floating-point dtype that the model's parameters do not
    have, a batch dimension the model's message asks for."""
    dtypes, devices = placements
    advice = []
    for label, name, value in tensors:
        if devices and value.device not in devices:
            device = sorted(map(str, devices))[0]
            on = " and ".join(sorted(map(str, devices)))
            advice.append(f"{label} is on {value.device} but the model's parameters are on {on}: pass "
                          f"{name}.to({device!r})")
        elif value.is_floating_point() and dtypes and value.dtype not in dtypes:
            dtype = _shown(sorted(dtypes, key=str)[0])
            advice.append(f"{label} is {_shown(value.dtype)} but the model's parameters are "
                          f"{' and '.join(sorted(_shown(each) for each in dtypes))}: pass {name}.to(torch.{dtype}), or "
                          f"convert a copy of the model in {_shown(value.dtype)} "
                          f"(fxlrp.convert(copy.deepcopy(model).to(torch.{_shown(value.dtype)})))")
    # "expected 4D input (got 3D input)" (a layer's check), "not enough values to unpack (expected 2,
    # got 1)" (``batch, length = ids.shape``): one dimension short, the batch's
    ranks = re.search(r"expected (\d+)D\b.*?got (\d+)D", said) or re.search(r"unpack \(expected (\d+), got (\d+)\)",
                                                                         said)
    if ranks is not None and int(ranks.group(2)) + 1 == int(ranks.group(1)):
        unbatched = next((name for _, name, value in tensors if value.dim() == int(ranks.group(2))), None)
        if unbatched is not None:
            advice.append(f"a single sample needs its batch dimension: pass {unbatched}.unsqueeze(0)")
    return advice


def _sentence(text: str, capitalised: bool = True) -> str:
    """``text`` as a sentence: ending in a full stop, capitalised (not a message quoted as it is)."""
    text = text[:1].upper() + text[1:] if capitalised else text
    return text if text.endswith((".", "!", "?")) else text + "."


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _described(tensors: list[tuple[str, str, Tensor]]) -> str:
    """``input 'x' (shape [3, 64, 64], float32, on cpu)``; ``the inputs 'x' (...) and 'edge_index' (...)``."""
    shown = [(label, f"(shape {list(value.shape)}, {_shown(value.dtype)}, on {value.device})")
             for label, _, value in tensors]
    if len(shown) == 1:
        return " ".join(shown[0])
    if not shown:
        return "the inputs"
    parts = [f"{label.removeprefix('input ')} {placed}" for label, placed in shown]
    return f"the inputs {', '.join(parts[:-1])} and {parts[-1]}"


def _run_model(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> BaseException | None:
    """Run ``model`` on the inputs as the user would, in evaluation mode and without gradients,
    every module's attributes put back after; the error it raised, or None."""
    with MODEL_WRITES:
        state = ModuleState(model)
        in_evaluation_mode(state.modules)
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - whatever the model raises is its refusal
            return error
        finally:
            state.restore()
    return None


def _from_the_model_on(traceback: types.TracebackType | None) -> types.TracebackType | None:
    """The model's traceback without the frame of :func:`_run_model` that called it."""
    while traceback is not None and traceback.tb_frame.f_code is _run_model.__code__:
        traceback = traceback.tb_next
    return traceback


def input_rejection(explain: Any, model: nn.Module | None, args: Sequence[Any], kwargs: Mapping[str, Any],
                    failure: BaseException) -> ExplanationInputError | None:
    """The error to raise instead of ``failure``, an explanation's failure on these inputs: the
    model's own refusal of them, or (for an explainer without its model, a copy) an input whose
    device or dtype the explainer's parameters do not have; None: the inputs are not the cause.

    Parameters
    ----------
    explain
        The explainer that failed.
    model
        The model it was converted from (None: not known).
    args, kwargs
        The inputs as the user gave them, as the model takes them.
    failure
        The explanation's error.

    Returns
    -------
    ExplanationInputError or None
        With the model's error as its ``__cause__`` (its traceback from the model's call on),
        nothing of the explanation's.
    """
    names = _model_names(explain)
    tensors = _labelled(args, kwargs, names)
    if model is None:
        advice = _advice(tensors, _model_placements(explain, None), "")
        if not advice:
            return None
        error = ExplanationInputError(f"{_described(tensors)} does not fit the model: {'; '.join(advice)} (the "
                                      f"explanation failed with {type(failure).__name__}: {_first_line(failure)})")
        error.__suppress_context__ = True
        return error
    refused = _run_model(model, args, kwargs)
    if refused is None:
        return None
    said = _first_line(refused)
    advice = (_advice(tensors, _model_placements(explain, model), said)
              or ["give the inputs as the model itself takes them"])
    error = ExplanationInputError(f"the model itself rejects {_described(tensors)}: {type(refused).__name__}: "
                                  f"{_sentence(said, capitalised=False)} {_sentence('; '.join(advice))}")
    refused.__traceback__ = _from_the_model_on(refused.__traceback__)
    refused.__suppress_context__ = True  # (raised while the explanation's error was handled)
    error.__cause__, error.__suppress_context__ = refused, True
    return error


def raised_from_the_call(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a public entry point) raising an :class:`~fxlrp.errors.ExplanationInputError`
    found inside it from its own call, without the frames of fxlrp's functions that found it: the
    user's call and the message are what count. (Its cause, the model's own error where it has
    one, stays.)"""

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ExplanationInputError as error:
            raise error.with_traceback(None)  # noqa: B904 - the error keeps its own cause

    return checked


_PACKAGE = str(Path(__file__).resolve().parent.parent)


def raised_by_fxlrp(error: BaseException) -> bool:
    """Whether ``error`` comes from a ``raise`` statement of fxlrp's own (an error in the user's
    terms, such as "node types ... have edges but no features in x"), not from a computation that
    failed on the inputs inside it."""
    innermost = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ is not None else []
    # (``raise ValueError(...)`` there, not ``raise error`` handing on what a computation raised)
    return bool(innermost) and innermost[0].filename.startswith(_PACKAGE) and \
        re.match(rf"raise {type(error).__name__}\(", innermost[0].line or "") is not None


@contextmanager
def model_consulted(explain: Any, model: nn.Module | None, args: Sequence[Any],
                    kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Where the explanation inside fails on the inputs, :func:`input_rejection`'s error if there
    is one, else the explanation's error as it was. fxlrp's own errors (its exception classes, and
    what its ``raise`` statements raise, see :func:`raised_by_fxlrp`) pass unchanged."""
    try:
        yield
    except FxlrpError:
        raise
    except FAILURES as failure:
        if raised_by_fxlrp(failure):
            raise
        rejection = input_rejection(explain, model, args, kwargs, failure)
        if rejection is None:
            raise
        raise rejection from rejection.__cause__
