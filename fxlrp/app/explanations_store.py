"""Explanations of a data set on disk: ``.npy`` shards of relevance plus a JSON index.

The format is described in ``docs/datasets.md``. In short, a directory holds::

    settings.json                 what the run was made with (a restart with others is refused)
    shards/relevance-000000.npy   relevance of samples [start, stop): float32 [stop - start, *sample]
    shards/relevance-000000.json  that shard's rows: names, labels, predictions, targets, scores, sums
    index.json                    written last: every shard, its range and shape, and all rows
    png/NAME.heatmap.png          with --png
    shards/concepts-000000.npz    with --concepts: the reference samples of the nodes among the shard's samples
    concepts/NODE.npz             with --concepts: those of all samples (fxlrp.concepts.read_references)

Shard ``k`` always holds the samples ``[k * shard_size, (k + 1) * shard_size)``, whichever
process computed it, so one process and many write identical files. Every file is written
atomically (a temporary name, ``fsync``, ``rename``); a shard counts as complete when its
``.json`` exists, which is written after its ``.npy``. A run killed at any moment therefore
leaves complete files only (and temporaries, removed by the next run), and the next run
computes exactly the shards without a ``.json``.

:func:`read_explanations` reads a finished directory back in data-set order. This module needs
numpy and nothing of the command line; ``fxlrp.read_explanations`` is it, imported on first use.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

FORMAT = "fxlrp-explanations"
VERSION = 1
INDEX = "index.json"
SETTINGS = "settings.json"
SHARDS = "shards"
PNG = "png"
TEMPORARY_SUFFIX = ".tmp"


# ---------------------------------------------------------------------------------------------
# atomic files


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(file)`` so that it either exists complete or not at all:
    into ``.NAME.tmp`` beside it, flushed to disk, then renamed (and the rename flushed)."""
    temporary = path.with_name(f".{path.name}{TEMPORARY_SUFFIX}")
    with open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_json(path: Path, content: dict[str, Any]) -> None:
    """Atomically write the dict ``content`` as JSON, one top-level key per line (in the given
    order), each value on its line."""
    lines = [f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}" for key, value in content.items()]
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    write_atomic(path, lambda file: file.write(text.encode()))


def write_npy(path: Path, array: np.ndarray) -> None:
    """Atomically write ``array`` in numpy's ``.npy`` format."""
    write_atomic(path, lambda file: np.save(file, np.ascontiguousarray(array), allow_pickle=False))


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete the temporaries a killed run left in ``directory`` (recursively); returns them."""
    removed = [path for path in directory.rglob(f".*{TEMPORARY_SUFFIX}") if path.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


# ---------------------------------------------------------------------------------------------
# shards


def shard_name(shard: int) -> str:
    return f"relevance-{shard:06d}"


def shard_ranges(samples: int, shard_size: int) -> list[range]:
    """Sample ranges of the shards: ``[k * shard_size, (k + 1) * shard_size)``, the last shorter."""
    return [range(start, min(start + shard_size, samples)) for start in range(0, samples, shard_size)]


@dataclass
class ShardRows:
    """What a shard records per sample besides relevance (``None`` marks a skipped sample)."""

    names: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    predictions: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    scores: list[float | None] = field(default_factory=list)
    relevance_sums: list[float | None] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    COLUMNS = ("names", "labels", "predictions", "targets", "scores", "relevance_sums")


class ExplanationWriter:
    """Writes a run's files into ``directory``; one per process, each for the shards it computes.

    ``settings``: what the explanations depend on (model, weights, composite, data, batch and
    shard size, precision); a directory holding another run's settings is refused.
    """

    def __init__(self, directory: Path, settings: dict[str, Any], samples: int, shard_size: int) -> None:
        self.directory = directory
        self.settings = settings
        self.samples = samples
        self.shard_size = shard_size
        self.ranges = shard_ranges(samples, shard_size)

    def conflict(self) -> str | None:
        """Why ``directory`` cannot take this run (another run's files, or not a directory), or None."""
        if self.directory.exists() and not self.directory.is_dir():
            return f"--out {str(self.directory)!r} is a file, not a directory"
        path = self.directory / SETTINGS
        if not path.is_file():
            return None
        try:
            existing = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            return f"{str(path)!r} cannot be read ({error}); delete it or choose another --out"
        differing = [key for key in sorted(set(existing) | set(self.settings))
                     if existing.get(key) != self.settings.get(key)]
        if not differing:
            return None
        key = differing[0]
        return (f"{str(self.directory)!r} holds explanations made with other settings ({key}: "
                f"{existing.get(key)!r} there, {self.settings.get(key)!r} now); choose another --out or delete it")

    def prepare(self) -> None:
        """Create the directories, remove a killed run's temporaries, record the settings (one
        process does this, before any shard is written)."""
        (self.directory / SHARDS).mkdir(parents=True, exist_ok=True)
        remove_temporaries(self.directory)
        if not (self.directory / SETTINGS).is_file():
            write_json(self.directory / SETTINGS, self.settings)

    def complete(self, shard: int) -> bool:
        return (self.directory / SHARDS / f"{shard_name(shard)}.json").is_file()

    def write_shard(self, shard: int, relevance: np.ndarray, rows: ShardRows) -> None:
        """Write a shard's relevance, then its rows (which mark it complete)."""
        span = self.ranges[shard]
        if relevance.shape[0] != len(span) or len(rows.names) != len(span):
            raise ValueError(f"shard {shard} holds samples {span.start}..{span.stop - 1}, got {relevance.shape[0]}")
        name = shard_name(shard)
        write_npy(self.directory / SHARDS / f"{name}.npy", relevance)
        content = {"file": f"{SHARDS}/{name}.npy", "start": span.start, "stop": span.stop,
                   "shape": list(relevance.shape), "dtype": relevance.dtype.name}
        content.update({column: getattr(rows, column) for column in ShardRows.COLUMNS})
        content["skipped"] = rows.skipped
        write_json(self.directory / SHARDS / f"{name}.json", content)

    def missing_shards(self) -> list[int]:
        return [shard for shard in range(len(self.ranges)) if not self.complete(shard)]

    def write_index(self, sample_shape: Sequence[int], classes: Sequence[str] | None,
                    concepts: dict[str, str] | None = None) -> dict[str, Any]:
        """Gather every shard's rows into ``index.json`` (when all shards are complete); with
        ``--concepts``, ``concepts``: each node's file of reference samples."""
        missing = self.missing_shards()
        if missing:
            raise RuntimeError(f"cannot write the index: shards {missing[:5]} are not complete")
        shards = [json.loads((self.directory / SHARDS / f"{shard_name(shard)}.json").read_text())
                  for shard in range(len(self.ranges))]
        index: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "samples": self.samples,
            "sample_shape": list(sample_shape), "dtype": shards[0]["dtype"],
            "classes": None if classes is None else list(classes),
            "settings": self.settings,
            "shards": [{key: shard[key] for key in ("file", "start", "stop", "shape")} for shard in shards],
        }
        for column in ShardRows.COLUMNS:
            index[column] = [value for shard in shards for value in shard[column]]
        index["skipped"] = [entry for shard in shards for entry in shard["skipped"]]
        if concepts is not None:
            index["concepts"] = concepts
        write_json(self.directory / INDEX, index)
        return index


# ---------------------------------------------------------------------------------------------
# reading


@dataclass
class Explanations:
    """A data set's explanations in data-set order (sample ``i`` is row ``i`` everywhere).

    ``relevance``: ``[N, *sample_shape]`` (rows of skipped samples are NaN); ``predictions``: the
    model's class per sample; ``targets``: the explained class; ``labels``: the data set's label
    (-1: none); ``scores``: the explained output (logit) and ``relevance_sums`` its relevance
    summed over the sample (NaN where skipped); ``names``: file paths relative to the folder, or
    indices; ``skipped``: ``{"index", "name", "reason"}`` of each sample that could not be read;
    ``index``: the whole ``index.json``.
    """

    relevance: np.ndarray
    predictions: np.ndarray
    targets: np.ndarray
    labels: np.ndarray
    scores: np.ndarray
    relevance_sums: np.ndarray
    names: list[str]
    classes: list[str] | None
    skipped: list[dict[str, Any]]
    index: dict[str, Any]

    def __len__(self) -> int:
        return len(self.names)


def _floats(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if value is None else value for value in values], dtype=np.float64)


def read_explanations(directory: str | os.PathLike[str], mmap: bool = False) -> Explanations:
    """The explanations ``fxlrp explain --data ... --out DIRECTORY`` wrote, in data-set order,
    however many processes wrote them. ``mmap``: with a single shard, map it instead of reading
    it (several shards are concatenated into memory)."""
    root = Path(directory)
    path = root / INDEX
    if not path.is_file():
        shards = sorted((root / SHARDS).glob("relevance-*.json")) if (root / SHARDS).is_dir() else []
        detail = f" ({len(shards)} shard(s) complete)" if shards else ""
        raise FileNotFoundError(f"{str(path)!r} does not exist: the run has not finished{detail}; run the same "
                                f"fxlrp explain command again to finish it")
    index = json.loads(path.read_text())
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise ValueError(f"{str(path)!r} is not an fxlrp explanations index of version {VERSION}")
    arrays = [np.load(root / shard["file"], mmap_mode="r" if mmap else None, allow_pickle=False)
              for shard in index["shards"]]
    for array, shard in zip(arrays, index["shards"], strict=True):
        if list(array.shape) != shard["shape"]:
            raise ValueError(f"{shard['file']} has shape {list(array.shape)}, the index says {shard['shape']}")
    relevance = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return Explanations(
        relevance=relevance,
        predictions=np.array(index["predictions"], dtype=np.int64),
        targets=np.array(index["targets"], dtype=np.int64),
        labels=np.array(index["labels"], dtype=np.int64),
        scores=_floats(index["scores"]),
        relevance_sums=_floats(index["relevance_sums"]),
        names=list(index["names"]),
        classes=index["classes"],
        skipped=list(index["skipped"]),
        index=index,
    )
