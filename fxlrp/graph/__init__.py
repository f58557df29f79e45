"""Steps 2 and 4 of the pipeline, on the captured (or recorded) graph.

:mod:`~fxlrp.graph.canonicalise` makes in-place operations out of place and detaches values read
where the model turned gradients off; :mod:`~fxlrp.graph.fold_batchnorm` folds BatchNorm into its
layer; :mod:`~fxlrp.graph.relevance_flow` finds the nodes relevance can reach;
:mod:`~fxlrp.graph.rewrite` replaces each node by its relevance function (the modules of
:mod:`~fxlrp.graph.nodes`) in an :class:`~fxlrp.graph.graph_module.ExplainedGraphModule`, and
:mod:`~fxlrp.graph.report` keeps the table of nodes, operations and rules.
"""
