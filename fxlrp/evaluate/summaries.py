"""Summaries of a metric over samples: the mean with a bootstrap confidence interval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fxlrp.evaluate.curves import EvaluationInputError, as_relevance

RESAMPLES = 2000
"""Bootstrap resamples of :func:`mean_interval` (the percentile interval's ends move by well under
a tenth of its width between seeds at this count)."""


@dataclass(frozen=True)
class Interval:
    """A mean over samples and its confidence interval.

    Attributes
    ----------
    mean : float
        The mean of the values.
    low, high : float
        The ends of the percentile bootstrap interval of the mean.
    samples : int
        How many values.
    confidence : float
        The interval's level, e.g. 0.95.
    """

    mean: float
    low: float
    high: float
    samples: int
    confidence: float

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval."""
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"


def mean_interval(values: Any, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    r"""The mean of per-sample values with its percentile bootstrap confidence interval.

    The ``resamples`` means :math:`\bar v^{*}_b` of ``n`` values drawn with replacement (a
    generator seeded with ``seed``: the same interval on every run) give the interval
    :math:`[q_{\alpha/2}, q_{1-\alpha/2}]` of their quantiles, :math:`\alpha = 1 - \text{confidence}`
    (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13). It makes no
    assumption on the values' distribution (ABPC per sample is often skewed); with one sample the
    interval is that value.

    Parameters
    ----------
    values : Tensor, numpy.ndarray or array-like
        ``[n]`` per-sample values (e.g. :meth:`PerturbationCurves.abpc`).
    confidence : float
        The interval's level, in (0, 1).
    resamples : int
        Bootstrap resamples.
    seed : int
        The resampling's seed.

    Returns
    -------
    Interval
    """
    data = as_relevance(values, torch.device("cpu"), "the values").reshape(-1)
    if len(data) == 0:
        raise EvaluationInputError("no values to summarise")
    if not 0 < confidence < 1:
        raise EvaluationInputError(f"confidence must lie between 0 and 1, got {confidence}")
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(data), (resamples, len(data)), generator=generator)
    means = data[picks].mean(dim=1)
    alpha = 1 - confidence
    low, high = torch.quantile(means, torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)).tolist()
    return Interval(float(data.mean()), low, high, len(data), confidence)


def ranked(results: dict[str, Tensor], confidence: float = 0.95) -> list[tuple[str, Interval]]:
    """Methods (or composites) by their mean value, largest first, each with its interval.

    Parameters
    ----------
    results : dict
        Name -> per-sample values (e.g. ABPC).
    confidence : float
        The intervals' level.

    Returns
    -------
    list of (name, Interval)
    """
    summaries = [(name, mean_interval(values, confidence)) for name, values in results.items()]
    return sorted(summaries, key=lambda item: -item[1].mean)


def table(rows: list[tuple[str, Interval]], metric: str = "ABPC") -> str:
    """A plain-text table of :func:`ranked` rows: rank, name, mean and interval."""
    if not rows:
        return ""
    width = max(len("method"), *(len(name) for name, _ in rows))
    level = f"{rows[0][1].confidence:.0%}"
    lines = [f"{'rank':>4}  {'method':<{width}}  {metric:>10}  {level + ' interval':>24}  samples"]
    for place, (name, interval) in enumerate(rows, 1):
        lines.append(f"{place:>4}  {name:<{width}}  {interval.mean:>10.4g}  "
                     f"{f'[{interval.low:.4g}, {interval.high:.4g}]':>24}  {interval.samples:>7}")
    return "\n".join(lines)
