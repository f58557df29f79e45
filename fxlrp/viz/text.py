"""Relevance of tokens as text people can read: HTML with coloured backgrounds, ANSI colours in
a terminal, and the merging of subword tokens into words.

``fxlrp.attribute(explain, input_ids)`` gives one relevance per token; with the tokens
(:func:`tokens_of`) :func:`html` and :func:`terminal` show it::

    relevance = fxlrp.attribute(explain, ids)                      # [1, length]
    tokens = text.tokens_of(tokenizer, ids[0])
    print(text.terminal(tokens, relevance[0], merge_subwords=True))
    text.save_html("explanation.html", text.html(tokens, relevance[0], title="class 1"))

Colours are those of :mod:`fxlrp.viz.image`'s default ``bwr`` map (blue, white, red) on the same
symmetric scale ``R / max|R|``: red for, blue against, white for zero, full red or blue at the
token with the largest ``|R|``. Unlike the picture colours they are not rounded to matplotlib's
256 steps, so zero is exactly white; ``fxlrp.viz.image.signed_values_from_bwr`` reads the normalised
relevance back from them. This module needs neither matplotlib nor transformers, and
``import fxlrp`` does not import it.

Tokens are strings as ``tokenizer.convert_ids_to_tokens`` gives them. Three ways of marking
words are understood (``convention``; by default detected from the tokens):

- ``"wordpiece"`` (BERT): ``"##ing"`` continues the previous word;
- ``"sentencepiece"`` (T5, Llama 2, ...): ``"▁the"`` starts a word, ``"<0x0A>"`` is a byte;
- ``"bytelevel"`` (GPT-2, RoBERTa, Llama 3, ...): ``"Ġthe"`` starts a word, ``"Ċ"`` is a newline
  (the tokens are bytes written as characters);
- ``"plain"``: every token is a word.

Special tokens (``[CLS]``, ``<s>``, ``<|endoftext|>``: a name in brackets) are words of their own.
"""

from __future__ import annotations

import html as _html
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

CONVENTIONS = ("wordpiece", "sentencepiece", "bytelevel", "plain")
"""The ways of marking words that :func:`merge_words`, :func:`html` and :func:`terminal` know."""

RelevanceLike = Sequence[float] | np.ndarray | torch.Tensor

_SPECIAL = re.compile(r"^(\[[A-Za-z_]+\]|<[^<>\s]+>)$")
_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_WHITESPACE_MARKS = {"\n": "↵", "\r": "↵", "\t": "→", " ": "·"}


# ---------------------------------------------------------------------------------------------
# colours


def normalise(relevance: RelevanceLike) -> np.ndarray:
    """``R / max|R|`` in float64: values in ``[-1, 1]``, zero stays zero.

    This is the ``per_map`` normalisation of :func:`fxlrp.viz.image.normalise_symmetric`, over
    one sequence.

    Parameters
    ----------
    relevance : sequence of float, ndarray or Tensor
        The relevance of one sequence (``[length]``, or ``[1, length]``).

    Returns
    -------
    ndarray
        The normalised relevance; an all-zero sequence stays zero.

    Raises
    ------
    ValueError
        If the relevance is no single sequence, or has NaN or infinite values.
    """
    values = _as_vector(relevance)
    scale = np.abs(values).max(initial=0.0)
    return values / scale if scale > 0 else np.zeros_like(values)


def colours(normalised: RelevanceLike) -> np.ndarray:
    """RGB ``uint8`` colours of normalised relevance on the ``bwr`` scale.

    ``v >= 0``: ``(255, 255 (1 - v), 255 (1 - v))`` (white to red); ``v < 0``:
    ``(255 (1 + v), 255 (1 + v), 255)`` (white to blue).

    Parameters
    ----------
    normalised : sequence of float, ndarray or Tensor
        Values in ``[-1, 1]``; values beyond are clipped.

    Returns
    -------
    ndarray
        ``[n, 3]``.
    """
    values = np.clip(_as_vector(normalised), -1.0, 1.0)
    fade = 1.0 - np.abs(values)
    red = np.where(values >= 0, 1.0, fade)
    blue = np.where(values >= 0, fade, 1.0)
    return np.round(np.stack([red, fade, blue], axis=-1) * 255).astype(np.uint8)


def text_colour(background: Sequence[int]) -> tuple[int, int, int]:
    """Black or white, whichever contrasts more with ``background`` (WCAG's relative luminance).

    Black on white, light blue and red; white on strong blue.

    Parameters
    ----------
    background : sequence of int
        RGB, 0 to 255.

    Returns
    -------
    tuple of int
        ``(0, 0, 0)`` or ``(255, 255, 255)``.
    """
    linear = [(channel / 255) / 12.92 if channel <= 10 else ((channel / 255 + 0.055) / 1.055) ** 2.4
              for channel in background]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return (0, 0, 0) if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else (255, 255, 255)


# ---------------------------------------------------------------------------------------------
# tokens and words


def tokens_of(tokenizer: Any, input_ids: Any) -> list[str] | list[list[str]]:
    """The token strings of ``input_ids``, from ``tokenizer.convert_ids_to_tokens``.

    Parameters
    ----------
    tokenizer : Any
        Any Hugging Face tokenizer.
    input_ids : Tensor, ndarray or sequence
        One sequence, or a batch.

    Returns
    -------
    list of str or list of list of str
        The tokens; a list per sequence for a batch.
    """
    ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    if ids and isinstance(ids[0], list):
        return [list(tokenizer.convert_ids_to_tokens(row)) for row in ids]
    return list(tokenizer.convert_ids_to_tokens([int(value) for value in ids]))


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token as a reader sees it, quoted: its decoded text (a byte-level BPE piece ``'Ġmovie'``
    reads ``' movie'``, a SentencePiece ``'▁movie'`` too).

    Parameters
    ----------
    tokenizer : Any
        Any Hugging Face tokenizer.
    token_id : int
        The token's id.

    Returns
    -------
    str
        ``repr`` of the decoded text; for a token that is a part of a character (a byte of a
        multi-byte UTF-8 character, which decodes to U+FFFD alone), the piece as the vocabulary
        writes it and what it is.
    """
    decoded = tokenizer.decode([int(token_id)], clean_up_tokenization_spaces=False)
    if decoded and "\ufffd" not in decoded:
        return repr(decoded)
    return f"{tokenizer.convert_ids_to_tokens(int(token_id))!r} (a part of a multi-byte character)"


def detect_convention(tokens: Sequence[str]) -> str:
    """The way the tokens mark words.

    A sequence without any marked token reads the same under all conventions but byte-level.

    Parameters
    ----------
    tokens : sequence of str
        The tokens.

    Returns
    -------
    str
        ``"bytelevel"`` if a token starts with ``Ġ`` or ``Ċ``, else ``"sentencepiece"`` if one
        has ``▁``, else ``"wordpiece"`` if one starts with ``##``, else ``"plain"``.
    """
    if any(token[:1] in ("Ġ", "Ċ") for token in tokens):
        return "bytelevel"
    if any("▁" in token for token in tokens):
        return "sentencepiece"
    if any(token.startswith("##") and len(token) > 2 for token in tokens):
        return "wordpiece"
    return "plain"


def merge_words(
    tokens: Sequence[str], relevance: RelevanceLike, *, convention: str | None = None
) -> tuple[list[str], np.ndarray]:
    """Words and their relevance.

    The relevance of a word is the sum (float64, in token order) of the relevance of its tokens,
    so the total is kept.

    Parameters
    ----------
    tokens : sequence of str
        The tokens of one sequence.
    relevance : sequence of float, ndarray or Tensor
        Their relevance.
    convention : str, optional
        One of :data:`CONVENTIONS`; detected from the tokens by default
        (:func:`detect_convention`).

    Returns
    -------
    words : list of str
        The words as text (markers removed, leading whitespace stripped; a word of whitespace
        only, such as a newline token, stays as it is).
    relevance : ndarray
        The relevance of each word.

    Raises
    ------
    ValueError
        If tokens and relevance differ in length, or the convention is unknown.
    """
    pieces = _pieces(tokens, relevance, convention, merge=True)
    words = [piece.text or piece.space for piece in pieces]
    return words, np.array([piece.relevance for piece in pieces], dtype=np.float64)


@dataclass(frozen=True)
class _Piece:
    """What is shown as one coloured box: a token, or a word of merged tokens."""

    space: str  # whitespace before the box, shown uncoloured
    text: str  # the box's text; "" for a token of whitespace only
    relevance: float
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class _Token:
    data: bytes  # what the token stands for, with the whitespace before it
    token: str
    relevance: float


def _pieces(tokens: Sequence[str], relevance: RelevanceLike, convention: str | None, merge: bool) -> list[_Piece]:
    values = _as_vector(relevance)
    tokens = [str(token) for token in tokens]
    if len(tokens) != len(values):
        raise ValueError(f"{len(tokens)} tokens but {len(values)} relevance values; pass the tokens and the "
                         f"relevance of one sequence (e.g. tokens_of(tokenizer, ids[0]) and relevance[0])")
    convention = detect_convention(tokens) if convention is None else convention
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown token convention {convention!r}; use one of {', '.join(CONVENTIONS)}")
    read = _reader(convention)
    groups: list[list[_Token]] = []
    previous_data, previous_special = b"", True
    for index, (token, value) in enumerate(zip(tokens, values.tolist(), strict=True)):
        special = bool(_SPECIAL.match(token)) and not _BYTE.match(token)
        data, continues = read(token, index)
        if index > 0 and convention in ("wordpiece", "plain") and not continues:
            data = b" " + data  # these tokenizers drop the spaces between words
        joins = (merge and continues and not special and not previous_special
                 and not previous_data[-1:].isspace())
        if joins:
            groups[-1].append(_Token(data, token, value))
        else:
            groups.append([_Token(data, token, value)])
        previous_data, previous_special = data, special
    pieces = []
    for group in groups:
        shown = b"".join(token.data for token in group).decode("utf-8", errors="replace")
        text = shown.lstrip()
        total = 0.0
        for token in group:
            total += token.relevance
        pieces.append(_Piece(shown[: len(shown) - len(text)], text, total, tuple(token.token for token in group)))
    return pieces


_Read = Callable[[str, int], tuple[bytes, bool]]


def _reader(convention: str) -> _Read:
    """``read(token, index) -> (bytes shown, continues the previous word)`` of a convention."""
    if convention == "wordpiece":
        def read(token: str, index: int) -> tuple[bytes, bool]:
            if token.startswith("##") and len(token) > 2 and index > 0:
                return token[2:].encode(), True
            return token.encode(), False
    elif convention == "sentencepiece":
        def read(token: str, index: int) -> tuple[bytes, bool]:
            byte = _BYTE.match(token)
            data = bytes([int(byte.group(1), 16)]) if byte else token.replace("▁", " ").encode()
            return data, not data[:1].isspace()
    elif convention == "bytelevel":
        decoder = _byte_decoder()

        def read(token: str, index: int) -> tuple[bytes, bool]:
            if all(character in decoder for character in token):
                data = bytes(decoder[character] for character in token)
            else:  # added tokens are stored as text
                data = token.encode()
            return data, not data[:1].isspace()
    else:
        def read(token: str, index: int) -> tuple[bytes, bool]:
            return token.encode(), False
    return read


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes are themselves, the rest
    (space, newline, control bytes) are shifted to 256 + n (space -> ``Ġ``, newline -> ``Ċ``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + shifted)
            shifted += 1
    return {chr(character): byte for byte, character in zip(printable, characters, strict=True)}


def _as_vector(values: RelevanceLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ValueError(f"relevance of one sequence is a vector [length]; got shape {array.shape} "
                         f"(pass relevance[i] for sequence i of a batch)")
    if not np.isfinite(array).all():
        raise ValueError("relevance has NaN or infinite values; nothing can be coloured by it")
    return array


def _shown(piece: _Piece) -> tuple[str, str]:
    """The box's text and the whitespace after it: a token of whitespace only is shown by marks
    (``↵`` newline, ``·`` space, ``→`` tab) and keeps its line breaks after the box."""
    if piece.text:
        return piece.text, ""
    marks = "".join(_WHITESPACE_MARKS.get(character, "·") for character in piece.space) or "∅"
    return marks, "".join(character for character in piece.space if character == "\n")


# ---------------------------------------------------------------------------------------------
# HTML


def html(
    tokens: Sequence[str],
    relevance: RelevanceLike,
    *,
    merge_subwords: bool = False,
    convention: str | None = None,
    title: str | None = None,
    legend: bool = True,
) -> str:
    """One sequence as an HTML fragment (a ``<div>``).

    Each token (or word) is on a background from white to red (positive relevance) or blue
    (negative), scaled by ``max |R|`` of the sequence. Text is HTML-escaped; spaces and line
    breaks are kept. Each box carries its exact relevance in ``data-relevance`` (Python's
    ``repr`` of the float64 value) and shows it, with its tokens, on hover. Whole pages:
    :func:`html_page`, :func:`save_html`.

    Parameters
    ----------
    tokens : sequence of str
        The tokens of one sequence.
    relevance : sequence of float, ndarray or Tensor
        Their relevance.
    merge_subwords : bool, default False
        Whether each box is a word of merged tokens (:func:`merge_words`).
    convention : str, optional
        One of :data:`CONVENTIONS`; detected from the tokens by default.
    title : str, optional
        A heading line.
    legend : bool, default True
        Whether a line with the scale follows.

    Returns
    -------
    str
        The fragment.

    Raises
    ------
    ValueError
        If tokens and relevance differ in length, or the convention is unknown.
    """
    pieces = _pieces(tokens, relevance, convention, merge_subwords)
    values = np.array([piece.relevance for piece in pieces], dtype=np.float64)
    backgrounds = colours(normalise(values))
    scale = float(np.abs(values).max(initial=0.0))
    boxes = []
    for piece, background in zip(pieces, backgrounds.tolist(), strict=True):
        shown, after = _shown(piece)
        hover = f"{' '.join(piece.tokens)}: {piece.relevance:+.4g}"
        boxes.append(
            f"{_html.escape(piece.space if piece.text else '')}<span class=\"fxlrp-token\" "
            f"data-relevance=\"{piece.relevance!r}\" title=\"{_html.escape(hover)}\" "
            f"style=\"background-color: {_hex(background)}; color: {_hex(text_colour(background))}; "
            f"padding: 0.1em 0.15em; border-radius: 0.2em\">{_html.escape(shown)}</span>{after}"
        )
    parts = [f"<div class=\"fxlrp-text\" data-max-abs-relevance=\"{scale!r}\" style=\"margin: 0.8em 0\">"]
    if title is not None:
        parts.append(f"<div class=\"fxlrp-title\" style=\"font-weight: bold\">{_html.escape(title)}</div>")
    parts.append("<div class=\"fxlrp-tokens\" style=\"white-space: pre-wrap; line-height: 1.9\">"
                 + "".join(boxes) + "</div>")
    if legend:
        parts.append(_legend(scale, float(values.sum())))
    parts.append("</div>")
    return "\n".join(parts)


def _legend(scale: float, total: float) -> str:
    swatches = _swatches([f"{-scale:.3g}", "", "0", "", f"{scale:+.3g}"])
    return (f"<div class=\"fxlrp-legend\" style=\"font-size: smaller; color: #555\">relevance {swatches} "
            f"(red: for, blue: against; sum {total:.4g})</div>")


def _swatches(labels: Sequence[str]) -> str:
    """Five boxes of the colour scale at ``-1, -1/2, 0, 1/2, 1``, with the labels written in them
    (HTML, not escaped)."""
    return " ".join(
        f"<span style=\"background-color: {_hex(colour)}; color: {_hex(text_colour(colour))}; padding: 0 0.3em\">"
        f"{label}</span>"
        for colour, label in zip(colours([-1.0, -0.5, 0.0, 0.5, 1.0]).tolist(), labels, strict=True)
    )


def html_page(*fragments: str, title: str = "fxlrp explanation") -> str:
    """A complete HTML document (UTF-8) holding the fragments of :func:`html`.

    Parameters
    ----------
    *fragments : str
        The fragments.
    title : str, default "fxlrp explanation"
        The page's title and heading.

    Returns
    -------
    str
        The document.
    """
    body = "\n".join(fragments)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_html.escape(title)}</title>\n</head>\n"
            f"<body style=\"font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto\">\n"
            f"<h1 style=\"font-size: 1.3em\">{_html.escape(title)}</h1>\n{body}\n</body>\n</html>\n")


def save_html(path: str | Path, *fragments: str, title: str = "fxlrp explanation") -> Path:
    """Write :func:`html_page` of the fragments to ``path`` (folders are made).

    Parameters
    ----------
    path : str or Path
        The file.
    *fragments : str
        The fragments of :func:`html`.
    title : str, default "fxlrp explanation"
        The page's title and heading.

    Returns
    -------
    Path
        The path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_page(*fragments, title=title), encoding="utf-8")
    return path


def _hex(colour: Sequence[int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*colour)


# ---------------------------------------------------------------------------------------------
# terminal


def use_colour(stream: TextIO | None = None) -> bool:
    """Whether to write colours to ``stream``.

    Parameters
    ----------
    stream : TextIO, optional
        The stream; ``sys.stdout`` by default.

    Returns
    -------
    bool
        True if it is a terminal, the ``NO_COLOR`` variable is unset or empty
        (https://no-color.org) and ``TERM`` is not ``dumb``.
    """
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def terminal(
    tokens: Sequence[str],
    relevance: RelevanceLike,
    *,
    merge_subwords: bool = False,
    convention: str | None = None,
    colour: bool | None = None,
    stream: TextIO | None = None,
) -> str:
    """One sequence as text for a terminal.

    With colour: each token (or word) on a 24-bit ANSI background (``ESC[48;2;R;G;Bm``) of the
    colours of :func:`html`, black or white text, reset after each box. Without: each token
    followed by its normalised relevance ``R / max|R|`` in brackets, e.g. ``good(+1.00)``.

    Parameters
    ----------
    tokens : sequence of str
        The tokens of one sequence.
    relevance : sequence of float, ndarray or Tensor
        Their relevance.
    merge_subwords : bool, default False
        Whether each box is a word of merged tokens (:func:`merge_words`).
    convention : str, optional
        One of :data:`CONVENTIONS`; detected from the tokens by default.
    colour : bool, optional
        Whether to colour; None decides by :func:`use_colour` for ``stream`` (colour in a
        terminal, none when piped or with ``NO_COLOR`` set).
    stream : TextIO, optional
        The stream the text is for; ``sys.stdout`` by default.

    Returns
    -------
    str
        The text.

    Raises
    ------
    ValueError
        If tokens and relevance differ in length, or the convention is unknown.
    """
    colour = use_colour(stream) if colour is None else colour
    pieces = _pieces(tokens, relevance, convention, merge_subwords)
    normalised = normalise([piece.relevance for piece in pieces])
    backgrounds = colours(normalised).tolist()
    parts = []
    for piece, value, background in zip(pieces, normalised.tolist(), backgrounds, strict=True):
        shown, after = _shown(piece)
        space = piece.space if piece.text else ""
        if colour:
            parts.append(f"{space}{_ansi(shown, background)}{after}")
        else:
            parts.append(f"{space}{shown}({value:+.2f}){after}")
    return "".join(parts)


def _ansi(shown: str, background: Sequence[int]) -> str:
    """``shown`` on a 24-bit ANSI background, in black or white (:func:`text_colour`), then reset."""
    foreground = text_colour(background)
    return (f"\x1b[48;2;{background[0]};{background[1]};{background[2]}m"
            f"\x1b[38;2;{foreground[0]};{foreground[1]};{foreground[2]}m{shown}\x1b[0m")
