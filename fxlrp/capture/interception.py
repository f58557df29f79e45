"""Every process-wide patch fxlrp makes, each behind a named context manager.

Capture, the relevance mode of code run eagerly (:mod:`fxlrp.eager.interpret`), the recorder
(:mod:`fxlrp.eager.record`) and the PyG integration need to see calls that neither torch.fx nor a
``TorchFunctionMode`` sees. Each such patch lives here, acts only on the thread that entered it
(a call from another thread runs as it is: tests/unit/test_threads.py runs captures,
explanations and plain library calls on two threads at once), nests, and is undone on exit, also
when the body raises (tests/unit/test_interception.py checks each):

- :func:`intercepted_calls`: a plain Python library function, by identity. torch.fx's own
  ``wrap``/``autowrap_functions`` patch only the global names of the traced module, so
  ``torch_scatter.scatter_add(...)``, a function stored in a dict or on a module attribute would
  still be traced into (and fail on the library's shape-dependent branches); a
  ``TorchFunctionMode`` sees torch's functions only. The function's code is swapped for a
  trampoline that hands the call to the innermost handler of the calling thread; on exit the
  function gets its own code, defaults and keyword defaults back.
  :func:`leaf_function_calls` (capture: such calls with Proxy arguments become single graph nodes)
  and :func:`checkpoints_run_their_function` (a capture's trace runs a checkpointed function as
  written; code run eagerly honours checkpoints, :mod:`fxlrp.eager.interpret`) are made of it.
- :func:`intercepted_applications`: ``SomeFunction.apply(...)`` of every custom
  ``torch.autograd.Function``. ``Function.apply`` is C code that no mode sees, so it is swapped on
  the class while any thread has a handler, and given back when the last one leaves.
- :func:`module_calls_followed`: every module call of the thread, through torch's global module
  forward hooks (module calls are not torch functions; hooks registered on the user's modules
  would write into the model), removed on exit.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.utils.checkpoint
from torch import fx
from torch.autograd.function import Function, FunctionCtx
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

DISPATCH_NAME = "__fxlrp_leaf_call__"

Handler = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], Callable[..., Any]], Any]
"""``handler(function, args, kwargs, original)``: ``original`` runs the function's own code."""

class ThreadHandlers:
    """Per thread, the stack of active handlers (innermost last).

    Handlers act only on the thread that installed them: a call from any other thread runs the
    original, so capturing or explaining on one thread never changes what the library does on
    another. Changed under :data:`_LOCK`.
    """

    def __init__(self) -> None:
        self.stacks: dict[int, list[Handler]] = {}

    def current(self) -> Handler | None:
        """The calling thread's innermost handler.

        Returns
        -------
        Handler or None
            The handler; None where the thread has none.
        """
        stack = self.stacks.get(threading.get_ident())
        return stack[-1] if stack else None

    def push(self, handler: Handler, thread: int) -> bool:
        """Add ``handler`` for ``thread``.

        Parameters
        ----------
        handler : Handler
            The handler.
        thread : int
            The thread's identifier (``threading.get_ident()``).

        Returns
        -------
        bool
            True if it is now the only handler of any thread (the patch is to be made).
        """
        self.stacks.setdefault(thread, []).append(handler)
        return len(self.stacks) == 1 and len(self.stacks[thread]) == 1

    def pop(self, thread: int) -> bool:
        """Remove ``thread``'s innermost handler.

        Parameters
        ----------
        thread : int
            The thread's identifier.

        Returns
        -------
        bool
            True if no handler is left on any thread (the patch is to be undone).
        """
        stack = self.stacks[thread]
        stack.pop()
        if not stack:
            del self.stacks[thread]
        return not self.stacks


# Per patched function (by id): the function, its saved code/defaults, its original code as a
# callable, and its handlers.
_PATCHED: dict[int, tuple[types.FunctionType, tuple[Any, Any, Any], Callable[..., Any], ThreadHandlers]] = {}
_NAMESPACES: dict[int, tuple[dict[str, Any], int]] = {}
_LOCK = threading.Lock()


def _dispatch(key: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    function, _, original, handlers = _PATCHED[key]
    handler = handlers.current()
    if handler is None:
        return original(*args, **kwargs)
    return handler(function, args, kwargs, original)


def _trampoline_code(function: types.FunctionType, key: int) -> types.CodeType:
    return _compiled_trampoline(function.__name__, function.__qualname__, key)


@functools.cache
def _compiled_trampoline(name: str, qualified_name: str, key: int) -> types.CodeType:
    # Cached: interpreted library layers patch their functions on every call. The code only
    # carries the dispatch key, so a reused id still dispatches to the function patched now.
    source = f"def {name}(*args, **kwargs):\n    return {DISPATCH_NAME}({key}, args, kwargs)\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<fxlrp leaf call of {qualified_name}>", "exec"), namespace)
    return namespace[name].__code__


def _patch(function: types.FunctionType, handler: Handler) -> None:
    with _LOCK:
        _patch_locked(function, handler, threading.get_ident())


def _patch_locked(function: types.FunctionType, handler: Handler, thread: int) -> None:
    key = id(function)
    if key in _PATCHED:
        _PATCHED[key][3].push(handler, thread)
        return
    original = types.FunctionType(
        function.__code__, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    original.__kwdefaults__ = function.__kwdefaults__
    saved = (function.__code__, function.__defaults__, function.__kwdefaults__)
    handlers = ThreadHandlers()
    handlers.push(handler, thread)
    _PATCHED[key] = (function, saved, original, handlers)
    namespace_key = id(function.__globals__)
    namespace, users = _NAMESPACES.get(namespace_key, (function.__globals__, 0))
    namespace[DISPATCH_NAME] = _dispatch
    _NAMESPACES[namespace_key] = (namespace, users + 1)
    function.__code__ = _trampoline_code(function, key)
    function.__defaults__ = None
    function.__kwdefaults__ = None


def _unpatch(function: types.FunctionType) -> None:
    with _LOCK:
        _unpatch_locked(function, threading.get_ident())


def _unpatch_locked(function: types.FunctionType, thread: int) -> None:
    key = id(function)
    _, (code, defaults, kwdefaults), _, handlers = _PATCHED[key]
    if not handlers.pop(thread):
        return
    del _PATCHED[key]
    function.__code__, function.__defaults__, function.__kwdefaults__ = code, defaults, kwdefaults
    namespace_key = id(function.__globals__)
    namespace, users = _NAMESPACES[namespace_key]
    if users == 1:
        namespace.pop(DISPATCH_NAME, None)
        del _NAMESPACES[namespace_key]
    else:
        _NAMESPACES[namespace_key] = (namespace, users - 1)


@contextmanager
def intercepted_calls(functions: Iterable[Callable[..., Any]], handler: Handler) -> Iterator[None]:
    """While active, every call of one of ``functions`` goes to ``handler``.

    Plain Python functions only (builtins and closures are skipped: their code cannot be swapped).

    Parameters
    ----------
    functions : iterable of callable
        The functions to intercept.
    handler : Handler
        ``handler(function, args, kwargs, original)``, called on this thread instead of the
        function; ``original`` runs the function's own code.

    Yields
    ------
    None
    """
    patched: list[types.FunctionType] = []
    try:
        for function in dict.fromkeys(functions):
            if not isinstance(function, types.FunctionType) or function.__code__.co_freevars:
                continue
            _patch(function, handler)
            patched.append(function)
        yield
    finally:
        for function in reversed(patched):
            _unpatch(function)


def contains_proxy(args: Any, kwargs: Any) -> bool:
    """Whether a call's arguments hold a torch.fx Proxy (the call is being traced).

    Parameters
    ----------
    args : Any
        The positional arguments.
    kwargs : Any
        The keyword arguments.

    Returns
    -------
    bool
        True if a Proxy is among them, at any depth.
    """
    found = False

    def visit(value: Any) -> Any:
        nonlocal found
        found = found or isinstance(value, fx.Proxy)
        return value

    fx.node.map_aggregate((args, kwargs), visit)
    return found


_APPLY = Function.__dict__["apply"]
_APPLY_HANDLERS = ThreadHandlers()


def _dispatched_apply(cls: type[Function], *args: Any, **kwargs: Any) -> Any:
    own = _APPLY.__get__(None, cls)
    handler = _APPLY_HANDLERS.current()
    return own(*args, **kwargs) if handler is None else handler(cls, args, kwargs, own)


@contextmanager
def intercepted_applications(handler: Handler) -> Iterator[None]:
    """While active, on this thread, ``SomeFunction.apply(...)`` of every custom Function goes to ``handler``.

    ``Function.apply`` is C code, so it is swapped on the class for as long as any thread has a
    handler (calls from other threads run it as they are), and given back after.

    Parameters
    ----------
    handler : Handler
        Called as ``handler(SomeFunction, args, kwargs, own_apply)``.

    Yields
    ------
    None
    """
    thread = threading.get_ident()
    with _LOCK:
        if _APPLY_HANDLERS.push(handler, thread):
            Function.apply = classmethod(_dispatched_apply)
    try:
        yield
    finally:
        with _LOCK:
            if _APPLY_HANDLERS.pop(thread):
                Function.apply = _APPLY


def forward_of(function: type[Function], args: tuple, kwargs: dict) -> Any:
    """``function.forward`` run as the code around it runs.

    ``apply`` would turn gradients off (and its backward is a rule of training; an explanation
    goes through the forward's operations).

    Parameters
    ----------
    function : type of Function
        The custom ``torch.autograd.Function``.
    args : tuple
        The positional arguments given to ``apply``.
    kwargs : dict
        The keyword arguments given to ``apply``.

    Returns
    -------
    Any
        What ``forward`` returns (given a fresh context, unless it takes none).
    """
    if function.setup_context is not Function.setup_context:  # forward without ctx (setup_context style)
        return function.forward(*args, **kwargs)
    context = FunctionCtx()
    context.needs_input_grad = tuple(isinstance(value, torch.Tensor) and value.requires_grad for value in args)
    return function.forward(context, *args, **kwargs)


ModuleCallHook = Callable[..., None]
"""``before(module, args)`` / ``after(module, args, output)``, as torch's module forward hooks."""


@contextmanager
def module_calls_followed(before: ModuleCallHook | None = None,
                          after: ModuleCallHook | None = None) -> Iterator[None]:
    """Follow every module call made on this thread while active.

    Calls from other threads are not seen. The hooks return nothing: they follow calls, never
    change them.

    Parameters
    ----------
    before : ModuleCallHook, optional
        ``before(module, args)``, run before each call.
    after : ModuleCallHook, optional
        ``after(module, args, output)``, run after each call (also when the call raises).

    Yields
    ------
    None
    """
    thread = threading.get_ident()
    handles = []
    if before is not None:
        def pre_hook(module: Any, args: Any) -> None:
            if threading.get_ident() == thread:
                before(module, args)

        handles.append(register_module_forward_pre_hook(pre_hook))
    if after is not None:
        def hook(module: Any, args: Any, output: Any) -> None:
            if threading.get_ident() == thread:
                after(module, args, output)

        handles.append(register_module_forward_hook(hook, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def leaf_function_calls(tracer: fx.Tracer, functions: Iterable[Callable[..., Any]]) -> Iterator[None]:
    """While active, calls of ``functions`` with Proxy arguments become ``call_function`` nodes.

    The nodes' target is the function object itself.

    Parameters
    ----------
    tracer : fx.Tracer
        The tracer that creates the nodes.
    functions : iterable of callable
        The functions recorded as single calls.

    Yields
    ------
    None
    """

    def record(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], original) -> Any:
        if contains_proxy(args, kwargs):
            return tracer.create_proxy("call_function", function, args, kwargs)
        return original(*args, **kwargs)

    with intercepted_calls(functions, record):
        yield


CHECKPOINT = inspect.unwrap(torch.utils.checkpoint.checkpoint)
"""Activation checkpointing (its undecorated function, which the decorated one calls)."""
_CHECKPOINT_OPTIONS = frozenset(inspect.signature(CHECKPOINT).parameters) - {"function", "args", "kwargs"}


def checkpointed_call(args: tuple, kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple, dict, dict]:
    """A call of :data:`CHECKPOINT` taken apart.

    Parameters
    ----------
    args : tuple
        The checkpoint's positional arguments: the function, then its inputs.
    kwargs : dict
        Its keyword arguments: checkpointing's options and the function's own keywords.

    Returns
    -------
    function : callable
        The checkpointed function.
    inputs : tuple
        Its positional arguments.
    keywords : dict
        Its keyword arguments.
    options : dict
        Checkpointing's options (``use_reentrant``, ``context_fn``, ...) that the call gave.
    """
    function, inputs = (args[0], args[1:]) if args else (kwargs["function"], ())
    keywords = {name: value for name, value in kwargs.items() if name not in _CHECKPOINT_OPTIONS and name != "function"}
    options = {name: value for name, value in kwargs.items() if name in _CHECKPOINT_OPTIONS}
    return function, inputs, keywords, options


def _checkpointed_function_run(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
    wrapped, inputs, keywords, _ = checkpointed_call(args, kwargs)
    return wrapped(*inputs, **keywords)


def checkpoints_run_their_function() -> Any:
    """While active on this thread, ``checkpoint(f, *inputs)`` runs ``f(*inputs)``.

    A capture's trace and a recorded run keep ``f``'s own operations, whose nodes get their rules
    (checkpointing's recomputation in backward would run outside them); code run eagerly honours
    checkpoints (:mod:`fxlrp.eager.interpret`).

    Returns
    -------
    contextmanager
        The context (:func:`intercepted_calls` of the checkpoint function).
    """
    return intercepted_calls((CHECKPOINT,), _checkpointed_function_run)
