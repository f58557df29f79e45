"""Operations the model zoos call on relevance-carrying tensors that the registry lacked
(benchmarks/registry_misses.py, docs/coverage.md): ``torch.diff`` in every spelling, a one-operand
``einsum`` (PyG's dense_mincut_pool and DMoNPooling), sparse matrices built from
relevance-carrying values and their products (PyG's ASAPooling), and ``torch.sparse.mm`` (PyG's
layers on a torch.sparse adjacency).

References, none computed by fxlrp: gradient x input in float64 (LRP-0 on maps that are piecewise
linear in the explained input), the epsilon rule written out with the dense matrix of the linear
map, the Product rule written out with dense matrices for products of a sparse matrix and a dense
or sparse one, and conservation where products of two relevance-carrying factors make gradient x
input another quantity.
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


# ------------------------------------------------------------------- sparse matrices (ASAPooling)

EDGES = torch.tensor([[0, 0, 1, 2, 3, 3, 1], [1, 2, 0, 3, 1, 2, 3]])  # 7 stored entries of a 4 x 4 matrix


def stabilised(z: Tensor, epsilon: float) -> Tensor:
    """zennit's stabiliser ``z + epsilon (sign(z) + [z = 0])``."""
    return z + epsilon * (torch.sign(z) + (z == 0).double())


def dense_of(values: Tensor, edges: Tensor = EDGES, size: int = 4) -> Tensor:
    """The dense matrix with ``values`` at ``edges`` (written out, no torch.sparse)."""
    matrix = torch.zeros(size, size, dtype=values.dtype)
    matrix[edges[0], edges[1]] = values
    return matrix


def product_shares(values: Tensor, other: Tensor, relevance: Tensor, epsilon: float, parts: int,
                   edges: Tensor = EDGES) -> tuple[Tensor, Tensor]:
    """The epsilon rule's shares of ``z = S @ B`` (S: ``values`` at ``edges``), each divided by
    ``parts`` (the Product rule's number of relevance-carrying factors): for stored entry e at
    (i, k), R_e = sum_f S_ik B_kf / s(z_if) R_if / parts and R_B[k, f] = sum_i S_ik B_kf / s(z_if)
    R_if / parts, summed over the entries by a loop."""
    z = dense_of(values, edges) @ other
    quotient = relevance / stabilised(z, epsilon)
    of_values = torch.zeros_like(values)
    of_other = torch.zeros_like(other)
    for entry in range(edges.size(1)):
        row, column = int(edges[0, entry]), int(edges[1, entry])
        terms = values[entry] * other[column] * quotient[row]
        of_values[entry] = terms.sum() / parts
        of_other[column] += terms / parts
    return of_values, of_other


SPARSE_PRODUCTS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "coo @ dense": lambda values, other: torch.sparse_coo_tensor(EDGES, values, (4, 4)) @ other,
    "csr @ dense": lambda values, other: torch.sparse_coo_tensor(EDGES, values, (4, 4)).to_sparse_csr() @ other,
    "torch.sparse.mm(coo, dense)": lambda values, other: torch.sparse.mm(torch.sparse_coo_tensor(EDGES, values, (4, 4)),
                                                                          other),
    "torch.sparse.mm(csr, dense, 'sum')": lambda values, other: torch.sparse.mm(
        torch.sparse_csr_tensor(*csr_pattern(), values[csr_order()], (4, 4)), other, "sum"),
    "coo to_dense() @ dense": lambda values, other: torch.sparse_coo_tensor(EDGES, values, (4, 4)).to_dense() @ other,
    "(dense.T @ coo.t()).T": lambda values, other: (other.T @ torch.sparse_coo_tensor(EDGES, values, (4, 4)).t()).T,
    "csr @ (csr of dense).to_dense()": lambda values, other: (
        torch.sparse_coo_tensor(EDGES, values, (4, 4)).to_sparse_csr() @ other.to_sparse_csr()).to_dense(),
}


def csr_order() -> Tensor:
    """The stored entries of EDGES in row-major order (CSR's)."""
    return torch.argsort(EDGES[0] * 4 + EDGES[1])


def csr_pattern() -> tuple[Tensor, Tensor]:
    ordered = EDGES[:, csr_order()]
    rows = torch.zeros(5, dtype=torch.long)
    rows[1:] = torch.cumsum(torch.bincount(ordered[0], minlength=4), 0)
    return rows, ordered[1]


class SparseProduct(nn.Module):
    def __init__(self, spelling: Callable[[Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.spelling = spelling

    def forward(self, values: Tensor, other: Tensor) -> Tensor:
        return self.spelling(values, other)


def explained_pair(model: nn.Module, values: Tensor, other: Tensor, output_relevance: Tensor, composite: object,
                   capture: str, carrying: tuple[bool, bool]) -> tuple[Tensor | None, Tensor | None]:
    explain = fxlrp.convert(model, composite, capture=capture)
    leaves = [value.clone().requires_grad_(flag) for value, flag in zip((values, other), carrying, strict=True)]
    output = explain(*leaves)
    torch.testing.assert_close(output, model(values, other), rtol=0, atol=0)  # the model's own values
    output.backward(output_relevance)
    return leaves[0].grad, leaves[1].grad


@pytest.mark.parametrize("spelling", SPARSE_PRODUCTS, ids=list(SPARSE_PRODUCTS))
def test_a_sparse_matrix_of_relevance_carrying_values_times_a_carrying_one_is_a_product(spelling: str) -> None:
    """S (built from relevance-carrying values) @ B (carrying): the Product rule, each factor half
    of the epsilon rule's share, as for dense factors; it was refused (torch.sparse_coo_tensor,
    to_sparse_csr had no rule) or failed in the rule's backward (a sparse CSR gradient). (torch.fx
    cannot trace a sparse constructor given a traced value: the default capture runs the model
    eagerly.)"""
    epsilon = 0.2
    generator = torch.Generator().manual_seed(11)
    values = torch.randn(7, dtype=torch.float64, generator=generator)
    other = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    output_relevance = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    model = SparseProduct(SPARSE_PRODUCTS[spelling])
    found_values, found_other = explained_pair(model, values, other, output_relevance, Composite(Epsilon(epsilon)),
                                               "auto", (True, True))
    expected_values, expected_other = product_shares(values, other, output_relevance, epsilon, parts=2)
    assert relative_error(found_values, expected_values) < 1e-12
    assert relative_error(found_other, expected_other) < 1e-12


@pytest.mark.parametrize("carrying", [(False, True), (True, False)], ids=["dense carries", "sparse carries"])
def test_a_sparse_product_with_one_carrying_factor_is_a_layer(carrying: tuple[bool, bool]) -> None:
    """With one relevance-carrying factor the product is a linear layer whose weight is the other
    factor: the epsilon rule with the whole share (and, under LRP-0, gradient x input)."""
    epsilon = 0.3
    generator = torch.Generator().manual_seed(12)
    values = torch.randn(7, dtype=torch.float64, generator=generator)
    other = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    output_relevance = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    model = SparseProduct(SPARSE_PRODUCTS["csr @ dense"])
    found = explained_pair(model, values, other, output_relevance, Composite(Epsilon(epsilon)), "auto", carrying)
    expected = product_shares(values, other, output_relevance, epsilon, parts=1)
    position = carrying.index(True)
    assert found[1 - position] is None
    assert relative_error(found[position], expected[position]) < 1e-12


def test_a_sparse_times_sparse_product_gives_each_factor_half() -> None:
    """ASAPooling's coarsening ``S.t().to_sparse_csr() @ (A @ S)`` on CSR matrices: sparse results,
    explained on their stored values; against the same shares written out with dense matrices."""
    epsilon = 0.1
    generator = torch.Generator().manual_seed(13)
    values = torch.rand(7, dtype=torch.float64, generator=generator) + 0.5
    weights = torch.rand(7, dtype=torch.float64, generator=generator) + 0.5

    class Coarsened(nn.Module):
        def forward(self, values: Tensor, weights: Tensor) -> Tensor:
            assignment = torch.sparse_coo_tensor(EDGES, values, (4, 4)).to_sparse_csr()
            adjacency = torch.sparse_coo_tensor(EDGES, weights, (4, 4)).to_sparse_csr()
            return (assignment.t().to_sparse_csr() @ (adjacency @ assignment)).to_dense()

    output_relevance = torch.randn(4, 4, dtype=torch.float64, generator=generator)
    model = Coarsened()
    explain = fxlrp.convert(model, Composite(Epsilon(epsilon)), capture="eager")
    leaf = values.clone().requires_grad_()
    output = explain(leaf, weights)
    torch.testing.assert_close(output, model(values, weights), rtol=0, atol=0)
    output.backward(output_relevance)
    # outer product S^T @ M with M = A @ S: two carrying factors, each half; then M = A @ S, a
    # layer in S (A is constant) that passes M's share on whole.
    dense = dense_of(values)
    inner = dense_of(weights) @ dense
    z = dense.T @ inner
    quotient = output_relevance / stabilised(z, epsilon)
    share_of_transposed = dense.T * (quotient @ inner.T) / 2  # R of S^T's entries
    share_of_inner = inner * (dense @ quotient) / 2
    inner_quotient = share_of_inner / stabilised(inner, epsilon)
    share_of_right = dense * (dense_of(weights).T @ inner_quotient)
    expected = share_of_transposed.T[EDGES[0], EDGES[1]] + share_of_right[EDGES[0], EDGES[1]]
    assert relative_error(leaf.grad, expected) < 1e-12


def test_repeated_indices_of_relevance_carrying_values_are_refused() -> None:
    """A COO tensor that repeats an index sums its values there when used: relevance would reach
    each summand whole, so fxlrp names the call and what to do."""
    repeated = torch.tensor([[0, 0, 1], [1, 1, 0]])

    class Repeats(nn.Module):
        def forward(self, values: Tensor, other: Tensor) -> Tensor:
            return torch.sparse_coo_tensor(repeated, values, (2, 2)) @ other

    explain = fxlrp.convert(Repeats(), LRP0, capture="eager")
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"sparse_coo_tensor on a sparse COO tensor whose "
                       r"relevance-carrying values repeat an index.*torch_geometric.utils.coalesce"):
        explain(torch.ones(3, dtype=torch.float64, requires_grad=True), torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"torch.sparse.mm with reduce='max'"):
        fxlrp.convert(SparseProduct(lambda values, other: torch.sparse.mm(
            torch.sparse_coo_tensor(EDGES, values, (4, 4)).to_sparse_csr(), other, "max")), LRP0, capture="eager")(
            torch.ones(7, dtype=torch.float64, requires_grad=True), torch.ones(4, 2, dtype=torch.float64))


class Pooled(nn.Module):
    """A GCN layer, ASAPooling, a GCN layer on the coarsened graph (with its coarsened edge
    weights where ``weighted``), a global sum and a linear head."""

    def __init__(self, weighted: bool) -> None:
        super().__init__()
        from torch_geometric.nn import ASAPooling, GCNConv

        self.before, self.pool, self.after = GCNConv(5, 8), ASAPooling(8, ratio=0.5), GCNConv(8, 8)
        self.head = nn.Linear(8, 3)
        self.weighted = weighted

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        from torch_geometric.nn import global_add_pool

        h = torch.relu(self.before(x, edge_index))
        weights = torch.ones(edge_index.size(1), dtype=x.dtype) if self.weighted else None
        h, edge_index, weights, batch, _ = self.pool(h, edge_index, edge_weight=weights, batch=batch)
        h = torch.relu(self.after(h, edge_index, weights))
        return self.head(global_add_pool(h, batch))


def two_graphs() -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(21)
    x = torch.randn(13, 5, dtype=torch.float64, generator=generator)
    pairs = torch.cat([torch.randint(0, 7, (2, 12), generator=generator),
                       torch.randint(7, 13, (2, 10), generator=generator)], dim=1)
    pairs = pairs[:, pairs[0] != pairs[1]]
    edge_index = torch.unique(torch.cat([pairs, pairs.flip(0)], dim=1), dim=1)
    return x, edge_index, torch.tensor([0] * 7 + [1] * 6)


@pytest.fixture
def float64_default():
    """ASAPooling makes its unit edge weights with the default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def test_asapooling_under_cp_lrp0_is_gradient_times_input_with_scores_held(float64_default: None,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """ASAPooling builds its cluster assignment as a torch.sparse_coo_tensor of relevance-carrying
    attention scores (it was refused: sparse_coo_tensor, to_sparse_csr and values had no rule).
    Under CP-LRP with epsilon 0 the attention scores (a softmax over edges) and the fitness gate
    (a sigmoid) are constants of the products they enter, and the rest of the network (GCN layers,
    ReLU, sums, the selection of the top clusters) is piecewise linear: the relevance is gradient x
    input of the network with those two detached."""
    import torch_geometric.nn.pool.asap as asap

    torch.manual_seed(3)
    model = Pooled(weighted=False).eval()
    x, edge_index, batch = two_graphs()
    explain = fxlrp.convert(model, fxlrp.composites.CPLRP(0.0))  # strict
    output = explain(x, edge_index, batch)
    torch.testing.assert_close(output, model(x, edge_index, batch), rtol=0, atol=0)
    relevance = fxlrp.attribute(explain, [x, edge_index, batch], target=1)[0]

    softmax, sigmoid = asap.softmax, torch.Tensor.sigmoid
    monkeypatch.setattr(asap, "softmax", lambda *args, **kwargs: softmax(*args, **kwargs).detach())
    monkeypatch.setattr(torch.Tensor, "sigmoid", lambda self: sigmoid(self).detach())
    leaf = x.clone().requires_grad_()
    gradient, = torch.autograd.grad(model(leaf, edge_index, batch)[:, 1].sum(), leaf)
    expected = x * gradient
    assert expected.abs().max() > 0
    assert relative_error(relevance, expected) < 1e-12


@pytest.mark.parametrize("weighted", [False, True], ids=["edge weights discarded", "coarsened edge weights used"])
def test_asapooling_is_explained_strictly(float64_default: None, weighted: bool) -> None:
    """Under LRP-0 and the default composite the attention scores carry relevance into the sparse
    assignment (refused before: sparse_coo_tensor, to_sparse_csr, values). Given edge weights,
    the coarsened adjacency S^T A S (sparse CSR products of relevance-carrying factors) gives
    relevance-carrying edge weights to the next layer. Strict conversion, the model's outputs,
    finite relevance (torch's own backward cannot pass index_select of a sparse COO tensor: with
    edge weights the model has no gradient x input)."""
    torch.manual_seed(4)
    model = Pooled(weighted=weighted).eval()
    x, edge_index, batch = two_graphs()
    if weighted:
        leaf = x.clone().requires_grad_()
        with pytest.raises(NotImplementedError):
            torch.autograd.grad(model(leaf, edge_index, batch)[:, 0].sum(), leaf)
    for composite in (LRP0, fxlrp.composites.CPLRP(0.0), None):
        explain = fxlrp.convert(model, composite)
        output = explain(x, edge_index, batch)
        torch.testing.assert_close(output, model(x, edge_index, batch), rtol=0, atol=0)
        relevance = fxlrp.attribute(explain, [x, edge_index, batch], target=0)[0]
        assert torch.isfinite(relevance).all() and relevance.abs().sum() > 0
        leaf = x.clone().requires_grad_()
        explain(leaf, edge_index, batch).backward(torch.eye(3, dtype=torch.float64)[[0, 0]] * output.detach())
        assert torch.isfinite(leaf.grad).all()


def test_asapoolings_sparse_coarsening_conserves_relevance() -> None:
    """ASAPooling's graph coarsening as PyG writes it (to_torch_coo_tensor, index_select of the
    kept clusters, to_sparse_csr, S^T (A S), to_edge_index), on assignments computed from the input
    by a bias-free layer: every rule on the way conserves relevance under LRP-0 (the products give
    each factor half, the layer A S passes its share whole), so the input's relevance sums to the
    output; the products of two relevance-carrying factors make it differ from gradient x input."""
    from torch_geometric.utils import to_edge_index, to_torch_coo_tensor, to_torch_csr_tensor

    x, edge_index, _ = two_graphs()
    kept = torch.tensor([0, 2, 3, 5, 8, 11])

    class Coarsening(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.score = nn.Linear(5, 4, bias=False)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            scores = torch.relu(self.score(x))[edge_index[0]].sum(dim=-1)
            nodes = x.size(0)
            adjacency = to_torch_csr_tensor(edge_index, torch.ones(edge_index.size(1), dtype=x.dtype),
                                            size=(nodes, nodes))
            assignment = to_torch_coo_tensor(edge_index, scores, size=(nodes, nodes))
            assignment = assignment.index_select(1, kept).to_sparse_csr()
            coarse = assignment.t().to_sparse_csr() @ (adjacency @ assignment)
            _, weights = to_edge_index(coarse)
            return weights.sum().view(1, 1)

    torch.manual_seed(5)
    model = Coarsening().double().eval()
    explain = fxlrp.convert(model, LRP0)
    relevance = fxlrp.attribute(explain, [x, edge_index], target=0)[0]
    total = model(x, edge_index).item()
    assert total > 0
    assert abs(relevance.sum().item() - total) < 1e-12 * total
    output = explain(x.clone().requires_grad_(), edge_index)
    torch.testing.assert_close(output, model(x, edge_index), rtol=0, atol=0)


class OnSparseAdjacency(nn.Module):
    """Two message-passing layers given the graph as a torch.sparse CSR adjacency (``adj_t``, made
    from ``edge_index``), a global sum and a linear head: message passing is
    ``torch.sparse.mm(adj_t, x, reduce)``."""

    def __init__(self, make: Callable[[int, int], nn.Module]) -> None:
        super().__init__()
        self.first, self.second, self.head = make(5, 8), make(8, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        from torch_geometric.utils import to_torch_csr_tensor

        adjacency = to_torch_csr_tensor(edge_index.flip(0), torch.ones(edge_index.size(1), dtype=x.dtype),
                                        size=(x.size(0), x.size(0)))
        h = torch.relu(self.first(x, adjacency))
        return self.head(torch.relu(self.second(h, adjacency)).sum(dim=0, keepdim=True))


def sparse_adjacency_layers() -> dict[str, Callable[[int, int], nn.Module]]:
    from torch_geometric.nn import GCNConv, GINConv, GraphConv, SAGEConv

    return {
        "GCNConv": lambda a, b: GCNConv(a, b),
        "GINConv": lambda a, b: GINConv(nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b))),
        "SAGEConv (mean)": lambda a, b: SAGEConv(a, b, aggr="mean"),
        "GraphConv (add)": lambda a, b: GraphConv(a, b),
    }


@pytest.mark.parametrize("layer", ["GCNConv", "GINConv", "SAGEConv (mean)", "GraphConv (add)"])
def test_layers_on_a_sparse_adjacency_under_lrp0_are_gradient_times_input(layer: str) -> None:
    """PyG layers given a torch.sparse adjacency aggregate by torch.sparse.mm (with reduce='mean'
    for SAGEConv's mean), which had no rule: a layer in the features, whose weight is the
    adjacency; piecewise linear, so LRP-0 is gradient x input."""
    x, edge_index, _ = two_graphs()
    torch.manual_seed(6)
    model = OnSparseAdjacency(sparse_adjacency_layers()[layer]).double().eval()
    explain = fxlrp.convert(model, LRP0)
    torch.testing.assert_close(explain(x, edge_index), model(x, edge_index), rtol=0, atol=0)
    relevance = fxlrp.attribute(explain, [x, edge_index], target=2)[0]
    leaf = x.clone().requires_grad_()
    gradient, = torch.autograd.grad(model(leaf, edge_index)[:, 2].sum(), leaf)
    assert (x * gradient).abs().max() > 0
    assert relative_error(relevance, x * gradient) < 1e-12


def test_a_row_mean_of_a_sparse_product_follows_the_dense_formula() -> None:
    """torch.sparse.mm(S, B, 'mean'): the sum over row i's stored entries divided by their number
    c_i, a layer in B with weight S_ik / c_i: R_B[k, f] = sum_i (S_ik / c_i) B_kf / s(z_if) R_if."""
    epsilon = 0.25
    generator = torch.Generator().manual_seed(14)
    values = torch.randn(7, dtype=torch.float64, generator=generator)
    other = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    output_relevance = torch.randn(4, 3, dtype=torch.float64, generator=generator)
    model = SparseProduct(lambda values, other: torch.sparse.mm(
        torch.sparse_csr_tensor(*csr_pattern(), values[csr_order()], (4, 4)), other, "mean"))
    _, found = explained_pair(model, values, other, output_relevance, Composite(Epsilon(epsilon)), "auto",
                              (False, True))
    counts = torch.bincount(EDGES[0], minlength=4).double()
    weight = dense_of(values) / counts[:, None]
    quotient = output_relevance / stabilised(weight @ other, epsilon)
    expected = other * (weight.T @ quotient)
    assert relative_error(found, expected) < 1e-12
