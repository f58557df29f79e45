"""Linear layers with quantized weights (torchao's weight-only int8, optimum-quanto's ``QLinear``)
explained as the linear map they compute: the rules of ``nn.Linear`` on the dequantized weight.

The reference is a float copy of the model whose linear layers hold the dequantized weights
(``weight.dequantize()``, computed by the quantization library): its explanation, by the same
composite, is the relevance the quantized model must get. The explainer computes each quantized
layer as ``F.linear`` on its dequantized weight, the kernel the float copy runs, so the outputs are
equal bit for bit; the relevance is compared at 1e-5 relative in float32 (the quantized libraries'
kernels run in float32). (Without gradients, the explainer of a model run eagerly runs the model
itself, whose quantized kernels it then equals bit for bit.)
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from support.references import relative_error
from torch import nn

import fxlrp
from fxlrp.rules.composites import AttnLRP, Epsilon, EpsilonPlusFlat

transformers = pytest.importorskip("transformers")


def torchao_int8(model: nn.Module) -> nn.Module:
    quantization = pytest.importorskip("torchao.quantization")
    quantization.quantize_(model, quantization.Int8WeightOnlyConfig())
    return model


def quanto(bits: str) -> Callable[[nn.Module], nn.Module]:
    def quantized(model: nn.Module) -> nn.Module:
        quanto = pytest.importorskip("optimum.quanto")
        quanto.quantize(model, weights=getattr(quanto, bits))
        quanto.freeze(model)
        return model

    quantized.__name__ = f"quanto_{bits}"
    return quantized


def tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).eval()


def dequantized_copy(model: nn.Module, quantized: nn.Module, every_layer: bool = True) -> nn.Module:
    """``model`` with each linear layer's weight replaced by its quantized twin's, dequantized
    (``every_layer``: each is quantized; else those the quantization left in float stay)."""
    twin = copy.deepcopy(model)
    layers = dict(quantized.named_modules())
    replaced = 0
    for name, module in twin.named_modules():
        if isinstance(module, nn.Linear):
            weight = layers[name].weight
            if type(weight) in (torch.Tensor, nn.Parameter):  # left in float
                assert not every_layer, name
                continue
            module.weight = nn.Parameter(weight.dequantize().detach().clone())
            replaced += 1
    assert replaced > 0
    return twin


@pytest.mark.parametrize("quantize", [torchao_int8, quanto("qint8"), quanto("qint4")])
@pytest.mark.parametrize("composite", [Epsilon, EpsilonPlusFlat, AttnLRP])
def test_quantized_mlp_is_explained_as_its_dequantized_copy(quantize: Callable, composite: type) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).eval()
    quantized = quantize(copy.deepcopy(model))
    twin = dequantized_copy(model, quantized)
    x = torch.randn(3, 64)
    explain, reference = fxlrp.convert(quantized, composite()), fxlrp.convert(twin, composite())
    assert torch.equal(explain(x), twin(x))
    assert relative_error(fxlrp.attribute(explain, x, target=2), fxlrp.attribute(reference, x, target=2)) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [torchao_int8, quanto("qint8")])
def test_quantized_llama_is_explained_as_its_dequantized_copy(quantize: Callable) -> None:
    model = tiny_llama()
    quantized = quantize(copy.deepcopy(model))
    twin = dequantized_copy(model, quantized)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    for composite in (AttnLRP(), Epsilon()):
        explain, reference = fxlrp.convert(quantized, composite), fxlrp.convert(twin, composite)
        with torch.no_grad():  # (without gradients the explainer runs the model itself: its kernels)
            assert torch.equal(explain(ids).logits, quantized(ids).logits)
            logits = twin(ids).logits
        assert torch.equal(explain(ids).logits, logits)  # explained: the dequantized weights' F.linear
        assert relative_error(fxlrp.attribute(explain, ids), fxlrp.attribute(reference, ids)) <= 1e-5


@pytest.mark.slow
def test_quantization_config_of_from_pretrained(tmp_path) -> None:
    """transformers' own loading paths: ``from_pretrained(..., quantization_config=...)`` with
    torchao's and optimum-quanto's configurations, explained as the dequantized float copy."""
    pytest.importorskip("torchao")
    pytest.importorskip("optimum.quanto")
    from torchao.quantization import Int8WeightOnlyConfig

    folder = tmp_path / "saved model"
    tiny_llama().save_pretrained(folder)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    configurations = (transformers.TorchAoConfig(Int8WeightOnlyConfig()), transformers.QuantoConfig(weights="int8"))
    for configuration in configurations:
        quantized = transformers.LlamaForCausalLM.from_pretrained(folder, quantization_config=configuration).eval()
        twin = dequantized_copy(model, quantized, every_layer=False)
        explain, reference = fxlrp.convert(quantized, Epsilon()), fxlrp.convert(twin, Epsilon())
        assert torch.equal(explain(ids).logits, twin(ids).logits)
        assert relative_error(fxlrp.attribute(explain, ids), fxlrp.attribute(reference, ids)) <= 1e-5
