"""``fxlrp explain --data SOURCE --out DIR``: explain a whole data set into resumable shards.

The data (:mod:`fxlrp.app.datasets`) is read by a ``DataLoader`` (``--workers``) in batches that
never cross a shard; each process (``torchrun``, :mod:`fxlrp.app.distributed`) computes its share
of the shards still missing and writes them atomically (:mod:`fxlrp.app.explanations_store`); the
first process writes the index when all are done. A run killed at any moment and started again
with the same command computes only the missing shards and ends with the files of an
uninterrupted run. That loop is :mod:`fxlrp.app.sharded_run`'s, which ``fxlrp evaluate`` shares.

With ``--concepts NODE[,NODE]`` each batch's explanation also records the relevance and the output
of those nodes (one forward and one backward pass still), and each shard keeps the top
``--concepts-top`` samples of every concept (channel) beside its relevance
(``shards/concepts-*.npz``); the first process merges them when all shards are done, finds the
receptive region of each reference sample and writes ``concepts/NODE.npz``
(:mod:`fxlrp.concepts.files`) before the index.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.app.cli_options import InputError
from fxlrp.app.composites import composite_by_name
from fxlrp.app.datasets import NO_LABEL, Item, Source
from fxlrp.app.devices import autocast, prepare_inputs, prepare_model
from fxlrp.app.distributed import Processes
from fxlrp.app.explanations_store import PNG, SHARDS, ExplanationWriter, write_atomic
from fxlrp.app.outputs import checked_targets, class_scores, explained_output, unexplainable
from fxlrp.app.preprocessing import Preprocessing
from fxlrp.app.sharded_run import DataSet, Shard, check_counts, loaded_model, on_processes
from fxlrp.concepts import ChannelConcept, ReferenceSamples, concept_atlas, conditional_relevance, with_boxes
from fxlrp.concepts.files import references_arrays, references_of_arrays, save_references
from fxlrp.explain.attribute import attribute

STORED = {"float32": np.float32, "bfloat16": np.float32, "float16": np.float16, "float64": np.float64}
"""The dtype relevance is stored in per ``--dtype`` (numpy has no bfloat16: its relevance is
stored as float32, which holds every bfloat16 value exactly)."""


def explains_data_set(args: argparse.Namespace) -> bool:
    """Whether ``fxlrp explain`` was given a data set: ``--data``, or one folder as its only input
    (which then becomes ``args.data``). Data-set options given with image files are refused (all but
    ``--device`` and ``--dtype``, which image files take too)."""
    images = list(getattr(args, "images", None) or [])
    if args.data is not None:
        if images:
            raise InputError("give either image files or --data, not both")
        return True
    if len(images) == 1 and Path(images[0]).is_dir():
        args.data, args.images = images[0], []
        return True
    if images and getattr(args, "concepts", None) is not None:
        raise InputError("--concepts applies to data sets (--data): it finds the reference samples of each concept "
                         "over a data set")
    defaults = {"workers": 0, "shard_size": 256, "on_error": "stop", "png": False}  # (--device, --dtype: both)
    given = [name for name, value in defaults.items() if getattr(args, name, value) != value]
    if given and images:
        option = "--" + given[0].replace("_", "-")
        raise InputError(f"{option} applies to data sets (--data), not to image files")
    return False


# ---------------------------------------------------------------------------------------------
# batches


@dataclass
class _Shard(Shard):
    """A shard being filled batch by batch: ``values`` holds its samples' relevance."""

    inputs: dict[int, Tensor] = field(default_factory=dict)
    references: dict[str, ReferenceSamples] = field(default_factory=dict)
    """With ``--concepts``: the reference samples of each node among the shard's samples so far."""


@dataclass
class _Run:
    """What every batch needs."""

    explain: nn.Module
    source: Source
    sample_shape: tuple[int, ...]
    classes: int
    target: int | str | None
    device: torch.device
    dtype: str
    on_error: str
    png: bool
    cmap: str
    compiled: Any = None
    """``fxlrp.compile(explain)`` with ``--compile``."""
    image_shaped: bool = False
    """The model's output is ``[batch, classes, height, width]`` (a segmentation model's): a class
    is explained over the image, and the predicted class is the one whose logits summed over the
    pixels are largest."""
    concepts: _Concepts | None = None
    """``--concepts``."""
    picture_names: list[str] = field(default_factory=list)
    """Each sample's PNG name (:func:`picture_names`), with ``--png``."""


CONCEPTS = "concepts"
"""The folder of the merged reference samples, ``DIR/concepts/NODE.npz``."""
ATLAS_CONCEPTS = 16
"""Concepts shown in a node's atlas picture (``--png``): those whose best reference scores highest."""
ATLAS_SAMPLES = 6
"""Reference samples shown per concept in the atlas."""


@dataclass
class _Concepts:
    """``--concepts``: the nodes, how many concepts each has, and the reference samples kept per concept."""

    nodes: list[str]
    counts: dict[str, int]
    top: int

    def empty(self, dtype: torch.dtype) -> dict[str, ReferenceSamples]:
        return {node: ReferenceSamples.empty(node, ChannelConcept(), self.counts[node], self.top, dtype)
                for node in self.nodes}


def _concept_nodes(args: argparse.Namespace) -> list[str] | None:
    """The nodes of ``--concepts`` (None without it); the option's values checked."""
    if getattr(args, "concepts", None) is None:
        return None
    nodes = [node.strip() for node in args.concepts.split(",")]
    if not all(nodes):
        raise InputError(f"--concepts {args.concepts!r}: give node names separated by commas, e.g. "
                         "--concepts features.2,features.5")
    if args.concepts_top < 1:
        raise InputError(f"--concepts-top must be at least 1, got {args.concepts_top}")
    if getattr(args, "compile", False):
        raise InputError("--concepts records the relevance of nodes inside the model, which a compiled explanation "
                         "does not expose: leave out --compile")
    return list(dict.fromkeys(nodes))


def _probe_concepts(explain: nn.Module, inputs: Tensor, nodes: list[str], top: int) -> _Concepts:
    """The nodes of ``--concepts`` checked on one sample: each names one node that runs and
    carries relevance, with an output ``[batch, channels, ...]``."""
    try:
        found = conditional_relevance(explain, inputs, [{}], record=nodes, target=0, output=explained_output,
                                      check_finite=False)
    except ValueError as error:
        raise InputError(f"--concepts: {error} (fxlrp report MODEL lists the nodes)") from None
    counts = {}
    for node in nodes:
        try:
            counts[node] = ChannelConcept().count(found.activation[node].shape)
        except ValueError as error:
            raise InputError(f"--concepts {node!r}: its output has shape {list(found.activation[node].shape)}, "
                             f"and its concepts are channels, dimension 1 ({error})") from None
    return _Concepts(nodes, counts, top)


def _problem(run: _Run, item: Item) -> str | None:
    """Why ``item`` cannot be explained, or None."""
    if item.error is not None:
        return item.error
    assert item.values is not None
    if tuple(item.values.shape) != run.sample_shape:
        hint = "; pass --size to resize images" if run.source.description.startswith("folder") else ""
        return f"has shape {tuple(item.values.shape)}, the first sample {run.sample_shape}{hint}"
    if run.target == "label":
        if item.label == NO_LABEL:
            return "has no label (it lies directly in the folder, not in a class sub-folder)"
        if not 0 <= item.label < run.classes:
            return f"has label {item.label}, out of range for the model's {run.classes} classes"
    return None


def _scores(run: _Run, output: Tensor) -> Tensor:
    """``[batch, classes]`` scores of the explained output (summed over the pixels of a
    segmentation model's), in float32, or float64 with ``--dtype float64``."""
    output = output.detach()
    return class_scores(output.double() if run.dtype == "float64" else output.float())


def _explain_batch(run: _Run, items: list[Item]) -> tuple[Tensor, Tensor, Tensor, Tensor, list[str | None],
                                                         dict[str, tuple[Tensor, Tensor]]]:
    """Relevance, predictions, targets and explained scores of a batch, in one forward and one
    backward pass (two forward passes for a segmentation model's predicted class), per sample
    why its explanation cannot be used (output or relevance NaN or Inf), or None, and with
    ``--concepts`` the relevance and output of each node."""
    inputs = prepare_inputs(torch.stack([item.values for item in items]), run.device, run.dtype)  # type: ignore[misc]
    outputs: list[Tensor] = []

    def kept(result: Any) -> Tensor:
        output = explained_output(result)
        outputs.append(output)
        return output

    if run.target == "label":
        targets: Any = torch.tensor([item.label for item in items], device=run.device)
    else:
        targets = run.target
    with autocast(run.device, run.dtype):
        if targets is None and run.image_shaped:  # the class over the image, not each pixel's own
            with torch.no_grad():
                targets = _scores(run, explained_output(run.explain(inputs))).argmax(dim=1)
        nodes: dict[str, tuple[Tensor, Tensor]] = {}
        if run.compiled is not None:
            given = None if targets is None else torch.as_tensor(targets, device=run.device).expand(len(items))
            relevance, output = run.compiled(inputs, given, return_output=True)
            outputs.append(output)
        elif run.concepts is not None:  # the same explanation, the nodes' relevance recorded on the way
            found = conditional_relevance(run.explain, inputs, [{}], record=run.concepts.nodes, target=targets,
                                          output=kept, check_finite=False)
            relevance = found.heatmap[0]
            nodes = {node: (found.relevance[node][0].detach(), found.activation[node].detach())
                     for node in run.concepts.nodes}
        else:
            relevance = attribute(run.explain, inputs, target=targets, output=kept, check_finite=False)
    logits = _scores(run, outputs[0])
    predictions = logits.argmax(dim=-1)
    if targets is None:
        targets = predictions
    targets = torch.as_tensor(targets, device=logits.device).expand(len(items))
    scores = logits.gather(1, targets[:, None]).squeeze(1)
    problems = unexplainable(logits, relevance, run.dtype)
    for node, (node_relevance, _) in nodes.items():
        finite = torch.isfinite(node_relevance).flatten(1).all(dim=1).tolist()
        problems = [problem if problem is not None or ok else f"its relevance at --concepts node {node!r} came out "
                    "NaN or Inf" for problem, ok in zip(problems, finite, strict=True)]
    return relevance.detach(), predictions.cpu(), targets.cpu(), scores.cpu(), problems, nodes


def _fill(run: _Run, shard: _Shard, batch: list[Item]) -> None:
    """Explain a batch into its shard; samples that cannot be read or explained are named and
    skipped, or stop the run (``--on-error``). A sample whose explanation comes out NaN or Inf is
    taken out of the batch and the rest explained again without it, so that their relevance is
    that of a batch without it."""
    good: list[Item] = []
    for item in batch:
        problem = _problem(run, item)
        if problem is None:
            good.append(item)
        else:
            shard.refuse(item, run.source.names[item.index], problem, run.on_error, "explained")
    results: dict[int, tuple[Tensor, int, int, float]] = {}
    while good:
        relevance, predictions, targets, scores, problems, nodes = _explain_batch(run, good)
        if any(problem is not None for problem in problems):
            for item, problem in zip(good, problems, strict=True):
                if problem is not None:
                    shard.refuse(item, run.source.names[item.index], problem, run.on_error, "explained")
            good = [item for item, problem in zip(good, problems, strict=True) if problem is None]
            continue
        stored = relevance.float().cpu().numpy().astype(shard.values.dtype, copy=False) if run.dtype != "float64" \
            else relevance.cpu().numpy()
        for row, item in enumerate(good):
            results[item.index] = (stored[row], int(predictions[row]), int(targets[row]), float(scores[row]))
            if run.png:
                shard.inputs[item.index] = item.values  # type: ignore[assignment]
        samples = torch.tensor([item.index for item in good])
        for node, (node_relevance, activation) in nodes.items():
            scored = (node_relevance, activation) if run.dtype == "float64" else \
                (node_relevance.float(), activation.float())
            shard.references[node] = shard.references[node].merged(
                ReferenceSamples.of_batch(node, ChannelConcept(), *scored, samples))
        break
    for item in batch:
        name = run.source.names[item.index]
        if item.index not in results:
            shard.add(item, name)
            continue
        values, prediction, target, score = results[item.index]
        shard.add(item, name, values, prediction, target, score, float(np.sum(values, dtype=np.float64)))


def picture_names(names: Sequence[str]) -> list[str]:
    """The names of the samples' PNGs: each sample's name without its file suffix (``cat/00.png``
    gives ``cat/00.heatmap.png``), the whole name where two samples would share one (``a.png`` and
    ``a.jpg``).

    Parameters
    ----------
    names
        The samples' names (:attr:`fxlrp.app.datasets.Source.names`).

    Returns
    -------
    list of str
        One name per sample, distinct where the names are.
    """
    stems = [str(PurePosixPath(name).with_suffix("")) if PurePosixPath(name).suffix else name for name in names]
    counts = Counter(stems)
    return [stem if counts[stem] == 1 else name for name, stem in zip(names, stems, strict=True)]


def _write_pngs(run: _Run, directory: Path, shard: _Shard) -> None:
    """Heatmap (and, for 1 or 3 channels, overlay) PNGs of a shard's explained samples."""
    from PIL import Image

    from fxlrp.viz import image

    for index, values in shard.inputs.items():
        relevance = shard.values[index - shard.span.start]
        flat = relevance.ndim == 2
        pictures = {"heatmap": image.heatmap(relevance, run.cmap, reduction="none" if flat else "sum")}
        if not flat and values.shape[0] in (1, 3):
            pictures["overlay"] = image.overlay(values.double(), relevance, run.cmap)
        scale = image.readable_scale(*relevance.shape[-2:])
        for kind, rgb in pictures.items():
            path = directory / PNG / f"{run.picture_names[index]}.{kind}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            picture = Image.fromarray(image.enlarge(np.ascontiguousarray(rgb, dtype=np.uint8), scale))
            write_atomic(path, lambda file, picture=picture: picture.save(file, format="PNG"))


# ---------------------------------------------------------------------------------------------
# the command


def run_dataset(args: argparse.Namespace) -> int:
    """``fxlrp explain --data``: returns the exit code; bad input raises :class:`InputError`."""
    check_counts(args)
    if args.out is None:
        raise InputError("the following arguments are required: --out (the directory for the explanations)")
    args.composite = args.composite or "epsilon"
    return on_processes(args, _explain_data_set)


def _settings(args: argparse.Namespace, preprocessing: Preprocessing, data: DataSet,
              device: torch.device) -> dict[str, Any]:
    """What the relevance depends on; a restart with other settings is refused."""
    settings = data.settings(args, preprocessing, device, chosen={"composite": args.composite},
                             more={"png": args.cmap if args.png else None})
    nodes = _concept_nodes(args)
    if nodes is not None:  # (runs without --concepts keep the settings they always had)
        settings["concepts"] = {"nodes": nodes, "top": args.concepts_top}
    return settings


def _explain_data_set(args: argparse.Namespace, device: torch.device, processes: Processes) -> int:
    model, preprocessing = loaded_model(args)
    composite = composite_by_name(args.composite, preprocessing)
    if args.png:
        from fxlrp.viz import image

        try:
            image.colour_map(args.cmap)
        except ValueError as error:
            raise InputError(str(error)) from None
    nodes = _concept_nodes(args)
    data = DataSet.opened(args, preprocessing)
    source, first, sample_shape = data.source, data.first, data.sample_shape
    if args.png and len(sample_shape) not in (2, 3):
        raise InputError(f"--png needs image-shaped samples [channels, height, width]; these are {sample_shape}")
    explain = fxlrp.convert(prepare_model(model, device, args.dtype), composite)
    logits, image_shaped = data.probe(explain, device, args.dtype)
    if image_shaped and getattr(args, "compile", False):
        raise InputError("--compile explains classifiers ([batch, classes] outputs); explain a segmentation model "
                         "without it")
    classes = logits.shape[1]
    concepts = None
    if nodes is not None:
        with autocast(device, args.dtype):
            concepts = _probe_concepts(explain, data.first_inputs(device, args.dtype), nodes, args.concepts_top)
    if isinstance(args.target, int):
        checked_targets(args.target, logits)
    elif args.target == "label" and source.classes is None and first.label == NO_LABEL:
        raise InputError(f"--target label: {source.description} has no labels")

    sharded = data.sharded(args, _settings(args, preprocessing, data, device), processes)
    writer = sharded.writer

    run = _Run(explain, source, sample_shape, classes, args.target, device, args.dtype, args.on_error, args.png,
               args.cmap, image_shaped=image_shaped, concepts=concepts,
               picture_names=picture_names(source.names) if args.png else [],
               compiled=fxlrp.compile(explain, output=explained_output) if getattr(args, "compile", False) else None)
    stored = STORED[args.dtype]

    def start(number: int, span: range) -> _Shard:
        shard = _Shard(number, span, np.zeros((len(span), *sample_shape), dtype=stored))
        if concepts is not None:
            shard.references = concepts.empty(_score_dtype(args.dtype))
        return shard

    def finish(shard: _Shard) -> None:
        if args.png:
            _write_pngs(run, writer.directory, shard)
        if concepts is not None:  # before the shard's rows, which mark it complete
            _write_shard_references(writer, shard)
        writer.write_shard(shard.number, shard.values, shard.rows)

    began = time.monotonic()
    shards, count = sharded.compute(source, args.batch_size, args.workers, start, partial(_fill, run), finish)
    if processes.world_size > 1:
        seconds = time.monotonic() - began
        print(f"fxlrp: process {processes.rank} of {processes.world_size}: {shards} shard(s), {count} samples "
              f"in {seconds:.1f} s ({count / max(seconds, 1e-9):.1f} samples/s)", file=sys.stderr)
    if sharded.finished():
        written = {} if concepts is None else _finish_references(run, writer, args, sample_shape)
        index = writer.write_index(sample_shape, source.classes, written or None)
        skipped = len(index["skipped"])
        skips = f" ({skipped} skipped: listed in index.json)" if skipped else ""
        print(f"explained {len(source) - skipped} of {len(source)} samples{skips} into {writer.directory}: "
              f"{len(writer.ranges)} shard(s) of relevance [{len(source)}, {', '.join(map(str, sample_shape))}] "
              f"{np.dtype(stored).name}{sharded.resumed()}; read them with fxlrp.read_explanations")
        if concepts is not None:
            listed = ", ".join(f"{node} ({concepts.counts[node]} concepts)" for node in concepts.nodes)
            print(f"reference samples of {listed}, {concepts.top} per concept, in {writer.directory / CONCEPTS}; "
                  f"read them with fxlrp.concepts.read_references")
    return 0


# ---------------------------------------------------------------------------------------------
# --concepts: reference samples


def _score_dtype(dtype: str) -> torch.dtype:
    return torch.float64 if dtype == "float64" else torch.float32


def _shard_references_path(writer: ExplanationWriter, shard: int) -> Path:
    return writer.directory / SHARDS / f"concepts-{shard:06d}.npz"


def _write_shard_references(writer: ExplanationWriter, shard: _Shard) -> None:
    """A shard's reference samples of every node, in one ``.npz`` (arrays named ``NODE/ARRAY``)."""
    arrays = {f"{node}/{name}": value for node, references in shard.references.items()
              for name, value in references_arrays(references).items()}
    write_atomic(_shard_references_path(writer, shard.number), lambda file: np.savez(file, **arrays))


def _finish_references(run: _Run, writer: ExplanationWriter, args: argparse.Namespace,
                       sample_shape: tuple[int, ...]) -> dict[str, str]:
    """Merge every shard's references (in shard order: the same whoever computed them), find the
    receptive region of each reference sample of image-shaped data, write ``concepts/NODE.npz``
    (and with ``--png`` an atlas per node); returns each node's file relative to the directory."""
    assert run.concepts is not None
    merged = run.concepts.empty(_score_dtype(args.dtype))
    for shard in range(len(writer.ranges)):
        with np.load(_shard_references_path(writer, shard), allow_pickle=False) as arrays:
            for node in run.concepts.nodes:
                prefix = f"{node}/"
                part = references_of_arrays({name[len(prefix):]: arrays[name] for name in arrays.files
                                             if name.startswith(prefix)})
                merged[node] = merged[node].merged(part)
    folder = writer.directory / CONCEPTS
    folder.mkdir(exist_ok=True)

    def sample(index: int) -> Tensor:
        values = run.source[index].values
        assert values is not None  # a reference sample was explained, so it was read
        return prepare_inputs(values, run.device, run.dtype)

    written = {}
    for node, references in merged.items():
        if len(sample_shape) in (2, 3):
            with autocast(run.device, run.dtype):
                references = with_boxes(run.explain, references, sample, batch_size=args.batch_size)
        path = folder / f"{node}.npz"
        write_atomic(path, lambda file, references=references: save_references(references, file))
        written[node] = str(path.relative_to(writer.directory))
        if args.png and len(sample_shape) == 3 and sample_shape[0] in (1, 3):
            _write_atlas(references, lambda index: run.source[index].values, folder)  # type: ignore[arg-type,return-value]
    return written


def _write_atlas(references: ReferenceSamples, sample: Any, folder: Path) -> None:
    """``NODE.relevance.png`` and ``NODE.activation.png``: the reference crops of the node's
    concepts whose best reference scores highest; dead ones (0 at best: no sample shows them) are
    left out."""
    for mode in ("relevance", "activation"):
        best = getattr(references, mode).scores[:, 0]
        shown = torch.argsort(best, descending=True, stable=True)[:ATLAS_CONCEPTS]
        shown = [int(concept) for concept in shown if torch.isfinite(best[concept]) and best[concept] != 0]
        if not shown:  # no sample explained
            continue
        figure = concept_atlas(references, sample, concept_ids=shown, mode=mode, count=ATLAS_SAMPLES)
        import matplotlib.pyplot as plt  # (concept_atlas chose the Agg backend)
        write_atomic(folder / f"{references.layer}.{mode}.png",
                     lambda file, figure=figure: figure.savefig(file, format="png", bbox_inches="tight", dpi=150))
        plt.close(figure)
