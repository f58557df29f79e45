"""The model families LXT's efficient mode supports, as tiny models with random weights.

Every parameter, norm weights and biases included, gets random noise on top of Hugging Face's
initialisation (which starts norms at 1 and biases at 0), so that no rule is tested on a trivial
value. Nothing is loaded from a hub.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn

VOCABULARY = 100


def causal_lm_logits(output: Any) -> torch.Tensor:
    """A causal language model's next-token logits (the last position)."""
    return output.logits[:, -1]


def classifier_logits(output: Any) -> torch.Tensor:
    return output.logits


@dataclass(frozen=True)
class Family:
    name: str
    """LXT's module name in ``lxt.efficient.models`` (``llama``, ``bert``, ...)."""
    build: Callable[[str], nn.Module]
    """A model of this family with the given ``attn_implementation`` (float32, eval mode)."""
    pick: Callable[[Any], torch.Tensor]
    """The logits to explain from the model's output."""
    rms_norm: str | None = None
    """Name of the family's RMSNorm class in its modeling module (None: LayerNorm)."""
    cp_lrp: bool = True
    """Whether LXT has a CP-LRP map for the family (not for BERT)."""

    @property
    def modeling(self) -> types.ModuleType:
        import importlib

        return importlib.import_module(f"transformers.models.{self.name}.modeling_{self.name}")


def _decoder_settings(attention: str) -> dict[str, Any]:
    return dict(vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                attn_implementation=attention)


def llama(attention: str) -> nn.Module:
    # biases on the projections and the MLP, so that the z-rule's bias terms are tested as well
    config = transformers.LlamaConfig(**_decoder_settings(attention), attention_bias=True, mlp_bias=True)
    return transformers.LlamaForCausalLM(config)


def qwen2(attention: str) -> nn.Module:  # q, k, v with biases
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_decoder_settings(attention)))


def qwen3(attention: str) -> nn.Module:  # RMSNorm on queries and keys
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_decoder_settings(attention), head_dim=8))


def gemma3(attention: str) -> nn.Module:
    # a sliding-window layer (window 4 < sequence length) and a global one; scaled embeddings,
    # GeGLU with the tanh GELU, RMSNorm on queries and keys, norms before and after each block
    config = transformers.Gemma3TextConfig(
        **_decoder_settings(attention), head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])
    return transformers.Gemma3ForCausalLM(config)


def gpt2(attention: str) -> nn.Module:
    # GPT-2's default activation, gelu_new, is written out in elementary torch operations
    config = transformers.GPT2Config(vocab_size=VOCABULARY, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     attn_implementation=attention)
    return transformers.GPT2LMHeadModel(config)


def bert(attention: str) -> nn.Module:
    config = transformers.BertConfig(vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                                     num_labels=3, attn_implementation=attention)
    return transformers.BertForSequenceClassification(config)


FAMILIES = {
    "llama": Family("llama", llama, causal_lm_logits, rms_norm="LlamaRMSNorm"),
    "qwen2": Family("qwen2", qwen2, causal_lm_logits, rms_norm="Qwen2RMSNorm"),
    "qwen3": Family("qwen3", qwen3, causal_lm_logits, rms_norm="Qwen3RMSNorm"),
    "gemma3": Family("gemma3", gemma3, causal_lm_logits, rms_norm="Gemma3RMSNorm"),
    "gpt2": Family("gpt2", gpt2, causal_lm_logits),
    "bert": Family("bert", bert, classifier_logits, cp_lrp=False),
}


def randomised(model: nn.Module, seed: int = 1) -> nn.Module:
    """Noise on every parameter (norm weights start at 1 or 0 and biases at 0 otherwise)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    return model


def tiny_model(family: Family, attention: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return randomised(family.build(attention).to(dtype).eval())


def token_ids(batch: int = 2, length: int = 7, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- transformers 4.x BERT adds its position embeddings in place ------------------------------------


def _bert_embeddings_out_of_place(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                                  past_key_values_length=0):
    """transformers 4.54's ``BertEmbeddings.forward`` with ``embeddings += position_embeddings``
    written ``embeddings = embeddings + position_embeddings`` (as transformers 5 writes it): the
    same values. fxlrp refuses an in-place addition to a relevance-carrying tensor in code it runs
    eagerly (a Python ``+=`` on a tensor reaches torch as ``add_``)."""
    input_shape = input_ids.size() if input_ids is not None else inputs_embeds.size()[:-1]
    seq_length = input_shape[1]
    if position_ids is None:
        position_ids = self.position_ids[:, past_key_values_length: seq_length + past_key_values_length]
    if token_type_ids is None:
        token_type_ids = self.token_type_ids[:, :seq_length].expand(input_shape[0], seq_length)
    if inputs_embeds is None:
        inputs_embeds = self.word_embeddings(input_ids)
    embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
    embeddings = embeddings + self.position_embeddings(position_ids)
    return self.dropout(self.LayerNorm(embeddings))


def explainable(model: nn.Module) -> nn.Module:
    """The model as fxlrp explains it in this environment: for BERT, the embeddings' forward
    without its in-place addition (on this instance only)."""
    for module in model.modules():
        if type(module).__name__ == "BertEmbeddings":
            module.forward = types.MethodType(_bert_embeddings_out_of_place, module)
    return model
