"""Sparse tensors (``torch.sparse``) built from relevance-carrying values, and their layouts.

A sparse matrix is its values placed at its indices: building one (``torch.sparse_coo_tensor``,
``torch.sparse_csr_tensor``, ...), changing its layout (``to_sparse_csr``, ``to_sparse_coo``,
``to_dense``, ``coalesce``) and reading its values back (``values()``) move values without
computing anything, and their native backward moves relevance with them, as views do. That holds
while every position holds one value: a COO tensor may list a position several times, and its
values there are summed where it is used (``coalesce``, ``to_dense``, a product), a sum whose
backward would give each summand the whole sum's relevance. Those calls are refused, naming what
to do. Products with sparse factors are ``matmul``'s (:mod:`fxlrp.operations.products`): a sparse
matrix built from relevance-carrying values times a dense or sparse one that carries relevance is
a product of two relevance-carrying factors, under the Product rule, as ``a @ b`` of dense ones,
computed for the rule on the stored entries (:class:`SparseEntries`, :func:`entry_product`).
``index_select`` of a sparse COO tensor, which torch cannot differentiate, picks the values it
keeps (:func:`selected`, the ``view`` entry's relevance function).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import UnsupportedOperationError
from fxlrp.registry import Operation, RoleFrom, Routed, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.roles import give_role, role_of
from fxlrp.relevance.rule_function import carries_relevance


def _repeats_positions(tensor: Tensor) -> bool:
    """Whether a sparse COO tensor lists a position more than once (its values there are summed
    where it is used)."""
    if tensor.layout is not torch.sparse_coo or tensor.is_coalesced():
        return False
    indices = tensor._indices()
    return indices.size(1) > 0 and torch.unique(indices, dim=1).size(1) < indices.size(1)


def _refuse_repeats(name: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"fxlrp has no LRP rule for {name} on a sparse COO tensor whose relevance-carrying values repeat an index: "
        "the values at a repeated index are summed where the tensor is used, and relevance would reach each of "
        "them whole. Sum them first (torch_geometric.utils.coalesce(edge_index, values), a scatter sum that fxlrp "
        "explains by the z-rule, or values.index_add over the unique indices) and build the tensor from unique "
        "indices"
    )


def _values_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The values argument of a sparse constructor: the last positional argument before ``size``
    (``sparse_coo_tensor(indices, values, size)``, ``sparse_csr_tensor(crow, col, values, size)``)
    or ``values=``."""
    if "values" in kwargs:
        return kwargs["values"]
    tensors = [value for value in args if isinstance(value, Tensor)]
    return tensors[-1] if tensors else None


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a sparse tensor (COO, CSR, CSC, BSR, BSC)."""
    return isinstance(value, Tensor) and value.layout is not torch.strided


class SparseEntries:
    """A sparse matrix as its stored entries: row and column indices (constants) and values (a
    dense vector, relevance-carrying where the matrix is), and how to build the matrix again from
    other values at the same positions. The rule machinery works on dense tensors, and torch's
    own backward of a product of two sparse CSR matrices is not always right (it gave other
    gradients than the same product of dense matrices in torch 2.14), so products with sparse
    factors are explained through :func:`entry_product`, written with dense gathers and sums."""

    def __init__(self, matrix: Tensor, name: str) -> None:
        layout = matrix.layout
        if matrix.dim() != 2 or layout not in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
            raise UnsupportedOperationError(
                f"fxlrp has no LRP rule for {name} on a sparse tensor of layout {layout} with {matrix.dim()} "
                "dimensions: it explains products of sparse COO, CSR and CSC matrices (2 dimensions); convert it with "
                "to_sparse_coo() or to_sparse_csr(), or multiply its dense form (to_dense())"
            )
        self.shape = matrix.shape
        if layout is torch.sparse_coo:
            if carries_relevance(matrix) and _repeats_positions(matrix):
                raise _refuse_repeats(name)
            matrix = matrix.coalesce()  # (positions sorted: a move)
            indices = matrix.indices()
            self.rows, self.columns = indices[0], indices[1]
            self.rebuild: Callable[[Tensor], Tensor] = lambda values: torch.sparse_coo_tensor(
                indices, values, self.shape, is_coalesced=True)
        elif layout is torch.sparse_csr:
            compressed, columns = matrix.crow_indices(), matrix.col_indices()
            self.rows = torch.repeat_interleave(torch.arange(self.shape[0], device=columns.device), compressed.diff())
            self.columns = columns
            self.rebuild = lambda values: torch.sparse_csr_tensor(compressed, columns, values, self.shape)
        else:
            compressed, rows = matrix.ccol_indices(), matrix.row_indices()
            self.rows = rows
            self.columns = torch.repeat_interleave(torch.arange(self.shape[1], device=rows.device), compressed.diff())
            self.rebuild = lambda values: torch.sparse_csc_tensor(compressed, rows, values, self.shape)
        self.values = give_role(matrix.values(), role_of(matrix))

    def positions(self, rows: Tensor, columns: Tensor, name: str) -> Tensor:
        """Where the entries at (``rows``, ``columns``) are stored in this matrix."""
        keys = self.rows * self.shape[1] + self.columns
        order = torch.argsort(keys)
        wanted = rows * self.shape[1] + columns
        found = torch.searchsorted(keys[order], wanted).clamp(max=max(keys.numel() - 1, 0))
        if keys.numel() == 0 or not bool((keys[order][found] == wanted).all()):
            raise UnsupportedOperationError(
                f"fxlrp: {name} stores fewer entries than its factors produce (torch left out some products), which "
                "fxlrp's rule for sparse products cannot place: multiply the matrices' dense forms (to_dense())"
            )
        return order[found]


def entry_product(left: SparseEntries | None, left_values: Tensor, right: SparseEntries | None,
                  right_values: Tensor, result: SparseEntries | None, name: str, mean: bool = False) -> Tensor:
    """``left @ right`` from the sparse factors' entries (``*_values`` their values, or the dense
    factor itself where the entries are None), with dense gathers and ``index_add``: a dense
    result, or the values of the sparse ``result`` at its stored positions.

    Every product ``l_ik r_kj`` of a stored entry with a stored (or dense) entry is added into
    ``(i, j)``, so the gradient of each factor's entry is the sum over the products it enters, as
    autograd gives it for dense matrices. ``mean`` (``torch.sparse.mm(left, right, "mean")``, left
    sparse, right dense): each row divided by its number of stored entries (at least 1)."""
    if left is not None and right is None:  # sparse @ dense: out[i] += l_e * R[k_e]
        dense = right_values.unsqueeze(-1) if right_values.dim() == 1 else right_values
        terms = left_values.unsqueeze(-1) * dense[left.columns]
        output = terms.new_zeros(left.shape[0], dense.shape[1]).index_add(0, left.rows, terms)
        if mean:
            counts = torch.bincount(left.rows, minlength=left.shape[0]).clamp(min=1)
            output = output / counts.unsqueeze(-1).to(output.dtype)
        return output.squeeze(-1) if right_values.dim() == 1 else output
    if mean:
        raise UnsupportedOperationError(
            f"fxlrp has no LRP rule for {name} with reduce='mean' unless the first factor is sparse and the second "
            "dense; write it as the sum divided by the counts"
        )
    if left is None and right is not None:  # dense @ sparse: out[:, j] += L[:, k_g] * r_g
        terms = left_values[..., right.rows] * right_values
        return terms.new_zeros(*left_values.shape[:-1], right.shape[1]).index_add(-1, right.columns, terms)
    assert left is not None and right is not None
    # sparse @ sparse: the pairs of entries (e, g) with l's column = r's row
    order = torch.argsort(right.rows, stable=True)
    counts = torch.bincount(right.rows, minlength=right.shape[0])
    starts = torch.cumsum(counts, 0) - counts
    per_entry = counts[left.columns]
    first = torch.repeat_interleave(torch.arange(left.columns.numel(), device=counts.device), per_entry)
    offsets = torch.arange(int(per_entry.sum()), device=counts.device) - torch.repeat_interleave(
        torch.cumsum(per_entry, 0) - per_entry, per_entry)
    second = order[starts[left.columns][first] + offsets]
    terms = left_values[first] * right_values[second]
    rows, columns = left.rows[first], right.columns[second]
    if result is None:
        return terms.new_zeros(left.shape[0], right.shape[1]).index_put((rows, columns), terms, accumulate=True)
    return terms.new_zeros(result.values.numel()).index_add(0, result.positions(rows, columns, name), terms)


def sparse_built(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """A sparse tensor built from values at indices: relevance moves with the values (the native
    backward), refused where a COO tensor repeats an index (its values there would be summed)."""
    result = function(*args, **kwargs)
    if isinstance(result, Tensor) and carries_relevance(result) and _repeats_positions(result):
        raise _refuse_repeats(f"{getattr(function, '__name__', 'a sparse constructor')}")
    return result


def sparse_moved(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A change of layout or a read of the values: relevance moves with the values, refused where
    a COO tensor repeats an index."""
    source = args[0] if args else None
    if isinstance(source, Tensor) and source.is_sparse and carries_relevance(source) and _repeats_positions(source):
        raise _refuse_repeats(f"Tensor.{getattr(function, '__name__', 'method')}")
    return function(*args, **kwargs)


def selected(call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Views, copies, indexing (the ``view`` entry): their native call, whose backward routes
    relevance. ``index_select`` of a sparse COO tensor whose values carry relevance (ASAPooling's
    ``S.index_select(1, perm)``) has no native backward: the values it keeps are picked from the
    input's values (found by running it on their positions), which routes relevance as a dense
    selection does; the result is the same matrix, coalesced."""
    source = args[0] if args else None
    if type(source) is not Tensor or source.layout is not torch.sparse_coo or not carries_relevance(source) \
            or getattr(function, "__name__", "") != "index_select":
        return function(*args, **kwargs)
    matrix = SparseEntries(source, "Tensor.index_select")
    with torch.no_grad():
        positions = matrix.rebuild(torch.arange(matrix.values.numel(), dtype=torch.float64, device=source.device))
        picked = function(positions, *args[1:], **kwargs).coalesce()
    chosen = picked.values().round().long()
    return torch.sparse_coo_tensor(picked.indices(), matrix.values[chosen], picked.shape, is_coalesced=True)


def _values_role(result: Any, *args: Any, **kwargs: Any) -> str | None:
    """A sparse tensor built from attention weights (ASAPooling's cluster assignment) holds them."""
    values = _values_of(args, kwargs)
    return role_of(values) if values is not None else None


register(
    Operation(
        "sparse_tensor",
        Spelling(
            functions=(torch.sparse_coo_tensor, torch.sparse_csr_tensor, torch.sparse_csc_tensor,
                       torch.sparse_compressed_tensor),
        ),
        Routed(sparse_built),
        ValueFlow(role=_values_role),
        description="a sparse tensor built from values at indices: relevance moves with the values (refused where "
        "a COO tensor repeats an index)",
    )
)
register(
    Operation(
        "sparse_layout",
        Spelling(
            methods=("to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "to_dense", "coalesce", "values"),
        ),
        Routed(sparse_moved),
        ValueFlow(role=RoleFrom.FIRST_ARGUMENT),
        description="sparse layouts, to_dense, coalesce, values(): relevance moves with the values (refused where a "
        "COO tensor repeats an index)",
    )
)
