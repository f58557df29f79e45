"""Record calls of library functions as single graph nodes, found by function identity.

torch.fx's own ``wrap``/``autowrap_functions`` only patch the global names of the traced
module, so ``torch_scatter.scatter_add(...)``, a function stored in a dict or on a module
attribute would still be traced into (and fail on the library's shape-dependent branches). Here
the function object itself is patched for the duration of the trace: its code is swapped for a
trampoline that records a node when any argument is a Proxy, and runs the original code
otherwise. However the model reaches the function, the call is caught.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import fx

DISPATCH_NAME = "__fxlrp_leaf_call__"


def _contains_proxy(args: Any, kwargs: Any) -> bool:
    found = False

    def visit(value: Any) -> Any:
        nonlocal found
        found = found or isinstance(value, fx.Proxy)
        return value

    fx.node.map_aggregate((args, kwargs), visit)
    return found


def _trampoline_code(function: types.FunctionType, key: int) -> types.CodeType:
    source = f"def {function.__name__}(*args, **kwargs):\n    return {DISPATCH_NAME}({key}, args, kwargs)\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<fxlrp leaf call of {function.__qualname__}>", "exec"), namespace)
    return namespace[function.__name__].__code__


@contextmanager
def leaf_function_calls(tracer: fx.Tracer, functions: Iterable[Callable[..., Any]]) -> Iterator[None]:
    """While active, calls of ``functions`` with Proxy arguments become ``call_function`` nodes
    whose target is the function object itself."""
    patched: list[tuple[types.FunctionType, types.CodeType, Any, Any]] = []
    originals: dict[int, Callable[..., Any]] = {}
    namespaces: list[dict[str, Any]] = []

    def dispatch(key: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        function, original = originals[key]
        if _contains_proxy(args, kwargs):
            return tracer.create_proxy("call_function", function, args, kwargs)
        return original(*args, **kwargs)

    try:
        for function in functions:
            if not isinstance(function, types.FunctionType) or function.__code__.co_freevars:
                continue
            original = types.FunctionType(
                function.__code__, function.__globals__, function.__name__,
                function.__defaults__, function.__closure__,
            )
            original.__kwdefaults__ = function.__kwdefaults__
            originals[id(function)] = (function, original)
            patched.append((function, function.__code__, function.__defaults__, function.__kwdefaults__))
            if DISPATCH_NAME not in function.__globals__:
                function.__globals__[DISPATCH_NAME] = dispatch
                namespaces.append(function.__globals__)
            function.__code__ = _trampoline_code(function, id(function))
            function.__defaults__ = None
            function.__kwdefaults__ = None
        yield
    finally:
        for function, code, defaults, kwdefaults in patched:
            function.__code__ = code
            function.__defaults__ = defaults
            function.__kwdefaults__ = kwdefaults
        for namespace in namespaces:
            namespace.pop(DISPATCH_NAME, None)
