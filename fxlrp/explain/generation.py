"""Explanations of generated text: the relevance of every earlier token for each generated token.

The user generates as usual (``model.generate``, any decoding), then explains what was generated:
one forward pass over prompt and continuation (teacher forcing) gives every step's logits, and the
relevance of all steps comes from that one forward pass, one backward pass per explained row.

:class:`GenerationExplanation` is the value every consumer reads (pictures in
:mod:`fxlrp.viz.generation`, the ``fxlrp explain --generate`` command).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class GenerationExplanation:
    """What a generation explanation holds, for a batch of ``batch`` sequences of ``length`` tokens
    (prompt and continuation, left-padded to one length) with ``rows`` explained rows.

    Row ``r`` explains a value of the logits (by default the logit of the token generated at
    ``positions[r]``, predicted at the position before it); its relevance reaches only the tokens
    before the last position it explains, so for one-step rows the matrix is zero on and above
    its diagonal ``relevance[b, r, positions[r][-1]:] == 0``.

    Attributes
    ----------
    relevance
        ``[batch, rows, length]``: the relevance of every token of the sequence for each row
        (padding tokens: 0).
    sequences
        ``[batch, length]``: the token ids, prompt and continuation.
    start
        The position of the first generated token (the prompt's length, left padding included).
    positions
        One tuple per row: the sequence positions of the generated tokens whose values the row
        explains (one for a step, several for a span).
    targets
        ``[batch, rows]``: the explained token of each one-step row (the generated token by
        default, the first of a contrast), -1 for spans and callables.
    scores
        ``[batch, rows]``: the explained value of each row (a logit, a difference of two, the sum
        over a span, or what a callable returned), as the forward pass computed it.
    attention_mask
        ``[batch, length]`` (1: token, 0: padding), or None where there is no padding.
    labels
        One short name per row, for pictures (``"step 3"``, ``"steps 3-5"``, ``"' the' - ' a'"``).
    source_relevance
        For encoder-decoder models: ``[batch, rows, source_length]``, the relevance of the encoder's
        input tokens for each row; None for decoder-only models.
    source_ids
        For encoder-decoder models: ``[batch, source_length]``, the encoder's input ids.
    source_mask
        For encoder-decoder models: the encoder's attention mask, or None.
    """

    relevance: Tensor
    sequences: Tensor
    start: int
    positions: tuple[tuple[int, ...], ...]
    targets: Tensor
    scores: Tensor
    attention_mask: Tensor | None
    labels: tuple[str, ...]
    source_relevance: Tensor | None = None
    source_ids: Tensor | None = None
    source_mask: Tensor | None = None

    def __len__(self) -> int:
        """The number of sequences."""
        return int(self.sequences.shape[0])

    @property
    def generated(self) -> Tensor:
        """``[batch, length - start]``: the generated token ids."""
        return self.sequences[:, self.start:]
