"""The ``fxlrp`` command: ``explain`` images or text, ``evaluate`` composites' faithfulness,
``report`` a model's node/rule table, run the ``demo``.

This module parses the command line without torch (``fxlrp --help`` needs none of it); the
commands are :mod:`fxlrp.app.commands`, imported to run one.

Exit codes: 0 success; 2 bad input (unknown model or composite, missing or unreadable file,
input of the wrong shape, bad option), printed as one line ``fxlrp: error: ...``; 1 the model
cannot be explained (fxlrp's capture or unsupported-operation errors, printed in full).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fxlrp.app.cli_options import COMPOSITE_NAMES, InputError, add_dataset_options
from fxlrp.errors import ExplanationInputError, FxlrpError

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


_IMAGENET = "0.485,0.456,0.406"


def _version() -> str:
    """The installed package's version (without importing fxlrp's package, which imports torch)."""
    from importlib import metadata

    try:
        return metadata.version("fxlrp")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="FILE", help="state dict saved with torch.save(model.state_dict(), FILE)")
    parser.add_argument("--composite", default="epsilon",
                        help=f"rules to use: {', '.join(COMPOSITE_NAMES)} (default: epsilon)")


def build_parser() -> argparse.ArgumentParser:
    """The ``fxlrp`` command's parser (built without torch).

    Returns
    -------
    argparse.ArgumentParser
        Its commands ``explain``, ``evaluate``, ``report`` and ``demo``; errors print one line and exit with 2.
    """
    parser = _Parser(prog="fxlrp", description="Layer-wise Relevance Propagation for PyTorch models via torch.fx.")
    parser.add_argument("--version", action="version", version=f"fxlrp {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser(
        "explain", help="heatmaps for images, coloured tokens for text",
        description="Explain each image's class and write PNGs to --out: NAME.heatmap.png and NAME.overlay.png "
                    "at the image's aspect, NAME.figure.png with a title and a colour bar (or a data set with --data); "
                    "or explain --text with a Hugging Face text model (--model hf:DIR), print its tokens coloured "
                    "by relevance and write --out/explanation.html. A classifier explains a class; a segmentation "
                    "model explains a class over the whole image: the sum of that class's logits over all pixels "
                    "(with --region, over a box of them).")
    explain.add_argument("--model", required=True,
                         help="torchvision:NAME: a classification, segmentation or video model (e.g. "
                              "torchvision:resnet18, torchvision:fcn_resnet50, torchvision:r3d_18; video models "
                              "take .pt/.npy clips [3, frames, height, width]); timm:NAME (e.g. timm:convnext_atto); "
                              "package.module:FACTORY; or hf:DIR: a Hugging Face image classifier, sequence "
                              "classifier or causal language model with its image processor or tokenizer, saved "
                              "with save_pretrained(DIR). Without --weights, models have random weights")
    _add_model_options(explain)
    explain.set_defaults(composite=None)
    explain.add_argument("--target", help="class to explain: an index (default: the predicted class; for a "
                                          "segmentation model the class whose logits summed over the pixels are "
                                          "largest); A,B for image files and a classifier: a contrast, logit A "
                                          "minus logit B (what makes it A rather than B); for hf: text models also "
                                          "a label name, or for a language model one token of its vocabulary "
                                          "(default: the predicted next token)")
    explain.add_argument("--region", type=_floats, metavar="X0,Y0,X1,Y1",
                         help="a segmentation model: explain the class over this box of the image only (x the "
                              "column, y the row, in the image file's pixels, scaled with the image to the model's "
                              "output: the output's pixels whose centres lie in it); the default class is the one "
                              "whose logits summed over the box are largest. Also writes NAME.region.png: the image "
                              "and the heatmap side by side, the box outlined")
    explain.add_argument("--text", action="append", help="text to explain with an hf: model (repeat for several)")
    explain.add_argument("--generate", type=int, metavar="N",
                         help="text with an hf: causal or encoder-decoder language model: generate N tokens after "
                              "each --text (greedy unless --sample) and explain each generated token over the tokens "
                              "before it (prompt and continuation: fxlrp.explain_generation); prints each token's "
                              "strongest context tokens, and with --out writes generation-I.npy (the matrix "
                              "[generated, length]; an encoder-decoder model's over its input: "
                              "generation-I.source.npy), generation-I.html and generation-I.png per text I; with "
                              "--data PROMPTS.txt (one prompt per line) the matrices of every prompt into resumable "
                              "shards in --out")
    explain.add_argument("--sample", action="store_true",
                         help="with --generate: sample the tokens (the model's generation config: temperature, "
                              "top-k, top-p) instead of greedy decoding")
    explain.add_argument("--seed", type=int, help="with --sample: the random seed (default 0), so a run repeats")
    explain.add_argument("--merge-subwords", action="store_true",
                         help="text: show words, each with the summed relevance of its tokens")
    explain.add_argument("--size", type=int,
                         help="resize images to SIZE x SIZE (default: the model's own preprocessing: a torchvision "
                              "model's weights.transforms(), a timm model's data config, an hf: model's image "
                              "processor; images as they are for other models)")
    explain.add_argument("--mean", type=_floats, metavar="M1,M2,...",
                         help=f"per-channel mean for normalisation (x - mean) / std of pixels in [0, 1), one number "
                              f"per channel separated by commas, e.g. {_IMAGENET} (default: the model's own, 0 for "
                              f"other models)")
    explain.add_argument("--std", type=_floats, metavar="S1,S2,...",
                         help="per-channel std, one positive number per channel separated by commas, e.g. "
                              "0.229,0.224,0.225 (default: the model's own, 1 for other models)")
    explain.add_argument("--batch-size", type=int, default=8, help="images per batch (default 8)")
    explain.add_argument("--compile", action="store_true",
                         help="compile the explanation, forward and relevance, with torch.compile (fxlrp.compile): "
                              "tens of seconds per batch shape at the start, the same relevance")
    explain.add_argument("--cmap", default="bwr", help="colour map: bwr, cold_and_hot, seismic, ... (default bwr)")
    explain.add_argument("--out", metavar="DIR", help="directory for the PNGs or explanation.html; required for "
                                                     "image files and --data, optional for --text")
    explain.add_argument("images", nargs="*", metavar="IMAGE",
                         help="image files, or .pt/.npy tensors [C, H, W] (video clips [C, T, H, W])")
    add_dataset_options(explain)

    evaluate = commands.add_parser(
        "evaluate", help="rank composites by how faithful their explanations are on a data set",
        description="Explain every sample of --data with each composite (and a random map), perturb its pixels "
                    "most relevant first and least relevant first, and print the composites ranked by ABPC = "
                    "AUC(LeRF) - AUC(MoRF) with 95%% bootstrap intervals (docs/faithfulness.md). Resumable "
                    "shards in --out, like fxlrp explain --data; also with torchrun --nproc-per-node N -m fxlrp.")
    evaluate.add_argument("--model", required=True,
                          help="an image classifier: torchvision:NAME, timm:NAME or package.module:FACTORY (random "
                               "weights without --weights)")
    evaluate.add_argument("--weights", metavar="FILE",
                          help="state dict saved with torch.save(model.state_dict(), FILE)")
    evaluate.add_argument("--composite", metavar="A,B,C",
                          help=f"composites to compare, separated by commas: {', '.join(COMPOSITE_NAMES)} "
                               f"(default: epsilon,epsilon_plus,epsilon_plus_flat,epsilon_gamma_box)")
    evaluate.add_argument("--target", help="class followed: an index, or 'label' (each sample's label); default: "
                                           "the predicted class")
    evaluate.add_argument("--patch", type=int, default=1, help="perturb PATCH x PATCH squares (default 1: pixels)")
    evaluate.add_argument("--steps", type=int, default=20,
                          help="points of each curve after the start: step j perturbs j/STEPS of the pixels "
                               "(default 20)")
    evaluate.add_argument("--baseline", default="zeros", choices=("zeros", "mean", "blur", "noise"),
                          help="what a perturbed pixel becomes, in the model's input space (default zeros)")
    evaluate.add_argument("--score", default="logit", choices=("logit", "probability"),
                          help="the class's logit (default) or softmax probability")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the random map and the noise baseline")
    evaluate.add_argument("--size", type=int, help="resize images to SIZE x SIZE (default: the model's own)")
    evaluate.add_argument("--mean", type=_floats, metavar="M1,M2,...",
                          help=f"per-channel mean for normalisation, one number per channel separated by commas, "
                               f"e.g. {_IMAGENET}")
    evaluate.add_argument("--std", type=_floats, metavar="S1,S2,...",
                          help="per-channel std, one positive number per channel separated by commas")
    evaluate.add_argument("--batch-size", type=int, default=8, help="samples per batch (default 8)")
    evaluate.add_argument("--out", metavar="DIR", required=True,
                          help="(required) directory for the shards of scores, index.json and evaluation.json")
    add_dataset_options(evaluate, explain=False)

    report = commands.add_parser("report", help="the node/rule table of a model",
                                 description="Print every node of the model with its operation and rule.")
    report.add_argument("model", help="torchvision:NAME, timm:NAME, package.module:FACTORY or hf:DIR (a Hugging "
                                      "Face model saved with save_pretrained(DIR): its report after one "
                                      "explanation of an example input)")
    _add_model_options(report)

    demo = commands.add_parser(
        "demo", help="the README demo: a CNN heatmap, a torchvision model, a scatter GNN",
        description="Three explanations, offline: a small CNN trained for seconds on scikit-learn's bundled digits "
                    "(heatmaps of test digits); a torchvision ResNet-18 with random weights (LRP-0 checked against "
                    "gradient x input); a scatter graph network trained on generated infection graphs (the "
                    "relevance of each node and edge). Writes three PNGs to --out and prints what each shows.")
    demo.add_argument("--out", default="out/demo", metavar="DIR", help="directory for the PNGs (default out/demo)")
    demo.add_argument("--fast", action="store_true", help="fewer training steps (for CI)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fxlrp`` console script.

    Parameters
    ----------
    argv
        The arguments; None: ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code: 0, 2 for bad input (one line ``fxlrp: error: ...``), 1 for a model that
        cannot be explained, 130 when interrupted.
    """
    args = build_parser().parse_args(argv)
    from fxlrp.app.commands import COMMANDS  # torch: not for parsing or --help

    try:
        return COMMANDS[args.command](args)
    except (InputError, ExplanationInputError) as error:  # (the API's refusal of an input: the user's input)
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
