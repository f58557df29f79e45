"""The table of every node of an explainer: operation, handling, rule, source line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeReport:
    """One row of :meth:`Explainer.report`."""

    name: str
    """The node's name."""
    target: str
    """What the node calls, as the table shows it."""
    operation: str
    """The node's canonical operation."""
    handling: str
    """``rule`` (a rule of the composite), ``identity``, ``native`` (relevance-neutral or routed by
    the native backward), ``container`` (attribute access or a method of a non-tensor input),
    ``input``/``output``/``constant``, ``no relevance`` (an operation without a rule on values
    that no input reaches, e.g. a degree normalisation from ``edge_index``) or ``gradient`` (no
    rule: strict=False fallback)."""
    rule: str
    """The rule's ``repr``; ``""`` where the node has none."""
    source: str
    """The model's source line that made the node (``path:line: code``); ``""`` where unknown."""


EXPLAINED = {"rule", "identity", "native", "container", "input", "output", "constant", "no relevance", "eager"}


@dataclass(frozen=True)
class Report:
    """What happens to each node of the model; ``str()`` gives the table."""

    model_name: str
    """The model's class name."""
    rows: Sequence[NodeReport]
    """One row per node."""
    eager_modules: Mapping[str, str] = field(default_factory=dict)
    """Modules torch.fx could not trace, run eagerly (``""``: the whole model), with its reason."""
    replays: Mapping[str, str] = field(default_factory=dict)
    """For each module run eagerly, the input signatures it replays as recorded graphs so far, and
    why others keep running eagerly (:mod:`fxlrp.eager.replay`)."""

    @property
    def capture(self) -> str:
        """Which capture path took which part of the model."""
        if not self.eager_modules:
            return "captured by torch.fx"
        if "" in self.eager_modules:
            return f"run eagerly as a whole ({self.eager_modules['']})"
        parts = "; ".join(f"{name} ({reason})" for name, reason in self.eager_modules.items())
        return f"captured by torch.fx, except {len(self.eager_modules)} module(s) run eagerly: {parts}"

    @property
    def coverage(self) -> float:
        """Fraction of nodes handled by a rule or a declared relevance-neutral operation."""
        handled = sum(row.handling in EXPLAINED for row in self.rows)
        return handled / len(self.rows) if self.rows else 1.0

    @property
    def counts(self) -> Counter:
        """How many nodes have each handling."""
        return Counter(row.handling for row in self.rows)

    def __str__(self) -> str:
        header = ("node", "target", "operation", "handling", "rule", "source")
        table = [header] + [
            (row.name, row.target, row.operation, row.handling, row.rule, _short(row.source)) for row in self.rows
        ]
        widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
                 for line in table]
        lines.insert(1, "-" * len(lines[0]))
        counts = ", ".join(f"{count} {handling}" for handling, count in sorted(self.counts.items()))
        lines.append(f"{self.model_name}: {len(self.rows)} nodes ({counts}); coverage {self.coverage:.2%}")
        lines.append(self.capture)
        # (a report pickled by an fxlrp without recorded runs has no ``replays``)
        lines += [f"recorded runs of {name or 'the whole model'}: {said}"
                  for name, said in getattr(self, "replays", {}).items()]
        return "\n".join(lines)


def _short(source: str) -> str:
    if not source:
        return ""
    path, _, rest = source.partition(":")
    return path.rsplit("/", 1)[-1] + ":" + rest
