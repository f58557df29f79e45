"""The ``fxlrp`` command and what it is built from.

:mod:`~fxlrp.app.cli`: the command line (``explain``, ``report``, ``demo``; ``python -m fxlrp``),
parsed without torch (:mod:`~fxlrp.app.cli_options`), the commands run by
:mod:`~fxlrp.app.commands`;
:mod:`~fxlrp.app.cli_inputs`: what it reads (a model from a spec, a composite by name, images);
:mod:`~fxlrp.app.explain_dataset`: ``explain --data``, a data set into resumable shards, with its
sources (:mod:`~fxlrp.app.datasets`), the files it writes (:mod:`~fxlrp.app.explanations_store`,
read back by ``fxlrp.read_explanations``) and its processes under ``torchrun``
(:mod:`~fxlrp.app.distributed`); :mod:`~fxlrp.app.demo`: the README's pictures.
"""
