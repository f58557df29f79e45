"""What is timed on each workload: the forward pass, gradient x input (the floor), fxlrp's,
zennit's and captum's explanations. ``prepare`` does the one-off work (``fxlrp.convert``,
registering zennit's hooks) and returns the function that is timed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.workloads import Workload


class Unavailable(Exception):
    """The configuration does not exist (yet) in the installed libraries."""


def _seed(output: Tensor) -> Tensor:
    """Output relevance: each sample's (each node's) highest output, as fxlrp.attribute does."""
    from fxlrp.explain.targets import output_relevance

    return output_relevance(output, None)


def _with_leaf(workload: Workload) -> tuple[list[Any], Tensor]:
    inputs = list(workload.inputs)
    leaf = inputs[workload.explained].detach().requires_grad_()
    inputs[workload.explained] = leaf
    return inputs, leaf


def backward_through(module: nn.Module, workload: Workload) -> Callable[[], Tensor]:
    """One explanation: forward with a leaf input, then the vector-Jacobian product with the
    output relevance (zennit's hooks and fxlrp's Functions turn it into relevance)."""

    def run() -> Tensor:
        inputs, leaf = _with_leaf(workload)
        output = module(*inputs)
        (relevance,) = torch.autograd.grad(output, leaf, _seed(output))
        return relevance

    return run


def forward(workload: Workload) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return workload.model(*workload.inputs)

    return run


def gradient_times_input(workload: Workload) -> Callable[[], Tensor]:
    """The floor: one backward through the model with frozen parameters, times the input."""
    gradient = backward_through(workload.model, workload)

    def run() -> Tensor:
        return gradient() * workload.inputs[workload.explained]

    return run


def _fxlrp_composite(name: str, workload: Workload) -> Any:
    import fxlrp

    if name == "Epsilon":
        return fxlrp.rules.Epsilon(1e-6)
    composite = getattr(fxlrp.composites, name, None)
    if composite is None:
        raise Unavailable(f"fxlrp.composites.{name} does not exist yet")
    if name == "EpsilonGammaBox":
        return composite(low=workload.low, high=workload.high)
    return composite()


def fxlrp_explanation(name: str) -> Callable[[Workload], Callable[[], Tensor]]:
    def prepare(workload: Workload) -> Callable[[], Tensor]:
        import fxlrp

        explain = fxlrp.convert(workload.model, _fxlrp_composite(name, workload))
        return backward_through(explain, workload)

    return prepare


def fxlrp_compiled(name: str) -> Callable[[Workload], Callable[[], Tensor]]:
    """``fxlrp.compile``: the explanation (forward, start relevance, relevance backward) traced
    to ATen operations and compiled by Inductor (fxlrp/explain/compiled.py); the first call, which
    traces and compiles (tens of seconds on a CPU), is made here and not timed."""
    def prepare(workload: Workload) -> Callable[[], Tensor]:
        import fxlrp

        explain = fxlrp.convert(_WithOthersFixed(workload), _fxlrp_composite(name, workload))
        compiled = fxlrp.compile(explain)
        explained = workload.inputs[workload.explained]
        compiled(explained)
        return lambda: compiled(explained)

    return prepare


class _WithOthersFixed(nn.Module):
    """A workload's model taking only its explained input; the others are fixed (a GCN's edges and
    edge weights), so that ``fxlrp.attribute`` explains that input alone, as the other
    configurations do."""

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.model, self.explained = workload.model, workload.explained
        self.others = [value for index, value in enumerate(workload.inputs) if index != workload.explained]

    def forward(self, explained: Tensor) -> Any:
        inputs = list(self.others)
        inputs.insert(self.explained, explained)
        return self.model(*inputs)


def fxlrp_lrp0_attributed(workload: Workload) -> Callable[[], Tensor]:
    """LRP-0 (the epsilon rule with epsilon 0 on every layer) through ``fxlrp.attribute``, which
    explains it in the gradient form (fxlrp/relevance/form.py): relevance of the explained input
    for each sample's highest output."""
    import fxlrp

    explain = fxlrp.convert(_WithOthersFixed(workload), fxlrp.rules.Epsilon(0.0))
    explained = workload.inputs[workload.explained]
    return lambda: fxlrp.attribute(explain, explained)


def _zennit_composite(name: str, workload: Workload) -> Any:
    from zennit import composites, rules, types

    canonizers = workload.zennit_canonizers()
    if name == "Epsilon":
        layer_map = composites.layer_map_base() + [
            (types.Convolution, rules.Epsilon(1e-6)), (torch.nn.Linear, rules.Epsilon(1e-6)),
        ]
        return composites.LayerMapComposite(layer_map=layer_map, canonizers=canonizers)
    if name == "EpsilonGammaBox":
        return composites.EpsilonGammaBox(low=workload.low, high=workload.high, canonizers=canonizers)
    return getattr(composites, name)(canonizers=canonizers)


def zennit_explanation(name: str) -> Callable[[Workload], Callable[[], Tensor]]:
    def prepare(workload: Workload) -> Callable[[], Tensor]:
        # zennit's canonizers and hooks change the model they are registered on: use a copy.
        model = copy.deepcopy(workload.model)
        _zennit_composite(name, workload).register(model)
        return backward_through(model, workload)

    return prepare


def captum_lrp(workload: Workload) -> Callable[[], Tensor]:
    from captum.attr import LRP

    lrp = LRP(copy.deepcopy(workload.model))
    others = tuple(value for i, value in enumerate(workload.inputs) if i != workload.explained)
    if workload.explained != 0:
        raise Unavailable("captum explains the first input only")

    with torch.no_grad():
        target = workload.model(*workload.inputs).argmax(dim=-1)

    def run() -> Tensor:
        return lrp.attribute(workload.inputs[0], target=target, additional_forward_args=others or None)

    return run


@dataclass(frozen=True)
class Configuration:
    name: str
    prepare: Callable[[Workload], Callable[[], Any]]
    is_floor: bool = False
    by_default: bool = True
    """False: run only when ``--configs`` names it (its preparation takes minutes)."""


CONFIGURATIONS: dict[str, Configuration] = {
    configuration.name: configuration
    for configuration in (
        Configuration("forward", forward),
        Configuration("gradient x input", gradient_times_input, is_floor=True),
        Configuration("fxlrp Epsilon", fxlrp_explanation("Epsilon")),
        Configuration("fxlrp EpsilonPlusFlat", fxlrp_explanation("EpsilonPlusFlat")),
        Configuration("fxlrp EpsilonGammaBox", fxlrp_explanation("EpsilonGammaBox")),
        Configuration("fxlrp LRP-0 (attribute)", fxlrp_lrp0_attributed),
        Configuration("fxlrp Epsilon (compiled)", fxlrp_compiled("Epsilon"), by_default=False),
        Configuration("zennit Epsilon", zennit_explanation("Epsilon")),
        Configuration("zennit EpsilonPlusFlat", zennit_explanation("EpsilonPlusFlat")),
        Configuration("zennit EpsilonGammaBox", zennit_explanation("EpsilonGammaBox")),
        Configuration("captum LRP", captum_lrp),
    )
}
FLOOR = "gradient x input"
