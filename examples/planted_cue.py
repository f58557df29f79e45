"""A planted cue: does the explanation find the one word that decides the label?

Generated sentences (no download): 6 to 12 filler words drawn at random, and in two of three
sentences one cue word, "good" or "bad", at a random position. The label is "positive" for
"good", "negative" for "bad", "neutral" without a cue, so each cue is the evidence for its class
(a model cannot call a sentence positive for lacking "bad"). A two-layer BERT
(``transformers.BertForSequenceClassification`` from a small config, with a WordPiece tokenizer
built here) learns the task in seconds. Held-out sentences with a cue are explained (their true
class) with

- AttnLRP and CP-LRP (fxlrp),
- gradient x input at the word embeddings (plain autograd),
- attention rollout (Abnar & Zuidema, 2020): the attention of each layer averaged over heads,
  ``0.5 A + 0.5 I`` for the residual, rows normalised, multiplied over layers; the row of [CLS],

and for each the share of the positive relevance that lies on the cue is averaged over sentences
(a random explanation gets 1/length, "chance"). Replacing the cue by a filler changes the
prediction, replacing a filler by another one barely moves the explained logit: the cue is the
model's evidence, so a faithful explanation puts its positive relevance there. A few sentences are
written to an HTML page with :mod:`fxlrp.viz.text`.

    python examples/planted_cue.py [--fast] [--out out/planted_cue]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from torch import Tensor

import fxlrp
from fxlrp.viz import text

CUES = {"bad": 0, "good": 1}
LABELS = ("negative", "positive", "neutral")
NEUTRAL = 2
FILLERS = ("the a movie film plot actor scene story music was is very quite rather this that it and but with some "
           "many long short new old first last seen watched today again really just screenplay soundtrack "
           "afternoon").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# the last three fillers are not in the vocabulary: WordPiece splits them (screen ##play, ...)
PIECES = ["screen", "##play", "sound", "##track", "after", "##noon"]
VOCABULARY = [*SPECIAL, *CUES, *FILLERS[:-3], *PIECES]
STEPS, STEPS_FAST = 600, 400
METHODS = ("AttnLRP", "CP-LRP", "gradient x input", "attention rollout")


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    label: int

    @property
    def text(self) -> str:
        return " ".join(self.words)


def make_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """BERT's WordPiece tokenization over :data:`VOCABULARY` (lower case, ``[CLS] ... [SEP]``)."""
    ids = {word: index for index, word in enumerate(VOCABULARY)}
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tokenizer.decoder = decoders.WordPiece()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def make_sentences(count: int, rng: random.Random, neutral: bool = True) -> list[Sentence]:
    """Sentences of 6-12 filler words, a third of them (``neutral``) without a cue, the rest with one."""
    sentences = []
    for _ in range(count):
        words = [rng.choice(FILLERS) for _ in range(rng.randint(6, 12))]
        if neutral and rng.random() < 1 / 3:
            sentences.append(Sentence(tuple(words), NEUTRAL))
            continue
        cue = rng.choice(list(CUES))
        words.insert(rng.randrange(len(words) + 1), cue)
        sentences.append(Sentence(tuple(words), CUES[cue]))
    return sentences


def make_model(layers: int = 2, heads: int = 2) -> transformers.BertForSequenceClassification:
    """A small BERT. Its initial weights are larger than BERT's (standard deviation 0.1, not
    0.02): from 0.02 some seeds first learn one cue and stay for hundreds of steps at calling the
    other cue's sentences neutral half of the time; from 0.1 seeds 0-7 all learn both in 400 steps."""
    config = transformers.BertConfig(
        vocab_size=len(VOCABULARY), hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=64, max_position_embeddings=32, num_labels=len(LABELS), initializer_range=0.1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        id2label=dict(enumerate(LABELS)), label2id={label: index for index, label in enumerate(LABELS)},
        attn_implementation="eager",  # attention weights for rollout (and the softmax in plain sight)
    )
    return transformers.BertForSequenceClassification(config)


def train(model: transformers.BertForSequenceClassification, tokenizer: transformers.PreTrainedTokenizerFast,
          steps: int, rng: random.Random, batch_size: int = 32) -> None:
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model.train()
    for _ in range(steps):
        batch = make_sentences(batch_size, rng)
        encoded = tokenizer([sentence.text for sentence in batch], padding=True, return_tensors="pt")
        labels = torch.tensor([sentence.label for sentence in batch])
        logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()


def gradient_times_input(model: transformers.BertForSequenceClassification, ids: Tensor, labels: Tensor) -> Tensor:
    """``dy/de . e`` at the word embeddings ``e`` (the lookup's output; position and token type
    embeddings are added after it), summed over the embedding dimension."""
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeddings).logits
    (gradient,) = torch.autograd.grad(logits.gather(1, labels[:, None]).sum(), embeddings)
    return (gradient * embeddings).sum(-1).detach()


def attention_rollout(model: transformers.BertForSequenceClassification, ids: Tensor) -> Tensor:
    """Abnar & Zuidema's rollout from [CLS]: ``prod_l normalise(0.5 mean_heads(A_l) + 0.5 I)``."""
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    identity = torch.eye(ids.shape[1])
    rollout = identity.expand(ids.shape[0], -1, -1)
    for attention in attentions:  # first layer first
        mixed = 0.5 * attention.mean(dim=1) + 0.5 * identity
        rollout = (mixed / mixed.sum(dim=-1, keepdim=True)) @ rollout
    return rollout[:, 0]


def cue_shares(relevance: Tensor, cue: Tensor) -> Tensor:
    """Per sentence: positive relevance on the cue token over all positive relevance (0 where
    nothing is positive)."""
    positive = relevance.clamp(min=0)
    total = positive.sum(dim=1)
    on_cue = positive.gather(1, cue[:, None])[:, 0]
    return torch.where(total > 0, on_cue / total.clamp(min=1e-30), torch.zeros_like(total))


def accuracy(model: transformers.BertForSequenceClassification, tokenizer: transformers.PreTrainedTokenizerFast,
             sentences: list[Sentence]) -> float:
    encoded = tokenizer([sentence.text for sentence in sentences], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
    return float((logits.argmax(dim=1) == torch.tensor([sentence.label for sentence in sentences])).float().mean())


def by_length(sentences: list[Sentence], tokenizer: transformers.PreTrainedTokenizerFast) -> dict[int, list[int]]:
    """Sentence indices grouped by token count: each group is one batch without padding."""
    groups: dict[int, list[int]] = {}
    for index, sentence in enumerate(sentences):
        groups.setdefault(len(tokenizer(sentence.text)["input_ids"]), []).append(index)
    return groups


@dataclass
class Measured:
    """Explanations of held-out sentences and what the model does with their words."""

    shares: dict[str, Tensor]  # method -> cue share of each sentence
    relevance: dict[str, dict[int, Tensor]]  # method -> sentence index -> relevance per token
    chance: float  # mean 1/length: the cue share of an explanation that knows nothing
    changed: float  # share of predictions that replacing the cue by a filler changes
    cue_effect: float  # smallest change of the explained logit when the cue is replaced by a filler
    filler_effect: float  # largest change when one filler is replaced by another


def measure(model: transformers.BertForSequenceClassification, tokenizer: transformers.PreTrainedTokenizerFast,
            sentences: list[Sentence]) -> Measured:
    """Explain the true class of each sentence (all with a cue) with each method, and replace
    words, in batches of sentences of one length (no padding)."""
    explainers = {"AttnLRP": fxlrp.convert(model, fxlrp.composites.AttnLRP()),
                  "CP-LRP": fxlrp.convert(model, fxlrp.composites.CPLRP())}
    methods: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
        name: (lambda ids, labels, explain=explain: fxlrp.attribute(explain, ids, target=labels))
        for name, explain in explainers.items()}
    methods["gradient x input"] = lambda ids, labels: gradient_times_input(model, ids, labels)
    methods["attention rollout"] = lambda ids, labels: attention_rollout(model, ids)

    cue_ids = torch.tensor([tokenizer.convert_tokens_to_ids(cue) for cue in CUES])
    filler_ids = torch.tensor(tokenizer.convert_tokens_to_ids(FILLERS[:-3]))
    shares = {name: torch.zeros(len(sentences)) for name in methods}
    relevance: dict[str, dict[int, Tensor]] = {name: {} for name in methods}
    changed, cue_effect, filler_effect, chance = 0, float("inf"), 0.0, 0.0
    generator = torch.Generator().manual_seed(0)

    def replaced(ids: Tensor, positions: Tensor) -> Tensor:
        """``ids`` with the token at ``positions`` (one per row) replaced by another filler word."""
        rows, current = torch.arange(len(ids)), ids[torch.arange(len(ids)), positions]
        choice = torch.randint(len(filler_ids), (len(ids),), generator=generator)
        choice = torch.where(filler_ids[choice] == current, (choice + 1) % len(filler_ids), choice)
        result = ids.clone()
        result[rows, positions] = filler_ids[choice]
        return result

    for length, members in sorted(by_length(sentences, tokenizer).items()):
        ids = tokenizer([sentences[index].text for index in members], return_tensors="pt")["input_ids"]
        labels = torch.tensor([sentences[index].label for index in members])
        is_cue = torch.isin(ids, cue_ids)
        assert (is_cue.sum(dim=1) == 1).all()
        cue = is_cue.int().argmax(dim=1)
        for name, method in methods.items():
            values = method(ids, labels)
            shares[name][members] = cue_shares(values, cue)
            relevance[name].update(zip(members, values, strict=True))
        # the model's evidence: without the cue the prediction changes, without a filler it does not
        filler = torch.randint(1, length - 1, (len(members),), generator=generator)  # not [CLS], [SEP]
        filler = torch.where(filler == cue, filler % (length - 2) + 1, filler)  # nor the cue
        without_cue, without_filler = replaced(ids, cue), replaced(ids, filler)
        rows = torch.arange(len(members))
        with torch.no_grad():
            logits, cue_logits, filler_logits = (model(input_ids=batch).logits
                                                 for batch in (ids, without_cue, without_filler))
        explained = logits[rows, labels]
        changed += int((cue_logits.argmax(dim=1) != logits.argmax(dim=1)).sum())
        cue_effect = min(cue_effect, float((cue_logits[rows, labels] - explained).abs().min()))
        filler_effect = max(filler_effect, float((filler_logits[rows, labels] - explained).abs().max()))
        chance += len(members) / length
    count = len(sentences)
    return Measured(shares, relevance, chance / count, changed / count, cue_effect, filler_effect)


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Returns the test accuracy, the mean cue share of each method (``shares``) and of the same
    methods on the untrained model (``untrained_shares``), chance (mean 1/length), the share of
    predictions that replacing the cue changes and the changes of the explained logit that
    replacing the cue (``cue_effect``, the smallest) or a filler (``filler_effect``, the largest)
    causes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer training steps and test sentences (for CI)")
    parser.add_argument("--out", type=Path, default=Path("out/planted_cue"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the training sentences")
    args = parser.parse_args(argv)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs fastest on one thread (two were 40x slower on busy cores)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer, model = make_tokenizer(), make_model()
    held_out = random.Random(12345)
    test = make_sentences(60 if args.fast else 300, held_out, neutral=False)  # explained: they have a cue
    untrained = measure(model, tokenizer, test)
    started, cpu_started = time.perf_counter(), time.process_time()
    train(model, tokenizer, steps=STEPS_FAST if args.fast else STEPS, rng=rng)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    measured = measure(model, tokenizer, test)
    test_accuracy = accuracy(model, tokenizer, make_sentences(len(test), held_out))

    shares = {name: float(values.mean()) for name, values in measured.shares.items()}
    untrained_shares = {name: float(values.mean()) for name, values in untrained.shares.items()}
    print(f"test accuracy {test_accuracy:.1%} on {len(test)} held-out sentences (a third neutral); training took "
          f"{seconds:.1f} s ({cpu_seconds:.1f} s of CPU time)")
    print(f"replacing the cue by a filler changes {measured.changed:.0%} of the predictions (the explained logit "
          f"moves by {measured.cue_effect:.2f} at least); replacing a filler moves it by "
          f"{measured.filler_effect:.2g} at most")
    print(f"share of positive relevance on the cue, mean over the sentences (chance, 1/length: "
          f"{measured.chance:.3f}):")
    print(f"  {'':<18} {'trained':>7}  {'':<14} {'untrained':>9}")
    for name, share in shares.items():
        print(f"  {name:<18} {share:7.3f}  ({share / measured.chance:4.1f}x chance) {untrained_shares[name]:9.3f}")

    fragments = []
    positive = [index for index, sentence in enumerate(test) if sentence.label == CUES["good"]]
    negative = [index for index, sentence in enumerate(test) if sentence.label == CUES["bad"]]
    shown = positive[:2] + negative[:2]
    for index in shown:
        sentence = test[index]
        tokens = text.tokens_of(tokenizer, tokenizer(sentence.text)["input_ids"])
        for name in METHODS:
            fragments.append(text.html(
                tokens, measured.relevance[name][index], merge_subwords=True,
                title=f"{name}: class {LABELS[sentence.label]!r}, share on the cue "
                      f"{measured.shares[name][index]:.2f}"))
    path = text.save_html(args.out / "planted_cue.html", *fragments, title="Planted cue: four held-out sentences")
    print(f"-> {path}")
    return {"accuracy": test_accuracy, "shares": shares, "untrained_shares": untrained_shares,
            "chance": measured.chance, "changed": measured.changed, "cue_effect": measured.cue_effect,
            "filler_effect": measured.filler_effect, "training_seconds": seconds,
            "training_cpu_seconds": cpu_seconds}


if __name__ == "__main__":
    main()
