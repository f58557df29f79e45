"""Where fxlrp and LXT 2.1 differ on purpose, with numbers (see docs/transformers.md).

1. LXT's identity rule (activations) scales the gradient by ``act(x) / (x + 1e-10)``: an input
   of 1e-10 passes half its relevance, one of -1e-10 an infinite relevance; fxlrp's identity rule
   passes ``R`` exactly. In a float64 model the stabiliser alone moves LXT's relevance by 6.5e-10
   (BERT) to 4.6e-8 (GPT-2) relative.
2. The Llama family computes its RMSNorm (Hugging Face's and LXT's patch) and, with eager
   attention, its softmax in float32 whatever the model's dtype: in float64 the two explanations
   then agree to float32's rounding only, and to float64's once the upcasts are gone.
3. LXT replaces BERT's classes with its own copy of ``modeling_bert``: a BERT made before
   ``monkey_patch`` keeps the original classes, and LXT's relevance for it is not AttnLRP (only
   the LayerNorms, patched on ``torch.nn.LayerNorm`` itself, follow the rules). fxlrp explains
   any instance.
4. An activation written out in torch operations (transformers' ``gelu_new``, GPT-2's default)
   is an activation only where it is registered as one (``fxlrp.integrations.transformers``); written inline in
   a model fxlrp does not register, fxlrp explains its operations one by one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from families import FAMILIES, tiny_model, token_ids
from lxt.efficient.rules import identity_rule_implicit
from lxt_harness import (
    compare,
    fxlrp_token_relevance,
    identity_rule_stabiliser,
    lxt_map_in_input_dtype,
    lxt_model,
    lxt_patched,
    lxt_relevance,
    norms_in_input_dtype,
    patch_map,
    relative_error,
    targets,
)
from torch import nn

import fxlrp
from fxlrp.rules.composites import AttnLRP


def test_lxts_identity_rule_has_a_stabiliser_fxlrps_passes_relevance_exactly() -> None:
    x = torch.tensor([1e-10, 1e-8, 1.0, -1.0, -1e-10], dtype=torch.float64)
    relevance = torch.ones_like(x)
    ours = fxlrp.attribute(fxlrp.convert(nn.GELU(), AttnLRP(epsilon=0.0)), x, target=relevance)
    assert torch.equal(ours, relevance)
    leaf = x.clone().requires_grad_()
    output = identity_rule_implicit(F.gelu, leaf)
    output.backward(relevance / output.detach())  # output relevance 1 in gradient x input
    lxts = (leaf.grad * leaf).detach()
    assert abs(lxts[0] - 0.5) < 1e-6  # x / (x + 1e-10) at x = 1e-10
    assert abs(lxts[1] - 1e-8 / (1e-8 + 1e-10)) < 1e-12  # 0.990
    assert abs(lxts[2] - 1.0) < 1e-9 and abs(lxts[3] - 1.0) < 1e-9
    assert not torch.isfinite(lxts[4])  # x + 1e-10 = 0


def test_the_stabiliser_moves_lxts_relevance_in_float64() -> None:
    """GPT-2 and BERT run in float64 throughout: with LXT's stabiliser the relative error is
    4.6e-8 (GPT-2) and 6.5e-10 (BERT), without it 2e-15 and 9e-16."""
    for name in ("gpt2", "bert"):
        family = FAMILIES[name]
        stock = compare(family, "attnlrp", "sdpa", torch.float64)
        with identity_rule_stabiliser(0.0):
            without = compare(family, "attnlrp", "sdpa", torch.float64)
        assert 1e-10 < stock < 1e-6 and without < 1e-13, (name, stock, without)


def test_the_llama_familys_float32_upcasts_limit_float64_agreement() -> None:
    """Llama in float64, LXT's stabiliser 0: stock 2.0e-8 (eager) and 3.0e-8 (SDPA); RMSNorm in
    float64: 4.7e-9 (eager: the float32 softmax remains) and 7e-16 (SDPA)."""
    family = FAMILIES["llama"]
    with identity_rule_stabiliser(0.0):
        stock = {attention: compare(family, "attnlrp", attention, torch.float64) for attention in ("eager", "sdpa")}
        with norms_in_input_dtype(family):
            mapping = lxt_map_in_input_dtype(family, "attnlrp")
            norms = {attention: compare(family, "attnlrp", attention, torch.float64, mapping)
                     for attention in ("eager", "sdpa")}
    assert all(1e-10 < error < 1e-6 for error in stock.values()), stock
    assert 1e-10 < norms["eager"] < 1e-6 and norms["sdpa"] < 1e-13, norms


def test_a_bert_made_before_lxts_patch_is_not_explained_by_lxt() -> None:
    """fxlrp against LXT on a BERT made after the patch: 7e-16; made before it: 0.37."""
    family = FAMILIES["bert"]
    model = tiny_model(family, "eager", torch.float64)
    ids = token_ids()
    target = targets(family, model, ids)
    relevance = fxlrp_token_relevance(model, ids, target, family.pick, AttnLRP(epsilon=0.0))
    with identity_rule_stabiliser(0.0), lxt_patched(family, patch_map(family, "attnlrp")) as modeling:
        made_before, chosen = lxt_relevance(model, ids, target, family.pick)
        made_after, _ = lxt_relevance(lxt_model(family, model, modeling), ids, target, family.pick)
    assert relative_error(relevance * chosen[:, None], made_after.sum(-1)) < 1e-13
    assert relative_error(relevance * chosen[:, None], made_before.sum(-1)) > 1e-2


class InlineNewGELU(nn.Module):
    """transformers' ``NewGELUActivation`` as a model of one's own would write it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def test_gpt2s_activation_is_an_activation_where_it_is_registered() -> None:
    """GPT-2 with ``gelu_new``, in float64 with LXT's stabiliser 0: LXT's relevance within 1e-10
    (registered by ``fxlrp.integrations.transformers``); the same values from an unregistered
    module: 5.5e-2 relative error, fxlrp splitting ``x * (1 + tanh(...))``."""
    family = FAMILIES["gpt2"]
    model = tiny_model(family, "eager", torch.float64)
    ids = token_ids()
    target = targets(family, model, ids)
    registered = fxlrp_token_relevance(model, ids, target, family.pick, AttnLRP(epsilon=0.0))
    with lxt_patched(family, patch_map(family, "attnlrp")), identity_rule_stabiliser(0.0):
        expected, chosen = lxt_relevance(model, ids, target, family.pick)
    inline = tiny_model(family, "eager", torch.float64)
    for block in inline.transformer.h:
        block.mlp.act = InlineNewGELU()
    with torch.no_grad():
        assert torch.equal(inline(ids).logits, model(ids).logits)
    unregistered = fxlrp_token_relevance(inline, ids, target, family.pick, AttnLRP(epsilon=0.0))
    assert relative_error(registered * chosen[:, None], expected.sum(-1)) <= 1e-10
    assert relative_error(unregistered * chosen[:, None], expected.sum(-1)) > 1e-2
