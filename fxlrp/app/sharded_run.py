"""What the data-set commands share (``fxlrp explain --data``, :mod:`fxlrp.app.explain_dataset`;
``fxlrp evaluate``, :mod:`fxlrp.app.evaluate_dataset`): the shard loop. Batches never cross a shard;
each process (``torchrun``, :mod:`fxlrp.app.distributed`) computes its share of the shards still
missing and writes them atomically (:mod:`fxlrp.app.explanations_store`); the first process writes
the index when all are done. A run killed at any moment and started again with the same command
computes only the missing shards and ends with the files of an uninterrupted run. Each command
gives what it computes per batch and what it writes.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import Sampler

from fxlrp.app.cli_options import InputError
from fxlrp.app.datasets import Item, Source


def target_of(text: int | str | None) -> int | str | None:
    """``--target`` in data-set mode: None (each sample's prediction), a class index, or ``label``
    (each sample's label from the data set)."""
    if text is None or isinstance(text, int) or text == "label":
        return text
    try:
        return int(text)
    except ValueError:
        raise InputError(f"--target {text!r} is neither a class index nor 'label'") from None


class _PlainProgress:
    """A progress line on stderr when tqdm is not installed: samples, samples/s, time left."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.start = self.shown = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and (now - self.shown >= 1.0 or self.done >= self.total):
            self.shown = now
            rate = self.done / max(now - self.start, 1e-9)
            left = (self.total - self.done) / rate if rate > 0 else float("inf")
            end = "\n" if self.done >= self.total else ""
            print(f"\rexplaining: {self.done}/{self.total} samples, {rate:.1f} samples/s, {left:.0f} s left",
                  end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and 0 < self.done < self.total:
            print(file=sys.stderr)


def progress_bar(total: int, enabled: bool) -> Any:
    """tqdm's bar (samples/s and time left) if tqdm is installed, else a plain line."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress(total, enabled)
    return tqdm(total=total, unit="sample", desc="explaining", file=sys.stderr, disable=None if enabled else True,
                smoothing=0.1)


class ShardBatches(Sampler[list[int]]):
    """Batches of ``batch_size`` consecutive samples within each shard (the last batch of a shard
    may be shorter): a batch never spans two shards, and a shard's batches are the same whichever
    process computes it."""

    def __init__(self, shards: Sequence[range], batch_size: int) -> None:
        self.shards = list(shards)
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for shard in self.shards:
            for start in range(shard.start, shard.stop, self.batch_size):
                yield list(range(start, min(start + self.batch_size, shard.stop)))

    def __len__(self) -> int:
        return sum(-(-len(shard) // self.batch_size) for shard in self.shards)


def _file_hash(path: str | None) -> str | None:
    if path is None:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _first_explainable(source: Source, on_error: str) -> Item:
    """The first sample that can be read (which fixes the sample shape)."""
    for index in range(len(source)):
        item = source[index]
        if item.error is None:
            return item
        if on_error == "stop":
            raise InputError(f"sample {index} ({source.names[index]!r}) cannot be read: {item.error}; fix or "
                             f"remove it, or pass --on-error skip")
    raise InputError(f"no sample of {source.description} can be read")
