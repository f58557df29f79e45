"""The ``fxlrp`` command: ``explain`` images or text, ``report`` a model's node/rule table, run the ``demo``.

Exit codes: 0 success; 2 bad input (unknown model or composite, missing or unreadable file,
input of the wrong shape, bad option), printed as one line ``fxlrp: error: ...``; 1 the model
cannot be explained (fxlrp's capture or unsupported-operation errors, printed in full).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import fxlrp
from fxlrp.app.cli_inputs import (
    InputError,
    Preprocessing,
    _first_sentence,
    _preprocessing,
    _run_model,
    _targets,
    check_inputs,
    composite_by_name,
    composite_names,
    load_model,
    stack_inputs,
)
from fxlrp.app.explain_dataset import add_dataset_options, explains_data_set, run_dataset
from fxlrp.errors import FxlrpError
from fxlrp.explain.attribute import attribute
from fxlrp.explain.compiled import compile as fxlrp_compile
from fxlrp.viz import text

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

    explain = commands.add_parser(
        "explain", help="heatmaps for images, coloured tokens for text",
        description="Explain each image's class and write heatmap PNGs to --out; or explain --text with a "
                    "Hugging Face model (--model hf:DIR), print its tokens coloured by relevance and write "
                    "--out/explanation.html.")
    explain.add_argument("--model", required=True,
                         help="torchvision:NAME (e.g. torchvision:resnet18), package.module:FACTORY, or hf:DIR: "
                              "a Hugging Face sequence classifier or causal language model and its tokenizer, "
                              "saved with save_pretrained(DIR)")
    _add_model_options(explain)
    explain.set_defaults(composite=None)
    explain.add_argument("--target", help="class to explain: an index (default: the predicted class); for hf: "
                                          "models also a label name, or for a language model a token (default: "
                                          "the predicted next token)")
    explain.add_argument("--text", action="append", help="text to explain with an hf: model (repeat for several)")
    explain.add_argument("--merge-subwords", action="store_true",
                         help="text: show words, each with the summed relevance of its tokens")
    explain.add_argument("--size", type=int, help="resize images to SIZE x SIZE (default 224 for torchvision)")
    explain.add_argument("--mean", type=_floats, help="per-channel mean for normalisation (default: ImageNet "
                                                      "for torchvision, 0 otherwise)")
    explain.add_argument("--std", type=_floats, help="per-channel std (default: ImageNet for torchvision, 1)")
    explain.add_argument("--batch-size", type=int, default=8, help="images per batch (default 8)")
    explain.add_argument("--compile", action="store_true",
                         help="compile the explanation, forward and relevance, with torch.compile (fxlrp.compile): "
                              "tens of seconds per batch shape at the start, the same relevance")
    explain.add_argument("--cmap", default="bwr", help="colour map: bwr, cold_and_hot, seismic, ... (default bwr)")
    explain.add_argument("--out", metavar="DIR", help="directory for the PNGs (required for images) or "
                                                     "explanation.html")
    explain.add_argument("images", nargs="*", metavar="IMAGE", help="image files, or .pt/.npy tensors [C, H, W]")
    add_dataset_options(explain)

    report = commands.add_parser("report", help="the node/rule table of a model",
                                 description="Print every node of the model with its operation and rule.")
    report.add_argument("model", help="torchvision:NAME or package.module:FACTORY")
    _add_model_options(report)

    demo = commands.add_parser("demo", help="the README demo: a CNN heatmap, a torchvision model, a scatter GNN")
    demo.add_argument("--out", default="out/demo", metavar="DIR", help="directory for the PNGs (default out/demo)")
    demo.add_argument("--fast", action="store_true", help="fewer training steps (for CI)")
    return parser


def _convert(model: torch.nn.Module, composite: object) -> torch.nn.Module:
    return fxlrp.convert(model, composite)


def run_report(args: argparse.Namespace) -> int:
    if args.model.startswith(HF_PREFIX):
        raise InputError("fxlrp report takes torchvision:NAME or package.module:FACTORY; explain an hf: model "
                         "with fxlrp explain --model hf:DIR --text TEXT")
    model = load_model(args.model, args.weights)
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

    from fxlrp.viz import image

    if args.compile and (args.text is not None or args.model.startswith(HF_PREFIX)):
        raise InputError("--compile explains images and data sets, not --text")
    if args.text is not None or args.model.startswith(HF_PREFIX):
        return run_explain_text(args)
    if explains_data_set(args):
        return run_dataset(args)
    if args.out is None:
        raise InputError("the following arguments are required: --out")
    if not args.images:
        raise InputError("the following arguments are required: IMAGE (image files to explain)")
    target = _class_index(args.target)
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be positive, got {args.batch_size}")
    model = load_model(args.model, args.weights)
    preprocessing = _preprocessing(args, model)
    composite = composite_by_name(args.composite or "epsilon", preprocessing)
    try:
        image.colour_map(args.cmap)
    except ValueError as error:
        raise InputError(str(error)) from None
    check_inputs(args.images, preprocessing)
    explain = _convert(model, composite)
    compiled = fxlrp_compile(explain) if args.compile else None
    out = Path(args.out)  # (the first batch's _run_model fails before anything is written)
    names = _output_names(args.images)
    lines = []
    with tqdm(total=len(args.images), unit="image", desc="explaining", file=sys.stderr,
              disable=None) as progress:
        for start in range(0, len(args.images), args.batch_size):
            paths = args.images[start:start + args.batch_size]
            inputs = stack_inputs(paths, preprocessing)
            if compiled is not None:  # one pass gives the scores and the relevance
                if start == 0:  # errors in the user's terms (input shape, target) before compiling
                    _targets(target, _run_model(explain, inputs[:1], paths))
                given = None if target is None else torch.full((len(paths),), target)
                relevance, logits = compiled(inputs, given, return_output=True)
                targets = _targets(target, logits)
            else:
                logits = _run_model(explain, inputs, paths)
                targets = _targets(target, logits)
                relevance = attribute(explain, inputs, target=targets)
            heatmaps = image.heatmap(relevance, args.cmap)
            overlays = image.overlay(inputs, relevance, args.cmap)
            scale = max(1, 128 // max(inputs.shape[-2:]))
            for index, name in enumerate(names[start:start + len(paths)]):
                image.save_png(heatmaps[index], out / f"{name}.heatmap.png", scale)
                image.save_png(overlays[index], out / f"{name}.overlay.png", scale)
                explained = int(targets[index])  # (not `target`: the next batch needs the option)
                lines.append(f"{paths[index]}: class {explained} (output {logits[index, explained]:.3g}), "
                             f"relevance sum {relevance[index].sum():.3g} -> {out / name}.heatmap.png")
            progress.update(len(paths))
    print("\n".join(lines))
    return 0


def _class_index(target: str | None) -> int | None:
    if target is None:
        return None
    try:
        return int(target)
    except ValueError:
        raise InputError(f"--target {target!r} is not a class index (a whole number)") from None


# ---------------------------------------------------------------------------------------------
# text: Hugging Face models saved with save_pretrained

HF_PREFIX = "hf:"
_HF_MODELS = (("ForSequenceClassification", "AutoModelForSequenceClassification"),
              ("ForCausalLM", "AutoModelForCausalLM"), ("LMHeadModel", "AutoModelForCausalLM"))


_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class Pretrained:
    """What a ``save_pretrained`` directory holds, read before the weights: the config, the Auto
    class the config's ``architectures`` call for, the tokenizer."""

    directory: Path
    config: Any
    loader: str
    tokenizer: Any

    @property
    def causal(self) -> bool:
        return self.loader == "AutoModelForCausalLM"

    @property
    def outputs(self) -> int:
        """Number of logits: classes of a classifier, the vocabulary of a language model."""
        return int(self.config.vocab_size if self.causal else self.config.num_labels)

    def load_model(self) -> torch.nn.Module:
        """The model in float32 and eval mode (transformers' loading progress bar kept quiet)."""
        import transformers
        from transformers.utils import logging

        quiet = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            model = getattr(transformers, self.loader).from_pretrained(self.directory, local_files_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable model gets the same one-line answer
            raise InputError(f"cannot load the model in {str(self.directory)!r}: {_first_sentence(error)}") from None
        finally:
            if quiet:
                logging.enable_progress_bar()
        return model.float().eval()


def open_pretrained(directory: str) -> Pretrained:
    """The config and tokenizer of a directory written by ``model.save_pretrained(DIR)`` and
    ``tokenizer.save_pretrained(DIR)``: a sequence classifier (``...ForSequenceClassification``)
    or a causal language model (``...ForCausalLM``, ``...LMHeadModel``). No downloads."""
    path = Path(directory)
    if not directory:
        raise InputError("--model hf: needs a directory: hf:DIR, where model.save_pretrained(DIR) wrote the model")
    if not path.is_dir():
        raise InputError(f"model directory {directory!r} does not exist")
    if not (path / "config.json").is_file():
        raise InputError(f"{directory!r} has no config.json; save the model there with model.save_pretrained(DIR)")
    try:
        import transformers
    except ImportError:
        raise InputError("hf: models need the transformers package: pip install 'fxlrp[text]'") from None
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read {str(path / 'config.json')!r}: {_first_sentence(error)}") from None
    architectures = list(getattr(config, "architectures", None) or [])
    loader = next((auto for name in architectures for suffix, auto in _HF_MODELS if name.endswith(suffix)), None)
    if loader is None:
        raise InputError(f"the model in {directory!r} is {', '.join(architectures) or 'of no named architecture'}; "
                         f"fxlrp explain --text takes sequence classifiers (...ForSequenceClassification) and "
                         f"causal language models (...ForCausalLM)")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise InputError(f"no tokenizer in {directory!r}; save it there with tokenizer.save_pretrained(DIR)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read the tokenizer in {directory!r}: {_first_sentence(error)}") from None
    return Pretrained(path, config, loader, tokenizer)


def _text_target(target: str | None, pretrained: Pretrained) -> int | None:
    """``--target`` as an index of the logits: a number, a label name (classifiers) or a token
    (language models); None without one (the highest logit)."""
    if target is None:
        return None
    size, tokenizer = pretrained.outputs, pretrained.tokenizer
    if target.lstrip("-").isdigit():
        index = int(target)
        if not 0 <= index < size:
            what = "token ids" if pretrained.causal else "classes"
            raise InputError(f"--target {index} is out of range: the model has {size} {what} (0..{size - 1})")
        return index
    if not pretrained.causal:
        names = getattr(pretrained.config, "id2label", None) or {}
        labels = {str(label): int(index) for index, label in names.items()}
        folded = {label.lower(): index for label, index in labels.items()}
        if target in labels or target.lower() in folded:
            return labels.get(target, folded.get(target.lower(), 0))
        raise InputError(f"--target {target!r} is neither a class index (0..{size - 1}) nor a label of the model "
                         f"({', '.join(labels) or 'it names none'})")
    if target in tokenizer.get_vocab():
        return int(tokenizer.convert_tokens_to_ids(target))
    ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InputError(f"--target {target!r} is {len(ids)} tokens ({' '.join(tokenizer.convert_ids_to_tokens(ids))})"
                         f"; give one token or a token id")
    return int(ids[0])


def run_explain_text(args: argparse.Namespace) -> int:
    if not args.model.startswith(HF_PREFIX):
        raise InputError(f"--text needs a Hugging Face model, --model hf:DIR (got {args.model!r})")
    if not args.text:
        raise InputError("hf: models explain text: pass --text TEXT")
    if args.images:
        raise InputError(f"give --text or image files, not both (got {args.images[0]!r})")
    if args.weights is not None:
        raise InputError("--weights is for torchvision and factory models; hf:DIR has its weights in DIR")
    if any(not sentence.strip() for sentence in args.text):
        raise InputError("--text is empty")
    composite_name = args.composite or "attnlrp"
    if composite_name.lower().replace("-", "_") == "epsilon_gamma_box":
        raise InputError("epsilon_gamma_box needs the value range of image pixels; for text use attnlrp, cplrp "
                         "or epsilon")
    composite = composite_by_name(composite_name, Preprocessing(None, 1, (0.0,), (1.0,)))
    pretrained = open_pretrained(args.model[len(HF_PREFIX):])
    tokenizer, limit = pretrained.tokenizer, getattr(pretrained.config, "max_position_embeddings", None)
    inputs = [tokenizer(sentence, return_tensors="pt")["input_ids"] for sentence in args.text]
    for sentence, ids in zip(args.text, inputs, strict=True):
        if limit is not None and ids.shape[1] > limit:
            raise InputError(f"the text {sentence[:30]!r}... has {ids.shape[1]} tokens; the model takes at most "
                             f"{limit}")
    target = _text_target(args.target, pretrained)
    model = pretrained.load_model()
    explain = _convert(model, composite)
    fragments, lines = [], []
    for sentence, ids in zip(args.text, inputs, strict=True):
        try:
            with torch.no_grad():
                logits = model(input_ids=ids).logits
        except (RuntimeError, IndexError, ValueError) as error:
            raise InputError(f"the model cannot take the text {sentence[:30]!r}: {_first_sentence(error)}") from None
        logits = logits[0, -1] if logits.dim() == 3 else logits[0]
        explained = int(logits.argmax()) if target is None else target
        relevance = attribute(explain, ids, target=explained)[0]
        if pretrained.causal:
            what = f"next token {tokenizer.convert_ids_to_tokens(explained)!r} (id {explained}, "
        else:
            what = f"class {explained} {model.config.id2label.get(explained, explained)!r} ("
        heading = f"{what}logit {logits[explained]:.4g}), relevance sum {relevance.sum():.4g}, {composite_name}"
        tokens = text.tokens_of(tokenizer, ids[0])
        lines += [heading, text.terminal(tokens, relevance, merge_subwords=args.merge_subwords)]
        fragments.append(text.html(tokens, relevance, merge_subwords=args.merge_subwords, title=heading))
    if args.out is not None:
        path = text.save_html(Path(args.out) / "explanation.html", *fragments,
                              title=f"fxlrp: {pretrained.directory.name}")
        lines.append(f"-> {path}")
    print("\n".join(lines))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from fxlrp.app.demo import run

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
