"""Capture a model as a torch.fx graph with fxlrp's tracer.

Step 1 of the pipeline. Beside the tracer: :mod:`~fxlrp.capture.interception` (library functions
recorded as single calls), :mod:`~fxlrp.capture.module_state` (what a forward writes into the
model, taken back) and :mod:`~fxlrp.capture.source` (the user's source line of a node), which the
eager path (:mod:`fxlrp.eager`) uses too.
"""

from __future__ import annotations

import inspect
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.nn.utils import parametrize

from fxlrp.capture.interception import (
    checkpoints_run_their_function,
    contains_proxy,
    forward_of,
    intercepted_applications,
    leaf_function_calls,
)
from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.capture.source import error_line, innermost_user_frame
from fxlrp.errors import CaptureError
from fxlrp.registry import REGISTRY

GRADIENTS_OFF = "fxlrp_gradients_off"
"""``node.meta`` key of a call the model's code made with gradients turned off (``with
torch.no_grad():``) while they were on around it."""


def as_python_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it equals, any other value as it is.

    torch takes the two alike, but a graph's code would name ``np``, which it does not import,
    and torch.fx refuses NumPy integers as arguments.

    Parameters
    ----------
    value : Any
        A call's argument (``np.sqrt(d)``'s ``np.float64``, an ``np.int64`` size, ...).

    Returns
    -------
    Any
        The Python number for a zero-dimensional NumPy value, else ``value``.
    """
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def keeps_its_type(container: dict[Any, Any]) -> bool:
    """Whether the capture builds a dict again as its own type.

    Parameters
    ----------
    container : dict
        A dict a traced forward returned or passed on.

    Returns
    -------
    bool
        True for an ``OrderedDict`` (built from the dict of its items), or a dataclass that is
        one (transformers' ``ModelOutput``) whose items are fields it takes by name, its required
        fields among them.
    """
    kind = type(container)
    if kind is OrderedDict:
        return True
    if not (issubclass(kind, OrderedDict) and is_dataclass(kind)):
        return False
    taken = {member.name: member for member in fields(kind) if member.init}
    required = [name for name, member in taken.items()
                if member.default is MISSING and member.default_factory is MISSING]
    return all(key in taken for key in container) and all(name in container for name in required)


class RelevanceTracer(fx.Tracer):
    """torch.fx's tracer with two small changes.

    Modules fxlrp explains as a whole are leaves, and library functions that cannot be traced
    through are recorded as single calls.

    Parameters
    ----------
    is_explained_module : callable
        Whether a module is explained as a whole (a leaf of the trace).
    leaf_functions : iterable of callable, optional
        Functions recorded as single calls.
    eager_modules : iterable of str, optional
        Qualified names of modules run eagerly (leaves too).
    """

    def __init__(
        self,
        is_explained_module: Callable[[nn.Module], bool],
        leaf_functions: Iterable[Callable[..., Any]] = (),
        eager_modules: Iterable[str] = (),
    ) -> None:
        super().__init__()
        self.record_stack_traces = False  # create_node records the one frame fxlrp reports
        self.is_explained_module = is_explained_module
        self.leaf_functions = tuple(leaf_functions)
        self.eager_modules = frozenset(eager_modules)
        self.tracing: list[str] = []
        self.custom_functions: list[str] = []
        """Names of the custom autograd Functions whose ``forward`` is being traced, innermost last."""
        self.thread = threading.get_ident()
        self.failing_module: str | None = None
        """Qualified name of the innermost module whose forward was being traced when tracing
        failed ("" for the root's own code); None if the failure was outside every module."""

    def call_module(self, module: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """torch.fx's module call, noting which module is being traced (:attr:`failing_module`).

        Parameters
        ----------
        module : nn.Module
            The called module.
        forward : callable
            Its forward.
        args : tuple
            The call's positional arguments.
        kwargs : dict
            The call's keyword arguments.

        Returns
        -------
        Any
            The call's output (proxies while tracing); a call from another thread runs as it is.
        """
        if threading.get_ident() != self.thread:
            # torch.fx routes every module call of the process through the tracer while it traces;
            # a module another thread runs meanwhile runs as it is.
            return forward(*args, **kwargs)
        self.tracing.append(self.path_of_module(module))
        try:
            return super().call_module(module, forward, args, kwargs)
        except Exception:
            if self.failing_module is None:
                self.failing_module = self.tracing[-1]
            raise
        finally:
            self.tracing.pop()

    def create_arg(self, a: Any) -> Any:
        """torch.fx's argument, keeping the type of dicts and turning NumPy scalars into numbers.

        Dicts keep their type where :func:`keeps_its_type` says so.

        Parameters
        ----------
        a : Any
            A value passed to a node.

        Returns
        -------
        Any
            The argument as the graph holds it.
        """
        if isinstance(a, dict) and keeps_its_type(a):
            # torch.fx makes every dict a plain one: a model's OrderedDict (torchvision's
            # segmentation models) or ModelOutput (a transformers model's ``.logits``) is built
            # again by a node, so that the explainer returns what the model returns.
            items = super().create_arg(dict(a))
            if type(a) is OrderedDict:  # (any keys: the generated code writes the dict out)
                return self.create_node("call_function", OrderedDict, (items,), {})
            return self.create_node("call_function", type(a), (), items)
        return super().create_arg(as_python_number(a))

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        """torch.fx's node, marked where gradients are off and given the user's source line.

        Parameters
        ----------
        *args, **kwargs
            As for ``fx.Tracer.create_node``.

        Returns
        -------
        fx.Node
            The node.
        """
        node = super().create_node(*args, **kwargs)
        if not torch.is_grad_enabled():  # (traced with gradients on: the model's code turned them off)
            node.meta[GRADIENTS_OFF] = True
        if not node.stack_trace:
            trace = innermost_user_frame()
            if trace:
                node.stack_trace = trace
        if self.custom_functions:
            node.meta[INSIDE_FUNCTION] = self.custom_functions[-1]
        return node

    def is_leaf_module(self, module: nn.Module, module_qualified_name: str) -> bool:
        """Whether a module is one node: run eagerly, explained as a whole, or a torch.fx leaf.

        Parameters
        ----------
        module : nn.Module
            The module.
        module_qualified_name : str
            Its qualified name.

        Returns
        -------
        bool
            True if the trace does not go into the module.
        """
        return (module_qualified_name in self.eager_modules or self.is_explained_module(module)
                or super().is_leaf_module(module, module_qualified_name))

    def _application(self, function: type, args: tuple, kwargs: dict, own: Callable[..., Any]) -> Any:
        """A custom autograd Function applied while tracing: one node where the registry names it
        (its own backward declared its rule, :func:`~fxlrp.registry.own_backward`), else traced
        through its ``forward``, whose operations get their rules."""
        if REGISTRY.for_function(function) is not None and contains_proxy(args, kwargs):
            return self.create_proxy("call_function", own, args, kwargs)
        self.custom_functions.append(function.__qualname__)
        try:
            return forward_of(function, args, kwargs)
        finally:
            self.custom_functions.pop()

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        """Trace ``root`` with gradients on, library functions recorded as single calls.

        Parameters
        ----------
        root : nn.Module or callable
            What to trace.
        concrete_args : dict, optional
            Inputs fixed to values, as for ``fx.Tracer.trace``.

        Returns
        -------
        fx.Graph
            The graph.
        """
        try:
            # With gradients on, so that calls the model's code makes with them off are seen
            # (GRADIENTS_OFF); custom Functions' forwards and checkpointed functions run as the
            # code around them (their own machinery turns gradients off).
            with (leaf_function_calls(self, self.leaf_functions), torch.enable_grad(),
                  intercepted_applications(self._application),
                  checkpoints_run_their_function()):
                return super().trace(root, concrete_args)
        except Exception:
            if self.failing_module is None:
                self.failing_module = ""  # the root's own forward
            raise


CAPTURE_PATHS = ("auto", "fx", "eager")
"""``fx``: torch.fx symbolic tracing only; ``eager``: the whole model run eagerly; ``auto``: torch.fx,
with each module it cannot trace run eagerly (see :mod:`fxlrp.eager`)."""

INSIDE_FUNCTION = "fxlrp_inside_function"
"""``node.meta`` key of a node traced inside a custom autograd Function's ``forward``: the
Function's name (fxlrp explains its forward's operations, not its own backward)."""

EXTRA_KEYWORDS = "fxlrp_extra_keywords"
"""Keyword under which the graph of a model run eagerly as a whole hands on its ``**kwargs``."""


@dataclass(frozen=True)
class Capture:
    """A captured model."""

    graph: fx.Graph
    """The graph."""
    constants: dict[str, Any] = field(default_factory=dict)
    """The constants the trace made (tensors created in ``forward``, e.g. ``torch.ones(3)``), by
    the names get_attr nodes give them."""
    eager_modules: dict[str, str] = field(default_factory=dict)
    """The modules to run eagerly, each with the reason torch.fx gave (``""`` is the whole model)."""
    optional_inputs: tuple[str, ...] = ()
    """Inputs whose default is None that the graph uses as tensors (``mask=None``): torch.fx traced
    them as given, so a call passing None needs a graph traced with that None."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Flags the graph was traced with fixed at their defaults (``is_causal: bool = False``, a
    ``mode: str``): a call passing other values needs a graph traced with those."""


def capture(
    model: nn.Module,
    is_explained_module: Callable[[nn.Module], bool],
    leaf_functions: Iterable[Callable[..., Any]] = (),
    concrete_args: dict[str, Any] | None = None,
    path: str = "auto",
) -> Capture:
    """Trace ``model``'s forward into a graph by the capture ``path`` (:data:`CAPTURE_PATHS`).

    Integrations of libraries in use are loaded first. The model is left as it was.

    Parameters
    ----------
    model : nn.Module
        The model.
    is_explained_module : callable
        Whether a module is explained as a whole (a leaf of the trace).
    leaf_functions : iterable of callable, optional
        Functions recorded as single calls, beside those of operations registered as ``leaf``.
    concrete_args : dict, optional
        Inputs fixed to values (beside the registry's :meth:`~fxlrp.registry.Registry.fixed_arguments`).
    path : {"auto", "fx", "eager"}, default "auto"
        With ``"auto"``, where torch.fx fails the innermost module it was tracing becomes a node
        run eagerly and the model is traced again (the whole model, if its own forward fails);
        with ``"fx"`` a failure is an error; ``"eager"`` runs the whole model eagerly.

    Returns
    -------
    Capture
        The graph, its constants, the modules run eagerly and the inputs and settings the graph
        was traced for.

    Raises
    ------
    ValueError
        If ``path`` is none of :data:`CAPTURE_PATHS`.
    CaptureError
        With ``"fx"``, if torch.fx cannot capture the model (saying why and what to do); for
        TorchScript modules; for a model run eagerly whose forward takes ``*args``.
    """
    if path not in CAPTURE_PATHS:
        raise ValueError(f"capture must be one of {', '.join(map(repr, CAPTURE_PATHS))}, not {path!r}")
    _refuse_torchscript(model)
    if path == "eager":
        return Capture(whole_model_graph(model), eager_modules={"": "capture='eager' was asked for"})
    leaves = tuple(dict.fromkeys((*leaf_functions, *REGISTRY.leaf_functions())))
    concrete_args = {**REGISTRY.fixed_arguments(model), **(concrete_args or {})}
    # A flag (``is_causal: bool = False``) is a setting, not an input: traced as a symbolic value,
    # any ``if`` on it fails the trace. Traced at its default; a call passing another value gets a
    # graph traced with that value (Explainer.explainer_for).
    settings = {name: parameter.default for name, parameter in inspect.signature(model.forward).parameters.items()
                if isinstance(parameter.default, (bool, str)) and name not in concrete_args}
    concrete_args = {**settings, **concrete_args} or None
    eager = _calls_a_graph_cannot_hold(model)
    if eager and path == "fx":
        listing = "\n".join(f"  - {name or 'the model itself'}: {reason}" for name, reason in eager.items())
        raise CaptureError(f"fxlrp could not capture {type(model).__name__} with torch.fx: a captured graph does not "
                           f"make these module calls as the model makes them:\n{listing}\n"
                           "Convert with capture='auto' (the default), which runs them eagerly.")
    if "" in eager:
        return Capture(whole_model_graph(model), eager_modules={"": eager[""]})
    while True:
        tracer = RelevanceTracer(is_explained_module, leaves, eager)
        failure = None
        with MODEL_WRITES:
            state = ModuleState(model)
            # traced in evaluation mode: the graph takes inference's branches (``if self.training:``)
            in_evaluation_mode(state.modules)
            try:
                graph = tracer.trace(model, concrete_args)
            except Exception as error:  # every tracing failure becomes one readable error, or an eager part
                failure = error
            finally:
                # torch.fx stores constants on the traced root, i.e. the user's model: take them
                # back, with everything else the traced forward wrote into the model's modules.
                added = state.restore()
        if failure is not None:
            if path == "fx":
                raise CaptureError(_explain_capture_failure(model, failure)) from failure
            failing, reason = tracer.failing_module or "", why_not_traced(failure)
            if failing == "" or failing in eager:
                return Capture(whole_model_graph(model), eager_modules={"": reason})
            eager[failing] = reason
            continue
        named = {node.target for node in graph.nodes if node.op == "get_attr"}
        # (torch.fx renames an input it was given a concrete value for: only the model's own names)
        parameters = inspect.signature(model.forward).parameters
        optional = tuple(node.target for node in graph.nodes
                         if node.op == "placeholder" and node.target in parameters and node.users
                         and parameters[node.target].default is None and node.target not in (concrete_args or {}))
        return Capture(graph, {name: value for name, value in added.items() if name in named}, eager, optional,
                       settings)


def _refuse_torchscript(model: nn.Module) -> None:
    """TorchScript modules run their operations inside TorchScript, where neither a graph capture
    nor the relevance mode of code run eagerly sees them: relevance would follow their gradient
    with no rule, and fxlrp says so instead."""
    scripted: list[str] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(outer + ".") or outer == "" for outer in scripted)
        if isinstance(module, torch.jit.ScriptModule) and not inside:
            scripted.append(name)
    if scripted:
        scripted = [name or "the model itself" for name in scripted]
        raise CaptureError(
            f"fxlrp cannot explain TorchScript modules ({', '.join(scripted)}): their operations run inside "
            "TorchScript, where fxlrp cannot give them rules. Convert the Python module they were scripted from "
            "(torch.jit.script(module) leaves module as it was)."
        )


def _calls_a_graph_cannot_hold(model: nn.Module) -> dict[str, str]:
    """Modules whose calls do more than their ``forward``, by name, with what: forward hooks
    (pruning's mask, the older weight and spectral norm, a hook of the user's), which torch.fx
    does not run for modules it traces through and fxlrp's relevance functions do not run for
    layers; parametrized parameters (``torch.nn.utils.parametrize``), computed at each call. Run
    eagerly, their calls run as the model's do, with the same rules."""
    found = {}
    for name, module in model.named_modules():
        reason = call_beyond_forward(module)
        if reason is not None:
            found[name] = reason
    return found


def call_beyond_forward(module: nn.Module) -> str | None:
    """What a call of ``module`` does beyond its ``forward``.

    A graph node calling the layer's function would skip it.

    Parameters
    ----------
    module : nn.Module
        The module.

    Returns
    -------
    str or None
        The reason (forward hooks, parametrized parameters); None if nothing.
    """
    if module._forward_hooks or module._forward_pre_hooks:
        return "it has forward hooks, which a captured graph does not run"
    if parametrize.is_parametrized(module):
        return "its parameters are parametrized (torch.nn.utils.parametrize), computed at each call"
    return None


def whole_model_graph(model: nn.Module) -> fx.Graph:
    """A graph with one node calling the model itself (the module ``""``).

    Parameters
    ----------
    model : nn.Module
        The model.

    Returns
    -------
    fx.Graph
        The graph, whose placeholders are the parameters of the model's ``forward``, defaults
        included (``**kwargs`` handed on under :data:`EXTRA_KEYWORDS`).

    Raises
    ------
    CaptureError
        If ``forward`` takes ``*args``.
    """
    graph = fx.Graph()
    positional: list[fx.Node] = []
    keywords: dict[str, Any] = {}
    for name, parameter in inspect.signature(model.forward).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            raise CaptureError(
                f"fxlrp could not capture {type(model).__name__}: torch.fx cannot trace it and its forward takes "
                f"*{name}, which fxlrp cannot hand on when it runs the model eagerly. Wrap the model in a module "
                "whose forward names its arguments."
            )
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            keywords[EXTRA_KEYWORDS] = graph.placeholder("**" + name)
            continue
        default = inspect.Signature.empty if parameter.default is inspect.Parameter.empty else parameter.default
        node = graph.placeholder(name, default_value=default)
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(node)
        else:
            keywords[name] = node
    graph.output(graph.create_node("call_module", "", tuple(positional), keywords, name="model"))
    return graph


def first_line(error: BaseException) -> str:
    """``Type: the message's first line``, at most 200 characters: a reason in a report line.

    Parameters
    ----------
    error : BaseException
        The error.

    Returns
    -------
    str
        The reason.
    """
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def why_not_traced(error: BaseException) -> str:
    """Why torch.fx could not trace a module, in a report line.

    The line says what in the module's code stops it and where, rather than torch.fx's own
    exception.

    Parameters
    ----------
    error : BaseException
        What tracing raised.

    Returns
    -------
    str
        One line, at most 300 characters.
    """
    if _failed_on_signature(error):
        return "torch.fx cannot take the arguments of its forward (*args or **kwargs, or a decorator's wrapper)"
    where = error_line(error)
    at = f" at {where}" if where else ""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, fx.proxy.TraceError) or "symbolically traced" in text or "Proxy" in text:
        return f"its code uses a tensor's value or shape in Python control flow (if, for, int()){at}"[:300]
    return f"torch.fx failed on it ({text}){at}"[:300]


def _failed_on_signature(error: BaseException) -> bool:
    """Whether torch.fx failed before running forward, on its signature (``*args``/``**kwargs``,
    a decorator's wrapper: torch.fx rebuilds the function's code object for its arguments)."""
    return any(frame.name == "create_args_for_root" for frame in traceback.extract_tb(error.__traceback__))


def _explain_capture_failure(model: nn.Module, error: Exception) -> str:
    if _failed_on_signature(error):
        try:
            signature = str(inspect.signature(model.forward))
        except (TypeError, ValueError):
            signature = "(...)"
        return "\n".join([
            f"fxlrp could not capture {type(model).__name__} with torch.fx: torch.fx cannot take the arguments of "
            f"{type(model).__name__}.forward{signature}",
            "(a forward with *args or **kwargs, or one wrapped by a decorator, as Hugging Face's models are).",
            "Convert with capture='auto' (the default) or capture='eager', which run the model eagerly, or wrap it",
            "in a module whose forward names its arguments.",
        ])
    where = error_line(error)
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    lines = [f"fxlrp could not capture {type(model).__name__} with torch.fx: {text}"]
    if where:
        lines.append(f"  at {where}")
    if isinstance(error, fx.proxy.TraceError) or "symbolically traced" in text or "Proxy" in text:
        lines += [
            "The forward pass uses the value or shape of a tensor in Python control flow (an `if`,",
            "a loop, `len()`, `int()`, iteration), which a graph capture cannot follow.",
            "What you can do:",
            "  - make the branch depend on a setting of the model instead of on its input;",
            "  - fix the value with convert(model, concrete_args={'argument': value});",
            "  - compute that value outside the model and pass it in as an input;",
            "  - or convert with capture='auto' (the default), which runs such a module eagerly.",
        ]
    else:
        lines.append("The failure happened while recording the forward pass" + ("; the line above is where. " if where
                     else ". ") + "convert(..., capture='auto') (the default) runs such a module eagerly instead.")
    return "\n".join(lines)
