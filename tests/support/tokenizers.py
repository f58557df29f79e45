"""Tokenizers built here (no downloads) for tiny Hugging Face models: BERT's WordPiece over a
given vocabulary and GPT-2's byte-level BPE trained on a few sentences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def wordpiece_tokenizer(words: Sequence[str]) -> Any:
    """BERT's tokenization (lower case, punctuation split, ``##`` continuations) over ``words``,
    which start with ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]`` and ``[MASK]``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocabulary = {word: index for index, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordPiece(vocabulary, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocabulary["[CLS]"]), ("[SEP]", vocabulary["[SEP]"])])
    tokenizer.decoder = decoders.WordPiece()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def bytelevel_tokenizer(sentences: Sequence[str], **special_tokens: str) -> Any:
    """GPT-2's byte-level BPE (300 pieces) trained on ``sentences``, end of text ``<|endoftext|>``;
    ``special_tokens``: more of them by role (``pad_token=...``)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([*sentences] * 5, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                                **special_tokens)
