"""The table of every node of an explainer: operation, handling, rule, source line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fxlrp.registry import Kind


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
    that no input reaches, e.g. a degree normalisation from ``edge_index``), ``unreached`` (an
    operation without a rule that relevance reaches for some of the model's outputs only, e.g. box
    decoding when a class score is explained: run natively, an error if an explanation's
    relevance arrives) or ``gradient`` (no rule: strict=False fallback)."""
    rule: str
    """The rule's ``repr``; ``""`` where the node has none."""
    source: str
    """The model's source line that made the node (``path:line: code``); ``""`` where unknown."""
    inside: str = ""
    """The custom autograd Function whose ``forward`` made the node; ``""`` for none."""
    calls: int | None = None
    """For an operation run eagerly, the calls one run made (``target`` shows them); None for a node."""


def handling_of(kind: Kind) -> str:
    """The handling a report shows for an operation of ``kind`` that has a relevance function.

    Parameters
    ----------
    kind : Kind
        The operation's kind.

    Returns
    -------
    str
        ``rule`` (affine: the composite's rule), ``identity`` (relevance passes unchanged) or
        ``native`` (the native backward routes it).
    """
    return {Kind.AFFINE: "rule", Kind.PASS: "identity"}.get(kind, "native")


RELEVANCE_STOPS = {"step": "a step function: its gradient is 0", "statistic": "a statistic LRP holds constant"}
"""Operations that end every path of relevance through them, with what they are."""


EXPLAINED = {"rule", "identity", "native", "container", "input", "output", "constant", "no relevance", "eager",
             "unreached"}


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
    operations_run: Mapping[str, Sequence[NodeReport]] = field(default_factory=dict)
    """For each node run eagerly (by its name), the operations its runs so far have made: one row
    per module, operation, handling and rule, whose ``name`` is the module, ``target`` how many
    calls one run made and ``source`` the first call's line."""

    @property
    def all_rows(self) -> list[NodeReport]:
        """The nodes, each node run eagerly followed by the operations its runs made."""
        inside = getattr(self, "operations_run", {})  # (a report pickled before it had them)
        return [shown for row in self.rows for shown in (row, *inside.get(row.name, ()))]

    @property
    def capture(self) -> str:
        """Which capture path took which part of the model."""
        if not self.eager_modules:
            return "captured by torch.fx"
        if "" in self.eager_modules:
            return f"run eagerly as a whole ({self.eager_modules['']})"
        parts = "; ".join(f"{name} ({reason})" for name, reason in self.eager_modules.items())
        return f"captured by torch.fx, except {len(self.eager_modules)} module(s) run eagerly: {parts}"

    def relevance_stops(self) -> list[str]:
        """Where relevance stops.

        Each row of an operation that ends every path through it (:data:`RELEVANCE_STOPS`) is
        named, with its source line and the custom autograd Function it is in.

        Returns
        -------
        list of str
            One line each, for an error that says why an output receives no relevance.
        """
        lines = []
        for row in self.all_rows:
            what = RELEVANCE_STOPS.get(row.operation)
            if what is None:
                continue
            line = f"{row.operation if getattr(row, 'calls', None) is not None else row.target} ({what})"
            if row.source:
                line += f" at {_short(row.source)}"
            inside = getattr(row, "inside", "")
            if inside:
                line += (f", inside {inside}.forward: fxlrp explains the operations of a custom autograd Function's "
                         "forward; to take its own backward as its rule, register it with relevance=own_backward "
                         "(docs/extending.md)")
            lines.append(line)
        return list(dict.fromkeys(lines))

    @property
    def coverage(self) -> float:
        """Fraction of the rows handled by a rule or a declared relevance-neutral operation.

        The rows are the nodes, and the operations run eagerly.
        """
        rows = self.all_rows
        handled = sum(row.handling in EXPLAINED for row in rows)
        return handled / len(rows) if rows else 1.0

    @property
    def counts(self) -> Counter:
        """How many rows have each handling."""
        return Counter(row.handling for row in self.all_rows)

    def __str__(self) -> str:
        header = ("node", "target", "operation", "handling", "rule", "source")
        table = [header] + [
            (row.name, row.target, row.operation, row.handling, row.rule, _short(row.source)) for row in self.all_rows
        ]
        widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
                 for line in table]
        lines.insert(1, "-" * len(lines[0]))
        counts = ", ".join(f"{count} {handling}" for handling, count in sorted(self.counts.items()))
        inside = len(self.all_rows) - len(self.rows)
        ran = f" and {inside} operation(s) run eagerly (by module)" if inside else ""
        lines.append(f"{self.model_name}: {len(self.rows)} nodes{ran} ({counts}); coverage {self.coverage:.2%}")
        lines.append(self.capture)
        lines += [f"recorded runs of {name or 'the whole model'}: {said}" for name, said in self.replays.items()]
        return "\n".join(lines)


def _short(source: str) -> str:
    if not source:
        return ""
    path, _, rest = source.partition(":")
    return path.rsplit("/", 1)[-1] + ":" + rest


def rows_run(node: str, operations: Mapping[tuple[str, str, str, str], Any]) -> list[NodeReport]:
    """The report rows of what the runs of node ``node``, run eagerly, have made.

    Parameters
    ----------
    node : str
        The node's name in the report.
    operations : Mapping
        ``(module, operation, handling, rule) -> run`` with the run's ``source`` and ``calls``
        (:attr:`fxlrp.eager.runner.LayerRunner.operations_run`).

    Returns
    -------
    list of NodeReport
        One row each, named ``node › module``.
    """
    return [NodeReport(f"{node} › {module}" if module else node, f"x{run.calls}", operation, handling, rule,
                       run.source, calls=run.calls)
            for (module, operation, handling, rule), run in operations.items()]
