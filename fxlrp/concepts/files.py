"""Reference samples on disk: one ``.npz`` file (numpy's zip of ``.npy`` arrays) per layer.

``fxlrp explain --data ... --concepts NODE`` writes ``DIR/concepts/NODE.npz`` (format in
``docs/datasets.md``); :func:`read_references` reads them back as :class:`ReferenceSamples`. The
arrays, for ``C`` concepts and ``k`` reference samples each, best first:

    layer                  the layer's name as given (a 0-d string)
    concept                its concepts, e.g. "ChannelConcept(dim=1)" (a 0-d string)
    seen                   how many samples were analysed
    relevance_samples      [C, k] int64: data set indices (-1: fewer than k samples)
    relevance_scores       [C, k]: their scores (-inf where no sample)
    relevance_positions    [C, k] int64: where the concept peaks in each (a flat index)
    relevance_boxes        [C, k, 4] int64: its receptive region, (row_start, row_stop,
                           column_start, column_stop) (only where found)
    activation_...         the same by activation
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import IO

import numpy as np
import torch

from fxlrp.concepts.concept import ChannelConcept, Concept, HeadConcept, NeuronConcept
from fxlrp.concepts.maximisation import ReferenceSamples, TopSamples

MODES = ("relevance", "activation")
FIELDS = ("samples", "scores", "positions", "boxes")


def references_arrays(references: ReferenceSamples) -> dict[str, np.ndarray]:
    """The arrays of a layer's references, as the ``.npz`` file holds them (see the module).

    Parameters
    ----------
    references : ReferenceSamples
        The references.

    Returns
    -------
    dict of str to ndarray
        By name.
    """
    arrays = {"layer": np.array(references.layer), "concept": np.array(repr(references.concept)),
              "seen": np.array(references.seen, dtype=np.int64)}
    for mode in MODES:
        top: TopSamples = getattr(references, mode)
        for name in FIELDS:
            value = getattr(top, name)
            if value is not None:
                arrays[f"{mode}_{name}"] = value.detach().cpu().numpy()
    return arrays


def save_references(references: ReferenceSamples, file: str | os.PathLike[str] | IO[bytes]) -> None:
    """Write a layer's references as an ``.npz`` file (:func:`read_references` reads it).

    Parameters
    ----------
    references : ReferenceSamples
        The references.
    file : str, PathLike or binary file
        Where.
    """
    np.savez(file, **references_arrays(references))


def _concept(text: str) -> Concept:
    match = re.fullmatch(r"(ChannelConcept|NeuronConcept)\(dim=(-?\d+)\)", text)
    if match:
        return (ChannelConcept if match[1] == "ChannelConcept" else NeuronConcept)(int(match[2]))
    match = re.fullmatch(r"HeadConcept\(heads=(\d+), dim=(-?\d+)\)", text)
    if match:
        return HeadConcept(int(match[1]), int(match[2]))
    raise ValueError(f"references of concepts {text!r}: only ChannelConcept, NeuronConcept and HeadConcept are read")


def references_of_arrays(arrays: dict[str, np.ndarray] | np.lib.npyio.NpzFile) -> ReferenceSamples:
    """:class:`ReferenceSamples` from the arrays of :func:`references_arrays`.

    Parameters
    ----------
    arrays : dict of str to ndarray, or NpzFile
        The arrays.

    Returns
    -------
    ReferenceSamples
        The references.
    """
    tops = []
    for mode in MODES:
        values = {name: torch.from_numpy(np.array(arrays[f"{mode}_{name}"])) for name in FIELDS
                  if f"{mode}_{name}" in arrays}
        tops.append(TopSamples(values["samples"], values["scores"], values["positions"], values.get("boxes")))
    return ReferenceSamples(str(arrays["layer"]), _concept(str(arrays["concept"])), tops[0], tops[1],
                            int(arrays["seen"]))


def read_references(path: str | os.PathLike[str]) -> dict[str, ReferenceSamples] | ReferenceSamples:
    """Reference samples written by ``fxlrp explain --data ... --concepts`` or :func:`save_references`.

    Parameters
    ----------
    path : str or PathLike
        The ``--out`` directory of ``fxlrp explain`` (its ``concepts/*.npz``: all layers), or one
        ``.npz`` file (one layer).

    Returns
    -------
    dict of str to ReferenceSamples, or ReferenceSamples
        Per layer name for a directory; the layer's for a file.
    """
    path = Path(path)
    if path.is_dir():
        folder = path / "concepts"
        files = sorted(folder.glob("*.npz")) if folder.is_dir() else []
        if not files:
            raise FileNotFoundError(f"{str(path)!r} holds no reference samples ({str(folder)!r} has no .npz files): "
                                    "fxlrp explain --data ... --concepts NODE writes them when the run ends")
        found = {}
        for file in files:
            references = read_references(file)
            assert isinstance(references, ReferenceSamples)
            found[references.layer] = references
        return found
    with np.load(path, allow_pickle=False) as arrays:
        return references_of_arrays(arrays)
