"""Parts run eagerly, replayed as recorded graphs for input signatures they meet again.

A part torch.fx cannot trace runs its module's code under the relevance mode, which pays Python
at every torch call of every explanation. When a part meets an input signature
(:func:`signature`: the tensors' shapes, strides, dtypes, devices and whether they carry
relevance, every other argument's value, and whether relevance travels in the gradient form,
where layers and sums are plain calls) for the second time, its run is recorded into a graph
(:mod:`fxlrp.eager.record`), which goes through the same pipeline as a captured graph -
canonicalise, the composite's rules, rewrite - and later runs of that signature run the
rewritten graph. A run the recording refuses (Python read values of the
run, see :mod:`fxlrp.eager.record`), and a graph with an operation the rewrite has no rule for, keep
running eagerly: the relevance mode then decides per call, and names or warns as it does.
Recorded graphs are kept for :data:`KEPT` signatures per part (the most recently used).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, fx, nn

from fxlrp.capture import RelevanceTracer, call_beyond_forward, first_line
from fxlrp.eager.interpret import intercepted_functions
from fxlrp.eager.record import CONSTANT_TYPES, Recording, RecordingFailed, record
from fxlrp.eager.runner import LayerRunner
from fxlrp.graph.canonicalise import canonicalise
from fxlrp.graph.rewrite import RewriteOptions, Rewriter
from fxlrp.registry import REGISTRY
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_form_active

KEPT = 8
"""Recorded graphs kept per part run eagerly."""


def signature(leaves: list[Any], spec: pytree.TreeSpec) -> Hashable | None:
    """What a recorded graph of a call with these arguments is valid for.

    Parameters
    ----------
    leaves : list
        The arguments' leaves, from ``pytree.tree_flatten((args, kwargs))``.
    spec : pytree.TreeSpec
        Their structure.

    Returns
    -------
    hashable or None
        The signature; None when an argument is not a value a signature can hold (an object, a
        cache).
    """
    described: list[Hashable] = [spec, torch.is_grad_enabled(), torch.get_default_dtype(), gradient_form_active()]
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            described.append((leaf.shape, leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad))
        elif isinstance(leaf, CONSTANT_TYPES):
            described.append((type(leaf), leaf))
        else:
            return None
    try:
        key = tuple(described)
        hash(key)
    except TypeError:
        return None
    return key


@dataclass
class Replay:
    """A recorded run rewritten with the conversion's rules."""

    graph_module: fx.GraphModule
    """The rewritten graph."""
    recording: Recording
    """The recording, which rebuilds the result from the graph's output."""

    def __call__(self, tensors: list[Tensor]) -> Any:
        """The result for a call whose arguments hold ``tensors``.

        Parameters
        ----------
        tensors : list of Tensor
            The tensors among the call's arguments, in pytree order.

        Returns
        -------
        Any
            The result, as the part's forward would return it.
        """
        return self.recording.rebuild(self.graph_module(*tensors))


class Recordings:
    """The recorded graphs of one part run eagerly, by signature (see the module)."""

    def __init__(self) -> None:
        self.replays: OrderedDict[Hashable, Replay] = OrderedDict()
        self.seen: OrderedDict[Hashable, None] = OrderedDict()
        self.refused: dict[Hashable, str] = {}
        self.lock = threading.Lock()

    def summary(self) -> str:
        """What :meth:`fxlrp.explain.explainer.Explainer.report` says of this part.

        Returns
        -------
        str
            The signatures it replays, and why the others run eagerly (each reason once).
        """
        with self.lock:
            sizes = [len(replay.graph_module.graph.nodes) for replay in self.replays.values()]
            reasons = list(dict.fromkeys(self.refused.values()))
        said = (f"{len(sizes)} input signature(s) replayed as recorded graphs ({', '.join(map(str, sizes))} nodes)"
                if sizes else "no recorded graph")
        if reasons:
            said += (f"; {len(self.refused)} signature(s) run eagerly, not recorded: "
                     + "; ".join(reasons))
        return said

    def replay_for(self, call: RelevanceCall, runner: LayerRunner, args: tuple,
                   kwargs: dict) -> Callable[[], Any] | None:
        """This call run by the replay of its signature.

        Parameters
        ----------
        call : RelevanceCall
            The part's call (its composite rewrites the recorded graph).
        runner : LayerRunner
            The part's runner.
        args : tuple
            Positional arguments.
        kwargs : dict
            Keyword arguments.

        Returns
        -------
        callable or None
            Runs the replay of the signature (kept, or recorded at the signature's second call);
            None where the call is to run eagerly.
        """
        leaves, spec = pytree.tree_flatten((args, kwargs))  # (once per call: the signature and the replay's inputs)
        replay = self._replay(call, runner, args, kwargs, signature(leaves, spec))
        return None if replay is None else partial(replay, [leaf for leaf in leaves if isinstance(leaf, Tensor)])

    def _replay(self, call: RelevanceCall, runner: LayerRunner, args: tuple, kwargs: dict,
                key: Hashable | None) -> Replay | None:
        if key is None or call.composite is None:
            return None
        with self.lock:
            replay = self.replays.get(key)
            if replay is not None:
                self.replays.move_to_end(key)
                return replay
            if key in self.refused:
                return None
            if key not in self.seen:  # a signature met once is run eagerly: recording costs a run
                self.seen[key] = None
                if len(self.seen) > 4 * KEPT:
                    self.seen.popitem(last=False)
                return None
        try:
            replay = _recorded(call, runner, args, kwargs)
        except Exception as refusal:  # noqa: BLE001 - whatever stops a recording, the run is explained eagerly
            # (RecordingFailed: the run depends on more than its signature; UnsupportedOperationError:
            # the relevance mode names or warns about the operation itself)
            with self.lock:
                self.refused[key] = _reason(refusal)
                if len(self.refused) > 4 * KEPT:
                    del self.refused[next(iter(self.refused))]
            return None
        with self.lock:
            self.replays[key] = replay
            if len(self.replays) > KEPT:
                self.replays.popitem(last=False)
        return replay


def _is_explained(module: nn.Module) -> bool:
    return REGISTRY.for_module(module) is not None


def _leaf_modules() -> Callable[[nn.Module, str], bool]:
    """Which modules are single nodes of a recorded graph: those capture's tracer keeps whole,
    unless their call does more than their ``forward`` (a hook, a parametrization), whose work
    is then recorded as it runs."""
    tracer = RelevanceTracer(_is_explained)

    def is_leaf(module: nn.Module, name: str) -> bool:
        return tracer.is_leaf_module(module, name) and call_beyond_forward(module) is None

    return is_leaf


def _reason(refusal: Exception) -> str:
    """Why a signature is not recorded, for the report: a recording's own reason whole, on one line
    (it ends with the model's file, line and code that caused it, which cutting it at its first
    line would lose);
    any other error's first line."""
    if isinstance(refusal, RecordingFailed):  # (its message says why in the model's terms)
        return ": ".join(line.strip() for line in str(refusal).strip().splitlines())
    return first_line(refusal)


def _recorded(call: RelevanceCall, runner: LayerRunner, args: tuple, kwargs: dict) -> Replay:
    """Record ``runner``'s run on these arguments and rewrite the graph with ``call``'s composite,
    as the relevance mode would explain the run: the same rules, first layers only where the
    part holds them, relevance starting where the run's inputs carry it and at embedding lookups."""
    site = call.site
    prefix = site.module_name if site is not None and site.module_name else ""
    recording = record(runner.module, prefix, _leaf_modules(), intercepted_functions(),
                       runner, args, kwargs)
    graph, root = recording.graph, recording.root
    modules = dict(root.named_modules())
    in_place_modules = canonicalise(graph, modules)
    carrying_inputs = {
        node.name: leaf.requires_grad
        for node, leaf in zip(graph.find_nodes(op="placeholder"),
                              (leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, Tensor)),
                              strict=True)
    }
    options = RewriteOptions(strict=True, warn_lost_relevance=call.warn_lost_relevance, input_relevance=carrying_inputs,
                             first_layer=site is not None and site.is_first_layer, named_nodes=False,
                             gradient_form=gradient_form_active())
    rewriter = Rewriter(root, graph, call.composite, options, in_place_modules=in_place_modules, modules=modules)
    return Replay(rewriter.run(), recording)
