"""Pictures of explanations.

:mod:`~fxlrp.viz.image`: heatmaps and overlays of images; :mod:`~fxlrp.viz.text`: tokens coloured by
relevance, in a terminal or HTML; :mod:`~fxlrp.viz.generation`: generated text, each generated
token's context coloured (an HTML page, a matrix picture, a terminal view);
:mod:`~fxlrp.viz.graph_image`: relevance on graphs and relevant walks. ``import fxlrp`` imports
none of them (images need matplotlib and pillow, graphs networkx: the ``pictures`` extra).
"""
