"""The ``fxlrp`` command and what it is built from.

:mod:`~fxlrp.app.cli`: the command line (``explain``, ``report``, ``demo``; ``python -m fxlrp``),
parsed without torch (:mod:`~fxlrp.app.cli_options`), the commands run by
:mod:`~fxlrp.app.commands`;
:mod:`~fxlrp.app.models`: the model a ``--model`` spec names, one module per source, with the
preprocessing each prescribes (:mod:`~fxlrp.app.preprocessing`); :mod:`~fxlrp.app.readers`: the
images and tensor files it reads; :mod:`~fxlrp.app.composites`: a composite by name;
:mod:`~fxlrp.app.outputs`: what a model's output means (the scores explained);
:mod:`~fxlrp.app.explain_dataset`: ``explain --data``, a data set into resumable shards, and
:mod:`~fxlrp.app.evaluate_dataset`: ``evaluate``, on one shard loop (:mod:`~fxlrp.app.sharded_run`),
with their sources (:mod:`~fxlrp.app.datasets`), the files they write
(:mod:`~fxlrp.app.explanations_store`, read back by ``fxlrp.read_explanations``), their processes
under ``torchrun`` (:mod:`~fxlrp.app.distributed`) and ``--device``/``--dtype``
(:mod:`~fxlrp.app.devices`); :mod:`~fxlrp.app.demo`: the README's pictures.
"""
