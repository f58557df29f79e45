"""Inputs fxlrp cannot explain as given: errors that name the input and what to pass instead.

Before anything runs, what is not a tensor where the model takes one: a NumPy array, a list of
numbers (``x.tolist()``, a tokenizer's output without ``return_tensors="pt"``), text, a sparse
tensor (:func:`refuse_unusable_inputs`; :func:`refuse_unusable_arguments` for the graph
functions' arguments by name). After the forward, an input on the meta device that the model
took (an embedding looks meta ids up without complaint), which holds nothing to explain
(:func:`refuse_input_without_values`); and where a model fails on inputs none of which is
floating-point, that fxlrp explains floating-point inputs and token ids
(:func:`no_floating_input_error`).

The other checks of the inputs are :mod:`fxlrp.explain.rank_checks` (the numbers of dimensions a
BatchNorm checks), :mod:`fxlrp.explain.finite_checks` (NaN and Inf) and
:mod:`fxlrp.explain.model_rejection` (the model asked when an explanation fails). After the check
of what the inputs are, :func:`fxlrp.attribute` visits them once, by position
(:func:`fxlrp.explain.explained_inputs.explained_inputs`), asking the checks of each.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import ExplanationInputError
from fxlrp.explain.model_rejection import model_input_names, model_of, model_placements, shown_dtype
from fxlrp.relevance.sources import Lookups


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


def no_receiver_error(lookups: Lookups) -> ValueError:
    """The error for an explanation none of whose inputs can receive relevance: no floating-point
    input, and no embedding looked up the token ids given (``lookups``, the call's) - or one
    looked up a copy the model made of them, whose relevance cannot be handed back per token.

    Parameters
    ----------
    lookups : Lookups
        The embedding lookups of the call.

    Returns
    -------
    ValueError
        Saying what to give instead.
    """
    if lookups.of_copied_ids():
        return ValueError(
            "none of the inputs can receive relevance: the model looks up a copy it makes of the token ids "
            "it is given (reordered or padded: XLNet transposes them, Longformer pads them), so the "
            "relevance of the lookup cannot be handed back per token of your ids. Explain the embeddings "
            "instead: pass inputs_embeds=model.get_input_embeddings()(ids) in the place of the ids"
        )
    return ValueError(
        "none of the inputs can receive relevance: give the floating-point input to explain (an "
        "image, node features, inputs_embeds) or token ids the model looks up in an embedding"
    )


def refuse_input_without_values(explain: Any, position: int, value: Tensor) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` for an input on the meta device that the
    model took (an embedding looks meta ids up in a CPU table without complaint): it holds no
    values, so neither does its explanation. (Where the model refuses such an input, its own
    message is raised instead, see :func:`input_rejection`.)

    Parameters
    ----------
    explain
        The explainer (its model's input names and parameters make the advice concrete).
    position
        The input's position in the model's ``forward``.
    value
        The input.

    Raises
    ------
    ExplanationInputError
        Always: naming the input and the device to give it on.
    """
    names = model_input_names(explain)
    name = names[position] if position < len(names) else f"inputs[{position}]"
    _, devices = model_placements(explain, model_of(explain))
    device = sorted(str(device) for device in devices if device.type != "meta")
    where = f": pass {name}.to({device[0]!r})" if device else ""
    raise ExplanationInputError(f"input {name!r} (shape {list(value.shape)}) is on the meta device, which "
                                f"holds no values to explain; give it on the device of the model's "
                                f"parameters{where}")


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


def _from_numpy(name: str, array: Any, explain: Any) -> str:
    """What to write instead of a NumPy array: ``torch.from_numpy(x)``, cast to the model's dtype
    where the array is floating-point and of another one."""
    try:
        dtype = torch.as_tensor(array.reshape(-1)[:0]).dtype
    except (TypeError, ValueError, RuntimeError):  # (an array of objects or strings)
        return f"torch.tensor({name})"
    if not dtype.is_floating_point:
        return f"torch.from_numpy({name})"
    dtypes, _ = model_placements(explain, model_of(explain))
    if len(dtypes) == 1 and dtype not in dtypes:
        return f"torch.from_numpy({name}).to(torch.{shown_dtype(next(iter(dtypes)))})"
    return f"torch.from_numpy({name})"


def _tensor_from_numbers(name: str, numbers: Any, explain: Any) -> str:
    """What to write instead of a list of numbers: ``torch.tensor(x)``, of the model's dtype where
    they are floats (integers stay integers: token ids, indices)."""
    while isinstance(numbers, (list, tuple)):
        numbers = numbers[0]
    if not isinstance(numbers, float) and not _number_of_kind(numbers, "fc"):
        return f"torch.tensor({name})"
    dtypes, _ = model_placements(explain, model_of(explain))
    dtype = f", dtype=torch.{shown_dtype(next(iter(dtypes)))}" if len(dtypes) == 1 else ""
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
            names = model_input_names(explain)
            _refuse_sparse("the input", names[0] if names else "inputs", inputs)
        return
    names = model_input_names(explain)
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
