"""fxlrp for PyTorch Geometric.

Imported automatically by :func:`fxlrp.convert` when ``torch_geometric`` is in use; import it
yourself for :class:`LRPExplainer` (PyG's Explainer API), :func:`graph_relevance` (node and edge
relevance in one call), :func:`with_cp_lrp` (attention coefficients as constants) and
:func:`relevant_walks` / :func:`subgraph_relevance` (GNN-LRP's walks; :class:`HeteroWalks` on
heterogeneous graphs).
"""

from fxlrp.integrations.pyg import operations  # noqa: F401  (registers PyG's layers and functions)
from fxlrp.integrations.pyg.attention import with_cp_lrp
from fxlrp.integrations.pyg.explainer import LRPExplainer
from fxlrp.integrations.pyg.relevance import GraphRelevance, graph_relevance
from fxlrp.integrations.pyg.walk_steps import walk_steps
from fxlrp.integrations.pyg.walks import HeteroWalks, relevant_walks, subgraph_relevance

__all__ = ["LRPExplainer", "GraphRelevance", "graph_relevance", "with_cp_lrp", "relevant_walks", "subgraph_relevance",
           "walk_steps", "HeteroWalks"]
