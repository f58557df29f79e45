"""Small models and model inspections that several test modules use: the eager-capture network
and its composites, a message-passing network, two linear layers around an activation, the
autograd nodes of fxlrp's rules, and the state of a model's attributes."""

from __future__ import annotations

import torch
import torch_scatter
from torch import Tensor, nn

from fxlrp.relevance.rule_function import RuleFunction
from fxlrp.rules import Epsilon, ZPlus
from fxlrp.rules.composites import Composite, EpsilonGammaBox, EpsilonPlusFlat


class Network(nn.Module):
    """Conv -> ReLU -> conv -> ReLU -> avg pool -> linear; ``branch`` adds a data-dependent
    branch that picks the same computation either way, so that torch.fx cannot trace it but the
    values are those of the traceable twin."""

    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.branch = branch
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 3), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(5, 3)

    def forward(self, x):
        features = self.features(x)
        if self.branch and bool(features.amax() < -1e9):  # never taken, but only known at run time
            features = features * 0
        return self.classifier(torch.flatten(self.pool(features), 1) + features.mean())


class OwnChoice(Composite):
    """A composite that chooses by module name in code of its own, with no name or type rules."""

    def __init__(self) -> None:
        super().__init__(Epsilon(0.25))
        self.second_conv = ZPlus()

    def rule_for(self, site):
        return self.second_conv if site.module_name == "features.2" else super().rule_for(site)


COMPOSITES = {
    "EpsilonPlusFlat": lambda: EpsilonPlusFlat(),
    "EpsilonGammaBox": lambda: EpsilonGammaBox(-1.0, 1.0),
    "name and type rules": lambda: Composite(
        Epsilon(0.25), name_rules={"features.2": ZPlus()}, type_rules={nn.Linear: Epsilon(0.5)},
        operation_rules={"mean": Epsilon(0.1)}),
    "a subclass's own choice by module": OwnChoice,
}


class OptionalMask(nn.Module):
    """``forward(x, mask=None)`` with ``if mask is not None: mask.view(...)``: torch.fx traces the
    branch as taken (its stand-in for ``mask`` is not None), so a call without a mask needs a
    graph traced with ``mask=None`` (timm's Hiera)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x, mask=None):
        if mask is not None:
            x = x * mask.view(x.shape[0], -1).to(x.dtype)
        return torch.relu(self.layer(x))


class MessagePassing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.message = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.readout = nn.Linear(11, 2)

    def forward(self, x, senders, receivers):
        messages = self.message(torch.cat([x[senders], x[receivers]], dim=1))
        incoming = torch_scatter.scatter_add(messages, receivers, dim=0, dim_size=x.shape[0])
        return self.readout(torch.cat([x, incoming], dim=1))


class TwoLayers(nn.Module):
    def __init__(self, activation) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 16), nn.Linear(16, 3)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return self.second(self.activation(self.first(x)))


def rule_nodes(output: Tensor) -> list:
    """The RuleFunction nodes of the autograd graph behind ``output``."""
    found, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, RuleFunction._backward_cls):
            found.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def proxies_in(value: object, seen: set[int] | None = None) -> list[str]:
    """Where ``value`` holds a torch.fx Proxy: nested dicts, lists, tuples and sets, and the
    attributes of modules (repr paths)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.fx.Proxy):
        return ["(proxy)"]
    if isinstance(value, nn.Module):
        items = vars(value).items()
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple, set)):
        items = enumerate(value)
    else:
        return []
    return [f"{key!s}.{path}" for key, item in items for path in proxies_in(item, seen)]


def state_of_attributes(model: nn.Module) -> dict[str, dict[str, object]]:
    """Every module's attribute names, and the identities of what its dicts, lists and sets hold."""
    def contents(value: object) -> object:
        if isinstance(value, dict):
            return {key: id(item) for key, item in value.items()}
        if isinstance(value, list):
            return [id(item) for item in value]
        if isinstance(value, set):
            return {id(item) for item in value}
        return id(value)

    return {name: {key: contents(value) for key, value in vars(module).items()}
            for name, module in model.named_modules()}
