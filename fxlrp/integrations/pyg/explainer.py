"""LRP as an algorithm for PyG's ``torch_geometric.explain.Explainer``."""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor, nn
from torch_geometric.explain import Explanation, HeteroExplanation
from torch_geometric.explain.algorithm import ExplainerAlgorithm
from torch_geometric.explain.config import MaskType, ModelMode

import fxlrp
from fxlrp.integrations.pyg.forward_reuse import ForwardReuse
from fxlrp.integrations.pyg.relevance import explained_forward, output_relevance, relevance_from
from fxlrp.rules import Rule
from fxlrp.rules.composites import Composite

_MODES = {
    ModelMode.multiclass_classification: "multiclass",
    ModelMode.binary_classification: "binary",
    ModelMode.regression: "regression",
}


class LRPExplainer(ExplainerAlgorithm):
    """Layer-wise Relevance Propagation for ``torch_geometric.explain.Explainer``.

    ``Explainer(model, algorithm=LRPExplainer(composite), explanation_type="model" or
    "phenomenon", node_mask_type="object"/"attributes"/"common_attributes"/None,
    edge_mask_type="object"/None, model_config=dict(mode=..., task_level="node"/"edge"/"graph",
    return_type=...))``.

    The output relevance is the explained output itself: the logit of the target class
    (multiclass), ``+-logit`` (binary, sign by target) or the value (regression), at the rows
    ``index`` (nodes for node-level tasks, node pairs for edge-level tasks such as link prediction,
    whose model takes the pairs as a keyword like ``edge_label_index``, graphs for graph-level
    tasks; all rows if None), zero
    elsewhere. PyG passes the model's prediction as target for ``"model"`` explanations and the
    given target for ``"phenomenon"``. Masks are relevances (signed, summing to about the
    explained output), not probabilities: ``node_mask`` ``object`` sums a node's feature
    relevances, ``common_attributes`` sums over nodes; ``edge_mask`` is the relevance of each
    edge's messages summed over all message-passing layers (see :mod:`fxlrp.integrations.pyg.relevance`).

    The converted model is kept and made again for another model, composite or ``strict``, or
    when a parameter or buffer of the model was replaced by another tensor (the conversion holds
    the tensors themselves; changes in place reach it).

    Parameters
    ----------
    composite : Composite, Rule or None, optional
        As for :func:`fxlrp.convert` (a rule, a composite, None for the default;
        :func:`fxlrp.integrations.pyg.with_cp_lrp` for attention as constants).
    strict : bool, default True
        As for :func:`fxlrp.convert`.
    reuse_forward : bool, default True
        PyG calls the algorithm once per explained node with the same graph; the forward pass
        is then run once and kept for the following calls, which pay only a backward pass each,
        with results identical to a fresh forward. It is run again as soon as the model's
        parameters (modified in place or replaced), the inputs (other tensors or modified in
        place) or the keywords change (see :mod:`fxlrp.integrations.pyg.forward_reuse`). The last
        forward's graph stays in memory until the next call with other inputs or :meth:`clear`;
        False: a forward per call, nothing kept.
    """

    def __init__(self, composite: Composite | Rule | None = None, *, strict: bool = True,
                 reuse_forward: bool = True) -> None:
        super().__init__()
        self.composite = composite
        self.strict = strict
        self.reuse_forward = reuse_forward
        self._converted: tuple[tuple[Any, ...], nn.Module] | None = None
        self._reuse = ForwardReuse()

    def explainer_for(self, model: nn.Module) -> nn.Module:
        """The fxlrp conversion of ``model`` (made again only when what it was made from changed).

        Parameters
        ----------
        model : nn.Module
            The user's model.

        Returns
        -------
        nn.Module
            The conversion.
        """
        made_from = (model, self.composite, self.strict, *model.parameters(), *model.buffers())
        kept = self._converted
        if kept is None or len(kept[0]) != len(made_from) or any(
                old is not new for old, new in zip(kept[0], made_from, strict=True)):
            # Not stored as a submodule: the user's model must not become part of this module.
            object.__setattr__(self, "_converted", (made_from, fxlrp.convert(model, self.composite,
                                                                             strict=self.strict)))
        return self._converted[1]

    def forward(
        self,
        model: nn.Module,
        x: Tensor,
        edge_index: Tensor,
        *,
        target: Tensor,
        index: int | Tensor | None = None,
        **kwargs: Any,
    ) -> Explanation:
        """Explain ``model``'s output on one graph (PyG's ``ExplainerAlgorithm.forward``).

        Parameters
        ----------
        model : nn.Module
            The user's model.
        x : Tensor or dict
            Node features (by node type for heterogeneous graphs).
        edge_index : Tensor or dict
            Edges (by edge type for heterogeneous graphs).
        target : Tensor
            The target PyG passes: the model's prediction, or the given target.
        index : int or Tensor, optional
            The explained rows; all rows if None.
        **kwargs
            The model's other keywords.

        Returns
        -------
        Explanation or HeteroExplanation
            The node and edge masks (relevances).

        Raises
        ------
        ValueError
            If one of ``x`` and ``edge_index`` is a dict and the other is not.
        """
        if isinstance(x, dict) != isinstance(edge_index, dict):
            raise ValueError("LRPExplainer: x and edge_index must both be tensors (homogeneous graph) or both "
                             "dicts by node and edge type (heterogeneous graph)")
        explain = self.explainer_for(model)
        if self.reuse_forward:
            forward = self._reuse.get(model, explain, x, edge_index, kwargs,
                                      lambda reusable: explained_forward(explain, x, edge_index, reusable=reusable,
                                                                         **kwargs))
        else:
            forward = explained_forward(explain, x, edge_index, **kwargs)
        start = output_relevance(forward.output, target, index, _MODES[self.model_config.mode])
        relevance = relevance_from(forward, start)
        with_edges = self.explainer_config.edge_mask_type == MaskType.object
        if isinstance(relevance.node, dict):
            explanation = HeteroExplanation()
            node_masks = {node_type: self._node_mask(value) for node_type, value in relevance.node.items()}
            if self.explainer_config.node_mask_type is not None:
                explanation.set_value_dict("node_mask", node_masks)
            if with_edges:
                explanation.set_value_dict("edge_mask", relevance.edge)
            return explanation
        return Explanation(node_mask=self._node_mask(relevance.node), edge_mask=relevance.edge if with_edges else None)

    def _node_mask(self, relevance: Tensor) -> Tensor | None:
        node_mask_type = self.explainer_config.node_mask_type
        if node_mask_type == MaskType.object:
            return relevance.sum(dim=-1, keepdim=True)
        if node_mask_type == MaskType.attributes:
            return relevance
        if node_mask_type == MaskType.common_attributes:
            return relevance.sum(dim=0, keepdim=True)
        return None

    def clear(self) -> None:
        """Drop the kept forward pass and the memory its graph holds."""
        self._reuse.clear()

    def supports(self) -> bool:
        """Whether the explainer's configuration is one this algorithm supports.

        Returns
        -------
        bool
            False (with a logged reason) for edge masks other than ``object`` or for neither
            node nor edge masks.
        """
        if self.explainer_config.edge_mask_type not in (None, MaskType.object):
            logging.error(f"'{type(self).__name__}' gives one relevance per edge: edge_mask_type must be "
                          f"'object' or None (got '{self.explainer_config.edge_mask_type.value}')")
            return False
        if self.explainer_config.node_mask_type is None and self.explainer_config.edge_mask_type is None:
            logging.error(f"'{type(self).__name__}' needs node_mask_type or edge_mask_type")
            return False
        return True
