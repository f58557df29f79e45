"""Explanations of generated text: the relevance of every earlier token for each generated token.

The user generates as usual (``model.generate``, any decoding), then explains what was generated:
one forward pass over prompt and continuation (teacher forcing) gives every step's logits, and the
relevance of all steps comes from that one forward pass, one backward pass per explained row.

:class:`GenerationExplanation` is the value every consumer reads (pictures in
:mod:`fxlrp.viz.generation`, the ``fxlrp explain --generate`` command).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fxlrp.errors import ExplanationInputError
from fxlrp.explain.attribute import attribute_from_output
from fxlrp.explain.explainer import Explainer
from fxlrp.explain.model_rejection import raised_from_the_call
from fxlrp.explain.targets import output_relevance, refuse_unknown_target


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


StepValue = Callable[[Tensor, Tensor], Tensor]
"""A target given as a function: ``value(logits, tokens)`` of one step's logits ``[batch,
vocabulary]`` (those that predicted the step's token) and its generated tokens ``[batch]``,
returning the explained value per sample ``[batch]``."""


@raised_from_the_call
def explain_generation(
    explain: Explainer,
    sequences: Tensor,
    start: int,
    *,
    attention_mask: Tensor | None = None,
    target: Any = None,
    steps: Sequence[int | range | Sequence[int]] | None = None,
    source: Tensor | None = None,
    source_mask: Tensor | None = None,
    check_finite: bool = True,
) -> GenerationExplanation:
    """The relevance of every earlier token for each generated token, from one forward pass.

    Generate as usual (``model.generate``, any decoding, with or without the key/value cache),
    then explain what was generated: ``sequences`` holds prompt and continuation (what
    ``generate`` returns), ``start`` the position of the first generated token. The model runs
    once over the whole sequence (teacher forcing: the logits at position ``p - 1`` are those that
    predicted the token at ``p``, as during generation), and each explained row is one backward
    pass from those logits, as :func:`fxlrp.attribute` explains a list of targets. Row ``r`` of
    the result equals ``fxlrp.attribute`` on the prefix that ends before its token, with that token
    as target.

    ``steps`` (rows) count the generated tokens from 0 (the token at ``start``; negative ones from
    the end, as in Python indexing). Each entry is a row: an int explains that step; a ``range``
    or a list of steps is a span, the sum of those steps' values explained in one backward pass
    (relevance is linear in where it starts, so a span's row is the sum of its steps' rows).
    None: every generated step, one row each.

    ``target`` says which value of each step's logits is explained (the same at every step):

    - ``None``: the logit of the token generated there (inseq's and Captum's default);
    - a token id (an int), or token ids per step (a tensor or list ``[generated]``, or
      ``[batch, generated]``): the logit of that token at that step;
    - a pair ``(a, b)`` of those: logit ``a`` minus logit ``b``, a contrast (as
      :func:`fxlrp.attribute` takes pairs): ``(None, other)`` explains why the model generated
      its token rather than ``other`` (``other`` per step: an alternative continuation, inseq's
      ``contrast_targets``);
    - a function ``value(logits, tokens)`` of one step's logits ``[batch, vocabulary]`` and its
      generated tokens ``[batch]``, returning one value per sample ``[batch]``: relevance starts
      from ``logits * d value / d logits`` (each logit's share to first order), which sums to the
      value where it is linear in the logits (sums, differences, scaled logits) and is its
      gradient x input at the logits otherwise (a log-probability: ``z_t - sum_j p_j z_j``).

    Padding: a batch of prompts is padded on the left (``tokenizer.padding_side = "left"``, as
    ``generate`` needs), so that every continuation starts at ``start``; ``attention_mask`` is the
    mask of the prompts ``[batch, start]`` (as the tokenizer gave it) or of the whole sequences
    ``[batch, length]``, where zeros after a sample's generated tokens mark the padding
    ``generate`` writes after a sequence ends (their rows are 0). The model gets the positions
    ``generate`` gives it (counted from each sample's first token, where its ``forward`` takes
    ``position_ids``), so each sample's matrix is the one it has alone.

    Encoder-decoder models (T5, BART, Whisper-style): ``source`` is the encoder's input (token
    ids ``[batch, source_length]``, with ``source_mask``), ``sequences`` the decoder's tokens
    as ``generate`` returns them (starting with the decoder's start token; ``start=1``), and the
    result holds each row's relevance over the encoder's input in ``source_relevance``.

    Parameters
    ----------
    explain
        The explainer :func:`fxlrp.convert` returned for the model (a Hugging Face causal
        language model or encoder-decoder model, or any model whose output, or its ``logits``,
        is per position ``[batch, length, vocabulary]``).
    sequences
        ``[batch, length]`` token ids: prompt and continuation (a decoder's tokens for an
        encoder-decoder model).
    start
        The position of the first generated token: the prompt's length, left padding included
        (``inputs["input_ids"].shape[1]`` of the call to ``generate``).
    attention_mask, target, steps, source, source_mask
        As described above.
    check_finite
        As for :func:`fxlrp.attribute`.

    Returns
    -------
    GenerationExplanation
        ``relevance[b, r]``: the relevance of every token of sample ``b`` for row ``r``, zero from
        the row's (last) explained token on; the explained values in ``scores``.

    Raises
    ------
    fxlrp.errors.ExplanationInputError
        For sequences that are not a batch of token ids, a ``start`` with no prompt before it or
        nothing generated after it, a mask of another shape or one that pads the prompts on the
        right, steps out of range, a target of no known kind.
    """
    if not isinstance(explain, Explainer):
        raise TypeError("explain_generation takes the explainer fxlrp.convert(model) returned, got "
                        f"{type(explain).__name__}")
    sequences = _token_ids(sequences, "sequences")
    batch, length = sequences.shape
    if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start < length:
        raise ExplanationInputError(
            f"start={start!r}: it is the position of the first generated token, between 1 and {length - 1} for "
            f"sequences of {length} tokens (the prompt's length: inputs['input_ids'].shape[1])")
    generated = length - start
    rows = _rows(steps, generated)
    for each in target if isinstance(target, tuple) else (target,):
        if not callable(each) or isinstance(each, Tensor):
            refuse_unknown_target(_as_token_ids(each, batch, generated), many=False)
    mask = _full_mask(attention_mask, batch, length, start)
    encoder = source is not None
    if encoder:
        source = _token_ids(source, "source")
        if source.shape[0] != batch:
            raise ExplanationInputError(f"source has {source.shape[0]} samples and sequences {batch}: one encoder "
                                        "input per generated sequence")
        inputs = {"input_ids": source, "attention_mask": source_mask, "decoder_input_ids": sequences}
        if mask is not None:
            inputs["decoder_attention_mask"] = mask
        decoder_ids = "decoder_input_ids"
    else:
        inputs = {"input_ids": sequences, "attention_mask": mask}
        if mask is not None and bool((mask == 0).any()) and "position_ids" in explain.input_names:
            # (as generate counts them: from each sample's first token, 1 at the padding)
            inputs["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        decoder_ids = "input_ids"
    # The LM head only for the positions that predicted generated tokens (the relevance is that of
    # the same logits; each backward pass then goes through length - start + 1 rows of it, not all).
    first_logit = start - 1 if not encoder and "logits_to_keep" in explain.input_names else 0
    if first_logit:
        inputs["logits_to_keep"] = length - first_logit
    inputs = {name: value for name, value in inputs.items() if value is not None}
    explained_scores: dict[int, Tensor] = {}
    explained_targets: dict[int, Tensor] = {}

    def row_start(index: int, row: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
        def relevance(logits: Tensor) -> Tensor:
            start_relevance = torch.zeros_like(logits)
            score = torch.zeros(batch, dtype=logits.dtype, device=logits.device)
            for step in row:
                position = start + step
                kept = None if mask is None else mask[:, position].to(device=logits.device, dtype=logits.dtype)
                share, value, token = _step_relevance(logits[:, position - 1 - first_logit].detach(), target,
                                                      sequences[:, position].to(logits.device), step, generated)
                if kept is not None:
                    share, value = share * kept[:, None], value * kept
                start_relevance[:, position - 1 - first_logit] += share
                score += value
                if len(row) == 1:
                    explained_targets[index] = token
            explained_scores[index] = score.detach()
            return start_relevance

        return relevance

    found = attribute_from_output(explain, inputs, [row_start(index, row) for index, row in enumerate(rows)],
                                  output=_logits(length - first_logit), check_finite=check_finite)
    relevance = found[decoder_ids].movedim(0, 1)
    source_relevance = found["input_ids"].movedim(0, 1) if encoder else None
    missing = torch.full((batch,), -1, dtype=torch.long)
    targets = torch.stack([explained_targets.get(index, missing).cpu() for index in range(len(rows))], dim=1)
    scores = torch.stack([explained_scores[index] for index in range(len(rows))], dim=1)
    if mask is not None:
        nowhere = torch.zeros(batch, dtype=torch.bool, device=mask.device)  # (spans keep their -1)
        unexplained = torch.stack([mask[:, start + row[0]] == 0 if len(row) == 1 else nowhere for row in rows], dim=1)
        targets = targets.masked_fill(unexplained.cpu(), -1)
    return GenerationExplanation(
        relevance=relevance.detach(), sequences=sequences, start=start,
        positions=tuple(tuple(start + step for step in row) for row in rows), targets=targets,
        scores=scores, attention_mask=mask, labels=tuple(_label(row, target) for row in rows),
        source_relevance=None if source_relevance is None else source_relevance.detach(),
        source_ids=source, source_mask=source_mask,
    )


def _token_ids(ids: Any, name: str) -> Tensor:
    """``ids`` checked: a tensor of integer token ids ``[batch, length]``."""
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        shown = f"a tensor of {ids.dtype}" if isinstance(ids, Tensor) else f"a {type(ids).__name__}"
        raise ExplanationInputError(f"{name} is {shown}; give token ids: an integer tensor [batch, length], as "
                                    "model.generate returns it")
    if ids.dim() != 2:
        raise ExplanationInputError(f"{name} has shape {list(ids.shape)}; give token ids [batch, length] (one "
                                    f"sequence: {name}[None])")
    return ids


def _rows(steps: Sequence[int | range | Sequence[int]] | None, generated: int) -> list[tuple[int, ...]]:
    """The explained rows: each a tuple of steps (from 0, the first generated token)."""
    if steps is None:
        return [(step,) for step in range(generated)]
    if isinstance(steps, (int, range)) or not isinstance(steps, Sequence):
        raise ExplanationInputError(f"steps={steps!r}: give a list of rows, each a step (an int) or a span (a range "
                                    "or a list of steps), e.g. steps=[0, 3, range(4, 8)]")
    rows = []
    for entry in steps:
        span = [entry] if isinstance(entry, int) and not isinstance(entry, bool) else entry
        if not isinstance(span, (range, Sequence)) or isinstance(span, str) or not all(
                isinstance(step, int) and not isinstance(step, bool) for step in span):
            raise ExplanationInputError(f"steps holds {entry!r}; each row is a step (an int) or a span (a range or a "
                                        "list of steps)")
        if not span:
            raise ExplanationInputError(f"steps holds the empty span {entry!r}; a span needs at least one step")
        for step in span:
            if not -generated <= step < generated:
                raise ExplanationInputError(
                    f"step {step} is out of range: {generated} tokens were generated (steps 0 to {generated - 1}, "
                    f"or -{generated} to -1 counting from the end)")
        rows.append(tuple(dict.fromkeys(step % generated for step in span)))
    if not rows:
        raise ExplanationInputError("steps=[] names no row; give at least one step, or leave steps out for all")
    return rows


def _full_mask(mask: Tensor | None, batch: int, length: int, start: int) -> Tensor | None:
    """The attention mask of the whole sequences: a prompt's mask extended with ones over the
    continuation; checked for left padding."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] not in (start,
                                                                                                          length):
        shown = list(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ExplanationInputError(f"attention_mask is {shown}; give the prompts' mask [{batch}, {start}] (as the "
                                    f"tokenizer returned it) or the whole sequences' [{batch}, {length}]")
    if mask.shape[1] == start:
        mask = torch.cat([mask, mask.new_ones(batch, length - start)], dim=1)
    prompt = mask[:, :start] != 0
    if bool((prompt[:, :-1] & ~prompt[:, 1:]).any()):
        raise ExplanationInputError(
            "attention_mask pads a prompt on the right; generate continues each prompt from its last token, so pad "
            "the prompts on the left (tokenizer.padding_side = 'left') and generate again")
    if bool((~prompt[:, -1]).any()):
        raise ExplanationInputError("attention_mask marks the last prompt token as padding; pad on the left")
    return mask


def _as_token_ids(spec: Any, batch: int, generated: int) -> Any:
    """A target of token ids per step (a list, or a tensor) checked as one; other kinds as they are."""
    if isinstance(spec, list):
        spec = torch.as_tensor(spec) if all(isinstance(value, int) for value in spec) else spec
    if isinstance(spec, Tensor) and not spec.is_floating_point() and spec.dim() > 0:
        if spec.shape[-1] != generated or spec.dim() > 2 or (spec.dim() == 2 and spec.shape[0] not in (1, batch)):
            raise ExplanationInputError(
                f"target has shape {list(spec.shape)}: token ids per step are [{generated}] or [{batch}, {generated}] "
                f"(one per generated token)")
    return spec


def _token_at(spec: Any, generated_tokens: Tensor, step: int, generated: int) -> Tensor:
    """The token each sample's row explains at ``step``: ``spec`` None (the generated one), a
    token id, or token ids per step."""
    if spec is None:
        return generated_tokens
    spec = _as_token_ids(spec, len(generated_tokens), generated)
    if isinstance(spec, Tensor) and spec.dim() > 0:
        return spec[..., step].to(generated_tokens.device).long().expand(len(generated_tokens))
    return torch.as_tensor(spec, device=generated_tokens.device).long().expand(len(generated_tokens))


def _step_relevance(logits: Tensor, target: Any, tokens: Tensor, step: int,
                    generated: int) -> tuple[Tensor, Tensor, Tensor]:
    """One step's share of a row: the relevance at its logits ``[batch, vocabulary]``, the
    explained value ``[batch]`` and the explained token (the first of a contrast; -1 for a
    function)."""
    if callable(target) and not isinstance(target, Tensor):
        leaf = logits.detach().requires_grad_()
        with torch.enable_grad():
            value = target(leaf, tokens)
            if not isinstance(value, Tensor) or value.shape not in ((len(tokens),), ()):
                shown = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ExplanationInputError(f"target(logits, tokens) returned {shown}; it must return one value per "
                                            f"sample, a tensor [{len(tokens)}]")
            (gradient,) = torch.autograd.grad(value.sum(), leaf, allow_unused=True)
        share = torch.zeros_like(logits) if gradient is None else logits * gradient
        return share, value.detach().expand(len(tokens)), torch.full_like(tokens, -1)
    if isinstance(target, tuple):
        if len(target) != 2:
            raise ExplanationInputError(f"target={target!r}: a contrast is a pair (a, b) (logit a minus logit b)")
        first, second = (_token_at(each, tokens, step, generated) for each in target)
        chosen = (first, second)
    else:
        first = _token_at(target, tokens, step, generated)
        chosen = first
    share = output_relevance(logits, chosen)
    return share, share.sum(dim=-1), first


def _logits(length: int) -> Callable[[Any], Tensor]:
    """Picks the per-position logits ``[batch, length, vocabulary]`` from the model's output (the
    last ``length`` positions')."""

    def pick(result: Any) -> Tensor:
        logits = result if isinstance(result, Tensor) else getattr(result, "logits", None)
        if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[1] != length:
            shown = list(logits.shape) if isinstance(logits, Tensor) else type(result).__name__
            raise ExplanationInputError(
                f"the model's output is {shown}; explain_generation explains logits per position [batch, {length}, "
                "vocabulary] (of the positions that predicted the generated tokens), as a causal language model or "
                "an encoder-decoder model's decoder gives them")
        return logits

    return pick


def _label(row: tuple[int, ...], target: Any) -> str:
    """A short name of a row, for pictures."""
    if len(row) == 1:
        name = f"step {row[0]}"
    elif row == tuple(range(row[0], row[-1] + 1)):
        name = f"steps {row[0]}-{row[-1]}"
    else:
        name = "steps " + ",".join(map(str, row))
    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], int):
        return f"{name} vs {target[1]}"
    return name
