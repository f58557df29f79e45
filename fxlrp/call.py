"""What one rewritten call site knows when it runs: its rule and per-conversion caches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from fxlrp.relevance import AffineLayer, apply_rule


class RelevanceCall:
    """The rule of one node and the settings of its conversion.

    Operations' ``relevance`` functions receive it first and call :meth:`affine` for the
    affine part of their work. Parameter transforms of the rule (``Rule.prepare``) are cached
    per weight tensor and recomputed only when the weight changes in place.

    ``site`` and ``composite`` are the node's :class:`~fxlrp.composites.Site` and the conversion's
    composite, for operations that run a whole sub-model at explanation time and choose rules for
    its parts (PyG's message-passing layers); ``strict`` is the conversion's setting.
    """

    def __init__(
        self, rule: Any, warn_lost_relevance: bool = False, *, site: Any = None, composite: Any = None,
        strict: bool = True,
    ) -> None:
        self.rule = rule
        self.warn_lost_relevance = warn_lost_relevance
        self.site = site
        self.composite = composite
        self.strict = strict
        self._prepared: dict[tuple[int, int, int, int], tuple[Any, Any]] = {}

    def layer(
        self,
        function: Callable[..., Tensor],
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        *,
        has_parameters: bool = False,
    ) -> AffineLayer:
        return AffineLayer(function, weight, bias, has_parameters, self.warn_lost_relevance)

    def affine(self, layer: AffineLayer, *inputs: Any) -> Tensor:
        """Run ``layer`` on ``inputs`` with this call's rule in backward."""
        return apply_rule(layer, self.rule, self._prepare(layer), *inputs)

    def _prepare(self, layer: AffineLayer) -> Any:
        if not layer.has_parameters:
            return self.rule.prepare(layer)
        key = tuple(
            (id(tensor), tensor._version) if tensor is not None else (0, 0)
            for tensor in (layer.weight, layer.bias)
        )
        flat_key = (*key[0], *key[1])
        cached = self._prepared.get(flat_key)
        if cached is None:
            # keep the tensors alive with their result so that ids are not reused
            cached = (self.rule.prepare(layer), (layer.weight, layer.bias))
            self._prepared = {flat_key: cached}
        return cached[0]
