"""Hugging Face transformers models (transformers 5) explained with AttnLRP(epsilon=0).

For each of 17 architectures of the issue's list (``CASES``) and 35 more families
(``MORE_CASES``: Mistral, Phi, GPT-NeoX, OPT, GPT-J, Gemma 2, Mixtral, Qwen2-MoE, ALBERT, DeBERTa-v2,
BART, BEiT, DINOv2, Swin, ConvNeXt, RoFormer, Llama 4, FalconMamba, ConvBERT, RT-DETR, ...), a tiny
configuration with random weights (nothing from a hub): conversion (strict where fxlrp has a rule for
every operation), the explainer's outputs equal to the model's, finite relevance, and the relevance
equal to an independent reference: LXT's Gradient x Input formulation of AttnLRP, built here without
fxlrp. The model runs under a
``TorchFunctionMode`` of this file that changes the backward pass the way LXT's efficient mode
does (see tests/unit/test_transformer_composites.py), on plain autograd:

- a product of two input-dependent tensors (``q k^T``, attention times values, ``a * b``)
  divides its gradient by 2: each factor receives half (the uniform rule);
- an activation (``F.gelu``, ``F.silu``, ``tanh``, ``sigmoid``, a power by a constant, transformers'
  activation modules as a whole) scales its gradient by ``act(x) / x``: the identity rule;
- LayerNorm, GroupNorm, RMSNorm, norms, ``sqrt``, ``rsqrt``, variances and the denominator of a
  quotient are constants (detached): the identity rule on ``sigma``;
- ``F.scaled_dot_product_attention`` is written out: ``softmax(q k^T * scale + mask) v``;
- ``F.grid_sample`` (deformable attention) samples at positions held constant (detached);
- everything else - linear layers, convolutions, sums, the softmax - keeps its gradient
  (epsilon 0 on an affine map is gradient x input).

Relevance is the input times its gradient, seeded with 1 at the target logit: fxlrp's with
``R_out = logit``. Token ids get the relevance of their embedding lookups summed over the
embedding dimension. Where fxlrp has no rule for an operation (SigLIP's attention-pooling head)
the test names the operation from the strict error, converts with ``strict=False`` (relevance
follows the gradient there) and the reference lets relevance follow that operation's gradient too.
Mamba's selective scan is MambaLRP's (Jafari et al., 2024): the reference runs the scan with its
selective parameters (time step, B, C) detached, as the MambaLRP authors' code does.

Models run in float64 and compare at 1e-10. The RMSNorm of Llama, Qwen and Gemma 3 upcasts to
float32 whatever the model's dtype, and so does Qwen3-MoE's router softmax (the two formulations
would then agree to float32's rounding only): for the comparison they compute in float64, the
same formulas without the upcast, in the model both explanations run. Mamba's family casts to
float32 in its selective scan (``.float()``), norms, residual stream and logits, and the grouped
matrix product of the default experts of Qwen3-MoE, Mixtral, Qwen2-MoE and DeepSeek-V3 has no
float64 kernel on the CPU: those models run under :class:`Float32PartsInFloat64`, which leaves
the casts out and computes the grouped product group by group in float64. Qwen3-MoE's router is a
gate (its top-k weights constant, relevance only to the chosen experts): the reference computes
it without gradient.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.references import recordings, relative_error
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

import fxlrp
from fxlrp.rules.composites import AttnLRP

transformers = pytest.importorskip("transformers")
from transformers import activations  # noqa: E402
from transformers.models.bloom import modeling_bloom  # noqa: E402

# -- the reference: LXT's modified gradient, on plain autograd --------------------------------------


class DivideGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return value.view_as(value)

    @staticmethod
    def backward(ctx, gradient: Tensor):
        return gradient / ctx.factor, None


class IdentityRule(torch.autograd.Function):
    """``output`` (computed from ``x``) whose backward scales by ``output / x``."""

    @staticmethod
    def forward(ctx, x: Tensor, output: Tensor) -> Tensor:
        ratio = torch.where(x == 0, torch.zeros_like(x), output / torch.where(x == 0, torch.ones_like(x), x))
        ctx.save_for_backward(ratio)
        return output.clone()

    @staticmethod
    def backward(ctx, gradient: Tensor):
        (ratio,) = ctx.saved_tensors
        return gradient * ratio, None


class FollowsGradient(torch.autograd.Function):
    """``call(*inputs)`` through which relevance follows the gradient (``R_in = J^T R_out``, what
    fxlrp does with ``strict=False`` for an operation without a rule), in gradient x input terms:
    the gradient reaching each input is ``J^T (output * gradient) / input``."""

    @staticmethod
    def forward(ctx, call: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        with torch.enable_grad():
            leaves = [value.detach().requires_grad_() for value in inputs]
            output = call(*leaves)
        ctx.graph = (leaves, output)
        return output.detach()

    @staticmethod
    def backward(ctx, gradient: Tensor):
        leaves, output = ctx.graph
        relevance = torch.autograd.grad(output, leaves, output.detach() * gradient, allow_unused=True)
        return (None, *(None if share is None else torch.where(leaf == 0, torch.zeros_like(share), share / leaf)
                        for share, leaf in zip(relevance, leaves, strict=True)))


def _follows_gradient(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    positions = [position for position, value in enumerate(args) if _input_dependent(value)]

    def call(*inputs: Tensor) -> Tensor:
        values = list(args)
        for position, value in zip(positions, inputs, strict=True):
            values[position] = value
        output = function(*values, **kwargs)
        return output[0] if isinstance(output, tuple) else output

    result = FollowsGradient.apply(call, *(args[position] for position in positions))
    if isinstance(function(*args, **kwargs), tuple):  # (attention output, weights): the weights unexplained
        with torch.no_grad():
            return (result, *function(*args, **kwargs)[1:])
    return result


def _input_dependent(value: Any) -> bool:
    return isinstance(value, Tensor) and value.requires_grad


def _product(function: Callable[..., Tensor], factors: list[Any], args: tuple, kwargs: dict) -> Tensor:
    output = function(*args, **kwargs)
    count = sum(_input_dependent(factor) for factor in factors)
    return DivideGradient.apply(output, float(count)) if count >= 2 else output


def _activation(function: Callable[..., Tensor], args: tuple, kwargs: dict) -> Tensor:
    x = args[0]
    output = function(*args, **kwargs)
    return IdentityRule.apply(x, output.detach()) if _input_dependent(x) else output


def _constant(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with torch.no_grad():
        return function(*args, **kwargs)


def _quotient(function: Callable[..., Tensor], args: tuple, kwargs: dict) -> Tensor:
    numerator, denominator, *rest = args
    if isinstance(denominator, Tensor):
        denominator = denominator.detach()
    return function(numerator, denominator, *rest, **kwargs)


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    dimensions = tuple(range(-len(normalized_shape), 0))
    mean = input.mean(dimensions, keepdim=True)
    sigma = torch.sqrt(input.var(dimensions, unbiased=False, keepdim=True) + eps).detach()
    output = (input - mean) / sigma
    output = output * weight if weight is not None else output
    return output + bias if bias is not None else output


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    grouped = input.reshape(input.shape[0], num_groups, -1)
    sigma = torch.sqrt(grouped.var(-1, unbiased=False, keepdim=True) + eps).detach()
    output = ((grouped - grouped.mean(-1, keepdim=True)) / sigma).reshape(input.shape)
    channels = (1, -1) + (1,) * (input.dim() - 2)
    output = output * weight.view(channels) if weight is not None else output
    return output + bias.view(channels) if bias is not None else output


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    dimensions = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(input.dtype).eps if eps is None else eps
    output = input * torch.rsqrt(input.pow(2).mean(dimensions, keepdim=True) + eps).detach()
    return output * weight if weight is not None else output


def _normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    return input / input.norm(p, dim, keepdim=True).clamp_min(eps).detach()


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = _product(torch.matmul, [query, key], (query, key.transpose(-2, -1)), {}) * scale
    if is_causal:
        length, source = scores.shape[-2:]
        attn_mask = torch.ones(length, source, dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    return _product(torch.matmul, [weights, value], (weights, value), {})


def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``beta * input + alpha * batch1 @ batch2`` (BLOOM's ALiBi scores): a sum and a product."""
    return beta * input + alpha * _product(torch.bmm, [batch1, batch2], (batch1, batch2), {})


def _grid_sample(input, grid, *settings, **kwargs):
    return F.grid_sample(input, grid.detach(), *settings, **kwargs)


def _einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _product(torch.einsum, list(operands), (equation, *operands), {})


ACTIVATIONS = (F.gelu, F.silu, F.tanh, torch.tanh, Tensor.tanh, F.elu, F.softplus, F.mish,
               torch.sigmoid, Tensor.sigmoid, F.sigmoid)  # a sigmoid gating a product is not covered
POWERS = (torch.pow, Tensor.pow, Tensor.__pow__, torch.square, Tensor.square)
PRODUCTS = (torch.mul, torch.multiply, Tensor.mul, Tensor.multiply, Tensor.__mul__, Tensor.__rmul__, torch.matmul,
            Tensor.matmul, Tensor.__matmul__, torch.bmm, Tensor.bmm, torch.mm, Tensor.mm)
CONSTANTS = (torch.sqrt, Tensor.sqrt, torch.rsqrt, Tensor.rsqrt, torch.var, Tensor.var, torch.std, Tensor.std,
             torch.norm, Tensor.norm, torch.linalg.vector_norm)
QUOTIENTS = (torch.div, Tensor.div, Tensor.__truediv__, Tensor.div_, Tensor.__itruediv__)
DECOMPOSED = {F.layer_norm: _layer_norm, F.group_norm: _group_norm, F.rms_norm: _rms_norm, F.normalize: _normalize,
              F.scaled_dot_product_attention: _attention, torch.einsum: _einsum,
              torch.baddbmm: _baddbmm, Tensor.baddbmm: _baddbmm, F.grid_sample: _grid_sample}
ACTIVATION_MODULES = tuple(getattr(activations, name) for name in (
    "NewGELUActivation", "FastGELUActivation", "AccurateGELUActivation", "QuickGELUActivation", "GELUActivation",
    "GELUTanh", "MishActivation") if hasattr(activations, name)) + (modeling_bloom.BloomGelu,)


class GradientTimesInput(TorchFunctionMode):
    """LXT's modified backward for the torch calls of a forward pass; embedding lookups of the
    explained token ids become leaves. ``gradient_only``: functions that keep their gradient
    (where fxlrp, converting with ``strict=False``, lets relevance follow it)."""

    def __init__(self, ids: list[Tensor], gradient_only: tuple[Callable[..., Any], ...] = ()) -> None:
        super().__init__()
        self.ids, self.gradient_only = ids, gradient_only
        self.lookups: list[tuple[Tensor, Tensor]] = []
        self.inside_activation = 0
        self.unknown: set[str] = set()

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inside_activation:
            return function(*args, **kwargs)
        if function in self.gradient_only and any(_input_dependent(value) for value in args):
            return _follows_gradient(function, args, kwargs)
        if function is F.embedding:
            return self._lookup(function, args, kwargs)
        if not any(_input_dependent(value) for value in (*args, *kwargs.values(),
                                                         *(args[1] if function is torch.einsum and len(args) == 2
                                                           and isinstance(args[1], (list, tuple)) else ()))):
            return function(*args, **kwargs)
        if function in DECOMPOSED:
            return DECOMPOSED[function](*args, **kwargs)
        if function in ACTIVATIONS:
            return _activation(function, args, kwargs)
        if function in POWERS and not any(_input_dependent(value) for value in args[1:]):
            return _activation(function, args, kwargs)
        if function in PRODUCTS:
            return _product(function, list(args[:2]), args, kwargs)
        if function in CONSTANTS:
            return _constant(function, args, kwargs)
        if function in QUOTIENTS:
            return _quotient(function, args, kwargs)
        if function in (torch.exp, Tensor.exp, torch.log, Tensor.log):
            self.unknown.add(getattr(function, "__name__", str(function)))
        return function(*args, **kwargs)

    def _lookup(self, function, args, kwargs):
        output = function(*args, **kwargs)
        indices = args[0] if not args[0].is_floating_point() else args[1]
        if any(indices.untyped_storage().data_ptr() == ids.untyped_storage().data_ptr()
               and indices.numel() == ids.numel() for ids in self.ids):
            output = output.detach().requires_grad_()
            self.lookups.append((indices, output))
        return output

    def activation_hooks(self) -> list[Any]:
        """transformers' activation modules take the identity rule as a whole."""

        def enter(module, args):
            if isinstance(module, ACTIVATION_MODULES):
                self.inside_activation += 1

        def leave(module, args, output):
            if not isinstance(module, ACTIVATION_MODULES):
                return None
            self.inside_activation -= 1
            if self.inside_activation == 0 and _input_dependent(args[0]):
                return IdentityRule.apply(args[0], output.detach())
            return None

        return [nn.modules.module.register_module_forward_pre_hook(enter),
                nn.modules.module.register_module_forward_hook(leave)]


def reference_relevance(model: nn.Module, inputs: tuple[Any, ...], pick: Callable[[Any], Tensor], target: int,
                        gradient_only: tuple[Callable[..., Any], ...] = ()) -> list[Tensor | None]:
    """LXT's Gradient x Input for each input (per token for ids; None for None)."""
    leaves = [value.detach().clone().requires_grad_() if isinstance(value, Tensor) and value.is_floating_point()
              else value for value in inputs]
    ids = [value for value in leaves if isinstance(value, Tensor) and not value.is_floating_point()]
    saved = [parameter.requires_grad for parameter in model.parameters()]
    model.requires_grad_(False)
    mode = GradientTimesInput(ids, gradient_only)
    hooks = mode.activation_hooks()
    try:
        with mode:
            output = pick(model(*leaves))
        seed = torch.zeros_like(output)
        seed[..., target] = 1.0
        explained = [leaf for leaf in leaves if _input_dependent(leaf)] + [leaf for _, leaf in mode.lookups]
        gradients = iter(torch.autograd.grad(output, explained, seed, allow_unused=True))
    finally:
        for hook in hooks:
            hook.remove()
        for parameter, flag in zip(model.parameters(), saved, strict=True):
            parameter.requires_grad_(flag)
    assert not mode.unknown, f"the reference has no rule for {mode.unknown}"
    relevance: list[Tensor | None] = [
        (leaf * _or_zero(next(gradients), leaf)).detach() if _input_dependent(leaf) else None for leaf in leaves]
    lookups = [(indices, leaf * _or_zero(next(gradients), leaf)) for indices, leaf in mode.lookups]
    for position, value in enumerate(leaves):
        if isinstance(value, Tensor) and not value.is_floating_point():
            found = [share for indices, share in lookups
                     if indices.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()]
            relevance[position] = sum(share.reshape(*value.shape, -1).sum(-1) for share in found).detach()
    return relevance


def _or_zero(gradient: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if gradient is None else gradient


# -- the models ------------------------------------------------------------------------------------

VOCABULARY = 100
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
DECODER = dict(vocab_size=VOCABULARY, **SMALL, num_key_value_heads=2, max_position_embeddings=64)


def _ids(batch: int = 2, length: int = 7, seed: int = 0) -> Tensor:
    return torch.randint(3, VOCABULARY, (batch, length), generator=torch.Generator().manual_seed(seed))


def _floats(*shape: int, seed: int = 1) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _next_token(output: Any) -> Tensor:
    return output.logits[:, -1]


def _logits(output: Any) -> Tensor:
    return output.logits


def _qwen3_moe(experts: str | None) -> nn.Module:
    config = transformers.Qwen3MoeConfig(**DECODER, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=16)
    if experts is not None:
        config._experts_implementation = experts
    return transformers.Qwen3MoeForCausalLM(config)


def _gpt_oss(experts: str) -> nn.Module:
    config = transformers.GptOssConfig(**DECODER, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                       layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    config._experts_implementation = experts
    config._attn_implementation = "eager"
    return transformers.GptOssForCausalLM(config)


Patches = Callable[[], list[tuple[Any, str, Callable[..., Any]]]]


def _router_held_constant(family: str = "qwen3_moe", router: str = "Qwen3MoeTopKRouter",
                          gated_shared_expert: bool = False) -> Patches:
    """The router as a gate for the reference: its top-k weights computed without gradient (and
    Qwen2-MoE's shared expert's sigmoid gate detached)."""

    def patches() -> list[tuple[Any, str, Callable[..., Any]]]:
        modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=[router])
        router_type = getattr(modeling, router)
        forward = router_type.forward

        def constant(self, hidden_states):
            with torch.no_grad():
                return forward(self, hidden_states)

        found = [(router_type, "forward", constant)]
        if gated_shared_expert:
            sigmoid = F.sigmoid
            found.append((F, "sigmoid", lambda x: sigmoid(x.detach())))
        return found

    return patches


def _clip() -> nn.Module:
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=VOCABULARY, **SMALL, max_position_embeddings=16),
        vision_config=dict(image_size=16, patch_size=8, **SMALL), projection_dim=16)
    return transformers.CLIPModel(config)


IMAGE_TOKEN = VOCABULARY - 1
"""LLaVA's image placeholder: the ids hold one per image feature (16 patches of a 16 x 16 image)."""


def _llava() -> nn.Module:
    """A LLaVA-style vision-language model: a CLIP vision tower, a two-layer projector, a Llama."""
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(image_size=16, patch_size=4, **SMALL),
        text_config=transformers.LlamaConfig(**DECODER), image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)
    return transformers.LlavaForConditionalGeneration(config)


def _image_and_text() -> tuple[Tensor, Tensor]:
    """Text ids with the image's 16 placeholders after two tokens, and the image."""
    ids = _ids(batch=1, length=24)
    ids[:, 2:18] = IMAGE_TOKEN
    return ids, _floats(1, 3, 16, 16)


def _mixtral(experts: str | None = None) -> nn.Module:
    config = transformers.MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2)
    if experts is not None:
        config._experts_implementation = experts
    return transformers.MixtralForCausalLM(config)


def _whisper() -> nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=VOCABULARY, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=10, max_target_positions=16, decoder_start_token_id=1, pad_token_id=0)
    return transformers.WhisperForConditionalGeneration(config)


def _wav2vec2() -> nn.Module:
    config = transformers.Wav2Vec2Config(
        vocab_size=VOCABULARY, **SMALL, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, num_labels=3, classifier_proj_size=16)
    return transformers.Wav2Vec2ForSequenceClassification(config)


def _mamba(conv_bias: bool = True) -> nn.Module:
    return transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCABULARY, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
        use_cache=False, use_conv_bias=conv_bias))


def _mamba_lrp_scan(family: str = "mamba", function: str = "mamba_selective_scan") -> Patches:
    """MambaLRP's selective scan for the reference (as the MambaLRP authors' code writes it):
    the time step, B and C detached, so the decay ``exp(dt A)``, ``dt B`` and ``C`` are constants
    and the scan is a linear map of its input. ``family``: whose modeling file's copy of the scan
    ``function`` (Mamba-2's: ``mamba2_chunk_scan``)."""

    def patches() -> list[tuple[Any, str, Callable[..., Any]]]:
        modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=[function])
        scan = getattr(modeling, function).__wrapped__

        def detached(hidden_states, dt, A, B, C, *args, **kwargs):
            return scan(hidden_states, dt.detach(), A, B.detach(), C.detach(), *args, **kwargs)

        return [(modeling, function, detached)]

    return patches


def _activation_function(family: str, name: str) -> Patches:
    """A family's own activation function (ESM's ``gelu``, the erf formula in Python) as one
    activation for the reference: the identity rule on its input."""

    def patches() -> list[tuple[Any, str, Callable[..., Any]]]:
        modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=[name])
        activation = getattr(modeling, name)
        return [(modeling, name, lambda x: IdentityRule.apply(x, activation(x.detach())))]

    return patches


def _norm_in_input_dtype(self, hidden_states: Tensor) -> Tensor:
    """Llama's, Qwen's and Mamba's RMSNorm without its float32 upcast."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _gemma3_norm_in_input_dtype(self, x: Tensor) -> Tensor:
    return self._norm(x) * (1.0 + self.weight)


def _router_in_input_dtype(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Qwen3-MoE's top-k router with its softmax in the input's dtype (it takes it in float32)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_top_value, router_indices = torch.topk(torch.softmax(router_logits, dim=-1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        router_top_value = router_top_value / router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


def _in_float64(module: str, norm: str, forward: Callable[..., Any] = _norm_in_input_dtype,
                ) -> Callable[[], list[tuple[type, Callable[..., Any]]]]:
    """The RMSNorm class of ``modeling_<module>`` and its forward without the upcast."""
    def patches() -> list[tuple[type, Callable[..., Any]]]:
        modeling = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=[norm])
        found = [(getattr(modeling, norm), forward)]
        if hasattr(modeling, "Qwen3MoeTopKRouter"):
            found.append((modeling.Qwen3MoeTopKRouter, _router_in_input_dtype))
        return found

    return patches


def _grouped_mm_by_groups(input: Tensor, weight: Tensor, offs: Tensor | None = None, bias: Tensor | None = None,
                          out_dtype: torch.dtype | None = None) -> Tensor:
    """``torch._grouped_mm(input, weight, offs)`` as its definition: the rows of ``input`` up to
    each offset (from the previous one) times that group's matrix of ``weight``, by ``torch.mm``;
    in any dtype. Only the form transformers' experts use (and its gradient for the input): a
    matrix of rows, a stack of matrices, offsets, no bias."""
    if input.dim() != 2 or weight.dim() != 3 or offs is None or bias is not None or out_dtype is not None:
        raise NotImplementedError("the test's grouped matrix product takes rows, a stack of matrices and offsets")
    output = input.new_zeros(input.shape[0], weight.shape[-1])
    start = 0
    for group, end in enumerate(offs.tolist()):
        output[start:end] = torch.mm(input[start:end], weight[group])
        start = end
    return output


class Float32PartsInFloat64(TorchFunctionMode):
    """What a model computes in float32 whatever its dtype, computed in float64: its casts of
    float64 tensors to float32 left out (Mamba's selective scan's ``.float()``, the RMSNorms',
    residual stream's and logits' casts of Mamba's family, Mixtral's and the MoE routers'
    softmax in float32), tensors it makes without a dtype made in float64 (Mamba's scan state
    starts as ``torch.zeros``), and ``torch._grouped_mm``, which has no float64 kernel on the
    CPU (the experts of transformers' MoE models), computed group by group
    (:func:`_grouped_mm_by_groups`, registered as its CPU kernel while the mode is on). The
    same formulas then compute in float64, in the model both explanations run, so that every
    difference between them is float64 rounding."""

    def __enter__(self):
        self.default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        self.kernels = torch.library.Library("aten", "IMPL")
        self.kernels.impl("_grouped_mm", _grouped_mm_by_groups, "CPU")
        return super().__enter__()

    def __exit__(self, *exception: Any) -> None:
        self.kernels._destroy()
        torch.set_default_dtype(self.default)
        super().__exit__(*exception)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (Tensor.to, Tensor.float) and isinstance(args[0], Tensor) and args[0].dtype == torch.float64 and (
                func is Tensor.float or torch.float32 in args[1:] or kwargs.get("dtype") == torch.float32):
            return args[0]
        if kwargs.get("dtype") == torch.float32:
            kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    pick: Callable[[Any], Tensor]
    float64_forwards: Callable[[], list[tuple[type, Callable[..., Any]]]] | None = None
    """Classes that compute in float32 whatever the model's dtype (RMSNorm; Qwen3-MoE's router
    softmax) and their forward without the upcast, used for the comparison."""
    missing: tuple[str, ...] = ()
    """Operations fxlrp has no rule for (named by the strict error): converted with strict=False."""
    gradient_only: tuple[Callable[..., Any], ...] = ()
    """What the reference lets relevance follow the gradient through, as fxlrp does there."""
    outputs_round: bool = False
    """The model's parameters that require grad take other kernels than the explainer's detached
    twins (nn.MultiheadAttention run by fxlrp with ``strict=False``; BEiT and Swin with gradients
    on, for the relative position bias; FalconMamba, Jamba, Mamba and Zamba, whose
    ``dt_proj.weight @ time_step.transpose(1, 2)`` or ``x_proj`` torch.matmul folds into one
    matrix product for a weight that requires grad and broadcasts into a batched one for a
    detached weight; ConvBERT's linear layer on a transposed input: a matrix product and an add, or
    a batched product or one ``addmm``), whose rounding differs by an amount that depends on the
    machine. Which of the two a product takes also depends on which operands require grad at the
    time, which differs between the explainer's first run and its later recorded replays (on an
    AMD EPYC, Mamba's outputs differ in the last bits between them, in float64). Their outputs are
    compared with the model's own in float64 within 1e-9 relative, not bit for bit."""
    compared: bool = True
    """Whether the relevance is compared with the reference (not where only float32 runs and the
    gradient-following formulation divides by the inputs)."""
    replays: bool = True
    """Whether the model's run is recorded and replayed from the second call (fxlrp/eager/replay.py);
    not where transformers hands the experts module to a function (Qwen3-MoE), which a graph
    would hand on with its own parameters, nor where the model applies an autograd Function of
    its own (BLOOM's GeLU), whose backward a graph cannot replay."""
    reference_forwards: Callable[[], list[tuple[Any, str, Callable[..., Any]]]] | None = None
    """Functions the reference runs instead of the model's own (``(module, name, function)``):
    MambaLRP's selective scan with its selective parameters detached."""
    float32_parts: bool = False
    """The model computes parts in float32 whatever its dtype (Mamba's scan, norms, residual stream
    and logits; the grouped matrix product of MoE experts, float32-only on the CPU): the test runs
    under :class:`Float32PartsInFloat64`."""


CASES = {
    "BertForSequenceClassification": Case(
        lambda: transformers.BertForSequenceClassification(
            transformers.BertConfig(vocab_size=VOCABULARY, **SMALL, num_labels=3)),
        lambda: (_ids(),), _logits),
    "RobertaForQuestionAnswering": Case(
        lambda: transformers.RobertaForQuestionAnswering(
            transformers.RobertaConfig(vocab_size=VOCABULARY, **SMALL, pad_token_id=1)),
        lambda: (_ids(),), lambda output: output.start_logits),
    "DistilBertForSequenceClassification": Case(
        lambda: transformers.DistilBertForSequenceClassification(transformers.DistilBertConfig(
            vocab_size=VOCABULARY, dim=32, n_layers=2, n_heads=4, hidden_dim=64, num_labels=3)),
        lambda: (_ids(),), _logits),
    "GPT2LMHeadModel": Case(
        lambda: transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=VOCABULARY, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        lambda: (_ids(),), _next_token),
    "LlamaForCausalLM": Case(
        lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER, attention_bias=True)),
        lambda: (_ids(),), _next_token, float64_forwards=_in_float64("llama", "LlamaRMSNorm")),
    "Qwen2ForCausalLM": Case(
        lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**DECODER)),
        lambda: (_ids(),), _next_token, float64_forwards=_in_float64("qwen2", "Qwen2RMSNorm")),
    "Qwen3ForCausalLM": Case(
        lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**DECODER, head_dim=8)),
        lambda: (_ids(),), _next_token, float64_forwards=_in_float64("qwen3", "Qwen3RMSNorm")),
    "Qwen3MoeForCausalLM": Case(  # experts by batched matrix products
        lambda: _qwen3_moe("batched_mm"), lambda: (_ids(),), _next_token, replays=False,
        float64_forwards=_in_float64("qwen3_moe", "Qwen3MoeRMSNorm"), reference_forwards=_router_held_constant()),
    "Qwen3MoeForCausalLM-grouped_mm": Case(  # the default experts: a grouped matrix product
        lambda: _qwen3_moe(None), lambda: (_ids(),), _next_token, float32_parts=True, replays=False,
        reference_forwards=_router_held_constant()),
    "Qwen3MoeForCausalLM-eager": Case(  # the experts' own loop (softmax, topk, products, index_add_), as
        # transformers 4.x writes every MoE block: the top-k weights of the softmax are gates there too
        lambda: _qwen3_moe("eager"), lambda: (_ids(),), _next_token, replays=False,
        float64_forwards=_in_float64("qwen3_moe", "Qwen3MoeRMSNorm"), reference_forwards=_router_held_constant()),
    "Gemma3ForCausalLM": Case(
        lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            **DECODER, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"])),
        lambda: (_ids(),), _next_token,
        float64_forwards=_in_float64("gemma3", "Gemma3RMSNorm", _gemma3_norm_in_input_dtype)),
    "BloomForCausalLM": Case(  # ALiBi: the attention bias added by alibi.baddbmm(batch1=q, batch2=k)
        lambda: transformers.BloomForCausalLM(
            transformers.BloomConfig(vocab_size=VOCABULARY, hidden_size=32, n_layer=2, n_head=4)),
        lambda: (_ids(),), _next_token, replays=False),
    "T5ForConditionalGeneration": Case(  # one decoder step: the decoder's ids so far, its next token
        lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=VOCABULARY, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
        lambda: (_ids(), None, _ids(length=3, seed=2)), _next_token),
    "ViTForImageClassification": Case(
        lambda: transformers.ViTForImageClassification(
            transformers.ViTConfig(image_size=16, patch_size=8, **SMALL, num_labels=3)),
        lambda: (_floats(2, 3, 16, 16),), _logits),
    "CLIPModel": Case(  # the image-text score: text ids and pixels both explained
        _clip, lambda: (_ids(), _floats(2, 3, 16, 16)), lambda output: output.logits_per_image),
    "SiglipVisionModel": Case(  # without the attention-pooling head: its last hidden state's first token
        lambda: transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(image_size=16, patch_size=8, **SMALL, vision_use_head=False)),
        lambda: (_floats(2, 3, 16, 16),), lambda output: output.last_hidden_state[:, 0]),
    "SiglipVisionModel-head": Case(
        lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(image_size=16, patch_size=8, **SMALL)),
        # its head is nn.MultiheadAttention run eagerly (F.multi_head_attention_forward), explained by
        # the module's decomposition (tests/unit/test_eager_capture.py: equal to the graph's); the reference
        # here has no such decomposition, so outputs and finite relevance are what is checked
        lambda: (_floats(2, 3, 16, 16),), lambda output: output.pooler_output, outputs_round=True, compared=False),
    "WhisperForConditionalGeneration": Case(  # one decoder step
        _whisper, lambda: (_floats(2, 8, 20), None, _ids(length=3, seed=2)), _next_token),
    "Wav2Vec2ForSequenceClassification": Case(_wav2vec2, lambda: (_floats(2, 400),), _logits),
    "MambaForCausalLM": Case(  # its selective scan computes in float32 (.float()) whatever the dtype
        lambda: _mamba(), lambda: (_ids(),), _next_token, float32_parts=True, reference_forwards=_mamba_lrp_scan(),
        outputs_round=True),
    "LlavaForConditionalGeneration": Case(  # the next token after text and an image: ids and pixels explained
        # (not replayed: transformers checks the count of image placeholders, a value of the ids, in Python)
        _llava, _image_and_text, _next_token, replays=False, float64_forwards=_in_float64("llama", "LlamaRMSNorm")),
    "MixtralForCausalLM-batched_mm": Case(  # batched experts (float64; the default grouped product is float32)
        lambda: _mixtral("batched_mm"), lambda: (_ids(),), _next_token, replays=False,
        float64_forwards=_in_float64("mixtral", "MixtralRMSNorm"),
        reference_forwards=_router_held_constant("mixtral", "MixtralTopKRouter")),
}


def _built(model: str, config: str, **settings: Any) -> Callable[[], nn.Module]:
    return lambda: getattr(transformers, model)(getattr(transformers, config)(**settings))


MORE_CASES = {  # families beyond the list, each as a user brings it
    "MistralForCausalLM": Case(_built("MistralForCausalLM", "MistralConfig", **DECODER), lambda: (_ids(),),
                               _next_token, float64_forwards=_in_float64("mistral", "MistralRMSNorm")),
    "Phi3ForCausalLM": Case(_built("Phi3ForCausalLM", "Phi3Config", **DECODER, pad_token_id=0), lambda: (_ids(),),
                            _next_token, float64_forwards=_in_float64("phi3", "Phi3RMSNorm")),
    "PhiForCausalLM": Case(_built("PhiForCausalLM", "PhiConfig", **DECODER, partial_rotary_factor=0.5),
                           lambda: (_ids(),), _next_token),
    "GPTNeoXForCausalLM": Case(_built("GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=VOCABULARY, **SMALL,
                                      rotary_pct=0.5, max_position_embeddings=64), lambda: (_ids(),), _next_token),
    "OPTForCausalLM": Case(_built("OPTForCausalLM", "OPTConfig", vocab_size=VOCABULARY, hidden_size=32,
                                  num_hidden_layers=2, ffn_dim=64, num_attention_heads=4, max_position_embeddings=64,
                                  word_embed_proj_dim=32), lambda: (_ids(),), _next_token),
    "GPTJForCausalLM": Case(_built("GPTJForCausalLM", "GPTJConfig", vocab_size=VOCABULARY, n_embd=32, n_layer=2,
                                   n_head=4, rotary_dim=4, n_positions=64), lambda: (_ids(),), _next_token),
    "GPTBigCodeForCausalLM": Case(_built("GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=VOCABULARY,
                                         n_embd=32, n_layer=2, n_head=4, n_positions=64), lambda: (_ids(),),
                                  _next_token),
    "Gemma2ForCausalLM": Case(_built("Gemma2ForCausalLM", "Gemma2Config", **DECODER, head_dim=8,
                                     query_pre_attn_scalar=8, sliding_window=4), lambda: (_ids(),), _next_token),
    "Starcoder2ForCausalLM": Case(_built("Starcoder2ForCausalLM", "Starcoder2Config", **DECODER),
                                  lambda: (_ids(),), _next_token),
    "Olmo2ForCausalLM": Case(_built("Olmo2ForCausalLM", "Olmo2Config", **DECODER, pad_token_id=0),
                             lambda: (_ids(),), _next_token),
    "StableLmForCausalLM": Case(_built("StableLmForCausalLM", "StableLmConfig", **DECODER), lambda: (_ids(),),
                                _next_token),
    "MixtralForCausalLM": Case(  # the default experts: a grouped matrix product
        _mixtral, lambda: (_ids(),), _next_token, float32_parts=True, replays=False,
        reference_forwards=_router_held_constant("mixtral", "MixtralTopKRouter")),
    "Qwen2MoeForCausalLM": Case(  # a shared expert behind a sigmoid gate as well
        _built("Qwen2MoeForCausalLM", "Qwen2MoeConfig", **DECODER, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=16, shared_expert_intermediate_size=16),
        lambda: (_ids(),), _next_token, float32_parts=True, replays=False,
        reference_forwards=_router_held_constant("qwen2_moe", "Qwen2MoeTopKRouter", gated_shared_expert=True)),
    "GptOssForCausalLM-eager": Case(  # its experts' own loop; the router takes topk of its logits, then
        # softmax: the softmax of the chosen scores is the gate (attention sinks in its attention)
        lambda: _gpt_oss("eager"), lambda: (_ids(),), _next_token, replays=False,
        reference_forwards=_router_held_constant("gpt_oss", "GptOssTopKRouter")),
    "SwitchTransformersForConditionalGeneration": Case(  # top-1 routing by max of the router's softmax
        _built("SwitchTransformersForConditionalGeneration", "SwitchTransformersConfig", vocab_size=VOCABULARY,
               d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4,
               expert_capacity=64, encoder_sparse_step=1, decoder_sparse_step=1, decoder_start_token_id=0),
        lambda: (_ids(), None, _ids(length=3, seed=2)), _next_token, replays=False,
        reference_forwards=_router_held_constant("switch_transformers", "SwitchTransformersTop1Router")),
    "AlbertForSequenceClassification": Case(
        _built("AlbertForSequenceClassification", "AlbertConfig", vocab_size=VOCABULARY, embedding_size=16, **SMALL,
               num_labels=3), lambda: (_ids(),), _logits),
    "ElectraForSequenceClassification": Case(
        _built("ElectraForSequenceClassification", "ElectraConfig", vocab_size=VOCABULARY, embedding_size=16,
               **SMALL, num_labels=3), lambda: (_ids(),), _logits),
    "XLMRobertaForSequenceClassification": Case(
        _built("XLMRobertaForSequenceClassification", "XLMRobertaConfig", vocab_size=VOCABULARY, **SMALL,
               pad_token_id=1, num_labels=3), lambda: (_ids(),), _logits),
    "MPNetForSequenceClassification": Case(
        _built("MPNetForSequenceClassification", "MPNetConfig", vocab_size=VOCABULARY, **SMALL, num_labels=3),
        lambda: (_ids(),), _logits),
    "DebertaV2ForSequenceClassification": Case(  # disentangled attention
        _built("DebertaV2ForSequenceClassification", "DebertaV2Config", vocab_size=VOCABULARY, **SMALL,
               num_labels=3), lambda: (_ids(),), _logits, replays=False),  # its padding warning reads the ids
    "BartForConditionalGeneration": Case(  # one decoder step
        _built("BartForConditionalGeneration", "BartConfig", vocab_size=VOCABULARY, d_model=32, encoder_layers=1,
               decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
               decoder_ffn_dim=64, max_position_embeddings=64),
        lambda: (_ids(), None, _ids(length=3, seed=2)), _next_token),
    "BeitForImageClassification": Case(  # relative position bias
        _built("BeitForImageClassification", "BeitConfig", image_size=16, patch_size=8, **SMALL, num_labels=3,
               use_relative_position_bias=True), lambda: (_floats(2, 3, 16, 16),), _logits, outputs_round=True,
        replays=False),  # its relative position index is a tensor from an lru_cache, made outside the run
    "Dinov2Model": Case(_built("Dinov2Model", "Dinov2Config", image_size=16, patch_size=8, **SMALL),
                        lambda: (_floats(2, 3, 16, 16),), lambda output: output.pooler_output),
    "DeiTForImageClassification": Case(
        _built("DeiTForImageClassification", "DeiTConfig", image_size=16, patch_size=8, **SMALL, num_labels=3),
        lambda: (_floats(2, 3, 16, 16),), _logits),
    "SwinForImageClassification": Case(  # shifted windows, relative position bias
        _built("SwinForImageClassification", "SwinConfig", image_size=16, patch_size=2, embed_dim=8, depths=[1, 1],
               num_heads=[2, 2], window_size=4, num_labels=3), lambda: (_floats(2, 3, 16, 16),), _logits,
        outputs_round=True),
    "ConvNextForImageClassification": Case(
        _built("ConvNextForImageClassification", "ConvNextConfig", num_stages=2, hidden_sizes=[8, 16],
               depths=[1, 1], num_labels=3), lambda: (_floats(2, 3, 32, 32),), _logits),
    "ConvBertForSequenceClassification": Case(  # dynamic convolution: unfold, a softmax kernel, torch.multiply
        _built("ConvBertForSequenceClassification", "ConvBertConfig", vocab_size=VOCABULARY, **SMALL,
               embedding_size=16, conv_kernel_size=3, max_position_embeddings=64, num_labels=3),
        lambda: (_ids(),), _logits, replays=False, outputs_round=True),  # its padding warning reads the ids
    "RTDetrForObjectDetection": Case(  # deformable attention (grid_sample) over a ResNet's feature maps
        _built("RTDetrForObjectDetection", "RTDetrConfig", backbone_config=transformers.RTDetrResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], layer_type="basic",
            out_features=["stage2", "stage3", "stage4"]), encoder_in_channels=[16, 16, 32],
            decoder_in_channels=[16, 16, 16], encoder_hidden_dim=16, d_model=16, encoder_ffn_dim=32,
            decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2, decoder_layers=1,
            decoder_n_points=2, num_queries=5, num_labels=3),
        lambda: (_floats(2, 3, 32, 32),), lambda output: output.logits[:, 0],  # the first query's classes
        replays=False),  # its position embeddings and anchors come from an lru_cache: made by an earlier call
    "EsmForSequenceClassification": Case(  # rotary positions, its own erf GeLU function
        _built("EsmForSequenceClassification", "EsmConfig", vocab_size=VOCABULARY, **SMALL, pad_token_id=1,
               mask_token_id=2, position_embedding_type="rotary", max_position_embeddings=64, num_labels=3),
        lambda: (_ids(),), _logits, reference_forwards=_activation_function("esm", "gelu")),
    "RoFormerForSequenceClassification": Case(  # rotary positions from a sinusoidal embedding table
        _built("RoFormerForSequenceClassification", "RoFormerConfig", vocab_size=VOCABULARY, **SMALL,
               max_position_embeddings=64, num_labels=3), lambda: (_ids(),), _logits,
        replays=False),  # its padding warning reads the ids
    "DeepseekV3ForCausalLM": Case(  # multi-head latent attention; a sigmoid router over groups, a gate
        _built("DeepseekV3ForCausalLM", "DeepseekV3Config", **{**DECODER, "num_key_value_heads": 4},
               moe_intermediate_size=16, n_routed_experts=4,
               n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
               kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8),
        lambda: (_ids(),), _next_token, float32_parts=True, replays=False,
        reference_forwards=_router_held_constant("deepseek_v3", "DeepseekV3TopkRouter")),
    "Llama4ForCausalLM": Case(  # rotary embedding as a complex product; a sigmoid router, a gate
        _built("Llama4ForCausalLM", "Llama4TextConfig", **DECODER, head_dim=8, intermediate_size_mlp=64,
               num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1),
        lambda: (_ids(),), _next_token, reference_forwards=_router_held_constant("llama4", "Llama4Router")),
    # families with their own copy of Mamba's selective scan, which computes in float32
    "FalconMambaForCausalLM": Case(  # B, C and the time step RMS-normalised
        _built("FalconMambaForCausalLM", "FalconMambaConfig", vocab_size=VOCABULARY, hidden_size=32, state_size=8,
               num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False),
        lambda: (_ids(),), _next_token, float32_parts=True, outputs_round=True,
        reference_forwards=_mamba_lrp_scan("falcon_mamba")),
    "JambaForCausalLM": Case(  # Mamba and attention layers
        _built("JambaForCausalLM", "JambaConfig", **DECODER, num_experts=1, attn_layer_period=2, attn_layer_offset=1,
               mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_cache=False),
        lambda: (_ids(),), _next_token, float32_parts=True, outputs_round=True,
        reference_forwards=_mamba_lrp_scan("jamba")),
    # Mamba-2's scan, in chunks (of 4 here: two, the last padded)
    "Mamba2ForCausalLM": Case(
        _built("Mamba2ForCausalLM", "Mamba2Config", vocab_size=VOCABULARY, hidden_size=32, state_size=8,
               num_hidden_layers=2, expand=2, num_heads=8, head_dim=8, n_groups=2, chunk_size=4, conv_kernel=4,
               use_cache=False),
        lambda: (_ids(),), _next_token, float32_parts=True,
        reference_forwards=_mamba_lrp_scan("mamba2", "mamba2_chunk_scan")),
    "BambaForCausalLM": Case(  # Mamba-2 and attention layers
        _built("BambaForCausalLM", "BambaConfig", **DECODER, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1,
               mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4, attn_layer_indices=[1],
               use_cache=False),
        lambda: (_ids(),), _next_token, float32_parts=True,
        reference_forwards=_mamba_lrp_scan("bamba", "mamba2_chunk_scan")),
    "ZambaForCausalLM": Case(  # Mamba layers, the last two with a shared attention block; two scans per layer
        _built("ZambaForCausalLM", "ZambaConfig", vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_mamba_heads=2, mamba_d_state=8,
               mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, attn_layer_period=1, attn_layer_offset=0,
               use_cache=False),
        lambda: (_ids(),), _next_token, float32_parts=True, reference_forwards=_mamba_lrp_scan("zamba"),
        outputs_round=True),
}


def _randomised(model: nn.Module) -> nn.Module:
    """Noise on every parameter: norms start at 1 and biases at 0 otherwise."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point():
                parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    return model


def _model(case: Case) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    model = _randomised(case.build().double().eval())
    inputs = tuple(value.double() if isinstance(value, Tensor) and value.is_floating_point() else value
                   for value in case.inputs())
    return model, inputs


@pytest.fixture
def in_float64(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Case], None]]:
    """Applies a case's float64 forwards, and :class:`Float32PartsInFloat64` for the rest of the test
    where the case asks for it."""
    with contextlib.ExitStack() as stack:
        def apply(case: Case) -> None:
            for module_type, forward in case.float64_forwards() if case.float64_forwards is not None else ():
                monkeypatch.setattr(module_type, "forward", forward)
            if case.float32_parts:
                stack.enter_context(Float32PartsInFloat64())

        yield apply


@pytest.mark.parametrize("name", [*CASES, *(pytest.param(name, marks=pytest.mark.slow) for name in MORE_CASES)])
def test_attnlrp_equals_lxts_gradient_times_input(name: str, in_float64) -> None:
    case = CASES.get(name) or MORE_CASES[name]
    in_float64(case)
    model, inputs = _model(case)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0), strict=not case.missing)
    for grad in (False, True):  # T5's attention takes other kernels with and without gradients
        with torch.set_grad_enabled(grad):
            explained, own = case.pick(explain(*inputs)).detach(), case.pick(model(*inputs)).detach()
        if not case.outputs_round:  # the same kernels on the same layouts
            assert torch.equal(explained, own)
        # where the kernels may differ, the same sums in another order
        assert relative_error(explained, own) <= 1e-9
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = fxlrp.attribute(explain, inputs, target=1, output=case.pick)
        # the second call of the signature: the model's run is recorded and replayed as a graph
        relevance = fxlrp.attribute(explain, inputs, target=1, output=case.pick)
    assert all(bool(recorded.replays) is case.replays for recorded in recordings(explain))
    for replayed, ran in zip(relevance, first, strict=True):
        assert (replayed is None and ran is None) or relative_error(replayed, ran) <= 1e-12
    followed = {str(warning.message) for warning in caught if "follows the gradient" in str(warning.message)}
    assert all(any(operation in message for operation in case.missing) for message in followed)
    assert len(followed) >= len(case.missing)
    for ours, value in zip(relevance, inputs, strict=True):
        assert (ours is None) == (value is None)
        assert value is None or (ours.shape == value.shape and torch.isfinite(ours).all() and ours.abs().max() > 0)
    if not case.compared:
        return
    with pytest.MonkeyPatch.context() as patch:
        for module, attribute, function in case.reference_forwards() if case.reference_forwards is not None else ():
            patch.setattr(module, attribute, function)
        expected = reference_relevance(model, inputs, case.pick, target=1, gradient_only=case.gradient_only)
    for ours, theirs in zip(relevance, expected, strict=True):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert relative_error(ours, theirs) <= 1e-10, (name, relative_error(ours, theirs))


def test_strict_conversion_names_the_operations_without_a_rule(monkeypatch: pytest.MonkeyPatch, in_float64) -> None:
    """Mamba's scan explained operation by operation (transformers 4.x writes it inline; here a
    copy of transformers 5's function, which fxlrp does not know) has no rule for the decay
    ``exp(dt A)``: strict conversion names it, ``strict=False`` lets relevance follow its gradient."""
    import types

    from transformers.models.mamba import modeling_mamba

    import fxlrp.integrations.transformers  # noqa: F401  (the integration registers the scan before it is replaced)

    scan = modeling_mamba.mamba_selective_scan.__wrapped__
    copy = types.FunctionType(scan.__code__, scan.__globals__, scan.__name__, scan.__defaults__)
    copy.__kwdefaults__ = scan.__kwdefaults__
    monkeypatch.setattr(modeling_mamba, "mamba_selective_scan", copy)
    case = CASES["MambaForCausalLM"]
    in_float64(case)
    model, inputs = _model(case)
    with pytest.raises(fxlrp.UnsupportedOperationError) as error:
        fxlrp.attribute(fxlrp.convert(model, AttnLRP(epsilon=0.0)), inputs, target=1, output=case.pick)
    assert "1 operation(s)" in str(error.value) and "- torch.exp " in str(error.value)
    with pytest.warns(UserWarning, match="follows the gradient through torch.exp"):
        relevance = fxlrp.attribute(fxlrp.convert(model, AttnLRP(epsilon=0.0), strict=False), inputs, target=1,
                                    output=case.pick)
    expected = reference_relevance(model, inputs, case.pick, target=1, gradient_only=(torch.exp,))
    assert relative_error(relevance[0], expected[0]) <= 1e-10


class _Masked(nn.Module):
    """A language model called with a fixed padding mask (``attention_mask``)."""

    def __init__(self, model: nn.Module, mask: Tensor) -> None:
        super().__init__()
        self.model, self.mask = model, mask

    def forward(self, ids: Tensor) -> Any:
        return self.model(ids, attention_mask=self.mask)


def _at_each_last_token(lengths: tuple[int, ...]) -> Callable[[Any], Tensor]:
    """The logits after each sequence's last token, in a batch padded on the right."""
    return lambda output: output.logits[torch.arange(len(lengths)), torch.tensor(lengths) - 1]


def _rotary_in_float64(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Llama's rotary embedding with its angles, cos and sin in float64 (transformers computes them
    in float32 whatever the model's dtype)."""
    freqs = position_ids[..., None].double() * self.inv_freq.double()
    angles = torch.cat((freqs, freqs), dim=-1)
    return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "GPT2LMHeadModel"])
def test_a_padded_batch_is_explained_at_each_sequences_last_token(name: str, in_float64,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A causal LM's default target is the next token after each sequence's last token, which the
    padding mask (``attention_mask``) marks: in a batch padded on the right, the shorter sequence's
    last position is padding, whose prediction nobody asked to explain (before: the padded
    sequence's token relevance was 61% (Llama) and 51% (GPT-2) off). Each sequence's token
    relevance equals the reference's for it alone, without padding, within 1e-9 relative; padding
    gets none. A batch of another length computes by other kernels (a vectorised and a scalar
    loop), which round differently: Llama's rotary embedding, which transformers computes in
    float32, computes in float64 here (in the model both explanations run), so that every
    difference is float64 rounding."""
    case = CASES[name]
    in_float64(case)
    if name == "LlamaForCausalLM":
        from transformers.models.llama import modeling_llama

        monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", _rotary_in_float64)
    model, _ = _model(case)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    ids, lengths = _ids(length=7), (7, 4)
    mask = (torch.arange(7) < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    before_mask = list(inspect.signature(model.forward).parameters).index("attention_mask")
    inputs = (ids, *[None] * (before_mask - 1), mask)  # (GPT-2 takes past_key_values before it)
    relevance = fxlrp.attribute(explain, inputs, target=1)[0]
    [padded] = reference_relevance(_Masked(model, mask), (ids,), _at_each_last_token(lengths), target=1)
    for sample, length in enumerate(lengths):
        [expected] = reference_relevance(model, (ids[sample:sample + 1, :length],), _next_token, target=1)
        # (the reference itself gives the padded sequence its relevance alone: what the test asks)
        assert relative_error(padded[sample, :length], expected[0]) <= 1e-9
        assert relative_error(relevance[sample, :length], expected[0]) <= 1e-9
        # (exact: the explained position comes before the padding, which the causal model's
        # output there does not read: its gradient is 0)
        assert torch.equal(relevance[sample, length:], torch.zeros(7 - length, dtype=relevance.dtype))


def test_inputs_by_name_as_a_tokenizer_gives_them(in_float64) -> None:
    """``fxlrp.attribute(explain, tokenizer(texts, return_tensors="pt"))``: a mapping of inputs by
    name (before: its keys were handed to the model as inputs, an AttributeError on a str). Each
    goes to its place in the model's forward; relevance comes back under the same keys, equal to
    the call by position, and the padding mask found by its name: a right-padded sequence of
    GPT-2 (whose forward takes the cache between the ids and the mask) equals the reference for it
    alone."""
    ids, lengths = _ids(length=7), (7, 4)
    mask = (torch.arange(7) < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids).masked_fill(torch.arange(7) >= 3, 1)
    bert, _ = _model(CASES["BertForSequenceClassification"])
    explain = fxlrp.convert(bert, AttnLRP(epsilon=0.0))
    encoding = transformers.BatchEncoding({"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    by_name = fxlrp.attribute(explain, encoding, target=1)
    by_position = fxlrp.attribute(explain, (ids, mask, types), target=1)  # BERT's order: ids, mask, types
    assert list(by_name) == ["input_ids", "token_type_ids", "attention_mask"]
    assert torch.equal(by_name["input_ids"], by_position[0]) and by_name["attention_mask"] is None
    assert by_position[2] is not None and torch.equal(by_name["token_type_ids"], by_position[2])
    expected, _, _ = reference_relevance(bert, (ids[:1], None, types[:1]), _logits, target=1)  # (unpadded)
    assert relative_error(by_name["input_ids"][:1], expected) <= 1e-10

    case = CASES["GPT2LMHeadModel"]
    in_float64(case)
    gpt2, _ = _model(case)
    explain = fxlrp.convert(gpt2, AttnLRP(epsilon=0.0))
    relevance, nodes = fxlrp.attribute_nodes(explain, {"input_ids": ids, "attention_mask": mask}, [], target=1)
    assert list(relevance) == ["input_ids", "attention_mask"] and nodes == {}
    positional = fxlrp.attribute(explain, (ids, None, mask), target=1)[0]  # (the replay of the first call's run)
    assert relative_error(relevance["input_ids"], positional) <= 1e-12
    [alone] = reference_relevance(gpt2, (ids[1:, :4],), _next_token, target=1)
    assert relative_error(relevance["input_ids"][1, :4], alone[0]) <= 1e-10

    with pytest.raises(TypeError, match=r"no input 'pixel_values' .* \(its inputs: input_ids, "):
        fxlrp.attribute(explain, {"input_ids": ids, "pixel_values": ids}, target=1)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.layer(x * y)


def test_inputs_by_name_name_what_is_missing() -> None:
    explain = fxlrp.convert(TwoInputs())
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"input 'x' comes before those given and has no default"):
        fxlrp.attribute(explain, {"y": x}, target=0)
    with pytest.raises(TypeError, match=r"names of the model's inputs are not known here"):
        fxlrp.attribute(TwoInputs(), {"x": x, "y": x}, target=0)
    relevance = fxlrp.attribute(explain, {"y": x, "x": 2 * x}, target=0)
    assert list(relevance) == ["y", "x"]
    expected = fxlrp.attribute(explain, (2 * x, x), target=0)
    assert torch.equal(relevance["x"], expected[0]) and torch.equal(relevance["y"], expected[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["LlamaForCausalLM", "GPT2LMHeadModel", "BertForSequenceClassification",
                                  "MambaForCausalLM", "LlavaForConditionalGeneration", "MixtralForCausalLM-batched_mm"])
def test_low_precision_relevance_is_finite_in_its_dtype(name: str, dtype: torch.dtype) -> None:
    """A model in bfloat16 or float16, as language models are often loaded, is explained in its
    precision: finite relevance of its dtype, not all zero. How close it is to the reference run
    in float64 on the same (rounded) weights is a measurement, not a bound (no bound over a
    whole network in 16 bits holds on every CPU's kernels): ``benchmarks/low_precision.py``
    (docs/benchmarks.md), with the reference's own error in that precision beside it. No guard of
    16-bit relevance is reached here (AttnLRP's epsilon is 0 and no output is exactly 0: dropping
    zero denominators, and the float16 stabiliser's guard, can be removed without a NaN); the
    check that refuses NaN and Inf of 16-bit relevance is held by
    ``tests/unit/test_robustness.py::test_relevance_that_overflows_in_16_bits_is_an_error``."""
    case = CASES[name]
    model, inputs = _model(case)
    # (an image in the model's precision, as a processor hands it)
    inputs = tuple(value.to(dtype) if isinstance(value, Tensor) and value.is_floating_point() else value
                   for value in inputs)
    relevance = fxlrp.attribute(fxlrp.convert(model.to(dtype), AttnLRP(epsilon=0.0)), inputs, target=1,
                                output=case.pick)
    for explained in relevance:
        assert explained.dtype == dtype and bool(explained.isfinite().all()) and bool((explained != 0).any())


def test_the_reference_tells_attnlrp_from_gradient_times_input() -> None:
    """The reference's modifications matter here: plain gradient x input differs from it."""
    case = CASES["GPT2LMHeadModel"]
    model, inputs = _model(case)
    expected = reference_relevance(model, inputs, case.pick, target=1)
    embeddings = model.get_input_embeddings()(inputs[0]).detach().requires_grad_()
    output = case.pick(model(inputs_embeds=embeddings))
    [gradient] = torch.autograd.grad(output[:, 1].sum(), [embeddings])
    plain = (gradient * embeddings).sum(-1)
    assert relative_error(plain, expected[0]) > 1e-2


def _mamba2(conv_bias: bool) -> nn.Module:
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=VOCABULARY, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, num_heads=8, head_dim=8,
        n_groups=2, chunk_size=4, conv_kernel=4, use_cache=False, use_conv_bias=conv_bias, use_bias=False))


@pytest.mark.parametrize("build", [_mamba, _mamba2], ids=["Mamba", "Mamba-2"])
def test_mamba_lrp_conserves_relevance(build: Callable[[bool], nn.Module]) -> None:
    """MambaLRP's rules are conservative (SiLU and the norms by the identity rule, the gating
    product halved, the selective scan a linear map of its input without bias): without the
    convolution's bias, the only bias on the relevance path, token relevance sums to the
    explained logit. Relevance that followed the gradient into the time step, B and C (as an
    explanation of the scan operation by operation would) breaks that (Mamba: 2.6e-3 off,
    Mamba-2: 1.5e-3; MambaLRP's: 9e-16 and 8e-16). In float64 with the model's float32 casts left
    out (:class:`Float32PartsInFloat64`): the sum differs from the logit by float64 rounding only."""
    torch.manual_seed(0)
    model = _randomised(build(conv_bias=False).double().eval())
    ids = _ids()
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    with Float32PartsInFloat64():
        logit = _next_token(model(ids))[:, 1].detach()
        relevance = fxlrp.attribute(explain, ids, target=1, output=_next_token)
        leaky = reference_relevance(model, (ids,), _next_token, target=1, gradient_only=(torch.exp,))[0]
    assert relative_error(relevance.sum(-1), logit) <= 1e-10, relevance.sum(-1) - logit
    assert relative_error(leaky.sum(-1), logit) > 1e-4


TRANSFORMERS_ACTIVATIONS = [
    value for value in vars(activations).values()
    if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == activations.__name__
] + [modeling_bloom.BloomGelu]


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("activation", TRANSFORMERS_ACTIVATIONS, ids=lambda activation: activation.__name__)
def test_transformers_activation_modules_take_the_identity_rule(activation: type, capture: str) -> None:
    """Each of transformers' activation modules (and BLOOM's GeLU, an autograd Function of
    gelu_new's formula) is one elementwise map with the identity rule: between two linear layers
    without bias, ``R_x = x * W1^T (R_h / h)`` with ``R_h = act(h) * w2`` under the z-rule. Run
    operation by operation, BLOOM's GeLU kept 42-52% of the relevance; sqrt(softplus(x)) was a
    statistic held constant, and no relevance reached the input."""
    generator = torch.Generator().manual_seed(4)
    first = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    second = torch.randn(1, 6, generator=generator, dtype=torch.float64)
    x = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    module = activation(-10, 10) if activation is activations.ClippedGELUActivation else activation()
    model = nn.Sequential(nn.Linear(4, 6, bias=False), module, nn.Linear(6, 1, bias=False)).double().eval()
    with torch.no_grad():
        model[0].weight.copy_(first)
        model[2].weight.copy_(second)
        hidden = x @ first.T
        hidden_relevance = model[1](hidden) * second
    expected = x * ((hidden_relevance / hidden) @ first)
    relevance = fxlrp.attribute(fxlrp.convert(model, AttnLRP(epsilon=0.0), capture=capture), x, target=0)
    assert relative_error(relevance, expected) <= 1e-12
