"""``fxlrp.explain_generation`` against LXT 2.1 explaining a generated sequence step by step.

LXT explains one logit per forward and backward pass, so explaining what a model generated is,
in LXT, one run per generated token on the prefix before it (its README's recipe:
``monkey_patch``, forward with ``inputs_embeds``, backward of the chosen logit seeded with
itself, gradient x input). fxlrp's ``explain_generation`` gives every step's row from one forward
over the whole sequence. With AttnLRP(epsilon=0) each row, scaled by its logit as LXT seeds it,
equals LXT's relevance for that step: in float64 as ``test_lxt_parity.py`` compares (RMSNorms in
the model's dtype, LXT's stabiliser 0), relative error <= 1e-10.
"""

from __future__ import annotations

import pytest
import torch
from families import FAMILIES, Family, causal_lm_logits, tiny_model, token_ids
from lxt_harness import (
    identity_rule_stabiliser,
    lxt_map_in_input_dtype,
    lxt_patched,
    lxt_relevance,
    norms_in_input_dtype,
    relative_error,
)

import fxlrp
from fxlrp.rules.composites import AttnLRP

GENERATED = 4


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2"])
def test_each_generated_step_equals_lxts_relevance_for_it(name: str) -> None:
    family = FAMILIES[name]
    with norms_in_input_dtype(family), identity_rule_stabiliser(0.0):
        _explain_each_step(family, tiny_model(family, "sdpa", torch.float64))


def _explain_each_step(family: Family, model: torch.nn.Module) -> None:
    prompts = token_ids(batch=2, length=6)
    with torch.no_grad():
        sequences = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=GENERATED,
                                   min_new_tokens=GENERATED, do_sample=False, pad_token_id=0)
    explained = fxlrp.explain_generation(fxlrp.convert(model, AttnLRP(epsilon=0.0)), sequences, prompts.shape[1])
    assert explained.relevance.shape == (2, GENERATED, sequences.shape[1])
    with lxt_patched(family, lxt_map_in_input_dtype(family, "attnlrp")):
        for row, (position,) in enumerate(explained.positions):
            expected, chosen = lxt_relevance(model, sequences[:, :position], sequences[:, position],
                                             causal_lm_logits)
            assert relative_error(explained.scores[:, row], chosen) <= 1e-10
            ours = explained.relevance[:, row, :position] * chosen[:, None]
            assert relative_error(ours, expected.sum(-1)) <= 1e-10, (row, relative_error(ours, expected.sum(-1)))
