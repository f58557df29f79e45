"""Why ``explain.to(...)``, ``.double()``, ``.half()``, ``.cuda()`` refuse to move an explainer.

An explainer computes with the model's own parameters and buffers, detached (shared storage, never
modified), held by the nodes of its graph, their rules' caches and the parts run eagerly; only its
constants are registered with it. ``nn.Module.to`` would move those few and leave the rest where
they are: a half-moved explainer that fails on the next input, or computes in two precisions.
Moving the rest would mean copies of the model's parameters, no longer shared with the model and
its later updates. So a move that would change anything is refused, with what to do instead
(convert a model that is where the explanation should run); one that changes nothing (``.to()``
to where the explainer already is, ``.float()`` on a float32 model) is allowed.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, fx

MOVE_REFUSED = (
    "an fxlrp explainer cannot be moved or cast (explain.to(...), .double(), .half(), .cuda(), ...): it "
    "computes with your model's own parameters, which it shares and never modifies, so they would stay where "
    "they are. Move or cast the model and convert that: explain = fxlrp.convert(model.to(device, dtype)), or "
    "fxlrp.convert(copy.deepcopy(model).to(...)) to keep the model as it is; then pass inputs of that device "
    "and dtype. For lower precision without converting again, run the explainer under torch.autocast."
)


def refuse_to_move(explainer: Any, convert: Callable[[Tensor], Tensor]) -> None:
    """Raise :class:`TypeError` if ``convert`` (what ``nn.Module._apply`` is given) would change
    the dtype or device of a tensor the explanation uses.

    ``convert`` is tried on an empty tensor of each dtype and device in use, never on the model's
    own tensors (``share_memory()`` converts in place)."""
    placements = {(tensor.dtype, tensor.device) for tensor in tensors_used(explainer)}
    for dtype, device in placements:
        probe = torch.empty(0, dtype=dtype, device=device)
        try:
            converted = convert(probe)
        except Exception as error:  # e.g. .cuda() on a machine without CUDA: still a move
            raise TypeError(MOVE_REFUSED) from error
        if converted is not probe and (converted.dtype, converted.device) != (dtype, device):
            raise TypeError(MOVE_REFUSED)


_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           fx.Graph, fx.Node, str, bytes, int, float, bool, complex)


def tensors_used(root: Any) -> Iterator[Tensor]:
    """Every tensor reachable from ``root`` through attributes, containers and partial functions:
    the explainer's constants, the detached parameters its nodes hold, its rules' parameters."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        item = pending.pop()
        if id(item) in seen or isinstance(item, _OPAQUE) or item is None:
            continue
        seen.add(id(item))
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            pending.extend(item)
        elif isinstance(item, functools.partial):  # the conversion's convert_again: the model itself
            pending.extend((item.args, item.keywords))
        elif hasattr(item, "__dict__"):
            pending.extend(vars(item).values())
