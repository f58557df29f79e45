"""fxlrp for PyTorch Geometric.

Imported automatically by :func:`fxlrp.convert` when ``torch_geometric`` is in use; import it
yourself for :class:`LRPExplainer` (PyG's Explainer API), :func:`graph_relevance` (node and edge
relevance in one call), :func:`with_cp_lrp` (attention coefficients as constants) and
:func:`relevant_walks` / :func:`subgraph_relevance` (GNN-LRP's walks; :class:`HeteroWalks` on
heterogeneous graphs).
"""

from fxlrp.pyg import operations  # noqa: F401  (registers PyG's layers and functions)
from fxlrp.pyg.attention import with_cp_lrp
from fxlrp.pyg.explainer import LRPExplainer
from fxlrp.pyg.relevance import GraphRelevance, graph_relevance
from fxlrp.pyg.walks import HeteroWalks, relevant_walks, subgraph_relevance, walk_steps

__all__ = ["LRPExplainer", "GraphRelevance", "graph_relevance", "with_cp_lrp", "relevant_walks", "subgraph_relevance",
           "walk_steps", "HeteroWalks"]
