"""The parts an :class:`~fxlrp.registry.Operation` is made of, each a small frozen value.

How a model spells an operation (:class:`Spelling`); how relevance crosses it (a
:class:`Propagation`: :class:`Affine` with its default rule and factors, :class:`Pass`,
:class:`Native`, :class:`Routed` or :class:`Decomposed`, each variant carrying only the facts that
mean something for it); how values flow through it (:class:`ValueFlow`: index arguments,
aliasing, rank, role). :mod:`fxlrp.registry` puts them together and finds them again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import nn

from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_is_native, require_relevance_form


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
    attention weights, a gating activation), which :meth:`~fxlrp.registry.Operation.explained` marks its results
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
    elementwise maps), which :mod:`fxlrp.explain.rank_checks` follows to a BatchNorm's check."""
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
