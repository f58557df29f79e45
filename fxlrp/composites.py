"""Composites: which rule each operation of a model gets.

A composite looks at a :class:`Site` (the canonical operation of a node, the module it belongs
to, whether it is the first layer) and returns a rule, or None to leave the operation's default
(the proportional z-rule for sums, pools and scatter sums).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from fxlrp.rules import Epsilon, Rule


@dataclass(frozen=True)
class Site:
    """What a composite may know about one node of the graph."""

    node_name: str
    operation: str
    """Canonical operation, e.g. ``"conv"``, ``"linear"``, ``"add"``, ``"avg_pool"``."""
    weighted: bool
    """A layer with weights (linear, convolution, BatchNorm, matmul with a parameter)."""
    module_name: str | None
    """Qualified name of the module the node belongs to (its own for module calls)."""
    module_type: type[nn.Module] | None
    is_first_layer: bool
    """The first weighted layer the input meets."""
    is_module_call: bool = False
    """The node calls a module (``nn.AvgPool2d``) rather than a function (``x + y``)."""


class Composite:
    """Assigns rules by qualified module name, first layer, module type and operation.

    Name and type rules apply to weighted layers and module calls; a functional sum such as a
    residual ``+`` inside a block is reached by ``operation_rules``. Precedence, first match wins:

    1. ``name_rules``: ``{glob pattern: rule}`` on the qualified module name (``"features.0"``,
       ``"layer*.conv1"``);
    2. ``first_layer``: the rule of the first weighted layer;
    3. ``type_rules``: ``{module type or tuple of types: rule}``, subclasses included;
    4. ``operation_rules``: ``{canonical operation: rule}`` (``"add"``, ``"avg_pool"``, ...);
    5. ``layer_rule`` for every weighted layer;
    6. the operation's own default (z-rule for sums).
    """

    def __init__(
        self,
        layer_rule: Rule | None = None,
        *,
        name_rules: Mapping[str, Rule] | None = None,
        first_layer: Rule | None = None,
        type_rules: Mapping[Any, Rule] | Iterable[tuple[Any, Rule]] | None = None,
        operation_rules: Mapping[str, Rule] | None = None,
    ) -> None:
        self.layer_rule = layer_rule
        self.name_rules = dict(name_rules or {})
        self.first_layer = first_layer
        self.type_rules = list(type_rules.items() if isinstance(type_rules, Mapping) else type_rules or [])
        self.operation_rules = dict(operation_rules or {})

    def rule_for(self, site: Site) -> Rule | None:
        by_module = site.weighted or site.is_module_call
        if by_module and site.module_name is not None:
            for pattern, rule in self.name_rules.items():
                if fnmatch.fnmatchcase(site.module_name, pattern):
                    return rule
        if site.is_first_layer and self.first_layer is not None:
            return self.first_layer
        if by_module and site.module_type is not None:
            for module_types, rule in self.type_rules:
                if issubclass(site.module_type, module_types):
                    return rule
        if site.operation in self.operation_rules:
            return self.operation_rules[site.operation]
        if site.weighted:
            return self.layer_rule
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layer_rule={self.layer_rule!r})"


def default_composite() -> Composite:
    """Epsilon(1e-6) on every weighted layer; the z-rule for sums, pools and scatter sums."""
    return Composite(layer_rule=Epsilon(1e-6))


def as_composite(composite: Composite | Rule | None) -> Composite:
    """``None`` -> the default; a single rule -> that rule on every weighted layer."""
    if composite is None:
        return default_composite()
    if isinstance(composite, Rule):
        return Composite(layer_rule=composite)
    if isinstance(composite, Composite):
        return composite
    raise TypeError(
        f"composite must be None, a rule (e.g. fxlrp.rules.Epsilon(0.0)) or a Composite, "
        f"not {type(composite).__name__}"
    )
