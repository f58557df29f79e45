"""The operation cases of ``tests/unit/test_operations.py`` (also ``test_operations_timm.py``): a
small model per spelling of an operation, built in float64 from a generator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class Op(nn.Module):
    """A model whose forward is ``spelling(self, *inputs)``, with the given parameters,
    buffers (indices) and submodules."""

    def __init__(self, spelling: Callable[..., Any], parameters=None, buffers=None, modules=None) -> None:
        super().__init__()
        self.spelling = spelling
        self.arity = spelling.__code__.co_argcount - 1
        for name, value in (parameters or {}).items():
            self.register_parameter(name, nn.Parameter(value))
        for name, value in (buffers or {}).items():
            self.register_buffer(name, value)
        for name, value in (modules or {}).items():
            self.add_module(name, value)

    # Fixed arguments: torch.fx cannot trace a forward(*inputs).
    def forward(self, x, y=None, z=None):
        return self.spelling(self, *(x, y, z)[: self.arity])


@dataclass
class Case:
    name: str
    spelling: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    kind: str
    weighted: bool = False
    parameters: dict[str, Callable[[torch.Generator], torch.Tensor]] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    modules: Callable[[], dict[str, nn.Module]] | None = None
    exact_forward: bool = True
    """False where the explainer computes the same map in another order (BatchNorm runs as its
    folded affine map ``x * scale + shift``: equal up to rounding)."""

    def build(self, generator: torch.Generator) -> tuple[nn.Module, list[torch.Tensor]]:
        parameters = {name: make(generator) for name, make in self.parameters.items()}
        modules = self.modules() if self.modules else {}
        model = Op(self.spelling, parameters, self.buffers, modules).double().eval()
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.normal_(0, 0.5, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
                module.weight.data.uniform_(0.5, 1.5, generator=generator)
                module.bias.data.normal_(0, 0.5, generator=generator)
        inputs = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in self.shapes]
        return model, inputs


def randn(*shape: int) -> Callable[[torch.Generator], torch.Tensor]:
    return lambda generator: torch.randn(shape, generator=generator, dtype=torch.float64)


def layer(factory: Callable[[], nn.Module]) -> Callable[[], dict[str, nn.Module]]:
    return lambda: {"layer": factory()}
