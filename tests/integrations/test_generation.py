"""``fxlrp.explain_generation``: every generated token explained over its context from one forward.

The reference for each row is ``fxlrp.attribute`` on the prefix that ends before the row's token,
with that token as target: a separate forward over fewer tokens, so the teacher-forced forward,
the picking of each step's logits and the rows' starting relevance are checked against the
next-token explanation that ``tests/integrations/test_transformers.py`` checks against LXT's
formulation. Tiny random models from configs (Llama, GPT-2; T5 and BART for encoder-decoders),
in float64, compared at 1e-10. Llama's RMSNorm and rotary embedding compute in float32 whatever
the model's dtype; here they compute in float64 (the same formulas without the upcast), so that
runs over sequences of other lengths round alike to float64's precision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.references import relative_error
from torch import Tensor, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

import fxlrp
from fxlrp.rules.composites import AttnLRP

transformers = pytest.importorskip("transformers")

VOCABULARY = 60
DECODER = dict(vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
               eos_token_id=2)


def _rms_norm_in_float64(self: nn.Module, hidden_states: Tensor) -> Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rotary_in_float64(self: nn.Module, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    angles = position_ids[:, :, None].double() * self.inv_freq[None, None, :].double()
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)


@pytest.fixture
def llama_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms_norm_in_float64)
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", _rotary_in_float64)


def _randomised(model: nn.Module) -> nn.Module:
    """Noise on every parameter (norms start at 1 and biases at 0 otherwise), in float64."""
    generator = torch.Generator().manual_seed(3)
    model = model.double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    return model


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**DECODER, num_key_value_heads=2, attention_bias=True)
    return _randomised(transformers.LlamaForCausalLM(config))


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCABULARY, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return _randomised(transformers.GPT2LMHeadModel(config))


MODELS: dict[str, Callable[[], nn.Module]] = {"llama": llama, "gpt2": gpt2}


def _models(fast: str) -> list[Any]:
    """The models' names, ``fast`` in the fast lane and the others marked slow."""
    return [name if name == fast else pytest.param(name, marks=pytest.mark.slow) for name in MODELS]


def _prompts(batch: int = 2, length: int = 6, seed: int = 0) -> Tensor:
    return torch.randint(3, VOCABULARY, (batch, length), generator=torch.Generator().manual_seed(seed))


def _generated(model: nn.Module, prompts: Tensor, mask: Tensor | None = None, new: int = 5, **settings: Any) -> Tensor:
    """Greedy continuation; never stopped early (no end-of-sequence token can end it)."""
    with torch.no_grad():
        return model.generate(prompts, attention_mask=torch.ones_like(prompts) if mask is None else mask,
                              max_new_tokens=new, min_new_tokens=new, do_sample=False, **settings)


def _prefix_relevance(explain: nn.Module, sequences: Tensor, position: int, target: Any,
                      mask: Tensor | None = None) -> Tensor:
    """``fxlrp.attribute`` on the tokens before ``position``, explaining the next token."""
    inputs = {"input_ids": sequences[:, :position]}
    if mask is not None:
        inputs["attention_mask"] = mask[:, :position]
    return fxlrp.attribute(explain, inputs, target=target)["input_ids"]


@pytest.mark.parametrize("name", _models("llama"))
def test_each_row_equals_attribute_on_the_prefix(name: str, llama_in_float64: None) -> None:
    """Row ``r`` is ``fxlrp.attribute`` on ``sequences[:, :p]`` with the token at ``p`` as target
    (``p = start + r``); its score is that token's logit; the row is 0 from ``p`` on (the model
    is causal: nothing at or after ``p`` predicted the token at ``p``)."""
    model = MODELS[name]()
    prompts = _prompts()
    sequences = _generated(model, prompts)
    start = prompts.shape[1]
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    explained = fxlrp.explain_generation(explain, sequences, start)
    assert explained.relevance.shape == (2, sequences.shape[1] - start, sequences.shape[1])
    assert torch.equal(explained.targets, sequences[:, start:])
    with torch.no_grad():
        logits = model(sequences).logits
    for row, (position,) in enumerate(explained.positions):
        expected = _prefix_relevance(explain, sequences, position, sequences[:, position])
        assert relative_error(explained.relevance[:, row, :position], expected) <= 1e-10, row
        after = explained.relevance[:, row, position:]
        assert torch.equal(after, torch.zeros_like(after))
        chosen = logits[:, position - 1].gather(1, sequences[:, position, None])[:, 0]
        assert relative_error(explained.scores[:, row], chosen) <= 1e-10


def test_a_span_is_the_sum_of_its_rows(llama_in_float64: None) -> None:
    """``steps=[range(1, 4)]``: the sum of three steps' logits in one backward pass equals the sum
    of the three rows (relevance is linear in where it starts), and so does its score."""
    model = llama()
    prompts = _prompts()
    sequences = _generated(model, prompts)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    rows = fxlrp.explain_generation(explain, sequences, prompts.shape[1])
    span = fxlrp.explain_generation(explain, sequences, prompts.shape[1], steps=[range(1, 4), -1, [0, 2]])
    assert span.positions == ((7, 8, 9), (10,), (6, 8)) and span.labels[:2] == ("steps 1-3", "step 4")
    assert relative_error(span.relevance[:, 0], rows.relevance[:, 1:4].sum(1)) <= 1e-10
    assert relative_error(span.relevance[:, 2], rows.relevance[:, [0, 2]].sum(1)) <= 1e-10
    # (another call, whose LM head keeps other positions: a matrix product of another shape, float64)
    assert relative_error(span.relevance[:, 1], rows.relevance[:, 4]) <= 1e-12
    assert relative_error(span.scores[:, 0], rows.scores[:, 1:4].sum(1)) <= 1e-10
    assert torch.equal(span.targets[:, 0], torch.tensor([-1, -1])) and torch.equal(span.targets[:, 1],
                                                                                    sequences[:, -1])


def test_a_contrast_is_the_difference_of_two_rows(llama_in_float64: None) -> None:
    """``target=(None, other)``: the generated token's logit minus ``other``'s at every step equals
    the row of the generated token minus the row of ``other`` (a token id, or one per step), and
    a row of ``other`` equals ``fxlrp.attribute`` on the prefix with ``other`` as target."""
    model = llama()
    prompts = _prompts()
    sequences = _generated(model, prompts)
    start = prompts.shape[1]
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    generated = fxlrp.explain_generation(explain, sequences, start)
    other = fxlrp.explain_generation(explain, sequences, start, target=7)
    contrast = fxlrp.explain_generation(explain, sequences, start, target=(None, 7))
    assert relative_error(contrast.relevance, generated.relevance - other.relevance) <= 1e-10
    assert relative_error(contrast.scores, generated.scores - other.scores) <= 1e-10
    assert contrast.labels[0] == "step 0 vs 7"
    expected = _prefix_relevance(explain, sequences, start + 2, 7)
    assert relative_error(other.relevance[:, 2, :start + 2], expected) <= 1e-10
    per_step = torch.tensor([7, 9, 11, 13, 15])  # (an alternative continuation, one token per step)
    varied = fxlrp.explain_generation(explain, sequences, start, target=(None, per_step))
    expected = _prefix_relevance(explain, sequences, start + 3, (sequences[:, start + 3], torch.tensor([13, 13])))
    assert relative_error(varied.relevance[:, 3, :start + 3], expected) <= 1e-10


def test_a_function_of_the_logits_starts_from_its_share_of_each_logit(llama_in_float64: None) -> None:
    """``target=value(logits, tokens)``: a linear one (the generated token's logit) gives the
    default rows; a log-probability starts from ``z (onehot_t - softmax(z))``, its gradient x
    input at the logits, which ``fxlrp.attribute`` takes as the output relevance itself."""
    model = llama()
    prompts = _prompts(batch=1)
    sequences = _generated(model, prompts, new=3)
    start = prompts.shape[1]
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    generated = fxlrp.explain_generation(explain, sequences, start)
    logit = fxlrp.explain_generation(explain, sequences, start,
                                     target=lambda logits, tokens: logits.gather(1, tokens[:, None])[:, 0])
    assert relative_error(logit.relevance, generated.relevance) <= 1e-10
    assert torch.equal(logit.targets, torch.full((1, 3), -1))
    log_probability = fxlrp.explain_generation(
        explain, sequences, start,
        target=lambda logits, tokens: logits.log_softmax(-1).gather(1, tokens[:, None])[:, 0])
    position = start + 1
    with torch.no_grad():
        z = model(sequences[:, :position]).logits[:, -1]
    onehot = torch.nn.functional.one_hot(sequences[:, position], VOCABULARY).double()
    start_relevance = z * (onehot - z.softmax(-1))
    expected = fxlrp.attribute(explain, sequences[:, :position], target=start_relevance,
                               output=lambda out: out.logits[:, -1])
    assert relative_error(log_probability.relevance[:, 1, :position], expected) <= 1e-10
    assert relative_error(log_probability.scores[:, 1], z.log_softmax(-1)[0, sequences[0, position]]) <= 1e-10


@pytest.mark.parametrize("name", _models("gpt2"))  # (GPT-2 reads the positions: see the docstring)
def test_prompts_padded_on_the_left_each_get_their_own_matrix(name: str, llama_in_float64: None) -> None:
    """A batch of prompts of different lengths, padded on the left as ``generate`` needs them:
    each sample's matrix equals its explanation alone (the model gets the positions generate
    gives it, counted from each sample's first token: GPT-2's position embeddings read them), and
    padding gets none. The prompts' mask ``[batch, start]`` and the whole sequences' are the same."""
    model = MODELS[name]()
    prompts = _prompts(batch=3, length=7)
    lengths = torch.tensor([7, 4, 5])
    mask = (torch.arange(7) >= 7 - lengths[:, None]).long()
    prompts = prompts.masked_fill(mask == 0, 0)
    sequences = _generated(model, prompts, mask)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    batched = fxlrp.explain_generation(explain, sequences, 7, attention_mask=mask)
    whole = torch.cat([mask, torch.ones(3, sequences.shape[1] - 7, dtype=torch.long)], dim=1)
    assert relative_error(fxlrp.explain_generation(explain, sequences, 7, attention_mask=whole).relevance,
                          batched.relevance) <= 1e-12
    for sample, length in enumerate(lengths.tolist()):
        padding = 7 - length
        alone = fxlrp.explain_generation(explain, sequences[sample:sample + 1, padding:], length)
        assert relative_error(batched.relevance[sample, :, padding:], alone.relevance[0]) <= 1e-10, sample
        assert relative_error(batched.scores[sample], alone.scores[0]) <= 1e-10
        assert torch.equal(batched.relevance[sample, :, :padding], torch.zeros(5, padding, dtype=torch.float64))


@pytest.mark.parametrize("name", _models("gpt2"))
def test_generation_with_the_cache_is_explained_at_the_logits_it_generated_from(name: str,
                                                                               llama_in_float64: None) -> None:
    """``generate`` with its key/value cache (one token per forward, the earlier ones cached) and
    without it give the same tokens, and the teacher-forced forward that explains them computes the
    logits generate chose them from: each row's score is the logit generate returned for that
    step (``output_logits``), in a batch padded on the left too. generate returns its logits
    rounded to float32: within float32's epsilon of the float64 values."""
    model = MODELS[name]()
    prompts = _prompts(batch=2, length=6)
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    prompts = prompts.masked_fill(mask == 0, 0)
    with torch.no_grad():
        cached = model.generate(prompts, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                                use_cache=True, output_logits=True, return_dict_in_generate=True)
        uncached = _generated(model, prompts, mask, use_cache=False)
    assert torch.equal(cached.sequences, uncached)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    explained = fxlrp.explain_generation(explain, cached.sequences, 6, attention_mask=mask)
    step_logits = torch.stack(cached.logits, dim=1)  # [batch, steps, vocabulary]
    chosen = step_logits.gather(2, cached.sequences[:, 6:, None])[..., 0]
    assert step_logits.dtype == torch.float32
    assert relative_error(explained.scores, chosen.double()) <= torch.finfo(torch.float32).eps
    assert torch.equal(fxlrp.explain_generation(explain, uncached, 6, attention_mask=mask).relevance,
                       explained.relevance)


class _LargeStoragesAlive(TorchDispatchMode):
    """Counts, after each operation, the storages of at least ``size`` bytes that operations made
    and that are still alive (held weakly, so counting keeps none alive); the parameters' are
    left out. ``most``: the highest count seen."""

    def __init__(self, size: int, parameters: list[Tensor]) -> None:
        super().__init__()
        self.size, self.most = size, 0
        self.parameters = {parameter.untyped_storage().data_ptr() for parameter in parameters}
        self.alive: dict[int, StorageWeakRef] = {}

    def __torch_dispatch__(self, function: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = function(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, Tensor) and value.untyped_storage().nbytes() >= self.size:
                storage = value.untyped_storage()
                if storage.data_ptr() not in self.parameters:
                    self.alive.setdefault(storage.data_ptr(), StorageWeakRef(storage))
        self.alive = {address: weak for address, weak in self.alive.items() if not weak.expired()}
        self.most = max(self.most, len(self.alive))
        return result


def test_the_rows_hold_the_logits_and_one_starting_relevance_beside_them() -> None:
    """Memory beside the model's own (issue 55: explain_generation peaked above LXT's per-prefix
    explanation at 128 + 16 tokens): each row's backward pass starts from a relevance of the
    logits' size, and at no time are more than two tensors of that size alive - the logits and
    the current row's starting relevance (divided by the logits in place in the gradient form,
    freed when its pass returns; the LM head finds the positions and tokens that carry relevance
    without an absolute value of it). The vocabulary is the largest dimension, so nothing else the
    call makes is as large; every call of an input signature is counted (run eagerly, recorded,
    replayed)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                      num_attention_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    sequences = torch.randint(3, 2000, (1, 12), generator=torch.Generator().manual_seed(0))
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    logits_bytes = 5 * 2000 * 4  # (the 5 positions that predicted the 4 generated tokens, float32)
    for _ in range(3):
        with _LargeStoragesAlive(logits_bytes, list(model.parameters())) as counted:
            explained = fxlrp.explain_generation(explain, sequences, 8)
        assert counted.most == 2  # (what the rows hold: tests above)
    assert explained.relevance.shape == (1, 4, 12)


def test_a_list_of_targets_on_per_position_logits_names_the_generation_api() -> None:
    """The trap of issue 55: ``fxlrp.attribute(explain, ids, target=[t1, ..., tk])`` on a language
    model's per-position logits explained every target at the last position. It is refused,
    naming explain_generation, with repeat= too; candidates for the next token are explained
    once their position is picked with ``output=``, each as a call of its own."""
    model = gpt2()
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    ids = _prompts()
    for repeat in (0, 2):
        with pytest.raises(fxlrp.ExplanationInputError, match=r"fxlrp\.explain_generation\(explain, sequences"):
            fxlrp.attribute(explain, ids, target=[5, 6], repeat=repeat)
    candidates = fxlrp.attribute(explain, ids, target=[5, 6], output=lambda out: out.logits[:, -1])
    assert relative_error(candidates[1], fxlrp.attribute(explain, ids, target=6)) <= 1e-12
    contrast = fxlrp.attribute(explain, ids, target=(5, 6))  # (a pair is one target: the next token's contrast)
    assert relative_error(contrast, candidates[0] - candidates[1]) <= 1e-10


def test_bad_input_gets_one_line_saying_what_to_give() -> None:
    model = gpt2()
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    sequences = _generated(model, _prompts(), new=3)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    cases = [
        (dict(start=9), r"start=9: it is the position of the first generated token, between 1 and 8"),
        (dict(start=6, steps=[3]), r"step 3 is out of range: 3 tokens were generated"),
        (dict(start=6, steps=[range(2, 2)]), r"empty span"),
        (dict(start=6, attention_mask=mask), r"pads a prompt on the right.*padding_side = 'left'"),
        (dict(start=6, attention_mask=mask[:, :4]), r"attention_mask is \[2, 4\]; give the prompts' mask \[2, 6\]"),
        (dict(start=6, target=torch.tensor([1, 2])), r"token ids per step are \[3\] or \[2, 3\]"),
        (dict(start=6, target="the"), r"target 'the' is not a target fxlrp knows"),
        (dict(start=6, target=lambda logits, tokens: logits), r"must return one value per sample, a tensor \[2\]"),
    ]
    for settings, message in cases:
        with pytest.raises(fxlrp.ExplanationInputError, match=message) as error:
            fxlrp.explain_generation(explain, sequences, **settings)
        assert "\n" not in str(error.value)
    with pytest.raises(fxlrp.ExplanationInputError, match=r"sequences is a tensor of torch.float32; give token ids"):
        fxlrp.explain_generation(explain, sequences.float(), 6)
    with pytest.raises(TypeError, match=r"takes the explainer fxlrp.convert\(model\) returned, got GPT2LMHeadModel"):
        fxlrp.explain_generation(model, sequences, 6)


# -- encoder-decoder models -------------------------------------------------------------------------


def _t5_norm_in_float64(self: nn.Module, hidden_states: Tensor) -> Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def t5() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCABULARY, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=2)
    return _randomised(transformers.T5ForConditionalGeneration(config))


def bart() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=VOCABULARY, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    return _randomised(transformers.BartForConditionalGeneration(config))


@pytest.mark.parametrize("name", ["t5", pytest.param("bart", marks=pytest.mark.slow)])
def test_each_decoder_step_over_the_source_and_the_earlier_tokens(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoder-decoder model: each row's relevance over the decoder's earlier tokens
    (``relevance``) and over the encoder's input (``source_relevance``) equals ``fxlrp.attribute``
    on the source and the decoder's prefix, the step's token as target; a source padded on the
    right (its mask given) gives each sample the matrix it has alone, padding none."""
    if name == "t5":
        from transformers.models.t5 import modeling_t5

        monkeypatch.setattr(modeling_t5.T5LayerNorm, "forward", _t5_norm_in_float64)
    model = {"t5": t5, "bart": bart}[name]()
    source = _prompts(batch=2, length=7)
    source_mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    source = source.masked_fill(source_mask == 0, 0)
    with torch.no_grad():
        sequences = model.generate(source, attention_mask=source_mask, max_new_tokens=4, min_new_tokens=4,
                                   do_sample=False)
    explain = fxlrp.convert(model, AttnLRP(epsilon=0.0))
    explained = fxlrp.explain_generation(explain, sequences, 1, source=source, source_mask=source_mask)
    assert explained.source_relevance.shape == (2, sequences.shape[1] - 1, 7)
    assert torch.equal(explained.targets, sequences[:, 1:])
    for row, (position,) in enumerate(explained.positions):
        inputs = {"input_ids": source, "attention_mask": source_mask, "decoder_input_ids": sequences[:, :position]}
        expected = fxlrp.attribute(explain, inputs, target=sequences[:, position], output=lambda out: out.logits[:, -1])
        assert relative_error(explained.relevance[:, row, :position], expected["decoder_input_ids"]) <= 1e-10
        assert relative_error(explained.source_relevance[:, row], expected["input_ids"]) <= 1e-10
        assert torch.equal(explained.relevance[:, row, position:],
                           torch.zeros_like(explained.relevance[:, row, position:]))
    alone = fxlrp.explain_generation(explain, sequences[1:], 1, source=source[1:, :4])
    assert relative_error(explained.source_relevance[1, :, :4], alone.source_relevance[0]) <= 1e-10
    assert relative_error(explained.relevance[1], alone.relevance[0]) <= 1e-10
    assert torch.equal(explained.source_relevance[1, :, 4:], torch.zeros(4, 3, dtype=torch.float64))
