"""Models dispatched by accelerate (``cpu_offload``, ``disk_offload``, ``dispatch_model`` with a
device map that offloads a layer to disk) explained through accelerate's hooks.

accelerate replaces each module's ``forward`` by one that runs its hook around it: the hook loads
the module's weights from where they are offloaded (a CPU copy, files on disk) into the module's
parameters before the forward, as ``type(old)(new, requires_grad=old.requires_grad)``, and puts
the meta tensors back after it. The explanation runs those hooks as the model does, so its
relevance is that of the same model held in memory: the same operations on the same weights,
compared in float64 (by construction the same numbers, 1e-12 leaves room for nothing else). The
dispatched model comes out as it went in: its parameters (class, device, storage), its hooks and
its offloaded weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.references import relative_error
from torch import nn

import fxlrp
from fxlrp.rules.composites import AttnLRP, Epsilon

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")


def tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).double().eval()


def offloaded_to_cpu(model: nn.Module, folder: Path) -> nn.Module:
    return accelerate.cpu_offload(model, execution_device="cpu")


def offloaded_to_disk(model: nn.Module, folder: Path) -> nn.Module:
    return accelerate.disk_offload(model, str(folder), execution_device="cpu")


def one_layer_on_disk(model: nn.Module, folder: Path) -> nn.Module:
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    return accelerate.dispatch_model(model, device_map=device_map, offload_dir=str(folder))


def state_of(model: nn.Module) -> dict:
    """What the explanation must leave as it was: each parameter's class, device, dtype, storage
    and flag, the hooks (accelerate's and torch's), the forwards accelerate put in place, and the
    offloaded weights' values."""
    hooks = {name: (getattr(module, "_hf_hook", None), vars(module).get("forward"),
                    len(module._forward_hooks), len(module._forward_pre_hooks))
             for name, module in model.named_modules()}
    parameters = {name: (type(value), value.device, value.dtype, value.requires_grad,
                         None if value.device.type == "meta" else value.data_ptr())
                  for name, value in model.named_parameters()}
    offloaded = {}
    for module in model.modules():
        weights_map = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        if weights_map is not None:  # (a view of all offloaded weights, by the module's prefix)
            offloaded.update({key: weights_map.dataset[key].clone() for key in weights_map})
    return {"hooks": hooks, "parameters": parameters, "offloaded": offloaded}


def assert_same_state(after: dict, before: dict) -> None:
    assert after["hooks"].keys() == before["hooks"].keys()
    for name, (hook, forward, *counts) in before["hooks"].items():
        hook_after, forward_after, *counts_after = after["hooks"][name]
        assert hook_after is hook and forward_after is forward and counts_after == counts, name
    assert after["parameters"] == before["parameters"]
    assert after["offloaded"].keys() == before["offloaded"].keys()
    for name, value in before["offloaded"].items():
        assert torch.equal(after["offloaded"][name], value), name


@pytest.mark.parametrize("dispatch", [offloaded_to_cpu, offloaded_to_disk, one_layer_on_disk])
@pytest.mark.parametrize("composite", [AttnLRP, pytest.param(Epsilon, marks=pytest.mark.slow)])
def test_dispatched_model_is_explained_as_the_model_in_memory(
        dispatch: Callable[[nn.Module, Path], nn.Module], composite: type, tmp_path: Path) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(1))
    expected = fxlrp.attribute(fxlrp.convert(model, composite()), ids)
    with torch.no_grad():
        logits = model(ids).logits

    dispatched = dispatch(copy.deepcopy(model), tmp_path / "offload folder")
    assert any(value.device.type == "meta" for value in dispatched.parameters())  # offloaded, loaded by hooks
    before = state_of(dispatched)
    explain = fxlrp.convert(dispatched, composite())
    # Three calls: the first runs the model eagerly, later ones may replay a recording of the run.
    for _ in range(3):
        assert relative_error(fxlrp.attribute(explain, ids), expected) <= 1e-12
    assert_same_state(state_of(dispatched), before)
    with torch.no_grad():
        assert torch.equal(dispatched(ids).logits, logits)


@pytest.mark.slow
def test_device_map_of_from_pretrained(tmp_path: Path) -> None:
    """transformers' own loading path: ``from_pretrained(..., device_map=..., offload_folder=...)``,
    which dispatches with accelerate's hooks, a layer offloaded to disk."""
    model = tiny_llama()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(1))
    expected = fxlrp.attribute(fxlrp.convert(model, AttnLRP()), ids)
    model.save_pretrained(tmp_path / "saved model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    loaded = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "saved model", device_map=device_map, offload_folder=tmp_path / "offload folder",
        dtype=torch.float64).eval()
    assert loaded.model.layers[0].mlp.down_proj.weight.device.type == "meta"
    before = state_of(loaded)
    assert relative_error(fxlrp.attribute(fxlrp.convert(loaded, AttnLRP()), ids), expected) <= 1e-12
    assert_same_state(state_of(loaded), before)
