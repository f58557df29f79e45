"""Modules that stand in for rewritten nodes in the explainer's graph."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxlrp.capture.module_state import run_with_detached_parameters
from fxlrp.registry import Operation
from fxlrp.relevance.call import RelevanceCall

REWRITTEN_PREFIX = "fxlrp_"
"""A rewritten node calls the explainer's module ``fxlrp_<original node name>``."""


def rewritten_module_name(node_name: str) -> str:
    """The name of the explainer's module that stands for a rewritten node.

    Parameters
    ----------
    node_name : str
        The original node's name.

    Returns
    -------
    str
        ``fxlrp_<node_name>``.
    """
    return REWRITTEN_PREFIX + node_name


def original_node_name(module_name: str) -> str | None:
    """The node name a rewritten module stands for.

    Parameters
    ----------
    module_name : str
        The name of one of the explainer's modules.

    Returns
    -------
    str or None
        The original node's name; None for modules that stand for no rewritten node.
    """
    return module_name[len(REWRITTEN_PREFIX):] if module_name.startswith(REWRITTEN_PREFIX) else None


def detached_state(module: nn.Module) -> dict[str, Any]:
    """The module's parameters and buffers, detached: shared storage, never given gradients.

    Parameters
    ----------
    module : nn.Module
        The module.

    Returns
    -------
    dict of str to Tensor
        Its parameters and buffers by qualified name, for ``torch.func.functional_call``.
    """
    state = {name: tensor.detach() for name, tensor in module.named_parameters()}
    state.update({name: tensor.detach() for name, tensor in module.named_buffers()})
    return state


def out_of_place(module: nn.Module) -> nn.Module:
    """A shallow copy with ``inplace=False``; the user's module is left as it is.

    Parameters
    ----------
    module : nn.Module
        The module.

    Returns
    -------
    nn.Module
        The copy, or ``module`` itself where it does not work in place.
    """
    if getattr(module, "inplace", False) is not True:
        return module
    twin = copy.copy(module)
    twin.inplace = False
    return twin


class RelevanceNode(nn.Module):
    """Calls an operation's relevance function with the node's rule.

    Parameters
    ----------
    operation : Operation
        The registry's entry of the node's operation.
    call : RelevanceCall
        The node's rule and the conversion's settings.
    function : Any
        What the node called (a function, or the user's module).
    keywords : dict, optional
        Keyword arguments added to each call (a module's detached parameters).
    """

    def __init__(
        self, operation: Operation, call: RelevanceCall, function: Any, keywords: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.operation = operation
        self.call = call
        # Not registered as a submodule: it may be the user's module, which the explainer's
        # .train()/.to() must not touch.
        object.__setattr__(self, "function", function)
        object.__setattr__(self, "keywords", keywords or {})

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the operation's relevance function on the node's arguments.

        Parameters
        ----------
        *args, **kwargs
            The node's arguments.

        Returns
        -------
        Any
            The operation's output, whose backward propagates relevance.
        """
        if torch.compiler.is_compiling():
            return _run_outside_compilation(RelevanceNode.forward)(self, *args, **kwargs)
        return self.operation.explained(self.call, self.function, *args, **kwargs, **self.keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`forward`, through nn.Module's call machinery only where the node has hooks.

        Parameters
        ----------
        *args, **kwargs
            The node's arguments.

        Returns
        -------
        Any
            What :meth:`forward` returns.
        """
        # nn.Module's call machinery costs more than a view's own work, in graphs of hundreds of
        # nodes run at every explanation: it runs only for a node given hooks (relevant walks
        # record node states with them). (Global module hooks do not see fxlrp's nodes.)
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.operation.name}, rule={self.call.rule!r}"


_outside_compilation: dict[Callable[..., Any], Any] = {}  # not functools.cache: Dynamo traces through it


def _run_outside_compilation(function: Callable[..., Any]) -> Any:
    """``function`` skipped by TorchDynamo (inside, nothing is compiling). Dynamo cannot trace a
    relevance function (``RelevanceNode.forward``: it builds the inner autograd graph its backward
    uses, and keeps Python state from forward to backward), nor a run that swaps a module's
    parameters under a lock (:func:`~fxlrp.capture.module_state.run_with_detached_parameters`):
    under torch.compile(explain) it would break the graph inside and recompile the node's forward
    for every node until its recompile limit. Skipped, it runs as in eager, once per call. Made
    at the first compilation, since torch.compiler.disable imports Dynamo, which takes about a
    second that ``import fxlrp`` should not spend. Compiled explanations: fxlrp.compile."""
    if function not in _outside_compilation:
        _outside_compilation[function] = torch.compiler.disable(function)
    return _outside_compilation[function]


class PlainCallNode(nn.Module):
    """Calls ``call(function, *args, **kwargs, **keywords)`` and nothing else.

    A node of a recorded graph whose relevance function is that call
    (:class:`~fxlrp.registry.NativeInGradientForm`).

    Parameters
    ----------
    call : callable
        The call, ``call(function, *args, **kwargs)``.
    function : Any
        What the node called (a function, or the user's module).
    keywords : dict
        A module's detached parameters, added to each call.
    """

    def __init__(self, call: Any, function: Any, keywords: dict[str, Any]) -> None:
        super().__init__()
        # Not registered as submodules: ``function`` may be the user's module.
        object.__setattr__(self, "call", call)
        object.__setattr__(self, "function", function)
        object.__setattr__(self, "keywords", keywords)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``call(function, *args, **kwargs, **keywords)``.

        Parameters
        ----------
        *args, **kwargs
            The node's arguments.

        Returns
        -------
        Any
            The call's output.
        """
        return self.call(self.function, *args, **kwargs, **self.keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`forward`, without nn.Module's call machinery.

        Parameters
        ----------
        *args, **kwargs
            The node's arguments.

        Returns
        -------
        Any
            What :meth:`forward` returns.
        """
        # (a node of a recorded graph: nobody hooks it; see RelevanceNode.__call__)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return getattr(self.function, "__name__", type(self.function).__name__)


class NativeModuleNode(nn.Module):
    """Runs a module natively with its parameters detached.

    Parameters
    ----------
    module : nn.Module
        The user's module (run out of place, :func:`out_of_place`).
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "module", out_of_place(module))
        object.__setattr__(self, "holds_tensors", bool(detached_state(module)))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module with its detached parameters and buffers.

        Parameters
        ----------
        *args, **kwargs
            The module's arguments.

        Returns
        -------
        Any
            The module's output.
        """
        if not self.holds_tensors:
            return self.module(*args, **kwargs)
        if torch.compiler.is_compiling():
            return _run_outside_compilation(run_with_detached_parameters)(self.module, args, kwargs, False)
        return run_with_detached_parameters(self.module, args, kwargs, evaluation=False)

    def extra_repr(self) -> str:
        return type(self.module).__name__


def method(name: str) -> Callable[..., Any]:
    """The function spelling of a Tensor method: ``self`` comes first.

    Parameters
    ----------
    name : str
        The method's name.

    Returns
    -------
    callable
        A :class:`TensorMethod`.
    """
    return TensorMethod(name)


class TensorMethod:
    """Calls the Tensor method ``__name__`` on its first argument.

    An object, not a closure, so that an explainer holding it can be pickled
    (``torch.save(explain)``).

    Parameters
    ----------
    name : str
        The method's name.
    """

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        """``tensor.<name>(*args, **kwargs)``.

        Parameters
        ----------
        tensor : Any
            The object whose method is called.
        *args, **kwargs
            The method's arguments.

        Returns
        -------
        Any
            What the method returns.
        """
        return getattr(tensor, self.__name__)(*args, **kwargs)
