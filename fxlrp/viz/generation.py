"""Pictures of what a language model generated: for each generated token, the relevance of every
earlier token (:class:`fxlrp.explain.generation.GenerationExplanation`).

- :func:`html`, :func:`html_page`, :func:`save_html`: a page that needs no server and no network
  (its script and styles are inline). Hovering a generated token colours the tokens before it by
  their relevance for it; clicking keeps that row. ``#row=R`` in the address (or
  ``#sample=S&row=R``) selects row ``R``.
- :func:`save_png` (:func:`matrix_figure`): the matrix, rows (generated tokens) against the
  context tokens, with token labels on both axes and a colour bar.
- :func:`terminal`: per row the generated token and its strongest context tokens with their
  shares of the row's relevance.

Colours are those of :mod:`fxlrp.viz.text` (white to red for positive relevance, to blue for
negative), normalised per row: ``R / max|R|`` of the row, so each generated token's strongest
context token is full red or blue whatever the size of its logit. For encoder-decoder models the
encoder's input tokens (``source_relevance``) are shown before the decoder's and share the row's
scale. Padding tokens are not shown.

``tokens`` are the token strings of ``explanation.sequences`` as
``fxlrp.viz.text.tokens_of(tokenizer, explanation.sequences)`` gives them: a list per sequence, or
one list for one sequence (with or without its padding tokens). Only :func:`save_png` and
:func:`matrix_figure` need matplotlib.
"""

from __future__ import annotations

import html as _html
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import torch

from fxlrp.explain.generation import GenerationExplanation
from fxlrp.viz import text
from fxlrp.viz.text import _ansi, _hex, _pieces, _shown, _swatches, colours, text_colour, use_colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Tokens = Sequence[str] | Sequence[Sequence[str]]

DEFAULT_TITLE = "fxlrp: relevance of the context for each generated token"


# ---------------------------------------------------------------------------------------------
# one sequence, ready to be drawn


@dataclass(frozen=True)
class _Column:
    """One shown token: a token of the encoder's input or of the sequence (padding is dropped)."""

    position: int  # in the source or the sequence
    source: bool
    space: str  # whitespace before the box
    shown: str  # the box's text (whitespace-only tokens as marks)
    after: str  # line breaks after the box
    text: str  # what the token stands for, its leading whitespace included


@dataclass(frozen=True)
class _Drawing:
    """One sequence of an explanation: its columns (source tokens first) and, per row, the relevance
    of each column."""

    sample: int
    columns: list[_Column]
    relevance: np.ndarray  # [rows, columns] float64
    start: int  # the position of the first generated token in the sequence
    row_positions: tuple[tuple[int, ...], ...]
    scores: list[float]
    names: list[str]  # per row: its label and the generated token

    @property
    def titles(self) -> list[str]:
        """Per row: its name and the explained score."""
        return [f"{name} · score {score:.4g}" for name, score in zip(self.names, self.scores, strict=True)]

    @property
    def scales(self) -> np.ndarray:
        """``max|R|`` of each row."""
        return np.abs(self.relevance).max(axis=1, initial=0.0)

    @property
    def normalised(self) -> np.ndarray:
        """``R / max|R|`` of each row; a row of zeros stays zero."""
        scales = self.scales[:, None]
        return np.divide(self.relevance, scales, out=np.zeros_like(self.relevance), where=scales > 0)

    @property
    def not_context(self) -> np.ndarray:
        """``[rows, columns]``: True where a token of the sequence is no context of the row (at or
        after the row's last explained position, with no relevance)."""
        columns = np.array([-1 if column.source else column.position for column in self.columns])
        lasts = np.array([_last(positions) for positions in self.row_positions], dtype=np.float64)
        return (columns[None, :] >= lasts[:, None]) & (self.relevance == 0)

    @property
    def first_generated(self) -> int:
        """The index of the first column that is a generated token (``len(columns)`` if none is shown)."""
        return next((index for index, column in enumerate(self.columns)
                     if not column.source and column.position >= self.start), len(self.columns))

    @property
    def sequence_start(self) -> int:
        """The index of the first column of the sequence (after the source's)."""
        return sum(column.source for column in self.columns)


def _drawing(explanation: GenerationExplanation, tokens: Tokens, sample: int, source_tokens: Tokens | None,
             convention: str | None) -> _Drawing:
    if not isinstance(explanation, GenerationExplanation):
        raise TypeError(f"expected a GenerationExplanation (what fxlrp's generation explanation returns), "
                        f"got {type(explanation).__name__}")
    batch, length = explanation.sequences.shape
    if not isinstance(sample, int | np.integer) or not 0 <= sample < batch:
        raise ValueError(f"sample {sample!r} is out of range: the explanation holds {batch} sequence(s)")
    relevance = _finite(explanation.relevance[sample], "relevance")
    rows = relevance.shape[0]
    keep = _kept(explanation.attention_mask, sample, length)
    columns = _columns(_tokens_of_sample(tokens, sample, batch, length, len(keep), "tokens",
                                         "tokens_of(tokenizer, explanation.sequences)"), keep, False, convention)
    values = relevance[:, keep]
    if explanation.source_relevance is not None:
        if source_tokens is None:
            raise ValueError("this explanation is of an encoder-decoder model: pass source_tokens= too "
                             "(tokens_of(tokenizer, explanation.source_ids))")
        source_length = explanation.source_relevance.shape[-1]
        source_keep = _kept(explanation.source_mask, sample, source_length)
        source = _tokens_of_sample(source_tokens, sample, batch, source_length, len(source_keep), "source_tokens",
                                   "tokens_of(tokenizer, explanation.source_ids)")
        columns = _columns(source, source_keep, True, convention) + columns
        source_values = _finite(explanation.source_relevance[sample], "source_relevance")[:, source_keep]
        values = np.concatenate([source_values, values], axis=1)
    elif source_tokens is not None:
        raise ValueError("source_tokens= is for encoder-decoder models; this explanation has no source_relevance")
    scores = [float(score) for score in explanation.scores[sample].tolist()]
    if not len(explanation.labels) == len(explanation.positions) == len(scores) == rows:
        raise ValueError(f"the explanation has {rows} rows of relevance but {len(explanation.labels)} labels, "
                         f"{len(explanation.positions)} positions and {len(scores)} scores")
    texts = {column.position: column.text for column in columns if not column.source}
    names = []
    for label, positions in zip(explanation.labels, explanation.positions, strict=True):
        token = texts.get(positions[0]) if len(positions) == 1 else None
        names.append(label if token is None or repr(token) in label else f"{label}: {token!r}")
    return _Drawing(sample, columns, values, explanation.start, explanation.positions, scores, names)


def _finite(values: torch.Tensor, name: str) -> np.ndarray:
    array = values.detach().cpu().double().numpy()
    if not np.isfinite(array).all():
        raise ValueError(f"the explanation's {name} has NaN or infinite values; nothing can be coloured by it")
    return array


def _kept(mask: torch.Tensor | None, sample: int, length: int) -> np.ndarray:
    """The positions that are tokens, not padding."""
    if mask is None:
        return np.arange(length)
    return np.flatnonzero(mask[sample].detach().cpu().numpy() != 0)


def _tokens_of_sample(tokens: Tokens, sample: int, batch: int, length: int, unpadded: int, name: str,
                      how: str) -> list[str]:
    """The tokens of one sequence, with or without its padding (:func:`_columns` keeps those of
    tokens): ``tokens`` is a list per sequence or the list of the one asked for."""
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name} is a list of token strings per sequence ({how}); got {type(tokens).__name__}")
    if tokens and not isinstance(tokens[0], str):
        if len(tokens) != batch:
            raise ValueError(f"{name} has {len(tokens)} lists of tokens but the explanation holds {batch} "
                             f"sequence(s); pass {how}")
        tokens = tokens[sample]
    tokens = [str(token) for token in tokens]
    if len(tokens) == length:
        return tokens
    if len(tokens) == unpadded:  # the padding left out
        return tokens
    raise ValueError(f"{name} has {len(tokens)} tokens but sequence {sample} has {length} "
                     f"({unpadded} without padding); pass {how}")


def _columns(tokens: list[str], keep: np.ndarray, source: bool, convention: str | None) -> list[_Column]:
    if len(tokens) != len(keep):  # with padding: show only the kept positions
        tokens = [tokens[position] for position in keep.tolist()]
    pieces = _pieces(tokens, np.zeros(len(tokens)), convention, merge=False)
    columns = []
    for position, piece in zip(keep.tolist(), pieces, strict=True):
        shown, after = _shown(piece)
        columns.append(_Column(position, source, piece.space if piece.text else "", shown, after,
                               piece.space + piece.text))
    return columns


def _last(positions: tuple[int, ...]) -> float:
    """The last explained position of a row: later tokens are no context of it."""
    return max(positions) if positions else float("inf")


# ---------------------------------------------------------------------------------------------
# HTML


_SCRIPT = """(function () {
  // Colours each fxlrp-generation block by the row of the generated token under the mouse, or the
  // one clicked last; the colours of every row are computed in Python and stored in the block.
  var wanted = function (block) {
    var row = /[#&]row=(\\d+)/.exec(location.hash), sample = /[#&]sample=(\\d+)/.exec(location.hash);
    if (!row || (sample && sample[1] !== block.getAttribute("data-sample"))) return null;
    return +row[1];
  };
  var start = function (block) {
    var data = JSON.parse(block.querySelector("script.fxlrp-generation-data").textContent);
    var cells = block.querySelectorAll(".fxlrp-token[data-column]");
    var info = block.querySelector(".fxlrp-row-info");
    var pinned = data.initial;
    var show = function (index) {
      var row = data.rows[index];
      var last = row.positions.length ? Math.max.apply(null, row.positions) : Infinity;
      for (var i = 0; i < cells.length; i++) {
        var cell = cells[i], column = +cell.getAttribute("data-column");
        var position = +cell.getAttribute("data-position"), source = cell.hasAttribute("data-source");
        var value = row.relevance[column];
        cell.style.backgroundColor = "#" + row.background.substr(6 * column, 6);
        cell.style.color = row.foreground.charAt(column) === "w" ? "#ffffff" : "#000000";
        cell.style.outline = !source && row.positions.indexOf(position) >= 0 ? "2px solid #000000" : "none";
        cell.style.opacity = !source && position > last ? "0.4" : "1";
        cell.title = cell.getAttribute("data-name") + ": R = " + value.toPrecision(4) +
          (row.scale > 0 ? ", R / max|R| = " + (value / row.scale).toFixed(3) : "");
      }
      info.textContent = row.info;
      block.setAttribute("data-row", index);
    };
    var choosers = block.querySelectorAll("[data-row]");
    for (var i = 0; i < choosers.length; i++) {
      (function (chooser) {
        var index = +chooser.getAttribute("data-row");
        chooser.addEventListener("mouseenter", function () { show(index); });
        chooser.addEventListener("mouseleave", function () { show(pinned); });
        chooser.addEventListener("click", function () { pinned = index; show(index); });
        chooser.addEventListener("focus", function () { pinned = index; show(index); });
      })(choosers[i]);
    }
    var fromAddress = function () {
      var index = wanted(block);
      if (index !== null && index < data.rows.length) { pinned = index; show(index); }
    };
    window.addEventListener("hashchange", fromAddress);
    show(pinned);
    fromAddress();
  };
  var blocks = document.querySelectorAll(".fxlrp-generation:not([data-ready])");
  for (var i = 0; i < blocks.length; i++) { blocks[i].setAttribute("data-ready", ""); start(blocks[i]); }
})();"""


def html(
    explanation: GenerationExplanation,
    tokens: Tokens,
    *,
    sample: int = 0,
    source_tokens: Tokens | None = None,
    convention: str | None = None,
    title: str | None = None,
    row: int | None = None,
) -> str:
    """One sequence of a generation explanation as an HTML fragment (a ``<div>`` with its script).

    The sequence is shown as text, one box per token (padding left out), a bar ``│`` where the
    generated text starts; generated tokens are underlined. Hovering a generated token (or a row's
    name in the header, for rows that are no single token: spans, a second target of a step)
    colours every token by its relevance for that row, ``R / max|R|`` of the row on the scale of
    :func:`fxlrp.viz.text.html`; clicking keeps the row. The explained token is outlined, the
    tokens after it faded; the header above the text (it stays in view while the page scrolls)
    names the row (its label, token and explained score) and shows the scale. For encoder-decoder
    models the encoder's input is a block of its own above the decoder's tokens.

    The page works without a server or network: the script is inline, and each row's relevance
    (exact float64, JSON), scale and colours are stored in a ``<script type="application/json"
    class="fxlrp-generation-data">`` of the block. The colours of the first row shown are also
    written in the boxes' styles, for viewers that run no script.

    Parameters
    ----------
    explanation : GenerationExplanation
        What the generation explanation returned.
    tokens : list of str, or list of list of str
        The tokens of ``explanation.sequences`` (:func:`fxlrp.viz.text.tokens_of`): a list per
        sequence, or the list of sequence ``sample``.
    sample : int, default 0
        The sequence shown.
    source_tokens : list of str, or list of list of str, optional
        For encoder-decoder models: the tokens of ``explanation.source_ids``.
    convention : str, optional
        How the tokens mark words (:data:`fxlrp.viz.text.CONVENTIONS`); detected by default.
    title : str, optional
        A heading line.
    row : int, optional
        The row shown before any hover or click; the last by default.

    Returns
    -------
    str
        The fragment.

    Raises
    ------
    ValueError
        If the tokens do not fit the explanation, ``sample`` or ``row`` is out of range, or the
        relevance has NaN or infinite values.
    """
    drawing = _drawing(explanation, tokens, sample, source_tokens, convention)
    rows = len(drawing.titles)
    if rows == 0:
        raise ValueError("the explanation has no rows: nothing was explained")
    initial = rows - 1 if row is None else row
    if not 0 <= initial < rows:
        raise ValueError(f"row {row} is out of range: the explanation has {rows} rows")
    backgrounds = colours(drawing.normalised.ravel()).reshape(rows, len(drawing.columns), 3)
    foregrounds = _foregrounds(backgrounds)
    scales, sums = drawing.scales, drawing.relevance.sum(axis=1)
    data = {"initial": initial, "rows": [
        {"info": f"{drawing.titles[index]} · max|R| {scales[index]:.3g} · sum of R {sums[index]:.4g}",
         "positions": list(drawing.row_positions[index]), "scale": float(scales[index]),
         "relevance": drawing.relevance[index].tolist(),
         "background": "".join(_hex(colour)[1:] for colour in backgrounds[index].tolist()),
         "foreground": foregrounds[index]}
        for index in range(rows)]}
    # the first row of each shown generated token is chosen by hovering the token; other rows by name
    generated = {column.position for column in drawing.columns
                 if not column.source and column.position >= drawing.start}
    token_rows: dict[int, int] = {}
    for index, positions in enumerate(drawing.row_positions):
        if len(positions) == 1 and positions[0] in generated:
            token_rows.setdefault(positions[0], index)
    named = [index for index in range(rows) if index not in token_rows.values()]

    def box(column_index: int, column: _Column) -> str:
        shown_row = data["rows"][initial]
        positions, last = drawing.row_positions[initial], _last(drawing.row_positions[initial])
        explained = not column.source and column.position in positions
        after = not column.source and column.position > last
        attributes = f"class=\"fxlrp-token\" data-column=\"{column_index}\" data-position=\"{column.position}\""
        attributes += " data-source=\"\"" if column.source else ""
        style = (f"background-color: #{shown_row['background'][6 * column_index: 6 * column_index + 6]}; "
                 f"color: {'#ffffff' if shown_row['foreground'][column_index] == 'w' else '#000000'}; "
                 f"outline: {'2px solid #000000' if explained else 'none'}; opacity: {0.4 if after else 1}; "
                 f"padding: 0.1em 0.15em; border-radius: 0.2em")
        generated = not column.source and column.position >= drawing.start
        if generated:
            style += "; border-bottom: 2px solid #777777"
        if generated and column.position in token_rows:
            attributes += f" data-row=\"{token_rows[column.position]}\" tabindex=\"0\""
            style += "; cursor: pointer"
        name = f"{column.text!r} at {'source ' if column.source else ''}position {column.position}"
        value = drawing.relevance[initial, column_index]
        return (f"{_html.escape(column.space)}<span {attributes} data-name=\"{_html.escape(name)}\" "
                f"title=\"{_html.escape(name)}: R = {value:.4g}\" style=\"{style}\">{_html.escape(column.shown)}"
                f"</span>{column.after}")

    def line(indices: range) -> str:
        parts = []
        for index in indices:
            if index == drawing.first_generated:
                parts.append("<span class=\"fxlrp-boundary\" title=\"the generated text starts here\" "
                             "style=\"color: #555555; font-weight: bold; padding: 0 0.15em\">│</span>")
            parts.append(box(index, drawing.columns[index]))
        return ("<div class=\"fxlrp-tokens\" style=\"white-space: pre-wrap; line-height: 2.1\">"
                + "".join(parts) + "</div>")

    caption = "font-size: smaller; color: #555555; margin-top: 0.5em"
    parts = [f"<div class=\"fxlrp-generation\" data-sample=\"{sample}\" style=\"margin: 0.8em 0\">"]
    if title is not None:
        parts.append(f"<div class=\"fxlrp-title\" style=\"font-weight: bold\">{_html.escape(title)}</div>")
    # the row's name and the scale stay in view while the text scrolls under them
    header = [f"<div class=\"fxlrp-row-info\" style=\"font-family: monospace\">"
              f"{_html.escape(data['rows'][initial]['info'])}</div>",
              f"<div class=\"fxlrp-legend\" style=\"font-size: smaller; color: #555555\">"
              f"{_swatches(['-max|R|', '', '0', '', '+max|R|'])} relevance for the row (red: for, blue: against); "
              f"hover or click an underlined (generated) token; │ marks where the generated text starts</div>"]
    if named:
        chips = " ".join(f"<span class=\"fxlrp-row-name\" data-row=\"{index}\" tabindex=\"0\" style=\"cursor: "
                         f"pointer; border: 1px solid #999999; border-radius: 0.3em; padding: 0 0.3em\">"
                         f"{_html.escape(explanation.labels[index])}</span>" for index in named)
        header.append(f"<div class=\"fxlrp-rows\" style=\"font-size: smaller\">more rows: {chips}</div>")
    parts.append("<div class=\"fxlrp-header\" style=\"position: sticky; top: 0; background-color: #ffffff; "
                 "padding: 0.3em 0; border-bottom: 1px solid #dddddd; z-index: 1\">" + "".join(header) + "</div>")
    if drawing.sequence_start > 0:
        parts.append(f"<div style=\"{caption}\">encoder input</div>" + line(range(drawing.sequence_start)))
        parts.append(f"<div style=\"{caption}\">decoder</div>")
    parts.append(line(range(drawing.sequence_start, len(drawing.columns))))
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    parts.append(f"<script type=\"application/json\" class=\"fxlrp-generation-data\">{payload}</script>")
    parts.append(f"<script>\n{_SCRIPT}\n</script>")
    parts.append("</div>")
    return "\n".join(parts)


def _foregrounds(backgrounds: np.ndarray) -> list[str]:
    """Per row a string of ``"b"`` (black) or ``"w"`` (white), the text colour of each box."""
    known: dict[tuple[int, ...], str] = {}
    rows = []
    for row in backgrounds.tolist():
        letters = []
        for colour in row:
            key = tuple(colour)
            if key not in known:
                known[key] = "b" if text_colour(colour) == (0, 0, 0) else "w"
            letters.append(known[key])
        rows.append("".join(letters))
    return rows


def html_page(
    explanation: GenerationExplanation,
    tokens: Tokens,
    *,
    source_tokens: Tokens | None = None,
    convention: str | None = None,
    title: str = DEFAULT_TITLE,
) -> str:
    """A complete HTML document with :func:`html` of every sequence of the explanation.

    Parameters
    ----------
    explanation : GenerationExplanation
        What the generation explanation returned.
    tokens : list of list of str, or list of str
        The tokens of ``explanation.sequences``, a list per sequence (one list for a single
        sequence).
    source_tokens : list of list of str, optional
        For encoder-decoder models: the tokens of ``explanation.source_ids``.
    convention : str, optional
        How the tokens mark words; detected by default.
    title : str
        The page's title and heading.

    Returns
    -------
    str
        The document.
    """
    batch = len(explanation)
    fragments = [html(explanation, tokens, sample=sample, source_tokens=source_tokens, convention=convention,
                      title=f"sequence {sample}" if batch > 1 else None)
                 for sample in range(batch)]
    return text.html_page(*fragments, title=title)


def save_html(path: str | Path, explanation: GenerationExplanation, tokens: Tokens, **options: Any) -> Path:
    """Write :func:`html_page` to ``path`` (folders are made).

    Parameters
    ----------
    path : str or Path
        The file.
    explanation, tokens
        As for :func:`html_page`.
    **options
        ``source_tokens``, ``convention``, ``title``: as for :func:`html_page`.

    Returns
    -------
    Path
        The path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_page(explanation, tokens, **options), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# matrix picture


NOT_CONTEXT = (204, 204, 204)
"""The colour of the matrix cells of tokens that are no context of a row: the explained token and
those after it (their relevance is zero by construction); grey is on no red-blue scale."""

_LABEL_POINTS = 7.0  # font size of the token labels
_LABEL_CHARACTERS = 14


def matrix_figure(
    explanation: GenerationExplanation,
    tokens: Tokens,
    *,
    sample: int = 0,
    source_tokens: Tokens | None = None,
    convention: str | None = None,
    title: str | None = None,
    dpi: int = 100,
) -> Figure:
    """The relevance matrix of one sequence as a matplotlib figure (what :func:`save_png` saves).

    Rows are the explained rows (generated tokens, spans, ...), columns the tokens of the sequence
    (for encoder-decoder models the encoder's input first, a solid line after it), padding left
    out; a dashed line marks where the generated text starts. Each cell has the colour of
    :func:`fxlrp.viz.text.colours` of ``R / max|R|`` of its row; cells of tokens that are no
    context of the row (the explained token and those after it) are grey (:data:`NOT_CONTEXT`).
    Labels are the tokens (whitespace shown as marks); when there are more columns (rows) than
    fit, every ``k``-th is labelled, with its position. With more columns than the picture has
    pixels across, neighbouring cells are blended rather than some left out.

    Parameters
    ----------
    explanation : GenerationExplanation
        What the generation explanation returned.
    tokens : list of str, or list of list of str
        The tokens of ``explanation.sequences``.
    sample : int, default 0
        The sequence drawn.
    source_tokens : list of str, or list of list of str, optional
        For encoder-decoder models: the tokens of ``explanation.source_ids``.
    convention : str, optional
        How the tokens mark words; detected by default.
    title : str, optional
        The figure's title; by default it says what is shown.
    dpi : int, default 100
        Pixels per inch.

    Returns
    -------
    Figure
        The figure, laid out (no pyplot state is touched).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    from fxlrp.viz.image import colour_map

    drawing = _drawing(explanation, tokens, sample, source_tokens, convention)
    rows, count = drawing.relevance.shape
    if rows == 0 or count == 0:
        raise ValueError("the explanation has no rows or no tokens to draw")
    width = float(np.clip(3.2 + 0.16 * count, 6.0, 26.0))
    height = float(np.clip(2.6 + 0.2 * rows, 3.5, 18.0))
    figure = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    pixels = colours(drawing.normalised.ravel()).reshape(rows, count, 3)
    pixels[drawing.not_context] = NOT_CONTEXT
    # one cell, one colour while cells are at least a pixel wide; narrower ones are averaged
    sharp = count <= (width - 3.0) * dpi and rows <= (height - 2.4) * dpi
    axes.imshow(pixels, interpolation="nearest" if sharp else "antialiased", aspect="auto")
    slot = _LABEL_POINTS * 1.35 / 72  # inches per label
    column_step = max(1, int(np.ceil(count / max(1, int((width - 3.0) / slot)))))
    row_step = max(1, int(np.ceil(rows / max(1, int((height - 2.4) / slot)))))
    columns = list(range(0, count, column_step))
    axes.set_xticks(columns, [_label(drawing.columns[index], column_step > 1) for index in columns],
                    rotation=90, fontsize=_LABEL_POINTS)
    shown_rows = list(range(0, rows, row_step))
    axes.set_yticks(shown_rows, [_short(drawing.names[index], 2 * _LABEL_CHARACTERS)
                                 for index in shown_rows], fontsize=_LABEL_POINTS)
    axes.tick_params(length=2, pad=1)
    if 0 < drawing.sequence_start < count:
        axes.axvline(drawing.sequence_start - 0.5, color="#000000", linewidth=1.2)
    if drawing.sequence_start < drawing.first_generated < count:
        axes.axvline(drawing.first_generated - 0.5, color="#444444", linewidth=1.0, linestyle="--")
    context = "encoder input | decoder tokens" if drawing.sequence_start else "prompt ¦ generated tokens"
    axes.set_xlabel(f"context: {context} (grey: the explained token and those after it)", fontsize=8)
    axes.set_ylabel("explained row (generated token)", fontsize=8)
    if title is None:
        title = "relevance of each earlier token for each generated token"
        title += f" (sequence {sample})" if len(explanation) > 1 else ""
    axes.set_title(title, fontsize=10)
    bar = figure.colorbar(ScalarMappable(Normalize(-1.0, 1.0), colour_map("bwr")), ax=axes,
                          fraction=min(0.05, 0.6 / width), pad=0.01)
    bar.set_label("R / max|R| of the row (red: for, blue: against)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing")  # emoji, CJK: boxes are fine
        figure.tight_layout()
    return figure


def save_png(path: str | Path, explanation: GenerationExplanation, tokens: Tokens, *, dpi: int = 100,
             **options: Any) -> Path:
    """Save :func:`matrix_figure` of one sequence as a PNG file (folders are made).

    Parameters
    ----------
    path : str or Path
        The file.
    explanation, tokens, dpi
        As for :func:`matrix_figure`.
    **options
        ``sample``, ``source_tokens``, ``convention``, ``title``: as for :func:`matrix_figure`.

    Returns
    -------
    Path
        The path.
    """
    figure = matrix_figure(explanation, tokens, dpi=dpi, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing")
        figure.savefig(path, dpi=dpi, format="png")
    return path


def _short(label: str, limit: int = _LABEL_CHARACTERS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _label(column: _Column, numbered: bool) -> str:
    where = f"{'src ' if column.source else ''}{column.position} " if numbered else ""
    return where + _short(column.shown.replace("\n", "↵"))


# ---------------------------------------------------------------------------------------------
# terminal


def terminal(
    explanation: GenerationExplanation,
    tokens: Tokens,
    *,
    sample: int = 0,
    top: int = 5,
    source_tokens: Tokens | None = None,
    convention: str | None = None,
    colour: bool | None = None,
    stream: TextIO | None = None,
) -> str:
    """Per row, the generated token and its ``top`` context tokens of largest ``|R|``.

    One line per row: its label, the generated token, the explained score, then the context
    tokens in order of ``|R|`` (the earlier first among equal ones), each as ``'text'@position``
    (``@s`` for the encoder's input) with its share of the row's relevance ``R / sum|R|``. Tokens
    with no relevance are not listed. With colour, each context token is on the background of
    :func:`html` (``R / max|R|`` of the row). Lines are not cut to the terminal's width.

    Parameters
    ----------
    explanation : GenerationExplanation
        What the generation explanation returned.
    tokens : list of str, or list of list of str
        The tokens of ``explanation.sequences``.
    sample : int, default 0
        The sequence shown.
    top : int, default 5
        How many context tokens each row lists.
    source_tokens : list of str, or list of list of str, optional
        For encoder-decoder models: the tokens of ``explanation.source_ids``.
    convention : str, optional
        How the tokens mark words; detected by default.
    colour : bool, optional
        Whether to colour; None decides by :func:`fxlrp.viz.text.use_colour` for ``stream``
        (colour in a terminal, none when piped or with ``NO_COLOR`` set).
    stream : TextIO, optional
        The stream the text is for; ``sys.stdout`` by default.

    Returns
    -------
    str
        The text, one line per row after a heading line.
    """
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top is how many context tokens to list per row, at least 1; got {top!r}")
    colour = use_colour(stream) if colour is None else colour
    drawing = _drawing(explanation, tokens, sample, source_tokens, convention)
    magnitude = np.abs(drawing.relevance)
    totals = magnitude.sum(axis=1)
    backgrounds = colours(drawing.normalised.ravel()).reshape(*drawing.relevance.shape, 3).tolist()
    lines = [f"sequence {sample}: for each row the {top} context tokens of largest |R|, "
             f"with R / sum|R| of the row"]
    for index, title in enumerate(drawing.titles):
        strongest = [column for column in np.argsort(-magnitude[index], kind="stable")[:top].tolist()
                     if magnitude[index, column] > 0]
        items = []
        for column in strongest:
            token = drawing.columns[column]
            name = repr(token.text)
            if colour:
                name = _ansi(name, backgrounds[index][column])
            where = f"s{token.position}" if token.source else str(token.position)
            items.append(f"{name}@{where} {drawing.relevance[index, column] / totals[index]:+.1%}")
        lines.append(f"{title}: " + ("  ".join(items) if items else "no relevance"))
    return "\n".join(lines)
