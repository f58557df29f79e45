"""Explanations use inference semantics whatever mode the model is in: a model left in training
mode, at conversion or after it, is explained as in evaluation mode - no dropout (also inside
fused attention), no drop path, inference's branches of ``if self.training:``. The reference is
the same model converted and explained in evaluation mode. And whatever mode torch is in: an
explanation asked for under ``torch.no_grad()`` or ``torch.inference_mode()`` is the same."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch
import torchvision
import transformers
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules.composites import AttnLRP


class FusedAttentionWithDropout(nn.Module):
    """Passes its attention dropout to the fused kernel in training mode, as Hugging Face's and
    timm's attention modules do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.head, self.rate = nn.Linear(16, 48), nn.Linear(16, 3), 0.5

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        mixed = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.rate if self.training else 0.0)
        return self.head(mixed.mean(1))


class NoisyInTraining(nn.Module):
    """Adds noise in training mode (a data augmentation written into the model)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layer, self.head = nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            x = x + torch.randn_like(x)
        return self.head(torch.relu(self.layer(x)).mean(1))


def _torchvision_vit() -> nn.Module:
    torch.manual_seed(2)
    model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                                 mlp_dim=32, num_classes=3, dropout=0.3, attention_dropout=0.5)
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision initialises the head to 0
    return model


def _timm_vit() -> nn.Module:
    torch.manual_seed(3)
    return timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, depth=2, num_classes=3,
                             drop_path_rate=0.5, attn_drop_rate=0.5, proj_drop_rate=0.3)


def _bert() -> nn.Module:
    torch.manual_seed(4)
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, num_labels=3, hidden_dropout_prob=0.5,
                                     attention_probs_dropout_prob=0.5, attn_implementation="sdpa")
    return transformers.BertForSequenceClassification(config)


def _tokens() -> Tensor:
    return torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(5))


def _images() -> Tensor:
    return torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(6))


def _sequences() -> Tensor:
    return torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(7))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], Tensor]]] = {
    "fused attention with dropout": (FusedAttentionWithDropout, _sequences),
    "noise in training": (NoisyInTraining, _sequences),
    "torchvision ViT (nn.MultiheadAttention)": (_torchvision_vit, _images),
    "timm ViT (drop path, attention dropout)": (_timm_vit, _images),
    "Hugging Face BERT (SDPA)": (_bert, _tokens),
}


def _logits(output: object) -> Tensor:
    return output.logits if hasattr(output, "logits") else output


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("in_training", ["at conversion", "after conversion"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_in_training_mode_is_explained_as_in_evaluation_mode(name: str, in_training: str, capture: str) -> None:
    build, make_input = MODELS[name]
    model, x = build().double().eval(), make_input()
    expected = fxlrp.attribute(fxlrp.convert(model, AttnLRP(0.0), capture=capture), x, target=1)
    with torch.no_grad():
        evaluation_output = _logits(model(x))

    model.train(in_training == "at conversion")
    explain = fxlrp.convert(model, AttnLRP(0.0), capture=capture)
    model.train()
    first, second = (fxlrp.attribute(explain, x, target=1) for _ in range(2))
    with torch.no_grad():
        output = _logits(explain(x))

    assert relative_error(first, expected) < 1e-12
    assert relative_error(second, expected) < 1e-12
    assert relative_error(output, evaluation_output) < 1e-12
    assert model.training and all(module.training for module in model.modules())  # the model's mode is its own


@pytest.mark.parametrize("context", ["torch.no_grad", "torch.inference_mode", "inputs made in inference mode"])
def test_explaining_inside_no_grad_or_inference_mode_gives_the_same_relevance(context: str) -> None:
    """Relevance travels by autograd: an explanation asked for where autograd is off (an
    evaluation loop under ``torch.no_grad()`` or ``torch.inference_mode()``) turns it on for its
    run; inputs made in inference mode are copied."""
    bert, tokens = _bert().double().eval(), _tokens()
    vit, images = _torchvision_vit().double().eval(), _images()
    cases = [(fxlrp.convert(bert, AttnLRP(0.0)), tokens), (fxlrp.convert(vit, AttnLRP(0.0)), images)]
    expected = [(fxlrp.attribute(explain, x, target=1), fxlrp.attribute(explain, x, target=[0, 2]))
                for explain, x in cases]
    with torch.no_grad() if context == "torch.no_grad" else torch.inference_mode():
        found = []
        for explain, x in cases:
            given = x.clone() if context == "inputs made in inference mode" else x
            found.append((fxlrp.attribute(explain, given, target=1), fxlrp.attribute(explain, given, target=[0, 2])))
    for (single, several), (expected_single, expected_several) in zip(found, expected, strict=True):
        assert torch.equal(single, expected_single) and torch.equal(several, expected_several)
