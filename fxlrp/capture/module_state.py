"""What a model's forward writes into its own modules, taken back.

A forward may write into its modules: timm's LeViT caches its attention biases in a dict
(``self.attention_bias_cache[device] = ...``), other models count calls or keep the last output,
``nn.LSTM`` rebuilds its list of flat weights when its parameters are swapped. fxlrp runs
forwards the user did not ask for - symbolically when it captures, eagerly when it explains a
part torch.fx cannot trace - and the user's model must come out of either as it went in.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn

_CONTAINERS = (dict, list, set)

MODEL_WRITES = threading.RLock()
"""Held while fxlrp writes into a user's model for the time of a run and puts it back (a part run
eagerly: detached parameter twins, evaluation mode; a capture's trace) and while it checks the
model for the user's changes (:meth:`fxlrp.explain.explainer.Explainer.follow_model`). Two threads would
otherwise interleave their writes and restores (one restoring the other's twins as the model's
parameters), and a check on one thread would take another's twins for a replaced parameter and
convert again mid-run. Parts run eagerly of explanations on several threads run one at a time;
captured graphs run in parallel."""


class ModuleState:
    """The attributes of every module of ``model`` and the contents of their containers, as they are now.

    The containers are the dicts, lists and sets among the attributes; :meth:`restore` puts
    everything back.

    A forward may write into its modules: timm's LeViT caches its attention biases in a dict
    (``self.attention_bias_cache[device] = ...``), other models count calls or keep the last
    output. Traced, such writes store symbolic values (fx Proxies) in the user's model, and torch.fx
    itself stores tensor constants on the root. Containers are restored in place, so that other
    references to them see their old contents; one level deep (a dict of lists is restored as a
    dict, its lists as they are).

    Parameters
    ----------
    model : nn.Module
        The model, whose modules are recorded.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = _modules_of(model)
        self.attributes = [dict(vars(module)) for module in self.modules]
        # This runs around every run of an eager part (about fifteen containers per module, most
        # of them torch's empty hook dicts): empty containers are only checked for staying empty,
        # and comparisons are made by identity in C (map(operator.is_, ...)), not in Python loops.
        # (A container two modules share is listed twice: restoring it twice is restoring it.)
        containers = [value for value in chain.from_iterable(map(dict.values, self.attributes))
                      if isinstance(value, _CONTAINERS)]
        self.empty = [value for value in containers if not value]
        self.contents = [(value, _shallow_copy(value)) for value in containers if value]

    def restore(self) -> dict[str, Any]:
        """Put every module's attributes and containers back.

        Returns
        -------
        dict of str to Any
            The attributes the root gained meanwhile (torch.fx's constants among them).
        """
        added = {name: value for name, value in vars(self.model).items() if name not in self.attributes[0]}
        for module, before in zip(self.modules, self.attributes, strict=True):
            now = vars(module)
            if now.keys() == before.keys() and all(map(operator.is_, now.values(), before.values())):
                continue
            for name in [name for name in now if name not in before]:
                del now[name]
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    now[name] = value
        if any(self.empty):
            for container in self.empty:
                container.clear()
        for container, contents in self.contents:
            if _same_contents(container, contents):
                continue
            container.clear()
            if isinstance(container, list):
                container.extend(contents)
            else:
                container.update(contents)
        return added


def checkpoints_itself(module: nn.Module) -> bool:
    """Whether ``module`` checkpoints its own forward in training, as Hugging Face transformers'
    layers do once ``model.gradient_checkpointing_enable()`` has set their ``gradient_checkpointing``
    flag and checkpointing function (``_gradient_checkpointing_func``).

    Parameters
    ----------
    module : nn.Module
        A module of the user's model.

    Returns
    -------
    bool
        True if its user asked for its activations to be recomputed in backward.
    """
    return getattr(module, "gradient_checkpointing", False) is True and callable(
        getattr(module, "_gradient_checkpointing_func", None))


def in_evaluation_mode(modules: list[nn.Module], checkpointing_kept: bool = False) -> None:
    """Put modules in evaluation mode for one run, which :meth:`ModuleState.restore` ends.

    Explanations use inference semantics (no dropout, drop path or attention dropout;
    BatchNorm's running statistics), whatever mode the model is in.

    Parameters
    ----------
    modules : list of nn.Module
        The modules (a :class:`ModuleState`'s ``modules``).
    checkpointing_kept : bool
        Put modules that :func:`checkpoints_itself` in training mode instead, whatever their mode,
        so that such a layer calls ``torch.utils.checkpoint`` as it does in training (which an
        explanation run eagerly honours, :mod:`fxlrp.eager.interpret`): its user asked for its
        activations to be recomputed. The flag decides nothing else in such a layer's own code
        (dropout is the identity in an explanation), and its children are in evaluation mode.
    """
    for module in modules:
        if checkpointing_kept and checkpoints_itself(module):
            module.training = True
        elif module.training:
            module.training = False


@contextmanager
def parameters_detached(module: nn.Module, evaluation: bool) -> Iterator[None]:
    """While active, ``module``'s parameters and buffers that require gradients are detached twins
    (shared storage); on exit the module is given back as it was (its parameters, and what ran in
    the meantime wrote into it).

    Parameters
    ----------
    module : nn.Module
        The user's module.
    evaluation : bool
        Whether to put it in evaluation mode (:func:`in_evaluation_mode`, layers that checkpoint
        themselves in training mode).

    Yields
    ------
    None
    """
    with MODEL_WRITES:
        written = ModuleState(module)
        try:
            _detach_parameters(written.modules)
            if evaluation:
                in_evaluation_mode(written.modules, checkpointing_kept=True)
            yield
        finally:
            written.restore()


def run_with_detached_parameters(module: nn.Module, args: tuple, kwargs: dict[str, Any], evaluation: bool) -> Any:
    """Run ``module`` with detached twins of its parameters and buffers that require gradients,
    the module given back as it was (its parameters, and what its forward writes into it).

    Parameters
    ----------
    module : nn.Module
        The user's module.
    args : tuple
        Its positional arguments.
    kwargs : dict of str to Any
        Its keyword arguments.
    evaluation : bool
        Whether to run it in evaluation mode (:func:`parameters_detached`).

    Returns
    -------
    Any
        The module's output.
    """
    with parameters_detached(module, evaluation):
        return module(*args, **kwargs)


def _detach_parameters(modules: list[nn.Module]) -> None:
    """Put detached twins (shared storage) in the place of the modules' parameters and buffers
    that require gradients, for one run: they carry no relevance and get no gradient. Tied
    parameters get one twin, so they stay tied. The caller's :class:`ModuleState` puts the
    originals back. (What ``torch.func.functional_call`` does, at a small part of its cost: it
    runs at every run of an eager part, and parameters that require no gradient are left alone.)

    A parameter's twin is a parameter of its class that requires no gradient, not a plain tensor:
    code run around the forward reads the class of what it finds in a module's parameters and
    builds its like - accelerate's offloading hooks load each weight as ``type(old)(new,
    requires_grad=old.requires_grad)`` and put it back the same way."""
    twins: dict[int, Tensor] = {}
    for module in modules:
        swapped = False
        for tensors in (module._parameters, module._buffers):
            for name, value in tensors.items():
                if value is not None and value.requires_grad:
                    twin = twins.get(id(value))
                    if twin is None:
                        twin = twins[id(value)] = _twin(value)
                    tensors[name] = twin
                    swapped = True
        if swapped and isinstance(module, nn.RNNBase):
            # A recurrent layer hands its kernel its own list of its parameters, made when they
            # are set: made again from the twins (ModuleState puts the module's list back).
            module._init_flat_weights()


def _twin(value: Tensor) -> Tensor:
    """``value`` detached (shared storage); a parameter stays a parameter of its class, with its
    attributes (a copy of its ``__dict__``: code that writes into the twin's leaves the original's)."""
    if not isinstance(value, nn.Parameter):
        return value.detach()
    twin = torch.Tensor._make_subclass(type(value), value, False)  # (it detaches: shared storage, no history)
    if value.__dict__:
        twin.__dict__.update(value.__dict__)
    return twin



_MISSING = object()


def _modules_of(model: nn.Module) -> list[nn.Module]:
    """``model`` and every module inside it, once each (``model.modules()`` without the qualified
    names it builds and discards: this runs at every run of an eager part)."""
    found = {id(model): model}
    pending = [model]
    while pending:
        for child in pending.pop()._modules.values():
            if child is not None and id(child) not in found:
                found[id(child)] = child
                pending.append(child)
    return list(found.values())


def _shallow_copy(container: dict | list | set) -> dict | list | set:
    """The container's contents (a plain dict, list or set; restoring puts them back into the
    container itself). Not ``copy.copy``, which rebuilds an OrderedDict through its pickling
    protocol, several times slower than ``dict(...)``; this copies about fifteen containers per
    module at every run of an eager part."""
    if isinstance(container, dict):
        return dict(container)
    return list(container) if isinstance(container, list) else set(container)


def _same_contents(container: dict | list | set, contents: dict | list | set) -> bool:
    """Whether ``container`` holds the same objects (by identity) as ``contents``."""
    if len(container) != len(contents):
        return False
    if isinstance(container, dict):
        return container.keys() == contents.keys() and all(map(operator.is_, container.values(), contents.values()))
    if isinstance(container, list):
        return all(map(operator.is_, container, contents))
    return {id(value) for value in container} == {id(value) for value in contents}
