r"""Conditional relevance (Concept Relevance Propagation, Achtibat et al., Nature Machine
Intelligence 2023) for any model :func:`fxlrp.convert` explains, with zennit-crp's conditions.

**Conditions.** A condition is a dict ``{site: concept indices, ..., "y": classes}``: each site
(a node of ``explain.report()`` or a module's qualified name, :mod:`fxlrp.concepts.sites`) with
the indices of the concepts kept there (channels, neurons, heads: :mod:`fxlrp.concepts.concept`),
and optionally the explained classes under ``"y"``.

**Masked relevance.** LRP computes the relevance of the inputs by a backward pass: with the
forward pass fixed, the relevance reaching a node's output ``z`` (summed over its consumers) is
shared among the node's inputs by the node's rule, linearly. A condition multiplies the
relevance reaching the output of each of its sites by the mask of its concepts,

    R(z) <- m_S * R(z),   m_S = 1 at the positions of the concepts in S, 0 elsewhere,

before the rule of the node that computed ``z`` shares it, and starts from the relevance of its
classes at the output, ``R(y) = y * 1[class in "y"]`` (without ``"y"``: ``target``, as in
:func:`fxlrp.attribute`). The conditional heatmap is the relevance that reaches the inputs;
recorded nodes get what reaches their output, after their own mask.

**Parallel paths** (``exclude_parallel=True``, zennit-crp's default). Relevance that goes around a
site (a residual connection past it) is not restricted by the site's mask. With
``exclude_parallel`` the backward pass instead runs from the output to the first site (nearest the
output), from there, masked, to the next, and so on, and from the last site to the inputs: only
relevance that passed every site of the condition, masked, reaches the inputs. For a site that is a
cut of the graph (every path from the inputs to the output passes it: a layer of a VGG, a residual
block's output) both give the same. Conservation follows from linearity: over a partition of the
concepts of a site into sets ``S_1, ..., S_n``, ``sum_i R(x | S_i) = R(x | all concepts)``, the
unconditional relevance where the site is a cut.

**Start at a node** (``start=``, zennit-crp's ``start_layer``): the backward pass begins at a
node's output with its activation as relevance, ``R(z) = z`` (masked by the condition's concepts
there): the concept's own heatmap, independent of any class.

**Batching.** ``repeat=0``: one forward pass, then one backward pass per condition (right for every
model, a graph network's nodes included). ``repeat=n``: the inputs are repeated ``n`` times along
their first dimension and ``n`` conditions share each backward pass, copy ``j`` masked for
condition ``j`` (zennit-crp's ``CondAttribution.generate``), for models whose first dimension is
the batch. Conditions that name different sites run in separate forward passes where
``exclude_parallel`` needs it (one per set of sites).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, get_gradient_edge

from fxlrp.concepts.concept import ChannelConcept, Concept, concept_relevance
from fxlrp.concepts.sites import OUTPUT, Site, outputs_observed, resolve
from fxlrp.explain.attribute import InputRelevance, Inputs, attribute_nodes, inputs_by_position
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.targets import default_output, output_relevance, padding_mask

Condition = Mapping[str, Any]
"""``{site: concept indices (an int, a list of ints, or a mask tensor), "y": classes}``."""


@dataclass
class ConditionalRelevance:
    """What :func:`conditional_relevance` returns; the first dimension of every relevance is the
    condition, in the order given.

    ``heatmap``: the inputs' relevance, ``[conditions, *input.shape]`` per input, as
    :func:`fxlrp.attribute` gives it (a tuple or dict for several inputs, None for inputs without
    relevance, one value per token for token ids). ``relevance``: for each recorded site (by the
    name given), the relevance reaching its output, ``[conditions, *output.shape]`` (after the
    site's own mask where the condition names it). ``activation``: each recorded site's output
    (the forward pass is the same for every condition). ``concepts``: the concepts of each site
    named in ``concepts=`` (:meth:`concept_relevance` takes them).
    """

    heatmap: InputRelevance
    relevance: dict[str, Tensor]
    activation: dict[str, Tensor]
    conditions: list[dict[str, Any]]
    concepts: dict[str, Concept] = field(default_factory=dict)

    def concept_relevance(self, site: str, concept: Concept | None = None, abs_norm: bool = False) -> Tensor:
        r"""The relevance of each concept of a recorded site, per condition and sample.

        ``R_c = sum over the positions of concept c of R``; with ``abs_norm``, divided by
        ``sum_c |R_c| + 1e-10`` (zennit-crp's ``ChannelConcept().attribute(relevance, abs_norm=True)``).

        Parameters
        ----------
        site : str
            A name given in ``record=``.
        concept : Concept, optional
            The concepts; by default those given for the site in ``concepts=``, else channels
            (dimension 1).
        abs_norm : bool, default False
            Normalise by the sum of absolute values per sample.

        Returns
        -------
        Tensor
            ``[conditions, batch, concepts]``.
        """
        if site not in self.relevance:
            raise KeyError(f"{site!r} was not recorded; pass record=[{site!r}, ...] (recorded: "
                           f"{', '.join(map(repr, self.relevance)) or 'none'})")
        concept = concept or self.concepts.get(site) or ChannelConcept()
        return concept_relevance(self.relevance[site], concept, abs_norm=abs_norm, batch_dim=1)


def conditional_relevance(
    explain: Explainer,
    inputs: Inputs,
    conditions: Sequence[Condition] | Condition,
    *,
    record: Sequence[str] = (),
    concepts: Concept | Mapping[str, Concept] | None = None,
    target: Any = None,
    start: str | None = None,
    exclude_parallel: bool = True,
    repeat: int = 0,
    output: Callable[[Any], Tensor] | None = None,
    check_finite: bool = True,
) -> ConditionalRelevance:
    r"""Relevance of the inputs (and of recorded nodes) restricted to concepts of chosen nodes.

    For each condition ``{site: ids, ..., "y": classes}`` the relevance reaching each named site's
    output is multiplied by the mask of its concepts ``ids``, ``R(z) <- m_ids * R(z)``, and the
    explanation starts from ``R(y) = y * 1[class in classes]`` at the output (see
    :mod:`fxlrp.concepts.conditional` for parallel paths and batching). With masks of all ones
    this is :func:`fxlrp.attribute_nodes`; everything else (rules, token ids, inputs given by name,
    checks) is the same.

    Parameters
    ----------
    explain : Explainer
        The explainer :func:`fxlrp.convert` returned (either capture path).
    inputs : Tensor, sequence or mapping
        The model's inputs, as :func:`fxlrp.attribute` takes them.
    conditions : sequence of dict, or one dict
        Conditions, e.g. ``[{"features.40": [12], "y": [1]}, {"features.40": [3, 5]}]``. A site is a
        row of ``explain.report()`` or a module's qualified name; its value the concept indices
        (an int or a list of ints; or a tensor, the mask itself, broadcast over the node's output
        per sample, or of the output's whole shape: one mask per sample). ``"y"``: the classes
        explained (an int or a list: their relevances summed).
    record : sequence of str, optional
        Sites whose relevance (and activation) to return.
    concepts : Concept or dict of str to Concept, optional
        What a site's indices mean: one :class:`~fxlrp.concepts.Concept` for all sites, or one
        per site name; ``ChannelConcept()`` (dimension 1) where none is given.
    target : optional
        What conditions without ``"y"`` explain: :func:`fxlrp.attribute`'s single ``target``
        (None: each sample's predicted class).
    start : str, optional
        Start the backward pass at this site's output with its activation as relevance
        (zennit-crp's ``start_layer``); conditions may not name ``"y"`` then.
    exclude_parallel : bool, default True
        Let only relevance that passed every site of a condition reach the inputs.
    repeat : int, default 0
        Conditions per backward pass, by repeating the inputs along their first dimension (for
        models whose first dimension is the batch); 0: one backward pass per condition.
    output : callable, optional
        Picks the tensor to explain from the model's output, as in :func:`fxlrp.attribute`.
    check_finite : bool, default True
        NaN or Inf in an input, the output or any relevance is an error (as in :func:`fxlrp.attribute`).

    Returns
    -------
    ConditionalRelevance
        Heatmaps ``[conditions, *input.shape]``, recorded relevances and activations.

    Raises
    ------
    ValueError
        For a site that names nothing, runs several times in one forward pass or carries no
        relevance; a concept index out of range; sites of one condition on parallel branches
        with ``exclude_parallel``; non-finite relevance.
    TypeError
        For an explainer not made by :func:`fxlrp.convert` or conditions of the wrong kind.
    """
    if not isinstance(explain, Explainer):
        raise TypeError("conditional_relevance needs the explainer returned by fxlrp.convert")
    if isinstance(target, list):
        raise TypeError("target is one target for every condition; explain several classes with conditions "
                        "naming them, e.g. [{..., 'y': [3]}, {..., 'y': [5]}]")
    if isinstance(record, str):
        record = [record]
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 0:
        raise ValueError(f"repeat must be an int >= 0 (conditions per backward pass), got {repeat!r}")
    given = _normalised(conditions)
    if start is not None and any(OUTPUT in condition for condition in given):
        raise ValueError(f"start={start!r} begins the backward pass at that node, so a condition's {OUTPUT!r} would "
                         f"have no effect: leave {OUTPUT!r} out of the conditions, or start=None")
    explainer = explain.explainer_for(*_positional(explain, inputs))[0]
    sites: dict[str, Site] = {}
    canonical: dict[str, str] = {}
    for key in [*(key for condition in given for key in condition if key != OUTPUT), *record,
                *([start] if start is not None else [])]:
        if key not in canonical:
            site = resolve(explainer, key)
            name = _canonical_name(site)
            canonical[key] = name
            sites.setdefault(name, site)
    concept_of = _concepts(concepts, canonical)
    masks = [_canonical_condition(condition, canonical) for condition in given]
    groups = _groups(masks, canonical.get(start) if start is not None else None, exclude_parallel)
    copies = repeat if repeat > 0 else 1
    found: list[Any] = [None] * len(masks)
    recorded: dict[str, list[Tensor | None]] = {canonical[key]: [None] * len(masks) for key in record}
    activation: dict[str, Tensor] = {}
    for indices in groups:
        run = _Run(explain, inputs, [masks[index] for index in indices], sites, concept_of, set(recorded),
                   min(copies, len(indices)), target, canonical.get(start) if start is not None else None,
                   exclude_parallel, output)
        heatmaps, relevances = run.run_passes(explainer, check_finite)
        for position, index in enumerate(indices):
            found[index] = heatmaps[position]
            for name in recorded:
                recorded[name][index] = relevances[name][position]
        activation.update(run.activations(recorded))
    heatmap = _stacked(found)
    relevance = {key: torch.stack(recorded[canonical[key]]) for key in record}  # type: ignore[arg-type]
    if check_finite:
        for key, value in relevance.items():
            if not torch.isfinite(value).all():
                raise ValueError(f"the relevance at {key!r} is not finite (NaN or Inf): a rule's quotient overflowed; "
                                 "explain in float32 or float64, or with a larger epsilon")
    return ConditionalRelevance(
        heatmap, relevance, {key: activation[canonical[key]] for key in record}, [dict(c) for c in given],
        {key: concept_of.get(name, ChannelConcept()) for key, name in canonical.items()},
    )


def _positional(explain: Explainer, inputs: Inputs) -> tuple[Any, ...]:
    """The inputs by position, as :func:`fxlrp.attribute` passes them to the explainer."""
    if isinstance(inputs, Tensor):
        return (inputs,)
    if isinstance(inputs, Mapping):
        return inputs_by_position(explain, inputs)[0]
    return tuple(inputs)


def _canonical_name(site: Site) -> str:
    """One name per place: the graph node's, or the module path inside a part run eagerly."""
    return site.node if site.node is not None else site.key


def _normalised(conditions: Sequence[Condition] | Condition) -> list[dict[str, Any]]:
    """Conditions as dicts of lists of ints (or mask tensors); errors for anything else."""
    if isinstance(conditions, Mapping):
        conditions = [conditions]
    if isinstance(conditions, (str, bytes)) or not isinstance(conditions, Sequence) or not conditions:
        raise TypeError(f"conditions must be a non-empty list of dicts such as [{{'features.40': [12], 'y': [1]}}], "
                        f"got {conditions!r}")
    found = []
    for condition in conditions:
        if not isinstance(condition, Mapping):
            raise TypeError(f"each condition is a dict {{site: concept indices, 'y': classes}}, got {condition!r}")
        found.append({key: _indices(key, value) for key, value in condition.items()})
    return found


def _indices(key: Any, value: Any) -> Any:
    if not isinstance(key, str):
        raise TypeError(f"a condition's keys are node or module names (str) or {OUTPUT!r}, got {key!r}")
    if isinstance(value, Tensor) and (value.is_floating_point() or value.dtype == torch.bool):
        if key == OUTPUT:
            raise TypeError(f"{OUTPUT!r} takes class indices, not a mask tensor")
        return value
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and value and all(
            isinstance(index, int) and not isinstance(index, bool) for index in value):
        return list(dict.fromkeys(value))
    raise TypeError(f"condition {key!r}: {value!r} is no list of concept indices (ints, at least one) or mask tensor")


def _concepts(concepts: Concept | Mapping[str, Concept] | None, canonical: Mapping[str, str]) -> dict[str, Concept]:
    """The concept of each site, by canonical name."""
    if concepts is None:
        return {}
    if isinstance(concepts, Concept):
        return {name: concepts for name in canonical.values()}
    if not isinstance(concepts, Mapping):
        raise TypeError(f"concepts must be a Concept or a dict of site name to Concept, got {concepts!r}")
    found: dict[str, Concept] = {}
    for key, concept in concepts.items():
        if not isinstance(concept, Concept):
            raise TypeError(f"concepts[{key!r}] must be a Concept (ChannelConcept(), NeuronConcept(), "
                            f"HeadConcept(heads)), got {concept!r}")
        if key not in canonical:
            raise ValueError(f"concepts names {key!r}, which no condition or record names")
        found[canonical[key]] = concept
    return found


def _canonical_condition(condition: Mapping[str, Any], canonical: Mapping[str, str]) -> dict[str, Any]:
    """A condition keyed by canonical site names; two names of one site keep the union of their indices."""
    found: dict[str, Any] = {}
    for key, value in condition.items():
        name = OUTPUT if key == OUTPUT else canonical[key]
        if name in found:
            if isinstance(value, Tensor) or isinstance(found[name], Tensor):
                raise ValueError(f"a condition names one site twice ({key!r} is {name!r}) with a mask tensor: "
                                 "name it once")
            value = list(dict.fromkeys([*found[name], *value]))
        found[name] = value
    return found


def _groups(conditions: list[dict[str, Any]], start: str | None, exclude_parallel: bool) -> list[list[int]]:
    """Conditions explained by one forward pass: all of them, or with ``exclude_parallel`` those
    naming the same sites (the backward pass's chain of sites is the same)."""
    if not exclude_parallel:
        return [list(range(len(conditions)))]
    groups: dict[frozenset[str], list[int]] = {}
    for index, condition in enumerate(conditions):
        groups.setdefault(frozenset(key for key in condition if key not in (OUTPUT, start)), []).append(index)
    return list(groups.values())


def _stacked(found: list[Any]) -> Any:
    """Per-condition relevances of the inputs stacked along a new first dimension."""
    first = found[0]
    if isinstance(first, Tensor):
        return torch.stack(found)
    if isinstance(first, tuple):
        return tuple(_stacked([one[i] for one in found]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _stacked([one[key] for one in found]) for key in first}
    return first


class _Root(torch.autograd.Function):
    """The explained tensor handed to :func:`fxlrp.attribute_nodes`: a scalar whose backward
    ignores what reaches it and gives, at each backward pass, the pass's starting relevance (at the
    output, a start node or the last site of a chain, :meth:`_Run.injection`)."""

    @staticmethod
    def forward(ctx: Any, run: _Run, tensor: Tensor) -> Tensor:
        ctx.run = run
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _: Tensor) -> tuple[None, Tensor]:
        return None, ctx.run.injection()


@dataclass
class _Observed:
    """A site's output in the forward pass."""

    edge: GradientEdge
    """Where the relevance of the output arrives (the node that computed it)."""
    value: Tensor
    """A view of the output: its values, and a root for backward passes that start there."""
    carries: bool
    """Whether relevance can reach it."""


class _Run:
    """One forward pass and its backward passes, for a group of conditions (see the module)."""

    def __init__(self, explain: Explainer, inputs: Inputs, conditions: list[dict[str, Any]], sites: dict[str, Site],
                 concepts: dict[str, Concept], record: set[str], copies: int, target: Any, start: str | None,
                 exclude_parallel: bool, output: Callable[[Any], Tensor] | None) -> None:
        self.explain, self.conditions, self.sites, self.concepts = explain, conditions, sites, concepts
        self.record, self.copies, self.target, self.start = record, copies, target, start
        self.exclude_parallel, self.output = exclude_parallel, output
        self.passes = [list(range(first, min(first + copies, len(conditions))))
                       for first in range(0, len(conditions), copies)]
        self.batch = _batch_size(inputs) if copies > 1 else None
        self.inputs = _repeated(inputs, copies, self.batch) if copies > 1 else inputs
        self.samples = _samples(_positional(explain, self.inputs))
        self.observed: dict[str, _Observed] = {}
        self.calls: dict[str, int] = {}
        self.recorded: dict[tuple[str, int], Tensor] = {}
        self.applied: set[tuple[str, int]] = set()
        self.current = -1
        self.explained: Tensor | None = None
        self.chain: list[str] = []

    # forward

    def observe(self, site: Site, tensor: Tensor) -> Tensor | None:
        name = _canonical_name(site)
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] > 1:
            return None
        # Past any torch function mode: code run eagerly notes the views it sees taken and takes
        # them again after an in-place write into their base (fxlrp.eager.in_place.replace_values);
        # this view must keep the output as computed, and the node that computed it.
        with torch._C.DisableTorchFunction():
            if tensor.requires_grad:
                tensor.register_hook(lambda grad, name=name: self._arrived(name, grad))
                self.observed[name] = _Observed(get_gradient_edge(tensor), tensor.view_as(tensor), True)
            else:
                self.observed[name] = _Observed(None, tensor.detach(), False)  # type: ignore[arg-type]
            if name == self.start and tensor.requires_grad:
                # The start's relevance, its activation, also reaches positions an activation after it
                # blocks (a ReLU's negative inputs): its readers get a view, so that no ReLU hands the
                # rule that computed it its own output as the denominator (equal only where it passes).
                return tensor.view_as(tensor)
        return None

    def pick(self, result: Any) -> Tensor:
        """``output=`` of :func:`fxlrp.attribute_nodes`: the model's explained output is kept,
        the sites checked and ordered, and the scalar root of the backward passes returned."""
        if self.output is not None:
            explained = self.output(result)
        else:
            explained = default_output(result, padding_mask(self.explain, _positional(self.explain, self.inputs)))
        if not isinstance(explained, Tensor):
            raise TypeError(f"the model returns {type(explained).__name__}; pass output=... to pick the tensor to "
                            "explain")
        self.explained = explained
        for name, site in self.sites.items():
            if self.calls.get(name, 0) > 1:
                raise ValueError(f"{site.describe()} runs {self.calls[name]} times in one forward pass, so a "
                                 "condition on it is ambiguous: name one call (its node in explain.report()) or a "
                                 "module run once")
            if name not in self.observed:
                raise ValueError(f"{site.describe()} did not run in the explained forward pass (its module is not "
                                 "called for these inputs)")
        named = {key for condition in self.conditions for key in condition if key != OUTPUT}
        for name in sorted(named | ({self.start} if self.start else set())):
            if not self.observed[name].carries:
                raise ValueError(f"{self.sites[name].describe()} carries no relevance: no explained input reaches its "
                                 "output, so a condition there (or a start) has nothing to restrict")
        order = {name: index for index, name in enumerate(self.observed)}  # the forward's order
        if self.start is not None:
            later = sorted((name for name in named if order[name] > order[self.start]), key=order.get)
            if later:
                listed = ", ".join(self.sites[name].describe() for name in later)
                raise ValueError(f"the conditions name {listed}, which the forward pass computes after the start, "
                                 f"{self.sites[self.start].describe()}: relevance starts there and never reaches "
                                 "them; remove them or start later")
        if self.exclude_parallel:
            chain = {key for key in self.conditions[0] if key not in (OUTPUT, self.start)}
            self.chain = sorted(chain, key=lambda name: -order[name])
        if self.chain:
            root = self.observed[self.chain[-1]].value
        elif self.start is not None:
            root = self.observed[self.start].value
        else:
            root = explained
        return _Root.apply(self, root)

    # backward

    def injection(self) -> Tensor:
        """The relevance the next backward pass starts from (see :class:`_Root`)."""
        self.current += 1
        if self.start is not None:
            top: Tensor = self.observed[self.start].value
            relevance = self._blocks(top, lambda block, _: block.detach())
        else:
            top = self.explained
            relevance = self._blocks(top, self._at_output)
        for name in self.chain:
            edge = self.observed[name].edge
            (relevance,) = torch.autograd.grad(top, edge, relevance, retain_graph=True, allow_unused=True)
            if relevance is None:
                raise ValueError(
                    f"with exclude_parallel=True relevance runs through the sites of a condition one after another, "
                    f"but {self.sites[name].describe()} lies on no path from the previous one to the inputs (parallel "
                    "branches): condition on sites one above the other, or pass exclude_parallel=False")
            top = self.observed[name].value
        return relevance

    def _at_output(self, block: Tensor, condition: int) -> Tensor:
        classes = self.conditions[condition].get(OUTPUT)
        samples = self.batch if self.batch is not None else self.samples
        if classes is None:
            return output_relevance(block, self.target, samples)
        total = output_relevance(block, classes[0], samples)
        for index in classes[1:]:
            total = total + output_relevance(block, index, samples)
        return total

    def _blocks(self, tensor: Tensor, of_block: Callable[[Tensor, int], Tensor]) -> Tensor:
        """``of_block(rows of copy j, its condition)`` for each copy, zero for copies without one."""
        conditions = self.passes[self.current]
        if self.batch is None:
            return of_block(tensor, conditions[0])
        if tensor.dim() == 0 or tensor.shape[0] != self.copies * self.batch:
            raise ValueError(f"repeat={self.copies} needs a batch-first model: the explained tensor has shape "
                             f"{list(tensor.shape)}, not {self.copies * self.batch} rows (the copies of {self.batch} "
                             "samples); pass repeat=0")
        blocks = tensor.split(self.batch)
        return torch.cat([of_block(block, conditions[j]) if j < len(conditions) else torch.zeros_like(block)
                          for j, block in enumerate(blocks)])

    def _arrived(self, name: str, grad: Tensor) -> Tensor | None:
        """Tensor hook of a site's output: mask the relevance arriving there (once per pass) and record it."""
        key = (name, self.current)
        if key in self.applied or self.current < 0:
            return None
        self.applied.add(key)
        mask = self._mask(name, grad)
        if mask is not None:
            grad = grad * mask
        if name in self.record:
            self.recorded[key] = grad.detach().clone()
        return grad

    def _mask(self, name: str, grad: Tensor) -> Tensor | None:
        conditions = self.passes[self.current]
        values = [self.conditions[index].get(name) for index in conditions]
        if all(value is None for value in values):
            return None
        concept = self.concepts.get(name) or ChannelConcept()
        if self.batch is None:
            return self._one_mask(name, concept, values[0], grad.shape, grad)
        block_shape = (self.batch, *grad.shape[1:])
        ones = grad.new_ones(()).expand(block_shape)
        masks = [ones if j >= len(values) or values[j] is None
                 else self._one_mask(name, concept, values[j], block_shape, grad).expand(block_shape)
                 for j in range(self.copies)]
        return torch.cat(masks)

    def _one_mask(self, name: str, concept: Concept, value: Any, shape: Sequence[int], like: Tensor) -> Tensor:
        if isinstance(value, Tensor):
            mask = value.to(dtype=like.dtype, device=like.device)
            if tuple(mask.shape) == tuple(shape):  # one mask per sample
                return mask
            try:
                fits = torch.broadcast_shapes(mask.shape, tuple(shape[1:])) == tuple(shape[1:])
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(f"the mask tensor for {self.sites[name].describe()} has shape {list(mask.shape)}, "
                                 f"which does not broadcast to its output per sample, {list(shape[1:])}, nor is "
                                 f"one mask per sample, {list(shape)}")
            return mask
        try:
            return concept.mask(shape, value, dtype=like.dtype, device=like.device)
        except ValueError as error:
            raise ValueError(f"{self.sites[name].describe()}: {error}") from None

    # the whole

    def run_passes(self, explainer: Explainer, check_finite: bool) -> tuple[list[Any], dict[str, list[Tensor]]]:
        """Run the forward and backward passes; per condition, the inputs' relevance and the
        recorded sites' relevance."""
        with outputs_observed(explainer, list(self.sites.values()), self.observe):
            heatmaps, _ = attribute_nodes(self.explain, self.inputs, [], target=[None] * len(self.passes),
                                          output=self.pick, check_finite=check_finite)
        found: list[Any] = []
        relevances: dict[str, list[Tensor]] = {name: [] for name in self.record}
        for index, conditions in enumerate(self.passes):
            for copy in range(len(conditions)):
                found.append(_copy_of(_merged_index(heatmaps, index), copy, self.batch))
                for name in self.record:
                    value = self.recorded.get((name, index))
                    if value is None:
                        observed = self.observed[name].value
                        value = torch.zeros_like(observed)
                    found_value = value if self.batch is None else value.split(self.batch)[copy]
                    relevances[name].append(found_value)
        return found, relevances

    def activations(self, names: Sequence[str]) -> dict[str, Tensor]:
        """The recorded sites' outputs (of the first copy)."""
        found = {}
        for name in names:
            value = self.observed[name].value.detach()
            found[name] = value if self.batch is None else value[:self.batch]
        return found


def _merged_index(found: Any, index: int) -> Any:
    if isinstance(found, Tensor):
        return found[index]
    if isinstance(found, tuple):
        return tuple(_merged_index(one, index) for one in found)
    if isinstance(found, dict):
        return {key: _merged_index(one, index) for key, one in found.items()}
    return found


def _copy_of(found: Any, copy: int, batch: int | None) -> Any:
    if batch is None:
        return found
    if isinstance(found, Tensor):
        return found.split(batch)[copy]
    if isinstance(found, tuple):
        return tuple(_copy_of(one, copy, batch) for one in found)
    if isinstance(found, dict):
        return {key: _copy_of(one, copy, batch) for key, one in found.items()}
    return found


def _batch_size(inputs: Inputs) -> int:
    values = list(inputs.values()) if isinstance(inputs, Mapping) else [inputs] if isinstance(inputs, Tensor) \
        else list(inputs)
    batch = next((value.shape[0] for value in values if isinstance(value, Tensor) and value.dim() > 0), None)
    if batch is None:
        raise ValueError("repeat=... needs a tensor input whose first dimension is the batch")
    return int(batch)


def _repeated(inputs: Inputs, copies: int, batch: int | None) -> Inputs:
    """The inputs with every tensor whose first dimension is the batch repeated ``copies`` times."""

    def one(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch:
            return value.repeat(copies, *[1] * (value.dim() - 1))
        return value

    if isinstance(inputs, Tensor):
        return one(inputs)
    if isinstance(inputs, Mapping):
        return {key: one(value) for key, value in inputs.items()}
    return [one(value) for value in inputs]


def _samples(inputs: Sequence[Any]) -> int | None:
    """The batch size :func:`fxlrp.attribute` reads targets against (the first input of two or
    more dimensions)."""
    return next((value.shape[0] for value in inputs if isinstance(value, Tensor) and value.dim() > 1), None)
