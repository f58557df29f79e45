"""Every operation and every spelling of it, against a dense reference (float64).

Each case is a one-operation model written the way a user would write it. Its relevance from
``fxlrp.convert`` is compared with a reference built from the operation's explicit Jacobian
(``torch.autograd.functional.jacobian``) and the rule's formula by hand:

- ``rule``: the epsilon rule ``R_j = x_j sum_k J_kj R_k / (z_k + eps (sign z_k + [z_k = 0]))``
  (eps of the composite on layers with weights, 0 - the z-rule - on sums, means, pools, scatters);
- ``routed``: ``R_in = J^T R`` (the native backward routes relevance: views, indexing, max, ReLU);
- ``identity``: ``R_in = R_out`` (smooth activations, scaling by constants, dropout);
- ``halves``: a product of two relevance-carrying factors gives each half of ``R_out``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch_scatter
from support.operations import Case, Op, layer, randn
from support.references import epsilon_reference, explained_relevance, relative_error, routed_reference
from torch import nn
from torch_scatter import scatter_mean, segment_csr

import fxlrp
from fxlrp.rules import Epsilon

TOLERANCE = 1e-10


INDEX = torch.tensor([0, 2, 2, 1, 0, 4])  # node 3 receives nothing
POINTER = torch.tensor([0, 2, 2, 5, 6])  # segment 1 is empty
SORTED_INDEX = torch.tensor([0, 0, 2, 2, 2, 3])
ROWS = torch.tensor([3, 0, 0, 2])
LINEAR_WEIGHT = {"weight": randn(5, 4), "bias": randn(5)}


def _clone_then(update: Callable[[torch.Tensor, torch.Tensor], Any]) -> Callable[..., Any]:
    """In-place spellings work on a copy, so that the reference may call the model repeatedly."""

    def spelling(m, x, y):
        out = x.clone()
        update(out, y)
        return out

    return spelling


def _iadd(m, x, y):
    out = x * 1.0
    out += y
    return out


def _isub(m, x, y):
    out = x * 1.0
    out -= y
    return out


def _imul(m, x):
    out = x + 0.0
    out *= 3.0
    return out


def _relu_in_place(m, x):
    out = x * 1.0
    out.relu_()
    return out


def _written_into(write):
    """``write`` applied to views of a copy of ``x``, which is returned (``y[:, :2].mul_(2)``)."""

    def spelling(m, x):
        out = x * 1.0
        write(out)
        return out

    return spelling


def _relu_into_slice_read_through_earlier_view(m, x):
    out = x * 1.0
    flat = out.view(-1)  # a view taken before the write, read after it
    out[:, :2].relu_()
    return flat.view(3, 4)


def _then(value, write):
    write(value)
    return value


def _module_in_place_on_slice(m, x):
    out = x * 1.0
    m.layer(out[:, :2])  # its result unread: the write into ``out`` is what counts
    return out


def _unsqueeze_in_place(m, x):
    out = x * 1.0
    out.unsqueeze_(0)
    return out[0]


SUMS = [
    Case("add operator", lambda m, x, y: x + y, ((3, 4), (3, 4)), "rule"),
    Case("add torch.add", lambda m, x, y: torch.add(x, y), ((3, 4), (3, 4)), "rule"),
    Case("add torch.add alpha", lambda m, x, y: torch.add(x, y, alpha=2.0), ((3, 4), (3, 4)), "rule"),
    Case("add method", lambda m, x, y: x.add(y), ((3, 4), (3, 4)), "rule"),
    Case("add +=", _iadd, ((3, 4), (3, 4)), "rule"),
    Case("add add_", _clone_then(lambda out, y: out.add_(y)), ((3, 4), (3, 4)), "rule"),
    Case("add broadcast row", lambda m, x, y: x + y, ((3, 4), (4,)), "rule"),
    Case("add broadcast both", lambda m, x, y: x + y, ((3, 1), (1, 4)), "rule"),
    Case("add bias parameter", lambda m, x: x + m.bias, ((3, 4),), "rule", parameters={"bias": randn(4)}),
    Case("add scalar", lambda m, x: x + 1.5, ((3, 4),), "rule"),
    Case("add reflected scalar", lambda m, x: 1.5 + x, ((3, 4),), "rule"),
    Case("add three terms", lambda m, x, y, z: x + y + z, ((2, 3), (2, 3), (2, 3)), "rule"),
    Case("sub operator", lambda m, x, y: x - y, ((3, 4), (3, 4)), "rule"),
    Case("sub torch.sub", lambda m, x, y: torch.sub(x, y), ((3, 4), (3, 4)), "rule"),
    Case("sub method", lambda m, x, y: x.sub(y), ((3, 4), (3, 4)), "rule"),
    Case("sub -=", _isub, ((3, 4), (3, 4)), "rule"),
    Case("sub broadcast", lambda m, x, y: x - y, ((3, 4), (3, 1)), "rule"),
    Case("sub reflected scalar", lambda m, x: 2.0 - x, ((3, 4),), "rule"),
    Case("sum all", lambda m, x: x.sum(), ((3, 4),), "rule"),
    Case("sum torch.sum dim", lambda m, x: torch.sum(x, dim=1), ((3, 4),), "rule"),
    Case("sum dims keepdim", lambda m, x: x.sum(dim=(0, 2), keepdim=True), ((2, 3, 4),), "rule"),
    Case("sum negative dim", lambda m, x: x.sum(-1), ((2, 3, 4),), "rule"),
    Case("mean method", lambda m, x: x.mean(1), ((3, 4),), "rule"),
    Case("mean torch.mean dims", lambda m, x: torch.mean(x, dim=(1, 2)), ((2, 3, 4),), "rule"),
    Case("cumsum", lambda m, x: torch.cumsum(x, dim=1), ((2, 5),), "rule"),
]

LAYERS = [
    Case("linear module", lambda m, x: m.layer(x), ((3, 4),), "rule", True, modules=layer(lambda: nn.Linear(4, 5))),
    Case("linear module no bias", lambda m, x: m.layer(x), ((3, 4),), "rule", True,
         modules=layer(lambda: nn.Linear(4, 5, bias=False))),
    Case("linear sequential 3d input", lambda m, x: m.layer(x), ((2, 3, 4),), "rule", True,
         modules=layer(lambda: nn.Sequential(nn.Linear(4, 5)))),
    Case("F.linear", lambda m, x: F.linear(x, m.weight, m.bias), ((3, 4),), "rule", True, parameters=LINEAR_WEIGHT),
    Case("F.linear no bias", lambda m, x: F.linear(x, m.weight), ((3, 4),), "rule", True,
         parameters={"weight": randn(5, 4)}),
    Case("matmul operator", lambda m, x: x @ m.weight.t(), ((3, 4),), "rule", True, parameters={"weight": randn(5, 4)}),
    Case("torch.matmul", lambda m, x: torch.matmul(x, m.weight), ((2, 3, 4),), "rule", True,
         parameters={"weight": randn(4, 5)}),
    Case("torch.mm", lambda m, x: torch.mm(x, m.weight), ((3, 4),), "rule", True, parameters={"weight": randn(4, 5)}),
    Case("matmul method", lambda m, x: x.matmul(m.weight), ((3, 4),), "rule", True,
         parameters={"weight": randn(4, 5)}),
    Case("matmul parameter on the left", lambda m, x: m.weight @ x, ((4, 3),), "rule", True,
         parameters={"weight": randn(5, 4)}),
    Case("torch.addmm", lambda m, x: torch.addmm(m.bias, x, m.weight), ((3, 4),), "rule", True,
         parameters={"weight": randn(4, 5), "bias": randn(5)}),
    Case("conv1d module", lambda m, x: m.layer(x), ((2, 4, 9),), "rule", True,
         modules=layer(lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2))),
    Case("conv2d module", lambda m, x: m.layer(x), ((2, 3, 7, 6),), "rule", True,
         modules=layer(lambda: nn.Conv2d(3, 4, 3, padding=1))),
    Case("conv2d groups stride dilation", lambda m, x: m.layer(x), ((1, 4, 9, 8),), "rule", True,
         modules=layer(lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(1, 2), groups=2))),
    Case("conv2d no bias", lambda m, x: m.layer(x), ((1, 2, 5, 5),), "rule", True,
         modules=layer(lambda: nn.Conv2d(2, 3, 3, bias=False))),
    Case("conv2d padding same", lambda m, x: m.layer(x), ((1, 2, 5, 6),), "rule", True,
         modules=layer(lambda: nn.Conv2d(2, 3, 3, padding="same"))),
    Case("conv2d reflect padding", lambda m, x: m.layer(x), ((1, 2, 5, 6),), "rule", True,
         modules=layer(lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"))),
    Case("conv2d replicate padding", lambda m, x: m.layer(x), ((1, 2, 5, 6),), "rule", True,
         modules=layer(lambda: nn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="replicate"))),
    Case("conv2d circular padding", lambda m, x: m.layer(x), ((1, 2, 5, 6),), "rule", True,
         modules=layer(lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"))),
    Case("conv3d module", lambda m, x: m.layer(x), ((1, 2, 4, 5, 4),), "rule", True,
         modules=layer(lambda: nn.Conv3d(2, 4, 2, stride=(1, 2, 1), padding=1, groups=2))),
    Case("F.conv2d", lambda m, x: F.conv2d(x, m.weight, m.bias, stride=2, padding=1), ((1, 3, 6, 6),), "rule",
         True, parameters={"weight": randn(4, 3, 3, 3), "bias": randn(4)}),
    Case("torch.conv2d", lambda m, x: torch.conv2d(x, m.weight, None, 1, 1), ((1, 3, 5, 5),), "rule", True,
         parameters={"weight": randn(2, 3, 3, 3)}),
    Case("F.conv1d", lambda m, x: F.conv1d(x, m.weight, m.bias), ((2, 3, 7),), "rule", True,
         parameters={"weight": randn(4, 3, 2), "bias": randn(4)}),
    Case("F.conv3d", lambda m, x: F.conv3d(x, m.weight, padding=1), ((1, 2, 3, 4, 3),), "rule", True,
         parameters={"weight": randn(3, 2, 2, 2, 2)}),
    Case("conv_transpose1d module", lambda m, x: m.layer(x), ((2, 4, 5),), "rule", True,
         modules=layer(lambda: nn.ConvTranspose1d(4, 2, 3, stride=2, groups=2))),
    Case("conv_transpose2d module", lambda m, x: m.layer(x), ((1, 3, 4, 5),), "rule", True,
         modules=layer(lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1))),
    Case("conv_transpose3d module", lambda m, x: m.layer(x), ((1, 2, 3, 3, 2),), "rule", True,
         modules=layer(lambda: nn.ConvTranspose3d(2, 2, 2, stride=(2, 1, 1)))),
    Case("F.conv_transpose2d", lambda m, x: F.conv_transpose2d(x, m.weight, m.bias, stride=2), ((1, 2, 3, 3),),
         "rule", True, parameters={"weight": randn(2, 3, 2, 2), "bias": randn(3)}),
    Case("batch_norm1d eval", lambda m, x: m.layer(x), ((4, 3),), "rule", True,
         modules=layer(lambda: nn.BatchNorm1d(3)), exact_forward=False),
    Case("batch_norm2d eval", lambda m, x: m.layer(x), ((2, 3, 4, 4),), "rule", True,
         modules=layer(lambda: nn.BatchNorm2d(3)), exact_forward=False),
    Case("batch_norm3d eval", lambda m, x: m.layer(x), ((1, 2, 3, 2, 2),), "rule", True,
         modules=layer(lambda: nn.BatchNorm3d(2)), exact_forward=False),
    Case("F.batch_norm", lambda m, x: F.batch_norm(x, m.mean, m.var, m.weight, m.bias, training=False, eps=1e-3),
         ((2, 3, 4),), "rule", True, parameters={"weight": randn(3), "bias": randn(3)},
         buffers={"mean": torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64),
                  "var": torch.tensor([0.5, 1.5, 2.0], dtype=torch.float64)}, exact_forward=False),
]

POOLS = [
    Case("avg_pool1d module", lambda m, x: m.layer(x), ((2, 3, 8),), "rule", modules=layer(lambda: nn.AvgPool1d(3, 2))),
    Case("avg_pool2d module", lambda m, x: m.layer(x), ((1, 2, 6, 7),), "rule",
         modules=layer(lambda: nn.AvgPool2d(2))),
    Case("avg_pool2d padding", lambda m, x: F.avg_pool2d(x, 3, stride=2, padding=1), ((1, 2, 6, 7),), "rule"),
    Case("avg_pool2d padding excluded", lambda m, x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
         ((1, 2, 6, 7),), "rule"),
    Case("avg_pool3d module", lambda m, x: m.layer(x), ((1, 2, 4, 4, 4),), "rule",
         modules=layer(lambda: nn.AvgPool3d(2))),
    Case("adaptive_avg_pool1d module", lambda m, x: m.layer(x), ((2, 3, 7),), "rule",
         modules=layer(lambda: nn.AdaptiveAvgPool1d(3))),
    Case("adaptive_avg_pool2d module", lambda m, x: m.layer(x), ((1, 2, 7, 5),), "rule",
         modules=layer(lambda: nn.AdaptiveAvgPool2d((3, 2)))),
    Case("F.adaptive_avg_pool2d global", lambda m, x: F.adaptive_avg_pool2d(x, 1), ((2, 3, 4, 4),), "rule"),
    Case("adaptive_avg_pool3d module", lambda m, x: m.layer(x), ((1, 2, 4, 5, 3),), "rule",
         modules=layer(lambda: nn.AdaptiveAvgPool3d(2))),
    Case("max_pool2d module", lambda m, x: m.layer(x), ((1, 2, 6, 6),), "routed",
         modules=layer(lambda: nn.MaxPool2d(2))),
    Case("F.max_pool1d", lambda m, x: F.max_pool1d(x, 3, stride=2, padding=1), ((2, 3, 8),), "routed"),
    Case("max_pool3d module", lambda m, x: m.layer(x), ((1, 2, 4, 4, 4),), "routed",
         modules=layer(lambda: nn.MaxPool3d(2))),
    Case("adaptive_max_pool2d module", lambda m, x: m.layer(x), ((1, 2, 5, 5),), "routed",
         modules=layer(lambda: nn.AdaptiveMaxPool2d(2))),
    Case("max over dim", lambda m, x: x.max(dim=1).values, ((3, 5),), "routed"),
    Case("torch.amax", lambda m, x: torch.amax(x, dim=0), ((3, 5),), "routed"),
]

TORCH_SCATTERS = [
    Case("scatter_add attribute", lambda m, x: torch_scatter.scatter_add(x, m.index, dim=0, dim_size=5),
         ((6, 3),), "rule", buffers={"index": INDEX}),
    Case("scatter_sum", lambda m, x: torch_scatter.scatter_sum(x, m.index, 0), ((6, 3),), "rule",
         buffers={"index": INDEX}),
    Case("scatter_mean imported", lambda m, x: scatter_mean(x, m.index, dim=0, dim_size=5), ((6, 3),), "rule",
         buffers={"index": INDEX}),
    Case("scatter reduce sum", lambda m, x: torch_scatter.scatter(x, m.index, 0, dim_size=5, reduce="sum"),
         ((6, 3),), "rule", buffers={"index": INDEX}),
    Case("scatter reduce mean", lambda m, x: torch_scatter.scatter(x, m.index, 0, reduce="mean"), ((6, 3),), "rule",
         buffers={"index": INDEX}),
    Case("scatter dim 1", lambda m, x: torch_scatter.scatter_add(x, m.index, dim=1), ((2, 6),), "rule",
         buffers={"index": INDEX}),
    Case("segment_csr sum", lambda m, x: segment_csr(x, m.pointer, reduce="sum"), ((6, 3),), "rule",
         buffers={"pointer": POINTER}),
    Case("segment_csr mean", lambda m, x: segment_csr(x, m.pointer, reduce="mean"), ((6, 3),), "rule",
         buffers={"pointer": POINTER}),
    Case("scatter_max", lambda m, x: torch_scatter.scatter_max(x, m.index, dim=0, dim_size=5)[0], ((6, 3),),
         "routed", buffers={"index": INDEX}),
    Case("scatter_min", lambda m, x: torch_scatter.scatter_min(x, m.index, dim=0)[0], ((6, 3),), "routed",
         buffers={"index": INDEX}),
    Case("scatter reduce max", lambda m, x: torch_scatter.scatter(x, m.index, 0, reduce="max"), ((6, 3),),
         "routed", buffers={"index": INDEX}),
    Case("segment_csr max", lambda m, x: segment_csr(x, m.pointer, reduce="max"), ((6, 3),), "routed",
         buffers={"pointer": POINTER}),
]
SCATTERS = TORCH_SCATTERS + [
    Case("scatter_add_ on new_zeros", lambda m, x: x.new_zeros(5, 3).scatter_add_(0, m.index2d, x), ((6, 3),),
         "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("scatter_add_ on torch.zeros", lambda m, x: torch.zeros(5, 3, dtype=x.dtype).scatter_add_(0, m.index2d, x),
         ((6, 3),), "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("scatter_add out of place", lambda m, x: torch.zeros_like(x[:5]).scatter_add(0, m.index2d, x), ((6, 3),),
         "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("torch.scatter_add", lambda m, x: torch.scatter_add(x.new_zeros(5, 3), 0, m.index2d, x), ((6, 3),),
         "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("index_add_", lambda m, x: x.new_zeros(5, 3).index_add_(0, m.index, x), ((6, 3),), "rule",
         buffers={"index": INDEX}),
    Case("torch.index_add", lambda m, x: torch.index_add(x.new_zeros(5, 3), 0, m.index, x), ((6, 3),), "rule",
         buffers={"index": INDEX}),
    Case("scatter_reduce_ sum", lambda m, x: x.new_zeros(5, 3).scatter_reduce_(0, m.index2d, x, reduce="sum"),
         ((6, 3),), "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("scatter_reduce mean", lambda m, x: x.new_zeros(5, 3).scatter_reduce(0, m.index2d, x, "mean"),
         ((6, 3),), "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("scatter_reduce mean without self",
         lambda m, x: x.new_zeros(5, 3).scatter_reduce(0, m.index2d, x, "mean", include_self=False),
         ((6, 3),), "rule", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
    Case("scatter_reduce amax", lambda m, x: x.new_zeros(5, 3).scatter_reduce(0, m.index2d, x, "amax",
                                                                               include_self=False),
         ((6, 3),), "routed", buffers={"index2d": INDEX[:, None].expand(6, 3).contiguous()}),
]

ROUTING = [
    Case("getitem index tensor", lambda m, x: x[m.rows], ((4, 3),), "routed", buffers={"rows": ROWS}),
    Case("getitem slices", lambda m, x: x[:, 1:3], ((4, 3),), "routed"),
    Case("getitem advanced 2d", lambda m, x: x[m.rows, m.rows[:2, None]], ((4, 4),), "routed",
         buffers={"rows": ROWS}),
    Case("torch.index_select", lambda m, x: torch.index_select(x, 0, m.rows), ((4, 3),), "routed",
         buffers={"rows": ROWS}),
    Case("index_select method dim 1", lambda m, x: x.index_select(1, m.rows), ((2, 4),), "routed",
         buffers={"rows": ROWS}),
    Case("gather", lambda m, x: x.gather(1, m.rows[None, :].expand(2, 4)), ((2, 4),), "routed",
         buffers={"rows": ROWS}),
    Case("torch.cat", lambda m, x, y: torch.cat([x, y], dim=1), ((2, 3), (2, 2)), "routed"),
    Case("torch.cat same tensor twice", lambda m, x: torch.cat((x, x)), ((2, 3),), "routed"),
    Case("torch.stack", lambda m, x, y: torch.stack([x, y], dim=-1), ((2, 3), (2, 3)), "routed"),
    Case("repeat_interleave int", lambda m, x: x.repeat_interleave(2, dim=0), ((3, 2),), "routed"),
    Case("torch.repeat_interleave tensor", lambda m, x: torch.repeat_interleave(x, m.repeats, dim=0), ((3, 2),),
         "routed", buffers={"repeats": torch.tensor([3, 0, 2])}),
    Case("view reshape", lambda m, x: x.view(2, 6).reshape(3, 4), ((3, 4),), "routed"),
    Case("permute transpose", lambda m, x: x.permute(2, 0, 1).transpose(0, 1), ((2, 3, 4),), "routed"),
    Case("flatten unsqueeze squeeze", lambda m, x: torch.flatten(x, 1).unsqueeze(0).squeeze(0), ((2, 3, 4),),
         "routed"),
    Case("flatten module", lambda m, x: m.layer(x), ((2, 3, 4),), "routed", modules=layer(nn.Flatten)),
    Case("expand", lambda m, x: x.expand(3, 4), ((1, 4),), "routed"),
    Case("identity module", lambda m, x: m.layer(x), ((2, 3),), "routed", modules=layer(nn.Identity)),
    Case("F.pad", lambda m, x: F.pad(x, (1, 2)), ((2, 3),), "routed"),
    Case("relu module", lambda m, x: m.layer(x), ((3, 4),), "routed", modules=layer(nn.ReLU)),
    Case("relu module in place", lambda m, x: m.layer(x * 1.0), ((3, 4),), "routed",
         modules=layer(lambda: nn.ReLU(inplace=True))),
    Case("F.relu", lambda m, x: F.relu(x), ((3, 4),), "routed"),
    Case("F.relu inplace", lambda m, x: F.relu(x * 1.0, inplace=True), ((3, 4),), "routed"),
    Case("torch.relu", lambda m, x: torch.relu(x), ((3, 4),), "routed"),
    Case("relu method", lambda m, x: x.relu(), ((3, 4),), "routed"),
    Case("relu_ method", _relu_in_place, ((3, 4),), "routed"),
    # identity since commit 9755653 (a leaky ReLU passes all its relevance, negative side included)
    Case("leaky_relu", lambda m, x: F.leaky_relu(x, 0.1), ((3, 4),), "identity"),
    Case("leaky_relu inplace", lambda m, x: F.leaky_relu(x * 1.0, 0.1, inplace=True), ((3, 4),), "identity"),
    Case("leaky_relu inplace by position", lambda m, x: F.leaky_relu(x * 1.0, 0.1, True), ((3, 4),), "identity"),
    Case("clamp", lambda m, x: x.clamp(min=-0.5, max=0.5), ((3, 4),), "routed"),
    Case("relu_ into a slice, read through an earlier view", _relu_into_slice_read_through_earlier_view,
         ((3, 4),), "routed"),
    Case("copy_ into a narrowed buffer",
         lambda m, x: _then(torch.zeros_like(x), lambda g: g.narrow(1, 0, 2).copy_(x[:, 1:3])), ((3, 4),), "routed"),
    Case("copy_ into a slice", _written_into(lambda out: out[:, :2].copy_(out[:, 2:])), ((3, 4),), "routed"),
    Case("zero_ of a column", _written_into(lambda out: out[:, 0].zero_()), ((3, 4),), "routed"),
    Case("fill_ of a column", _written_into(lambda out: out[:, 1].fill_(0.5)), ((3, 4),), "routed"),
    Case("fill_diagonal_", _written_into(lambda out: out.fill_diagonal_(0.0)), ((3, 4),), "routed"),
    Case("index_copy", lambda m, x: x.new_zeros(5, 4).index_copy(0, torch.tensor([4, 0, 2]), x), ((3, 4),),
         "routed"),
    Case("index_copy_", lambda m, x: x.new_zeros(5, 4).index_copy_(0, torch.tensor([4, 0, 2]), x), ((3, 4),),
         "routed"),
    Case("masked_scatter", lambda m, x: x.new_zeros(3, 4).masked_scatter(torch.arange(12).reshape(3, 4) % 3 == 0, x),
         ((3, 4),), "routed"),
    Case("relu module in place on a slice", _module_in_place_on_slice, ((3, 4),), "routed",
         modules=layer(lambda: nn.ReLU(inplace=True))),
    Case("relu_ into rows chosen by a tensor (a copy: nothing written)",
         _written_into(lambda out: out[torch.tensor([0, 2])].relu_()), ((3, 4),), "routed"),
]

IDENTITIES = [
    *(
        Case(f"{module.__name__} module", lambda m, x: m.layer(x), ((3, 4),), "identity", modules=layer(module))
        for module in (nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.ELU, nn.Softplus, nn.Hardswish)
    ),
    Case("F.gelu", lambda m, x: F.gelu(x), ((3, 4),), "identity"),
    Case("F.silu", lambda m, x: F.silu(x), ((3, 4),), "identity"),
    Case("torch.sigmoid", lambda m, x: torch.sigmoid(x), ((3, 4),), "identity"),
    Case("sigmoid method", lambda m, x: x.sigmoid(), ((3, 4),), "identity"),
    Case("torch.tanh", lambda m, x: torch.tanh(x), ((3, 4),), "identity"),
    Case("tanh method", lambda m, x: x.tanh(), ((3, 4),), "identity"),
    Case("F.elu", lambda m, x: F.elu(x), ((3, 4),), "identity"),
    Case("F.softplus", lambda m, x: F.softplus(x, beta=2.0), ((3, 4),), "identity"),
    Case("F.hardswish", lambda m, x: F.hardswish(x), ((3, 4),), "identity"),
    Case("mul by scalar", lambda m, x: x * 3.0, ((3, 4),), "identity"),
    Case("reflected mul by scalar", lambda m, x: 3.0 * x, ((3, 4),), "identity"),
    Case("mul by parameter", lambda m, x: x * m.scale, ((3, 4),), "identity", parameters={"scale": randn(4)}),
    Case("torch.mul by buffer", lambda m, x: torch.mul(m.factor, x), ((3, 4),), "identity",
         buffers={"factor": torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)}),
    Case("mul *=", _imul, ((3, 4),), "identity"),
    Case("div by scalar", lambda m, x: x / 4.0, ((3, 4),), "identity"),
    Case("div method by parameter", lambda m, x: x.div(m.scale), ((3, 4),), "identity",
         parameters={"scale": lambda generator: torch.rand(4, generator=generator, dtype=torch.float64) + 1}),
    Case("torch.div", lambda m, x: torch.div(x, 2.0), ((3, 4),), "identity"),
    Case("div by relevance-free shape", lambda m, x: x / x.shape[1], ((3, 4),), "identity"),
    Case("negation", lambda m, x: -x, ((3, 4),), "identity"),
    Case("dropout module eval", lambda m, x: m.layer(x), ((3, 4),), "identity",
         modules=layer(lambda: nn.Dropout(0.5))),
    Case("F.dropout eval", lambda m, x: F.dropout(x, 0.3, training=m.training), ((3, 4),), "identity"),
    Case("mul_ into a slice", _written_into(lambda out: out[:, :2].mul_(2.0)), ((3, 4),), "identity"),
    Case("mul_ into the diagonal", _written_into(lambda out: out.diagonal().mul_(3.0)), ((3, 4),), "identity"),
    Case("div_ into a narrowed transpose", _written_into(lambda out: out.t().narrow(0, 1, 2).div_(4.0)),
         ((3, 4),), "identity"),
    Case("unsqueeze_", _unsqueeze_in_place, ((3, 4),), "identity"),
]

HALVES = [
    Case("mul of two relevant tensors", lambda m, x, y: x * y, ((3, 4), (3, 4)), "halves"),
    Case("torch.mul of two relevant tensors", lambda m, x, y: torch.mul(x, y), ((3, 4), (3, 4)), "halves"),
]

CASES = SUMS + LAYERS + POOLS + SCATTERS + ROUTING + IDENTITIES + HALVES


def reference(case: Case, model: nn.Module, inputs: list[torch.Tensor], relevance: torch.Tensor, epsilon: float):
    with torch.no_grad():
        output = model(*inputs)
    if case.kind == "rule":
        return epsilon_reference(model, inputs, relevance, epsilon if case.weighted else 0.0)
    if case.kind == "routed":
        return routed_reference(model, inputs, relevance)
    if case.kind == "identity":
        assert output.shape == inputs[0].shape
        return [relevance]
    if case.kind == "halves":
        return [relevance / 2, relevance / 2]
    raise AssertionError(case.kind)


# LRP-0 on every case; on layers with weights also an epsilon that moves the result.
RUNS = [(case, 0.0) for case in CASES] + [(case, 0.25) for case in CASES if case.weighted]


@pytest.mark.parametrize(("case", "epsilon"), RUNS, ids=[f"{case.name}-eps{epsilon}" for case, epsilon in RUNS])
def test_operation_matches_dense_reference(case: Case, epsilon: float) -> None:
    generator = torch.Generator().manual_seed(7)
    model, inputs = case.build(generator)
    explain = fxlrp.convert(model, Epsilon(epsilon))
    with torch.no_grad():
        output = model(*inputs)
        explained_output = explain(*inputs)
    if case.exact_forward:
        assert torch.equal(explained_output, output)
    else:
        assert relative_error(explained_output, output) < 1e-14
    relevance = torch.randn(output.shape, generator=generator, dtype=torch.float64)

    actual = explained_relevance(explain, inputs, relevance)
    expected = reference(case, model, inputs, relevance, epsilon)

    for actual_input, expected_input in zip(actual, expected, strict=True):
        assert actual_input.shape == expected_input.shape
        assert torch.isfinite(actual_input).all()
        assert relative_error(actual_input, expected_input) < TOLERANCE


CONSERVING = ("add operator", "add broadcast both", "add three terms", "sub operator", "sum all", "sum dims keepdim",
              "cumsum", "scatter_add attribute", "scatter dim 1", "segment_csr sum", "scatter_add_ on new_zeros",
              "index_add_", "scatter_reduce_ sum")


@pytest.mark.parametrize("case", [case for case in CASES if case.name in CONSERVING], ids=lambda case: case.name)
def test_sums_conserve_relevance(case: Case) -> None:
    """The z-rule keeps the total relevance where no constant takes part in the sum."""
    generator = torch.Generator().manual_seed(3)
    model, inputs = case.build(generator)
    with torch.no_grad():
        output = model(*inputs)
    relevance = torch.randn(output.shape, generator=generator, dtype=torch.float64)
    actual = explained_relevance(fxlrp.convert(model), inputs, relevance)
    total = sum(value.sum() for value in actual)
    # Empty scatter groups are outputs of 0: their relevance is dropped by design.
    kept = relevance[output != 0].sum()
    assert abs(total.item() - kept.item()) < 1e-9 * relevance.abs().sum().item()


def test_relevance_at_zero_output_is_dropped_without_nan() -> None:
    """``x + y = 0`` cannot be divided among its terms: its relevance is lost, nothing is NaN."""
    model = Op(lambda m, x, y: x + y)
    x = torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64)
    y = torch.tensor([0.0, -2.0, 4.0], dtype=torch.float64)
    relevance = torch.tensor([1.0, 5.0, 2.0], dtype=torch.float64)
    rel_x, rel_y = explained_relevance(fxlrp.convert(model), [x, y], relevance)
    assert torch.equal(rel_x, torch.tensor([1.0, 0.0, -6.0], dtype=torch.float64))
    assert torch.equal(rel_y, torch.tensor([0.0, 0.0, 8.0], dtype=torch.float64))


def test_lost_relevance_warning_is_available() -> None:
    model = Op(lambda m, x: x.sum(dim=1))
    x = torch.tensor([[1.0, -1.0], [2.0, 1.0]], dtype=torch.float64)
    explain = fxlrp.convert(model, warn_lost_relevance=True)
    with pytest.warns(UserWarning, match="dropped"):
        explained_relevance(explain, [x], torch.ones(2, dtype=torch.float64))


def test_report_names_rule_of_each_operation() -> None:
    model = Op(lambda m, x: F.relu(m.layer(x)).sum(1) * 2.0, modules={"layer": nn.Linear(3, 2)})
    rows = {row.target: row for row in fxlrp.convert(model, Epsilon(0.5)).report().rows}
    assert rows["layer"].operation == "linear" and "0.5" in rows["layer"].rule
    assert "epsilon=0.0" in rows[".sum()"].rule
    assert rows["torch.nn.functional.relu"].handling == "native"
    assert rows["operator.mul"].operation.startswith("mul")


def test_operators_are_recorded_by_identity() -> None:
    """The operator spelling of add reaches the same registry entry as torch.add."""
    from fxlrp.registry import REGISTRY

    assert REGISTRY.for_function(operator.add) is REGISTRY.for_function(torch.add)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_operation_in_code_run_eagerly_matches_dense_reference(case: Case) -> None:
    """Every case in code run eagerly, three calls (the second records the run, the third replays
    it), LRP-0. torch_scatter's functions are handed to their rules whole there, as a graph records
    them (inside, segment_csr and the max/min reductions call compiled operations no rule reaches);
    a fresh buffer filled in place whose twin's backward keeps the buffer (scatter_reduce_) is
    swapped for the result, not written."""
    generator = torch.Generator().manual_seed(7)
    model, inputs = case.build(generator)
    explain = fxlrp.convert(model, Epsilon(0.0), capture="eager")
    with torch.no_grad():
        output = model(*inputs)
        assert torch.equal(explain(*inputs), output)
    relevance = torch.randn(output.shape, generator=generator, dtype=torch.float64)
    expected = reference(case, model, inputs, relevance, 0.0)
    for _ in range(3):
        for actual_input, expected_input in zip(explained_relevance(explain, inputs, relevance), expected, strict=True):
            assert relative_error(actual_input, expected_input) < TOLERANCE
