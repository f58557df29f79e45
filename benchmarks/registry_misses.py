"""Which torch functions, Tensor methods and ``torch.sparse`` calls the model zoos make on
relevance-carrying tensors that fxlrp's registry has no entry for.

    python benchmarks/registry_misses.py                              # the default subset (~10 min on 2 cores)
    python benchmarks/registry_misses.py --zoos pyg,timm --markdown   # a table for docs/coverage.md
    python benchmarks/registry_misses.py --zoos torchvision --all     # every torchvision classifier

Each model (random weights, eval, float32, batch 1, small inputs, no downloads) is converted with
``capture="eager"`` and ``strict=False``, so that its whole forward runs under fxlrp's relevance
mode (:mod:`fxlrp.eager.interpret`), which sees every torch call: none is hidden inside a module a
graph would keep as one node, and an operation without a rule does not stop the run. The mode
reports each call on relevance-carrying tensors to the observer of ``operations_observed``, with
whether the registry has it; the calls it has no entry for are the misses, counted per operation with the
models and the first line of code that made them. One forward per model, no backward: a miss is
a call the registry lacks, whatever the composite. A model that cannot be built or run is listed
with its error (the sweep goes on).

Zoos (``--zoos``): ``torchvision`` (one classifier per family; ``--all``: every one),
``segmentation`` (torchvision's segmentation models), ``timm`` (the fixed sample of the tests),
``pyg`` (the tests' layer list, more message-passing layers and PyG's pooling layers, each in a
small network), ``hf`` (Hugging Face families of the tests, small configurations). Results go to
``out/registry_misses/results.json``; ``--markdown`` prints the table of misses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fxlrp  # noqa: E402
from fxlrp.capture.source import is_library_file  # noqa: E402
from fxlrp.eager.rule_choice import operations_observed  # noqa: E402

OUT = os.path.join(ROOT, "out", "registry_misses")


@dataclass
class Model:
    """A model of a zoo: ``build()`` gives the model, ``inputs()`` its arguments (floating tensors
    among them carry relevance; integer ones are ids or indices)."""

    zoo: str
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    kwargs: Callable[[], dict[str, Any]] = field(default=dict)


# ------------------------------------------------------------------------------------------ zoos

TORCHVISION_FAMILIES = (
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
    "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small", "regnet_x_400mf",
    "regnet_y_400mf", "resnet18", "resnext50_32x4d", "shufflenet_v2_x0_5", "squeezenet1_0", "swin_t",
    "swin_v2_t", "vgg11", "vit_b_16", "wide_resnet50_2",
)


def _image_size(name: str) -> int:
    if name.startswith(("vit_", "maxvit")):
        return 224
    if name.startswith("inception"):
        return 75
    if name.startswith(("alexnet", "swin")):
        return 64
    if name.startswith(("convnext", "densenet", "vgg")):
        return 32
    return 24 if name.startswith("squeezenet") else 16


def _image(size: int) -> tuple[Tensor]:
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def torchvision_models(every: bool) -> Iterator[Model]:
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models) if every else TORCHVISION_FAMILIES
    for name in names:
        def build(name: str = name) -> nn.Module:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torchvision.models.get_model(name, weights=None)

        yield Model("torchvision", name, build, lambda name=name: _image(_image_size(name)))


def segmentation_models(every: bool) -> Iterator[Model]:
    import torchvision

    for name in torchvision.models.list_models(module=torchvision.models.segmentation):
        def build(name: str = name) -> nn.Module:
            return torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5)

        yield Model("segmentation", name, build, lambda: _image(32))


TIMM_SAMPLE: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("resnet18", 32, {}), ("regnetx_002", 32, {}), ("densenet121", 32, {}),
    ("test_vit", 32, {"img_size": 32, "dynamic_img_size": False}),
    ("swin_tiny_patch4_window7_224", 32,
     {"img_size": 32, "window_size": 4, "embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2)}),
    ("convnextv2_atto", 32, {}), ("levit_128s", 64, {"img_size": 64}), ("test_nfnet", 32, {}),
    ("efficientformerv2_s0", 64, {"img_size": 64}), ("test_coatnet", 64, {"img_size": 64}),
    ("test_efficientnet", 32, {}), ("caformer_s18", 32, {}), ("nest_tiny", 32, {"img_size": 32}),
)
"""The tests' timm sample (tests/models/test_timm_sample.py; CAFormer and NesT at their smallest
timm configurations here, where the tests build smaller ones)."""


def timm_models(every: bool) -> Iterator[Model]:
    import timm

    for name, size, settings in TIMM_SAMPLE:
        def build(name: str = name, settings: dict[str, Any] = settings) -> nn.Module:
            return timm.create_model(name, pretrained=False, num_classes=10, **settings)

        yield Model("timm", name, build, lambda size=size: _image(size))


class _Convolutions(nn.Module):
    """Two layers of one kind with ReLU between them, a global pool and a linear head."""

    def __init__(self, make: Callable[[int, int], nn.Module], features: int, width: int,
                 call: Callable[..., Tensor] | None = None) -> None:
        super().__init__()
        self.first, self.second = make(features, width), make(width, width)
        self.call = call
        self.head = nn.Linear(width, 3)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        from torch_geometric.nn import global_add_pool

        call = self.call or (lambda layer, x, edge_index, edge_attr, x0: layer(x, edge_index))
        x0 = x
        x = call(self.first, x, edge_index, edge_attr, x0).relu()
        x = call(self.second, x, edge_index, edge_attr, x0).relu()
        return self.head(global_add_pool(x, batch))


class _Pooled(nn.Module):
    """A GCN layer, a hierarchical pooling layer, a GCN layer on the pooled graph and a readout."""

    def __init__(self, pool: nn.Module, width: int, weighted: bool) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.before, self.pool, self.after = GCNConv(5, width), pool, GCNConv(width, width)
        self.weighted = weighted
        self.head = nn.Linear(width, 3)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        from torch_geometric.nn import global_add_pool

        x = self.before(x, edge_index).relu()
        if self.weighted:  # ASAPooling: coarsened edge weights that carry relevance
            x, edge_index, edge_weight, batch, _ = self.pool(x, edge_index, batch=batch,
                                                             edge_weight=torch.ones(edge_index.size(1)))
        else:
            pooled = self.pool(x, edge_index, batch=batch)
            if len(pooled) == 4:  # EdgePooling: x, edge_index, batch, how to unpool
                x, edge_index, batch = pooled[0], pooled[1], pooled[2]
            else:  # TopK, SAG: x, edge_index, edge_attr, batch, perm, score
                x, edge_index, batch = pooled[0], pooled[1], pooled[3]
            edge_weight = None
        x = self.after(x, edge_index, edge_weight).relu()
        return self.head(global_add_pool(x, batch))


class _OnSparseAdjacency(nn.Module):
    """A message-passing layer given its graph as a torch.sparse CSR adjacency (``adj_t``, as
    PyG's docs write it), then a global sum and a linear head."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer, self.head = layer, nn.Linear(8, 3)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        from torch_geometric.nn import global_add_pool
        from torch_geometric.utils import to_torch_csr_tensor

        adjacency = to_torch_csr_tensor(edge_index.flip(0), size=(x.size(0), x.size(0)))
        return self.head(global_add_pool(self.layer(x, adjacency).relu(), batch))


class _Dense(nn.Module):
    """A dense GNN: node features and an adjacency matrix per graph, a dense pooling layer."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        from torch_geometric.nn import DenseGCNConv

        self.conv, self.assign, self.kind = DenseGCNConv(5, 8), nn.Linear(5, 3), kind
        if kind == "dmon":
            from torch_geometric.nn import DMoNPooling

            self.dmon = DMoNPooling(8, 3)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        from torch_geometric.nn import dense_diff_pool, dense_mincut_pool
        from torch_geometric.utils import to_dense_adj, to_dense_batch

        dense, mask = to_dense_batch(x, batch)
        adjacency = to_dense_adj(edge_index, batch)
        h = self.conv(dense, adjacency, mask).relu()
        if self.kind == "dmon":
            _, pooled, _, _, _, _ = self.dmon(h, adjacency, mask)
        else:
            pool = dense_diff_pool if self.kind == "diff" else dense_mincut_pool
            pooled = pool(h, adjacency, self.assign(dense), mask)[0]
        return self.head(pooled.sum(dim=1))


def pyg_models(every: bool) -> Iterator[Model]:
    import torch_geometric.nn as gnn

    def mlp(a: int, b: int) -> nn.Module:
        return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b))

    with_edges = lambda layer, x, edge_index, edge_attr, x0: layer(x, edge_index, edge_attr)  # noqa: E731
    with_x0 = lambda layer, x, edge_index, edge_attr, x0: layer(x, x0, edge_index)  # noqa: E731
    layers: dict[str, tuple[Callable[[int, int], nn.Module], Any]] = {
        # the tests' list (tests/support/pyg_networks.py)
        "GCNConv": (lambda a, b: gnn.GCNConv(a, b), None),
        "GINConv": (lambda a, b: gnn.GINConv(mlp(a, b), train_eps=True), None),
        "SAGEConv(mean)": (lambda a, b: gnn.SAGEConv(a, b, aggr="mean"), None),
        "SAGEConv(max)": (lambda a, b: gnn.SAGEConv(a, b, aggr="max"), None),
        "GraphConv(add)": (lambda a, b: gnn.GraphConv(a, b, aggr="add"), None),
        "GraphConv(max)": (lambda a, b: gnn.GraphConv(a, b, aggr="max"), None),
        "EdgeConv": (lambda a, b: gnn.EdgeConv(mlp(2 * a, b), aggr="max"), None),
        "GATConv": (lambda a, b: gnn.GATConv(a, b // 2, heads=2), None),
        "GATv2Conv": (lambda a, b: gnn.GATv2Conv(a, b // 2, heads=2), None),
        "TransformerConv": (lambda a, b: gnn.TransformerConv(a, b // 2, heads=2), None),
        "GINEConv": (lambda a, b: gnn.GINEConv(mlp(a, b), edge_dim=3), with_edges),
        # more message-passing layers
        "ChebConv": (lambda a, b: gnn.ChebConv(a, b, K=3), None),
        "TAGConv": (lambda a, b: gnn.TAGConv(a, b), None),
        "SGConv": (lambda a, b: gnn.SGConv(a, b, K=2), None),
        "ARMAConv": (lambda a, b: gnn.ARMAConv(a, b), None),
        "LEConv": (lambda a, b: gnn.LEConv(a, b), None),
        "ResGatedGraphConv": (lambda a, b: gnn.ResGatedGraphConv(a, b), None),
        "GENConv": (lambda a, b: gnn.GENConv(a, b), None),
        "ClusterGCNConv": (lambda a, b: gnn.ClusterGCNConv(a, b), None),
        "GeneralConv": (lambda a, b: gnn.GeneralConv(a, b), None),
        "FiLMConv": (lambda a, b: gnn.FiLMConv(a, b), None),
        "MFConv": (lambda a, b: gnn.MFConv(a, b), None),
        "FeaStConv": (lambda a, b: gnn.FeaStConv(a, b, heads=2), None),
        "SuperGATConv": (lambda a, b: gnn.SuperGATConv(a, b // 2, heads=2), None),
        "SSGConv": (lambda a, b: gnn.SSGConv(a, b, alpha=0.1), None),
        "MixHopConv": (lambda a, b: nn.Sequential(), None),  # replaced below
        "HypergraphConv": (lambda a, b: gnn.HypergraphConv(a, b), None),
        "CGConv": (lambda a, b: nn.Sequential(gnn.CGConv(a, dim=3), nn.Linear(a, b)), None),  # replaced below
        "GCN2Conv": (lambda a, b: gnn.GCN2Conv(b, alpha=0.1), with_x0),
        "FAConv": (lambda a, b: gnn.FAConv(b), with_x0),
        "AntiSymmetricConv": (lambda a, b: gnn.AntiSymmetricConv(b), None),
        "GPSConv": (lambda a, b: gnn.GPSConv(b, gnn.GCNConv(b, b), heads=2), None),
        "PNAConv": (lambda a, b: gnn.PNAConv(a, b, aggregators=["mean", "min", "max", "std"],
                                              scalers=["identity", "amplification"], deg=torch.tensor([0, 2, 4, 2])),
                    None),
    }
    del layers["MixHopConv"], layers["CGConv"]
    for name, (make, call) in layers.items():
        square = name in ("GCN2Conv", "FAConv", "AntiSymmetricConv", "GPSConv")
        features = 8 if square else 5

        def build(make: Callable[[int, int], nn.Module] = make, call: Any = call,
                  features: int = features) -> nn.Module:
            return _Convolutions(make, features, 8, call)

        yield Model("pyg", name, build, lambda features=features: _graph(features))
    for name, make in {"GCNConv": lambda: gnn.GCNConv(5, 8), "GINConv": lambda: gnn.GINConv(mlp(5, 8)),
                       "SAGEConv(mean)": lambda: gnn.SAGEConv(5, 8), "GraphConv(add)": lambda: gnn.GraphConv(5, 8),
                       "LEConv": lambda: gnn.LEConv(5, 8)}.items():
        yield Model("pyg", f"{name} on a torch.sparse adjacency", lambda make=make: _OnSparseAdjacency(make()),
                    lambda: _graph(5))
    pools: dict[str, tuple[Callable[[], nn.Module], bool]] = {
        "TopKPooling": (lambda: gnn.TopKPooling(8, ratio=0.5), False),
        "SAGPooling": (lambda: gnn.SAGPooling(8, ratio=0.5), False),
        "ASAPooling": (lambda: gnn.ASAPooling(8, ratio=0.5), False),
        "ASAPooling(edge weights)": (lambda: gnn.ASAPooling(8, ratio=0.5), True),
        "EdgePooling": (lambda: gnn.EdgePooling(8), False),
    }
    for name, (make, weighted) in pools.items():
        yield Model("pyg", name, lambda make=make, weighted=weighted: _Pooled(make(), 8, weighted), lambda: _graph(5))
    for kind, name in (("diff", "dense_diff_pool"), ("mincut", "dense_mincut_pool"), ("dmon", "DMoNPooling")):
        yield Model("pyg", name, lambda kind=kind: _Dense(kind), lambda: _graph(5))


def _graph(features: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    nodes = 12
    x = torch.randn(nodes, features, generator=generator)
    pairs = torch.randint(0, nodes, (2, 18), generator=generator)
    pairs = pairs[:, pairs[0] != pairs[1]]
    edge_index = torch.cat([pairs, pairs.flip(0)], dim=1)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=generator)
    batch = torch.tensor([0] * 7 + [1] * 5)
    return x, edge_index, edge_attr, batch


HF_SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
HF_DECODER = {"vocab_size": 100, **HF_SMALL, "num_key_value_heads": 2, "max_position_embeddings": 64}
HF_SEQ2SEQ = "ids+decoder"

HF_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (model class, config class, settings), as the tests build them (tests/integrations/test_transformers.py)
    "BertForSequenceClassification": ("BertForSequenceClassification", "BertConfig",
                                      {"vocab_size": 100, **HF_SMALL, "num_labels": 3}),
    "RobertaForQuestionAnswering": ("RobertaForQuestionAnswering", "RobertaConfig",
                                    {"vocab_size": 100, **HF_SMALL, "pad_token_id": 1}),
    "DistilBertForSequenceClassification": ("DistilBertForSequenceClassification", "DistilBertConfig", {
        "vocab_size": 100, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "num_labels": 3}),
    "GPT2LMHeadModel": ("GPT2LMHeadModel", "GPT2Config",
                        {"vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    "LlamaForCausalLM": ("LlamaForCausalLM", "LlamaConfig", {**HF_DECODER, "attention_bias": True}),
    "Qwen2ForCausalLM": ("Qwen2ForCausalLM", "Qwen2Config", HF_DECODER),
    "Qwen3ForCausalLM": ("Qwen3ForCausalLM", "Qwen3Config", {**HF_DECODER, "head_dim": 8}),
    "Qwen3MoeForCausalLM": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {
        **HF_DECODER, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}),
    "Gemma3ForCausalLM": ("Gemma3ForCausalLM", "Gemma3TextConfig", {
        **HF_DECODER, "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"]}),
    "BloomForCausalLM": ("BloomForCausalLM", "BloomConfig",
                         {"vocab_size": 100, "hidden_size": 32, "n_layer": 2, "n_head": 4}),
    "T5ForConditionalGeneration": ("T5ForConditionalGeneration", "T5Config", {
        "vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
        "decoder_start_token_id": 0}),
    "ViTForImageClassification": ("ViTForImageClassification", "ViTConfig",
                                  {"image_size": 16, "patch_size": 8, **HF_SMALL, "num_labels": 3}),
    "SiglipVisionModel": ("SiglipVisionModel", "SiglipVisionConfig", {"image_size": 16, "patch_size": 8, **HF_SMALL}),
    "WhisperForConditionalGeneration": ("WhisperForConditionalGeneration", "WhisperConfig", {
        "vocab_size": 100, "num_mel_bins": 8, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "max_source_positions": 10, "max_target_positions": 16, "decoder_start_token_id": 1, "pad_token_id": 0}),
    "Wav2Vec2ForSequenceClassification": ("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", {
        "vocab_size": 100, **HF_SMALL, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
        "num_conv_pos_embeddings": 8, "num_conv_pos_embedding_groups": 4, "num_labels": 3,
        "classifier_proj_size": 16}),
    "MambaForCausalLM": ("MambaForCausalLM", "MambaConfig", {
        "vocab_size": 100, "hidden_size": 32, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
        "conv_kernel": 4, "use_cache": False}),
    "MistralForCausalLM": ("MistralForCausalLM", "MistralConfig", HF_DECODER),
    "Phi3ForCausalLM": ("Phi3ForCausalLM", "Phi3Config", {**HF_DECODER, "pad_token_id": 0}),
    "PhiForCausalLM": ("PhiForCausalLM", "PhiConfig", {**HF_DECODER, "partial_rotary_factor": 0.5}),
    "GPTNeoXForCausalLM": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {
        "vocab_size": 100, **HF_SMALL, "rotary_pct": 0.5, "max_position_embeddings": 64}),
    "OPTForCausalLM": ("OPTForCausalLM", "OPTConfig", {
        "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "ffn_dim": 64, "num_attention_heads": 4,
        "max_position_embeddings": 64, "word_embed_proj_dim": 32}),
    "GPTJForCausalLM": ("GPTJForCausalLM", "GPTJConfig", {
        "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_positions": 64}),
    "GPTBigCodeForCausalLM": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", {
        "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    "Gemma2ForCausalLM": ("Gemma2ForCausalLM", "Gemma2Config", {
        **HF_DECODER, "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4}),
    "Starcoder2ForCausalLM": ("Starcoder2ForCausalLM", "Starcoder2Config", HF_DECODER),
    "Olmo2ForCausalLM": ("Olmo2ForCausalLM", "Olmo2Config", {**HF_DECODER, "pad_token_id": 0}),
    "StableLmForCausalLM": ("StableLmForCausalLM", "StableLmConfig", HF_DECODER),
    "MixtralForCausalLM": ("MixtralForCausalLM", "MixtralConfig",
                           {**HF_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "Qwen2MoeForCausalLM": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", {
        **HF_DECODER, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16}),
    "SwitchTransformersForConditionalGeneration": ("SwitchTransformersForConditionalGeneration",
                                                   "SwitchTransformersConfig", {
        "vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2,
        "num_heads": 4, "num_experts": 4, "expert_capacity": 64, "encoder_sparse_step": 1,
        "decoder_sparse_step": 1, "decoder_start_token_id": 0}),
    "AlbertForSequenceClassification": ("AlbertForSequenceClassification", "AlbertConfig",
                                        {"vocab_size": 100, "embedding_size": 16, **HF_SMALL, "num_labels": 3}),
    "ElectraForSequenceClassification": ("ElectraForSequenceClassification", "ElectraConfig",
                                         {"vocab_size": 100, "embedding_size": 16, **HF_SMALL, "num_labels": 3}),
    "XLMRobertaForSequenceClassification": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                                            {"vocab_size": 100, **HF_SMALL, "pad_token_id": 1, "num_labels": 3}),
    "MPNetForSequenceClassification": ("MPNetForSequenceClassification", "MPNetConfig",
                                       {"vocab_size": 100, **HF_SMALL, "num_labels": 3}),
    "DebertaV2ForSequenceClassification": ("DebertaV2ForSequenceClassification", "DebertaV2Config",
                                           {"vocab_size": 100, **HF_SMALL, "num_labels": 3}),
    "BartForConditionalGeneration": ("BartForConditionalGeneration", "BartConfig", {
        "vocab_size": 100, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64}),
    "BeitForImageClassification": ("BeitForImageClassification", "BeitConfig", {
        "image_size": 16, "patch_size": 8, **HF_SMALL, "num_labels": 3, "use_relative_position_bias": True}),
    "Dinov2Model": ("Dinov2Model", "Dinov2Config", {"image_size": 16, "patch_size": 8, **HF_SMALL}),
    "DeiTForImageClassification": ("DeiTForImageClassification", "DeiTConfig",
                                   {"image_size": 16, "patch_size": 8, **HF_SMALL, "num_labels": 3}),
    "SwinForImageClassification": ("SwinForImageClassification", "SwinConfig", {
        "image_size": 16, "patch_size": 2, "embed_dim": 8, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4,
        "num_labels": 3}),
    "ConvNextForImageClassification": ("ConvNextForImageClassification", "ConvNextConfig",
                                       {"num_stages": 2, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3}),
    "ConvBertForSequenceClassification": ("ConvBertForSequenceClassification", "ConvBertConfig", {
        "vocab_size": 100, **HF_SMALL, "embedding_size": 16, "conv_kernel_size": 3, "max_position_embeddings": 64,
        "num_labels": 3}),
    "EsmForSequenceClassification": ("EsmForSequenceClassification", "EsmConfig", {
        "vocab_size": 100, **HF_SMALL, "pad_token_id": 1, "mask_token_id": 2, "position_embedding_type": "rotary",
        "max_position_embeddings": 64, "num_labels": 3}),
    "RoFormerForSequenceClassification": ("RoFormerForSequenceClassification", "RoFormerConfig",
                                          {"vocab_size": 100, **HF_SMALL, "max_position_embeddings": 64,
                                           "num_labels": 3}),
    "DeepseekV3ForCausalLM": ("DeepseekV3ForCausalLM", "DeepseekV3Config", {
        **HF_DECODER, "num_key_value_heads": 4, "moe_intermediate_size": 16, "n_routed_experts": 4,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
        "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}),
    "Llama4ForCausalLM": ("Llama4ForCausalLM", "Llama4TextConfig", {
        **HF_DECODER, "head_dim": 8, "intermediate_size_mlp": 64, "num_local_experts": 4, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1}),
    "FalconMambaForCausalLM": ("FalconMambaForCausalLM", "FalconMambaConfig", {
        "vocab_size": 100, "hidden_size": 32, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
        "conv_kernel": 4, "use_cache": False}),
    "JambaForCausalLM": ("JambaForCausalLM", "JambaConfig", {
        **HF_DECODER, "num_experts": 1, "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 8,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 4, "use_cache": False}),
    "Mamba2ForCausalLM": ("Mamba2ForCausalLM", "Mamba2Config", {
        "vocab_size": 100, "hidden_size": 32, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
        "num_heads": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 4, "conv_kernel": 4, "use_cache": False}),
    "BambaForCausalLM": ("BambaForCausalLM", "BambaConfig", {
        **HF_DECODER, "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_n_groups": 1, "mamba_d_state": 8,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 4, "attn_layer_indices": [1],
        "use_cache": False}),
    "ZambaForCausalLM": ("ZambaForCausalLM", "ZambaConfig", {
        "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "n_mamba_heads": 2, "mamba_d_state": 8,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 4, "attn_layer_period": 1, "attn_layer_offset": 0,
        "use_cache": False}),
}


def _hf_inputs(name: str) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 100, (1, 7), generator=generator)
    if name.startswith(("ViT", "Siglip", "Beit", "Dinov2", "DeiT", "Swin")):
        return (torch.randn(1, 3, 16, 16, generator=generator),)
    if name.startswith("ConvNext"):
        return (torch.randn(1, 3, 32, 32, generator=generator),)
    if name.startswith("Wav2Vec2"):
        return (torch.randn(1, 400, generator=generator),)
    decoder = torch.randint(3, 100, (1, 3), generator=generator)
    if name.startswith("Whisper"):
        return (torch.randn(1, 8, 20, generator=generator), None, decoder)
    if name.startswith(("T5", "Bart", "SwitchTransformers")):
        return (ids, None, decoder)
    return (ids,)


def hf_models(every: bool) -> Iterator[Model]:
    import transformers

    for name, (model_class, config_class, settings) in HF_FAMILIES.items():
        def build(model_class: str = model_class, config_class: str = config_class,
                  settings: dict[str, Any] = settings) -> nn.Module:
            return getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))

        yield Model("hf", name, build, lambda name=name: _hf_inputs(name))


ZOOS: dict[str, Callable[[bool], Iterator[Model]]] = {
    "torchvision": torchvision_models, "segmentation": segmentation_models, "timm": timm_models,
    "pyg": pyg_models, "hf": hf_models,
}


# ------------------------------------------------------------------------------------------ sweep


class MissObserver:
    """The observer of ``operations_observed``: every call on relevance-carrying tensors, and for those the
    registry lacks, how often and the first line of code that made each."""

    def __init__(self) -> None:
        self.calls = 0
        self.misses: dict[str, dict[str, Any]] = {}

    def __call__(self, interpretation: Any, name: str, has_rule: bool) -> None:
        self.calls += 1
        if not has_rule:
            entry = self.misses.setdefault(name, {"calls": 0, "where": _calling_line()})
            entry["calls"] += 1

    @contextmanager
    def observing(self) -> Iterator[MissObserver]:
        with operations_observed(self):
            yield self


def _calling_line() -> str:
    """``file:line: code`` of the innermost frame outside torch, fxlrp and this script."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not is_library_file(frame.filename) and frame.filename != os.path.abspath(__file__):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "?"


def carrying(value: Any) -> Any:
    """Floating tensors as relevance-carrying leaves (integer ones stay: ids, indices)."""
    if isinstance(value, Tensor) and value.is_floating_point():
        return value.clone().requires_grad_()
    return value


def sweep_one(model: Model) -> dict[str, Any]:
    """Build, convert to run eagerly as a whole, run once under the observer."""
    record: dict[str, Any] = {"zoo": model.zoo, "model": model.name}
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        module = model.build().eval()
        inputs = model.inputs()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            explain = fxlrp.convert(module, capture="eager", strict=False)
            observer = MissObserver()
            with observer.observing(), torch.enable_grad():
                explain(*(carrying(value) for value in inputs), **model.kwargs())
        record["calls"] = observer.calls
        record["misses"] = observer.misses
    except Exception as error:  # noqa: BLE001  (the sweep goes on; the error is its result)
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        record["trace"] = traceback.format_exc(limit=-3)[-1500:]
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def markdown(records: list[dict[str, Any]]) -> str:
    """One row per operation the registry lacks: the models that call it, how often, where first."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        for name, entry in record.get("misses", {}).items():
            row = rows.setdefault(name, {"models": [], "calls": 0, "where": entry["where"]})
            row["models"].append(f"{record['zoo']}:{record['model']}")
            row["calls"] += entry["calls"]
    lines = ["| operation | models (zoo:name) | calls | first call |", "| --- | --- | --- | --- |"]
    for name, row in sorted(rows.items()):
        where = row["where"].replace("|", "\\|")
        if ROOT in where:
            where = where.replace(ROOT + os.sep, "")
        site = where.split("site-packages/")[-1]
        lines.append(f"| `{name}` | {', '.join(row['models'])} | {row['calls']} | `{site[:110]}` |")
    errors = [record for record in records if "error" in record]
    if errors:
        lines += ["", "| model | did not run |", "| --- | --- |"]
        lines += [f"| {record['zoo']}:{record['model']} | {record['error'].replace('|', '/')[:160]} |"
                  for record in errors]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoos", default="torchvision,segmentation,timm,pyg,hf",
                        help=f"comma-separated, of {', '.join(ZOOS)}")
    parser.add_argument("--all", action="store_true", help="every torchvision classifier, not one per family")
    parser.add_argument("--models", default="", help="comma-separated model names: only these")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--markdown", action="store_true", help="print the table of misses")
    parser.add_argument("--out", default=os.path.join(OUT, "results.json"))
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    chosen = {name for name in arguments.models.split(",") if name}
    records = []
    for zoo in arguments.zoos.split(","):
        for model in ZOOS[zoo](arguments.all):
            if chosen and model.name not in chosen:
                continue
            record = sweep_one(model)
            records.append(record)
            found = ", ".join(record.get("misses", {})) or ("-" if "error" not in record else record["error"][:100])
            print(f"{zoo:12s} {model.name:36s} {record['seconds']:7.1f} s  {found}", flush=True)
    os.makedirs(os.path.dirname(arguments.out), exist_ok=True)
    with open(arguments.out, "w") as file:
        json.dump(records, file, indent=1)
    if arguments.markdown:
        print(markdown(records))


if __name__ == "__main__":
    main()
