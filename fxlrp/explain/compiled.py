"""``fxlrp.compile``: an explanation, forward and relevance backward, compiled as one graph.

``torch.compile(explain)`` cannot compile an explainer: TorchDynamo traces Python bytecode, and
the relevance Functions' forward builds the inner autograd graph their backward pulls relevance
back through (``get_gradient_edge``, ``.grad_fn``, leaves made with ``requires_grad_()``) and keeps
state between the two passes in Python objects (a ReLU rectifying a rule's kept output, an
activation recomputed from it). Dynamo would break the graph at each of them, resume, and
recompile each rewritten node's ``forward`` for every operation it serves until its recompile
limit (``docs/datasets.md``, "Compiled explanations"); so that ``forward`` is skipped by Dynamo
(``torch.compiler.disable``): ``torch.compile(explain)`` gives the eager relevance without
recompiling, but compiles next to nothing.

:func:`compile` traces one level lower instead. ``torch.fx.experimental.proxy_tensor.make_fx``
runs the whole explanation (the explainer's forward, the start relevance, ``torch.autograd.grad``
through the relevance Functions' backward) on the real tensors of a first call and records the
ATen operations that reach the dispatcher: the relevance Functions' Python runs as it always
does, so what they compute is what is recorded, in one graph without autograd. That graph is
compiled by ``torch.compile`` (Inductor by default) with static shapes, once per input shapes
(and dtypes, devices, target kind); later calls with inputs of those shapes run it with no
tracing and no recompilation.

What a trace fixes: the explainer's weights at the time of the trace (they are the graph's
constants), Python values among the inputs, and every decision the code takes from shapes. A
decision taken from tensor values cannot be recorded; the rules that take one to skip work
(z+/alpha-beta's ``x-`` terms, gamma's halves) compute every term while traced
(:mod:`fxlrp.relevance.tracing`), any other is an error naming the operation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fxlrp.explain.input_checks import no_floating_input_error, no_receiver_error
from fxlrp.explain.model_rejection import raised_by_fxlrp
from fxlrp.explain.targets import default_output, padding_mask
from fxlrp.relevance.form import GradientFormUnavailable, gradient_form, relevance_at
from fxlrp.relevance.sources import looked_up_with, may_be_token_ids, sources_collected, token_relevance
from fxlrp.relevance.stabilise import divide_dropping_zeros
from fxlrp.relevance.tracing import traced

EXACT_INDUCTOR_OPTIONS = {"layout_optimization": False}
"""Inductor's channels-last layout for convolutions changes their rounding (about 1e-7 relative),
which the epsilon rule's small denominators amplify (1e-4 on a random ResNet-18); with the
model's own layout the compiled relevance equals the eager one bit for bit on the CPU."""


@dataclass
class _Entry:
    """A compiled explanation for one kind of call."""

    run: Callable[..., Any]
    classes: int | None
    receivers: list[bool]
    """Which inputs receive relevance: the floating-point ones and the token ids an embedding looked up."""


class CompiledExplanation:
    """``fxlrp.attribute(explain, inputs, target)`` as a compiled graph; made by :func:`compile`.

    ``compiled(inputs, target)`` returns what ``fxlrp.attribute`` returns for inputs of floating
    point (images, features, embeddings), token ids and other tensors or values that are passed as
    they are (a graph's indices): the relevance of each floating-point input and, per token, of
    the ids an embedding looks up (None for the others). ``target`` is None (each sample's
    highest output), a class index, a tensor of one class index per sample, or a float tensor of
    the explained output's shape (the output relevance itself). ``return_output=True`` also
    returns the explained output (``[batch, classes]`` for a classifier), from the same pass.
    ``graphs`` counts the traces made so far: one per kind of call (shapes, dtypes, devices,
    target kind, autocast).
    """

    def __init__(self, explain: nn.Module, output: Callable[[Any], Tensor] | None, backend: str | Callable[..., Any],
                 mode: str | None, options: dict[str, Any] | None) -> None:
        self.explain, self.output = explain, output
        self.backend, self.mode, self.options = backend, mode, options
        self._entries: dict[tuple[Any, ...], _Entry] = {}

    @property
    def graphs(self) -> int:
        return len(self._entries)

    def __call__(self, inputs: Tensor | Sequence[Any], target: Any = None, *, return_output: bool = False) -> Any:
        single = isinstance(inputs, Tensor)
        values = (inputs,) if single else tuple(inputs)
        explained = [_is_explained(value) for value in values]
        if not any(explained) and not any(map(may_be_token_ids, values)):
            raise ValueError("fxlrp.compile explains floating-point inputs (images, features, embeddings) or the "
                             "token ids an embedding looks up; none was given")
        target_kind, target_tensor = _target_argument(target, values)
        if getattr(self.explain, "follow_model", lambda: False)():  # the model changed: traces of the old one
            self._entries.clear()
        key = (tuple(_key_of(value) for value in values), target_kind, _key_of(target_tensor), _autocast_state(values))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._traced(values, explained, target_kind, target_tensor)
        if target_kind == "index":
            target_tensor = _in_range(target_tensor, entry.classes)
        tensors = [value for value in values if isinstance(value, Tensor)]
        if target_tensor is not None:
            tensors.append(target_tensor)
        with ExitStack() as modes:
            modes.enter_context(torch.no_grad())  # the graph holds its backward: nothing in it is differentiated
            for device in {tensor.device.type for tensor in tensors}:  # autocast's casts are in the graph
                modes.enter_context(torch.autocast(device, enabled=False))
            relevance, output = entry.run(*tensors)
        relevance = iter(relevance)
        result = tuple(next(relevance) if receives else None for receives in entry.receivers)
        result = result[0] if single else result
        return (result, output) if return_output else result

    def _traced(self, values: tuple[Any, ...], explained: list[bool], target_kind: str,
                target_tensor: Tensor | None) -> _Entry:
        """The explanation traced and compiled in the form ``fxlrp.attribute`` takes: the gradient
        form where the explainer allows it (``R / x`` carried on native autograd, its backward
        mostly the model's own kernels), the relevance form where a rule or operation of the
        model has none."""
        if getattr(self.explain, "gradient_form", False):
            try:
                return self._trace(values, explained, target_kind, target_tensor, gradient=True)
            except GradientFormUnavailable:
                self.explain.keep_to_relevance_form()
        return self._trace(values, explained, target_kind, target_tensor, gradient=False)

    def _trace(self, values: tuple[Any, ...], explained: list[bool], target_kind: str,
               target_tensor: Tensor | None, gradient: bool) -> _Entry:
        from torch.fx.experimental.proxy_tensor import make_fx

        positions = [index for index, value in enumerate(values) if isinstance(value, Tensor)]
        classes: list[int | None] = [None]
        receivers = list(explained)

        def explanation(*tensors: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
            arguments = list(values)
            for position, tensor in zip(positions, tensors, strict=False):
                arguments[position] = tensor.detach().requires_grad_() if explained[position] else tensor
            target = tensors[len(positions)] if target_tensor is not None else None
            ids = [value for value in arguments if may_be_token_ids(value)]
            with torch.enable_grad(), sources_collected(ids) as lookups, gradient_form(gradient):
                try:
                    result = self.explain(*arguments)
                except (RuntimeError, TypeError) as error:  # (an image given as integers: say so)
                    replaced = error if raised_by_fxlrp(error) else no_floating_input_error(
                        values, error, bool(lookups.sources))
                    if replaced is not error:
                        raise replaced from None
                    raise
                output = (self.output(result) if self.output is not None
                          else default_output(result, padding_mask(self.explain, arguments)))
                if not isinstance(output, Tensor):
                    raise TypeError(f"the model returns {type(output).__name__}; pass output=... to fxlrp.compile "
                                    "to pick the tensor to explain")
                classes[0] = output.shape[-1] if output.dim() else None
                start = _start_relevance(output, target, target_kind)
                if gradient:  # g = R / y at the output, R = x g at the inputs and the lookups' outputs
                    start = divide_dropping_zeros(start, output.detach(), in_place=target_kind != "relevance")
                # token ids receive the relevance that reaches the embedding lookups made with them
                looked_up = [looked_up_with(value, lookups.sources) if not is_explained else []
                             for value, is_explained in zip(arguments, explained, strict=True)]
                receivers[:] = [is_explained or bool(found) for is_explained, found in zip(explained, looked_up,
                                                                                           strict=True)]
                if not any(receivers):
                    raise no_receiver_error(lookups)
                leaves = [arguments[index] for index, is_explained in enumerate(explained) if is_explained]
                edges = [source.edge for found in looked_up for source in found]
                relevance = iter(torch.autograd.grad(output, leaves + edges, start, allow_unused=True))
            if gradient:
                values_at = [value.detach() for value in leaves] + [source.embedding for found in looked_up
                                                                    for source in found]
                relevance = iter([relevance_at(value, share) for value, share in zip(values_at, relevance,
                                                                                      strict=True)])
            per_input = []
            for value, is_explained, found in zip(arguments, explained, looked_up, strict=True):
                if is_explained:
                    found_here = next(relevance)
                    per_input.append(torch.zeros_like(value) if found_here is None else found_here)
                elif found:
                    per_input.append(token_relevance(value, found, relevance))
            return tuple(per_input), output.detach()

        tensors = [values[index] for index in positions] + ([target_tensor] if target_tensor is not None else [])
        try:
            with traced():
                graph = make_fx(explanation, tracing_mode="real")(*tensors)
        except RuntimeError as error:
            if "data-dependent" not in str(error) and "_local_scalar_dense" not in str(error):
                raise
            raise RuntimeError(
                "fxlrp.compile: the explanation reads a tensor's values to decide what to compute (an `if` "
                "on a value, .item(), .tolist()), which a compiled graph cannot record for every input; "
                f"explain this model with fxlrp.attribute. ({str(error).splitlines()[0]})"
            ) from error
        _views_as_reshapes(graph)
        mode, options = _mode_and_options(self.backend, self.mode, self.options)
        run = torch.compile(graph, fullgraph=True, dynamic=False, backend=self.backend, mode=mode, options=options)
        if (options or {}).get("triton.cudagraphs") and any(tensor.is_cuda for tensor in tensors):
            run = _fresh_outputs(run)
        return _Entry(run, classes[0], receivers)


def _mode_and_options(backend: str | Callable[..., Any], mode: str | None,
                      options: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
    """``torch.compile``'s ``mode`` and ``options`` for a compiled explanation: for Inductor, the
    mode's own options (``torch._inductor.list_mode_options``; ``"reduce-overhead"``: CUDA graphs)
    with :data:`EXACT_INDUCTOR_OPTIONS` or the caller's ``options`` over them, and no mode -
    ``torch.compile`` takes one of the two, and a mode alone would drop the model's layout."""
    if backend != "inductor":
        return mode, options
    from torch._inductor import list_mode_options

    mode_options = list_mode_options(mode) if mode is not None else {}  # (None: every mode's, by name)
    return None, {**mode_options, **(EXACT_INDUCTOR_OPTIONS if options is None else options)}


def _fresh_outputs(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` replayed as a CUDA graph, whose outputs live in the graph's memory pool and are
    overwritten by its next replay: each call starts a new step of the graphs
    (``torch.compiler.cudagraph_mark_step_begin``) and returns copies, so that the relevance of one
    call stays the caller's after the next."""

    def replayed(*tensors: Tensor) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        relevance, output = run(*tensors)
        return tuple(value.clone() for value in relevance), output.clone()

    return replayed


def compile(explain: nn.Module, *, output: Callable[[Any], Tensor] | None = None,
            backend: str | Callable[..., Any] = "inductor", mode: str | None = None,
            options: dict[str, Any] | None = None) -> CompiledExplanation:
    """The explanation ``fxlrp.attribute(explain, inputs, target)`` compiled into one graph per
    kind of call (input shapes, dtypes, devices, target kind): forward, start relevance and the
    relevance backward together, with no recompilation for further inputs of the same shapes.

    ``output``: picks the explained tensor from the model's output (as for ``attribute``).
    ``backend``, ``mode``, ``options``: ``torch.compile``'s. Inductor's default here keeps the
    model's memory layout for convolutions (:data:`EXACT_INDUCTOR_OPTIONS`), which makes the
    relevance equal to the eager one; ``options={}`` lets Inductor choose (faster on some
    machines, about 1e-4 relative off under the epsilon rule). ``mode="reduce-overhead"`` replays
    the explanation as a CUDA graph on a GPU (one launch for its kernels: for a repeated
    explanation of one shape, where the host's issuing of kernels sets the time); each call
    returns copies of the graph's outputs, which its next replay overwrites. On the CPU it is the
    default mode.

    The explanation is traced in the form ``attribute`` takes: the gradient form (``R / x``
    carried on autograd, :mod:`fxlrp.relevance.form`) where the explainer allows it, else the
    relevance form. The first call of each kind traces and compiles (tens of seconds on a CPU);
    the trace holds the explainer's weights as they are then. ``attribute_nodes``, ``attribute``'s
    ``repeat=`` and lists of targets are not compiled.
    """
    return CompiledExplanation(explain, output, backend, mode, options)


def _is_explained(value: Any) -> bool:
    return isinstance(value, Tensor) and value.is_floating_point()


def _key_of(value: Any) -> Any:
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device)
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return ("value", type(value), value)


def _autocast_state(values: tuple[Any, ...]) -> tuple[Any, ...]:
    devices = sorted({value.device.type for value in values if isinstance(value, Tensor)})
    return tuple((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                 for device in devices if torch.is_autocast_enabled(device))


def _target_argument(target: Any, values: tuple[Any, ...]) -> tuple[str, Tensor | None]:
    """The target's kind and the tensor the graph takes for it (None: each sample's highest output)."""
    if target is None:
        return "predicted", None
    if isinstance(target, (list, tuple)):
        raise ValueError("fxlrp.compile explains one target per sample (None, a class index or a tensor of "
                         "indices, or the output relevance); use fxlrp.attribute for lists and contrasts")
    device = next(value.device for value in values if isinstance(value, Tensor))
    tensor = torch.as_tensor(target, device=device)
    if tensor.is_floating_point():
        return "relevance", tensor
    return "index", tensor.long()


def _in_range(index: Tensor, classes: int | None) -> Tensor:
    """Class indices checked against the output's classes (negative ones count from the end)."""
    if classes is not None and index.numel() and bool(((index < -classes) | (index >= classes)).any()):
        raise ValueError(f"target {index.tolist()!r} is out of range: the explained output has {classes} classes "
                         f"(indices 0 to {classes - 1})")
    return index


def _start_relevance(output: Tensor, target: Tensor | None, kind: str) -> Tensor:
    """``R = output * one-hot(target)`` (the relevance itself for a float target), recorded."""
    if kind == "relevance":
        return target.expand(output.shape)
    if output.dim() == 0:
        return output.detach().clone()
    classes = output.shape[-1]
    index = output.detach().argmax(dim=-1) if target is None else target.remainder(classes)
    index = index.expand(output.shape[:-1]) if index.dim() == 0 else index.reshape(output.shape[:-1])
    mask = torch.zeros_like(output).scatter_(-1, index.unsqueeze(-1), 1.0)
    return output.detach() * mask


def _views_as_reshapes(graph: torch.fx.GraphModule) -> None:
    """``view`` -> ``reshape`` in a recorded graph. The trace recorded views that the eager run's
    strides allowed; the compiler infers strides of its own for some operations (the quotient a
    rule writes into its denominator's buffer), where the same view can be impossible. A reshape
    is that view wherever it is possible and a copy elsewhere: the same values."""
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    graph.recompile()
