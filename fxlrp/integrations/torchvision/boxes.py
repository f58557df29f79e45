"""A detector's box decoding (torchvision's ``BoxCoder.decode_single``): boxes from predicted
offsets of reference boxes, each coordinate's relevance shared among the terms it is the sum of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import require_relevance_form
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.stabilise import divide_dropping_zeros


class _DecodedBoxes(torch.autograd.Function):
    """Forward: torchvision's ``BoxCoder.decode_single`` as the model runs it. Backward: the
    relevance of each box coordinate shared among the terms it is the sum of (see
    :func:`box_decoding`)."""

    @staticmethod
    def forward(ctx: Any, function: Callable[..., Tensor], coder: Any, codes: Tensor, boxes: Tensor) -> Tensor:
        decoded = function(coder, codes, boxes)
        ctx.save_for_backward(codes, boxes, decoded)
        ctx.coder = coder
        return decoded

    @staticmethod
    def backward(ctx: Any, relevance: Tensor) -> tuple[None, None, Tensor, None]:
        codes, boxes, decoded = ctx.saved_tensors
        coder = ctx.coder
        boxes = boxes.to(codes.dtype)
        sizes = torch.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], dim=1)[:, None]  # [N, 1, 2]
        deltas = codes.reshape(codes.shape[0], -1, 4) / torch.as_tensor(coder.weights, dtype=codes.dtype,
                                                                        device=codes.device)
        centre = deltas[..., :2] * sizes  # (the shift of the centre from the reference box's)
        log_sizes = deltas[..., 2:]
        half = 0.5 * sizes * torch.expm1(log_sizes.clamp(max=coder.bbox_xform_clip))  # (the change of half the size)
        half = half * (log_sizes <= coder.bbox_xform_clip)  # (clipped: a constant, no relevance)
        shares = divide_dropping_zeros(relevance, decoded).reshape(centre.shape[0], -1, 4)  # R / z per coordinate
        low, high = shares[..., :2], shares[..., 2:]  # (x0, y0) = centre - half, (x1, y1) = centre + half
        by_code = torch.cat([centre * (low + high), half * (high - low)], dim=-1)
        return None, None, by_code.reshape(codes.shape), None


def box_decoding(call: RelevanceCall, function: Callable[..., Any], coder: Any, codes: Tensor, boxes: Tensor) -> Tensor:
    r"""torchvision's ``BoxCoder.decode_single``: boxes from predicted offsets of reference boxes
    (anchors, proposals), with the reference boxes held constant.

    Each coordinate is a sum, e.g. the left edge

    .. math:: x_0 = \underbrace{c_x - \tfrac{w}{2}}_{\text{reference}}
        + \underbrace{w\,d_x}_{\text{shift}} - \underbrace{\tfrac{w}{2}(e^{d_w} - 1)}_{\text{resize}}

    (``c_x``, ``w`` the reference box's centre and width, ``d_x = t_x / w_x`` and ``d_w = t_w /
    w_w`` the predicted codes over the coder's weights, ``d_w`` clipped above as the model clips
    it), and its relevance is shared among the terms by the z-rule, ``R_term = term / x_0 R``:
    the reference box's share is a constant's (a bias's), the shift's goes to ``t_x`` (linear),
    the resize's to ``t_w``. That is the rule of the sums with ``e^{d}`` explained as
    ``1 + (e^{d} - 1)``: the value it has at ``d = 0`` a constant, the change the part of
    ``d``, ``R_d = (1 - e^{-d}) R_{e^d}``. The relevance reaching the network is the
    coordinate's offset from the reference box's, ``x_0 - (c_x - w / 2)``: what moved the edge
    from where the anchor or proposal had it. The centre ``(x_0 + x_1) / 2`` is linear in the
    codes: the resize terms cancel, and LRP-0 of it is gradient x input on a piecewise-linear
    network.

    Parameters
    ----------
    call : RelevanceCall
        The node's settings.
    function : callable
        ``BoxCoder.decode_single``.
    coder : BoxCoder
        The detector's coder (its weights and clip).
    codes : Tensor
        The predicted offsets ``[N, 4 K]``.
    boxes : Tensor
        The reference boxes ``[N, 4]``, held constant.

    Returns
    -------
    Tensor
        The decoded boxes ``[N, 4 K]``, as the model computes them.
    """
    if not torch.is_grad_enabled() or not carries_relevance(codes):
        return function(coder, codes, boxes)
    require_relevance_form("box decoding")
    return _DecodedBoxes.apply(function, coder, codes, boxes.detach())


try:
    from torchvision.models.detection._utils import BoxCoder
except ImportError:  # torchvision is optional
    BoxCoder = None

if BoxCoder is not None:
    register(
        Operation(
            "box_decoding",
            Spelling(functions=(BoxCoder.decode_single,), leaf=True),
            Affine(box_decoding, default_rule=proportional),
            ValueFlow(index_arguments=(2,)),
            description="box decoding (BoxCoder.decode_single): each coordinate the sum of the reference box's "
            "(a constant), the predicted shift's and the predicted resize's (e^d - 1) terms, z-rule",
        )
    )
