"""Inputs fxlrp cannot explain as given, and NaN or Inf: errors that say where, not NaN heatmaps.

A NaN anywhere in an input spreads through every layer it reaches, and an activation that
overflows (float16's largest value is 65504) makes the explained output, or the relevance of
everything below it, Inf or NaN. Returned as relevance, either looks like an explanation. So
:func:`fxlrp.attribute` checks the floating-point inputs before it runs the model and the
explained output and the relevance after (one pass over each, small next to the explanation);
``check_finite=False`` turns the checks off for inputs whose NaN and Inf are meant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

TURN_OFF = "pass check_finite=False to fxlrp.attribute to explain it as it is"


def refuse_non_finite_inputs(explain: Any, inputs: Tensor | Sequence[Any]) -> None:
    """A :class:`ValueError` naming the first floating-point input with NaN or Inf."""
    single = isinstance(inputs, Tensor)
    values = (inputs,) if single else tuple(inputs)
    names = _input_names(explain, len(values))
    for position, value in enumerate(values):
        if not isinstance(value, Tensor) or not (value.is_floating_point() or value.is_complex()):
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
