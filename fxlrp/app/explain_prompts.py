"""``fxlrp explain --model hf:DIR --data prompts.txt --generate N --out DIR``: a data set of prompts.

One prompt per line of a text file (blank lines are refused: they would shift the numbering). Each
prompt gets ``N`` tokens generated after it (as ``--text`` with ``--generate``) and the matrix of
:func:`fxlrp.explain_generation`: the relevance of every token of prompt and continuation for each
generated token. The matrices go into resumable shards of the data-set store
(:mod:`fxlrp.app.explanations_store`: shards, ``index.json``, a killed run computes only the missing
shards), as relevance ``[prompts, N, L]`` with ``L`` the longest prompt's tokens plus ``N``: prompt
``i``'s matrix ``[N, length_i]`` in its first ``length_i`` columns, 0 after them; its token ids
(``-1`` after them) in ``shards/tokens-*.npy`` beside each shard, written before the shard's rows
that mark it complete. Each row records the prompt (``names``) and the summed explained logits
(``scores``). An encoder-decoder model's matrices are over the decoder's tokens (from its start
token), and each prompt's relevance over the encoder's input, the prompt itself, goes beside them:
``shards/source-relevance-*.npy`` ``[prompts, N, S]`` with ``S`` the longest prompt's tokens (0
after a prompt's), its token ids in ``shards/source-tokens-*.npy`` (-1 after them). Under
``torchrun`` each process computes its share of the missing shards (:mod:`fxlrp.app.sharded_run`);
the files do not depend on the number of processes.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fxlrp
from fxlrp.app.cli_options import InputError
from fxlrp.app.distributed import Processes
from fxlrp.app.explanations_store import SHARDS, ShardRows, shard_name, write_npy
from fxlrp.app.models.huggingface import Pretrained
from fxlrp.app.sharded_run import ShardedRun, on_processes

STORED = {"float32": np.float32, "float64": np.float64}
"""The dtype the matrices are stored in per ``--dtype`` (the model runs in it)."""


def read_prompts(path: str) -> list[str]:
    """The prompts of a text file, one per line (a final newline ends the last, it adds none)."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"--data {path!r} is not a file; give a text file with one prompt per line")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--data {path!r} cannot be read as UTF-8 text: {error}") from None
    if not lines:
        raise InputError(f"--data {path!r} holds no prompt; write one prompt per line")
    blank = next((number for number, line in enumerate(lines, 1) if not line.strip()), None)
    if blank is not None:
        raise InputError(f"line {blank} of {path!r} is blank; write one prompt per line, without blank lines")
    return lines


def tokens_path(directory: Path, shard: int, kind: str = "tokens") -> Path:
    """Where the token ids of a shard's prompts and continuations are stored (``kind="tokens"``),
    or for an encoder-decoder model the encoder's input ids (``"source-tokens"``) and the
    relevance over them (``"source-relevance"``)."""
    return directory / SHARDS / f"{shard_name(shard).replace('relevance', kind)}.npy"


def run_prompt_data_set(args: argparse.Namespace, pretrained: Pretrained, composite: Any, composite_name: str,
                        explain_one: Any) -> int:
    """``fxlrp explain --model hf:DIR --data PROMPTS --generate N --out DIR``; ``explain_one(model,
    explain, ids, prompt)`` generates after one prompt's ids and explains it (a
    :class:`fxlrp.GenerationExplanation`). Returns the exit code; bad input raises
    :class:`InputError`."""
    if args.out is None:
        raise InputError("the following arguments are required: --out (the directory for the explanations)")
    defaults = {"workers": 0, "on_error": "stop", "png": False, "concepts": None, "device": "cpu", "compile": False}
    given = [name for name, value in defaults.items() if getattr(args, name, value) != value]
    if given:
        option = "--" + given[0].replace("_", "-")
        raise InputError(f"{option} is not taken with a file of prompts (--data with --generate): it explains each "
                         f"prompt in turn on the CPU, into --out; leave {option} out")
    if args.shard_size < 1:
        raise InputError(f"--shard-size must be at least 1, got {args.shard_size}")
    prompts = read_prompts(args.data)
    tokenizer = pretrained.tokenizer
    inputs = [tokenizer(prompt, return_tensors="pt")["input_ids"] for prompt in prompts]
    limit = getattr(pretrained.config, "max_position_embeddings", None)
    for number, ids in enumerate(inputs, 1):
        if limit is not None and ids.shape[1] + args.generate > limit:
            raise InputError(f"line {number} of {args.data!r} has {ids.shape[1]} tokens and {args.generate} generated "
                             f"ones; the model takes at most {limit}")
    return on_processes(args, lambda args, device, processes: _explain_prompts(
        args, processes, pretrained, composite, composite_name, explain_one, prompts, inputs))


def _explain_prompts(args: argparse.Namespace, processes: Processes, pretrained: Pretrained, composite: Any,
                     composite_name: str, explain_one: Any, prompts: list[str], inputs: list[torch.Tensor]) -> int:
    """:func:`run_prompt_data_set` in this process's place among those ``torchrun`` started: its
    share of the missing shards; the first process writes the index when all are done."""
    longest = max(ids.shape[1] for ids in inputs)
    width = longest + args.generate
    settings = {"model": args.model, "composite": composite_name, "generate": args.generate, "sample": args.sample,
                "seed": args.seed, "data": str(args.data), "samples": len(prompts),
                "prompts_sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest()[:16],
                "shard_size": args.shard_size, "dtype": args.dtype}
    sharded = ShardedRun(Path(args.out), settings, len(prompts), args.shard_size, processes)
    writer = sharded.writer
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    model = pretrained.load_model().to(dtype)
    explain = fxlrp.convert(model, composite)
    mine = processes.share(sharded.missing)
    began = time.monotonic()
    for shard in mine:
        span = writer.ranges[shard]
        relevance = np.zeros((len(span), args.generate, width), dtype=STORED[args.dtype])
        tokens = np.full((len(span), width), -1, dtype=np.int64)
        over_inputs = longest if pretrained.seq2seq else 0  # (the encoder's input: the prompts)
        source = np.zeros((len(span), args.generate, over_inputs), dtype=STORED[args.dtype])
        source_tokens = np.full((len(span), over_inputs), -1, dtype=np.int64)
        rows = ShardRows()
        for row, index in enumerate(span):
            explanation = explain_one(model, explain, inputs[index], prompts[index])
            matrix = explanation.relevance[0].detach().cpu().numpy()
            relevance[row, :, :matrix.shape[1]] = matrix
            tokens[row, :matrix.shape[1]] = explanation.sequences[0].cpu().numpy()
            if explanation.source_relevance is not None:
                over_input = explanation.source_relevance[0].detach().cpu().numpy()
                source[row, :, :over_input.shape[1]] = over_input
                source_tokens[row, :over_input.shape[1]] = explanation.source_ids[0].cpu().numpy()
            rows.names.append(prompts[index])
            rows.labels.append(-1)
            rows.predictions.append(-1)
            rows.targets.append(-1)
            rows.scores.append(float(explanation.scores[0].sum()))
            rows.relevance_sums.append(float(np.sum(matrix, dtype=np.float64)))
        # (before the rows, which mark the shard complete)
        write_npy(tokens_path(writer.directory, shard), tokens)
        if pretrained.seq2seq:
            write_npy(tokens_path(writer.directory, shard, "source-tokens"), source_tokens)
            write_npy(tokens_path(writer.directory, shard, "source-relevance"), source)
        writer.write_shard(shard, relevance, rows)
    sharded.report(len(mine), sum(len(writer.ranges[shard]) for shard in mine), time.monotonic() - began, "prompts")
    if not sharded.finished():
        return 0
    writer.write_index((args.generate, width), None)
    source_note = (f", and over each prompt's tokens [{len(prompts)}, {args.generate}, {longest}] in "
                  f"shards/source-relevance-*.npy" if pretrained.seq2seq else "")
    print(f"explained {args.generate} generated tokens after each of {len(prompts)} prompts into {writer.directory}: "
          f"{len(writer.ranges)} shard(s) of relevance [{len(prompts)}, {args.generate}, {width}]{source_note}"
          f"{sharded.resumed()}; read them with fxlrp.read_explanations")
    return 0
