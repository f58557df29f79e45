"""``fxlrp evaluate --data``: composites ranked by ABPC, equal to ``fxlrp.evaluate`` on the same
explanations; resumable shards and torchrun processes as ``fxlrp explain --data``."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.command_line import ENVIRONMENT, MODEL, ROOT, run, snapshot

import fxlrp
from fxlrp.app import cli
from fxlrp.app.evaluate_dataset import _random_maps
from fxlrp.evaluate import image_curves, mean_interval
from fxlrp.toys.digits import DigitsCNN

SAMPLES, STEPS = 6, 4
"""Samples in 3 shards of 2 and curve steps: small, every CLI run costs (float64 convolutions on the CPU)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("evaluate")
    torch.manual_seed(0)
    torch.save(DigitsCNN().state_dict(), folder / "weights.pt")
    inputs = torch.randint(0, 256, (SAMPLES, 1, 8, 8), generator=torch.Generator().manual_seed(1)).float() / 255
    np.save(folder / "inputs.npy", inputs.numpy())
    return {"weights": folder / "weights.pt", "data": folder / "inputs.npy", "inputs": inputs}


def command(files: dict[str, Path], out: Path, *options: str) -> list[str]:
    return ["evaluate", "--model", MODEL, "--weights", str(files["weights"]), "--data", str(files["data"]),
            "--out", str(out), "--composite", "epsilon,epsilon_plus", "--steps", str(STEPS), "--dtype", "float64",
            "--batch-size", "2", "--shard-size", "2", *options]


@pytest.fixture(scope="module")
def whole(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One complete run of the command, shared by the tests (each copies it before changing it):
    its folder and its standard output."""
    out = tmp_path_factory.mktemp("whole") / "run"
    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        code = cli.main(command(files, out))
    assert code == 0, errors.getvalue()
    return out, printed.getvalue()


def test_the_table_is_fxlrp_evaluate_on_the_same_explanations(files: dict[str, Path],
                                                             whole: tuple[Path, str]) -> None:
    """Each method's mean ABPC and interval equal those of ``image_curves`` on ``fxlrp.attribute``'s
    relevance of all samples at once (float64: the bound holds by construction), ranked by the mean."""
    folder, out = whole
    summary = json.loads((folder / "evaluation.json").read_text())
    inputs = files["inputs"].double()
    model = DigitsCNN().double().eval()
    model.load_state_dict(torch.load(files["weights"], weights_only=True))
    expected = {}
    for name, composite in (("epsilon", fxlrp.rules.Epsilon(1e-6)), ("epsilon_plus", fxlrp.composites.EpsilonPlus())):
        relevance = fxlrp.attribute(fxlrp.convert(model, composite), inputs, target=None)
        expected[name] = image_curves(model, inputs, relevance, steps=STEPS, progress=False).abpc()
    expected["random"] = image_curves(model, inputs, _random_maps(list(range(SAMPLES)), (1, 8, 8), 0), steps=STEPS,
                                      progress=False).abpc()
    rows = {row["method"]: row for row in summary["ranked"]}
    for name, values in expected.items():
        interval = mean_interval(values)
        assert rows[name]["abpc"] == pytest.approx(interval.mean, rel=1e-9, abs=1e-12)
        assert (rows[name]["low"], rows[name]["high"]) == pytest.approx((interval.low, interval.high), rel=1e-9,
                                                                        abs=1e-12)
        assert rows[name]["samples"] == SAMPLES
    means = [row["abpc"] for row in summary["ranked"]]
    assert means == sorted(means, reverse=True)
    table_lines = out.splitlines()[1:5]
    assert [line.split()[1] for line in table_lines[1:]] == [row["method"] for row in summary["ranked"]]


def test_a_restart_computes_only_missing_shards_and_ends_identical(files: dict[str, Path], whole: tuple[Path, str],
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(whole[0], cut)
    for name in ("shards/relevance-000001.json", "shards/relevance-000001.npy", "index.json", "evaluation.json"):
        (cut / name).unlink()  # as a run killed after shards 0 and 2
    kept = (cut / "shards" / "relevance-000000.npy").stat().st_mtime_ns
    code, out, err = run(command(files, cut), capsys)
    assert code == 0, err
    assert "2 of 3 shards were already complete" in out
    assert (cut / "shards" / "relevance-000000.npy").stat().st_mtime_ns == kept
    assert snapshot(cut) == snapshot(whole[0])


@pytest.mark.parametrize(("options", "message"), [
    (("--composite", "epsilon,nonsense"), "unknown composite 'nonsense'"),
    (("--composite", "epsilon,random"), "the random map is always evaluated"),
    (("--target", "12"), "--target 12 is out of range"),
    (("--steps", "0"), "--steps must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_code_2(files: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], options: tuple[str, ...],
                                               message: str) -> None:
    code, _, err = run(command(files, tmp_path / "bad", *options), capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_another_run_in_the_same_directory_is_refused(files: dict[str, Path], whole: tuple[Path, str],
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(whole[0], tmp_path / "run")
    code, _, err = run(command(files, tmp_path / "run", "--baseline", "blur"), capsys)
    assert code == 2 and "other settings (curves" in err, err


@pytest.mark.slow
def test_two_processes_with_torchrun_write_the_files_of_one(files: dict[str, Path], tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun is not installed beside this Python")
    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "fxlrp",
                          *command(files, tmp_path / "two")], env=ENVIRONMENT, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert two.returncode == 0, two.stderr
    one = subprocess.run([sys.executable, "-m", "fxlrp", *command(files, tmp_path / "one")], env=ENVIRONMENT,
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")
    assert two.stdout == one.stdout.replace(str(tmp_path / "one"), str(tmp_path / "two"))
