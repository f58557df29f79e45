"""The second capture path: parts of a model torch.fx cannot trace are explained by running them.

torch.fx records a forward by running it on symbolic values, so Python that looks at a tensor's
value (``if x.sum() > 0``, Hugging Face's mask construction, ``int(index.max())``) cannot be
recorded. Capture then makes the innermost module whose tracing failed a single node of the
graph (the whole model if its own ``forward`` fails) and traces the rest again; at explanation
time such a node runs its module's real code on real tensors under
:class:`~fxlrp.eager.interpret.RelevanceMode`, which sends every torch operation on relevance-carrying
tensors to the relevance function the registry holds for it. So:

- the same registry and the same rules as the graph (no second set of operations);
- branches are taken per input, as the model takes them;
- the composite's name, type and first-layer rules follow the module calls inside
  (:class:`~fxlrp.eager.rule_choice.ModuleContext`);
- ``strict=True`` names every operation without a rule with its source line, when the explainer
  first runs (a part run eagerly is only seen when it runs).

Here: the relevance function of such a part (the registry's ``eager`` operation); the part's
runner (:mod:`~fxlrp.eager.runner`); the relevance mode (:mod:`~fxlrp.eager.interpret`), the rules
it chooses (:mod:`~fxlrp.eager.rule_choice`), its in-place writes (:mod:`~fxlrp.eager.in_place`)
and the views it tracks for them (:mod:`~fxlrp.eager.views`); a run recorded as a graph
(:mod:`~fxlrp.eager.record`) and replayed for later inputs of its signature
(:mod:`~fxlrp.eager.replay`). The operations get the interpreter through their call
(:meth:`~fxlrp.relevance.call.RelevanceCall.decompose`): this package supplies it as it is
imported.
"""

from __future__ import annotations

from typing import Any

from fxlrp.capture import EXTRA_KEYWORDS
from fxlrp.eager.interpret import interpret, run_interpreted
from fxlrp.eager.replay import Recordings
from fxlrp.eager.rule_choice import Interpretation, current_observer
from fxlrp.eager.runner import LayerRunner, layer_runner
from fxlrp.registry import Decomposed, Operation, Spelling, register
from fxlrp.relevance.call import Interpreter, RelevanceCall, supply_interpreter


def run_eagerly(call: RelevanceCall, runner: LayerRunner, *args: Any, **kwargs: Any) -> Any:
    """Relevance function of a part run eagerly.

    It runs the module's forward under the relevance mode, whether or not its inputs carry
    relevance (token ids do not; their embedding starts it); or, from the second call with the
    same input signature, the run's recorded graph (:mod:`fxlrp.eager.replay`).

    Parameters
    ----------
    call : RelevanceCall
        The node's rule and settings.
    runner : LayerRunner
        The part's runner.
    *args, **kwargs
        The part's arguments.

    Returns
    -------
    Any
        The part's output, whose backward propagates relevance.
    """
    extra = kwargs.pop(EXTRA_KEYWORDS, None) or {}  # (before kwargs are unpacked: the key is fxlrp's)
    kwargs = {**kwargs, **extra}
    observer = current_observer()
    if observer is None:  # (observed runs make each call under the relevance mode: operations_observed)
        if runner.recordings is None:
            runner.recordings = Recordings()
        replay = runner.recordings.replay_for(call, runner, args, kwargs)
        if replay is not None:
            return replay()
    return run_interpreted(call, runner, args, kwargs, observer)


EAGER = register(
    Operation(
        "eager",
        Spelling(module_function=layer_runner),
        Decomposed(run_eagerly),
        description="a module torch.fx cannot trace, run eagerly: each torch operation inside gets the "
        "rule the registry and the composite give it, decided as it runs",
    )
)

supply_interpreter(Interpreter(run=interpret, rules_inside=Interpretation))
