"""The models the command line loads, one module per source of ``--model``:

``torchvision:NAME`` (:mod:`~fxlrp.app.models.torchvision`: classification, segmentation and video
models, random weights or ``--weights``, preprocessed as their weights' ``transforms()`` say),
``timm:NAME`` (:mod:`~fxlrp.app.models.timm`: random weights, preprocessed by the model's own data
config), ``hf:DIR`` (:mod:`~fxlrp.app.models.huggingface`: a Hugging Face model saved with
``save_pretrained``: text models, and image classifiers with their image processor) and
``package.module:FACTORY`` (:mod:`~fxlrp.app.models.factory`). :mod:`~fxlrp.app.models.spec` reads
the spec and hands it to its source; :mod:`~fxlrp.app.models.weights` reads ``--weights``. Every
problem becomes an :class:`~fxlrp.app.cli_options.InputError` whose message is one line naming
the input and what to do.
"""
