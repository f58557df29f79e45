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
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
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
    """How relevance crosses an operation: what its :class:`Propagation` amounts to."""

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
    its ``forward``. Register it with ``register(Operation("name",
    Spelling(functions=(TheFunction,)), Pass(own_backward)))`` (docs/extending.md). Relevance is carried
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


ModuleFunction = Callable[[nn.Module, dict[str, Any]], tuple[Callable[..., Any], dict[str, Any]]]
"""``module_function(module, parameters)``: the functional form of a module instance and its
keyword arguments, given the module's detached parameters and buffers."""


@dataclass(frozen=True)
class Spelling:
    """How a model spells an operation: functions, Tensor methods, module types."""

    functions: tuple[Callable[..., Any], ...] = ()
    """Functions that spell it, by identity (``torch.add``, ``operator.add``, ``F.linear``)."""
    methods: tuple[str, ...] = ()
    """Tensor method names that spell it (``"add"``)."""
    modules: tuple[type[nn.Module], ...] = ()
    """Module types that spell it (``nn.Conv2d``); subclasses that keep the type's ``forward`` too."""
    module_bases: tuple[type[nn.Module], ...] = ()
    """Module types whose subclasses all spell it, whatever their ``forward`` (a library's base
    class, e.g. PyG's ``MessagePassing``, whose subclasses each define their own forward)."""
    module_function: ModuleFunction | None = None
    """``module_function(module, parameters)`` returns the functional form of a module instance and
    its keyword arguments, given the module's detached parameters and buffers; by default the
    module itself, called with no extra arguments."""
    leaf: bool = False
    """Whether capture records calls of :attr:`functions` as single nodes instead of tracing into
    them (library functions with Python control flow on tensor values)."""


class Propagation:
    """How relevance crosses an operation: :class:`Affine`, :class:`Pass`, :class:`Native`,
    :class:`Routed` or :class:`Decomposed`.

    Each variant declares only the facts that mean something for it; what it does not declare
    reads as the value here (a :class:`Pass` is never ``weighted``), so no variant can be given
    a fact that contradicts it.
    """

    kind: Kind
    relevance: RelevanceFunction | None = None
    """``relevance(call, function, *args, **kwargs)`` (a :class:`RelevanceFunction`) replaces the
    call: ``call`` is the :class:`~fxlrp.relevance.call.RelevanceCall` with the node's rule,
    ``function`` the original callable of the spelling (the function itself, a caller of the
    Tensor method with ``self`` first, or the functional form of a module) and ``args``/``kwargs``
    the call's arguments. None (:class:`Native`): the node keeps its native operation."""
    weighted = False
    default_rule: Callable[[], Any] | None = None
    factors: Callable[[Sequence[Any], Mapping[str, Any]], Sequence[Any]] | None = None
    output_free_backward = False
    gradient_native: NativeInGradientForm | None = None
    source = False
    holds_layers = False


@dataclass(frozen=True)
class Affine(Propagation):
    """Affine in its relevance-carrying inputs: the composite gives each call a rule (epsilon, z+, ...)."""

    kind = Kind.AFFINE
    relevance: RelevanceFunction = field()  # (required: the base's None is for Native)
    default_rule: Callable[[], Any] | None = None
    """The rule where the composite names none (the z-rule for sums); None: the composite's layer rule."""
    factors: Callable[[Sequence[Any], Mapping[str, Any]], Sequence[Any]] | None = None
    """For a product (``a * b``, ``a @ b``, ``einsum``): its factors among a call's arguments,
    positional and by keyword (``lambda args, kwargs: args[:2]``). Where two or more carry
    relevance, the rule the call is given is a :class:`~fxlrp.rules.Product` rule
    (:meth:`fxlrp.rules.composites.Composite.resolve`); which do is read from the graph at
    conversion, from the tensors in code run eagerly."""
    weighted: bool = False
    """Whether it is a layer with weights, where a composite's layer rules apply."""
    output_free_backward: bool = False
    """Whether its vector-Jacobian product leaves its output unread (sums, pooling), so that a
    ReLU that alone consumes it may rectify it in place. Layers with weights (:attr:`weighted`)
    are taken to be so; a scatter_reduce's or softmax's backward reads its output."""
    gradient_native: NativeInGradientForm | None = None
    """Where its relevance function is a plain call in the gradient form (affine maps, layers,
    products with one relevance-carrying factor): see :class:`NativeInGradientForm`."""
    source: bool = False
    """Whether relevance starts at its output although its arguments carry none (a bag of
    embeddings of token ids): code run eagerly routes its calls to :attr:`relevance` even then."""


@dataclass(frozen=True)
class Pass(Propagation):
    """Relevance passes unchanged (the identity rule, ``R_in = R_out``): smooth activations,
    scaling by constants."""

    kind = Kind.PASS
    relevance: RelevanceFunction = field()  # (required: the base's None is for Native)
    gradient_native: NativeInGradientForm | None = None
    """Where its relevance function is a plain call in the gradient form (a map linear in its one
    relevance-carrying argument): see :class:`NativeInGradientForm`."""


@dataclass(frozen=True)
class Native(Propagation):
    """The model's own call, kept in the graph: its native backward routes relevance (max, pooling
    by maximum) or it carries none (shapes, comparisons, creation)."""

    kind = Kind.NATIVE


@dataclass(frozen=True)
class Routed(Propagation):
    """No rule: a relevance function routes relevance the operation's own way (a ReLU's
    rectification, a view's selection, dropout as the identity at explanation time, an embedding
    lookup)."""

    kind = Kind.NATIVE
    relevance: RelevanceFunction = field()  # (required: the base's None is for Native)
    source: bool = False
    """Whether relevance starts at its output although its arguments carry none (an embedding
    lookup of token ids, the input layer of a language model): code run eagerly routes its calls
    to :attr:`relevance` even then."""


@dataclass(frozen=True)
class Decomposed(Propagation):
    """Explained by running its own code, whose operations each take their rule: a part run
    eagerly, a PyG message-passing layer. The composite's layer rules reach the layers inside one
    by one, and the first layer may be among them (found as that code runs)."""

    relevance: RelevanceFunction = field()  # (required: the base's None is for Native)
    weighted: bool = False
    """Whether it is itself a layer with weights, given the composite's layer rule for what its
    relevance function computes outside the layers it runs (a message-passing layer's sums)."""
    holds_layers = True

    @property
    def kind(self) -> Kind:  # type: ignore[override]
        """:attr:`Kind.AFFINE` for a layer with weights, else :attr:`Kind.NATIVE`."""
        return Kind.AFFINE if self.weighted else Kind.NATIVE


class RoleFrom(enum.Enum):
    """Where an operation's output takes its role from its arguments (:attr:`ValueFlow.role`)."""

    FIRST_ARGUMENT = "first argument"
    """Its output is its first argument's values moved, re-typed or selected (views, copies,
    casts, indexing, the pieces of ``split``): it takes that argument's role, so that a cast or a
    reshape between a softmax and the product it feeds keeps the product's rule; where the
    argument can hold none (:func:`fxlrp.graph.relevance_flow.nodes_that_may_hold_roles`) the
    native call is all there is to it."""
    SHARED = "shared"
    """Its output takes the role its relevance-carrying arguments share (elementwise affine maps:
    ``1 - z`` of a gate ``z`` is a gate, as GRU's update ``(1 - z) * n + z * h`` uses it;
    ``weights * mask`` of attention weights are attention weights)."""


SpellingFact = bool | frozenset[Any]
"""A fact of every spelling of an operation (True/False), or of the spellings listed (method
names, functions and module types)."""


def _holds_for(fact: SpellingFact, spelled: Any) -> bool:
    return fact if isinstance(fact, bool) else spelled in fact


class NonNegativeOutput(Protocol):
    """A :attr:`ValueFlow.non_negative`: whether a call's output is never negative."""

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


@dataclass(frozen=True)
class ValueFlow:
    """How values flow through an operation: which arguments are indices, whether its output
    may be a view of its first argument or keeps its number of dimensions, where its output's
    role comes from."""

    role: str | Callable[..., str | None] | RoleFrom | None = None
    """The role of its output for the products it enters (:mod:`fxlrp.relevance.roles`: a gate,
    attention weights, a gating activation), which :meth:`Operation.explained` marks its results
    with; ``role(result, *args, **kwargs)`` where it depends on the call (a softmax of the scores a
    router chose makes gates, not attention weights); or taken from its arguments
    (:class:`RoleFrom`)."""
    index_arguments: tuple[int, ...] | Mapping[str, tuple[int, ...]] = ()
    """Positions of its arguments that are indices (``scatter(src, index)``: 1; a Tensor method's
    ``self`` is position 0): they select values but carry no relevance of their own (see
    :mod:`fxlrp.graph.relevance_flow`). The same for every spelling, or by the name of each
    spelling (``{"gather": (2,)}``). Keyword arguments named ``index``, ``indptr``, ``batch``, ...
    are indices whatever the operation."""
    aliasing: SpellingFact = False
    """Whether its result may share memory with its first argument (a view, or the tensor
    itself), so that an in-place write into the result writes into the argument."""
    keeps_rank: SpellingFact = False
    """Whether its output has as many dimensions as its input, batched or not (layers,
    elementwise maps), which :mod:`fxlrp.explain.input_checks` follows to a BatchNorm's check."""
    saturates: bool = False
    """Whether it squashes into a bounded range, its derivative vanishing where it saturates
    (softmax, sigmoid)."""
    non_negative: NonNegativeOutput | None = None
    """When its output is never negative, known from the graph without reading a value:
    ``non_negative(spelling, args, kwargs, known)`` (a :class:`NonNegativeOutput`). Rules that
    treat positive and negative inputs apart (z+, alpha-beta, gamma) then leave out the terms of
    negative inputs of the layers it feeds (:func:`fxlrp.graph.relevance_flow.nodes_known_non_negative`).
    None: never known (convolutions, BatchNorm, ...)."""

    @property
    def gives_role(self) -> bool:
        """Whether it gives its output a role of its own (:attr:`role` a role or a function), not its arguments'."""
        return self.role is not None and not isinstance(self.role, RoleFrom)

    @property
    def moves_values(self) -> bool:
        """Whether its output is its first argument's values moved (:attr:`RoleFrom.FIRST_ARGUMENT`)."""
        return self.role is RoleFrom.FIRST_ARGUMENT

    def index_positions(self, name: str) -> tuple[int, ...]:
        """The positions of the index arguments of the spelling ``name`` (a method's or function's name).

        Parameters
        ----------
        name : str
            The spelling's name.

        Returns
        -------
        tuple of int
            The positions; empty where none is an index.
        """
        if isinstance(self.index_arguments, tuple):
            return self.index_arguments
        return self.index_arguments.get(name, ())

    def may_alias(self, spelled: str | Callable[..., Any]) -> bool:
        """Whether the spelling (a method's name or a function) may return a view of its first argument.

        Parameters
        ----------
        spelled : str or callable
            The method's name or the function.

        Returns
        -------
        bool
            True if its result may share memory with its first argument.
        """
        return _holds_for(self.aliasing, spelled)

    def keeps_rank_of(self, spelled: str | Callable[..., Any] | type) -> bool:
        """Whether the spelling (a method's name, a function or a module type) keeps the number of dimensions.

        Parameters
        ----------
        spelled : str, callable or type
            The method's name, the function or the module's type.

        Returns
        -------
        bool
            True if its output has as many dimensions as its input.
        """
        return _holds_for(self.keeps_rank, spelled)


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
