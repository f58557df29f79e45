"""fxlrp.viz.text: colours as a function of relevance, escaping, whitespace, subword merging per
tokenizer convention, ANSI codes and their absence. Token lists are written by hand (no
tokenizer downloads)."""

from __future__ import annotations

import html as html_module
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fxlrp.viz import text

ROOT = Path(__file__).resolve().parents[2]

SPAN = re.compile(r'<span class="fxlrp-token" data-relevance="([^"]+)" title="[^"]*" '
                  r'style="background-color: #([0-9a-f]{6}); color: #([0-9a-f]{6});[^"]*">(.*?)</span>', re.S)


def boxes(page: str) -> list[tuple[float, tuple[int, int, int], str]]:
    """(relevance, background RGB, shown text) of each token box of an html() fragment."""
    return [(float(value), tuple(int(background[i:i + 2], 16) for i in (0, 2, 4)), html_module.unescape(shown))
            for value, background, _, shown in SPAN.findall(page)]


def shown_text(page: str) -> str:
    """The text of the token line as a browser shows it (tags removed, entities decoded)."""
    line = re.search(r'<div class="fxlrp-tokens"[^>]*>(.*?)</div>', page, re.S).group(1)
    return html_module.unescape(re.sub(r"<[^>]+>", "", line))


def test_colours_follow_relevance_symmetrically() -> None:
    tokens = ["[CLS]", "good", "movie", "bad", "plot", "[SEP]"]
    relevance = torch.tensor([0.5, 2.0, 0.0, -1.0, -2.0, 1.0])
    found = boxes(text.html(tokens, relevance))
    assert [shown for _, _, shown in found] == tokens
    assert [value for value, _, _ in found] == relevance.tolist()
    colour = {shown: background for _, background, shown in found}
    assert colour["good"] == (255, 0, 0)  # the largest positive relevance: full red
    assert colour["movie"] == (255, 255, 255)  # zero: white
    assert colour["plot"] == (0, 0, 255)  # -max|R|: full blue (the scale is symmetric)
    assert colour["bad"] == (128, 128, 255)  # -max|R| / 2: half way to blue
    assert colour["[SEP]"] == (255, 128, 128)  # +max|R| / 2
    assert colour["[CLS]"] == (255, 191, 191)  # +max|R| / 4: 255 * 3/4 = 191.25
    # the same picture for relevance scaled by any positive factor; mirrored colours for -R
    assert [background for _, background, _ in boxes(text.html(tokens, relevance * 1e-6))] == list(colour.values())
    mirrored = [background[::-1] for background in colour.values()]
    assert [background for _, background, _ in boxes(text.html(tokens, -relevance))] == mirrored


def test_colours_are_fxlrp_image_bwr_without_its_256_steps() -> None:
    image = pytest.importorskip("fxlrp.viz.image")  # needs matplotlib; fxlrp.viz.text does not
    values = np.linspace(-1.0, 1.0, 2001)
    ours = text.colours(values).astype(int)
    pictures = image.colourise(values[None], "bwr")[0].astype(int)
    assert np.abs(ours - pictures).max() <= 2  # matplotlib rounds to 256 colours, we do not
    assert (ours[[0, -1]] == pictures[[0, -1]]).all()
    assert np.abs(image.signed_values_from_bwr(ours) - values).max() <= 0.5 / 255 + 1e-12
    relevance = np.array([0.3, -1.7, 0.0, 1.2])
    assert np.array_equal(text.normalise(relevance), image.normalise_symmetric(relevance[None])[0])


def test_zero_relevance_is_white_and_text_stays_readable() -> None:
    found = boxes(text.html(["a", "b"], [0.0, 0.0]))
    assert [background for _, background, _ in found] == [(255, 255, 255)] * 2
    assert text.text_colour((0, 0, 255)) == (255, 255, 255)  # white on strong blue
    assert text.text_colour((255, 0, 0)) == (0, 0, 0)  # black on red
    assert text.text_colour((255, 255, 255)) == (0, 0, 0)


def test_html_escapes_tokens_and_title() -> None:
    page = text.html(["<script>alert(1)</script>", "&", '"'], [1.0, -1.0, 0.5], title="<b>class</b>")
    assert "<script>" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;class&lt;/b&gt;" in page
    assert [shown for _, _, shown in boxes(page)] == ["<script>alert(1)</script>", "&", '"']
    assert shown_text(page) == '<script>alert(1)</script> & "'


def test_relevance_is_kept_exactly_in_data_attributes() -> None:
    relevance = [0.1, -1e-7, 3.141592653589793, 2.5e-300, 0.0]
    assert [value for value, _, _ in boxes(text.html(list("abcde"), relevance))] == relevance


def test_whitespace_and_newlines_are_kept() -> None:
    # GPT-2 byte-level BPE: "Hello world\n\n  x" -> Hello, Ġworld, ĊĊ, Ġ, Ġx
    tokens = ["Hello", "Ġworld", "ĊĊ", "Ġ", "Ġx"]
    page = text.html(tokens, [1.0, 0.5, 0.25, 0.0, -0.5], title="t", legend=True)
    assert shown_text(page) == "Hello world↵↵\n\n· x"  # whitespace-only tokens get visible marks
    assert "white-space: pre-wrap" in page
    assert [shown for _, _, shown in boxes(page)] == ["Hello", "world", "↵↵", "·", "x"]
    # SentencePiece: "▁" is a space, "<0x0A>" a newline byte
    page = text.html(["▁one", "▁two", "<0x0A>", "▁three"], [1.0, 1.0, 1.0, 1.0])
    assert shown_text(page) == " one two↵\n three"
    # WordPiece keeps no spaces; words are separated by one
    assert shown_text(text.html(["[CLS]", "un", "##usual", "film"], [1.0, 1.0, 1.0, 1.0])) == "[CLS] unusual film"


def test_legend_and_title() -> None:
    page = text.html(["a", "b"], [2.0, -0.5], title="class 1 (logit 3.2)")
    assert 'class="fxlrp-title"' in page and "class 1 (logit 3.2)" in page
    legend = re.search(r'<div class="fxlrp-legend".*?</div>', page, re.S).group(0)
    assert "+2" in legend and "-2" in legend and "sum 1.5" in legend
    bare = text.html(["a", "b"], [2.0, -0.5], legend=False)
    assert "fxlrp-legend" not in bare and "fxlrp-title" not in bare
    document = text.html_page(page, bare, title="two <texts>")
    assert document.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in document
    assert "two &lt;texts&gt;" in document and document.count('class="fxlrp-text"') == 2


# relevance values are binary fractions: sums in any order are exact, so == compares them
MERGE_CASES = {
    "wordpiece": (
        ["[CLS]", "the", "un", "##believ", "##able", "film", "##s", ",", "good", "[SEP]"],
        [0.5, 0.25, 1.0, -0.125, 2.0, 0.0625, -0.5, 0.75, 4.0, -1.0],
        ["[CLS]", "the", "unbelievable", "films", ",", "good", "[SEP]"],
        [0.5, 0.25, 1.0 - 0.125 + 2.0, 0.0625 - 0.5, 0.75, 4.0, -1.0],
    ),
    "sentencepiece": (
        ["<s>", "▁The", "▁un", "bel", "iev", "able", "▁film", ".", "<0x0A>", "▁Good", "</s>"],
        [0.5, 0.25, 1.0, -0.125, 2.0, 0.0625, -0.5, 0.75, 4.0, -1.0, 8.0],
        ["<s>", "The", "unbelievable", "film.", "\n", "Good", "</s>"],
        [0.5, 0.25, 1.0 - 0.125 + 2.0 + 0.0625, -0.5 + 0.75, 4.0, -1.0, 8.0],
    ),
    "bytelevel": (
        ["<|endoftext|>", "The", "Ġun", "bel", "iev", "able", "Ġfilm", ".", "Ċ", "Good", "Ġcaf", "Ã©", "!"],
        [0.5, 0.25, 1.0, -0.125, 2.0, 0.0625, -0.5, 0.75, 4.0, -1.0, 8.0, 16.0, -2.0],
        ["<|endoftext|>", "The", "unbelievable", "film.", "\n", "Good", "café!"],
        [0.5, 0.25, 1.0 - 0.125 + 2.0 + 0.0625, -0.5 + 0.75, 4.0, -1.0, 8.0 + 16.0 - 2.0],
    ),
}


@pytest.mark.parametrize("convention", list(MERGE_CASES))
def test_merging_sums_relevance_per_word(convention: str) -> None:
    tokens, relevance, words, sums = MERGE_CASES[convention]
    assert text.detect_convention(tokens) == convention
    merged, merged_relevance = text.merge_words(tokens, torch.tensor(relevance, dtype=torch.float64))
    assert merged == words
    assert merged_relevance.tolist() == sums
    assert merged_relevance.sum() == sum(relevance)  # nothing lost
    page = text.html(tokens, relevance, merge_subwords=True)
    assert [value for value, _, _ in boxes(page)] == sums
    top = words[int(np.argmax(sums))]
    assert [shown for _, background, shown in boxes(page) if background == (255, 0, 0)] == [top.strip()]
    # unmerged, each token is its own box with its own relevance
    assert [value for value, _, _ in boxes(text.html(tokens, relevance))] == relevance
    plain = text.terminal(tokens, relevance, merge_subwords=True, colour=False)
    assert f"{top}(+1.00)" in plain


def test_merging_needs_the_convention_of_the_tokens() -> None:
    tokens = ["un", "##believ", "##able"]
    # read as plain tokens nothing is merged; an explicit convention overrides detection
    assert text.merge_words(tokens, [1.0, 2.0, 4.0], convention="plain")[0] == tokens
    assert text.merge_words(["a", "b"], [1.0, 2.0], convention="bytelevel")[0] == ["ab"]
    with pytest.raises(ValueError, match="unknown token convention 'bpe'"):
        text.merge_words(tokens, [1.0, 2.0, 4.0], convention="bpe")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_colours_are_ansi_24_bit_backgrounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    tokens, relevance = ["[CLS]", "good", "film", "bad", "[SEP]"], [0.0, 2.0, 0.5, -2.0, 0.0]
    coloured = text.terminal(tokens, relevance, stream=FakeTerminal())
    assert "\x1b[48;2;255;0;0m\x1b[38;2;0;0;0mgood\x1b[0m" in coloured  # strongest red, black text
    assert "\x1b[48;2;0;0;255m\x1b[38;2;255;255;255mbad\x1b[0m" in coloured  # strongest blue, white text
    assert "\x1b[48;2;255;191;191m\x1b[38;2;0;0;0mfilm\x1b[0m" in coloured  # a quarter of max |R|
    assert coloured.count("\x1b[48;2;255;255;255m") == 2  # the zeros: white
    assert coloured.count("\x1b[0m") == len(tokens)  # every box is reset
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == "[CLS] good film bad [SEP]"
    assert coloured == text.terminal(tokens, relevance, colour=True)


def test_terminal_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens, relevance = ["[CLS]", "good", "film", "bad", "[SEP]"], [0.0, 2.0, 0.5, -2.0, 0.0]
    expected = "[CLS](+0.00) good(+1.00) film(+0.25) bad(-1.00) [SEP](+0.00)"
    monkeypatch.setenv("NO_COLOR", "1")
    assert text.terminal(tokens, relevance, stream=FakeTerminal()) == expected
    assert not text.use_colour(FakeTerminal())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.delenv("TERM", raising=False)
    assert text.use_colour(FakeTerminal())
    assert text.terminal(tokens, relevance, stream=io.StringIO()) == expected  # piped: no codes
    monkeypatch.setenv("NO_COLOR", "")  # empty counts as unset (no-color.org)
    assert "\x1b[" in text.terminal(tokens, relevance, stream=FakeTerminal())


def test_bad_input_is_explained() -> None:
    with pytest.raises(ValueError, match="3 tokens but 2 relevance values"):
        text.html(["a", "b", "c"], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"got shape \(2, 3\).*relevance\[i\]"):
        text.terminal(["a", "b", "c"], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        text.html(["a"], [float("nan")])
    # a batch of one is taken as its sequence
    assert boxes(text.html(["a", "b"], torch.tensor([[1.0, -1.0]])))[0][0] == 1.0


class FakeTokenizer:
    vocabulary = ["[PAD]", "[CLS]", "[SEP]", "good", "##ish"]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.vocabulary[index] for index in ids]


def test_tokens_of_single_sequences_and_batches() -> None:
    assert text.tokens_of(FakeTokenizer(), torch.tensor([1, 3, 4, 2])) == ["[CLS]", "good", "##ish", "[SEP]"]
    assert text.tokens_of(FakeTokenizer(), torch.tensor([[1, 3, 2], [1, 4, 0]])) == [
        ["[CLS]", "good", "[SEP]"], ["[CLS]", "##ish", "[PAD]"]]
    assert text.tokens_of(FakeTokenizer(), [1, 2]) == ["[CLS]", "[SEP]"]


def test_import_needs_neither_matplotlib_nor_transformers() -> None:
    # the generation page and terminal view (fxlrp.viz.generation) need them no more than text does
    code = ("import sys, fxlrp.viz.text, fxlrp.viz.generation; "
            "print(sorted(name for name in ('matplotlib', 'transformers', 'PIL') "
            "if name in sys.modules))")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # this clone's fxlrp, from any working directory
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT,
                            env=environment, timeout=120).stdout
    assert loaded.strip() == "[]"


def test_byte_level_tokens_read_back_as_the_text() -> None:
    pre_tokenizers = pytest.importorskip("tokenizers.pre_tokenizers")
    original = "Hello wörld, café!\n\tnaïve  x 😀"
    pieces = [piece for piece, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(original)]
    assert text.detect_convention(pieces) == "bytelevel"
    words, _ = text.merge_words(pieces, np.ones(len(pieces)))
    assert "wörld," in words and "😀" in words  # multi-byte characters rebuilt from their bytes
    # the page reads as the original text; whitespace-only tokens show marks (· space, ↵ newline,
    # → tab) in their box and keep their line breaks after it
    page = text.html(pieces, np.ones(len(pieces)), merge_subwords=True)
    assert shown_text(page) == "Hello wörld, café!↵\n→naïve· x 😀"  # GPT-2 splits "\n\t" in two
