"""Running fxlrp's command line from tests: in this process (`run`, exit code and output) or in
another (`ENVIRONMENT`: the project and the tests' support package on the path, one thread), the
digits CNN it explains, and a folder's files for comparing runs byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fxlrp
from fxlrp.app import cli
from fxlrp.toys.digits import DigitsCNN

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fxlrp.toys.digits:DigitsCNN"
ENVIRONMENT = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}


def explainer(weights: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The digits CNN with ``weights``, converted with the command's default rule (Epsilon 1e-6)."""
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, weights_only=True))
    return fxlrp.convert(model.eval().to(dtype), fxlrp.rules.Epsilon(1e-6))


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``fxlrp ARGUMENTS`` in this process: the exit code, standard output and standard error."""
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by its relative path, with its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}
