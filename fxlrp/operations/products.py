"""Products in which several factors may carry relevance: ``mul``, ``matmul`` (sparse factors
included), ``einsum``, ``torch._grouped_mm``.

With one relevance-carrying factor a product is a layer in that factor: an elementwise product
rescales it (relevance passes unchanged), a matrix product or einsum is a linear layer whose
weight is the constant factor (the composite's rule). With several, the call's rule is a
:class:`~fxlrp.rules.Product` rule (each entry names its ``factors``, and
:meth:`~fxlrp.rules.composites.Composite.resolve` gives such a call the Product rule): factors that are
constants by role (gates, and attention weights under CP-LRP) get nothing, the others share
uniformly.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import UnsupportedOperationError
from fxlrp.operations.helpers import (
    NATIVE_UNDER_NATIVE_RULE,
    NATIVE_WITH_ONE_CARRIER,
    bind,
    non_negative_where_arguments_are,
)
from fxlrp.operations.sparse import SparseEntries, entry_product, is_sparse
from fxlrp.registry import Affine, Operation, RoleFrom, Spelling, ValueFlow, register
from fxlrp.relevance import AffineLayer, apply_pass, apply_rule
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_form_active
from fxlrp.relevance.roles import role_of
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.straight_through import decomposed_in_backward
from fxlrp.rules import Product


def receivers(rule: Product, args: tuple[Any, ...], carrying: tuple[int, ...]) -> tuple[int, ...]:
    """Positions of the relevance-carrying factors (``carrying``) that are not constants by role
    (all of them if every one is)."""
    return receiving(rule, [role_of(value) for value in args], carrying)


def receiving(rule: Any, roles: Sequence[str | None], carrying: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`receivers` from the factors' roles (a rule without ``constants``, a layer rule where
    one factor carries relevance, holds none constant). Where every factor's role is held
    constant, the roles the rule lists last are released first: under CP-LRP (gates, attention
    weights, activations) a gate times ``tanh`` (an LSTM's ``i * g``, WaveNet's gated unit) holds
    the gate constant and the activation takes all, as the gate does against any other signal."""
    constants = tuple(getattr(rule, "constants", ()))
    while constants:
        chosen = tuple(position for position in carrying if roles[position] not in constants)
        if chosen:
            return chosen
        constants = constants[:-1]
    return carrying


def rule_of_product(call: RelevanceCall) -> Product:
    """The call's rule, which is a :class:`Product` rule wherever several factors carry relevance."""
    rule = call.rule
    if not isinstance(rule, Product):
        raise RuntimeError(
            f"fxlrp: {rule!r} was given to a product of several relevance-carrying tensors, which takes a "
            "Product rule; an operation that multiplies relevance-carrying tensors names its factors in its "
            "registry entry (Operation(factors=...)), so that the composite gives its calls a Product rule"
        )
    return rule


def multilinear(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """A product of several relevance-carrying factors under the call's :class:`Product` rule."""
    rule = rule_of_product(call)
    carrying = tuple(position for position, value in enumerate(args) if carries_relevance(value))
    chosen = receivers(rule, args, carrying)
    if len(chosen) < len(carrying):
        # Factors that are constants by role enter the rule as constants: detached, they get no share.
        args = tuple(
            value.detach() if position in carrying and position not in chosen else value
            for position, value in enumerate(args)
        )
    layer = AffineLayer(bind(function, kwargs), warn_lost_relevance=call.warn_lost_relevance)
    return apply_rule(layer, rule, rule.prepare(layer), *args)


def elementwise_product(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """``a * b``: rescaling by constants passes relevance unchanged; between relevance-carrying
    factors it is shared equally among the receivers of the :class:`Product` rule (each term of an
    elementwise product is the whole product, so the uniform epsilon rule is exactly ``R / N``).
    A product with a complex factor by its real form (:func:`complex_product`)."""
    if len(args) == 2 and (_is_complex(args[0]) or _is_complex(args[1])) and not kwargs:
        return complex_product(call, function, *args)
    if len(args) != 2 or not (carries_relevance(args[0]) and carries_relevance(args[1])):
        return apply_pass(bind(function, kwargs), None, *args, linear=True)
    return apply_pass(bind(function, kwargs), receivers(rule_of_product(call), args, (0, 1)), *args, linear=True)


def _is_complex(value: Any) -> bool:
    return isinstance(value, Tensor) and value.is_complex()


def complex_product(call: RelevanceCall, function: Callable[..., Tensor], a: Any, b: Any) -> Tensor:
    """``a * b`` with a complex factor (Llama 4's rotary embedding: ``view_as_complex(q) * e^(i
    theta)``), explained as its real form on the pairs of real numbers the complex ones are
    (:func:`torch.view_as_real`), ``(a_re b_re - a_im b_im, a_re b_im + a_im b_re)``: products and
    sums under their rules, as ``q cos + rotate_half(q) sin`` is in Llama. A complex product mixes
    the two parts of each number, which the rule of an elementwise product (relevance passes
    unchanged) would not see. The values are the model's own call's
    (:func:`~fxlrp.relevance.straight_through.decomposed_in_backward`). In the gradient form, with
    one relevance-carrying factor, the relevance function is the product's own call, as for a real
    product (``mul``'s entry: a recorded graph runs it so): autograd's gradient of a complex
    product is the transposed Jacobian of its real form, the z-rule's gradient form there."""
    if gradient_form_active() and not (carries_relevance(a) and carries_relevance(b)):
        return function(a, b)
    return decomposed_in_backward(function, partial(call.decompose, _complex_product_real_form), a, b)


def _complex_product_real_form(a: Any, b: Any) -> Tensor:
    def parts(value: Any) -> tuple[Any, Any]:
        if not _is_complex(value):
            return value, 0.0
        real, imaginary = torch.view_as_real(value).unbind(-1)
        return real, imaginary

    (a_real, a_imaginary), (b_real, b_imaginary) = parts(a), parts(b)
    return torch.complex(a_real * b_real - a_imaginary * b_imaginary, a_real * b_imaginary + a_imaginary * b_real)


def matrix_product(call: RelevanceCall, function: Any, left: Any, right: Any, *args: Any, **kwargs: Any) -> Tensor:
    """``left @ right``: a linear layer in the factor that carries relevance (the other one is its
    weight), or the :class:`Product` rule when both do; with a sparse factor, by its values
    (:func:`sparse_matrix_product`)."""
    if is_sparse(left) or is_sparse(right):
        return sparse_matrix_product(call, function, left, right, *args, **kwargs)
    left_carries, right_carries = carries_relevance(left), carries_relevance(right)
    if left_carries and right_carries:
        return multilinear(call, function, left, right, *args, **kwargs)
    if right_carries:
        def right_layer(x: Tensor, w: Tensor, b: Any) -> Tensor:
            return function(w, x, *args, **kwargs)
        return call.affine(call.layer(right_layer, left, None, has_parameters=True), right)

    def left_layer(x: Tensor, w: Tensor, b: Any) -> Tensor:
        return function(x, w, *args, **kwargs)
    return call.affine(call.layer(left_layer, right, None, has_parameters=True), left)


LINEAR_REDUCTIONS = (None, "sum", "mean")
"""``torch.sparse.mm(a, b, reduce)``: the reductions of the products along a row that keep it a
product (a mean is the sum over the row's stored entries divided by their number)."""


def sparse_matrix_product(call: RelevanceCall, function: Any, left: Any, right: Any, *args: Any,
                          **kwargs: Any) -> Tensor:
    r"""``left @ right`` (``matmul``, ``torch.mm``, ``torch.sparse.mm``) with a sparse factor: the
    same rules as for dense factors - a linear layer in the factor that carries relevance, whose
    weight is the other, or the :class:`Product` rule where both carry relevance (a sparse matrix
    built from relevance-carrying values, as ASAPooling's cluster assignment ``S``, times a
    relevance-carrying one) - on the stored entries: with ``z = S B``,

    .. math:: R_{S_{ik}} = \frac{1}{N} \sum_f \frac{S_{ik} B_{kf}}{s(z_{if})} R_{if}, \qquad
        R_{B_{kf}} = \frac{1}{N} \sum_i \frac{S_{ik} B_{kf}}{s(z_{if})} R_{if}

    for the stored entries ``S_ik`` (``N`` = 2 where both carry relevance; the layer rule, ``N`` =
    1, in the one that does; ``s`` the rule's stabiliser). A sparse result is explained on its
    stored values. The rule's terms come from :func:`~fxlrp.operations.sparse.entry_product` (dense
    gathers and sums over the stored entries), the values from the model's own call. A mean
    (``torch.sparse.mm(a, b, "mean")``, PyG's mean aggregation on a sparse adjacency) is the sum
    scaled per row; another reduction (``"max"``, ``"min"``, ``"prod"``) is not a product and is
    refused."""
    reduction = args[0] if args else kwargs.get("reduce")
    if reduction not in LINEAR_REDUCTIONS:
        raise UnsupportedOperationError(
            f"fxlrp has no LRP rule for torch.sparse.mm with reduce={reduction!r} on relevance-carrying tensors: only "
            "its sum and mean are products; write the reduction out (the products, then "
            "torch_geometric.utils.scatter(..., reduce=...), which fxlrp explains: sums and means proportionally, "
            "max and min winner-take-all)"
        )
    carrying = (carries_relevance(left), carries_relevance(right))
    if not any(carrying):
        return function(left, right, *args, **kwargs)
    name = f"{getattr(function, '__name__', 'matmul')} with a sparse factor"
    with torch.no_grad():
        exact = function(left, right, *args, **kwargs)  # the model's own values
        if exact.layout is torch.sparse_coo:
            exact = exact.coalesce()
    entries = [SparseEntries(factor, name) if is_sparse(factor) else None for factor in (left, right)]
    operands = [piece.values if piece is not None else factor
                for piece, factor in zip(entries, (left, right), strict=True)]
    result = SparseEntries(exact, name) if is_sparse(exact) else None
    exact_values = result.values if result is not None else exact

    def product(a: Tensor, b: Tensor, own: bool = True) -> Tensor:
        terms = entry_product(entries[0], a, entries[1], b, result, name, mean=reduction == "mean")
        # the model's own values (x + 0 is x), the gradient of the terms
        return exact_values + (terms - terms.detach()) if own else terms

    if all(carrying):
        output = multilinear(call, product, *operands)
    else:
        position = carrying.index(True)
        weight = operands[1 - position]

        def layer(x: Tensor, w: Tensor, b: Any) -> Tensor:
            # the layer's own weight gives the model's values; a rule's modified weight (z+) its own
            return product(x, w, w is weight) if position == 0 else product(w, x, w is weight)

        output = call.affine(call.layer(layer, weight, None, has_parameters=True), operands[position])
    return result.rebuild(output) if result is not None else output


def leading_pair(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Sequence[Any]:
    """The factors of ``a * b``, ``a @ b``, ``torch._grouped_mm(a, b, offs)``: the first two arguments."""
    return args[:2]


def listed(operands: Sequence[Any]) -> Sequence[Any]:
    """The operands of ``torch.einsum``, given one by one or as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        return tuple(operands[0])
    return operands


def einsum_operands(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Sequence[Any]:
    """The factors of ``torch.einsum(equation, *operands)``."""
    return listed(args[1:])


def einsum(call: RelevanceCall, function: Any, equation: str, *operands: Any, **kwargs: Any) -> Tensor:
    """``torch.einsum``: linear in each operand; the :class:`Product` rule when several carry
    relevance; when one does, a layer whose weight is the constant operand (several constant
    operands contracted into one weight), under the composite's rule - z+, gamma, flat act on
    that weight as on ``F.linear``'s."""
    operands = listed(operands)
    carrying = [position for position, value in enumerate(operands) if carries_relevance(value)]
    if len(carrying) >= 2:
        return multilinear(call, function, equation, *operands, **kwargs)
    if not carrying or call.runs_natively():
        return function(equation, *operands, **kwargs)
    [position] = carrying
    if len(operands) == 1:  # 'ijj->i', 'ijk->ij': a sum over (diagonals of) the operand, no weight
        return call.affine(call.layer(bind(function, kwargs)), equation, *operands)
    ranks = tuple(operand.dim() for operand in operands)
    inputs, weight_subscripts, output = _weight_equation(equation, ranks, position)
    constants = [operand for index, operand in enumerate(operands) if index != position]
    if len(constants) == 1:
        weight = constants[0]
    else:  # contracted once per parameter change, as rules transform weights
        weight = call.cached(("einsum weight", equation, position), constants, lambda: torch.einsum(
            ",".join(subscripts for index, subscripts in enumerate(inputs) if index != position)
            + "->" + weight_subscripts, *constants))
    joined = f"{inputs[position]},{weight_subscripts}->{output}"

    def layer_function(x: Tensor, w: Tensor, b: Any) -> Tensor:
        if w is weight:  # the layer's own output: the model's own call, for its exact values
            return function(equation, *operands[:position], x, *operands[position + 1:], **kwargs)
        return function(joined, x, w, **kwargs)

    return call.affine(call.layer(layer_function, weight, None, has_parameters=True), operands[position])


@functools.lru_cache(maxsize=256)  # parsed once per equation, ranks and input position, not per call
def _weight_equation(equation: str, ranks: tuple[int, ...], position: int) -> tuple[tuple[str, ...], str, str]:
    """The einsum's operand subscripts (``...`` written out), the subscripts of the one weight
    its constant operands (all but ``position``) contract to, and the output subscripts:
    the constants' indices that the input at ``position`` or the output also has, in order."""
    left, arrow, output = equation.replace(" ", "").partition("->")
    named = sorted(set(left.replace(",", "").replace(".", "")))
    spare = iter(letter for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if letter not in named)
    broadcast = "".join(next(spare) for _ in range(max(ranks)))  # letters for the ``...`` dimensions
    inputs = []
    for subscripts, rank in zip(left.split(","), ranks, strict=True):
        dots = rank - len(subscripts.replace("...", ""))
        inputs.append(subscripts.replace("...", broadcast[len(broadcast) - dots:] if dots else ""))
    if arrow:
        dots = max(len(subscripts) - len(original.replace("...", ""))
                   for subscripts, original in zip(inputs, left.split(","), strict=True))
        output = output.replace("...", broadcast[len(broadcast) - dots:] if dots else "")
    else:  # implicit: the ``...`` dimensions, then the indices that occur once, in alphabetical order
        counts = "".join(inputs)
        dots = [letter for letter in broadcast if letter in counts]
        output = "".join(dots) + "".join(sorted(letter for letter in set(counts)
                                                if counts.count(letter) == 1 and letter not in broadcast))
    kept = set(inputs[position]) | set(output)
    weight = "".join(dict.fromkeys(letter for index, subscripts in enumerate(inputs) if index != position
                                   for letter in subscripts if letter in kept))
    return tuple(inputs), weight, output


register(
    Operation(
        "mul",
        Spelling(
            functions=(operator.mul, torch.mul, torch.multiply),
            methods=("mul", "multiply", "__mul__", "__rmul__"),
        ),
        Affine(
            elementwise_product,
            default_rule=Product,
            factors=leading_pair,
            gradient_native=NATIVE_WITH_ONE_CARRIER,
        ),
        ValueFlow(non_negative=non_negative_where_arguments_are, role=RoleFrom.SHARED),
        description="product: a constant factor rescales (relevance passes to the other factor); "
        "relevance-carrying factors by the Product rule (gates get none by default)",
    )
)
register(
    Operation(
        "matmul",
        Spelling(
            functions=(torch.matmul, torch.mm, torch.bmm, operator.matmul, torch.sparse.mm,
                       *((torch._sparse_mm,) if hasattr(torch, "_sparse_mm") else ())),
            methods=("matmul", "mm", "bmm", "__matmul__"),
        ),
        Affine(matrix_product, factors=leading_pair, weighted=True, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        description="matrix product: a layer when one factor is constant; attention products by the Product rule",
    )
)
register(
    Operation(
        "einsum",
        Spelling(functions=(torch.einsum,)),
        Affine(einsum, factors=einsum_operands, weighted=True, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        description="einsum: a layer when one operand carries relevance; attention products by the Product rule",
    )
)
# torch._grouped_mm (torch >= 2.8): the rows of ``x`` between consecutive offsets times one matrix
# of ``w`` each, the experts of a mixture-of-experts layer in one kernel (transformers 5's default
# experts). A layer in the factor that carries relevance, run on the same kernel.
if hasattr(torch, "_grouped_mm"):
    register(
        Operation(
            "grouped_mm",
            Spelling(functions=(torch._grouped_mm,)),
            Affine(matrix_product, factors=leading_pair, weighted=True, gradient_native=NATIVE_UNDER_NATIVE_RULE),
            description="grouped matrix product (mixture-of-experts): a layer in the factor that carries relevance",
        )
    )
