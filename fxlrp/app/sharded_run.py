"""What the data-set commands share (``fxlrp explain --data``, :mod:`fxlrp.app.explain_dataset`;
``fxlrp evaluate``, :mod:`fxlrp.app.evaluate_dataset`): the shard loop. Batches never cross a shard;
each process (``torchrun``, :mod:`fxlrp.app.distributed`) computes its share of the shards still
missing and writes them atomically (:mod:`fxlrp.app.explanations_store`); the first process writes
the index when all are done. A run killed at any moment and started again with the same command
computes only the missing shards and ends with the files of an uninterrupted run. Each command
gives what it computes per batch and what it writes.

Both start alike (:func:`loaded_model`, :class:`DataSet`): the model and its preprocessing, the
data and its first readable sample (which fixes the sample shape and is the probe of the model),
the settings every run records.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler

from fxlrp.app.cli_options import InputError
from fxlrp.app.datasets import NO_LABEL, Item, Source, as_list, open_data
from fxlrp.app.devices import autocast, device_of, prepare_inputs
from fxlrp.app.distributed import Processes, processes_from_environment
from fxlrp.app.explanations_store import ExplanationWriter, ShardRows
from fxlrp.app.models.spec import load_model, preprocessing_from_options
from fxlrp.app.outputs import probe_model
from fxlrp.app.preprocessing import Preprocessing


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


def file_hash(path: str | None) -> str | None:
    """The first 16 hex digits of a file's SHA-256 (``--weights``, recorded in the settings), or None."""
    if path is None:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def first_explainable(source: Source, on_error: str) -> Item:
    """The first sample that can be read (which fixes the sample shape)."""
    for index in range(len(source)):
        item = source[index]
        if item.error is None:
            return item
        if on_error == "stop":
            raise InputError(f"sample {index} ({source.names[index]!r}) cannot be read: {item.error}; fix or "
                             f"remove it, or pass --on-error skip")
    raise InputError(f"no sample of {source.description} can be read")


def check_counts(args: argparse.Namespace, *more: tuple[str, int, int]) -> None:
    """``--batch-size``, ``--shard-size`` and ``--workers`` (and ``more``: ``(option, value,
    lowest)``) checked to be at least their lowest value."""
    for option, value, low in (("--batch-size", args.batch_size, 1), ("--shard-size", args.shard_size, 1),
                               ("--workers", args.workers, 0), *more):
        if value < low:
            raise InputError(f"{option} must be at least {low}, got {value}")


def on_processes(args: argparse.Namespace,
                 command: Callable[[argparse.Namespace, torch.device, Processes], int]) -> int:
    """Run a data-set command in this process's place among those ``torchrun`` started (alone
    when started otherwise).

    Parameters
    ----------
    args
        The parsed command line; its ``--target`` is read first (:func:`target_of`).
    command
        ``command(args, device, processes)``: the command's work, on ``--device`` (under torchrun
        without a device index, CUDA device ``LOCAL_RANK``).

    Returns
    -------
    int
        What ``command`` returns; the process group is left however it ends.
    """
    args.target = target_of(args.target)
    device = device_of(args.device)
    processes = processes_from_environment(device.type)
    try:
        if processes.joined and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", processes.local_rank)
        return command(args, device, processes)
    finally:
        processes.close()


def loaded_model(args: argparse.Namespace) -> tuple[nn.Module, Preprocessing]:
    """The model of ``--model`` (with ``--weights``) and its preprocessing (the options', else the
    model's own). A model without ``--weights`` gets the same random weights in every process.

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    tuple
        The model and its preprocessing.
    """
    torch.manual_seed(0)
    model = load_model(args.model, args.weights)
    return model, preprocessing_from_options(args, model)


@dataclass(frozen=True)
class DataSet:
    """A data-set run's samples (``--data``) and the first that can be read, which fixes the sample
    shape and is the sample the model is probed with."""

    source: Source
    first: Item

    @classmethod
    def opened(cls, args: argparse.Namespace, preprocessing: Preprocessing) -> DataSet:
        """``--data`` opened with ``preprocessing``, its first readable sample found (``--on-error``).

        Parameters
        ----------
        args
            The parsed command line.
        preprocessing
            The model's preprocessing.

        Returns
        -------
        DataSet
            The samples.
        """
        source = open_data(args.data, preprocessing)
        return cls(source, first_explainable(source, args.on_error))

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The first readable sample's shape, which every sample must have."""
        assert self.first.values is not None
        return tuple(self.first.values.shape)

    def first_inputs(self, device: torch.device, dtype: str) -> Tensor:
        """The first readable sample as a batch of one, on ``device`` in ``dtype`` (``--dtype``)."""
        return prepare_inputs(self.first.values[None], device, dtype)  # type: ignore[index]

    def probe(self, model: nn.Module, device: torch.device, dtype: str) -> tuple[Tensor, bool]:
        """:func:`~fxlrp.app.outputs.probe_model` on the first readable sample: its class scores and
        whether the model's output is image-shaped."""
        with autocast(device, dtype):
            return probe_model(model, self.first_inputs(device, dtype), [self.source.names[self.first.index]])

    def settings(self, args: argparse.Namespace, preprocessing: Preprocessing, device: torch.device, *,
                 chosen: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
        """The settings a run records (a restart with others is refused): the model and its weights,
        what the command explains with (``chosen``), the target, the preprocessing, the data, batch
        and shard size, device and precision, and the command's own (``more``).

        Parameters
        ----------
        args
            The parsed command line.
        preprocessing
            The model's preprocessing.
        device
            This process's device.
        chosen
            The composites (or methods), recorded before the target.
        more
            The command's other settings, recorded last.

        Returns
        -------
        dict of str to Any
            The settings, in the order they are written.
        """
        return {
            "model": args.model, "weights_sha256": file_hash(args.weights), **chosen, "target": args.target,
            "preprocessing": {"size": preprocessing.size, "channels": preprocessing.channels,
                              "mean": list(preprocessing.mean), "std": list(preprocessing.std),
                              "transform": preprocessing.description},
            "data": self.source.description, "samples": len(self.source), "names_sha256": self.source.fingerprint(),
            "batch_size": args.batch_size, "shard_size": args.shard_size, "device": device.type,
            "dtype": args.dtype, **more,
        }

    def sharded(self, args: argparse.Namespace, settings: dict[str, Any], processes: Processes) -> ShardedRun:
        """The run's directory (``--out``, ``--shard-size``) opened by this process (:class:`ShardedRun`)."""
        return ShardedRun(Path(args.out), settings, len(self.source), args.shard_size, processes)


@dataclass
class Shard:
    """A shard being filled batch by batch: its number, its samples, what is computed per sample
    (``values``, one row per sample) and its rows."""

    number: int
    span: range
    values: np.ndarray
    rows: ShardRows = field(default_factory=ShardRows)

    @property
    def full(self) -> bool:
        return len(self.rows.names) == len(self.span)

    def add(self, item: Item, name: str, values: Any = np.nan, prediction: int = NO_LABEL, target: int = NO_LABEL,
            score: float | None = None, relevance_sum: float | None = None) -> None:
        """A sample's results: its row of ``values`` and its entry in every column of the rows
        (by default those of a skipped sample: NaN, no prediction or target, no score)."""
        self.values[item.index - self.span.start] = values
        for column, value in zip(ShardRows.COLUMNS, (name, item.label, prediction, target, score, relevance_sum),
                                 strict=True):
            getattr(self.rows, column).append(value)

    def refuse(self, item: Item, name: str, problem: str, on_error: str, failed: str) -> None:
        """A sample that cannot be used: stop the run with one line naming it and what to do
        (``--on-error stop``; ``failed``: what it cannot be, e.g. ``"explained"``), or name it on
        stderr and list it in the rows as skipped."""
        if on_error == "stop":
            raise InputError(f"sample {item.index} ({name!r}) cannot be {failed}: {problem}; fix or remove it, "
                             f"or pass --on-error skip")
        print(f"fxlrp: skipped sample {item.index} ({name!r}): {problem}", file=sys.stderr)
        self.rows.skipped.append({"index": item.index, "name": name, "reason": problem})


AnyShard = TypeVar("AnyShard", bound=Shard)


class ShardedRun:
    """A data-set run's directory, opened by every process: refused if it holds another run's
    settings, prepared by the first process (a killed run's temporaries removed) while the others
    wait, the shards still missing found before any is written.

    Parameters
    ----------
    out
        ``--out``.
    settings
        What the results depend on (:meth:`DataSet.settings`).
    samples
        The number of samples.
    shard_size
        ``--shard-size``.
    processes
        This process's place among those started together.
    """

    def __init__(self, out: Path, settings: dict[str, Any], samples: int, shard_size: int,
                 processes: Processes) -> None:
        self.writer = ExplanationWriter(out, settings, samples, shard_size)
        self.processes = processes
        conflict = self.writer.conflict()
        if conflict is not None:
            raise InputError(conflict)
        self.missing = self.writer.missing_shards()  # every process sees the same files: nothing is written yet
        processes.barrier()
        if processes.is_main:
            self.writer.prepare()
        processes.barrier()

    @property
    def directory(self) -> Path:
        return self.writer.directory

    def compute(self, source: Source, batch_size: int, workers: int, start: Callable[[int, range], AnyShard],
                fill: Callable[[AnyShard, list[Item]], None], finish: Callable[[AnyShard], None]) -> tuple[int, int]:
        """Compute this process's share of the missing shards, batch by batch in data-set order.

        Parameters
        ----------
        source
            The data, read by a ``DataLoader`` with ``workers`` processes in batches of at most
            ``batch_size`` samples that never cross a shard.
        start
            ``start(number, span)``: an empty shard.
        fill
            ``fill(shard, batch)``: a batch's results into its shard, one row per sample.
        finish
            ``finish(shard)``: write a full shard (its rows last, which mark it complete).

        Returns
        -------
        tuple
            The number of shards and of samples this process computed.
        """
        mine = self.processes.share(self.missing)
        spans = [self.writer.ranges[shard] for shard in mine]
        loader = DataLoader(source, batch_sampler=ShardBatches(spans, batch_size), num_workers=workers,
                            collate_fn=as_list)
        progress = progress_bar(sum(len(span) for span in spans), self.processes.is_main)
        shards = iter(zip(mine, spans, strict=True))
        shard: AnyShard | None = None
        try:
            for batch in loader:
                if shard is None:
                    shard = start(*next(shards))
                fill(shard, batch)
                if shard.full:
                    finish(shard)
                    shard = None
                progress.update(len(batch))
        finally:
            progress.close()
        return len(mine), sum(len(span) for span in spans)

    def finished(self) -> bool:
        """Wait for every process to finish its shards; True in the first process, which then
        writes the index."""
        self.processes.barrier()
        return self.processes.is_main

    def resumed(self) -> str:
        """``"; K of N shards were already complete"`` when a restart found K shards done, else ``""``."""
        resumed = len(self.writer.ranges) - len(self.missing)
        return f"; {resumed} of {len(self.writer.ranges)} shards were already complete" if resumed else ""
