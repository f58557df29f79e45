"""Concepts: conditional relevance (Concept Relevance Propagation) and attribution graphs for any
model :func:`fxlrp.convert` explains.

- :func:`conditional_relevance`: heatmaps (and node relevances) restricted to chosen concepts of
  chosen nodes, zennit-crp's conditions (``[{"features.40": [12], "y": [1]}]``), many conditions per
  call; on both capture paths (a traced graph, parts run eagerly).
- :class:`ChannelConcept`, :class:`NeuronConcept`, :class:`HeadConcept`: what a node's concept
  indices are (channels, neurons, attention heads); :func:`concept_relevance`: the relevance of
  each concept of a node.
- :func:`attribution_graph`: how the relevance of concepts of one layer comes from the concepts
  of the layers below, for one prediction.
- :func:`relevance_maximisation`: the reference samples of each concept over a data set, by
  relevance and by activation (zennit-crp's ``FeatureVisualization``), shards merged exactly;
  :func:`receptive_boxes`, :func:`with_boxes` and :func:`reference_crops` (receptive regions),
  :func:`concept_atlas` (a picture); :func:`read_references` reads what ``fxlrp explain --data
  ... --concepts NODE`` writes.
- :func:`top_concepts`: one prediction's most relevant concepts of a layer, their shares,
  conditional heatmaps and reference samples; ``.picture(path)`` draws them.

The core (``fxlrp.convert``, ``fxlrp.attribute``) never imports this package.
"""

from fxlrp.concepts.concept import ChannelConcept, Concept, HeadConcept, NeuronConcept, concept_relevance
from fxlrp.concepts.conditional import ConditionalRelevance, conditional_relevance
from fxlrp.concepts.files import read_references, save_references
from fxlrp.concepts.graph import ConceptEdge, ConceptGraph, attribution_graph
from fxlrp.concepts.maximisation import (
    ReferenceSamples,
    TopSamples,
    concept_atlas,
    receptive_boxes,
    reference_crops,
    relevance_maximisation,
    with_boxes,
)
from fxlrp.concepts.prediction import TopConcepts, top_concepts
from fxlrp.concepts.sites import OUTPUT

__all__ = [
    "Concept",
    "ChannelConcept",
    "NeuronConcept",
    "HeadConcept",
    "concept_relevance",
    "conditional_relevance",
    "ConditionalRelevance",
    "attribution_graph",
    "ConceptGraph",
    "ConceptEdge",
    "relevance_maximisation",
    "ReferenceSamples",
    "TopSamples",
    "reference_crops",
    "receptive_boxes",
    "with_boxes",
    "concept_atlas",
    "read_references",
    "save_references",
    "top_concepts",
    "TopConcepts",
    "OUTPUT",
]
