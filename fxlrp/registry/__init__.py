"""The one registry of operations fxlrp knows.

Each :class:`Operation` names a canonical operation, lists every spelling that reaches it
(``nn.Module`` types, functions by identity, Tensor method names) and says how relevance
crosses it. Adding an operation is one ``register(Operation(...))`` in ``fxlrp/operations/``.
The operations fill it as they are imported; it imports nothing above it and loads nothing:
:mod:`fxlrp.explain.loader` imports the core's operations, and the integrations with libraries
(:mod:`fxlrp.registry.integrations`) when a model uses the library.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from torch import nn

from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_is_native, require_relevance_form
from fxlrp.relevance.roles import give_role, role_of, shared_role


class RelevanceFunction(Protocol):
    """An operation's ``relevance``: called in place of the operation.

    It is called as ``relevance(call, function, *args, **kwargs)`` and returns what the
    operation returns, computed so that its backward carries relevance under ``call.rule``.
    """

    def __call__(self, call: RelevanceCall, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run the operation so that its backward carries relevance.

        Parameters
        ----------
        call : RelevanceCall
            The node's :class:`~fxlrp.relevance.call.RelevanceCall` (its rule and conversion
            settings).
        function : callable
            The original callable of the spelling the model used.
        *args, **kwargs
            The call's arguments.

        Returns
        -------
        Any
            What the operation returns.
        """
        ...


class Kind(enum.Enum):
    """How relevance crosses an operation."""

    AFFINE = "affine"
    """Affine in its relevance-carrying inputs; the composite picks a rule (epsilon, z+, ...)."""
    PASS = "pass"
    """Relevance passes unchanged (identity rule), e.g. smooth activations, scaling by constants."""
    NATIVE = "native"
    """The native backward already routes relevance correctly (ReLU, max, views, indexing,
    concatenation) or the operation carries no relevance (shapes, comparisons, creation)."""


def called(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``: the call as the model makes it.

    Parameters
    ----------
    function : callable
        The called function.
    *args, **kwargs
        Its arguments.

    Returns
    -------
    Any
        What ``function`` returns.
    """
    return function(*args, **kwargs)


def own_backward(call: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Relevance function of a custom ``torch.autograd.Function`` whose own backward is declared its rule.

    The Function is applied as the model applies it, and relevance goes back through its
    ``backward``, ``R_in = backward(R_out)``.

    Right where that backward routes values rather than scaling them by a derivative - a
    straight-through estimator's identity (the identity rule), a gradient reversal's sign - which
    is why it is declared, never assumed: an undeclared Function is explained by the operations of
    its ``forward``. Register it with ``register(Operation("name", Kind.PASS,
    functions=(TheFunction,), relevance=own_backward))`` (docs/extending.md). Relevance is carried
    as itself (the relevance form), not as ``R / x``.

    Parameters
    ----------
    call : RelevanceCall
        The node's call (unused: the Function's backward is its rule).
    function : callable
        ``TheFunction.apply``.
    *args, **kwargs
        The Function's arguments.

    Returns
    -------
    Any
        What the Function returns.
    """
    require_relevance_form(f"{getattr(getattr(function, '__self__', None), '__name__', 'a custom Function')}'s "
                           "own backward")
    return function(*args, **kwargs)


@dataclass(frozen=True)
class NativeInGradientForm:
    """Where an operation's relevance function is a plain call in the gradient form.

    In the gradient form (:mod:`fxlrp.relevance.form`, ``R = x * g``), with at most one
    relevance-carrying factor, an affine map's rule ``R_x = x * J^T (R / z)`` is
    ``g_x = J^T g_z``, autograd's own. A recorded graph (:mod:`fxlrp.eager.replay`) runs such a
    node as that call alone.
    """

    needs_native_rule: bool = True
    """True: only under a rule whose gradient is the native gradient (LRP-0 and the z-rule:
    :meth:`~fxlrp.rules.Rule.gradient_is_native`); False: under any rule (a map linear in its one
    relevance-carrying argument, whose identity rule ``x g_x = y g_y`` is ``g_x = J^T g_y``)."""
    call: Callable[..., Any] = called
    """``call(function, *args, **kwargs)``: the call the relevance function makes then."""

    def holds(self, rule: Any, warn_lost_relevance: bool) -> bool:
        """Whether the relevance function under ``rule`` is :attr:`call` in the gradient form.

        Parameters
        ----------
        rule : Rule or None
            The call's rule.
        warn_lost_relevance : bool
            Whether relevance lost at zero denominators warns, which takes the rule's own
            backward.

        Returns
        -------
        bool
            True if the node may run as :attr:`call` alone.
        """
        return not warn_lost_relevance and (not self.needs_native_rule or gradient_is_native(rule))


class NonNegativeOutput(Protocol):
    """An operation's :attr:`~Operation.non_negative`: whether a call's output is never negative."""

    def __call__(self, spelling: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                 known: Callable[[Any], bool], /) -> bool:
        """Whether the call's output is never negative, given what is known of its arguments.

        Parameters
        ----------
        spelling : Any
            What the call calls: the function, the Tensor method's name or the module.
        args, kwargs
            The call's arguments, as the captured graph holds them (its values are graph nodes).
        known : callable
            ``known(argument)``: whether an argument is known never to be negative (a node so
            known, a number ``>= 0``, a list or tuple of such, None, a string, a dtype); False
            for anything else.

        Returns
        -------
        bool
            True only if no value of the output can be negative.
        """
        ...


@dataclass(frozen=True, eq=False)
class Operation:
    """A canonical operation and every way a model can spell it.

    Each field is documented where it is declared. How the fields depend on each other
    (``weighted``, ``default_rule`` and ``factors`` need an
    affine kind; ``source``, ``holds_layers`` and ``gradient_native`` a relevance function; one
    of ``role``, ``shares_role``, ``moves_values``) is checked when an operation is made, and a
    contradiction is refused with what to change (:data:`_FIELD_RULES`).
    """

    name: str
    """The canonical name (``"conv"``, ``"add"``, ``"softmax"``), which composites' ``operation_rules`` use."""
    kind: Kind
    """How relevance crosses it."""
    functions: tuple[Callable[..., Any], ...] = ()
    """Functions that spell it, by identity (``torch.add``, ``operator.add``, ``F.linear``)."""
    methods: tuple[str, ...] = ()
    """Tensor method names that spell it (``"add"``)."""
    modules: tuple[type[nn.Module], ...] = ()
    """Module types that spell it (``nn.Conv2d``); subclasses that keep the type's ``forward`` too."""
    relevance: RelevanceFunction | None = None
    """``relevance(call, function, *args, **kwargs)`` (a :class:`RelevanceFunction`) replaces the
    call: ``call`` is the :class:`~fxlrp.relevance.call.RelevanceCall` with the node's rule,
    ``function`` the original callable of this spelling (the function itself, a caller of the
    Tensor method with ``self`` first, or the functional form of a module) and ``args``/``kwargs``
    the call's arguments. With ``relevance=None`` the node keeps its native operation."""
    module_function: Callable[[nn.Module, dict[str, Any]], tuple[Callable[..., Any], dict[str, Any]]] | None = None
    """``module_function(module, parameters)`` returns the functional form of a module instance and
    its keyword arguments, given the module's detached parameters and buffers; by default the
    module itself, called with no extra arguments."""
    weighted: bool = False
    """Whether it is a layer with weights, where a composite's layer rules apply."""
    default_rule: Callable[[], Any] | None = None
    """Rule used for an AFFINE operation when the composite names none (the z-rule for sums)."""
    description: str = ""
    """A line saying what the operation is, for documentation and reports."""
    subclasses: bool = False
    """Whether subclasses of ``modules`` belong to it too, whatever their ``forward`` (a library's
    base class, e.g. PyG's ``MessagePassing``, whose subclasses each define their own forward)."""
    leaf: bool = False
    """Whether capture records calls of ``functions`` as single nodes instead of tracing into them
    (library functions with Python control flow on tensor values)."""
    index_arguments: tuple[int, ...] = ()
    """Positions of the arguments of ``functions`` that are indices (``scatter(src, index)``: 1):
    they select values but carry no relevance of their own (see :mod:`fxlrp.graph.relevance_flow`).
    Keyword arguments named ``index``, ``indptr``, ``batch``, ... are indices whatever the entry."""
    output_free_backward: bool = False
    """Whether the operation's vector-Jacobian product leaves its output unread (sums, pooling), so
    that a ReLU that alone consumes it may rectify it in place. Layers with weights (``weighted``)
    are taken to be so; a scatter_reduce's or softmax's backward reads its output."""
    source: bool = False
    """Whether relevance starts at its output although its arguments carry none (an embedding
    lookup of token ids, the input layer of a language model): code run eagerly routes its calls
    to ``relevance`` even then."""
    holds_layers: bool = False
    """Whether it runs a module's own code, whose layers the composite's rules reach one by one (a
    part run eagerly, a PyG message-passing layer): the first layer may be inside, and is found as
    that code runs."""
    factors: Callable[[Sequence[Any], Mapping[str, Any]], Sequence[Any]] | None = None
    """For a product (``a * b``, ``a @ b``, ``einsum``): its factors among a call's arguments,
    positional and by keyword (``lambda args, kwargs: args[:2]``). Where two or more carry
    relevance, the rule the call is given is a :class:`~fxlrp.rules.Product` rule
    (:meth:`fxlrp.rules.composites.Composite.resolve`); which do is read from the graph at conversion,
    from the tensors in code run eagerly."""
    role: str | Callable[..., str | None] | None = None
    """The role of its output for the products it enters (:mod:`fxlrp.relevance.roles`: a gate,
    attention weights, a gating activation): :meth:`explained` marks its results with it. Where it
    depends on the call, ``role(result, *args, **kwargs)`` gives it (a softmax of the scores a
    router chose makes gates, not attention weights)."""
    shares_role: bool = False
    """Whether its output takes the role its relevance-carrying arguments share (elementwise
    affine maps: ``1 - z`` of a gate ``z`` is a gate, as GRU's update ``(1 - z) * n + z * h``
    uses it; ``weights * mask`` of attention weights are attention weights)."""
    moves_values: bool = False
    """Whether its output is its first argument's values moved, re-typed or selected (views,
    copies, casts, indexing, the pieces of ``split``): it takes that argument's role, so that a
    cast or a reshape between a softmax and the product it feeds keeps the product's rule; where
    the argument can hold none (:func:`fxlrp.graph.relevance_flow.nodes_that_may_hold_roles`) the
    native call is all there is to it."""
    gradient_native: NativeInGradientForm | None = None
    """Where its relevance function is a plain call in the gradient form (affine maps, layers,
    products with one relevance-carrying factor): see :class:`NativeInGradientForm`."""
    non_negative: NonNegativeOutput | None = None
    """When its output is never negative, known from the graph without reading a value:
    ``non_negative(spelling, args, kwargs, known)`` (a :class:`NonNegativeOutput`). Rules that
    treat positive and negative inputs apart (z+, alpha-beta, gamma) then leave out the terms of
    negative inputs of the layers it feeds (:func:`fxlrp.graph.relevance_flow.nodes_known_non_negative`).
    None: never known (convolutions, BatchNorm, ...)."""

    def __post_init__(self) -> None:
        problems = [message for holds, message in _FIELD_RULES if holds(self)]
        if problems:
            raise ValueError(f"operation {self.name!r}: " + "; ".join(problems))

    def explained(self, call: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``relevance(call, function, *args, **kwargs)``, its output given its role as a product's factor.

        The role comes from :attr:`role`, :attr:`shares_role` or :attr:`moves_values`.

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
        result = self.relevance(call, function, *args, **kwargs)
        if self.moves_values:
            role = role_of(args[0]) if args else None
        elif self.shares_role:
            role = shared_role((*args, *kwargs.values()))
        else:
            role = self.role(result, *args, **kwargs) if callable(self.role) else self.role
        return give_role(result, role)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by name (an explainer saved with torch.save): its functions may be closures, and
        # code compares operations by identity (``operation is EAGER``).
        return (REGISTRY.find_by_name, (self.name,))


_FIELD_RULES: tuple[tuple[Callable[[Operation], bool], str], ...] = (
    (lambda op: op.weighted and op.kind is not Kind.AFFINE,
     "weighted=True needs kind=Kind.AFFINE (a composite's layer rules apply to affine maps only)"),
    (lambda op: op.default_rule is not None and op.kind is not Kind.AFFINE,
     "default_rule needs kind=Kind.AFFINE (only affine operations take a rule)"),
    (lambda op: op.factors is not None and op.kind is not Kind.AFFINE,
     "factors needs kind=Kind.AFFINE (a product of relevance-carrying factors takes a Product rule)"),
    (lambda op: op.subclasses and not op.modules,
     "subclasses=True describes module types: give modules=(...)"),
    (lambda op: (op.source or op.holds_layers or op.gradient_native is not None) and op.relevance is None,
     "source, holds_layers and gradient_native describe a relevance function: give relevance=..."),
    (lambda op: sum((op.role is not None, op.shares_role, op.moves_values)) > 1,
     "role, shares_role and moves_values each give the output's role: choose one"),
)
"""How :class:`Operation`'s fields depend on each other: a registration breaking one of these
is refused with its message."""


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
        loader (:mod:`fxlrp.explain.loader`) sets its own, which first loads what registers it."""

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
        return self._index(replace(operation, functions=operation.functions + functions,
                                   modules=operation.modules + modules))

    def _index(self, operation: Operation) -> Operation:
        self.operations[operation.name] = operation
        self.version += 1
        for function in operation.functions:
            self._by_function[id(function)] = operation
            self._functions[id(function)] = function  # keeps the id valid
        for method in operation.methods:
            self._by_method[method] = operation
        for module_type in operation.modules:
            self._by_module[module_type] = operation
            if operation.subclasses:
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
        return tuple(
            function for operation in self.operations.values() if operation.leaf for function in operation.functions
        )



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


def registered_operation(name: str) -> Operation:
    """The registered operation ``name``.

    Parameters
    ----------
    name : str
        The operation's name.

    Returns
    -------
    Operation
        The operation.

    Raises
    ------
    ValueError
        If nothing loaded registers ``name``.
    """
    if name not in REGISTRY.operations:
        raise ValueError(
            f"no part of fxlrp loaded in this process registers the operation {name!r} (an explainer being loaded "
            "uses it): import the module that registers it (your extension of fxlrp) first"
        )
    return REGISTRY.operations[name]


REGISTRY = Registry()
