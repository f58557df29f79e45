"""Capture a model as a torch.fx graph with fxlrp's tracer."""

from __future__ import annotations

import copy
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx, nn

from fxlrp.errors import CaptureError
from fxlrp.integrations import load_integrations
from fxlrp.leaf_functions import leaf_function_calls
from fxlrp.registry import REGISTRY

_LIBRARY_DIRECTORIES = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (torch, __import__("fxlrp"))
)
_GENERATED_BY_FXLRP = "<fxlrp "  # code objects fxlrp compiles (fxlrp/leaf_functions.py)


LIBRARY_CONCRETE_ARGS: dict[type, dict[str, Any]] = {}
"""Arguments of library model classes that only steer Python control flow and that capture fixes
to their usual value (integrations fill this, e.g. PyG's BasicGNN sampling arguments = None).
Applies to the converted model's own class and its subclasses; the user's ``concrete_args`` win."""


def _library_concrete_args(model: nn.Module) -> dict[str, Any]:
    fixed: dict[str, Any] = {}
    for base in reversed(type(model).__mro__):
        fixed.update(LIBRARY_CONCRETE_ARGS.get(base, {}))
    return fixed


def innermost_user_frame() -> str:
    """The innermost caller outside torch and fxlrp, in traceback format, as long as it runs
    inside a ``forward`` (as torch.fx's own stack traces require); '' otherwise.

    It is all :func:`fxlrp.source.source_line` reads. torch.fx's ``record_stack_traces`` would
    format the whole stack of every node and, the first time, import torch.export (~2 s)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith((*_LIBRARY_DIRECTORIES, _GENERATED_BY_FXLRP)):
        frame = frame.f_back
    user = frame
    while frame is not None and frame.f_code.co_name != "forward":
        frame = frame.f_back
    if user is None or frame is None:
        return ""
    code = user.f_code
    line = linecache.getline(code.co_filename, user.f_lineno).strip()
    return f'File "{code.co_filename}", line {user.f_lineno}, in {code.co_name}\n    {line}'


class RelevanceTracer(fx.Tracer):
    """torch.fx's tracer with two small changes: modules fxlrp explains as a whole are leaves,
    and library functions that cannot be traced through are recorded as single calls."""

    def __init__(
        self,
        is_explained_module: Callable[[nn.Module], bool],
        leaf_functions: Iterable[Callable[..., Any]] = (),
    ) -> None:
        super().__init__()
        self.record_stack_traces = False  # create_node records the one frame fxlrp reports
        self.is_explained_module = is_explained_module
        self.leaf_functions = tuple(leaf_functions)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if not node.stack_trace:
            trace = innermost_user_frame()
            if trace:
                node.stack_trace = trace
        return node

    def is_leaf_module(self, module: nn.Module, module_qualified_name: str) -> bool:
        return self.is_explained_module(module) or super().is_leaf_module(module, module_qualified_name)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        with leaf_function_calls(self, self.leaf_functions):
            return super().trace(root, concrete_args)


def user_source_line(error: BaseException) -> str | None:
    """``file:line: code`` of the innermost frame of the error that is in the user's code."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not frame.filename.startswith(_LIBRARY_DIRECTORIES) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return None


def capture(
    model: nn.Module,
    is_explained_module: Callable[[nn.Module], bool],
    leaf_functions: Iterable[Callable[..., Any]] = (),
    concrete_args: dict[str, Any] | None = None,
) -> tuple[fx.Graph, dict[str, Any]]:
    """Trace ``model``'s forward into a graph, or raise :class:`CaptureError` saying why not.

    Returns the graph and the constants the trace created (tensors made in ``forward``, e.g.
    ``torch.ones(3)``, which get_attr nodes name). Integrations of libraries in use are loaded
    first; functions of operations registered as ``leaf`` are recorded as single calls like
    ``leaf_functions``.
    """
    load_integrations()
    tracer = RelevanceTracer(is_explained_module, (*leaf_functions, *REGISTRY.leaf_functions()))
    concrete_args = {**_library_concrete_args(model), **(concrete_args or {})} or None
    state = ModuleState(model)
    try:
        graph = tracer.trace(model, concrete_args)
    except Exception as error:  # every tracing failure becomes one readable error
        raise CaptureError(_explain_capture_failure(model, error)) from error
    finally:
        # torch.fx stores such constants on the traced root, i.e. the user's model: take them back,
        # with everything else the traced forward wrote into the model's modules.
        added = state.restore()
    named = {node.target for node in graph.nodes if node.op == "get_attr"}
    constants = {name: value for name, value in added.items() if name in named}
    return graph, constants


_CONTAINERS = (dict, list, set)


class ModuleState:
    """The attributes of every module of ``model`` and the contents of the dicts, lists and sets
    among them, as they are now; :meth:`restore` puts them back.

    A forward may write into its modules: timm's LeViT caches its attention biases in a dict
    (``self.attention_bias_cache[device] = ...``), other models count calls or keep the last
    output. Traced, such writes store symbolic values (fx Proxies) in the user's model, and torch.fx
    itself stores tensor constants on the root. Containers are restored in place, so that other
    references to them see their old contents; one level deep (a dict of lists is restored as a
    dict, its lists as they are)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = list({id(module): module for module in model.modules()}.values())
        self.attributes = [dict(vars(module)) for module in self.modules]
        self.contents = {
            id(value): (value, copy.copy(value))
            for attributes in self.attributes for value in attributes.values() if isinstance(value, _CONTAINERS)
        }

    def restore(self) -> dict[str, Any]:
        """Put every module's attributes back; return the attributes the root gained meanwhile
        (torch.fx's constants among them)."""
        added = {name: value for name, value in vars(self.model).items() if name not in self.attributes[0]}
        for module, before in zip(self.modules, self.attributes, strict=True):
            now = vars(module)
            for name in [name for name in now if name not in before]:
                del now[name]
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    now[name] = value
        for container, contents in self.contents.values():
            if _same_contents(container, contents):
                continue
            container.clear()
            if isinstance(container, list):
                container.extend(contents)
            else:
                container.update(contents)
        return added


_MISSING = object()


def _same_contents(container: dict | list | set, contents: dict | list | set) -> bool:
    """Whether ``container`` holds the same objects (by identity) as ``contents``."""
    if len(container) != len(contents):
        return False
    if isinstance(container, dict):
        return all(key in contents and value is contents[key] for key, value in container.items())
    if isinstance(container, list):
        return all(value is old for value, old in zip(container, contents, strict=True))
    return {id(value) for value in container} == {id(value) for value in contents}


def _explain_capture_failure(model: nn.Module, error: Exception) -> str:
    where = user_source_line(error)
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
            "  - compute that value outside the model and pass it in as an input.",
        ]
    else:
        lines.append("The failure happened while recording the forward pass; the line above is where.")
    return "\n".join(lines)
