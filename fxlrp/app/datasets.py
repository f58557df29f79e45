"""Data sets that ``fxlrp explain --data`` explains: a folder of images (ImageFolder layout), a
tensor file whose first dimension counts the samples, or a ``package.module:FACTORY`` returning a
``torch.utils.data.Dataset``.

Every source becomes a :class:`Source`: a map-style data set whose items never raise. An item is
a :class:`Item` ``(index, values, label, error)``: a sample that cannot be read (a broken file in
the middle of a folder, a factory item of the wrong type, values with NaN or Inf) comes back with
``values=None`` and the reason, so that the caller names it and skips it or stops (``--on-error``),
in the main process, with the one-line error of the command line - an exception raised in a
``DataLoader`` worker would arrive as a multi-line traceback.

Part of the command line, not of the core: ``import fxlrp`` does not import this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset

from fxlrp.app.cli_options import InputError
from fxlrp.app.models.factory import imported_object
from fxlrp.app.preprocessing import Preprocessing
from fxlrp.app.readers import TENSOR_SUFFIXES, non_finite, read_input

NO_LABEL = -1
"""The label of a sample that has none (a file directly in the folder, a tensor file without labels)."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
"""File suffixes a folder is searched for (besides the tensor suffixes ``.pt``, ``.pth``, ``.npy``)."""


@dataclass(frozen=True)
class Item:
    """One sample as a ``DataLoader`` delivers it: ``values`` is None when it could not be read,
    and ``error`` says why."""

    index: int
    values: Tensor | None
    label: int
    error: str | None = None


class Source(Dataset):
    """A data set of :class:`Item` with a name per sample and, for folders, class names.

    ``names[i]`` identifies sample ``i`` in messages and PNG file names (a folder's relative
    paths; the index for tensors and factories). ``description`` is what the settings of a run
    record about the data (its kind and location).
    """

    def __init__(self, names: Sequence[str], classes: Sequence[str] | None, description: str) -> None:
        self.names = list(names)
        self.classes = None if classes is None else list(classes)
        self.description = description

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> Item:
        try:
            values, label = self.read(index)
        except Exception as error:  # noqa: BLE001 - any failure is reported for this one sample
            return Item(index, None, self.known_label(index), _one_line(error))
        problem = non_finite(values)
        if problem is not None:  # NaN or Inf: relevance NaN (every value it meets), not an explanation
            return Item(index, None, label, problem)
        return Item(index, values, label)

    def read(self, index: int) -> tuple[Tensor, int]:
        """The sample's input tensor and label; raises when it cannot be read."""
        raise NotImplementedError

    def known_label(self, index: int) -> int:
        """The label of a sample that cannot be read, where it is known without reading it."""
        return NO_LABEL

    def fingerprint(self) -> str:
        """A hash of the sample names: a resumed run checks that the data set is the same."""
        return hashlib.sha256("\n".join(self.names).encode()).hexdigest()[:16]


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


# ---------------------------------------------------------------------------------------------
# a folder of images


class ImageFolder(Source):
    """Every image (and ``.pt``/``.npy`` tensor ``[C, H, W]``) under ``root``, recursively, in
    sorted order of their relative paths. As in ``torchvision.datasets.ImageFolder``, each
    sub-folder of ``root`` is a class (sorted names, labels 0, 1, ...), whatever lies below it
    belonging to it; files directly in ``root`` have no label. Other files are ignored
    (:attr:`ignored` lists them)."""

    def __init__(self, root: Path, preprocessing: Preprocessing) -> None:
        self.root = root
        self.preprocessing = preprocessing
        suffixes = IMAGE_SUFFIXES + TENSOR_SUFFIXES
        files, self.ignored = [], []
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root)
            if any(part.startswith(".") for part in relative.parts) or not path.is_file():
                continue
            (files if path.suffix.lower() in suffixes else self.ignored).append(relative)
        classes = sorted({relative.parts[0] for relative in files if len(relative.parts) > 1})
        self._labels = [classes.index(relative.parts[0]) if len(relative.parts) > 1 else NO_LABEL
                        for relative in files]
        super().__init__([relative.as_posix() for relative in files], classes or None, f"folder {root}")

    def read(self, index: int) -> tuple[Tensor, int]:
        return read_input(self.root / self.names[index], self.preprocessing), self._labels[index]

    def known_label(self, index: int) -> int:
        return self._labels[index]


# ---------------------------------------------------------------------------------------------
# a tensor file


LABEL_KEYS = ("labels", "targets", "label", "target", "y")
INPUT_KEYS = ("inputs", "images", "data", "input", "x")


class TensorFile(Source):
    """Samples along the first dimension of a ``.npy`` array (memory-mapped) or of a ``.pt``
    file holding a tensor, a pair ``(inputs, labels)`` or a dict with ``"inputs"`` (or
    ``"images"``, ``"data"``, ``"x"``) and ``"labels"`` (or ``"targets"``, ``"y"``). The values are
    taken as they are (already preprocessed), as float32."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inputs, self.labels = _load_tensor_file(path)
        super().__init__([str(index) for index in range(len(self.inputs))], None, f"tensor file {path}")

    def read(self, index: int) -> tuple[Tensor, int]:
        values = self.inputs[index]
        tensor = torch.from_numpy(np.array(values, dtype=np.float32)) if isinstance(values, np.ndarray) \
            else values.detach().clone().float()
        return tensor, NO_LABEL if self.labels is None else int(self.labels[index])


def _load_tensor_file(path: Path) -> tuple[Any, Any]:
    try:
        if path.suffix == ".npy":
            loaded: Any = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise InputError(f"cannot read tensor file {str(path)!r}: {_one_line(error)[:160]}") from None
    labels = None
    if isinstance(loaded, dict):
        inputs = next((loaded[key] for key in INPUT_KEYS if key in loaded), None)
        labels = next((loaded[key] for key in LABEL_KEYS if key in loaded), None)
        if inputs is None:
            raise InputError(f"{str(path)!r} holds a dict without inputs: name them one of {', '.join(INPUT_KEYS)}")
    elif isinstance(loaded, tuple | list) and len(loaded) == 2:
        inputs, labels = loaded
    else:
        inputs = loaded
    if not isinstance(inputs, Tensor | np.ndarray) or inputs.ndim < 1:
        raise InputError(f"{str(path)!r} holds a {type(inputs).__name__}, not a tensor with samples along "
                         f"its first dimension")
    if isinstance(inputs, np.ndarray) and not np.issubdtype(inputs.dtype, np.number):
        raise InputError(f"{str(path)!r} holds {inputs.dtype} values, not numbers")
    if labels is not None:
        labels = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels)
        if labels.shape != (len(inputs),) or not np.issubdtype(labels.dtype, np.integer):
            raise InputError(f"the labels in {str(path)!r} must be {len(inputs)} integers, got shape "
                             f"{labels.shape} of {labels.dtype}")
    return inputs, labels


# ---------------------------------------------------------------------------------------------
# a factory


class FactoryData(Source):
    """The items of a user's map-style ``Dataset``: tensors, or pairs ``(tensor, label)``."""

    def __init__(self, spec: str, dataset: Dataset) -> None:
        self.dataset = dataset
        super().__init__([str(index) for index in range(len(dataset))], None, f"factory {spec}")

    def read(self, index: int) -> tuple[Tensor, int]:
        item = self.dataset[index]
        label: Any = NO_LABEL
        if isinstance(item, tuple | list) and len(item) == 2:
            item, label = item
        if not isinstance(item, Tensor):
            raise TypeError(f"item {index} is a {type(item).__name__}, not a tensor or a pair (tensor, label)")
        if isinstance(label, Tensor):
            label = label.item()
        if not isinstance(label, int) or isinstance(label, bool):
            raise TypeError(f"the label of item {index} is {label!r}, not an integer class")
        return item.detach().float(), label


def _factory_data(spec: str) -> FactoryData:
    dataset = imported_object(spec, Dataset, "data")
    if isinstance(dataset, IterableDataset) or not isinstance(dataset, Dataset) or not hasattr(dataset, "__len__"):
        raise InputError(f"{spec!r} gives a {type(dataset).__name__}, not a map-style torch.utils.data.Dataset "
                         f"with a length")
    return FactoryData(spec, dataset)


# ---------------------------------------------------------------------------------------------


def open_data(spec: str, preprocessing: Preprocessing) -> Source:
    """The data set named by ``spec``: an existing folder, a ``.pt``/``.pth``/``.npy`` file, or
    ``package.module:FACTORY``. Raises :class:`InputError` with a one-line message."""
    path = Path(spec)
    if path.is_dir():
        source: Source = ImageFolder(path.resolve(), preprocessing)
    elif path.is_file():
        if path.suffix.lower() not in TENSOR_SUFFIXES:
            raise InputError(f"data {spec!r} is a {path.suffix or 'suffix-less'} file; give a folder of images, "
                             f"a .pt/.npy tensor file or package.module:FACTORY")
        source = TensorFile(path.resolve())
    elif ":" in spec and "/" not in spec.partition(":")[0]:
        source = _factory_data(spec)
    else:
        raise InputError(f"data {spec!r} does not exist (a folder, a .pt/.npy file or package.module:FACTORY)")
    if len(source) == 0:
        raise InputError(f"data {spec!r} holds no samples")
    return source


def as_list(items: list[Item]) -> list[Item]:
    """``collate_fn`` of the loader: items are stacked in the main process, where a sample of
    another shape can be reported as that sample's problem."""
    return items
