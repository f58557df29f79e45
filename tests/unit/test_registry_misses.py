"""Operations the model zoos call on relevance-carrying tensors that the registry lacked
(benchmarks/registry_misses.py, docs/coverage.md): ``torch.diff`` in every spelling, a one-operand
``einsum`` (PyG's dense_mincut_pool and DMoNPooling), and sparse adjacency built from
relevance-carrying values (PyG's ASAPooling).

References, none computed by fxlrp: gradient x input in float64 (LRP-0 on maps that are piecewise
linear in the explained input), the epsilon rule written out with the dense matrix of the linear
map, and the Product rule written out with dense matrices for a product of a sparse matrix and a
dense one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import Composite

LRP0 = Epsilon(0.0)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """``max |actual - expected| / max |expected|``."""
    return float((actual - expected).abs().max() / expected.abs().max())


def gradient_times_input(model: nn.Module, x: Tensor, target: int) -> Tensor:
    """``x * d model(x)[:, target].sum() / dx``, with the model's own autograd (float64)."""
    leaf = x.clone().requires_grad_()
    gradient, = torch.autograd.grad(model(leaf)[:, target].sum(), leaf)
    return leaf.detach() * gradient


def relevance_for(model: nn.Module, x: Tensor, output_relevance: Tensor, composite: object,
                  capture: str = "auto") -> Tensor:
    """The relevance fxlrp gives ``x`` for ``output_relevance`` at the model's output."""
    explain = fxlrp.convert(model, composite, capture=capture)
    leaf = x.clone().requires_grad_()
    explain(leaf).backward(output_relevance)
    return leaf.grad


# --------------------------------------------------------------------------------- torch.diff


class Differences(nn.Module):
    """``spelling(h)`` between a ReLU layer and a linear head; ``width`` is its output width."""

    def __init__(self, spelling: Callable[[Tensor], Tensor], width: int) -> None:
        super().__init__()
        self.spelling = spelling
        self.first = nn.Linear(6, 8)
        self.head = nn.Linear(width, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.first(x))
        return self.head(self.spelling(h).flatten(1))


def constant(*shape: int) -> Tensor:
    return torch.linspace(-1.0, 2.0, int(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape)


SPELLINGS: dict[str, tuple[Callable[[Tensor], Tensor], int]] = {
    "torch.diff": (lambda h: torch.diff(h), 7),
    "Tensor.diff": (lambda h: h.diff(), 7),
    "n=2 by keyword": (lambda h: torch.diff(h, n=2, dim=-1), 6),
    "n=3, dim=1 by position": (lambda h: h.diff(3, 1), 5),
    "constant prepend and append": (lambda h: torch.diff(h, prepend=constant(4, 2), append=constant(4, 1)), 10),
    "prepend that carries relevance": (lambda h: torch.diff(h, dim=1, prepend=h[:, -2:].flip(1) * 3.0), 9),
    "append that carries relevance, by position": (lambda h: h.diff(2, -1, None, torch.relu(h[:, :3] - 0.1)), 9),
    "over the batch, both carrying": (lambda h: torch.diff(h, dim=0, prepend=h[1:2], append=-h[:1]), 8),
}


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("spelling", SPELLINGS, ids=list(SPELLINGS))
def test_diff_under_lrp0_is_gradient_times_input(spelling: str, capture: str) -> None:
    """torch.diff is linear in its input and in prepend/append: with LRP-0 on a ReLU network the
    relevance is gradient x input, whichever spelling the model uses and whether prepend/append
    are constants (a bias) or carry relevance themselves."""
    function, width = SPELLINGS[spelling]
    torch.manual_seed(0)
    model = Differences(function, width).double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0, capture=capture)  # strict: diff has a rule
    relevance = fxlrp.attribute(explain, x, target=1)
    expected = gradient_times_input(model, x, 1)
    assert expected.abs().max() > 0
    assert relative_error(relevance, expected) < 1e-12
    if capture == "fx":
        assert "diff" in {row.operation for row in explain.report().rows}


def on_diff(rule: Epsilon) -> Composite:
    """A composite that gives ``diff`` ``rule`` (its own default is the z-rule, epsilon 0)."""
    return Composite(LRP0, operation_rules={"diff": rule})


def difference_matrix(length: int, n: int) -> Tensor:
    """The matrix ``D`` of ``n``-th differences of a vector of ``length``: ``diff(v, n) = D @ v``
    (written out from the definition ``v[1:] - v[:-1]``, applied ``n`` times)."""
    matrix = torch.eye(length, dtype=torch.float64)
    for _ in range(n):
        matrix = matrix[1:] - matrix[:-1]
    return matrix


def test_diff_under_epsilon_follows_the_dense_formula() -> None:
    """R_j = sum_k x_j D_kj / s(z_k) R_k with z = D [prepend, x, append] (s: zennit's stabiliser,
    z + eps (sign(z) + [z = 0])); the constant prepend/append act as a bias: their share is dropped."""
    epsilon = 0.25
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    prepend, append = constant(3, 2), -constant(3, 1)

    class Diff(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.diff(2, -1, prepend=prepend, append=append)

    output_relevance = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    relevance = relevance_for(Diff(), x, output_relevance, on_diff(Epsilon(epsilon)))
    matrix = difference_matrix(8, 2)  # [6, 8]: columns 0-1 prepend, 2-6 x, 7 append
    joined = torch.cat([prepend, x, append], dim=1)
    z = joined @ matrix.T
    stabilised = z + epsilon * (torch.sign(z) + (z == 0).double())
    expected = x * ((output_relevance / stabilised) @ matrix[:, 2:7])
    assert relative_error(relevance, expected) < 1e-12


def test_diff_under_epsilon_gives_a_carrying_prepend_its_share() -> None:
    """A prepend computed from the input is a second input of the same linear map: it receives
    x_j D_kj / s(z_k) R_k for its columns, which reach the input through the slice it was cut from."""
    epsilon = 0.1
    x = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))

    class Diff(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return torch.diff(x, prepend=x[:, -1:], dim=-1)

    output_relevance = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    relevance = relevance_for(Diff(), x, output_relevance, on_diff(Epsilon(epsilon)))
    matrix = difference_matrix(7, 1)  # column 0: the prepend, 1-6: x
    joined = torch.cat([x[:, -1:], x], dim=1)
    z = joined @ matrix.T
    stabilised = z + epsilon * (torch.sign(z) + (z == 0).double())
    shares = joined * ((output_relevance / stabilised) @ matrix)
    expected = shares[:, 1:].clone()
    expected[:, -1] += shares[:, 0]
    assert relative_error(relevance, expected) < 1e-12


# ------------------------------------------------------------------------ one-operand einsum


class Traces(nn.Module):
    """Row sums and the trace of a 3x3 matrix per sample, as one-operand einsums."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 9)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.first(x)).view(-1, 3, 3)
        return self.head(torch.einsum("bij->bi", h) + torch.einsum("bii->b", h)[:, None])


def test_one_operand_einsum_under_lrp0_is_gradient_times_input() -> None:
    """'bij->bi' and 'bii->b' are sums (over a diagonal): linear, no weight. In the relevance form
    (``explain(x).backward(R)``) as well as in the gradient form ``fxlrp.attribute`` uses."""
    torch.manual_seed(1)
    model = Traces().double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    expected = gradient_times_input(model, x, 1)
    for capture in ("fx", "eager"):
        relevance = fxlrp.attribute(fxlrp.convert(model, LRP0, capture=capture), x, target=1)
        assert relative_error(relevance, expected) < 1e-12
        output = model(x).detach()
        relevance = relevance_for(model, x, torch.zeros_like(output).index_fill_(1, torch.tensor([1]), 1.0) * output,
                                  LRP0, capture=capture)
        assert relative_error(relevance, expected) < 1e-12


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_one_operand_einsum_under_epsilon_follows_the_dense_formula(capture: str) -> None:
    """The trace ``z_b = sum_i X_bii`` under the epsilon rule (the layer rule einsum takes):
    R_X[b, i, j] = [i = j] X_bii / s(z_b) R_b. It failed before: the rule looked for a weight among
    the other operands, and there were none."""
    epsilon = 0.5
    x = torch.randn(3, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))

    class Trace(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return torch.einsum("bii->b", x)

    output_relevance = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    relevance = relevance_for(Trace(), x, output_relevance, Composite(Epsilon(epsilon)), capture=capture)
    z = x.diagonal(dim1=1, dim2=2).sum(dim=1)
    stabilised = z + epsilon * (torch.sign(z) + (z == 0).double())
    expected = torch.eye(4, dtype=torch.float64) * x * (output_relevance / stabilised)[:, None, None]
    assert relative_error(relevance, expected) < 1e-12
