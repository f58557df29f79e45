"""Explanations on a CUDA device: the relevance the CPU gives, for each kind of model fxlrp takes.

Each test explains the same model and inputs in float64 on the CPU and on the GPU and compares
the two to float64's rounding (the kernels differ, the arithmetic does not): a constant, a mask or
an index left on the CPU, or an operation whose rule builds a tensor on the wrong device, fails
here with an error or a different heatmap. LRP-0 = gradient x input on the GPU ties the GPU's
relevance to its own gradient. The tests need a CUDA device and are skipped without one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import AttnLRP, EpsilonGammaBox, EpsilonPlusFlat

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
torchvision = pytest.importorskip("torchvision")

TOLERANCE = 1e-10
"""float64 on two devices: the same sums in other orders, relative to the largest relevance."""


def _randomised_batch_norm(model: nn.Module) -> nn.Module:
    generator = torch.Generator().manual_seed(3)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    return model


def _on_both(build: Callable[[], nn.Module], inputs: Any, composite: Any, **attribute: Any) -> tuple[Any, Any]:
    """The relevance of the inputs on the CPU and on the GPU (brought back), float64."""
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = build().double().eval().to(device)
        moved = _moved(inputs, device)
        relevance = fxlrp.attribute(fxlrp.convert(model, composite), moved, **attribute)
        results.append(_moved(relevance, "cpu"))
    return results[0], results[1]


def _moved(value: Any, device: str) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(item, device) for item in value)
    if isinstance(value, dict):
        return {key: _moved(item, device) for key, item in value.items()}
    return value


def _assert_same(cpu: Any, gpu: Any) -> None:
    cpu_values = [cpu] if isinstance(cpu, Tensor) else [value for value in cpu if value is not None]
    gpu_values = [gpu] if isinstance(gpu, Tensor) else [value for value in gpu if value is not None]
    for expected, actual in zip(cpu_values, gpu_values, strict=True):
        assert torch.isfinite(actual).all()
        assert expected.abs().max() > 0
        assert relative_error(actual, expected) < TOLERANCE


def _resnet() -> nn.Module:
    return _randomised_batch_norm(torchvision.models.resnet18(weights=None, num_classes=10))


IMAGE = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("composite", [EpsilonPlusFlat(), EpsilonGammaBox(low=-3.0, high=3.0), Epsilon(1e-6)],
                         ids=["EpsilonPlusFlat", "EpsilonGammaBox", "Epsilon"])
def test_a_cnn_explained_on_the_gpu_gives_the_cpu_relevance(composite: Any) -> None:
    cpu, gpu = _on_both(_resnet, IMAGE, composite, target=3)
    _assert_same(cpu, gpu)


def test_lrp0_on_the_gpu_is_gradient_times_input() -> None:
    torch.manual_seed(0)
    model = _resnet().double().eval().cuda()
    image = IMAGE.cuda()
    relevance = fxlrp.attribute(fxlrp.convert(model, Epsilon(0.0)), image, target=3)
    leaf = image.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)[:, 3].sum(), leaf)
    assert relative_error(relevance, gradient * image) < TOLERANCE


def _vision_transformer() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=10)
    nn.init.normal_(model.heads.head.weight, std=0.1)  # torchvision starts the head at zero
    return model


def test_a_vision_transformer_under_attnlrp_on_the_gpu_gives_the_cpu_relevance() -> None:
    cpu, gpu = _on_both(_vision_transformer, IMAGE, AttnLRP(), target=3)
    _assert_same(cpu, gpu)


def test_a_language_model_run_eagerly_on_the_gpu_gives_the_cpu_relevance() -> None:
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(2))

    def build() -> nn.Module:
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, num_labels=3)
        return transformers.BertForSequenceClassification(config)

    cpu, gpu = _on_both(build, ids, AttnLRP(), target=1)
    _assert_same(cpu, gpu)


def test_attention_in_pieces_sized_by_the_gpus_free_memory_gives_the_cpu_relevance(monkeypatch) -> None:
    """On the CPU each head of each sample is a piece here (PIECE_SCORES 1); on the GPU the pieces
    are sized by the memory free there: the whole batch's heads at once. Same relevance."""
    transformers = pytest.importorskip("transformers")
    from fxlrp.operations import attention

    monkeypatch.setattr(attention, "PIECE_SCORES", 1)
    decided = []
    original = attention.attention_pieces

    def recorded(*args: Any) -> Any:
        decided.append((args[0].device.type, original(*args)))
        return decided[-1][1]

    monkeypatch.setattr(attention, "attention_pieces", recorded)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(2))

    def build() -> nn.Module:
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, num_labels=3)
        return transformers.BertForSequenceClassification(config)

    cpu, gpu = _on_both(build, ids, Epsilon(1e-6), target=1)
    _assert_same(cpu, gpu)
    pieces = {device: [found for where, found in decided if where == device] for device in ("cpu", "cuda")}
    assert pieces["cpu"] and all(found is not None and len(found) == 8 for found in pieces["cpu"])
    assert pieces["cuda"] and all(found is None for found in pieces["cuda"])


def test_a_graph_network_on_the_gpu_gives_the_cpu_relevance() -> None:
    pyg = pytest.importorskip("torch_geometric")

    class Network(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gcn = pyg.nn.GCNConv(8, 16)
            self.gat = pyg.nn.GATConv(16, 4, heads=2, concat=False)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.gat(self.gcn(x, edge_index).relu(), edge_index)

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(12, 8, dtype=torch.float64, generator=generator)
    edge_index = torch.randint(0, 12, (2, 40), generator=generator)
    cpu, gpu = _on_both(Network, (x, edge_index), EpsilonPlusFlat(), target=1)
    _assert_same(cpu, gpu)


def test_lrp0_of_a_detection_on_the_gpu_is_gradient_times_input_and_the_cpu_relevance() -> None:
    # (ResNet-50 FPN Faster R-CNN: piecewise linear from the image to the class logit, RoIAlign
    # linear in the features for fixed boxes; a MobileNet's hard-swish makes LRP-0 differ from it)
    from torchvision.models import detection

    from fxlrp.integrations.torchvision import LOGIT_HEADS, explain_detection

    image = torch.rand(1, 3, 100, 120, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    relevances = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = detection.fasterrcnn_resnet50_fpn(
            weights=None, weights_backbone=None, num_classes=4, box_score_thresh=0.0, box_detections_per_img=6,
            rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=40, min_size=96, max_size=128)
        model = model.double().eval().to(device)
        x = image.to(device)
        explained = explain_detection(fxlrp.convert(model, Epsilon(0.0)), x, 0)
        logits: list[Tensor] = []
        handles = [module.register_forward_hook(lambda module, args, output: logits.append(output[0]))
                   for module in model.modules() if isinstance(module, tuple(LOGIT_HEADS))]
        leaf = x.clone().requires_grad_()
        try:
            model(leaf)
        finally:
            for handle in handles:
                handle.remove()
        (gradient,) = torch.autograd.grad(logits[0][explained.position], leaf)
        assert relative_error(explained.relevance, gradient * x) < 1e-12
        relevances.append(explained.relevance.cpu())
    _assert_same(relevances[0], relevances[1])


def test_conditional_heatmaps_on_the_gpu_give_the_cpu_ones() -> None:
    from fxlrp.concepts import conditional_relevance

    conditions = [{"layer3": [0], "y": [3]}, {"layer3": [5, 7], "y": [3]}, {"layer4.1.conv2": [2]}]
    heatmaps = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        explain = fxlrp.convert(_resnet().double().eval().to(device), EpsilonPlusFlat())
        result = conditional_relevance(explain, IMAGE.to(device), conditions, target=3, repeat=2)
        heatmaps.append(result.heatmap.cpu())
    _assert_same(heatmaps[0], heatmaps[1])


def test_a_device_map_over_the_gpu_and_the_cpu_gives_the_relevance_in_memory() -> None:
    """A model dispatched by accelerate over ``cuda:0`` and the CPU (a layer's weights kept on the
    CPU, moved to the GPU by its hook for its forward, as a map with ``"cpu"`` entries runs):
    the relevance of the model held in memory on the CPU, to float64's rounding on two devices;
    the dispatched model comes out as it went in."""
    pytest.importorskip("accelerate")
    from integrations.test_accelerate import accelerate, assert_same_state, state_of, tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(1))
    expected = fxlrp.attribute(fxlrp.convert(model, AttnLRP()), ids)
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
                  "model.rotary_emb": 0, "lm_head": 0}
    dispatched = accelerate.dispatch_model(copy.deepcopy(model), device_map=device_map, main_device=0)
    assert dispatched.model.layers[1].mlp.down_proj.weight.device.type in ("cpu", "meta")
    before = state_of(dispatched)
    explain = fxlrp.convert(dispatched, AttnLRP())
    for _ in range(2):  # (the second call of the signature may replay a recorded run)
        relevance = fxlrp.attribute(explain, ids.cuda())
        assert relevance.device.type == "cuda"
        assert relative_error(relevance.cpu(), expected) <= TOLERANCE
    assert_same_state(state_of(dispatched), before)


@pytest.mark.parametrize("composite", [AttnLRP(0.0), AttnLRP()], ids=["gradient-form", "relevance-form"])
def test_gradient_checkpointing_on_the_gpu_gives_the_cpu_relevance(composite: Any) -> None:
    """A Llama with ``gradient_checkpointing_enable()`` explained on the GPU, whose backward runs
    on the device's own autograd thread, where the checkpointed layers are recomputed under the
    relevance mode: the relevance of the model without checkpointing on the CPU (float64)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).double().eval()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(1))
    expected = fxlrp.attribute(fxlrp.convert(model, composite), ids)
    checkpointed = copy.deepcopy(model).cuda()
    checkpointed.gradient_checkpointing_enable()
    explain = fxlrp.convert(checkpointed, composite)
    for _ in range(2):
        assert relative_error(fxlrp.attribute(explain, ids.cuda()).cpu(), expected) <= TOLERANCE


def test_cuda_graphs_replay_the_cpu_relevance() -> None:
    """``fxlrp.compile(mode="reduce-overhead")``: the explanation recorded once as a CUDA graph and
    replayed for each further input of its shape, without recompiling; each call's relevance is
    the eager relevance on the CPU (float64), also the first call's after the second replay
    overwrote the graph's own outputs."""
    torch.manual_seed(0)
    model = _resnet().double().eval()
    explain_on_the_cpu = fxlrp.convert(model, EpsilonPlusFlat())
    compiled = fxlrp.compile(fxlrp.convert(copy.deepcopy(model).cuda(), EpsilonPlusFlat()), mode="reduce-overhead")
    images = [torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
              for seed in range(3)]
    relevance = [compiled(image.cuda(), torch.tensor([3, 7]).cuda()) for image in images]
    assert compiled.graphs == 1
    for image, found in zip(images, relevance, strict=True):
        _assert_same(fxlrp.attribute(explain_on_the_cpu, image, target=torch.tensor([3, 7])), found.cpu())


def test_a_language_model_compiled_on_its_token_ids_replays_the_cpu_relevance() -> None:
    """``fxlrp.compile(mode="reduce-overhead")`` of a causal LM on its token ids, in the gradient
    form (``AttnLRP(0.0)``): one CUDA graph for the shape, each batch's relevance per token the
    CPU's eager one (float64)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa")).double().eval()
    explain_on_the_cpu = fxlrp.convert(model, AttnLRP(0.0))
    compiled = fxlrp.compile(fxlrp.convert(copy.deepcopy(model).cuda(), AttnLRP(0.0)), mode="reduce-overhead")
    batches = [torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    relevance = [compiled(ids.cuda()) for ids in batches]
    assert compiled.graphs == 1
    for ids, found in zip(batches, relevance, strict=True):
        _assert_same(fxlrp.attribute(explain_on_the_cpu, ids), found.cpu())
