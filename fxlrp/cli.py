"""The ``fxlrp`` command: ``explain`` images, ``report`` a model's node/rule table, run the ``demo``.

Exit codes: 0 success; 2 bad input (unknown model or composite, missing or unreadable file,
input of the wrong shape, bad option), printed as one line ``fxlrp: error: ...``; 1 the model
cannot be explained (fxlrp's capture or unsupported-operation errors, printed in full).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from fxlrp.cli_inputs import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    InputError,
    Preprocessing,
    check_inputs,
    composite_by_name,
    composite_names,
    first_layer_channels,
    load_model,
    stack_inputs,
)
from fxlrp.errors import FxlrpError
from fxlrp.explain_dataset import add_dataset_options, explains_data_set, run_dataset

BAD_INPUT = 2
CANNOT_EXPLAIN = 1


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and the bad-input exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"fxlrp: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(BAD_INPUT)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="FILE", help="state dict saved with torch.save(model.state_dict(), FILE)")
    parser.add_argument("--composite", default="epsilon",
                        help=f"rules to use: {', '.join(composite_names())} (default: epsilon)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fxlrp", description="Layer-wise Relevance Propagation for PyTorch models via torch.fx.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser("explain", help="heatmaps for images",
                                  description="Explain each image's class and write heatmap PNGs to --out.")
    explain.add_argument("--model", required=True,
                         help="torchvision:NAME (e.g. torchvision:resnet18) or package.module:FACTORY")
    _add_model_options(explain)
    explain.add_argument("--target", type=int, help="class to explain (default: each image's predicted class)")
    explain.add_argument("--size", type=int, help="resize images to SIZE x SIZE (default 224 for torchvision)")
    explain.add_argument("--mean", type=_floats, help="per-channel mean for normalisation (default: ImageNet "
                                                      "for torchvision, 0 otherwise)")
    explain.add_argument("--std", type=_floats, help="per-channel std (default: ImageNet for torchvision, 1)")
    explain.add_argument("--batch-size", type=int, default=8, help="images per batch (default 8)")
    explain.add_argument("--cmap", default="bwr", help="colour map: bwr, cold_and_hot, seismic, ... (default bwr)")
    explain.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs")
    explain.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or .pt/.npy tensors [C, H, W]")
    add_dataset_options(explain)

    report = commands.add_parser("report", help="the node/rule table of a model",
                                 description="Print every node of the model with its operation and rule.")
    report.add_argument("model", help="torchvision:NAME or package.module:FACTORY")
    _add_model_options(report)

    demo = commands.add_parser("demo", help="the README demo: a CNN heatmap, a torchvision model, a scatter GNN")
    demo.add_argument("--out", default="out/demo", metavar="DIR", help="directory for the PNGs (default out/demo)")
    demo.add_argument("--fast", action="store_true", help="fewer training steps (for CI)")
    return parser


def _preprocessing(args: argparse.Namespace, model: torch.nn.Module) -> Preprocessing:
    channels = first_layer_channels(model)
    from_torchvision = args.model.startswith("torchvision:")
    imagenet = from_torchvision and channels == 3
    size = getattr(args, "size", None) or (224 if from_torchvision else None)
    mean = getattr(args, "mean", None) or (IMAGENET_MEAN if imagenet else (0.0,) * channels)
    std = getattr(args, "std", None) or (IMAGENET_STD if imagenet else (1.0,) * channels)
    for name, values in (("--mean", mean), ("--std", std)):
        if len(values) != channels:
            raise InputError(f"{name} has {len(values)} values; the model takes {channels} channels")
    if any(value <= 0 for value in std):
        raise InputError("--std values must be positive")
    if size is not None and size < 1:
        raise InputError(f"--size must be positive, got {size}")
    return Preprocessing(size, channels, tuple(mean), tuple(std))


def _convert(model: torch.nn.Module, composite: object) -> torch.nn.Module:
    import fxlrp

    return fxlrp.convert(model, composite)


def run_report(args: argparse.Namespace) -> int:
    model = load_model(args.model, args.weights)
    args.size = args.mean = args.std = None
    composite = composite_by_name(args.composite, _preprocessing(args, model))
    print(_convert(model, composite).report())
    return 0


def _output_names(paths: Sequence[str]) -> list[str]:
    """File stems, numbered where two inputs share one."""
    names: list[str] = []
    for path in paths:
        stem, number = Path(path).stem, 1
        name = stem
        while name in names:
            number += 1
            name = f"{stem}_{number}"
        names.append(name)
    return names


def run_explain(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fxlrp import image
    from fxlrp.explainer import attribute

    if explains_data_set(args):
        return run_dataset(args)
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be positive, got {args.batch_size}")
    model = load_model(args.model, args.weights)
    preprocessing = _preprocessing(args, model)
    composite = composite_by_name(args.composite, preprocessing)
    try:
        image.colour_map(args.cmap)
    except ValueError as error:
        raise InputError(str(error)) from None
    check_inputs(args.images, preprocessing)
    explain = _convert(model, composite)
    _run_model(explain, stack_inputs(args.images[:1], preprocessing), args.images[:1])
    out = Path(args.out)
    names = _output_names(args.images)
    lines = []
    with tqdm(total=len(args.images), unit="image", desc="explaining", file=sys.stderr,
              disable=None) as progress:
        for start in range(0, len(args.images), args.batch_size):
            paths = args.images[start:start + args.batch_size]
            inputs = stack_inputs(paths, preprocessing)
            logits = _run_model(explain, inputs, paths)
            targets = _targets(args.target, logits)
            relevance = attribute(explain, inputs, target=targets)
            heatmaps = image.heatmap(relevance, args.cmap)
            overlays = image.overlay(inputs, relevance, args.cmap)
            scale = max(1, 128 // max(inputs.shape[-2:]))
            for index, name in enumerate(names[start:start + len(paths)]):
                image.save_png(heatmaps[index], out / f"{name}.heatmap.png", scale)
                image.save_png(overlays[index], out / f"{name}.overlay.png", scale)
                target = int(targets[index])
                lines.append(f"{paths[index]}: class {target} (output {logits[index, target]:.3g}), "
                             f"relevance sum {relevance[index].sum():.3g} -> {out / name}.heatmap.png")
            progress.update(len(paths))
    print("\n".join(lines))
    return 0


def _run_model(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> torch.Tensor:
    try:
        with torch.no_grad():
            logits = explain(inputs)
    except RuntimeError as error:
        detail = str(error).strip().splitlines()[0][:200]
        raise InputError(f"the model cannot take {paths[0]!r} (input shape {tuple(inputs.shape[1:])}): "
                         f"{detail}; check --size and the image") from None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise InputError("fxlrp explain needs a classifier returning [batch, classes] scores")
    return logits


def _targets(target: int | None, logits: torch.Tensor) -> torch.Tensor:
    classes = logits.shape[1]
    if target is None:
        return logits.argmax(dim=1)
    if not 0 <= target < classes:
        raise InputError(f"--target {target} is out of range: the model has {classes} classes (0..{classes - 1})")
    return torch.full((logits.shape[0],), target, dtype=torch.long)


def run_demo(args: argparse.Namespace) -> int:
    from fxlrp.demo import run

    run(Path(args.out), fast=args.fast)
    return 0


COMMANDS = {"explain": run_explain, "report": run_report, "demo": run_demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fxlrp`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except InputError as error:
        print(f"fxlrp: error: {error}", file=sys.stderr)
        return BAD_INPUT
    except FxlrpError as error:
        print(f"fxlrp: the model cannot be explained: {error}", file=sys.stderr)
        return CANNOT_EXPLAIN
    except KeyboardInterrupt:
        print("fxlrp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
