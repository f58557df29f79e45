"""When an explanation fails on its inputs: does the model itself take them?

Inputs the model itself would not take (no batch dimension, another dtype or device than its
parameters) are the model's to refuse, in its own words, not a failure deep inside the relevance
machinery. When the explanation fails, the model is asked (:func:`input_rejection`): it runs once
on the inputs as given (evaluation mode, no gradients, its modules' attributes put back), and if
it fails too, the error is the model's own message with what to do (the input's dtype or device
against the parameters', a missing batch dimension), raised from the model's own error; if the
model takes the inputs, the explanation's error is raised as it was. Valid inputs never pay for
this forward pass; what is checked before anything runs is :mod:`fxlrp.explain.input_checks`'s
and :mod:`fxlrp.explain.rank_checks`'.

These errors are :class:`~fxlrp.errors.ExplanationInputError`; the public functions raise them
from their own call (:func:`raised_from_the_call`), without the frames of fxlrp that found them.
"""

from __future__ import annotations

import functools
import re
import traceback
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.errors import ExplanationInputError, FxlrpError
from fxlrp.explain.placement import tensors_used

FAILURES = (RuntimeError, TypeError, ValueError, LookupError, AttributeError, AssertionError)
"""What a forward raises for inputs it does not take: torch's checks of shapes, dtypes and devices,
a shape that does not unpack, an attribute a list lacks, a library's assertion."""


def model_of(explain: Any) -> nn.Module | None:
    """The model an explainer was converted from (None for a copy, which holds only its graph, or
    for a module not made by :func:`fxlrp.convert`)."""
    return getattr(getattr(explain, "conversion", None), "model", None)


def model_input_names(explain: Any) -> tuple[str, ...]:
    """The names of the model's inputs in the order of its ``forward``, where the explainer knows them.

    Parameters
    ----------
    explain
        The explainer.

    Returns
    -------
    tuple of str
        The names; empty where the explainer does not know them (a module not made by
        :func:`fxlrp.convert`).
    """
    return tuple(getattr(explain, "input_names", ()) or ())


def _placements(tensors: Iterator[Tensor]) -> tuple[set[torch.dtype], set[torch.device]]:
    """The floating-point dtypes and the devices of ``tensors``."""
    dtypes, devices = set(), set()
    for tensor in tensors:
        devices.add(tensor.device)
        if tensor.is_floating_point():
            dtypes.add(tensor.dtype)
    return dtypes, devices


def model_placements(explain: Any, model: nn.Module | None) -> tuple[set[torch.dtype], set[torch.device]]:
    """The dtypes and devices of the model's parameters and buffers (of those the explainer holds,
    for an explainer without its model: a copy).

    Parameters
    ----------
    explain
        The explainer.
    model
        Its model (:func:`model_of`), or None.

    Returns
    -------
    tuple
        The floating-point dtypes and the devices.
    """
    if model is not None:
        return _placements(iter([*model.parameters(), *model.buffers()]))
    return _placements(tensors_used(explain))


def shown_dtype(dtype: torch.dtype) -> str:
    """A dtype as the user writes it after ``torch.`` (``"float32"``).

    Parameters
    ----------
    dtype
        The dtype.

    Returns
    -------
    str
        Its name.
    """
    return str(dtype).removeprefix("torch.")


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
            dtype = shown_dtype(sorted(dtypes, key=str)[0])
            parameters = " and ".join(sorted(shown_dtype(each) for each in dtypes))
            advice.append(f"{label} is {shown_dtype(value.dtype)} but the model's parameters are "
                          f"{parameters}: pass {name}.to(torch.{dtype}), or "
                          f"convert a copy of the model in {shown_dtype(value.dtype)} "
                          f"(fxlrp.convert(copy.deepcopy(model).to(torch.{shown_dtype(value.dtype)})))")
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
    shown = [(label, f"(shape {list(value.shape)}, {shown_dtype(value.dtype)}, on {value.device})")
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
    names = model_input_names(explain)
    tensors = _labelled(args, kwargs, names)
    if model is None:
        advice = _advice(tensors, model_placements(explain, None), "")
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
    advice = (_advice(tensors, model_placements(explain, model), said)
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


FXLRP_DIRECTORY = str(Path(__file__).resolve().parent.parent)
"""The directory of fxlrp's source: what is raised or warned from there is fxlrp's own."""


def raised_by_fxlrp(error: BaseException) -> bool:
    """Whether ``error`` comes from a ``raise`` statement of fxlrp's own (an error in the user's
    terms, such as "node types ... have edges but no features in x"), not from a computation that
    failed on the inputs inside it."""
    innermost = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ is not None else []
    # (``raise ValueError(...)`` there, not ``raise error`` handing on what a computation raised)
    return bool(innermost) and innermost[0].filename.startswith(FXLRP_DIRECTORY) and \
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
