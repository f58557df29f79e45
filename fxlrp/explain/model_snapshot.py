"""What an explainer was converted from, so that it follows later changes to the model.

The captured graph calls the model's own modules and holds detached twins of their parameters and
buffers (shared storage), so values the user changes in place - an optimizer step,
``load_state_dict``, ``copy_`` - reach it as they are. Three kinds of change do not:

- an object replaced: a submodule swapped for another, a parameter, buffer or tensor attribute
  assigned anew, or a parameter's storage (``parameter.data = ...``) - the graph holds the old one;
  a forward hook added or removed - capture runs modules with hooks eagerly, the others in the graph;
- a plain attribute the trace read as a constant (a temperature, a flag, a size): torch.fx wrote
  its value into the graph;
- values the conversion computed new tensors from: BatchNorm folded into its layer (from the
  layer's parameters and the running statistics) and BatchNorm's scale and shift, kept while
  their sources' version counters stand still. A forward in training mode updates the running
  statistics inside the kernel without counting their versions; BatchNorm's forward then counts
  the batch in ``num_batches_tracked`` in place, whose version is compared. (A norm module
  without that counter has its statistics compared by value.)

:class:`ModelSnapshot` records these at conversion and names the first that changed; the
explainer then converts the model again before it runs (:meth:`fxlrp.explain.explainer.Explainer.follow_model`).
Checking compares each table at once, so that it costs a small part of a millisecond for a
ResNet-50 (151 modules, running statistics included), and reads no tensor values: on a GPU,
no synchronisation.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain, repeat
from operator import attrgetter, is_
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

_PLAIN = (bool, int, float, str, type(None))
_MISSING = object()
_VERSION = attrgetter("_version")


def _is_plain(value: Any) -> bool:
    """A value torch.fx writes into the graph when the forward reads it (a number, a flag, a
    tuple of them such as a kernel size)."""
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(item, _PLAIN) for item in value))


def _same(current: Any, recorded: Any) -> bool:
    return current is recorded or (type(current) is type(recorded) and _is_plain(recorded) and current == recorded)


def _flat(tensors: list[Tensor]) -> dict[tuple[torch.device, torch.dtype], Tensor]:
    """The tensors' values in one vector per device and dtype (one comparison, one device
    synchronisation)."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor.detach().reshape(-1))
    return {group: torch.cat(values) for group, values in groups.items()}


class ModelSnapshot:
    """The model's objects, plain attributes and derived-from values at conversion.

    ``derived_from``: modules whose parameters and buffers the conversion computed new tensors
    from (the layers BatchNorm was folded into, and those BatchNorms).

    Checked at every explanation, so laid out for a check made of C loops: the tables of
    submodules, parameters, buffers and hooks (most of them empty: the hooks of nearly every
    module) are compared by their lengths, their keys and, by identity, their values, all tables
    at once; attributes by identity first (unchanged, they are the same objects)."""

    def __init__(self, model: nn.Module, derived_from: Iterable[nn.Module] = ()) -> None:
        self.tables: list[dict[str, Any]] = []
        attributes: list[tuple[nn.Module, dict[str, Any], str, Any]] = []
        statistics: list[Tensor] = []
        storages: list[tuple[Tensor, int]] = []
        counted: list[Tensor] = []
        for module in model.modules():
            for table in (module._modules, module._parameters, module._buffers, module._forward_hooks,
                          module._forward_pre_hooks):
                self.tables.append(table)
            held = (*module._parameters.values(), *module._buffers.values())
            storages.extend((tensor, tensor.data_ptr()) for tensor in held if tensor is not None)
            for name, value in vars(module).items():
                # (``training`` aside: explanations use inference semantics whatever it says)
                if not name.startswith("_") and name != "training" and (isinstance(value, Tensor) or _is_plain(value)):
                    attributes.append((module, vars(module), name, value))
            if isinstance(module, _NormBase) and module.running_mean is not None:
                running = [tensor for tensor in (module.running_mean, module.running_var) if tensor is not None]
                counter = getattr(module, "num_batches_tracked", None)
                if isinstance(counter, Tensor):
                    counted.extend((*running, counter))
                else:
                    statistics.extend(running)
        self.lengths = list(map(len, self.tables))
        self.filled = [table for table in self.tables if table]
        self.names = list(chain.from_iterable(self.filled))
        self.values = [value for table in self.filled for value in table.values()]
        self.attributes = attributes
        self.attribute_values = [value for *_, value in attributes]
        self.attribute_tables = [table for _, table, _, _ in attributes]
        self.attribute_names = [name for _, _, name, _ in attributes]
        self.versioned = [tensor for module in derived_from
                          for tensor in (*module._parameters.values(), *module._buffers.values()) if tensor is not None]
        self.versioned += counted
        self.versions = list(map(_VERSION, self.versioned))
        self.stored = [tensor for tensor, _ in storages]
        self.addresses = [address for _, address in storages]
        self.statistics = statistics
        self.statistics_values = _flat(statistics) if statistics else {}

    def change(self) -> str | None:
        """What changed since the snapshot, in the user's terms; None if nothing did."""
        # (each comparison one C loop over all the model's tables, tensors or attributes - ``map``
        # of a builtin -, the tables' lengths first: a table filled or emptied since is not among ``filled``)
        if (list(map(len, self.tables)) != self.lengths or list(chain.from_iterable(self.filled)) != self.names
                or not all(map(is_, chain.from_iterable(map(dict.values, self.filled)), self.values))):
            return "a submodule, parameter, buffer or forward hook of the model was replaced, added or removed"
        if list(map(Tensor.data_ptr, self.stored)) != self.addresses:
            return "a parameter or buffer of the model was given new storage"
        current = list(map(dict.get, self.attribute_tables, self.attribute_names, repeat(_MISSING)))
        if not all(map(is_, current, self.attribute_values)):
            for now, (module, _, name, value) in zip(current, self.attributes, strict=True):
                if not _same(now, value):
                    return f"the attribute {name!r} of a {type(module).__name__} changed"
        if list(map(_VERSION, self.versioned)) != self.versions:
            return "parameters that BatchNorm was folded into, or BatchNorm's running statistics, changed"
        if self.statistics:
            current_values = _flat(self.statistics)
            if any(not torch.equal(current_values[group], values) for group, values in self.statistics_values.items()):
                return "BatchNorm's running statistics changed"
        return None
