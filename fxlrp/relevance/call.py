"""What one rewritten call site knows when it runs: its rule and per-conversion caches."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from torch import Tensor

from fxlrp.relevance import AffineLayer, apply_rule
from fxlrp.relevance.form import gradient_form_active, gradient_is_native
from fxlrp.relevance.rule_function import AffineRule


class RelevanceCall:
    """The rule of one node and the settings of its conversion.

    Operations' ``relevance`` functions receive it first and call :meth:`affine` for the
    affine part of their work. Parameter transforms of the rule (``Rule.prepare``) are cached
    per weight tensor and recomputed only when the weight changes in place.

    ``site`` and ``composite`` are the node's :class:`~fxlrp.rules.composites.Site` and the conversion's
    composite, for operations that run a whole sub-model at explanation time and choose rules for
    its parts (PyG's message-passing layers); ``strict`` is the conversion's setting.
    ``sole_consumer``: the node is the only consumer of its first argument's value (known from
    the graph; False where it is unknown).
    """

    def __init__(
        self, rule: AffineRule | None, warn_lost_relevance: bool = False, *, site: Any = None, composite: Any = None,
        strict: bool = True, sole_consumer: bool = False,
    ) -> None:
        self.rule = rule
        self.warn_lost_relevance = warn_lost_relevance
        self.site = site
        self.composite = composite
        self.strict = strict
        self.sole_consumer = sole_consumer
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
        input_gradient: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> AffineLayer:
        return AffineLayer(function, weight, bias, has_parameters, self.warn_lost_relevance, recomputable, softmax_dim,
                           input_gradient)

    def runs_natively(self) -> bool:
        """Whether the operation's own call is this call's relevance function now: in the gradient
        form (:mod:`fxlrp.relevance.form`), for a rule whose gradient form is the native gradient
        (LRP-0, the z-rule: :meth:`~fxlrp.rules.Rule.gradient_is_native`). :meth:`affine` would
        run the operation unchanged then; the caller skips building its layer. This is asked at
        every call of an operation in code run eagerly."""
        return gradient_form_active() and not self.warn_lost_relevance and gradient_is_native(self.rule)

    def affine(self, layer: AffineLayer, *inputs: Any) -> Tensor:
        """Run ``layer`` on ``inputs`` with this call's rule in backward."""
        return apply_rule(layer, self.rule, self._prepare(layer), *inputs)

    def cached(self, slot: Hashable, tensors: Sequence[Tensor | None], compute: Callable[[], Any]) -> Any:
        """``compute()``, computed again only when one of ``tensors`` is replaced or changed in
        place. For work that depends on parameters alone (a rule's weight transforms,
        BatchNorm's scale and shift), so that it runs once per conversion, not once per call."""
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
