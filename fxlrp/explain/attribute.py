"""``fxlrp.attribute`` and ``fxlrp.attribute_nodes``: the relevance of a model's inputs (and nodes)
for a target, by one forward and one backward pass of an explainer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.errors import ExplanationInputError, FxlrpError
from fxlrp.explain.absorption import absorbing_layer, absorbing_module
from fxlrp.explain.explained_inputs import ExplainedInputs, explained_inputs, is_explained_leaf
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.finite_checks import (
    FiniteChecks,
    absolute_total,
    one_vanishing_warning,
    refuse_non_finite_output,
    refuse_non_finite_relevance,
    relevance_totals,
)
from fxlrp.explain.input_checks import no_floating_input_error, no_receiver_error, refuse_unusable_inputs
from fxlrp.explain.model_rejection import FAILURES, input_rejection, model_of, raised_by_fxlrp, raised_from_the_call
from fxlrp.explain.targets import (
    LISTED_PER_POSITION,
    FromOutput,
    default_output,
    logits_per_position,
    made_for_the_call,
    output_relevance,
    padding_mask,
    per_copy,
    refuse_unknown_target,
)
from fxlrp.relevance.form import GradientFormUnavailable, gradient_form, relevance_at
from fxlrp.relevance.rule_function import reusable_graph
from fxlrp.relevance.sources import RelevanceSource, looked_up_with, sources_collected, token_relevance
from fxlrp.relevance.stabilise import divide_dropping_zeros

InputRelevance = Tensor | tuple[Tensor | None, ...] | dict[str, Tensor | None]
"""Relevance of the inputs: a tensor for a tensor input, else one entry per input (None for
inputs that receive none), as captum returns attributions; inputs given by name get a dict."""


Inputs = Tensor | Sequence[Any] | Mapping[str, Any]
"""A model's inputs: a tensor, a sequence by position, or a mapping by name (a tokenizer's output)."""


@raised_from_the_call
def attribute(
    explain: Explainer | nn.Module,
    inputs: Inputs,
    target: Any = None,
    *,
    output: Callable[[Any], Tensor] | None = None,
    repeat: int = 0,
    check_finite: bool = True,
) -> InputRelevance:
    """Relevance of each input in one call.

    ``inputs``: a tensor, a sequence of inputs, or a mapping of the model's inputs by name, as a
    tokenizer returns them (``tokenizer(text, return_tensors="pt")``: ``input_ids``,
    ``attention_mask``, ...), given to the model at their places in its ``forward`` (the inputs left
    out before the last one given take their defaults). Each floating-point tensor gets its relevance;
    token ids that the model looks up in an embedding (``nn.Embedding``, ``F.embedding``,
    ``nn.EmbeddingBag``) get the relevance of each token: the relevance reaching the lookup's
    output summed over the embedding dimension, of the ids' shape (:func:`attribute_nodes` with
    the embedding node gives it per dimension). Other inputs (integer indices such as a GNN's
    senders/receivers, settings) are passed as they are and get ``None``.
    ``target``: see :func:`output_relevance`. A list ``[t1, ..., tk]`` of such targets explains
    each: every relevance then has a leading dimension of ``k`` (``[k, *input.shape]``), equal to
    ``k`` separate calls. (Not on a language model's per-position logits picked by default: a list
    there would explain every target at the last position only, which is never what explaining
    generated text means, so it is an error naming :func:`fxlrp.explain_generation`, which explains
    each generated token at its own position; candidates for the next token are a list once the
    position is picked, ``output=lambda out: out.logits[:, -1]``.) One forward pass serves all
    ``k`` (its graph kept under :func:`~fxlrp.relevance.rule_function.reusable_graph`), with one
    backward pass per target:
    right for any model, a graph network's nodes included. ``repeat=n`` (n >= 1) instead explains
    the inputs repeated along their first dimension, up to ``n`` copies per forward and backward
    pass, copy ``i`` for target ``t_i``: for models whose first dimension is the batch (CNNs,
    transformers; not a graph network's nodes), with class indices as targets; every tensor input
    whose first dimension is the batch size is repeated. (``torch.autograd.grad(...,
    is_grads_batched=True)`` cannot serve: its vmap fails in fxlrp's relevance Functions.)
    ``output``: picks the explained tensor from the model's output (e.g.
    ``lambda graphs: graphs.global_features``); by default the output itself, or for a model
    output with ``logits`` (Hugging Face) the logits, of the last position where they are given
    per position (a causal LM: the next token; pass ``output=`` for another position) - with an
    input named ``attention_mask`` (a padding mask), of each sequence's last token.
    Relevance is returned with the shapes of the inputs: a tensor for a tensor input, a tuple for
    a sequence of inputs, a dict with the same keys for a mapping (:data:`InputRelevance`).
    ``check_finite``: a floating-point input with NaN or Inf, an explained output that is not
    finite (an activation overflowed) or relevance that is not (a quotient overflowed, in float16)
    is a ``ValueError`` saying which and what to do, instead of NaN relevance (see
    :mod:`fxlrp.explain.finite_checks`); and relevance reaching the inputs that is a negligible
    share of the output's (under a millionth, absolute values summed: the rules absorbed it, as
    biases that make up nearly all of a randomly initialised model's output do) is a
    :class:`fxlrp.VanishedRelevanceWarning`, once per call, naming the layer that absorbed most
    (see :func:`~fxlrp.explain.finite_checks.warn_of_vanished_relevance` for why a millionth, and
    :mod:`fxlrp.explain.absorption` for which layer). False
    returns whatever comes out, without these checks' synchronisations with the device.

    Inputs and targets are checked before the explanation runs (:mod:`fxlrp.explain.input_checks`,
    :mod:`fxlrp.explain.rank_checks`): inputs the model itself would not take are refused in its own
    words (see Raises; :mod:`fxlrp.explain.model_rejection`).

    Parameters
    ----------
    explain
        The explainer :func:`fxlrp.convert` returned.
    inputs
        The model's inputs, as described above.
    target
        What to explain (see :func:`~fxlrp.explain.targets.output_relevance`): None (each
        sample's highest output, the predicted class), a class index (an int; negative ones count
        from the end, as in torch indexing: ``-1`` is the last class), a tensor of one index per
        sample, a pair ``(a, b)`` (logit ``a`` minus logit ``b``), a float tensor of the explained
        output's shape (the output relevance itself), a :class:`~fxlrp.Region` (a class over a box
        or mask of an image-shaped output), or a list of these. A float or bool is no
        class index, and no target is rounded to one.
    output, repeat, check_finite
        As described above.

    Returns
    -------
    InputRelevance
        The relevance of each input, with the inputs' shapes (a leading dimension per target
        for a list of targets).

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        (a ``ValueError`` and a ``TypeError``) for inputs given as NumPy arrays, lists of numbers,
        text or other objects than tensors; for a list of targets on a language model's
        per-position logits without ``output=``; for inputs the model itself rejects - no batch
        dimension, another dtype or device than its parameters, a wrong shape: the model's own
        message, with what to do; for a target of no known kind (a name, a float, a bool, a
        tensor on the meta device), an index out of range, a float tensor not of the output's
        shape.
    ValueError
        For NaN or Inf in an input, the output or the relevance (``check_finite``).
    """
    refuse_unusable_inputs(explain, inputs)
    refuse_unknown_target(target)
    return _attribute(explain, inputs, target, output=output, nodes=None, repeat=repeat, check_finite=check_finite)


@raised_from_the_call
def attribute_nodes(
    explain: Explainer,
    inputs: Inputs,
    nodes: Sequence[str],
    target: Any = None,
    *,
    output: Callable[[Any], Tensor] | None = None,
    repeat: int = 0,
    check_finite: bool = True,
) -> tuple[InputRelevance, dict[str, Tensor]]:
    """:func:`attribute`, and the relevance of intermediate nodes: ``(input relevance, {name:
    relevance of that node's output})``.

    ``nodes``: names of nodes of ``explain.report()`` (e.g. ``"layer1_0_relu"``, an embedding
    lookup for the relevance of each token per dimension, or a GNN's per-edge message node). A
    node's relevance is what reaches its output in the backward pass, summed over its consumers,
    of the shape of its output; with a list of targets it gets the same leading dimension as the
    inputs' relevance. The other arguments are :func:`attribute`'s.

    Parameters
    ----------
    explain
        The explainer :func:`fxlrp.convert` returned.
    inputs, target, output, repeat, check_finite
        As for :func:`attribute`.
    nodes
        As described above.

    Returns
    -------
    tuple of (InputRelevance, dict of str to Tensor)
        The inputs' relevance and each node's.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        As :func:`attribute` raises it.
    TypeError
        For ``nodes`` that are not a list of names; ValueError for a name no node has.
    """
    if isinstance(nodes, str) or not all(isinstance(name, str) for name in nodes):
        raise TypeError(f"nodes must be a list of node names from explain.report(), got {nodes!r}")
    refuse_unusable_inputs(explain, inputs)
    refuse_unknown_target(target)
    return _attribute(explain, inputs, target, output=output, nodes=nodes, repeat=repeat, check_finite=check_finite)


def attribute_from_output(
    explain: Explainer | nn.Module,
    inputs: Inputs,
    starts: Sequence[Callable[[Tensor], Tensor]],
    *,
    output: Callable[[Any], Tensor],
    check_finite: bool = True,
) -> InputRelevance:
    """:func:`attribute` for targets that need the explained output's values: ``starts[i](output)``
    is the relevance the ``i``-th explanation starts from, of the output's shape. One forward pass
    serves all, with one backward pass each, as for a list of targets (the relevance has a leading
    dimension of ``len(starts)``); each is made when its backward pass runs. What
    :func:`fxlrp.explain_generation` explains its rows with.

    Parameters
    ----------
    explain
        The explainer :func:`fxlrp.convert` returned.
    inputs
        The model's inputs, as :func:`attribute` takes them.
    starts
        One function of the explained output per explanation, at least one.
    output
        Picks the explained tensor from the model's output.
    check_finite
        As for :func:`attribute`.

    Returns
    -------
    InputRelevance
        The relevance of each input, ``[len(starts), *input.shape]``.
    """
    refuse_unusable_inputs(explain, inputs)
    return _attribute(explain, inputs, [FromOutput(start) for start in starts], output=output, nodes=None,
                      repeat=0, check_finite=check_finite)


def _attribute(
    explain: Explainer | nn.Module, inputs: Inputs, target: Any, *,
    output: Callable[[Any], Tensor] | None, nodes: Sequence[str] | None, repeat: int, check_finite: bool,
    listed: bool = False,
) -> Any:
    """:func:`attribute` and :func:`attribute_nodes` (``nodes`` not None). ``listed``: the targets
    were given as a list (explained ``repeat`` at a time, as one tensor of them per pass)."""
    if isinstance(inputs, Mapping):
        by_position, positions = inputs_by_position(explain, inputs)
        found = _attribute(explain, by_position, target, output=output, nodes=nodes, repeat=repeat,
                           check_finite=check_finite, listed=listed)
        input_relevance = found if nodes is None else found[0]
        keyed = {name: input_relevance[position] for name, position in positions.items()}
        return keyed if nodes is None else (keyed, found[1])
    if torch.is_inference_mode_enabled():
        # Relevance travels by autograd, which inference mode turns off: the explanation leaves it.
        with torch.inference_mode(False):
            return _attribute(explain, inputs, target, output=output, nodes=nodes, repeat=repeat,
                              check_finite=check_finite, listed=listed)
    many = isinstance(target, list)
    with one_vanishing_warning():
        return _attribute_checked(explain, inputs, target, output=output, nodes=nodes, repeat=repeat,
                                  check_finite=check_finite, listed=listed, many=many)


def _attribute_checked(
    explain: Explainer | nn.Module, inputs: Tensor | Sequence[Any], target: Any, *,
    output: Callable[[Any], Tensor] | None, nodes: Sequence[str] | None, repeat: int, check_finite: bool,
    listed: bool, many: bool,
) -> Any:
    """:func:`_attribute` for inputs by position, outside inference mode."""
    if many and not target:
        raise ValueError("target=[] names no target; give at least one")
    if many and repeat > 0:
        return _attribute_repeated(explain, inputs, target, output=output, nodes=nodes, repeat=repeat,
                                   check_finite=check_finite)
    finite = FiniteChecks() if check_finite else None
    walked = explained_inputs(explain, inputs, finite)
    if nodes is not None and not isinstance(explain, Explainer):
        raise TypeError("attribute_nodes needs the explainer returned by fxlrp.convert")
    request = _Request(explain, walked, target, output, nodes, many, listed=listed or many, finite=finite,
                       gradient=nodes is None and getattr(explain, "gradient_form", False))
    try:
        results = _backward(request)
    except GradientFormUnavailable:
        # The composite allows the gradient form but the model meets a rule or operation without
        # one (an operation's own default rule, PReLU): this explainer keeps to the relevance form.
        explain.keep_to_relevance_form()
        results = _backward(dataclasses.replace(request, gradient=False))
    if finite is not None:
        input_relevance = [result if nodes is None else result[0] for result in results]
        refusal = functools.partial(refuse_non_finite_relevance, results)
        if request.output_totals:
            totals = relevance_totals(input_relevance, request.output_totals[0].device)
            finite.add(totals, refusal)  # (not finite where the relevance is not)
            finite.compare_totals(request.output_totals, totals, functools.partial(
                _absorbing_layer, explain, walked.given, target, output=output, many=many))
        else:
            finite.check(input_relevance, refusal)
        if nodes is not None:
            finite.check([result[1:] for result in results], refusal)
        finite.refuse()
    return _merged(results, torch.stack) if many else results[0]


def _absorbing_layer(explain: Explainer | nn.Module, inputs: Tensor | Sequence[Any], target: Any, first: int, *,
                     output: Callable[[Any], Tensor] | None, many: bool) -> str | None:
    """The layer that absorbed most of target ``first``'s relevance
    (:func:`~fxlrp.explain.absorption.absorbing_layer`), by one more pass without the checks (so
    without a warning of its own); where the graph names none (a model run eagerly as a whole),
    the module that did (:func:`~fxlrp.explain.absorption.absorbing_module`); None where neither
    is found."""
    if not isinstance(explain, Explainer):
        return None
    explainer = explain.explainer_for(*((inputs,) if isinstance(inputs, Tensor) else inputs))[0]

    def relevance_of_nodes(names: list[str]) -> dict[str, Tensor | None]:
        return _attribute(explain, inputs, target[first] if many else target, output=output, nodes=names, repeat=0,
                          check_finite=False)[1]

    try:
        return (absorbing_layer(explainer, relevance_of_nodes)
                or absorbing_module(explainer, functools.partial(relevance_of_nodes, [])))
    except (TypeError, ValueError, RuntimeError):
        # A graph the pass cannot record (a layer's output no tensor where the graph does not show
        # it): no layer named, the warning says how to find it; the explanation itself succeeded.
        return None


@dataclasses.dataclass(frozen=True)
class _Request:
    """One explanation :func:`attribute` asks of the explainer's passes."""

    explain: nn.Module
    inputs: ExplainedInputs
    """The inputs, walked once: as given, and what the explainer runs on."""
    target: Any
    output: Callable[[Any], Tensor] | None
    nodes: Sequence[str] | None
    """The intermediate nodes whose relevance is asked for (:func:`attribute_nodes`), or None."""
    many: bool
    """Whether ``target`` is a list of targets explained from this forward, each with a backward pass."""
    listed: bool
    """Whether the user gave a list of targets (this pass may explain copies of the inputs for them)."""
    finite: FiniteChecks | None
    """The checks for NaN and Inf, read once at the end of the call; None: no checks."""
    gradient: bool
    """Whether the passes run in the gradient form (:mod:`fxlrp.relevance.form`), converted back
    to relevance at the end."""
    output_totals: list[Tensor] = dataclasses.field(default_factory=list)
    """Per target, the summed absolute relevance its backward pass starts from (under
    ``check_finite``): what :func:`~fxlrp.explain.finite_checks.warn_of_vanished_relevance` compares."""


def _backward(request: _Request) -> list[Any]:
    """:func:`attribute`'s forward and backward passes: per target, the relevance of the inputs
    (and the intermediate nodes), as :func:`_assembled` gives it; a failed forward is explained
    in the user's terms."""
    try:
        return _passes(request)
    except _ForwardFailed as failed:
        error, ids_looked_up = failed.error, failed.ids_looked_up
    explain, inputs = request.explain, request.inputs.given
    model = model_of(explain)
    single = isinstance(inputs, Tensor)
    rejection = input_rejection(explain, model, (inputs,) if single else tuple(inputs), {}, error)
    # The inputs' dtype is blamed only where the model itself fails on them too (or is not there to
    # ask): a failure of the explanation alone (a library's hook around the model's modules) is not
    # the inputs'.
    if isinstance(error, (RuntimeError, TypeError)) and (model is None or rejection is not None):
        replaced = no_floating_input_error(inputs, error, ids_looked_up)
        if replaced is not error:
            raise replaced from None
    if rejection is None:
        raise error
    raise rejection from rejection.__cause__


class _ForwardFailed(Exception):  # noqa: N818 - a signal within this module, never shown
    """The explainer's forward failed with ``error`` (carried out of the passes' contexts)."""

    def __init__(self, error: BaseException, ids_looked_up: bool) -> None:
        super().__init__()
        self.error, self.ids_looked_up = error, ids_looked_up


def _passes(request: _Request) -> list[Any]:
    """:func:`_backward`'s passes; a failure of the forward raised as :class:`_ForwardFailed`.
    The relevance each target starts from is made when its backward pass runs, and what reaches
    an embedding lookup is summed per token as soon as it has (one output-sized tensor and one
    lookup-sized one at a time, however many targets)."""
    explain, walked, nodes, many = request.explain, request.inputs, request.nodes, request.many
    inputs, leaves, values = walked.given, walked.leaves, walked.values
    target, output, gradient = request.target, request.output, request.gradient
    with (torch.enable_grad(), sources_collected(walked.token_ids) as lookups,
          reusable_graph() if many else nullcontext(),
          gradient_form(gradient)):
        try:
            if nodes is None:
                result, recorded = explain(*leaves), {}
            else:
                result, recorded = explain.run_recording(list(nodes), *leaves)
        except FxlrpError:
            raise
        except FAILURES as error:
            if raised_by_fxlrp(error):
                raise
            raise _ForwardFailed(error, bool(lookups.sources) or lookups.of_copied_ids()) from None
        walked.refuse_without_values(explain)
        if request.listed and output is None and logits_per_position(result):
            raise ExplanationInputError(LISTED_PER_POSITION)
        explained = output(result) if output is not None else default_output(result, padding_mask(explain, inputs))
        if not isinstance(explained, Tensor):
            raise TypeError(
                f"the model returns {type(explained).__name__}; pass output=... to pick the tensor to explain"
            )
        intermediate = [_relevance_carrier(name, value) for name, value in recorded.items()]
        looked_up = [looked_up_with(leaf, lookups.sources) for leaf in leaves]
        wanted = walked.edges + [value for value in intermediate if value is not None]
        wanted += [source.edge for found in looked_up for source in found]
        if not wanted:
            raise no_receiver_error(lookups)
        if not explained.requires_grad:
            stops = explain.report().relevance_stops() if isinstance(explain, Explainer) else []
            raise ValueError(
                "the explained output does not depend on the inputs along any path relevance can take: each "
                "path is cut by a .detach() or torch.no_grad() in the model, or passes an operation LRP holds "
                "constant (a norm, variance, sqrt or rsqrt of an input-dependent value is a statistic and gets "
                "no relevance), so there is no relevance to give. Explain an output the inputs reach; where such "
                "a sqrt is an activation of your model, register it with the identity rule (docs/extending.md)"
                + "".join(f"\n  - relevance stops at {stop}" for stop in stops)
            )
        if request.finite is not None:
            request.finite.check(explained, lambda: refuse_non_finite_output(explained))
        samples = next((leaf.shape[0] for leaf in leaves if isinstance(leaf, Tensor) and leaf.dim() > 1), None)
        request.output_totals.clear()  # (of a pass in the relevance form after one in the gradient form failed)

        def start_of(one: Any) -> Tensor:
            start = output_relevance(explained, one, samples)
            if request.finite is not None:
                request.output_totals.append(absolute_total(start).float())
            if gradient:  # g = R / y at the output, into the relevance where it is fxlrp's own
                start = divide_dropping_zeros(start, explained.detach(), in_place=made_for_the_call(one))
            return start

        if gradient:  # R = x g at the inputs and the lookups' outputs
            values = values + [source.embedding for found_here in looked_up for source in found_here]

        def assembled(grads: tuple[Tensor | None, ...]) -> Any:
            with torch.no_grad():  # (values the relevance is computed from, not a graph to keep)
                if gradient:
                    grads = tuple(relevance_at(value, share) for value, share in zip(values, grads, strict=True))
                return _assembled(iter(grads), leaves, looked_up, recorded, intermediate,
                                  isinstance(inputs, Tensor), nodes is None)

        # Each pass's starting relevance is made as its argument, so that nothing here holds it once
        # the pass has returned: one output-sized tensor beside the output, however many targets.
        return [assembled(torch.autograd.grad(explained, wanted, start_of(one), allow_unused=True,
                                              retain_graph=many))
                for one in (target if many else [target])]


def _assembled(
    relevance: Iterator[Tensor | None],
    leaves: list[Any],
    looked_up: list[list[RelevanceSource]],
    recorded: dict[str, Any],
    intermediate: list[Tensor | None],
    single: bool,
    inputs_only: bool,
) -> Any:
    """:func:`attribute`'s result from the gradients of one backward pass."""
    input_relevance = tuple(
        _zero_if_none(next(relevance), leaf) if is_explained_leaf(leaf) else None for leaf in leaves
    )
    node_relevance = {
        name: torch.zeros_like(value) if carrier is None else _zero_if_none(next(relevance), value)
        for (name, value), carrier in zip(recorded.items(), intermediate, strict=True)
    }
    input_relevance = tuple(
        token_relevance(leaf, found, relevance) if found else given
        for leaf, found, given in zip(leaves, looked_up, input_relevance, strict=True)
    )
    input_result = input_relevance[0] if single else input_relevance
    if inputs_only:
        return input_result
    return input_result, node_relevance


def _merged(results: list[Any], merge: Callable[[list[Tensor]], Tensor]) -> Any:
    """Results of the same structure (tensors, None, tuples, dicts) merged tensor by tensor."""
    first = results[0]
    if isinstance(first, Tensor):
        return merge(results)
    if isinstance(first, tuple):
        return tuple(_merged([result[i] for result in results], merge) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _merged([result[key] for result in results], merge) for key in first}
    return first  # None: an input without relevance


def _attribute_repeated(explain: nn.Module, inputs: Tensor | Sequence[Any], targets: list[Any], *,
                        output: Callable[[Any], Tensor] | None, nodes: Sequence[str] | None, repeat: int,
                        check_finite: bool) -> Any:
    """:func:`attribute` for ``k`` targets by explaining up to ``repeat`` copies of the inputs,
    stacked along their first dimension, per pass; results ``[k, batch, ...]``."""
    single = isinstance(inputs, Tensor)
    values = (inputs,) if single else tuple(inputs)
    batch = next((value.shape[0] for value in values if isinstance(value, Tensor) and value.dim() > 0), None)
    if batch is None:
        raise ValueError("attribute(..., repeat=...) needs a tensor input whose first dimension is the batch")
    chunks = []
    for start in range(0, len(targets), repeat):
        chunk = targets[start:start + repeat]
        copies = [value.repeat(len(chunk), *[1] * (value.dim() - 1))
                  if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch else value
                  for value in values]
        combined = torch.cat([per_copy(target, batch) for target in chunk])
        result = _attribute(explain, copies[0] if single else copies, combined, output=output, nodes=nodes,
                            repeat=0, check_finite=check_finite, listed=True)
        copied = len(chunk)
        chunks.append(_merged([result], lambda tensors: tensors[0].reshape(copied, -1, *tensors[0].shape[1:])))
    return _merged(chunks, torch.cat)


"""The name of the input :func:`default_output` takes as a padding mask (Hugging Face's)."""


def inputs_by_position(explain: nn.Module, inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, int]]:
    """Inputs given by name as :func:`attribute` takes them: by position in the model's
    ``forward``, each input left out before the last one given taking its default; and the
    position of each name."""
    parameters = [parameter for parameter in getattr(explain, "input_parameters", ())
                  if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    names = [parameter.name for parameter in parameters]
    if not parameters:
        raise TypeError(
            f"the inputs are given by name ({', '.join(map(repr, inputs))}), but the names of the model's inputs "
            "are not known here (a module not made by fxlrp.convert, or saved by an older fxlrp): give them by "
            "position, in the order of the model's forward"
        )
    for name in inputs:
        if name not in names:
            raise TypeError(
                f"the model's forward has no input {name!r} that can be given by position (its inputs: "
                f"{', '.join(names)}): leave {name!r} out, or give the inputs by position"
            )
    last = max((names.index(name) for name in inputs), default=-1)
    for parameter in parameters[:last]:
        if parameter.name not in inputs and parameter.default is parameter.empty:
            raise TypeError(
                f"the model's input {parameter.name!r} comes before those given and has no default: give it too"
            )
    by_position = tuple(inputs[parameter.name] if parameter.name in inputs else parameter.default
                        for parameter in parameters[:last + 1])
    return by_position, {name: names.index(name) for name in inputs}


def _relevance_carrier(name: str, value: Any) -> Tensor | None:
    """The node's output tensor if relevance can reach it; None if it depends on no input."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"node {name!r} outputs {type(value).__name__}, not a tensor; pick the node that takes "
            "the tensor out of it (its getitem or attribute node in explain.report())"
        )
    return value if value.requires_grad else None


def _zero_if_none(relevance: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if relevance is None else relevance
