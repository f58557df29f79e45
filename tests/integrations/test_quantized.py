"""Linear layers with quantized weights (torchao's weight-only int8, optimum-quanto's ``QLinear``)
explained as the linear map they compute: the rules of ``nn.Linear`` on the dequantized weight.

The reference is a float copy of the model whose linear layers hold the dequantized weights
(``weight.dequantize()``, computed by the quantization library): its explanation, by the same
composite, is the relevance the quantized model must get. The explainer computes each quantized
layer as ``F.linear`` on its dequantized weight, the kernel the float copy runs, so the outputs are
equal bit for bit; the relevance is compared at 1e-5 relative in float32 (the quantized libraries'
kernels run in float32). (Without gradients, the explainer of a model run eagerly runs the model
itself, whose quantized kernels it then equals bit for bit.)

bitsandbytes' ``Linear8bitLt`` and ``Linear4bit`` are refused in one line saying what to do
(``fxlrp/integrations/bitsandbytes.py`` says why), and left as they were.
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


def bitsandbytes_layers(model: nn.Sequential) -> nn.Sequential:
    """``model`` with its first linear layer in 8 bits and its last in 4 (bitsandbytes)."""
    bnb = pytest.importorskip("bitsandbytes")
    quantized = copy.deepcopy(model)
    first, last = quantized[0], quantized[2]
    eight = bnb.nn.Linear8bitLt(first.in_features, first.out_features, has_fp16_weights=False)
    eight.weight = bnb.nn.Int8Params(first.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    four = bnb.nn.Linear4bit(last.in_features, last.out_features)
    four.weight = bnb.nn.Params4bit(last.weight.data.clone(), requires_grad=False)
    eight.bias, four.bias = first.bias, last.bias
    quantized[0], quantized[2] = eight.to("cpu"), four.to("cpu")
    return quantized


@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_bitsandbytes_layers_are_refused_in_one_line_and_left_as_they_were(capture: str) -> None:
    torch.manual_seed(0)
    quantized = bitsandbytes_layers(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).eval())
    x = torch.randn(3, 64)
    with torch.no_grad():
        output = quantized(x)
    state = quantized[0].state
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"^bitsandbytes' 8-bit and 4-bit layers .* torchao "
                                                             r"\(quantize_\(model, Int8WeightOnlyConfig\(\)\)[^\n]*$"):
        fxlrp.attribute(fxlrp.convert(quantized, Epsilon(), capture=capture), x)
    # (a trace of Linear8bitLt's forward would have left symbolic values in its state)
    assert quantized[0].state is state and isinstance(state.CB, torch.Tensor)
    with torch.no_grad():
        assert torch.equal(quantized(x), output)


@pytest.mark.slow
def test_bitsandbytes_quantization_config_is_refused_in_one_line(tmp_path) -> None:
    """A transformers model loaded with ``BitsAndBytesConfig`` (run eagerly as a whole): the same refusal."""
    pytest.importorskip("bitsandbytes")
    folder = tmp_path / "saved model"
    tiny_llama().save_pretrained(folder)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    for configuration in (transformers.BitsAndBytesConfig(load_in_4bit=True),
                          transformers.BitsAndBytesConfig(load_in_8bit=True)):
        quantized = transformers.LlamaForCausalLM.from_pretrained(folder, quantization_config=configuration,
                                                                 device_map="cpu").eval()
        with pytest.raises(fxlrp.UnsupportedOperationError, match=r"^bitsandbytes' 8-bit and 4-bit layers [^\n]*$"):
            fxlrp.attribute(fxlrp.convert(quantized, AttnLRP()), ids)
