"""Perturbation curves: the model's score as the features of an input are replaced by a baseline
in the order an explanation gives, batched over samples and steps.

This module holds what images, tokens and graphs share: the order of the features
(:func:`feature_ranks`), how many are perturbed at each step (:func:`step_counts`), the curves
(:class:`PerturbationCurves`) with their summaries, and the batched loop over (sample, step) rows
(:func:`score_rows`). :mod:`fxlrp.evaluate.images`, :mod:`fxlrp.evaluate.tokens` and
:mod:`fxlrp.evaluate.graphs` say what a feature is and what perturbing it means.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fxlrp.errors import FxlrpError

ORDERS = ("morf", "lerf")
"""Most relevant first, least relevant first."""
MODES = ("deletion", "insertion")
SCORES = ("logit", "probability")


class EvaluationInputError(FxlrpError, ValueError):
    """An input of a faithfulness metric that cannot be used (relevance of another shape, NaN in it,
    an unknown baseline or order); the message says which and what to do."""


@dataclass(frozen=True)
class PerturbationCurves:
    """The model's score along perturbation curves, per sample.

    Attributes
    ----------
    scores : dict[str, Tensor]
        Per order (``"morf"``: most relevant first, ``"lerf"``: least relevant first) the scores
        ``[samples, steps + 1]``: column ``j`` is the explained score (logit or probability of the
        target) after step ``j``; column 0 is the unperturbed input for deletion, the input with
        every feature perturbed for insertion. float64.
    fractions : Tensor
        ``[samples, steps + 1]``: the fraction of the sample's features perturbed (deletion) or
        restored (insertion) at each point, from 0 to 1.
    counts : Tensor
        ``[samples, steps + 1]``: the number of features perturbed (restored) at each point.
    mode : str
        ``"deletion"``: features are replaced by the baseline one after another; ``"insertion"``:
        the input starts as the baseline and its features are restored one after another.
    """

    scores: dict[str, Tensor]
    fractions: Tensor
    counts: Tensor
    mode: str

    @property
    def morf(self) -> Tensor:
        """The most-relevant-first curves ``[samples, steps + 1]``."""
        return self._order("morf")

    @property
    def lerf(self) -> Tensor:
        """The least-relevant-first curves ``[samples, steps + 1]``."""
        return self._order("lerf")

    def _order(self, order: str) -> Tensor:
        if order not in self.scores:
            raise EvaluationInputError(f"the curves were computed for orders {', '.join(self.scores)}, not "
                                       f"{order!r}; pass orders=('morf', 'lerf') to compute both")
        return self.scores[order]

    def auc(self, order: str = "morf") -> Tensor:
        r"""Area under one order's curve per sample, over the fraction of features perturbed.

        .. math:: \mathrm{AUC} = \sum_{j=0}^{L-1} (t_{j+1} - t_j)\, \frac{f_j + f_{j+1}}{2},
                  \qquad t_j = k_j / F

        (the trapezoidal rule; ``f_j`` the score after step ``j``, ``k_j`` features of ``F``
        perturbed). With ``t`` in ``[0, 1]`` the area is the curve's mean height, in the score's
        units, comparable between inputs of different sizes. Quantus's ``calculate_auc`` uses
        ``dx = 1`` per step instead: its value is this one times ``L`` where the steps are equal.

        Parameters
        ----------
        order : str
            ``"morf"`` or ``"lerf"``.

        Returns
        -------
        Tensor
            ``[samples]``, float64.
        """
        return trapezoid(self._order(order), self.fractions)

    def abpc(self) -> Tensor:
        r"""Area between the perturbation curves per sample (ABPC, Blücher et al., "Decoupling
        Pixel Flipping and Occlusion Strategy for Consistent XAI Benchmarks", TMLR 2024, as used in
        the AttnLRP and DynamicLRP evaluations).

        .. math:: \mathrm{ABPC} = \mathrm{AUC}(\mathrm{LeRF}) - \mathrm{AUC}(\mathrm{MoRF})

        for deletion (removing the least relevant features first should keep the score, removing
        the most relevant first should drop it), and ``AUC(MoRF) - AUC(LeRF)`` for insertion, so
        that larger is more faithful in both; a map whose order carries no information (a random
        map) has an expected ABPC of 0.

        Returns
        -------
        Tensor
            ``[samples]``, float64, in the score's units.
        """
        difference = self.auc("lerf") - self.auc("morf")
        return difference if self.mode == "deletion" else -difference

    def aopc(self, order: str = "morf") -> Tensor:
        r"""Area over the perturbation curve per sample (AOPC, Samek et al., "Evaluating the
        Visualization of What a Deep Neural Network Has Learned", IEEE TNNLS 2017, eq. 12):

        .. math:: \mathrm{AOPC} = \frac{1}{L + 1} \sum_{k=0}^{L}
                  \bigl(f(x^{(0)}) - f(x^{(k)})\bigr)

        over the ``L`` steps of a deletion curve (Samek et al. average it over the data set too:
        take the mean of the returned values). Larger is more faithful for MoRF; for LeRF a small
        value is.

        Parameters
        ----------
        order : str
            ``"morf"`` (default) or ``"lerf"``.

        Returns
        -------
        Tensor
            ``[samples]``, float64.
        """
        if self.mode != "deletion":
            raise EvaluationInputError("AOPC is defined on deletion curves (Samek et al. 2017); these are "
                                       "insertion curves: compare them with abpc() or auc()")
        curve = self._order(order)
        return (curve[:, :1] - curve).mean(dim=1)


def trapezoid(values: Tensor, positions: Tensor) -> Tensor:
    """The trapezoidal rule along the last dimension: ``sum((x[j+1] - x[j]) (y[j] + y[j+1]) / 2)``."""
    return ((positions[..., 1:] - positions[..., :-1]) * (values[..., 1:] + values[..., :-1]) / 2).sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# inputs


def as_relevance(relevance: Any, device: torch.device, what: str = "relevance",
                 remedy: str = "explain again (in float64, or with a larger epsilon) or replace them before "
                               "evaluating") -> Tensor:
    """Relevance from anywhere (a torch tensor of any device and dtype, a NumPy array, a list) as
    a float64 tensor on ``device``, checked to be finite (``what`` and ``remedy`` name the values
    and what to do in the errors)."""
    if isinstance(relevance, Tensor):
        values = relevance.detach()
    else:
        try:
            values = torch.as_tensor(np.asarray(relevance))
        except (TypeError, ValueError, RuntimeError) as error:
            raise EvaluationInputError(f"{what} must be a tensor or an array of numbers, got "
                                       f"{type(relevance).__name__} ({error})") from None
    if not (values.is_floating_point() or values.dtype in (torch.int32, torch.int64, torch.bool)):
        raise EvaluationInputError(f"{what} must hold real numbers, got dtype {values.dtype}")
    values = values.to(device=device, dtype=torch.float64)
    if not bool(torch.isfinite(values).all()):
        raise EvaluationInputError(f"{what} holds NaN or Inf values; {remedy}")
    return values


def check_choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise EvaluationInputError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def check_orders(orders: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    orders = (orders,) if isinstance(orders, str) else tuple(orders)
    if not orders:
        raise EvaluationInputError("orders is empty; give 'morf', 'lerf' or both")
    for order in orders:
        check_choice(order, ORDERS, "each order")
    return tuple(dict.fromkeys(orders))


def check_evaluation_mode(model: Any) -> None:
    """A model in training mode (dropout, batch statistics) gives another score on every call."""
    if isinstance(model, nn.Module) and model.training:
        raise EvaluationInputError("the model is in training mode, where dropout and batch statistics change its "
                                   "scores from call to call; call model.eval() before evaluating explanations")


def check_curve_options(model: Any, orders: str | tuple[str, ...] | list[str], mode: str,
                        score: str) -> tuple[str, ...]:
    """The checks every kind of curve makes on its shared arguments (the model's mode, ``mode``,
    ``score``, ``orders``); returns the orders as a tuple without repeats."""
    check_evaluation_mode(model)
    check_choice(mode, MODES, "mode")
    check_choice(score, SCORES, "score")
    return check_orders(orders)


# ---------------------------------------------------------------------------------------------
# orders and steps


def feature_ranks(relevance: Tensor, order: str, valid: Tensor | None = None) -> Tensor:
    """Each feature's place in the perturbation order, per sample.

    Parameters
    ----------
    relevance : Tensor
        ``[samples, features]``.
    order : str
        ``"morf"``: the most relevant feature gets rank 0; ``"lerf"``: the least relevant.
        Ties keep the features' own order (a stable sort), in both orders.
    valid : Tensor or None
        ``[samples, features]`` bool: features that may be perturbed; the others get rank
        ``features`` (never perturbed). None: all.

    Returns
    -------
    Tensor
        ``[samples, features]`` int64 ranks.
    """
    key = -relevance if order == "morf" else relevance
    ordered = torch.sort(key, dim=1, stable=True).indices
    count = relevance.shape[1]
    if valid is not None:  # valid features first, each group in relevance order
        invalid_in_order = (~valid).gather(1, ordered).to(torch.int8)
        ordered = ordered.gather(1, torch.sort(invalid_in_order, dim=1, stable=True).indices)
    ranks = torch.empty_like(ordered)
    positions = torch.arange(count, device=relevance.device).expand_as(ordered)
    ranks.scatter_(1, ordered, positions)
    if valid is not None:
        ranks = ranks.masked_fill(~valid, count)
    return ranks


def step_counts(features: Tensor, per_step: int | None, steps: int | None) -> Tensor:
    """How many features are perturbed at each point of the curves, per sample.

    Parameters
    ----------
    features : Tensor
        ``[samples]``: how many features each sample has that may be perturbed.
    per_step : int or None
        Features per step: points ``0, s, 2s, ..., F`` (the last step takes what is left;
        ``ceil(F / s)`` steps, as Quantus's ``features_in_step``). Needs the same ``F`` for
        every sample.
    steps : int or None
        The number of steps ``L`` instead: point ``j`` perturbs ``round(j F_i / L)`` features of
        sample ``i`` (samples of different sizes then share their fractions).

    Returns
    -------
    Tensor
        ``[samples, L + 1]`` int64, from 0 to ``F_i``.
    """
    if (per_step is None) == (steps is None):
        raise EvaluationInputError("give either features_per_step or steps")
    if per_step is not None:
        if per_step < 1:
            raise EvaluationInputError(f"features_per_step must be at least 1, got {per_step}")
        if bool((features != features[0]).any()):
            raise EvaluationInputError("features_per_step needs samples with the same number of features; these "
                                       "have different numbers: give steps instead")
        total = int(features[0])
        count = -(-total // per_step)
        points = torch.clamp(torch.arange(count + 1, device=features.device) * per_step, max=total)
        return points.expand(len(features), -1).clone()
    if steps < 1:
        raise EvaluationInputError(f"steps must be at least 1, got {steps}")
    fractions = torch.arange(steps + 1, device=features.device, dtype=torch.float64) / steps
    return torch.round(fractions[None] * features[:, None].to(torch.float64)).to(torch.int64)


def curve_counts(counted: Tensor, per_step: int | None, steps: int | None) -> Tensor:
    """:func:`step_counts` with the default of the curves: one feature per step where every sample
    has as many (``counted``: ``[samples]``), else as many steps as the largest sample has features."""
    if per_step is None and steps is None:
        per_step, steps = (1, None) if bool((counted == counted[0]).all()) else (None, int(counted.max()))
    return step_counts(counted, per_step, steps)


def curve_fractions(counts: Tensor, counted: Tensor) -> Tensor:
    """The fraction of each sample's features perturbed at each point (0 for a sample without any)."""
    return counts.to(torch.float64) / counted.clamp(min=1)[:, None].to(torch.float64)


@dataclass(frozen=True)
class Rows:
    """The rows of the batched loop: every (order, sample, point), in that nesting."""

    orders: int
    samples: int
    points: int
    device: torch.device

    def __len__(self) -> int:
        return self.orders * self.samples * self.points

    def locate(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The order, sample and point of each row."""
        rows = rows.to(self.device)
        return rows // (self.samples * self.points), (rows // self.points) % self.samples, rows % self.points

    def perturbed(self, counts: Tensor, counted: Tensor, mode: str) -> Tensor:
        """The rows whose input differs from the unperturbed one (indices, on the device): not the
        first point of a deletion curve, nor the last of an insertion curve, whose scores are the
        unperturbed input's (one model call for all of them, not one row per order)."""
        _, sample, point = self.locate(torch.arange(len(self), device=self.device))
        untouched = counts[sample, point] == (0 if mode == "deletion" else counted[sample])
        return (~untouched).nonzero().view(-1)

    def curves(self, found: Tensor, orders: tuple[str, ...], counts: Tensor, counted: Tensor,
               mode: str) -> PerturbationCurves:
        """The rows' scores ``[len(self)]`` as curves."""
        found = found.view(self.orders, self.samples, self.points)
        return PerturbationCurves({order: found[index] for index, order in enumerate(orders)},
                                  curve_fractions(counts, counted), counts, mode)


def perturbed_features(ranks: Tensor, counts: Tensor, mode: str, valid: Tensor | None = None) -> Tensor:
    """Which features are replaced by the baseline, per (sample, point) row.

    Parameters
    ----------
    ranks : Tensor
        ``[rows, features]``: each row's sample's ranks (:func:`feature_ranks`).
    counts : Tensor
        ``[rows]``: the point's count ``k``.
    mode : str
        Deletion: the ``k`` first features in the order; insertion: every feature that may be
        perturbed except the ``k`` first.
    valid : Tensor or None
        ``[rows, features]``: features that may be perturbed (insertion keeps the others as they are).

    Returns
    -------
    Tensor
        ``[rows, features]`` bool.
    """
    first = ranks < counts[:, None]
    if mode == "deletion":
        return first
    kept = ~first
    return kept if valid is None else kept & valid


# ---------------------------------------------------------------------------------------------
# scores, batched


def explained_scores(output: Any, targets: Tensor, score: str) -> Tensor:
    """The target's logit (or softmax probability) of each row of a model's output ``[rows, classes]``
    (a Hugging Face output is read as its ``logits``), float64."""
    if not isinstance(output, Tensor):
        output = getattr(output, "logits", output)
    if not isinstance(output, Tensor) or output.dim() != 2:
        shape = list(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise EvaluationInputError(f"the model's output must be scores [batch, classes], got {shape}; wrap the model "
                                   f"so that it returns them (e.g. lambda x: model(x)[..., 0])")
    values = output.detach().to(torch.float64)
    if score == "probability":
        values = torch.softmax(values, dim=1)
    return values.gather(1, targets[:, None].to(values.device)).squeeze(1)


def check_targets(target: Any, logits: Tensor) -> Tensor:
    """``target`` (None: the predicted class; an int; one per sample) as ``[samples]`` int64,
    checked against the number of classes."""
    samples, classes = logits.shape
    if target is None:
        return logits.argmax(dim=1)
    targets = torch.as_tensor(target, device=logits.device)
    if targets.is_floating_point() or targets.dim() > 1:
        raise EvaluationInputError(f"target must be a class index or one per sample, got {target!r}")
    targets = targets.to(torch.int64).expand(samples) if targets.dim() == 0 else targets.to(torch.int64)
    if len(targets) != samples:
        raise EvaluationInputError(f"target has {len(targets)} entries for {samples} samples")
    if bool(((targets < 0) | (targets >= classes)).any()):
        raise EvaluationInputError(f"target {targets.tolist()} is out of range: the model has {classes} classes")
    return targets


def score_reader(target: Any, output: Any, score: str, samples: int,
                 device: torch.device) -> Callable[[Any, Tensor], Tensor]:
    """How the curves read each row's score from the model's output on a batch: the target class's
    logit or probability (``target`` an int, one per sample or None, checked against ``output``, the
    model's output on the unperturbed samples), or what a callable ``target(output, samples)``
    returns. The reader takes an output and the sample of each of its rows and returns ``[rows]``
    float64 scores."""
    if callable(target):
        if score != "logit":
            raise EvaluationInputError(f"score={score!r} applies to a classifier's scores; a callable target "
                                       f"returns the score itself: leave score at 'logit' and compute a "
                                       f"probability in the target")
        return lambda output, rows: called_scores(target, output, rows, device)
    logits = output if isinstance(output, Tensor) else getattr(output, "logits", output)
    explained_scores(logits, torch.zeros(samples, dtype=torch.int64, device=device), "logit")  # (its shape)
    targets = check_targets(target, logits.detach())
    return lambda output, rows: explained_scores(output, targets[rows], score)


def called_scores(target: Callable[[Any, Tensor], Any], output: Any, samples: Tensor, device: torch.device) -> Tensor:
    """A callable target's scores of a batch ``[rows]`` (``samples``: the sample each row perturbs),
    checked to be one finite number per row, as float64 on ``device``."""
    values = as_relevance(target(output, samples), device, what="the target's scores",
                          remedy="the target must return a finite score for every input")
    if tuple(values.shape) != (len(samples),):
        raise EvaluationInputError(f"the target returned scores of shape {list(values.shape)} for a batch of "
                                   f"{len(samples)} inputs; it must return one score per input, [{len(samples)}]")
    return values


@contextmanager
def progress_bar(total: int, enabled: bool, description: str) -> Iterator[Callable[[int], None]]:
    """tqdm's bar on stderr when tqdm is installed, ``enabled`` and stderr a terminal; else none.
    Yields the function that advances it."""
    bar = None
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            bar = None
        else:
            bar = tqdm(total=total, unit="input", desc=description, file=sys.stderr, disable=None, leave=False)
    try:
        yield (lambda count: None) if bar is None else bar.update
    finally:
        if bar is not None:
            bar.close()


def score_rows(layout: Rows, counts: Tensor, counted: Tensor, mode: str, unperturbed: Tensor, batch_size: int,
               make_batch: Callable[[Tensor], Any], run: Callable[[Any], Any],
               read: Callable[[Any, Tensor], Tensor], progress: bool, description: str) -> Tensor:
    """Score the rows of ``layout`` in batches of ``batch_size`` perturbed inputs:
    ``make_batch(row_indices)`` builds a batch's inputs, ``run`` calls the model on them,
    ``read(output, row_indices)`` takes each row's score. Rows whose input is the unperturbed one
    (:meth:`Rows.perturbed`) take their sample's score from ``unperturbed`` ``[samples]`` instead
    of a model call. Returns ``[len(layout)]`` float64."""
    if batch_size < 1:
        raise EvaluationInputError(f"batch_size must be at least 1, got {batch_size}")
    found = unperturbed[layout.locate(torch.arange(len(layout), device=layout.device))[1]].clone()
    rows = layout.perturbed(counts, counted, mode)
    with torch.no_grad(), progress_bar(len(rows), progress, description) as advance:
        for start in range(0, len(rows), batch_size):
            indices = rows[start:start + batch_size]
            found[indices] = read(run(make_batch(indices)), indices)
            advance(len(indices))
    return found


def tensor_curves(run: Callable[..., Any], inputs: Tensor, relevance: Tensor, feature_of: Tensor,
                  baseline: Tensor, target: Any, *, orders: tuple[str, ...], mode: str, score: str,
                  features_per_step: int | None, steps: int | None, valid: Tensor | None, batch_size: int,
                  progress: bool, extra: dict[str, Tensor] | None = None) -> PerturbationCurves:
    """Perturbation curves of inputs whose features are groups of their elements.

    Parameters
    ----------
    run : callable
        The model, called on a batch of perturbed inputs (and, per row, ``extra``'s tensors as
        keyword arguments).
    inputs : Tensor
        ``[samples, *shape]``.
    relevance : Tensor
        ``[samples, features]`` float64: each feature's relevance.
    feature_of : Tensor
        int64, broadcastable to ``shape``: the feature each element belongs to.
    baseline : Tensor
        ``[samples, *shape]`` (or broadcastable): what a perturbed element becomes.
    target, orders, mode, score, features_per_step, steps, batch_size, progress
        As :func:`fxlrp.evaluate.image_curves`.
    valid : Tensor or None
        ``[samples, features]`` bool: the features that may be perturbed; None: all.
    extra : dict or None
        Per-sample tensors ``[samples, ...]`` passed to ``run`` as keyword arguments with each row's.

    Returns
    -------
    PerturbationCurves
    """
    samples, features = relevance.shape
    extra = extra or {}
    counted = torch.full((samples,), features, device=inputs.device) if valid is None else valid.sum(dim=1)
    counts = curve_counts(counted, features_per_step, steps)
    layout = Rows(len(orders), samples, counts.shape[1], inputs.device)
    with torch.no_grad():
        output = run(inputs, **extra)
    read_scores = score_reader(target, output, score, samples, inputs.device)
    ranks = torch.stack([feature_ranks(relevance, order, valid) for order in orders])
    baseline = baseline.expand_as(inputs)
    flat_feature = feature_of.expand(inputs.shape[1:]).reshape(-1)
    element_shape = inputs.shape[1:]

    def make_batch(rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        order, sample, point = layout.locate(rows)
        chosen = perturbed_features(ranks[order, sample], counts[sample, point], mode,
                                    None if valid is None else valid[sample])
        where = chosen[:, flat_feature].view(len(rows), *element_shape)
        return torch.where(where, baseline[sample], inputs[sample]), {name: value[sample]
                                                                      for name, value in extra.items()}

    def read(output: Any, rows: Tensor) -> Tensor:
        return read_scores(output, layout.locate(rows)[1])

    unperturbed = read_scores(output, torch.arange(samples, device=inputs.device))
    found = score_rows(layout, counts, counted, mode, unperturbed, batch_size, make_batch,
                       lambda batch: run(batch[0], **batch[1]), read, progress, f"{mode} curves")
    return layout.curves(found, orders, counts, counted, mode)
