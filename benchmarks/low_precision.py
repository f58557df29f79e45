"""How far 16-bit relevance is from float32's and float64's: measurements, not bounds.

Across a whole network no bound on 16-bit relevance holds on every CPU (how a kernel rounds, and
where a ReLU input near 0 flips, depend on it), so the tests check what holds by construction
(finite relevance in the model's dtype, the command's 16-bit relevance equal to the API's, LRP-0
of a small network within its rounding bound: tests/unit/test_robustness.py) and this script
measures the rest, on this machine's kernels:

- **images**: torchvision's ResNet-18 (10 classes) and a 2-layer ViT (random weights, 2 inputs of
  3x32x32, class 1), cast to float16 / bfloat16 or run under autocast, under the default
  composite and EpsilonPlusFlat: ``1 - correlation`` with the float32 relevance (the worse of the
  2 samples), beside the same loss of the model's own gradient x input in that precision (what
  the precision costs anyway).
- **language models**: tiny Llama, GPT-2, BERT and Mamba configurations (random weights) in
  bfloat16 / float16 under AttnLRP(epsilon=0): the relative error of the relevance against
  fxlrp's in float64 on the same rounded weights.

Run: ``python -m benchmarks.low_precision [--threads 2]``; prints two tables.
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch
import torchvision
from torch import Tensor, nn

import fxlrp
from fxlrp.rules.composites import AttnLRP, EpsilonPlusFlat

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
COMPOSITES = {"default": lambda: None, "EpsilonPlusFlat": EpsilonPlusFlat}


def correlation(relevance: Tensor, reference: Tensor) -> Tensor:
    """Pearson correlation per sample."""
    a, b = relevance.double().flatten(1), reference.double().flatten(1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def image_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(num_classes=10).eval()
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                               hidden_dim=32, mlp_dim=64, num_classes=10).eval()
    nn.init.normal_(vit.heads.head.weight, std=0.5)  # torchvision initialises the head to 0
    return {"resnet18": resnet, "vit": vit}


def gradient_times_input(model: nn.Module, x: Tensor) -> Tensor:
    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)[:, 1].sum(), leaf)
    return (gradient * leaf).detach()


def in_precision(function, model: nn.Module, x: Tensor, dtype: torch.dtype, how: str) -> Tensor:
    if how == "model":
        return function(copy.deepcopy(model).to(dtype), x.to(dtype))
    with torch.autocast("cpu", dtype=dtype):
        return function(model, x)


def images() -> list[str]:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    lines = ["| model | dtype | how | composite | 1 - correlation with float32 | model's own gradient x input |",
             "|---|---|---|---|---:|---:|"]
    for name, model in image_models().items():
        own_float32 = gradient_times_input(model, x)
        for composite, make in COMPOSITES.items():
            reference = fxlrp.attribute(fxlrp.convert(model, make()), x, target=1)
            for dtype_name, dtype in DTYPES.items():
                for how in ("model", "autocast"):
                    relevance = in_precision(lambda m, v: fxlrp.attribute(fxlrp.convert(m, make()), v, target=1),
                                             model, x, dtype, how)
                    own = in_precision(gradient_times_input, model, x, dtype, how)
                    lost = float(1 - correlation(relevance, reference).min())
                    own_lost = float(1 - correlation(own, own_float32).min())
                    lines.append(f"| {name} | {dtype_name} | {how} | {composite} | {lost:.1e} | {own_lost:.1e} |")
    return lines


def language_models() -> dict[str, tuple[nn.Module, Tensor, str]]:
    import transformers

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    configs = {
        "Llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=100, **small,
                                                                        num_key_value_heads=2)),
        "GPT-2": transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2,
                                                                      n_head=4, n_positions=64)),
        "BERT": transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=100, **small,
                                                                                   num_labels=3)),
        "Mamba": transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=100, hidden_size=32,
                                                                        state_size=8, num_hidden_layers=2,
                                                                        use_cache=False)),
    }
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    return {name: (model.eval(), ids, "classes" if name == "BERT" else "next") for name, model in configs.items()}


def language() -> list[str]:
    lines = ["| model | dtype | relative error against float64 (same rounded weights) |", "|---|---|---:|"]
    for name, (model, ids, kind) in language_models().items():
        pick = (lambda output: output.logits) if kind == "classes" else (lambda output: output.logits[:, -1])
        for dtype_name, dtype in DTYPES.items():
            low = copy.deepcopy(model).to(dtype)
            high = copy.deepcopy(low).double()
            relevance = fxlrp.attribute(fxlrp.convert(low, AttnLRP(epsilon=0.0)), ids, target=1, output=pick)
            expected = fxlrp.attribute(fxlrp.convert(high, AttnLRP(epsilon=0.0)), ids, target=1, output=pick)
            error = float((relevance.double() - expected).abs().max() / expected.abs().max())
            lines.append(f"| {name} | {dtype_name} | {error:.1e} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    warnings.simplefilter("ignore")
    print("\n".join(images()))
    print()
    print("\n".join(language()))


if __name__ == "__main__":
    main()
