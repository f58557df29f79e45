"""The seeds' printed relevance tables (seeds/000, 001 and the conv example of 002), reproduced
through ``fxlrp.convert`` on small modules written as a user would write them (float32, as the
seeds ran; the seeds print two decimals, so the tables are compared to 5e-3 and exact
fractions to float32 precision)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_scatter
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon


def relevance(model: nn.Module, inputs: list[Tensor], output_relevance, composite=None) -> list[Tensor]:
    explain = fxlrp.convert(model, composite)
    leaves = [value.clone().requires_grad_() for value in inputs]
    output = explain(*leaves)
    start = output_relevance(output) if callable(output_relevance) else output_relevance
    output.backward(start)
    return [leaf.grad for leaf in leaves]


def where_nonzero(output: Tensor) -> Tensor:
    """The seeds' ``rel_out = ones * (out != 0)``."""
    return (output != 0).to(output.dtype).detach()


def close(actual: Tensor, printed: list) -> bool:
    return torch.allclose(actual, torch.tensor(printed, dtype=actual.dtype), atol=5e-3, rtol=0)


class Add(nn.Module):
    def forward(self, a, b):
        return a + b


class Sum(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, a):
        return torch.sum(a, dim=self.dim)


class Scatter(nn.Module):
    def __init__(self, index: list[int], how: str, dim_size: int | None = None) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor(index))
        self.how = how
        self.dim_size = dim_size

    def forward(self, src):
        if self.how == "add":
            return torch_scatter.scatter_add(src, self.index, dim=0, dim_size=self.dim_size)
        if self.how == "mean":
            return torch_scatter.scatter_mean(src, self.index, dim=0, dim_size=self.dim_size)
        return torch_scatter.scatter_max(src, self.index, dim=0, dim_size=self.dim_size)[0]


def linear(weight: list, bias: list | None) -> nn.Linear:
    layer = nn.Linear(3, 2, bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight, dtype=torch.float))
        if bias is not None:
            layer.bias.copy_(torch.tensor(bias, dtype=torch.float))
    return layer


# ---- seed 000: hijacking autograd --------------------------------------------------------------

def test_seed000_add() -> None:
    a = torch.tensor([1.0, 2, 3, 1])
    b = torch.tensor([0.0, 1, 2, 4])
    rel_a, rel_b = relevance(Add(), [a, b], where_nonzero)
    assert torch.allclose(rel_a, torch.tensor([1, 2 / 3, 3 / 5, 1 / 5]))
    assert torch.allclose(rel_b, torch.tensor([0, 1 / 3, 2 / 5, 4 / 5]))


@pytest.mark.parametrize(("dim", "printed"), [
    (0, [[-0.20, 0.00, 1.50, 0.00], [1.20, -0.00, -0.50, -0.00]]),
    (1, [[0.14, 0.29, 0.43, 0.14], [0.60, 0.20, 0.10, 0.10]]),
])
def test_seed000_sum(dim: int, printed: list) -> None:
    a = torch.tensor([[1.0, 2, 3, 1], [-6, -2, -1, -1]])
    (rel,) = relevance(Sum(dim), [a], where_nonzero)
    assert close(rel, printed)


@pytest.mark.parametrize(("how", "values", "index", "scale", "printed"), [
    ("add", [1, 1, 1, 1, 2, 6, 1, 1, -2], [0, 0, 0, 0, 1, 1, 2, 2, 2], 1,
     [0.25, 0.25, 0.25, 0.25, 0.25, 0.75, 0, 0, 0]),
    ("mean", [1, 1, 1, 1, 2, 8, 1, 1, -2], [0, 0, 0, 0, 1, 1, 2, 2, 2], 1,
     [0.25, 0.25, 0.25, 0.25, 0.20, 0.80, 0, 0, 0]),
    ("max", [1, 1, 1, 1, 2, 8, 0, 0, 0], [0, 0, 0, 0, 1, 1, 3, 3, 3], 3,
     [0, 0, 0, 3, 0, 3, 0, 0, 0]),
])
def test_seed000_scatter(how: str, values: list, index: list, scale: float, printed: list) -> None:
    src = torch.tensor(values, dtype=torch.float)
    (rel,) = relevance(Scatter(index, how), [src], lambda out: scale * where_nonzero(out))
    if how == "max":
        # Four tied maxima in group 0: the seed's torch_scatter gave the last one the relevance,
        # torch_scatter 2.1 gives it to the first. Winner-take-all either way, as native.
        native = src.clone().requires_grad_()
        output = Scatter(index, how)(native)
        output.backward(scale * where_nonzero(output))
        assert torch.equal(rel, native.grad)
        assert rel[:4].sum() == 3 and (rel[:4] != 0).sum() == 1
        rel, printed = rel[4:], printed[4:]
    assert close(rel, printed)


@pytest.mark.parametrize("bias", [None, [0.0, 1.0], [0.0, 100.0]])
def test_seed000_linear_epsilon(bias: list | None) -> None:
    """The seed's LinearEpsilonRelevance (eps=1e-16, sign-following): zeros in input and weights,
    and the bias absorbing the relevance of the output it shifts."""
    layer = linear([[1, 2, -1], [0, 0, 1]], bias)
    (rel,) = relevance(nn.Sequential(layer), [torch.tensor([[4.0, 8, 0]])], where_nonzero, Epsilon(1e-16))
    assert close(rel, [[0.20, 0.80, 0.00]])


class SeedNetwork(nn.Module):
    """The seed's "putting things together": add, scatter_add, two linear maps, add."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor([0, 0, 1, 1, 2]))
        self.u = nn.Linear(3, 2, bias=False)
        self.v = nn.Linear(3, 2, bias=False)
        with torch.no_grad():
            self.u.weight.copy_(torch.tensor([[1.0, 0, 2], [0, 5, 1]]))
            self.v.weight.copy_(torch.tensor([[0.0, 1, -1], [-4, -2, -3]]))

    def forward(self, a, b):
        c = a + b
        d = torch_scatter.scatter_add(c, self.index, dim=1)
        return self.u(d) + self.v(d)


def test_seed000_network() -> None:
    a = torch.tensor([[1.0, 2, 3, 1, 0]])
    b = torch.tensor([[0.0, 1, 2, 4, 5]])
    rel_a, rel_b = relevance(SeedNetwork(), [a, b], where_nonzero, Epsilon(1e-16))
    assert close(rel_a, [[-0.95, -1.89, 2.41, 0.80, -0.00]])
    assert close(rel_b, [[-0.00, -0.95, 1.61, 3.21, -2.24]])
    assert abs(rel_a.sum().item() - 0.36842078) < 1e-5
    assert abs(rel_b.sum().item() - 1.6315787) < 1e-5


# ---- seed 001: index and scatter operations, step by step --------------------------------------

class IndexSelect(nn.Module):
    def forward(self, x):
        return torch.index_select(x, 0, torch.tensor([0, 2, 5, 5]))


def test_seed001_index_select() -> None:
    x = torch.tensor([0.7, 0.2, 0.0, 0.5, 0.3, 0.1])
    (rel,) = relevance(IndexSelect(), [x], torch.tensor([5.0, 0, 2, 1]))
    assert torch.equal(rel, torch.tensor([5.0, 0, 0, 0, 0, 3]))


class SumAll(nn.Module):
    def forward(self, x):
        return x.sum()


def test_seed001_sum_pooling() -> None:
    (rel,) = relevance(SumAll(), [torch.tensor([0.7, 0.2, 0.0, 0.5, 0.5, 0.1])], torch.tensor(10.0))
    assert close(rel, [3.5, 1.0, 0.0, 2.5, 2.5, 0.5]) and abs(rel.sum().item() - 10) < 1e-5


def test_seed001_sum_pooling_of_zero_loses_relevance() -> None:
    x = torch.tensor([0.7, 0.2, 0.1, -0.7, -0.3, 0.0], dtype=torch.float64)
    x[-1] = -x[:-1].sum()  # an exact zero total (the seed's float32 sum happened to be 0)
    (rel,) = relevance(SumAll(), [x], torch.tensor(10.0, dtype=torch.float64))
    assert torch.equal(rel, torch.zeros_like(x))


@pytest.mark.parametrize("how", ["add", "mean"])
@pytest.mark.parametrize("output_relevance", [[5.0, 3, 0, 1], [5.0, 3, 10, 1]], ids=["R9", "R19-lost10"])
def test_seed001_scatter_sums(how: str, output_relevance: list) -> None:
    x = torch.tensor([0.5, 0.2, 0.0, 0.5, 0.5, 0.1])
    (rel,) = relevance(Scatter([0, 0, 1, 1, 1, 3], how, dim_size=4), [x], torch.tensor(output_relevance))
    assert close(rel, [3.57, 1.43, 0.0, 1.5, 1.5, 1.0])
    assert abs(rel.sum().item() - 9.0) < 1e-5


@pytest.mark.parametrize("output_relevance", [[5.0, 3, 0, 1], [5.0, 3, 10, 1]], ids=["R9", "R19-lost10"])
def test_seed001_scatter_max(output_relevance: list) -> None:
    x = torch.tensor([0.5, 0.1, 0.0, 0.7, 0.3, 0.1])
    (rel,) = relevance(Scatter([0, 0, 1, 1, 1, 3], "max", dim_size=4), [x], torch.tensor(output_relevance))
    assert torch.equal(rel, torch.tensor([5.0, 0, 0, 3, 0, 1]))


# ---- seed 002: a z-rule Function around conv2d -------------------------------------------------
# The seed's LRP_ZRule_func divides by Z + [Z == 0] * float32_eps: the z-rule, stabilised only
# at exact zeros. No pre-activation of these examples is 0, so fxlrp's z-rule (Epsilon(0.0),
# which drops relevance at exact zeros instead) gives the same numbers: LRP-0 is the composite.

class Convolution(nn.Module):
    def __init__(self, skip: bool = False) -> None:
        super().__init__()
        self.skip = skip
        self.register_buffer("weight", torch.ones(1, 1, 3, 3))

    def forward(self, x):
        out = F.conv2d(x, self.weight, None, 1, 1)
        return out + x if self.skip else out


def test_seed002_conv_z_rule() -> None:
    x = torch.tensor([[-1.0, -1, 1, 1]] * 4).view(1, 1, 4, 4)
    (rel,) = relevance(Convolution(), [x], torch.ones(1, 1, 4, 4), Epsilon(0.0))
    edge, inner = [1.25, 0.4167, 0.4167, 1.25], [1.75, 0.5833, 0.5833, 1.75]
    assert close(rel[0, 0], [edge, inner, inner, edge])


def test_seed002_skip_connection_is_not_double_counted() -> None:
    """The seed shows a plain ``+`` after the z-rule conv giving 1 + 0.6944... per pixel (32 in
    total for 16 of output relevance); fxlrp's add splits by contribution and conserves it."""
    x = torch.ones(1, 1, 4, 4)
    (alone,) = relevance(Convolution(), [x], torch.ones(1, 1, 4, 4), Epsilon(0.0))
    corner, side, centre = 0.6944, 0.9722, 1.3611
    assert close(alone[0, 0], [[corner, side, side, corner], [side, centre, centre, side],
                               [side, centre, centre, side], [corner, side, side, corner]])
    (with_skip,) = relevance(Convolution(skip=True), [x], torch.ones(1, 1, 4, 4), Epsilon(0.0))
    assert abs(with_skip.sum().item() - 16.0) < 1e-4
    assert not close(with_skip[0, 0], (alone[0, 0] + 1).tolist())
