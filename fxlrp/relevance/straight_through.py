"""Exact values from the original kernel, relevance from an equivalent decomposition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fxlrp.relevance.form import gradient_form, gradient_form_active
from fxlrp.relevance.rule_function import carries_relevance

Index = tuple[slice, ...]
Piece = tuple[Index | None, ...]
"""Where a piece of an operation lies in its inputs and, last, in its output: one index per input
(None: the whole input, which the piece then shares with other pieces; inputs past the last index
given are whole too) and one of the output."""
ClosedForm = Callable[[list[Any], Sequence[Tensor | None]], Sequence[Tensor | None]]
"""``(inputs, relevance of the outputs) -> relevance of the relevance-carrying inputs``, in order."""


class DecomposedInBackward(torch.autograd.Function):
    """Forward: the original kernel's outputs. Backward: relevance through a decomposition.

    The decomposition of the same operation is computed in backward.

    The decomposition is mathematically the same operation but not bit-identical (fused attention
    kernels, LayerNorm's fused statistics): the model's outputs stay exactly the model's.

    Computing the decomposition in backward rather than beside the kernel in forward is the same
    work, but its intermediates (attention's ``length x length`` scores and weights, one set per
    layer) live only while relevance passes through that layer instead of from forward to
    backward. An operation made of independent pieces (attention: each head of each sample) may
    name them: the decomposition then runs piece after piece, so that only one piece's
    intermediates are alive at a time. Where the relevance of the decomposition has a closed form
    (fused attention under the epsilon and softmax rules), ``closed_form(inputs, relevance)`` gives
    it without running the decomposition.
    """

    @staticmethod
    def forward(ctx, exact: Callable[..., Any], path: Callable[..., Any], closed_form: ClosedForm | None,
                pieces: Sequence[Piece] | None, *inputs: Any) -> Any:
        """Run the original kernel and keep the relevance-carrying inputs.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        exact : callable
            The original kernel.
        path : callable
            The decomposition, run in backward.
        closed_form : ClosedForm or None
            The decomposition's relevance without running it, if it has a closed form.
        pieces : sequence of Piece or None
            Independent parts of the operation, decomposed one after the other.
        *inputs
            The operation's inputs.

        Returns
        -------
        Any
            ``exact(*inputs)``.
        """
        ctx.path, ctx.closed_form, ctx.pieces = path, closed_form, pieces
        ctx.gradient_form = gradient_form_active()  # backward may run on another thread (CUDA)
        ctx.positions = [index for index, value in enumerate(inputs) if carries_relevance(value)]
        # (aliases: the Python objects may be given other tensors later, see RuleFunction.forward)
        ctx.inputs = [None if index in ctx.positions else value.detach() if isinstance(value, Tensor) else value
                      for index, value in enumerate(inputs)]
        ctx.save_for_backward(*(inputs[index] for index in ctx.positions))  # in-place changes are errors
        outputs = exact(*inputs)
        ctx.single = isinstance(outputs, Tensor)
        return outputs

    @staticmethod
    def backward(ctx, *relevance: Tensor | None) -> tuple[Tensor | None, ...]:
        """The relevance of the inputs through the decomposition.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        *relevance : Tensor or None
            The relevance of each output.

        Returns
        -------
        tuple of (Tensor or None)
            None for ``exact``, ``path``, ``closed_form`` and ``pieces``, then the relevance of
            each input (None for inputs that carry none).
        """
        inputs = list(ctx.inputs)
        for index, value in zip(ctx.positions, ctx.saved_tensors, strict=True):
            inputs[index] = value
        result: list[Tensor | None] = [None] * len(inputs)
        if ctx.pieces is None:
            shares = _relevance_through(ctx, inputs, relevance)
            for index, share in zip(ctx.positions, shares, strict=True):
                result[index] = share
            return (None, None, None, None, *result)
        for piece in ctx.pieces:
            *where, where_out = piece
            where = [*where, *[None] * (len(inputs) - len(where))]
            part = [value if at is None or not isinstance(value, Tensor) else value[at]
                    for value, at in zip(inputs, where, strict=True)]
            shares = _relevance_through(ctx, part, tuple(
                share if share is None or where_out is None else share[where_out] for share in relevance))
            for index, share in zip(ctx.positions, shares, strict=True):
                if share is None:
                    continue
                if result[index] is None:
                    result[index] = torch.zeros_like(inputs[index])
                whole = result[index]
                (whole if where[index] is None else whole[where[index]]).add_(share)
        return (None, None, None, None, *result)


def _relevance_through(ctx: Any, inputs: list[Any], relevance: Sequence[Tensor | None]) -> Sequence[Tensor | None]:
    """The relevance of the relevance-carrying ``inputs`` (at ``ctx.positions``) through the
    decomposition ``ctx.path``, for the ``relevance`` of its outputs."""
    if ctx.closed_form is not None:
        return ctx.closed_form(inputs, relevance)
    leaves = [inputs[index].detach().requires_grad_() for index in ctx.positions]
    for index, leaf in zip(ctx.positions, leaves, strict=True):
        inputs[index] = leaf
    with torch.enable_grad(), gradient_form(ctx.gradient_form):
        outputs = ctx.path(*inputs)
    outputs = (outputs,) if ctx.single else tuple(outputs)
    pairs = [
        (output, share) for output, share in zip(outputs, relevance, strict=True)
        if share is not None and isinstance(output, Tensor) and output.requires_grad
    ]
    if not pairs:
        return [None] * len(leaves)
    return torch.autograd.grad([output for output, _ in pairs], leaves, [share for _, share in pairs],
                               allow_unused=True)


def decomposed_in_backward(
    exact: Callable[..., Any], path: Callable[..., Any], *inputs: Any, pieces: Sequence[Piece] | None = None,
    closed_form: ClosedForm | None = None,
) -> Any:
    """``exact(*inputs)``, whose relevance in backward is that of ``path(*inputs)``.

    ``path`` is the same operation decomposed into explained parts; its relevance is computed in
    backward (see :class:`DecomposedInBackward`).

    Parameters
    ----------
    exact : callable
        The original kernel, whose outputs are returned.
    path : callable
        The decomposition.
    *inputs
        The operation's inputs.
    pieces : sequence of Piece, optional
        Independent parts of the operation, decomposed one after the other (one :data:`Piece`
        each; their outputs must not overlap and must cover the output).
    closed_form : ClosedForm, optional
        The relevance of ``path`` computed without running it.

    Returns
    -------
    Any
        ``exact(*inputs)``.
    """
    return DecomposedInBackward.apply(exact, path, closed_form, pieces, *inputs)
