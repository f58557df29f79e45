"""``--weights FILE``: a state dict, and the number of classes its classifier has."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from fxlrp.app.cli_options import InputError, first_sentence


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """A state dict from ``torch.save(model.state_dict(), path)`` (or ``{"state_dict": ...}``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"weights file {str(path)!r} does not exist")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise InputError(f"cannot read weights {str(path)!r}: {first_sentence(error)}; expected a file written by "
                         f"torch.save(model.state_dict(), path)") from None
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(isinstance(value, Tensor) for value in loaded.values()):
        raise InputError(f"weights {str(path)!r} are not a state dict; save them with "
                         f"torch.save(model.state_dict(), path)")
    return loaded


def classes_of(state_dict: dict[str, Tensor], prefix: str | None = None) -> int | None:
    """The number of classes of the classifier in a state dict.

    Parameters
    ----------
    state_dict
        A model's state dict.
    prefix
        Only keys starting with it count (``"classifier."`` for a segmentation head); None: all.

    Returns
    -------
    int or None
        The output size of its last matrix-shaped weight (a linear classifier), else of its last
        convolution weight (a 1x1 convolution as classifier: SqueezeNet, S3D, segmentation
        heads); None where it has neither.
    """
    weights = [value for key, value in state_dict.items()
               if key.endswith("weight") and (prefix is None or key.startswith(prefix))]
    matrices = [value for value in weights if value.dim() == 2]
    convolutions = [value for value in weights if value.dim() > 2]
    found = matrices or convolutions
    return int(found[-1].shape[0]) if found else None
