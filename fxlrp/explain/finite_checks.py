"""NaN or Inf in an explanation: errors that say where, not NaN heatmaps; and relevance that vanished.

A NaN anywhere in an input spreads through every layer it reaches, and an activation that
overflows (float16's largest value is 65504) makes the explained output, or the relevance of
everything below it, Inf or NaN. Returned as relevance, either looks like an explanation. So
:func:`fxlrp.attribute` checks the floating-point inputs, the explained output and the relevance
(one pass over each, small next to the explanation), and reads the three answers on the host
together at the end of the call (:class:`FiniteChecks`: one device synchronisation per call);
``check_finite=False`` turns the checks off for inputs whose NaN and Inf are meant. Relevance
reaching the inputs that is a negligible share of the output's is read in the same
synchronisation and warned of (:func:`warn_of_vanished_relevance`).
"""

from __future__ import annotations

import cmath
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import VanishedRelevanceWarning
from fxlrp.explain.model_rejection import FXLRP_DIRECTORY

TURN_OFF = "pass check_finite=False to fxlrp.attribute to explain it as it is"


class FiniteChecks:
    """The NaN and Inf checks of one explanation and its check for vanished relevance, read on the
    host together at its end.

    Each check keeps, per checked tensor, a sum of its values on the tensor's device
    (:func:`non_finite_flags`): NaN or Inf where one of the values is (or, for values near their
    dtype's largest, where the sum of finite values overflows). :meth:`refuse` reads every sum and
    total at once - one device synchronisation per call, one operation (a stack) per device - and
    where a sum is not finite calls the refusals in the order the checks were made (inputs,
    explained output, relevance); each refusal checks its values exactly, so the error is the first
    failing check's, with its counts, and an overflowed sum of finite values raises nothing. The
    relevance's check reuses the totals that the check for vanished relevance sums anyway
    (:meth:`compare_totals`).
    """

    def __init__(self) -> None:
        self._sums: list[Tensor] = []
        self._refusals: list[Callable[[], None]] = []
        self._totals: tuple[list[Tensor], list[Tensor]] = ([], [])
        self._locate: Callable[[int], str | None] | None = None

    def check(self, values: Any, refusal: Callable[[], None]) -> None:
        """Check the floating-point (and complex) tensors in ``values`` (a tensor, or tuples, lists
        and dicts of them); ``refusal`` raises their error."""
        flags = non_finite_flags(values)
        if flags:
            self.add(flags, refusal)

    def add(self, flags: Sequence[Tensor], refusal: Callable[[], None]) -> None:
        """Add sums made by :func:`non_finite_flags` or :func:`relevance_totals` (at least one; not
        finite where the values they sum are not); ``refusal`` raises the error of the values."""
        self._sums += flags
        self._refusals.append(refusal)

    def compare_totals(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor],
                       locate: Callable[[int], str | None] | None = None) -> None:
        """Warn at :meth:`refuse` where, for some target, the relevance reaching the inputs has
        vanished (:func:`warn_of_vanished_relevance`); per target, the summed absolute relevance
        the explanation started from and the one reaching the inputs (one-element tensors);
        ``locate``: names the layer that absorbed most for a target, by its position (called
        only when the warning is given)."""
        self._totals[0].extend(outputs)
        self._totals[1].extend(inputs)
        self._locate = locate

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
            warn_of_vanished_relevance(torch.tensor(output_totals), torch.tensor(input_totals), torch.tensor(vanished),
                                       self._locate)


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


def non_finite_flags(values: Any) -> list[Tensor]:
    """Per floating-point (or complex) tensor in ``values`` (a tensor, or tuples, lists and dicts of
    them), a one-element sum of its values on its device: NaN or Inf where one of them is (and,
    rarely, where finite values near their dtype's largest overflow the sum; 16-bit values are
    summed in float32). One operation per tensor.

    Parameters
    ----------
    values
        The values checked; tensors on the meta device hold none and are left out.

    Returns
    -------
    list of Tensor
        The sums, for :meth:`FiniteChecks.add`.
    """
    with torch.no_grad():
        return [value.sum(dtype=summing_dtype(value)) for value in _tensors(values)
                if (value.is_floating_point() or value.is_complex()) and value.device.type != "meta"]


def summing_dtype(values: Tensor) -> torch.dtype:
    """The dtype the checks sum ``values`` in: theirs, float32 for 16-bit values (whose sums of
    finite values would overflow or lose the total). Chosen on the host from the dtype's size
    (``torch.promote_types`` would be an operation dispatched per checked tensor)."""
    dtype = values.dtype
    if dtype.is_complex:
        return dtype if dtype.itemsize >= 8 else torch.complex64
    return dtype if dtype.itemsize >= 4 else torch.float32


def absolute_total(values: Tensor) -> Tensor:
    """``sum |values|`` in :func:`summing_dtype`, a one-element tensor (a 1-norm: no absolute value
    of ``values``' size is made), NaN or Inf where a value is."""
    with torch.no_grad():  # (not recorded, and no detach dispatched)
        return torch.linalg.vector_norm(values, 1, dtype=summing_dtype(values))


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


def vanished_relevance(output_totals: Sequence[Tensor], input_relevance: Sequence[Any],
                       locate: Callable[[int], str | None] | None = None,
                       ) -> tuple[Tensor | None, Callable[[], None]]:
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
    locate
        Given the position of a target, the layer that absorbed most of its relevance, in the
        user's terms (called only when the warning is given; see
        :func:`warn_of_vanished_relevance`).

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
    return vanished.any(), lambda: warn_of_vanished_relevance(outputs, inputs, vanished, locate)


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
            sums = [absolute_total(tensor) for tensor in _tensors(found) if tensor.is_floating_point()]
            totals.append(sums[0] if len(sums) == 1 else
                          torch.stack([total.to(device) for total in sums]).sum() if sums else
                          torch.zeros((), device=device))
    return totals


def warn_of_vanished_relevance(outputs: Tensor, inputs: Tensor, vanished: Tensor,
                               locate: Callable[[int], str | None] | None = None) -> None:
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
    The warning names the layer that absorbed most where ``locate`` can name one (one more pass,
    only once the warning is given: :mod:`fxlrp.explain.absorption`), and otherwise says how to
    find it.

    Parameters
    ----------
    outputs
        Per target, the summed absolute relevance the explanation started from.
    inputs
        Per target, the summed absolute relevance reaching the inputs.
    vanished
        Per target, whether ``inputs`` is under the share of ``outputs``.
    locate
        Given the position of a target, the layer that absorbed most of its relevance, in the
        user's terms (None where none can be named); None: no layer can be named.
    """
    warned = _VANISHING_WARNED.get()
    if warned is not None:
        if warned[0]:
            return
        warned[0] = True
    first = int(vanished.nonzero()[0, 0])
    which = "" if len(outputs) == 1 else f" (for {int(vanished.sum())} of {len(outputs)} targets)"
    layer = locate(first) if locate is not None else None
    if layer is None:
        found = ("to find the layer that absorbs it, compare the relevance sums of nodes of explain.report() from "
                 "fxlrp.attribute_nodes(explain, inputs, nodes=[...], target=...)")
    else:
        of = "" if len(outputs) == 1 else f" of target {first}"
        found = (f"the layer that absorbed most{of} (the largest fall of the absolute relevance from its output to "
                 f"its inputs) is {layer}")
    warnings.warn(
        f"fxlrp: the relevance reaching the inputs is {float(inputs[first]):.2g} in all{which}, a negligible "
        f"share (under {VANISHED_SHARE:g}) of the explained output's {float(outputs[first]):.2g} (absolute values "
        "summed): the rules absorbed it on the way - biases that make up nearly all of the output (weights "
        "left at their random initialisation), an epsilon larger than the layers' outputs, or a rule that finds "
        "no contribution to share it by (z+ where none is positive) - so a heatmap of it shows rounding noise, "
        f"not the model's reasons. Load the trained weights or use a smaller epsilon; {found}",
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
    while frame is not None and frame.f_code.co_filename.startswith(FXLRP_DIRECTORY):
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
