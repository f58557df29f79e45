"""The one registry of operations fxlrp knows.

Each :class:`Operation` names a canonical operation, lists every spelling that reaches it
(``nn.Module`` types, functions by identity, Tensor method names) and says how relevance
crosses it. Adding an operation is one ``register(Operation(...))`` in ``fxlrp/operations/``;
the parts it is made of (:class:`Spelling`, :class:`Affine`, :class:`ValueFlow`, ...) live in
:mod:`fxlrp.registry.parts` and are named here too.
The operations fill it as they are imported; it imports nothing above it and loads nothing:
:mod:`fxlrp.explain.loader` imports the core's operations, and the integrations with libraries
(:mod:`fxlrp.registry.integrations`) when a model uses the library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from fxlrp.registry.parts import (
    Affine,
    Decomposed,
    Kind,
    ModuleFunction,
    Native,
    NativeInGradientForm,
    NonNegativeOutput,
    Pass,
    Propagation,
    RelevanceFunction,
    RoleFrom,
    Routed,
    Spelling,
    SpellingFact,
    ValueFlow,
    called,
    own_backward,
)
from fxlrp.relevance.roles import give_role, role_of, shared_role

__all__ = [
    "REGISTRY", "Affine", "Decomposed", "Kind", "ModuleFunction", "Native", "NativeInGradientForm",
    "NonNegativeOutput", "Operation", "Pass", "Propagation", "Registry", "RelevanceFunction", "RoleFrom",
    "Routed", "Spelling", "SpellingFact", "ValueFlow", "called", "own_backward", "register", "registered_operation",
]


@dataclass(frozen=True, eq=False)
class Operation:
    """A canonical operation: how a model spells it, how relevance crosses it, how values flow through it.

    Each part is a small frozen value whose variants carry only the facts that mean something for
    them, so a registration cannot contradict itself: ``Operation("scaled", Spelling(functions=(f,)),
    Affine(affine, default_rule=proportional))``.
    """

    name: str
    """The canonical name (``"conv"``, ``"add"``, ``"softmax"``), which composites' ``operation_rules`` use."""
    spelling: Spelling
    """How a model spells it."""
    propagation: Affine | Pass | Native | Routed | Decomposed
    """How relevance crosses it."""
    flow: ValueFlow = ValueFlow()
    """How values flow through it."""
    description: str = ""
    """A line saying what the operation is, for documentation and reports."""

    def explained(self, call: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``relevance(call, function, *args, **kwargs)``, its output given its role as a product's factor.

        The role comes from :attr:`ValueFlow.role`.

        Parameters
        ----------
        call : RelevanceCall
            The node's rule and conversion settings.
        function : callable
            The original callable of the spelling the model used.
        *args, **kwargs
            The call's arguments.

        Returns
        -------
        Any
            What the operation returns, marked with its role.
        """
        result = self.propagation.relevance(call, function, *args, **kwargs)
        role = self.flow.role
        if role is RoleFrom.FIRST_ARGUMENT:
            role = role_of(args[0]) if args else None
        elif role is RoleFrom.SHARED:
            role = shared_role((*args, *kwargs.values()))
        elif callable(role):
            role = role(result, *args, **kwargs)
        return give_role(result, role)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by name (an explainer saved with torch.save): its functions may be closures, and
        # code compares operations by identity (``operation is EAGER``).
        return (REGISTRY.find_by_name, (self.name,))


class Registry:
    """Finds the operation of a call by function identity, method name or module type.

    fxlrp has one, :data:`REGISTRY`.
    """

    def __init__(self) -> None:
        self.operations: dict[str, Operation] = {}
        self._by_function: dict[int, Operation] = {}
        self._functions: dict[int, Callable[..., Any]] = {}
        self._by_method: dict[str, Operation] = {}
        self._by_module: dict[type, Operation] = {}
        self._by_base_module: dict[type, Operation] = {}
        self._concrete_args: dict[type, dict[str, Any]] = {}
        self.version = 0
        """Counts the changes of the registry (lookups made from it know when to be made again)."""
        self.find_by_name: Callable[[str], Operation] = registered_operation
        """``find_by_name(name)``, the registered operation ``name``: what a pickled operation
        names, to be found again in the process that loads it. :func:`registered_operation`; the
        loader (:mod:`fxlrp.explain.loader`) sets it with the loading of what registers it."""

    def register(self, operation: Operation) -> Operation:
        """Add an operation.

        Parameters
        ----------
        operation : Operation
            The operation.

        Returns
        -------
        Operation
            ``operation``.

        Raises
        ------
        ValueError
            If an operation of that name is registered already.
        """
        if operation.name in self.operations:
            raise ValueError(f"operation {operation.name!r} is registered twice")
        return self._index(operation)

    def extend(self, name: str, *, functions: tuple[Callable[..., Any], ...] = (),
               modules: tuple[type[nn.Module], ...] = ()) -> Operation:
        """Add spellings to a registered operation.

        An integration adds its library's functions or module types to an operation the core
        defines.

        Parameters
        ----------
        name : str
            The registered operation's name.
        functions : tuple of callable, optional
            Functions to add.
        modules : tuple of type, optional
            Module types to add.

        Returns
        -------
        Operation
            The operation with the added spellings, which replaces the registered one.

        Raises
        ------
        ValueError
            If no operation ``name`` is registered.
        """
        if name not in self.operations:
            raise ValueError(f"no operation {name!r} is registered to add spellings to; register it first "
                             "(fxlrp's own operations are registered once fxlrp.convert is imported)")
        operation = self.operations[name]
        spelling = operation.spelling
        return self._index(replace(operation, spelling=replace(
            spelling, functions=spelling.functions + functions, modules=spelling.modules + modules)))

    def _index(self, operation: Operation) -> Operation:
        self.operations[operation.name] = operation
        self.version += 1
        spelling = operation.spelling
        for function in spelling.functions:
            self._by_function[id(function)] = operation
            self._functions[id(function)] = function  # keeps the id valid
        for method in spelling.methods:
            self._by_method[method] = operation
        for module_type in (*spelling.modules, *spelling.module_bases):
            self._by_module[module_type] = operation
        for module_type in spelling.module_bases:
            self._by_base_module[module_type] = operation
        return operation

    def for_function(self, function: Callable[..., Any]) -> Operation | None:
        """The operation a function spells.

        Parameters
        ----------
        function : callable
            The called function.

        Returns
        -------
        Operation or None
            The operation, by the function's identity; None if none is registered.
        """
        operation = self._by_function.get(id(function))
        if operation is None and getattr(function, "__name__", None) == "apply":
            # ``TheFunction.apply`` of a custom autograd Function, registered by its class
            owner = getattr(function, "__self__", None)
            if isinstance(owner, type):
                operation = self._by_function.get(id(owner))
        return operation

    def for_method(self, name: str) -> Operation | None:
        """The operation a Tensor method spells.

        Parameters
        ----------
        name : str
            The method's name.

        Returns
        -------
        Operation or None
            The operation; None if none is registered.
        """
        return self._by_method.get(name)

    def for_module(self, module: nn.Module) -> Operation | None:
        """The operation a module instance spells.

        Parameters
        ----------
        module : nn.Module
            The module.

        Returns
        -------
        Operation or None
            The operation of its exact type; else of the closest registered base class whose
            ``forward`` it keeps; else of a base registered with ``subclasses=True``. None if
            none.
        """
        # Exact type first; then the closest registered base class, so subclasses of
        # nn.Conv2d that keep its forward (as many libraries write) are found too.
        operation = self._by_module.get(type(module))
        if operation is not None:
            return operation
        for base in type(module).__mro__[1:]:
            if base in self._by_module and type(module).forward is base.forward:
                return self._by_module[base]
        for base in type(module).__mro__:
            if base in self._by_base_module:
                return self._by_base_module[base]
        return None

    def fix_arguments(self, model_type: type[nn.Module], values: dict[str, Any]) -> None:
        """Fix arguments of a library's model class that only steer Python control flow.

        Capture fixes them to these values (PyG's BasicGNN: the sampling arguments = None). They
        apply to the class and its subclasses; a user's ``concrete_args`` win.

        Parameters
        ----------
        model_type : type of nn.Module
            The model class.
        values : dict of str to Any
            The arguments' values, by name.
        """
        self._concrete_args.setdefault(model_type, {}).update(values)

    def fixed_arguments(self, model: nn.Module) -> dict[str, Any]:
        """The arguments :meth:`fix_arguments` fixed for ``model``'s class and its bases.

        Parameters
        ----------
        model : nn.Module
            The model.

        Returns
        -------
        dict of str to Any
            The fixed arguments (a subclass's values win over its bases').
        """
        fixed: dict[str, Any] = {}
        for base in reversed(type(model).__mro__):
            fixed.update(self._concrete_args.get(base, {}))
        return fixed

    def leaf_functions(self) -> tuple[Callable[..., Any], ...]:
        """Functions of operations marked ``leaf``: capture records their calls as single nodes.

        Returns
        -------
        tuple of callable
            The functions.
        """
        return tuple(function for operation in self.operations.values() if operation.spelling.leaf
                     for function in operation.spelling.functions)

    def callables_where(self, holds: Callable[[Operation], bool]) -> frozenset[Callable[..., Any]]:
        """The functions and Tensor methods (as ``torch.Tensor.name``) that spell operations for which ``holds``.

        What a ``__torch_function__`` handler is handed: a question about an operation asked of
        the callables it sees (``registry.callables_where(lambda operation: operation.flow.saturates)``).

        Parameters
        ----------
        holds : callable
            ``holds(operation)``: whether an operation is wanted.

        Returns
        -------
        frozenset of callable
            Its functions, and the Tensor methods of its method names that torch has.
        """
        wanted = [operation.spelling for operation in self.operations.values() if holds(operation)]
        methods = (getattr(torch.Tensor, name, None) for spelling in wanted for name in spelling.methods)
        return frozenset((*(function for spelling in wanted for function in spelling.functions),
                          *(method for method in methods if method is not None)))



def register(operation: Operation) -> Operation:
    """Add an operation to the registry.

    Parameters
    ----------
    operation : Operation
        The operation.

    Returns
    -------
    Operation
        ``operation``.

    Raises
    ------
    ValueError
        If an operation of that name is registered already.
    """
    return REGISTRY.register(operation)


def registered_operation(name: str, load: Callable[[str], None] | None = None) -> Operation:
    """The registered operation ``name``.

    Parameters
    ----------
    name : str
        The operation's name.
    load : callable, optional
        ``load(name)``, called first where ``name`` is not registered: imports what may register
        it (the loader's, :mod:`fxlrp.explain.loader`, imports the integrations of installed
        libraries).

    Returns
    -------
    Operation
        The operation.

    Raises
    ------
    ValueError
        If nothing loaded registers ``name``.
    """
    if name not in REGISTRY.operations and load is not None:
        load(name)
    if name not in REGISTRY.operations:
        raise ValueError(
            f"no part of fxlrp loaded in this process registers the operation {name!r} (an explainer being loaded "
            "uses it): import the module that registers it (your extension of fxlrp) first"
        )
    return REGISTRY.operations[name]


REGISTRY = Registry()
