"""The converted model: the model's outputs, relevance in backward, and the conversion that made it."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import Tensor, fx, nn

from fxlrp.capture.module_state import MODEL_WRITES
from fxlrp.explain.model_snapshot import ModelSnapshot
from fxlrp.explain.placement import refuse_to_move
from fxlrp.explain.rank_checks import RankCheck
from fxlrp.graph.nodes import original_node_name
from fxlrp.graph.report import Report, rows_run
from fxlrp.relevance.rule_function import outputs_recorded
from fxlrp.relevance.tracing import values_are_traced


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What a conversion decided for its explainer, in one value that :func:`fxlrp.convert` builds
    and the explainer holds (a conversion again, :meth:`Explainer.follow_model`, replaces it whole).

    ``gradient_form``: whether :func:`attribute` may explain in the gradient form
    (:mod:`fxlrp.relevance.form`). ``input_names``: the names of the model's inputs in order
    (:func:`attribute` finds a padding mask by its name); ``input_parameters``: those inputs'
    parameters (:func:`attribute` places inputs given by name). ``signature``, ``optional_inputs``,
    ``concrete_args`` and ``settings``: how calls are bound to the graph (see
    :meth:`Explainer.explainer_for`); ``signature`` None passes calls on as given.
    ``convert_again``: how to convert the model again (``convert_again(concrete_args=...)``), for
    a changed model and for graphs traced with other optional inputs or settings.
    ``model``: the model converted (unwrapped), which is asked whether it takes inputs an
    explanation failed on (:func:`~fxlrp.explain.model_rejection.input_rejection`); None in a copy.
    ``rank_checks``: the numbers of dimensions of inputs that BatchNorms of the model refuse
    (:func:`~fxlrp.explain.rank_checks.recorded_rank_checks`), checked before each explanation.
    """

    gradient_form: bool = False
    input_names: tuple[str, ...] = ()
    input_parameters: tuple[inspect.Parameter, ...] = ()
    signature: inspect.Signature | None = None
    optional_inputs: tuple[str, ...] = ()
    concrete_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    convert_again: Callable[..., Explainer] | None = None
    model: nn.Module | None = dataclasses.field(default=None, compare=False, repr=False)
    rank_checks: tuple[RankCheck, ...] = ()


class Explainer(nn.Module):
    """Computes the model's outputs; ``output.backward(R)`` leaves input relevance in ``.grad``.

    Created by :func:`fxlrp.convert`. ``graph_module`` is the rewritten torch.fx graph,
    ``conversion`` the :class:`Conversion` that made it, ``snapshot`` what the model was when it was
    converted (None: nothing to follow, as in a copy; see :meth:`follow_model`).
    """

    def __init__(self, graph_module: fx.GraphModule, report: Report, conversion: Conversion | None = None,
                 snapshot: ModelSnapshot | None = None) -> None:
        super().__init__()
        self.graph_module = graph_module
        self._report = report
        self.conversion = conversion or Conversion()
        self._snapshot = snapshot
        self._traced_for: dict[Any, Explainer] = {}

    @property
    def gradient_form(self) -> bool:
        return self.conversion.gradient_form

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.conversion.input_names

    @property
    def input_parameters(self) -> tuple[inspect.Parameter, ...]:
        return self.conversion.input_parameters

    def keep_to_relevance_form(self) -> None:
        """The model meets a rule or operation without a gradient form (an operation's own default
        rule, PReLU), found at its first explanation: later ones take the relevance form at once."""
        self.conversion = dataclasses.replace(self.conversion, gradient_form=False)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickle, copy.deepcopy, torch.save) explains the model as it was copied: its
        # modules are its own, so there is nothing to follow, and the file needs no more of the
        # model than the graph does. A graph traced for settings keeps how to trace others.
        state = {**self.__dict__, "_snapshot": None}
        if self.conversion.signature is None:
            state["conversion"] = dataclasses.replace(self.conversion, convert_again=None, model=None)
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
            fresh = self.conversion.convert_again(concrete_args=self.conversion.concrete_args or None)
        self.graph_module, self._report = fresh.graph_module, fresh._report
        self.conversion, self._snapshot, self._traced_for = fresh.conversion, fresh._snapshot, {}
        return True

    def explainer_for(self, *args: Any, **kwargs: Any) -> tuple[Explainer, tuple[Any, ...], dict[str, Any]]:
        """The explainer whose graph this call takes, with the call's arguments for its graph: this
        one, or one traced with the optional inputs the call leaves None and the settings it
        changes (calls are bound to the model's signature and passed on by position, as torch.fx
        renames inputs it was given concrete values for; an optional input the graph uses as a
        tensor, traced as given, or a setting other than the traced value, such as
        ``is_causal=False``, runs a graph traced with those: converted again at the first such
        call, and kept, as the model's own code takes its ``mask is None`` or ``if is_causal:``
        branch); first converted again if the model changed
        (:meth:`follow_model`)."""
        self.follow_model()
        conversion = self.conversion
        if conversion.signature is None:
            return self, args, kwargs
        arguments = conversion.signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        given = arguments.arguments
        missing = frozenset(name for name in conversion.optional_inputs if given.get(name) is None)
        changed = frozenset(_changed_settings(conversion.settings, given))
        if not missing and not changed:
            return self, arguments.args, arguments.kwargs
        key = (missing, changed)
        if key not in self._traced_for:
            fixed = {**conversion.concrete_args, **dict.fromkeys(missing), **dict(changed)}
            self._traced_for[key] = conversion.convert_again(concrete_args=fixed)
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
        leaves None and the settings it gives, see :meth:`explainer_for`)."""
        if args or kwargs:
            return self.explainer_for(*args, **kwargs)[0]._with_replays()
        self.follow_model()
        return self._with_replays()

    def _with_replays(self) -> Report:
        """The conversion's report, with what the parts run eagerly have run and recorded by now."""
        replays, operations_run = {}, {}
        for module in self.graph_module.modules():
            function = getattr(module, "function", None)
            site = module.call.site if hasattr(module, "call") else None
            recordings = getattr(function, "recordings", None)
            if recordings is not None:
                replays[site.module_name if site is not None and site.module_name else ""] = recordings.summary()
            ran = getattr(function, "operations_run", None)
            if ran and site is not None:
                operations_run[site.node_name] = rows_run(site.node_name, ran)
        if not replays and not operations_run:
            return self._report
        return dataclasses.replace(self._report, replays=replays, operations_run=operations_run)

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

