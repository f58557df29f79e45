"""Operations whose native backward already routes relevance, or that carry none.

Views, reshapes and copies move relevance with the values; indexing, gathering and
concatenation route it to where each value came from and add it up where a value was used
several times; max and min pooling are winner-take-all; comparisons, shapes and tensor creation
carry no relevance at all. None of them is rewritten.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxlrp.operations.helpers import held_constant, identity, native, non_negative_where_arguments_are
from fxlrp.operations.sparse import selected
from fxlrp.registry import Native, Operation, RoleFrom, Routed, Spelling, ValueFlow, register
from fxlrp.registry.writes import (
    copied,
    diagonal_filled,
    filled,
    items_set,
    view_of_written,
    written_through_view,
    zeroed,
)
from fxlrp.relevance.roles import ATTENTION, GATE, SELECTED, role_of

VIEWING_METHODS = (
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "expand", "expand_as", "movedim", "moveaxis", "swapaxes", "swapdims", "narrow", "select", "chunk",
    "split", "tensor_split", "unbind", "diagonal", "unfold", "as_strided", "contiguous", "to", "type_as", "float",
    "double", "half", "bfloat16", "__getitem__",
)
"""Methods whose result may share memory with ``self`` (a view, or the tensor itself)."""
VIEW_METHODS = VIEWING_METHODS + (
    "clone", "repeat", "repeat_interleave", "tile", "index_select", "gather", "take_along_dim", "masked_select",
    "flip", "roll", "type", "cpu", "cuda", "detach", "masked_fill", "tril", "triu", "scatter", "index_put",
    "index_fill", "index_copy", "masked_scatter", "broadcast_to",
    # transposes read as properties (a graph reads them by ``getattr``)
    "T", "mT", "H", "mH",
)
VIEWING_FUNCTIONS = (
    torch.reshape, torch.flatten, torch.unflatten, torch.permute, torch.transpose, torch.t, torch.squeeze,
    torch.unsqueeze, torch.movedim, torch.moveaxis, torch.swapaxes, torch.narrow, torch.select, torch.chunk,
    torch.split, torch.tensor_split, torch.unbind, torch.diagonal, torch.as_strided, operator.getitem,
)
"""Functions whose result may share memory with their first argument."""
VIEW_FUNCTIONS = VIEWING_FUNCTIONS + (
    torch.clone,
    # torch's own index_select, also where a library imported first has put a wrapper of it in
    # its place (PyG does; its integration registers the wrapper)
    torch._C._VariableFunctions.index_select, torch.gather, torch.take_along_dim,
    torch.masked_select, torch.flip,
    torch.roll, torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack,
    torch.vstack, torch.dstack, torch.repeat_interleave, torch.tile,
    torch.masked_fill, torch.tril, torch.triu, torch.scatter, torch.detach,
    torch.broadcast_to, torch.atleast_1d, torch.atleast_2d, torch.atleast_3d,
    F.pad, F.one_hot, F.pixel_shuffle, F.pixel_unshuffle, F.channel_shuffle,
    operator.setitem, builtins.getattr, written_through_view, view_of_written,
    copied, filled, zeroed, items_set, diagonal_filled, torch.index_copy, torch.masked_scatter,
    torch.view_as_real, torch.view_as_complex, torch.complex,
)
VIEW_MODULES = (nn.Flatten, nn.Unflatten, nn.Identity, nn.PixelShuffle, nn.PixelUnshuffle, nn.ChannelShuffle,
                nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
                nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReplicationPad1d, nn.ReplicationPad2d)



def moved_non_negative(spelling: Any, args: Any, kwargs: Any, known: Any) -> bool:
    """The entry's :attr:`~fxlrp.registry.ValueFlow.non_negative`: values moved, selected or
    concatenated are never negative where none of the moved ones is, and the values a call
    writes or pads with are not (a fill value, a padding module's ``value``). Indexing selects:
    its index adds no values (its negative positions count from the end)."""
    if spelling is operator.getitem:
        return known(args[0])
    if isinstance(spelling, nn.Module) and not known(getattr(spelling, "value", 0)):
        return False
    return non_negative_where_arguments_are(spelling, args, kwargs, known)

register(
    Operation(
        "view",
        Spelling(functions=VIEW_FUNCTIONS, methods=VIEW_METHODS, modules=VIEW_MODULES),
        Routed(selected),
        ValueFlow(
            non_negative=moved_non_negative,
            role=RoleFrom.FIRST_ARGUMENT,
            # an index selects values but contributes none of its own
            index_arguments={"getitem": (1,), "index_select": (2,), "gather": (2,), "scatter": (2,),
                             "index_fill": (2,), "index_copy": (2,), "take_along_dim": (1,), "index_put": (1,),
                             "repeat_interleave": (1,)},
            aliasing=frozenset((*VIEWING_METHODS, *VIEWING_FUNCTIONS)),
            keeps_rank=frozenset({nn.Identity, "contiguous"}),
        ),
        description="views, copies, indexing, gathering, concatenation, padding",
    )
)

register(
    Operation(
        "where",
        Spelling(functions=(torch.where,), methods=("where",)),
        Routed(native),
        ValueFlow(role=RoleFrom.SHARED),
        description="elementwise choice between two tensors: each value's relevance goes back to the "
        "tensor it was taken from; the role both share stays (attention weights masked after the softmax)",
    )
)

register(
    Operation(
        "max",
        Spelling(
            functions=(
                torch.min, torch.amax, torch.amin, torch.maximum, torch.minimum,
                F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d,
                F.adaptive_max_pool2d, F.adaptive_max_pool3d, torch.max_pool1d, torch.max_pool2d,
                torch.max_pool3d, torch.sort,
                F.max_pool1d_with_indices, F.max_pool2d_with_indices, F.max_pool3d_with_indices,
            ),
            methods=("min", "amax", "amin", "maximum", "minimum", "sort"),
            modules=(
                nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
                nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
            ),
        ),
        Native(),
        ValueFlow(non_negative=non_negative_where_arguments_are,
                  keeps_rank=frozenset({nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d})),
        description="max and min: winner-take-all",
    )
)

def largest_role(result: Any, input: Any, *args: Any, **kwargs: Any) -> str | None:
    """``topk`` and ``max`` along a dimension pick values and their indices, winner-take-all. A
    router chooses experts by them (a mixture of experts written out: each chosen expert's output
    times its weight), and its weights are gates, which the product rules of AttnLRP and CP-LRP
    hold constant, so that the chosen experts take the relevance, as in the experts functions
    transformers 5 runs (:mod:`fxlrp.integrations.transformers`): the largest values of a softmax's or a
    sigmoid's outputs (Mixtral, Qwen-MoE; Switch Transformers' top 1 by ``max``) are gates, those
    of other scores selected, whose softmax (GPT-OSS) or sigmoid is a gate. A ``max`` of all values
    or of two tensors (no indices) is a plain maximum. (The indices carry no relevance: their mark
    is never read.)"""
    if not isinstance(result, tuple):
        return None
    return GATE if role_of(input) in (ATTENTION, GATE) else SELECTED


register(
    Operation(
        "largest",
        Spelling(functions=(torch.topk, torch.max), methods=("topk", "max")),
        Routed(native),
        ValueFlow(non_negative=non_negative_where_arguments_are, role=largest_role),
        description="topk and max: winner-take-all; the largest of a softmax or sigmoid (a router's weights) are "
        "gates",
    )
)

register(
    Operation(
        "dropout",
        Spelling(
            functions=(F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, torch.dropout),
            methods=("dropout",),
            modules=(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout),
        ),
        Routed(identity),
        ValueFlow(non_negative=non_negative_where_arguments_are, keeps_rank=True),
        description="dropout: the identity at explanation time",
    )
)

register(
    Operation(
        "constant",
        Spelling(
            functions=(
                torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.linspace,
                torch.eye, torch.tensor, torch.as_tensor, torch.zeros_like, torch.ones_like,
                torch.full_like, torch.empty_like, torch.rand, torch.randn, torch.rand_like,
                torch.randn_like, torch.randint, torch.argmax, torch.argmin, torch.argsort,
                torch.bincount, torch.unique, torch.eq, torch.ne, torch.lt, torch.le, torch.gt,
                torch.ge, torch.isnan, torch.isinf, torch.isfinite, torch.numel,
                torch.logical_and, torch.logical_or, torch.logical_not,
                operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                operator.floordiv, operator.mod, operator.and_, operator.or_, operator.invert,
                operator.not_, operator.xor, builtins.len, builtins.int, builtins.float,
                fx._symbolic_trace._assert_is_none,  # the check capture adds for concrete_args=None
            ),
            methods=(
                "size", "dim", "numel", "ndimension", "nelement", "new_zeros", "new_ones", "new_full",
                "new_empty", "new_tensor", "argmax", "argmin", "argsort", "eq", "ne", "lt", "le", "gt",
                "ge", "bool", "long", "int", "byte", "short", "isnan", "isinf", "isfinite",
                "nonzero", "bincount", "unique", "item", "tolist", "any", "all",
                "get_device", "is_floating_point", "is_contiguous", "__eq__", "__ne__", "__lt__",
                "__le__", "__gt__", "__ge__", "__floordiv__", "__mod__", "__and__", "__or__",
                "__invert__", "__len__", "fill_", "zero_", "requires_grad_",
            ),
        ),
        Native(),
        description="shapes, indices, comparisons, tensor creation: carry no relevance",
    )
)


register(
    Operation(
        "step",
        Spelling(
            functions=(
                torch.sign, torch.sgn, torch.signbit, torch.heaviside, torch.round, torch.floor, torch.ceil,
                torch.trunc, torch.fix,
            ),
            methods=("sign", "sgn", "signbit", "heaviside", "round", "floor", "ceil", "trunc", "fix"),
        ),
        Routed(held_constant),
        description="piecewise-constant maps (sign, heaviside, round, floor, ceil, trunc): derivative 0 "
        "almost everywhere, so the output carries no relevance and a product with it is a gate",
    )
)
