"""The inputs of one explanation, walked once: what the explainer runs on and what the checks found.

:func:`fxlrp.attribute` puts the inputs by position (a mapping by name through
:func:`~fxlrp.explain.attribute.inputs_by_position`) and :func:`explained_inputs` visits each one
once: the NaN and Inf flags (:class:`~fxlrp.explain.finite_checks.FiniteChecks`, read at the end of
the call), the fresh leaf of autograd an explained input becomes, its gradient edge and values
(taken before the forward), the token ids an embedding may look up, and an input on the meta
device (refused after the forward, where the model did not refuse it first). The result,
:class:`ExplainedInputs`, is the inputs' part of the one request the explanation's passes read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torch.autograd.graph import GradientEdge, get_gradient_edge

from fxlrp.explain.finite_checks import FiniteChecks, non_finite_flags, refuse_non_finite_inputs
from fxlrp.explain.input_checks import refuse_input_without_values
from fxlrp.explain.rank_checks import refuse_ranks_the_model_refuses
from fxlrp.relevance.sources import may_be_token_ids


@dataclasses.dataclass(frozen=True)
class ExplainedInputs:
    """The inputs of one explanation by position, as :func:`explained_inputs` found them."""

    given: Tensor | Sequence[Any]
    """The inputs as given: a tensor alone, or a sequence by position."""
    leaves: list[Any]
    """What the explainer runs on, one per input: each floating-point tensor a fresh leaf of
    autograd that collects relevance; the rest as given."""
    edges: list[GradientEdge]
    """The gradient edges of the explained leaves, taken before the forward: a model writing into
    its input in place (``x.mul_(2)``, run eagerly) leaves the Python object holding the written
    values (:func:`fxlrp.eager.in_place.replace_values`); relevance belongs to the input as given,
    which the edge still names."""
    values: list[Tensor]
    """The explained leaves' values, taken before the forward (as the edges)."""
    token_ids: list[Tensor]
    """The inputs that may be token ids an embedding looks up (tensors neither floating-point nor
    complex)."""
    without_values: int | None
    """The position of the first input on the meta device, which holds no values to explain; None
    where none is."""

    def refuse_without_values(self, explain: Any) -> None:
        """Refuse an input on the meta device (see :func:`~fxlrp.explain.input_checks.refuse_input_without_values`),
        once the model has taken it.

        Parameters
        ----------
        explain
            The explainer (its model's input names and parameters make the advice concrete).

        Raises
        ------
        ExplanationInputError
            Naming the input and the device to give it on.
        """
        if self.without_values is not None:
            refuse_input_without_values(explain, self.without_values, self.leaves[self.without_values])


def explained_inputs(explain: Any, inputs: Tensor | Sequence[Any], finite: FiniteChecks | None) -> ExplainedInputs:
    """Visit the inputs once: check them and make what the explainer runs on.

    First the numbers of dimensions the model's BatchNorms check (a look at each checked input's
    ``dim()``, :func:`~fxlrp.explain.rank_checks.refuse_ranks_the_model_refuses`); then, per
    input, its NaN and Inf flags (read with the other checks' at the end of the call), its leaf,
    edge and values, whether it may be token ids and whether it is on the meta device.

    Parameters
    ----------
    explain
        The explainer.
    inputs
        The inputs by position: a tensor alone, or a sequence.
    finite
        The call's NaN and Inf checks; None: no checks (``check_finite=False``).

    Returns
    -------
    ExplainedInputs
        The inputs as the explanation's passes read them.

    Raises
    ------
    ExplanationInputError
        For an input with a number of dimensions a BatchNorm of the model refuses.
    """
    given = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    refuse_ranks_the_model_refuses(explain, given)
    leaves, edges, values, token_ids, flags = [], [], [], [], []
    without_values = None
    for position, value in enumerate(given):
        if finite is not None:
            flags += non_finite_flags(value)
        leaf = _leaf_if_explained(value)
        leaves.append(leaf)
        if not isinstance(leaf, Tensor):
            continue
        if leaf.requires_grad:
            edges.append(get_gradient_edge(leaf))
            values.append(leaf.detach())
        elif may_be_token_ids(leaf):
            token_ids.append(leaf)
        if without_values is None and leaf.device.type == "meta":
            without_values = position
    if finite is not None and flags:
        finite.add(flags, lambda: refuse_non_finite_inputs(explain, inputs))
    return ExplainedInputs(inputs, leaves, edges, values, token_ids, without_values)


def _leaf_if_explained(value: Any) -> Any:
    """A floating-point tensor becomes a fresh leaf that collects relevance; the rest stays (a
    tensor made in inference mode, which autograd cannot keep, as a copy)."""
    if isinstance(value, Tensor) and value.is_inference():
        value = value.clone()
    if isinstance(value, Tensor) and value.is_floating_point():
        return value.detach().requires_grad_()
    return value


def is_explained_leaf(value: Any) -> bool:
    """Whether an input the explainer runs on collects relevance (a leaf of autograd).

    Parameters
    ----------
    value
        One of :attr:`ExplainedInputs.leaves`.

    Returns
    -------
    bool
        True for a tensor that requires gradients.
    """
    return isinstance(value, Tensor) and value.requires_grad
