"""Data-set factories for the data-set tests of ``fxlrp explain --data`` (imported by name in
subprocesses: ``support.slow_data:SLOW_DIGITS``, with ``tests`` on PYTHONPATH)."""

from __future__ import annotations

import os
import time

import torch
from torch import Tensor
from torch.utils.data import Dataset


class Digits(Dataset):
    """``count`` generated 1x8x8 inputs with labels 0..9; each read sleeps ``delay`` seconds so
    that a test can kill a run in the middle."""

    def __init__(self, count: int = 40, delay: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(3)
        self.inputs = torch.rand(count, 1, 8, 8, generator=generator)
        self.labels = torch.arange(count) % 10
        self.delay = delay

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if self.delay:
            time.sleep(self.delay)
        return self.inputs[index], int(self.labels[index])


def DIGITS() -> Digits:  # noqa: N802 - named like a constant on the command line
    return Digits(int(os.environ.get("FXLRP_TEST_SAMPLES", "40")))


def SLOW_DIGITS() -> Digits:  # noqa: N802
    return Digits(int(os.environ.get("FXLRP_TEST_SAMPLES", "40")), delay=float(os.environ.get("FXLRP_TEST_DELAY",
                                                                                                "0.03")))
