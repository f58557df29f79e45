"""The pipeline put together, and the explainer it makes.

:mod:`~fxlrp.explain.convert` runs the steps (capture, canonical form, rules, rewrite) and returns
an :class:`~fxlrp.explain.explainer.Explainer` holding the :class:`~fxlrp.explain.explainer.Conversion`
that made it; :mod:`~fxlrp.explain.attribute` explains with it (``attribute``, ``attribute_nodes``)
from the start relevance :mod:`~fxlrp.explain.targets` makes of a target, checks its
inputs and outputs (:mod:`~fxlrp.explain.input_checks`, :mod:`~fxlrp.explain.rank_checks`,
:mod:`~fxlrp.explain.finite_checks`, :mod:`~fxlrp.explain.model_rejection`; once per call,
:mod:`~fxlrp.explain.explained_inputs`), refuses moves that would half-move it
(:mod:`~fxlrp.explain.placement`) and follows later changes to the model
(:mod:`~fxlrp.explain.model_snapshot`); :mod:`~fxlrp.explain.compiled` compiles an explanation with
``torch.compile``. ``import fxlrp`` gives the public names: ``fxlrp.convert``, ``fxlrp.attribute``,
``fxlrp.attribute_nodes``, ``fxlrp.compile``, ``fxlrp.Explainer``.
"""
