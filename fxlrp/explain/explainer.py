"""The converted model: same outputs, relevance in backward."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.autograd.graph import get_gradient_edge

from fxlrp.capture.module_state import MODEL_WRITES
from fxlrp.explain.input_checks import (
    no_floating_input_error,
    refuse_non_finite_inputs,
    refuse_non_finite_output,
    refuse_non_finite_relevance,
)
from fxlrp.explain.model_snapshot import ModelSnapshot
from fxlrp.explain.placement import refuse_to_move
from fxlrp.graph.nodes import original_node_name
from fxlrp.graph.report import Report
from fxlrp.relevance.form import GradientFormUnavailable, gradient_form, relevance_at
from fxlrp.relevance.rule_function import outputs_recorded, reusable_graph
from fxlrp.relevance.sources import RelevanceSource, same_values, sources_collected
from fxlrp.relevance.stabilise import divide_dropping_zeros
from fxlrp.relevance.tracing import values_are_traced


class Explainer(nn.Module):
    """Computes the model's outputs; ``output.backward(R)`` leaves input relevance in ``.grad``.

    Created by :func:`fxlrp.convert`. ``graph_module`` is the rewritten torch.fx graph.
    """

    def __init__(self, graph_module: fx.GraphModule, report: Report) -> None:
        super().__init__()
        self.graph_module = graph_module
        self._report = report
        self.__dict__.update(self._conversion_defaults())

    @staticmethod
    def _conversion_defaults() -> dict[str, Any]:
        """What a conversion sets after making the explainer (:func:`fxlrp.convert`), as it is
        before: ``gradient_form``, whether :func:`attribute` may explain in the gradient form
        (:mod:`fxlrp.relevance.form`); ``input_names``, the names of the model's inputs in order
        (:func:`attribute` finds a padding mask by its name); ``input_parameters``, those inputs'
        parameters (:func:`attribute` places inputs given by name); the rest, see
        :meth:`bind_inputs` and :meth:`converted_from`."""
        return {"gradient_form": False, "input_names": (), "input_parameters": (), "_signature": None,
                "_optional_inputs": (),
                "_concrete_args": {}, "_settings": {}, "_traced_for": {}, "_snapshot": None, "_convert_again": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # An explainer saved by an earlier version of fxlrp lacks what later versions added: it
        # gets the defaults, and explains what it was saved with (as every copy does).
        super().__setstate__({**self._conversion_defaults(), **state})

    def converted_from(self, snapshot: ModelSnapshot, convert_again: Callable[..., Explainer]) -> None:
        """What the explainer was converted from, and how to convert it again
        (``convert_again(concrete_args=...)``): see :meth:`follow_model`."""
        self._snapshot, self._convert_again = snapshot, convert_again

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickle, copy.deepcopy, torch.save) explains the model as it was copied: its
        # modules are its own, so there is nothing to follow, and the file needs no more of the
        # model than the graph does. A graph traced for settings keeps how to trace others.
        state = {**self.__dict__, "_snapshot": None}
        if self._signature is None:
            state["_convert_again"] = None
        return state

    def follow_model(self) -> bool:
        """Convert the model again if it changed since conversion in a way the graph does not
        follow by itself (a submodule or parameter replaced, an attribute the trace read as a
        constant, BatchNorm's statistics or the parameters it was folded into; see
        :mod:`fxlrp.explain.model_snapshot`): explanations are always of the model as it is now. Runs
        before every call, but not inside a trace (:func:`fxlrp.compile` checks before tracing); values
        changed in place are shared and need nothing. Returns whether it converted again."""
        if self._snapshot is None or values_are_traced():
            return False
        with MODEL_WRITES:  # (not while another thread's eager run has written into the model)
            if self._snapshot.change() is None:
                return False
            fresh = self._convert_again(concrete_args=self._concrete_args or None)
        self.graph_module = fresh.graph_module
        for name in ("_report", *self._conversion_defaults()):
            setattr(self, name, getattr(fresh, name))
        return True

    def bind_inputs(self, signature: inspect.Signature, optional_inputs: tuple[str, ...],
                    concrete_args: dict[str, Any], settings: dict[str, Any] | None = None) -> None:
        """Calls are bound to the model's ``signature`` and passed on by position (torch.fx renames
        inputs it was given concrete values for). ``optional_inputs`` default to None and the graph
        uses them as tensors: torch.fx traced ``if mask is not None:`` as taken. ``settings`` are
        flags the graph was traced with fixed at these values (``is_causal=False``). A call passing
        None for some optional inputs or other values for settings runs a graph traced with those
        (converted again with those ``concrete_args``, at the first such call, and kept), as the
        model's own code takes its ``mask is None`` or ``if is_causal:`` branch."""
        self._signature, self._optional_inputs = signature, optional_inputs
        self._concrete_args = concrete_args
        self._settings = settings or {}

    def explainer_for(self, *args: Any, **kwargs: Any) -> tuple[Explainer, tuple[Any, ...], dict[str, Any]]:
        """The explainer whose graph this call takes, with the call's arguments for its graph: this
        one, or one traced with the optional inputs the call leaves None and the settings it
        changes (see :meth:`bind_inputs`); first converted again if the model changed
        (:meth:`follow_model`)."""
        self.follow_model()
        if self._signature is None:
            return self, args, kwargs
        arguments = self._signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        given = arguments.arguments
        missing = frozenset(name for name in self._optional_inputs if given.get(name) is None)
        changed = frozenset(_changed_settings(self._settings, given))
        if not missing and not changed:
            return self, arguments.args, arguments.kwargs
        key = (missing, changed)
        if key not in self._traced_for:
            fixed = {**self._concrete_args, **dict.fromkeys(missing), **dict(changed)}
            self._traced_for[key] = self._convert_again(concrete_args=fixed)
        return self._traced_for[key], arguments.args, arguments.kwargs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        explainer, args, kwargs = self.explainer_for(*args, **kwargs)
        return explainer.graph_module(*args, **kwargs)

    def run_recording(self, nodes: Sequence[str], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Tensor]]:
        """Compute the outputs and keep the output tensors of the named nodes.

        ``nodes`` are names of :meth:`report` rows (the model's torch.fx node names, e.g.
        ``"layer1_0_conv1"``, ``"add_3"``, an input's name). The recorded tensors are part of
        the autograd graph, so the relevance reaching them is their gradient (see
        :func:`attribute_nodes`).
        """
        explainer, args, kwargs = self.explainer_for(*args, **kwargs)
        if explainer is not self:
            return explainer.run_recording(nodes, *args, **kwargs)
        graph_nodes = self._graph_nodes(nodes)
        recorder = _Recorder(self.graph_module, {node: name for name, node in graph_nodes.items()})
        with outputs_recorded():
            result = recorder.run(*args, **kwargs)
        return result, {name: recorder.recorded[name] for name in nodes if name in recorder.recorded}

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Explainer:
        """What ``.to()``, ``.double()``, ``.half()``, ``.cuda()``, ... call: refused with what to do
        instead when it would move or cast anything (see :mod:`fxlrp.explain.placement`); a no-op otherwise."""
        refuse_to_move(self, fn)
        return self

    def report(self, *args: Any, **kwargs: Any) -> Report:
        """Every node of the model with its canonical operation, handling, rule and source; given
        a call's inputs, those of the graph that call runs (one traced for the optional inputs it
        leaves None and the settings it gives, see :meth:`bind_inputs`)."""
        if args or kwargs:
            return self.explainer_for(*args, **kwargs)[0]._with_replays()
        self.follow_model()
        return self._with_replays()

    def _with_replays(self) -> Report:
        """The conversion's report, with what the parts run eagerly have recorded by now."""
        replays = {}
        for module in self.graph_module.modules():
            recordings = getattr(getattr(module, "function", None), "recordings", None)
            if recordings is not None:
                site = module.call.site
                replays[site.module_name if site is not None and site.module_name else ""] = recordings.summary()
        return dataclasses.replace(self._report, replays=replays) if replays else self._report

    def _graph_nodes(self, names: Sequence[str]) -> dict[str, fx.Node]:
        """Graph node of each report name: rewritten nodes are call_module nodes whose target
        is the rewrite's module ``fxlrp_<name>``; the others keep their name."""
        by_name: dict[str, fx.Node] = {}
        for node in self.graph_module.graph.nodes:
            by_name.setdefault(node.name, node)
            original = original_node_name(node.target) if node.op == "call_module" else None
            if original is not None:
                by_name[original] = node
        known = {row.name for row in self._report.rows}
        missing = [name for name in names if name not in known or name not in by_name]
        if missing:
            listing = ", ".join(row.name for row in self._report.rows[:12])
            raise ValueError(
                f"no node named {', '.join(map(repr, missing))} in the explained model; node names are "
                f"those of explain.report() (e.g. {listing}, ...)"
            )
        return {name: by_name[name] for name in names}


def _changed_settings(settings: dict[str, Any], given: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of the settings a call gives values other than those traced."""
    for name, traced in settings.items():
        value = given.get(name, traced)
        if value is traced or (type(value) is type(traced) and value == traced):
            continue
        if not isinstance(value, (bool, str, int, float, type(None))):
            raise TypeError(
                f"{name}={type(value).__name__} was given where the model's forward has the setting "
                f"{name}={traced!r}: fxlrp traces a model with each such setting fixed to a Python value (a bool, "
                f"str or number). Pass one, or convert with concrete_args={{{name!r}: ...}} or capture='eager'."
            )
        yield name, value


class _Recorder(fx.Interpreter):
    """Runs the graph and keeps the outputs of chosen nodes."""

    def __init__(self, graph_module: fx.GraphModule, names: dict[fx.Node, str]) -> None:
        super().__init__(graph_module)
        self.names = names
        self.recorded: dict[str, Any] = {}

    def run_node(self, node: fx.Node) -> Any:
        value = super().run_node(node)
        if node in self.names:
            self.recorded[self.names[node]] = value
        return value


def output_relevance(output: Tensor, target: Any, samples: int | None = None) -> Tensor:
    """The relevance to start from: the output times a one-hot mask of ``target``.

    ``target`` may be a class index, a tensor of one index per sample, None (each sample's
    highest output), a pair ``(a, b)`` of class indices (a contrast: ``R = out_a e_a - out_b e_b``,
    the relevance of logit ``a`` minus logit ``b``, e.g. two candidate next tokens) or a tensor of
    the output's shape (taken as the relevance itself). Classes are in the last dimension
    (``[batch, classes]``, ``[batch, positions, classes]``), except in an image-shaped output of four
    or more dimensions (``[batch, classes, height, width]``, a segmentation model's), where they are
    in dimension 1 and a class is explained at every pixel (None: each pixel's top class).
    ``samples``: the batch size of the explained inputs, if they have one; a one-dimensional output
    of that length holds one value per sample (a regression, a score, a node's): None explains each
    sample's value, an index the value of that sample.
    """
    if isinstance(target, Tensor) and target.shape == output.shape and target.is_floating_point():
        return target
    if output.dim() == 0:
        return output.detach().clone()
    if target is None and output.dim() == 1 and samples is not None and output.shape[0] == samples:
        return output.detach().clone()  # (an index still picks one sample: a node of a graph)
    if isinstance(target, tuple) and len(target) == 2:
        return output_relevance(output, target[0], samples) - output_relevance(output, target[1], samples)
    if output.dim() > 3:
        return _dense_relevance(output, target)
    return _class_relevance(output, target)


def _class_relevance(output: Tensor, target: Any, given: Tensor | None = None) -> Tensor:
    """The output times a one-hot mask over its last dimension, the classes: at ``target`` (an
    index, or one per sample), or at each sample's highest output (None). ``given``: the output as
    the model gave it, when its classes were moved last (an image-shaped output)."""
    if target is None:
        target = output.detach().argmax(dim=-1)
    mask = torch.zeros_like(output)
    index = torch.as_tensor(target, device=output.device, dtype=torch.long)
    _check_target(index, target, output, given)
    if index.dim() == 0:
        mask[..., index] = 1.0
    else:
        mask.scatter_(-1, index.reshape(*output.shape[:-1], 1), 1.0)
    return output.detach() * mask


def _dense_relevance(output: Tensor, target: Any) -> Tensor:
    """:func:`output_relevance` of an image-shaped output ``[batch, classes, *spatial]`` (a
    segmentation model's): its classes are in dimension 1 (torch's convention for convolutional
    outputs), a class index (or one per sample) is explained at every position, None explains each
    position's top class."""
    if isinstance(target, Tensor) and target.dim() == 1 and target.numel() == output.shape[0]:
        target = target.view(-1, *[1] * (output.dim() - 2)).expand(output.shape[:1] + output.shape[2:])
    return _class_relevance(output.movedim(1, -1), target, given=output).movedim(-1, 1)


def _check_target(index: Tensor, target: Any, output: Tensor, given: Tensor | None = None) -> None:
    """A ValueError in the user's terms for a class index the output does not have, or a number of
    indices that is not one per sample (instead of an indexing error from inside torch); ``output``
    has its classes last, ``given`` is the output as the model gave it if they were not."""
    classes, samples = output.shape[-1], output[..., 0].numel()
    shape = list((output if given is None else given).shape)
    if index.dim() > 0 and index.numel() != samples:
        per = f"one per sample ({samples})" if given is None else f"one per sample ({shape[0]}) or position ({samples})"
        raise ValueError(f"target has {index.numel()} class indices; the explained output {shape} needs one index, "
                         f"or {per}")
    if index.numel() and bool((index < -classes).any() | (index >= classes).any()):
        shown = (target.tolist() if target.numel() <= 16 else f"tensor of shape {list(target.shape)}") \
            if isinstance(target, Tensor) else target
        where = f"has {classes} classes in its last dimension" if given is None else \
            f"is image-shaped, with {classes} classes in dimension 1"
        raise ValueError(f"target {shown!r} is out of range: the explained output {shape} {where} "
                         f"(indices 0 to {classes - 1})")


InputRelevance = Tensor | tuple[Tensor | None, ...] | dict[str, Tensor | None]
"""Relevance of the inputs: a tensor for a tensor input, else one entry per input (None for
inputs that receive none), as captum returns attributions; inputs given by name get a dict."""
Inputs = Tensor | Sequence[Any] | Mapping[str, Any]
"""A model's inputs: a tensor, a sequence by position, or a mapping by name (a tokenizer's output)."""


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
    ``k`` separate calls. One forward pass serves all ``k`` (its graph kept under
    :func:`~fxlrp.relevance.rule_function.reusable_graph`), with one backward pass per target:
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
    :mod:`fxlrp.explain.input_checks`); False returns whatever comes out.
    """
    return _attribute(explain, inputs, target, output=output, nodes=None, repeat=repeat, check_finite=check_finite)


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
    """
    if isinstance(nodes, str) or not all(isinstance(name, str) for name in nodes):
        raise TypeError(f"nodes must be a list of node names from explain.report(), got {nodes!r}")
    return _attribute(explain, inputs, target, output=output, nodes=nodes, repeat=repeat, check_finite=check_finite)


def _attribute(
    explain: Explainer | nn.Module, inputs: Inputs, target: Any, *,
    output: Callable[[Any], Tensor] | None, nodes: Sequence[str] | None, repeat: int, check_finite: bool,
) -> Any:
    """:func:`attribute` and :func:`attribute_nodes` (``nodes`` not None)."""
    if isinstance(inputs, Mapping):
        by_position, positions = inputs_by_position(explain, inputs)
        found = _attribute(explain, by_position, target, output=output, nodes=nodes, repeat=repeat,
                           check_finite=check_finite)
        input_relevance = found if nodes is None else found[0]
        keyed = {name: input_relevance[position] for name, position in positions.items()}
        return keyed if nodes is None else (keyed, found[1])
    if torch.is_inference_mode_enabled():
        # Relevance travels by autograd, which inference mode turns off: the explanation leaves it.
        with torch.inference_mode(False):
            return _attribute(explain, inputs, target, output=output, nodes=nodes, repeat=repeat,
                              check_finite=check_finite)
    many = isinstance(target, list)
    if many and not target:
        raise ValueError("target=[] names no target; give at least one")
    if many and repeat > 0:
        return _attribute_repeated(explain, inputs, target, output=output, nodes=nodes, repeat=repeat,
                                   check_finite=check_finite)
    if check_finite:
        refuse_non_finite_inputs(explain, inputs)
    single = isinstance(inputs, Tensor)
    leaves = [_leaf_if_explained(value) for value in ((inputs,) if single else inputs)]
    # Taken before the forward: a model writing into its input in place (``x.mul_(2)``, run
    # eagerly) leaves the Python object holding the written values (fxlrp.eager.interpret.replace_values);
    # relevance belongs to the input as given, which the edge still names.
    explained_leaves = [get_gradient_edge(leaf) for leaf in leaves if _is_explained_leaf(leaf)]
    if nodes is not None and not isinstance(explain, Explainer):
        raise TypeError("attribute_nodes needs the explainer returned by fxlrp.convert")
    values = [leaf.detach() for leaf in leaves if _is_explained_leaf(leaf)]  # before a write, as the edges
    gradient = nodes is None and getattr(explain, "gradient_form", False)
    try:
        found, looked_up, recorded, intermediate = _backward(
            explain, inputs, leaves, explained_leaves, values, target, output, nodes, many, check_finite, gradient)
    except GradientFormUnavailable:
        # The composite allows the gradient form but the model meets a rule or operation without
        # one (an operation's own default rule, PReLU): this explainer keeps to the relevance form.
        explain.gradient_form = False
        found, looked_up, recorded, intermediate = _backward(
            explain, inputs, leaves, explained_leaves, values, target, output, nodes, many, check_finite, False)
    results = [_assembled(iter(grads), leaves, looked_up, recorded, intermediate, single, nodes is None)
               for grads in found]
    if check_finite:
        refuse_non_finite_relevance(results)
    return _merged(results, torch.stack) if many else results[0]


def _backward(
    explain: nn.Module, inputs: Tensor | Sequence[Any], leaves: list[Any], explained_leaves: list[Any],
    values: list[Tensor], target: Any, output: Callable[[Any], Tensor] | None, nodes: Sequence[str] | None,
    many: bool, check_finite: bool, gradient: bool,
) -> tuple[list[tuple[Tensor | None, ...]], list[list[RelevanceSource]], dict[str, Any], list[Tensor | None]]:
    """:func:`attribute`'s forward and backward passes: the relevance reaching the explained
    inputs, the intermediate nodes and the embedding lookups, per target. ``gradient``: in the
    gradient form (:mod:`fxlrp.relevance.form`), converted back to relevance here."""
    with (torch.enable_grad(), sources_collected(_token_ids(leaves)) as lookups,
          reusable_graph() if many else nullcontext(),
          gradient_form(gradient)):
        try:
            if nodes is None:
                result, recorded = explain(*leaves), {}
            else:
                result, recorded = explain.run_recording(list(nodes), *leaves)
        except (RuntimeError, TypeError) as error:
            raise no_floating_input_error(inputs, error, bool(lookups.sources) or lookups.of_copied_ids()) from error
        explained = output(result) if output is not None else default_output(result, padding_mask(explain, inputs))
        if not isinstance(explained, Tensor):
            raise TypeError(
                f"the model returns {type(explained).__name__}; pass output=... to pick the tensor to explain"
            )
        intermediate = [_relevance_carrier(name, value) for name, value in recorded.items()]
        looked_up = [_looked_up(leaf, lookups.sources) for leaf in leaves]
        wanted = explained_leaves + [value for value in intermediate if value is not None]
        wanted += [source.edge for found in looked_up for source in found]
        if not wanted and lookups.of_copied_ids():
            raise ValueError(
                "none of the inputs can receive relevance: the model looks up a copy it makes of the token ids "
                "it is given (reordered or padded: XLNet transposes them, Longformer pads them), so the "
                "relevance of the lookup cannot be handed back per token of your ids. Explain the embeddings "
                "instead: pass inputs_embeds=model.get_input_embeddings()(ids) in the place of the ids"
            )
        if not wanted:
            raise ValueError(
                "none of the inputs can receive relevance: give the floating-point input to explain (an "
                "image, node features, inputs_embeds) or token ids the model looks up in an embedding"
            )
        if not explained.requires_grad:
            raise ValueError(
                "the explained output does not depend on the inputs along any path relevance can take: each "
                "path is cut by a .detach() or torch.no_grad() in the model, or passes an operation LRP holds "
                "constant (a norm, variance, sqrt or rsqrt of an input-dependent value is a statistic and gets "
                "no relevance), so there is no relevance to give. Explain an output the inputs reach; where such "
                "a sqrt is an activation of your model, register it with the identity rule (docs/extending.md)"
            )
        if check_finite:
            refuse_non_finite_output(explained)
        samples = next((leaf.shape[0] for leaf in leaves if isinstance(leaf, Tensor) and leaf.dim() > 1), None)
        starts = [output_relevance(explained, one, samples) for one in (target if many else [target])]
        if gradient:  # g = R / y at the output
            starts = [divide_dropping_zeros(start, explained.detach()) for start in starts]
        found = [torch.autograd.grad(explained, wanted, start, allow_unused=True, retain_graph=many)
                 for start in starts]
    if gradient:  # R = x g at the inputs and the lookups' outputs
        values = values + [source.embedding for found_here in looked_up for source in found_here]
        found = [tuple(relevance_at(value, share) for value, share in zip(values, grads, strict=True))
                 for grads in found]
    return found, looked_up, recorded, intermediate


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
        _zero_if_none(next(relevance), leaf) if _is_explained_leaf(leaf) else None for leaf in leaves
    )
    node_relevance = {
        name: torch.zeros_like(value) if carrier is None else _zero_if_none(next(relevance), value)
        for (name, value), carrier in zip(recorded.items(), intermediate, strict=True)
    }
    input_relevance = tuple(
        _token_relevance(leaf, found, relevance) if found else given
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


def _per_copy(target: Any, batch: int) -> Tensor:
    """One class index per sample of a copy: an index for all, or one per sample."""
    index = torch.as_tensor(target)
    if index.is_floating_point() or index.dim() > 1 or (index.dim() == 1 and len(index) != batch):
        raise ValueError(f"attribute(..., repeat=...) takes class indices as targets (an index, or one per sample "
                         f"of the batch of {batch}); got {target!r}; leave repeat=0 for other targets")
    return index.long().expand(batch)


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
        combined = torch.cat([_per_copy(target, batch) for target in chunk])
        result = _attribute(explain, copies[0] if single else copies, combined, output=output, nodes=nodes,
                            repeat=0, check_finite=check_finite)
        copied = len(chunk)
        chunks.append(_merged([result], lambda tensors: tensors[0].reshape(copied, -1, *tensors[0].shape[1:])))
    return _merged(chunks, torch.cat)


def default_output(result: Any, mask: Tensor | None = None) -> Any:
    """The tensor to explain when no ``output=`` is given: the output itself; a model output with
    ``logits`` (Hugging Face's), its logits - of the last position if they are per position
    ``[batch, length, vocabulary]``, which is a causal language model's next-token prediction.
    With a padding ``mask`` of the logits' ``[batch, length]`` (1 at tokens, 0 at padding), each
    sequence's last token: in a batch padded on the right, a shorter sequence's last position is
    padding, whose prediction nobody asked to explain."""
    logits = getattr(result, "logits", None) if not isinstance(result, Tensor) else None
    if not isinstance(logits, Tensor):
        return result
    if logits.dim() != 3:
        return logits
    if mask is None or mask.shape != logits.shape[:2]:
        return logits[:, -1]
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask != 0, positions, -1).amax(dim=1).to(logits.device)  # (-1: no token marked)
    return logits[torch.arange(logits.shape[0], device=logits.device), last]


PADDING_MASK = "attention_mask"
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


def padding_mask(explain: nn.Module, inputs: Tensor | Sequence[Any]) -> Tensor | None:
    """The tensor given for the model's input named :data:`PADDING_MASK`, if any (``inputs`` as
    :func:`attribute` takes them: by position)."""
    names = getattr(explain, "input_names", ())
    if PADDING_MASK not in names or isinstance(inputs, Tensor):
        return None
    position = names.index(PADDING_MASK)
    mask = inputs[position] if position < len(inputs) else None
    return mask if isinstance(mask, Tensor) else None


def _may_be_token_ids(value: Any) -> bool:
    """A tensor neither floating-point nor complex."""
    return isinstance(value, Tensor) and not value.is_floating_point() and not value.is_complex()


def _token_ids(inputs: Sequence[Any]) -> list[Tensor]:
    return [value for value in inputs if _may_be_token_ids(value)]


def _looked_up(value: Any, sources: list[RelevanceSource]) -> list[RelevanceSource]:
    """The embedding lookups made with the token ids ``value`` (none for other inputs)."""
    if not _may_be_token_ids(value):
        return []
    return [source for source in sources if same_values(source.indices, value)]


def _token_relevance(ids: Tensor, found: list[RelevanceSource], relevance: Iterator[Tensor | None]) -> Tensor:
    """Relevance per token: what reached each lookup, summed over the embedding dimension."""
    total = torch.zeros(ids.shape, dtype=found[0].embedding.dtype, device=found[0].embedding.device)
    for _ in found:
        share = next(relevance)
        if share is not None:
            total += share.reshape(ids.numel(), -1).sum(dim=1).reshape(ids.shape)
    return total


def _leaf_if_explained(value: Any) -> Any:
    """A floating-point tensor becomes a fresh leaf that collects relevance; the rest stays (a
    tensor made in inference mode, which autograd cannot keep, as a copy)."""
    if isinstance(value, Tensor) and value.is_inference():
        value = value.clone()
    if isinstance(value, Tensor) and value.is_floating_point():
        return value.detach().requires_grad_()
    return value


def _is_explained_leaf(value: Any) -> bool:
    return isinstance(value, Tensor) and value.requires_grad


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
