"""``fxlrp evaluate --data SOURCE --model MODEL --composite A,B,C --out DIR``: which composite
explains this model faithfully on this data, ranked by ABPC with confidence intervals.

Each sample is explained with every composite (and a random map, the floor every explanation
should clear) and perturbed along MoRF and LeRF curves (:func:`fxlrp.evaluate.image_curves`);
each shard keeps, per sample and method, the area under the MoRF curve, under the LeRF curve and
their difference ABPC. The data-set machinery is ``fxlrp explain --data``'s
(:mod:`fxlrp.app.sharded_run`): the same sources, batches within shards, atomic shard files, a
restart that computes only the missing shards, and torchrun processes sharing the shards. When
all are done the first process writes ``index.json`` and ``evaluation.json`` and prints the table:
mean ABPC per method with its 95% percentile bootstrap interval over the samples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import fxlrp
from fxlrp.app.cli_options import InputError
from fxlrp.app.composites import composite_by_name
from fxlrp.app.datasets import NO_LABEL, Item
from fxlrp.app.devices import autocast, prepare_inputs, prepare_model
from fxlrp.app.distributed import Processes
from fxlrp.app.explanations_store import SHARDS, shard_name, write_json
from fxlrp.app.outputs import explained_output
from fxlrp.app.sharded_run import DataSet, Shard, check_counts, loaded_model, on_processes
from fxlrp.evaluate import EvaluationInputError, image_curves, ranked, table
from fxlrp.explain.attribute import attribute

RANDOM = "random"
"""The row of a random map (Gaussian, seeded per sample): ABPC about 0."""
SUMMARIES = ("auc_morf", "auc_lerf", "abpc")
"""What a shard keeps per sample and method, in this order along its last dimension."""
DEFAULT_COMPOSITES = "epsilon,epsilon_plus,epsilon_plus_flat,epsilon_gamma_box"


def _methods(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise InputError(f"--composite {text!r}: give composite names separated by commas, e.g. "
                         f"--composite epsilon,epsilon_plus_flat")
    return list(dict.fromkeys(names))


def _settings(args: argparse.Namespace, methods: list[str], preprocessing: Any, data: DataSet,
              device: torch.device) -> dict[str, Any]:
    """What the scores depend on; a restart with other settings is refused."""
    curves = {"patch": args.patch, "steps": args.steps, "baseline": args.baseline, "score": args.score,
              "seed": args.seed}
    return {"command": "evaluate",
            **data.settings(args, preprocessing, device, chosen={"methods": methods}, more={"curves": curves})}


def _random_maps(indices: list[int], shape: tuple[int, ...], seed: int) -> Tensor:
    """A Gaussian map per sample, seeded by the sample's index: the same whichever batch or process."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1_000_003 + index),
                                    dtype=torch.float64) for index in indices])


def _evaluate_batch(args: argparse.Namespace, model: torch.nn.Module, explainers: dict[str, torch.nn.Module],
                    items: list[Item], device: torch.device) -> tuple[np.ndarray, Tensor, Tensor, list[str | None]]:
    """Per sample and method the AUCs and ABPC ``[batch, methods, 3]``, the predictions and targets,
    and why a sample's scores cannot be used (relevance NaN or Inf under a composite) or None."""
    inputs = prepare_inputs(torch.stack([item.values for item in items]), device, args.dtype)  # type: ignore[misc]
    with torch.no_grad(), autocast(device, args.dtype):
        logits = explained_output(model(inputs)).float()
    predictions = logits.argmax(dim=1)
    if args.target == "label":
        targets = torch.tensor([item.label for item in items], device=device)
    elif args.target is None:
        targets = predictions
    else:
        targets = torch.full((len(items),), args.target, device=device)
    found = np.zeros((len(items), len(explainers) + 1, len(SUMMARIES)))
    problems: list[str | None] = [None] * len(items)
    maps = {name: None for name in explainers} | {RANDOM: None}
    for name, explain in explainers.items():
        with autocast(device, args.dtype):
            relevance = attribute(explain, inputs, target=targets, output=explained_output, check_finite=False)
        finite = torch.isfinite(relevance).flatten(1).all(dim=1).tolist()
        for row, ok in enumerate(finite):
            if not ok and problems[row] is None:
                problems[row] = f"its relevance under {name} came out NaN or Inf"
        maps[name] = torch.nan_to_num(relevance.detach(), nan=0.0, posinf=0.0, neginf=0.0)
    maps[RANDOM] = _random_maps([item.index for item in items], tuple(inputs.shape[1:]), args.seed)
    for column, relevance in enumerate(maps.values()):
        with autocast(device, args.dtype):
            curves = image_curves(model, inputs, relevance, targets, patch=args.patch, steps=args.steps,
                                  baseline=args.baseline, seed=args.seed, score=args.score,
                                  batch_size=args.batch_size * (args.steps + 1), progress=False)
        found[:, column] = torch.stack([curves.auc("morf"), curves.auc("lerf"), curves.abpc()], dim=1).cpu().numpy()
    return found, predictions.cpu(), targets.cpu(), problems


def _fill(args: argparse.Namespace, model: torch.nn.Module, explainers: dict[str, torch.nn.Module],
          sample_shape: tuple[int, ...], source: Any, device: torch.device, shard: Shard, batch: list[Item]) -> None:
    """A batch's scores into its shard's array and rows; samples that cannot be read or explained
    stop the run or are skipped (``--on-error``), their scores NaN."""
    def refuse(item: Item, problem: str) -> None:
        shard.refuse(item, source.names[item.index], problem, args.on_error, "evaluated")

    good = []
    for item in batch:
        problem = item.error
        if problem is None and tuple(item.values.shape) != sample_shape:  # type: ignore[union-attr]
            problem = f"has shape {tuple(item.values.shape)}, the first sample {sample_shape}"  # type: ignore[union-attr]
        if problem is None and args.target == "label" and item.label == NO_LABEL:
            problem = "has no label (it lies directly in the folder, not in a class sub-folder)"
        if problem is None:
            good.append(item)
        else:
            refuse(item, problem)
    results: dict[int, tuple[np.ndarray, int, int]] = {}
    if good:
        found, predictions, targets, problems = _evaluate_batch(args, model, explainers, good, device)
        for row, item in enumerate(good):
            if problems[row] is not None:
                refuse(item, problems[row])  # type: ignore[arg-type]
            else:
                results[item.index] = (found[row], int(predictions[row]), int(targets[row]))
    for item in batch:
        shard.add(item, source.names[item.index], *results.get(item.index, ()))


def read_scores(directory: Path, methods: list[str]) -> dict[str, np.ndarray]:
    """Every shard's ``[samples, methods, 3]`` scores, per method and summary, skipped samples left out."""
    index = json.loads((directory / "index.json").read_text())
    scores = np.concatenate([np.load(directory / shard["file"], allow_pickle=False) for shard in index["shards"]])
    kept = np.isfinite(scores).all(axis=(1, 2))
    return {name: scores[kept, column] for column, name in enumerate(methods)}


def run_evaluate(args: argparse.Namespace) -> int:
    """``fxlrp evaluate``: the ranked table of composites; returns the exit code (bad input raises
    :class:`InputError`)."""
    check_counts(args, ("--patch", args.patch, 1), ("--steps", args.steps, 1))
    return on_processes(args, _evaluate_data_set)


def _evaluate_data_set(args: argparse.Namespace, device: torch.device, processes: Processes) -> int:
    names = _methods(args.composite or DEFAULT_COMPOSITES)
    if RANDOM in names:
        raise InputError(f"--composite {RANDOM!r}: the random map is always evaluated; name composites only")
    model, preprocessing = loaded_model(args)
    composites = {name: composite_by_name(name, preprocessing) for name in names}
    data = DataSet.opened(args, preprocessing)
    source, sample_shape = data.source, data.sample_shape
    if len(sample_shape) != 3:
        raise InputError(f"fxlrp evaluate perturbs images [channels, height, width]; these samples are "
                         f"{list(sample_shape)}")
    model = prepare_model(model, device, args.dtype).eval()
    explainers = {name: fxlrp.convert(model, composite) for name, composite in composites.items()}
    logits, image_shaped = data.probe(model, device, args.dtype)
    if image_shaped:
        raise InputError("fxlrp evaluate follows a class score along perturbation curves: it takes classifiers "
                         "([batch, classes] outputs), not segmentation models")
    if isinstance(args.target, int) and not 0 <= args.target < logits.shape[1]:
        raise InputError(f"--target {args.target} is out of range: the model has {logits.shape[1]} classes")
    methods = [*names, RANDOM]
    sharded = data.sharded(args, _settings(args, methods, preprocessing, data, device), processes)
    writer = sharded.writer

    def start(number: int, span: range) -> Shard:
        return Shard(number, span, np.zeros((len(span), len(methods), len(SUMMARIES))))

    def fill(shard: Shard, batch: list[Item]) -> None:
        try:
            _fill(args, model, explainers, sample_shape, source, device, shard, batch)
        except EvaluationInputError as error:
            raise InputError(str(error)) from None

    sharded.compute(source, args.batch_size, args.workers, start, fill,
                    lambda shard: writer.write_shard(shard.number, shard.values, shard.rows))
    if sharded.finished():
        index = writer.write_index([len(methods), len(SUMMARIES)], source.classes)
        by_method = read_scores(writer.directory, methods)
        rows_ranked = ranked({name: values[:, 2] for name, values in by_method.items()})
        summary = {"methods": methods, "summaries": list(SUMMARIES), "interval": "95% percentile bootstrap",
                   "ranked": [{"method": name, "abpc": interval.mean, "low": interval.low, "high": interval.high,
                               "samples": interval.samples,
                               "auc_morf": float(by_method[name][:, 0].mean()),
                               "auc_lerf": float(by_method[name][:, 1].mean())} for name, interval in rows_ranked]}
        write_json(writer.directory / "evaluation.json", summary)
        skipped = f", {len(index['skipped'])} skipped (listed in index.json)" if index["skipped"] else ""
        print(f"ABPC = AUC(LeRF) - AUC(MoRF) of the {args.score} of the explained class, {args.baseline} baseline, "
              f"{args.steps} steps of {'pixels' if args.patch == 1 else f'{args.patch}x{args.patch} patches'}; "
              f"mean over {len(source) - len(index['skipped'])} samples{skipped} with its 95% bootstrap interval "
              f"(larger is more faithful){sharded.resumed()}")
        print(table(rows_ranked))
        print(f"-> {writer.directory / 'evaluation.json'}; per-sample scores in {writer.directory / SHARDS}/"
              f"{shard_name(0)}.npy ... [samples, methods, ({', '.join(SUMMARIES)})]")
    return 0
