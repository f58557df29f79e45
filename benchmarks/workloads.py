"""The models and inputs the benchmark explains: torchvision CNNs, a vision transformer, a GCN
written with plain torch + torch_scatter, and Hugging Face's ViT, which only the eager capture
path takes. Random weights (no downloads), eval mode,
parameters frozen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# Normalised images lie roughly in [-3, 3]: the box of the first layer's zB rule.
IMAGE_LOW, IMAGE_HIGH = -3.0, 3.0


@dataclass
class Workload:
    """A model, the inputs it is called with, and which input is explained (the others are
    indices or constants)."""

    name: str
    model: nn.Module
    inputs: tuple[Tensor, ...]
    explained: int = 0
    low: float = IMAGE_LOW
    high: float = IMAGE_HIGH
    zennit_canonizers: Callable[[], list] = list
    """Builds zennit's canonizers for this model (zennit has none for ViT or graphs)."""

    @property
    def device(self) -> torch.device:
        return self.inputs[self.explained].device


class GCNLayer(nn.Module):
    """``H' = D^-1/2 A D^-1/2 (H W) + b`` with messages gathered by ``index_select`` and summed by
    ``torch_scatter.scatter_add``, as a user writes it without PyG."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor, source: Tensor, target: Tensor, norm: Tensor) -> Tensor:
        from torch_scatter import scatter_add

        h = self.linear(x)
        messages = h.index_select(0, source) * norm.unsqueeze(-1)
        return scatter_add(messages, target, dim=0, dim_size=x.size(0)) + self.bias


def gcn_norm(edge_index: Tensor, nodes: int) -> Tensor:
    """``1 / sqrt(deg(i) deg(j))`` per edge, computed once per graph (PyG's ``cached=True``)."""
    from torch_scatter import scatter_add

    source, target = edge_index
    degree = scatter_add(torch.ones(target.numel()), target, dim=0, dim_size=nodes).clamp(min=1.0)
    inverse_root = degree.rsqrt()
    return inverse_root[source] * inverse_root[target]


class GCN(nn.Module):
    """Two GCN layers with a ReLU between them; node classification logits."""

    def __init__(self, in_features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GCNLayer(in_features, hidden)
        self.conv2 = GCNLayer(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor, norm: Tensor) -> Tensor:
        source, target = edge_index[0], edge_index[1]
        hidden = torch.relu(self.conv1(x, source, target, norm))
        return self.conv2(hidden, source, target, norm)


def _torchvision(name: str, batch: int, size: int) -> Workload:
    import torchvision
    from zennit.torchvision import ResNetCanonizer, VGGCanonizer

    kwargs = {"image_size": size} if name.startswith("vit") else {}
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    # torchvision starts ViT's head at zero: its logits, gradients and relevance would all be 0,
    # which every method computes fast. Random weights there, as in a trained head.
    for module in model.modules():
        if isinstance(module, nn.Linear) and not module.weight.any():
            nn.init.normal_(module.weight, std=0.02)
    # zennit has no DenseNet canonizer (its sequential BatchNorm merge pairs the wrong layers there).
    canonizers = {"resnet": ResNetCanonizer, "vgg": VGGCanonizer}
    canonizer = next((build for prefix, build in canonizers.items() if name.startswith(prefix)), None)
    return Workload(
        name, model, (torch.randn(batch, 3, size, size),),
        zennit_canonizers=(lambda: [canonizer()]) if canonizer else list,
    )


class Logits(nn.Module):
    """A Hugging Face classifier's logits (its output is a ModelOutput)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits


def _hugging_face_vit(batch: int, size: int, layers: int = 12, hidden: int = 768) -> Workload:
    """Hugging Face's ViT-Base (random weights): torch.fx cannot trace it, fxlrp runs it eagerly."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=size, patch_size=16, num_hidden_layers=layers, hidden_size=hidden,
                       num_attention_heads=hidden // 64, intermediate_size=4 * hidden, num_labels=1000,
                       attn_implementation="sdpa")
    return Workload("hf_vit_base", Logits(ViTForImageClassification(config)), (torch.randn(batch, 3, size, size),))


def _gcn(nodes: int, edges: int, features: int = 64, hidden: int = 64, classes: int = 8) -> Workload:
    edge_index = torch.randint(0, nodes, (2, edges))
    x = torch.randn(nodes, features)
    return Workload(
        "gcn", GCN(features, hidden, classes), (x, edge_index, gcn_norm(edge_index, nodes)),
        low=float(x.min()), high=float(x.max()),
    )


FULL: dict[str, Callable[[int | None], Workload]] = {
    "resnet50": lambda batch: _torchvision("resnet50", batch or 4, 224),
    "vgg16": lambda batch: _torchvision("vgg16", batch or 4, 224),
    "densenet121": lambda batch: _torchvision("densenet121", batch or 4, 224),
    "vit_b_16": lambda batch: _torchvision("vit_b_16", batch or 2, 224),
    "gcn": lambda batch: _gcn(100_000, 1_000_000),
    "hf_vit_base": lambda batch: _hugging_face_vit(batch or 2, 224),
}
QUICK: dict[str, Callable[[int | None], Workload]] = {
    "resnet50": lambda batch: _torchvision("resnet50", batch or 1, 64),
    "vgg16": lambda batch: _torchvision("vgg16", batch or 1, 64),
    "densenet121": lambda batch: _torchvision("densenet121", batch or 1, 64),
    "vit_b_16": lambda batch: _torchvision("vit_b_16", batch or 1, 32),
    "gcn": lambda batch: _gcn(2_000, 20_000),
    "hf_vit_base": lambda batch: _hugging_face_vit(batch or 1, 32, layers=2, hidden=128),
}
QUICK_DESCRIPTION = "batch 1 at 64x64 (ViT 32x32), GCN with 2k nodes and 20k edges"
DESCRIPTIONS = {
    "resnet50": "batch 4, 3x224x224",
    "vgg16": "batch 4, 3x224x224",
    "densenet121": "batch 4, 3x224x224",
    "vit_b_16": "batch 2, 3x224x224",
    "gcn": "100k nodes, 1M edges, 64 -> 64 -> 8 features",
    "hf_vit_base": "Hugging Face ViTForImageClassification, ViT-Base config, batch 2, 3x224x224; run eagerly",
}


def build(name: str, quick: bool, device: str = "cpu", batch: int | None = None) -> Workload:
    """The workload ``name`` in eval mode with frozen parameters and a fixed seed, on ``device``;
    ``batch`` replaces the images' default batch size (graphs have none)."""
    torch.manual_seed(0)
    workload = (QUICK if quick else FULL)[name](batch)
    workload.model.eval().requires_grad_(False).to(device)
    workload.inputs = tuple(value.to(device) for value in workload.inputs)
    return workload
