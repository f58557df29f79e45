"""What the ``fxlrp`` command's parser needs, without torch: the error of a bad input, the composite
names, the data-set options. ``fxlrp --help`` imports this module and :mod:`fxlrp.app.cli` only;
the commands (:mod:`fxlrp.app.commands`) import torch when one runs.
"""

from __future__ import annotations

import argparse

from fxlrp.errors import FxlrpError

HF_PREFIX = "hf:"
"""``--model hf:DIR``: a Hugging Face model saved with ``save_pretrained``."""

COMPOSITE_NAMES = ("epsilon", "lrp0", "epsilon_plus", "epsilon_plus_flat", "epsilon_alpha2_beta1",
                   "epsilon_alpha2_beta1_flat", "epsilon_gamma_box", "attnlrp", "cplrp")
"""The composite names the command line accepts (:func:`fxlrp.app.composites.composite_by_name`)."""

DTYPES = ("float32", "bfloat16", "float16", "float64")
"""``--dtype`` of a data-set run."""


class InputError(FxlrpError):
    """A command-line input (model, weights, composite, image) that cannot be used."""


def first_sentence(error: Exception) -> str:
    """A library's error as the end of a one-line message: its first sentence on one line, at
    most 160 characters (its type's name where it has no text)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.split(". ")[0][:160]


def one_line(text: str) -> str:
    """``text`` on one line, its runs of white space made single spaces."""
    return " ".join(str(text).split())


def add_dataset_options(parser: argparse.ArgumentParser, explain: bool = True) -> None:
    """The options of ``fxlrp explain`` (and ``fxlrp evaluate``) for data sets, devices and precision.

    Parameters
    ----------
    parser
        The command's parser; the options go into a group of their own.
    explain
        Also the options only ``explain`` has (``--png``, ``--concepts``); ``evaluate`` takes the
        others: the data, shards, workers, errors, device and precision.
    """
    what = "explain a whole data set into" if explain else "evaluate over a whole data set, its scores in"
    group = parser.add_argument_group("data sets", f"{what} resumable .npy shards "
                                      "(see docs/datasets.md); also with torchrun --nproc-per-node N -m fxlrp")
    group.add_argument("--data", metavar="SOURCE", required=not explain,
                       help="a folder of images (searched recursively; class sub-folders give labels), a .pt/.npy "
                            "tensor file with samples along the first dimension, or package.module:FACTORY "
                            "returning a torch.utils.data.Dataset; --out then receives shards and index.json")
    group.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    group.add_argument("--shard-size", type=int, default=256, help="samples per shard file (default 256)")
    group.add_argument("--on-error", choices=("stop", "skip"), default="stop",
                       help="a sample that cannot be read or explained (a damaged file, NaN or Inf in it or in its "
                            "explanation, another size, no label): stop with an error naming it (default), or "
                            "skip it (named on stderr and listed in index.json with its reason, its relevance "
                            "NaN) and explain the rest")
    group.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps (image files too)")
    group.add_argument("--dtype", default="float32", choices=DTYPES,
                       help="float32 (default); bfloat16 or float16 run the model under autocast; float64 "
                            "converts model and inputs (image files too)")
    if not explain:
        return
    group.add_argument("--png", action="store_true", help="also write heatmap (and overlay) PNGs to DIR/png")
    group.add_argument("--concepts", metavar="NODE[,NODE]",
                       help="also find the reference samples of every concept (channel) of these nodes (module "
                            "paths such as features.2, or rows of fxlrp report): per concept the --concepts-top "
                            "samples of largest relevance and of largest activation, with the receptive region of "
                            "the concept in each; written to DIR/concepts/NODE.npz (fxlrp.concepts.read_references), "
                            "with --png also an atlas picture per node")
    group.add_argument("--concepts-top", type=int, default=8, metavar="K",
                       help="reference samples kept per concept with --concepts (default 8)")
