"""What one rewritten call site knows when it runs: its rule and per-conversion caches."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from fxlrp.relevance import AffineLayer, apply_rule
from fxlrp.relevance.form import gradient_form_active, gradient_is_native
from fxlrp.relevance.rule_function import AffineRule


@dataclass(frozen=True)
class Interpreter:
    """What the engine that runs code eagerly (:mod:`fxlrp.eager`) hands the operations: an
    operation whose relevance is that of a decomposition written in plain torch (fused attention, a
    complex product, GLU, a recurrent cell) runs it through its call
    (:meth:`RelevanceCall.decompose`), and needs nothing above the registry."""

    run: Callable[..., Any]
    """``run(call, function, *args, **kwargs)``: ``function(*args, **kwargs)`` with each torch
    operation on relevance-carrying tensors explained by its registry entry, under ``call``'s
    composite."""
    rules_inside: Callable[[RelevanceCall], Any]
    """``rules_inside(call)``: the rules of the operations inside ``call``; it has
    ``rule_for(operation, module, first, relevance_factors)``, ``holds_first_layer`` and
    ``composite``."""


_INTERPRETER: list[Interpreter] = []


def supply_interpreter(interpreter: Interpreter) -> None:
    """Hand the operations the engine's :class:`Interpreter` (the engine does, as it is imported).

    Parameters
    ----------
    interpreter : Interpreter
        The engine's interpreter.
    """
    _INTERPRETER[:] = [interpreter]


def _interpreter() -> Interpreter:
    if not _INTERPRETER:
        raise RuntimeError("fxlrp's engine is not loaded: import fxlrp.explain.loader (fxlrp.convert does)")
    return _INTERPRETER[0]


class RelevanceCall:
    """The rule of one node and the settings of its conversion.

    Operations' ``relevance`` functions receive it first and call :meth:`affine` for the
    affine part of their work. Parameter transforms of the rule (``Rule.prepare``) are cached
    per weight tensor and recomputed only when the weight changes in place.

    Parameters
    ----------
    rule : AffineRule or None
        The node's rule; None for operations that are not affine.
    warn_lost_relevance : bool, default False
        Whether relevance dropped at outputs of 0 warns.
    site : Site, optional
        The node's :class:`~fxlrp.rules.composites.Site`, for operations that run a whole
        sub-model at explanation time and choose rules for its parts (PyG's message-passing
        layers).
    composite : Composite, optional
        The conversion's composite, for the same operations.
    strict : bool, default True
        The conversion's setting.
    sole_consumer : bool, default False
        Whether the node is the only consumer of its first argument's value (known from the
        graph; False where it is unknown).
    inputs_non_negative : bool, default False
        Whether the node's relevance-carrying arguments are known never to be negative (from the
        graph: the outputs of ReLUs, poolings of them, ...; False where it is unknown). The layers
        of the call (:meth:`layer`) say so to their rules.
    """

    def __init__(
        self, rule: AffineRule | None, warn_lost_relevance: bool = False, *, site: Any = None, composite: Any = None,
        strict: bool = True, sole_consumer: bool = False, inputs_non_negative: bool = False,
    ) -> None:
        self.rule = rule
        self.warn_lost_relevance = warn_lost_relevance
        self.site = site
        self.composite = composite
        self.strict = strict
        self.sole_consumer = sole_consumer
        self.inputs_non_negative = inputs_non_negative
        self._cache: dict[Hashable, tuple[tuple[Any, ...], Any, tuple[Any, ...]]] = {}
        self.inner_calls: dict[tuple[int, str, bool, bool], tuple[Any, RelevanceCall]] = {}
        """Calls of the operations inside a part run eagerly, by module, operation, first-layer flag
        and whether several factors of a product carry relevance."""

    def __getstate__(self) -> dict[str, Any]:
        # The caches are keyed by the ids of tensors and modules of this process: a copy
        # (copy.deepcopy, pickle, torch.save) starts without them and fills them from its own.
        return {**self.__dict__, "_cache": {}, "inner_calls": {}}

    def layer(
        self,
        function: Callable[..., Tensor],
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        *,
        has_parameters: bool = False,
        recomputable: bool = False,
        softmax_dim: int | None = None,
        input_gradient: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None,
        output_rows_dim: int | None = None,
    ) -> AffineLayer:
        """The :class:`~fxlrp.relevance.AffineLayer` of ``function`` under this call's settings.

        Parameters
        ----------
        function : callable
            The operation, ``function(*inputs, weight, bias)`` or ``function(*inputs)``.
        weight, bias : Tensor, optional
            The layer's parameters.
        has_parameters : bool, default False
            Whether ``function`` takes ``weight`` and ``bias``.
        recomputable : bool, default False
            Whether the output is cheap to compute again from the input.
        softmax_dim : int, optional
            For a softmax, the dimension it normalises over.
        input_gradient : callable, optional
            The layer's vector-Jacobian product in its input, where it has a closed form.
        output_rows_dim : int, optional
            The output's dimension of the weight's rows (:attr:`AffineLayer.output_rows_dim`).

        Returns
        -------
        AffineLayer
            The layer, with this call's ``warn_lost_relevance`` and ``inputs_non_negative``.
        """
        return AffineLayer(function, weight, bias, has_parameters, self.warn_lost_relevance, recomputable, softmax_dim,
                           input_gradient, self.inputs_non_negative, output_rows_dim)

    def runs_natively(self) -> bool:
        """Whether the operation's own call is this call's relevance function at this moment.

        It is in the gradient form (:mod:`fxlrp.relevance.form`), for a rule whose gradient form
        is the native gradient (LRP-0, the z-rule: :meth:`~fxlrp.rules.Rule.gradient_is_native`).
        :meth:`affine` would run the operation unchanged then; the caller skips building its
        layer. This is asked at every call of an operation in code run eagerly.

        Returns
        -------
        bool
            True if the operation may run as it is.
        """
        return gradient_form_active() and not self.warn_lost_relevance and gradient_is_native(self.rule)

    def affine(self, layer: AffineLayer, *inputs: Any) -> Tensor:
        """Run ``layer`` on ``inputs`` with this call's rule in backward.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        *inputs
            Its inputs.

        Returns
        -------
        Tensor
            The layer's output, whose backward propagates relevance by the rule.
        """
        return apply_rule(layer, self.rule, self._prepare(layer), *inputs)

    def decompose(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)``, a decomposition in plain torch, with each torch operation
        inside explained under this call's composite (the engine's :class:`Interpreter`).

        Parameters
        ----------
        function : callable
            The decomposition.
        *args, **kwargs
            Its arguments.

        Returns
        -------
        Any
            What ``function`` returns (natively run where no argument carries relevance).
        """
        return _interpreter().run(self, function, *args, **kwargs)

    def rules_inside(self) -> Any:
        """The rules of the operations inside this call, as the composite chooses them.

        Returns
        -------
        Any
            An object with ``rule_for(operation, module, first, relevance_factors)``,
            ``holds_first_layer`` and ``composite`` (the engine's :class:`Interpreter`).
        """
        return _interpreter().rules_inside(self)

    def cached(self, slot: Hashable, tensors: Sequence[Tensor | None], compute: Callable[[], Any]) -> Any:
        """``compute()``, computed again only when one of ``tensors`` is replaced or changed in place.

        For work that depends on parameters alone (a rule's weight transforms, BatchNorm's scale
        and shift), so that it runs once per conversion, not once per call.

        Parameters
        ----------
        slot : hashable
            The cache entry's key within this call.
        tensors : sequence of (Tensor or None)
            The tensors the result depends on.
        compute : callable
            Computes the result, without arguments.

        Returns
        -------
        Any
            The cached or freshly computed result.
        """
        key = tuple((id(tensor), tensor._version) if tensor is not None else None for tensor in tensors)
        entry = self._cache.get(slot)
        if entry is None or entry[0] != key:
            # the tensors stay referenced with the result, so their ids cannot be reused
            entry = (key, compute(), tuple(tensors))
            self._cache[slot] = entry
        return entry[1]

    def _prepare(self, layer: AffineLayer) -> Any:
        if not layer.has_parameters:
            return self.rule.prepare(layer)
        return self.cached("rule", (layer.weight, layer.bias), lambda: self.rule.prepare(layer))
