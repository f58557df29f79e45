"""Registry entries for PyTorch Geometric: message-passing layers, PyG's scatter and softmax, the
global pools. All of them are explained by running PyG's own code (see :mod:`fxlrp.eager.interpret`)."""

from __future__ import annotations

import importlib
from typing import Any

from torch import Tensor
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.utils import scatter, softmax

from fxlrp.eager.interpret import interpret
from fxlrp.eager.runner import LayerRunner, layer_runner
from fxlrp.integrations.pyg.messages import given_edges, messages_of
from fxlrp.operations.scatter import reduce_by_argument
from fxlrp.operations.sums import proportional
from fxlrp.registry import REGISTRY, Affine, Decomposed, Native, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules.attention import GRAPH_SOFTMAX


def message_passing(call: RelevanceCall, runner: LayerRunner, *args: Any, **kwargs: Any) -> Tensor:
    """A message-passing layer: its real forward, propagate, message, aggregate and update run
    with every operation on relevance-carrying tensors explained by its rule."""
    name = call.site.module_name if call.site is not None and call.site.module_name else type(runner.module).__name__
    with messages_of(runner.module, name, given_edges(args, kwargs)):
        return interpret(call, runner, *args, **kwargs)


register(
    Operation(
        "message_passing",
        Spelling(module_bases=(MessagePassing,), module_function=layer_runner),
        Decomposed(message_passing, weighted=True),
        description="PyG message-passing layer (any MessagePassing subclass), run with its parts explained",
    )
)
register(
    Operation(
        "pyg_scatter",
        Spelling(functions=(scatter,), leaf=True),
        Affine(reduce_by_argument, default_rule=proportional),
        ValueFlow(index_arguments=(1,)),
        description="torch_geometric.utils.scatter: sum/mean proportional, max/min winner-take-all",
    )
)
register(
    Operation(
        "global_pool",
        Spelling(functions=(global_add_pool, global_mean_pool, global_max_pool), leaf=True),
        Affine(interpret, default_rule=proportional),
        ValueFlow(index_arguments=(1,)),
        description="PyG global add/mean/max pooling over the nodes of each graph",
    )
)
REGISTRY.extend(GRAPH_SOFTMAX, functions=(softmax,))

# PyG replaces torch.index_select with a Python wrapper (for its HashTensor) that checks the
# dimension against input.dim(): recorded as one call, it runs natively (gradient = gather-add,
# which routes relevance like the original).
try:  # torch_geometric >= 2.7
    _pyg_index_select = getattr(importlib.import_module("torch_geometric.hash_tensor"), "_new_index_select", None)
except ImportError:
    _pyg_index_select = None
if _pyg_index_select is not None:
    register(
        Operation(
            "pyg_index_select",
            Spelling(functions=(_pyg_index_select,), leaf=True),
            Native(),
            description="torch.index_select as patched by torch_geometric: native",
        )
    )

# BasicGNN (GCN, GIN, GraphSAGE, GAT, ...) trims sampled mini-batches when these are given;
# fixed to None, its forward is a plain stack of layers.
REGISTRY.fix_arguments(BasicGNN, {"num_sampled_nodes_per_hop": None, "num_sampled_edges_per_hop": None})
