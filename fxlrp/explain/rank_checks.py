"""The numbers of dimensions the model's BatchNorms check, recorded at conversion and compared
before each explanation.

The explainer computes BatchNorm as its affine map (or folds it into the layer before it), which
broadcasts where the module raised ``expected 4D input (got 3D input)``, so a missing batch
dimension could be explained where the model refuses it. :func:`recorded_rank_checks` records at
conversion the BatchNorms an input reaches through layers that keep its number of dimensions
(convolutions, linear layers, activations, pooling, dropout) with what each says to which number
(:class:`RankCheck`), and :func:`refuse_ranks_the_model_refuses` compares: no more than a look at
each checked input's ``dim()``, never a forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fxlrp.errors import ExplanationInputError
from fxlrp.registry import REGISTRY


@dataclass(frozen=True)
class RankCheck:
    """What a BatchNorm of the model says to the number of dimensions of an input it is reached by
    through layers that keep that number (recorded by :func:`recorded_rank_checks`).

    ``position``, ``name``: the input's place and name in the model's ``forward``; ``module``,
    ``kind``: the BatchNorm's path in the model and its class; ``accepted``: the numbers of
    dimensions it takes; ``said``: its message for each number of dimensions up to 8 it refuses.
    """

    position: int
    name: str
    module: str
    kind: str
    accepted: tuple[int, ...]
    said: tuple[tuple[int, str], ...]

    def refusal(self, value: Tensor) -> str | None:
        """The error message for ``value`` in the user's terms; None if the BatchNorm takes it."""
        rank = value.dim()
        if rank in self.accepted:
            return None
        expected = " or ".join(f"{accepted}D" for accepted in self.accepted)
        said = dict(self.said).get(rank, f"expected {expected} input (got {rank}D input)")
        advice = (f"a single sample needs its batch dimension: pass {self.name}.unsqueeze(0)"
                  if rank + 1 in self.accepted else f"give it with {expected.replace('D', '')} dimensions")
        return (f"the model itself rejects input {self.name!r} (shape {list(value.shape)}): its {self.kind} "
                f"{self.module!r} raises ValueError: {said}; {advice}")


def _checks_rank(module: nn.Module) -> bool:
    return (isinstance(module, _BatchNorm) and type(module).forward is _BatchNorm.forward
            and hasattr(module, "_check_input_dim"))


def _keeps_rank(node: fx.Node, module: nn.Module | None) -> bool:
    """Whether the node's output has as many dimensions as its input, batched or not: what the
    registry says of its spelling (:meth:`fxlrp.registry.ValueFlow.keeps_rank_of`)."""
    if node.op == "call_module":
        operation, spelled = REGISTRY.for_module(module), type(module)
    elif node.op == "call_function":
        operation, spelled = REGISTRY.for_function(node.target), node.target
    elif node.op == "call_method":
        operation, spelled = REGISTRY.for_method(node.target), node.target
    else:
        return False
    return operation is not None and operation.flow.keeps_rank_of(spelled)


def _rank_check(module: nn.Module, path: str, position: int, name: str) -> RankCheck | None:
    accepted, said = [], []
    for rank in range(9):
        try:
            module._check_input_dim(torch.empty((1,) * rank, device="meta"))
        except ValueError as error:
            said.append((rank, str(error)))
        else:
            accepted.append(rank)
    if not said or not accepted:
        return None
    return RankCheck(position, name, path, type(module).__name__, tuple(accepted), tuple(said))


def recorded_rank_checks(graph: fx.Graph, modules: Mapping[str, nn.Module],
                         positional: Sequence[str]) -> tuple[RankCheck, ...]:
    """The BatchNorms each input reaches with its own number of dimensions, through call_module,
    function and method nodes that keep it (convolutions, linear layers, activations, pooling,
    dropout), as :class:`RankCheck` s in the order the graph runs them.

    Parameters
    ----------
    graph
        The captured graph, before BatchNorm is folded.
    modules
        The model's modules by qualified name.
    positional
        The names of the model's inputs that may be given by position, in order.

    Returns
    -------
    tuple of RankCheck
        Empty where no input reaches a BatchNorm that way (transformers, graph networks, models
        run eagerly).
    """
    order = {node: index for index, node in enumerate(graph.nodes)}
    found: list[tuple[int, RankCheck]] = []
    for placeholder in graph.nodes:
        if placeholder.op != "placeholder" or placeholder.target not in positional:
            continue
        position = list(positional).index(placeholder.target)
        pending, seen = [placeholder], {placeholder}
        while pending:
            current = pending.pop()
            for user in current.users:
                if user in seen or not user.args or user.args[0] is not current or len(user.all_input_nodes) != 1:
                    continue
                seen.add(user)
                module = modules.get(user.target) if user.op == "call_module" else None
                if module is not None and _checks_rank(module):
                    check = _rank_check(module, user.target, position, placeholder.target)
                    if check is not None:
                        found.append((order[user], check))
                elif _keeps_rank(user, module):
                    pending.append(user)
    return tuple(check for _, check in sorted(found, key=lambda item: item[0]))


def refuse_ranks_the_model_refuses(explain: Any, values: Sequence[Any]) -> None:
    """An :class:`~fxlrp.errors.ExplanationInputError` with the model's BatchNorm's own message for
    an input with a number of dimensions it refuses (see :func:`recorded_rank_checks`). No more
    than a look at each checked input's ``dim()``.

    Parameters
    ----------
    explain
        The explainer; one without recorded checks (a plain module) checks nothing.
    values
        The model's inputs by position.

    Raises
    ------
    ExplanationInputError
        Naming the input, its shape, the BatchNorm and what it says, and what to do.
    """
    conversion = getattr(explain, "conversion", None)
    for check in getattr(conversion, "rank_checks", ()):
        if check.position < len(values) and isinstance(values[check.position], Tensor):
            refusal = check.refusal(values[check.position])
            if refusal is not None:
                raise ExplanationInputError(refusal)
