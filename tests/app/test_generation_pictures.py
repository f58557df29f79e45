"""fxlrp.viz.generation: the HTML page, the matrix PNG and the terminal view of a generation
explanation, each read back and compared with the relevance matrix it was made of. The
explanations are written by hand (a known matrix), so these tests need no model; the page's script
is run in a real headless Chromium where one is installed."""

from __future__ import annotations

import ast
import html as html_module
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fxlrp.explain.generation import GenerationExplanation
from fxlrp.viz import generation, text

TOKENS = [
    ["<|pad|>", "<|pad|>", "The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", ".", "Ċ"],
    ["Once", "Ġupon", "Ġa", "Ġtime", ",", "Ġthere", "Ġwas", "Ġa", "Ġcat", "!"],
]
START = 6
POSITIONS = ((6,), (7,), (8,), (9,), (7, 8), (6,))
LABELS = ("step 0", "step 1", "step 2", "step 3", "steps 1-2", "' the' - ' a'")
PADDING = 2  # sequence 0 is left-padded by two tokens


def explained(seed: int = 0, encoder_decoder: bool = False) -> GenerationExplanation:
    """A generation explanation of two sequences (the first left-padded) with random relevance that
    is zero at padding and from each row's last explained position on, as the API gives it."""
    generator = np.random.default_rng(seed)
    batch, length, rows = 2, len(TOKENS[0]), len(POSITIONS)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :PADDING] = 0
    relevance = generator.normal(size=(batch, rows, length))
    for row, positions in enumerate(POSITIONS):
        relevance[:, row, max(positions):] = 0.0
    relevance[0, :, :PADDING] = 0.0
    relevance[1, 3, [0, 4]] = [50.0, -50.0]  # equal |R| at the top of a row: the earlier is listed first
    sequences = torch.arange(batch * length).reshape(batch, length) + 100
    targets = torch.tensor([[int(sequences[b, p[0]]) if len(p) == 1 else -1 for p in POSITIONS] for b in range(2)])
    source = {}
    if encoder_decoder:
        source_mask = torch.ones(batch, 5, dtype=torch.long)
        source_mask[1, :1] = 0
        source_relevance = generator.normal(size=(batch, rows, 5)) * 3.0
        source_relevance[1, :, :1] = 0.0
        source = {"source_relevance": torch.from_numpy(source_relevance), "source_ids": torch.zeros(batch, 5),
                  "source_mask": source_mask}
    return GenerationExplanation(
        relevance=torch.from_numpy(relevance), sequences=sequences, start=START, positions=POSITIONS,
        targets=targets, scores=torch.from_numpy(generator.normal(size=(batch, rows))), attention_mask=mask,
        labels=LABELS, **source)


SOURCE_TOKENS = [["▁Trans", "late", "▁this", "</s>", "<pad>"], ["<pad>", "▁Sag", "▁es", "!", "</s>"]]


def kept(sample: int) -> list[int]:
    return list(range(PADDING if sample == 0 else 0, len(TOKENS[0])))


def expected_rows(explanation: GenerationExplanation, sample: int) -> np.ndarray:
    """``[rows, columns]``: the relevance of the shown tokens (source first), padding left out."""
    matrix = explanation.relevance[sample].double().numpy()[:, kept(sample)]
    if explanation.source_relevance is not None:
        source = [position for position in range(5) if int(explanation.source_mask[sample, position])]
        matrix = np.concatenate([explanation.source_relevance[sample].double().numpy()[:, source], matrix], axis=1)
    return matrix


def per_row(matrix: np.ndarray) -> np.ndarray:
    """``R / max|R|`` of each row, written out independently of the module."""
    return np.stack([row / np.abs(row).max() for row in matrix])


def blocks(page: str) -> list[dict]:
    return [json.loads(payload) for payload in
            re.findall(r'<script type="application/json" class="fxlrp-generation-data">(.*?)</script>', page, re.S)]


def hex_colours(packed: str) -> np.ndarray:
    return np.array([[int(packed[i + j: i + j + 2], 16) for j in (0, 2, 4)] for i in range(0, len(packed), 6)])


# ---------------------------------------------------------------------------------------------
# HTML, read as text


def test_html_stores_each_rows_relevance_and_colours() -> None:
    image = pytest.importorskip("fxlrp.viz.image")
    explanation = explained()
    page = generation.html_page(explanation, TOKENS)
    data = blocks(page)
    assert len(data) == 2
    for sample, block in enumerate(data):
        matrix = expected_rows(explanation, sample)
        assert len(block["rows"]) == len(POSITIONS)
        for index, row in enumerate(block["rows"]):
            stored = np.array(row["relevance"])
            assert np.array_equal(stored, matrix[index])  # exact float64, padding left out
            assert row["scale"] == np.abs(matrix[index]).max()
            assert np.array_equal(stored / row["scale"], per_row(matrix)[index])
            backgrounds = hex_colours(row["background"])
            # the colours are fxlrp.text's, normalised per row: read back within half a colour step
            assert np.abs(image.signed_values_from_bwr(backgrounds) - per_row(matrix)[index]).max() <= 0.5 / 255 + 1e-12
            assert np.array_equal(backgrounds, text.colours(per_row(matrix)[index]))
            assert row["positions"] == list(POSITIONS[index])
            assert row["info"].startswith(LABELS[index])


def test_html_shows_tokens_without_padding_and_marks_the_generated_ones() -> None:
    explanation = explained()
    fragment = generation.html(explanation, TOKENS, sample=0)
    spans = re.findall(r'<span class="fxlrp-token" data-column="(\d+)" data-position="(\d+)"([^>]*)>(.*?)</span>',
                       fragment)
    assert [int(position) for _, position, _, _ in spans] == kept(0)  # no padding token
    assert [int(column) for column, _, _, _ in spans] == list(range(len(kept(0))))
    assert [html_module.unescape(shown) for *_, shown in spans] == ["The", "cat", "sat", "on", "the", "mat", ".", "↵"]
    # the boundary sits right before the first generated token (position 6)
    assert re.search(r'class="fxlrp-boundary"[^>]*>│</span> <span class="fxlrp-token" data-column="4" '
                     r'data-position="6"', fragment)
    rows = {int(position): re.search(r'data-row="(\d+)"', attributes) for _, position, attributes, _ in spans}
    # each generated token chooses the first row that explains it alone; the prompt chooses none
    assert {position: int(found.group(1)) for position, found in rows.items() if found} == {6: 0, 7: 1, 8: 2, 9: 3}
    # the rows that are no single token get a name to hover: the span, the second row of step 0
    assert re.findall(r'class="fxlrp-row-name" data-row="(\d+)"', fragment) == ["4", "5"]
    # before any script runs, the boxes show the last row (the contrast at step 0)
    static = [tuple(int(c[i:i + 2], 16) for i in (0, 2, 4))
              for c in re.findall(r'data-name="[^"]*" title="[^"]*" style="background-color: #([0-9a-f]{6})', fragment)]
    assert np.array_equal(np.array(static), text.colours(per_row(expected_rows(explanation, 0))[5]))


def test_html_escapes_tokens_and_labels() -> None:
    explanation = explained()
    hostile = [list(tokens) for tokens in TOKENS]
    hostile[1][2] = "</script><script>alert(1)</script>"
    labelled = GenerationExplanation(**{**explanation.__dict__, "labels": ("<b>step</b> 0", *LABELS[1:])})
    page = generation.html_page(labelled, hostile)
    assert "<script>alert(1)" not in page and "<b>step" not in page
    assert page.count("<script") == 4  # per sequence: its data and its script
    assert blocks(page)[1]["rows"][0]["info"].startswith("<b>step</b> 0")  # JSON keeps the text as it is


def test_html_of_an_encoder_decoder_colours_the_source_on_the_rows_scale() -> None:
    explanation = explained(encoder_decoder=True)
    fragment = generation.html(explanation, TOKENS, sample=1, source_tokens=SOURCE_TOKENS)
    matrix = expected_rows(explanation, 1)  # source columns first: one scale for source and decoder
    row = blocks(fragment)[0]["rows"][2]
    assert np.array_equal(np.array(row["relevance"]), matrix[2])
    assert np.array_equal(hex_colours(row["background"]), text.colours(per_row(matrix)[2]))
    source = re.findall(r'data-column="(\d+)" data-position="(\d+)" data-source=""[^>]*>(.*?)</span>', fragment)
    assert [(int(c), int(p), s) for c, p, s in source] == [
        (0, 1, "Sag"), (1, 2, "es"), (2, 3, "!"), (3, 4, "&lt;/s&gt;")]
    assert "encoder input" in fragment
    with pytest.raises(ValueError, match="encoder-decoder model: pass source_tokens="):
        generation.html(explanation, TOKENS)


def test_tokens_may_leave_the_padding_out_and_bad_input_is_explained() -> None:
    explanation = explained()
    assert generation.html(explanation, TOKENS[0][PADDING:], sample=0) == generation.html(explanation, TOKENS[0])
    with pytest.raises(ValueError, match="tokens has 7 tokens but sequence 1 has 10"):
        generation.html(explanation, TOKENS[1][:7], sample=1)
    with pytest.raises(ValueError, match="tokens has 1 lists of tokens but the explanation holds 2"):
        generation.html_page(explanation, TOKENS[:1])
    with pytest.raises(ValueError, match="sample 2 is out of range: the explanation holds 2"):
        generation.terminal(explanation, TOKENS, sample=2)
    with pytest.raises(ValueError, match="row 6 is out of range"):
        generation.html(explanation, TOKENS, row=6)
    with pytest.raises(ValueError, match="source_tokens= is for encoder-decoder models"):
        generation.html(explanation, TOKENS, source_tokens=SOURCE_TOKENS)
    broken = explanation.relevance.clone()
    broken[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="relevance has NaN or infinite values"):
        generation.html(GenerationExplanation(**{**explanation.__dict__, "relevance": broken}), TOKENS, sample=1)


# ---------------------------------------------------------------------------------------------
# PNG


def test_png_cells_have_the_rows_colours(tmp_path: Path) -> None:
    image = pytest.importorskip("fxlrp.viz.image")
    explanation = explained(encoder_decoder=True)
    matrix = expected_rows(explanation, 1)
    arguments = {"sample": 1, "source_tokens": SOURCE_TOKENS}
    path = generation.save_png(tmp_path / "matrix.png", explanation, TOKENS, **arguments)
    figure = generation.matrix_figure(explanation, TOKENS, **arguments)  # the same layout as in the file
    picture = image.read_png(path)
    assert picture.shape[:2] == (round(figure.get_figheight() * figure.dpi), round(figure.get_figwidth() * figure.dpi))
    axes = figure.axes[0]
    found = np.zeros((*matrix.shape, 3), dtype=np.uint8)
    for row in range(matrix.shape[0]):
        for column in range(matrix.shape[1]):
            x, y = axes.transData.transform((column, row))
            found[row, column] = picture[int(picture.shape[0] - y), int(x)]
    # grey where a token is no context of the row: the decoder's tokens from the row's last position on
    grey = np.array([[False] * 4 + [position >= max(positions) for position in kept(1)] for positions in POSITIONS])
    assert np.array_equal(found[grey], np.full((grey.sum(), 3), 204))
    assert np.array_equal(found[~grey], text.colours(per_row(matrix)[~grey]))
    assert np.abs(image.signed_values_from_bwr(found[~grey]) - per_row(matrix)[~grey]).max() <= 0.5 / 255 + 1e-12
    labels = [label.get_text() for label in axes.get_xticklabels()]
    assert labels == ["Sag", "es", "!", "</s>", "Once", "upon", "a", "time", ",", "there", "was", "a", "cat", "!"]
    assert [label.get_text() for label in axes.get_yticklabels()] == [
        "step 0: ' was'", "step 1: ' a'", "step 2: ' cat'", "step 3: '!'", "steps 1-2", "' the' - ' a': ' was'"]



def test_png_labels_of_a_long_generation_do_not_overlap() -> None:
    pytest.importorskip("matplotlib")
    generated, context = 64, 512
    length = context + generated
    generator = np.random.default_rng(1)
    relevance = np.tril(generator.normal(size=(generated, length)), k=context - 1)[None]
    words = ["Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġa", "Ġvery", "Ġlong", "Ġmat", ",", "Ċ", "Ġand", "Ġthen"]
    tokens = [words[index % len(words)] for index in range(length)]
    explanation = GenerationExplanation(
        relevance=torch.from_numpy(relevance), sequences=torch.zeros(1, length, dtype=torch.long), start=context,
        positions=tuple((context + row,) for row in range(generated)), targets=torch.zeros(1, generated),
        scores=torch.zeros(1, generated), attention_mask=None,
        labels=tuple(f"step {row}" for row in range(generated)))
    figure = generation.matrix_figure(explanation, tokens)
    renderer = figure.canvas.get_renderer()
    axes = figure.axes[0]
    for labels, low, high in ((axes.get_xticklabels(), "x0", "x1"), (axes.get_yticklabels(), "y0", "y1")):
        boxes = sorted((label.get_window_extent(renderer) for label in labels), key=lambda box: getattr(box, low))
        assert len(boxes) >= 24  # enough labels to find one's way
        assert all(getattr(first, high) <= getattr(second, low)
                   for first, second in zip(boxes, boxes[1:], strict=False))
    # thinned labels say which position they are
    assert axes.get_xticklabels()[1].get_text().split(" ")[0] == str(int(axes.get_xticks()[1]))
    everything = figure.get_tightbbox(renderer)  # in inches
    assert everything.x0 >= -0.01 and everything.y0 >= -0.01  # nothing cut off at the figure's edge
    assert everything.x1 <= figure.get_figwidth() + 0.01 and everything.y1 <= figure.get_figheight() + 0.01
    assert figure.get_figwidth() * figure.dpi <= 2600 and figure.get_figheight() * figure.dpi <= 1800


# ---------------------------------------------------------------------------------------------
# terminal


ITEM = re.compile(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")@(s?)(\d+) ([+-]\d+\.\d)%")


def test_terminal_lists_the_strongest_context_tokens_of_each_row() -> None:
    explanation = explained(encoder_decoder=True)
    for sample in range(2):
        output = generation.terminal(explanation, TOKENS, sample=sample, top=4, source_tokens=SOURCE_TOKENS,
                                     colour=False)
        lines = output.splitlines()[1:]
        assert len(lines) == len(POSITIONS)
        matrix = expected_rows(explanation, sample)
        source = [p for p in range(5) if int(explanation.source_mask[sample, p])]
        columns = [("s", p) for p in source] + [("", p) for p in kept(sample)]
        for index, line in enumerate(lines):
            assert line.startswith(LABELS[index])
            strongest = np.argsort(-np.abs(matrix[index]), kind="stable")[:4]  # equal |R|: the earlier first
            items = ITEM.findall(line)
            assert [(where, int(position)) for _, where, position, _ in items] == [columns[c] for c in strongest]
            shares = matrix[index, strongest] / np.abs(matrix[index]).sum()
            assert [float(share) for *_, share in items] == [round(100 * share, 1) for share in shares.tolist()]
            shown = [SOURCE_TOKENS[sample][p] if where else TOKENS[sample][p] for where, p in
                     (columns[c] for c in strongest)]
            assert [ast.literal_eval(quoted) for quoted, *_ in items] == [_decoded(token) for token in shown]
    tied = generation.terminal(explanation, TOKENS, sample=1, top=2, source_tokens=SOURCE_TOKENS, colour=False)
    assert re.search(r"step 3: '!' · score \S+: 'Once'@0 \+\d+\.\d%  ','@4 -\d+\.\d%", tied)


def _decoded(token: str) -> str:
    """What a token of the lists above stands for (byte-level Ġ and sentencepiece ▁: a space)."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_colours_only_where_colour_is_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    explanation = explained()
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    coloured = generation.terminal(explanation, TOKENS, sample=1, top=3, stream=FakeTerminal())
    plain = generation.terminal(explanation, TOKENS, sample=1, top=3, stream=io.StringIO())  # piped
    assert "\x1b[" not in plain
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain
    matrix = per_row(expected_rows(explanation, 1))
    strongest = int(np.argmax(np.abs(matrix[2])))  # full red or blue: R / max|R| of its row is +-1
    red, green, blue = text.colours(matrix[2, [strongest]])[0].tolist()
    assert (red, green, blue) in ((255, 0, 0), (0, 0, 255))
    assert f"\x1b[48;2;{red};{green};{blue}m" in coloured.splitlines()[3]
    monkeypatch.setenv("NO_COLOR", "1")
    assert generation.terminal(explanation, TOKENS, sample=1, top=3, stream=FakeTerminal()) == plain


# ---------------------------------------------------------------------------------------------
# the page in a real browser


def chromium() -> str:
    """The system's Chromium (``apt-get install -y chromium``); the test is skipped without it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium installed (apt-get install -y chromium): the page's script is not run in a browser")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def css_colours(matrix_row: np.ndarray) -> list[str]:
    """The backgrounds a browser reports for the tokens of a row, as ``rgb(r, g, b)``."""
    return [f"rgb({red}, {green}, {blue})" for red, green, blue in text.colours(matrix_row).tolist()]


def test_page_selects_the_row_named_in_its_address_in_chromium(tmp_path: Path) -> None:
    executable = chromium()
    explanation = explained()
    path = generation.save_html(tmp_path / "a page" / "generation.html", explanation, TOKENS)
    run = subprocess.run([executable, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          path.as_uri() + "#sample=1&row=2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    rows = re.findall(r'class="fxlrp-generation" data-sample="(\d)"[^>]*data-row="(\d+)"', dom)
    assert rows == [("0", "5"), ("1", "2")]  # sequence 0 keeps its first row shown (the last), 1 shows row 2
    parts = dom.split('class="fxlrp-generation" data-sample="1"')
    for sample, (part, row) in enumerate(zip(parts, (5, 2), strict=True)):
        found = re.findall(r'data-column="\d+"[^>]*style="background-color: ([^;]*);', part)
        assert [css_rgb(colour) for colour in found] == css_colours(per_row(expected_rows(explanation, sample))[row])


def css_rgb(colour: str) -> str:
    """A CSS colour as a browser may write it in a style (``#rrggbb`` or ``rgb(r, g, b)``), as ``rgb(r, g, b)``."""
    if colour.startswith("#"):
        return "rgb({}, {}, {})".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5)))
    return colour


@pytest.mark.slow  # 3-6 s: playwright starts its driver and the browser
def test_hovering_and_clicking_generated_tokens_in_chromium(tmp_path: Path) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    explanation = explained(encoder_decoder=True)
    path = generation.save_html(tmp_path / "generation.html", explanation, TOKENS, source_tokens=SOURCE_TOKENS)
    expected = [per_row(expected_rows(explanation, sample)) for sample in range(2)]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS[1:], headless=True)
        try:
            page = browser.new_page()
            page.goto(path.as_uri())
            block = page.locator(".fxlrp-generation").nth(1)

            def shown() -> list[str]:
                return block.locator(".fxlrp-token[data-column]").evaluate_all(
                    "cells => cells.map(cell => getComputedStyle(cell).backgroundColor)")

            assert shown() == css_colours(expected[1][5])  # the last row before anything is touched
            block.locator('.fxlrp-token[data-position="7"]').hover()
            assert shown() == css_colours(expected[1][1])  # step 1's row, source tokens included
            assert block.locator(".fxlrp-row-info").inner_text().startswith("step 1: ' a' · score")
            page.mouse.move(0, 0)
            assert shown() == css_colours(expected[1][5])  # back to the kept row
            block.locator('.fxlrp-token[data-position="8"]').click()
            page.mouse.move(0, 0)
            assert shown() == css_colours(expected[1][2])  # clicked: kept
            block.locator('.fxlrp-row-name[data-row="4"]').hover()  # the span's name
            assert shown() == css_colours(expected[1][4])
            first = page.locator(".fxlrp-generation").nth(0).locator(".fxlrp-token[data-column]")
            assert first.evaluate_all("cells => cells.map(cell => getComputedStyle(cell).backgroundColor)") == \
                css_colours(expected[0][5])  # the other sequence did not move
        finally:
            browser.close()
