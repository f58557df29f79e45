"""The ``fxlrp`` command: explain, report, demo; every bad input gives one line and exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fxlrp.app import cli
from fxlrp.toys.digits import DigitsCNN, load_digits_split, positive_relevance_on_ink, train_classifier
from fxlrp.viz import image
from tests.support.pictures import colour_bars

ROOT = Path(__file__).resolve().parents[2]
DIGITS_MODEL = "fxlrp.toys.digits:DigitsCNN"


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A DigitsCNN weights file, three test digits as 8x8 grey PNGs, and some bad inputs."""
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    data = load_digits_split()
    model = train_classifier(DigitsCNN(), data.train_images, data.train_labels, epochs=3)
    torch.save(model.state_dict(), folder / "digits.pt")
    torch.save(DigitsCNN(classes=5).state_dict(), folder / "five_classes.pt")
    for index in range(3):
        pixels = np.round(data.test_images[index, 0].numpy() * 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"digit{index}.png")
    Image.fromarray(np.zeros((4, 4), dtype=np.uint8), mode="L").save(folder / "tiny.png")
    Image.fromarray(np.zeros((9, 9), dtype=np.uint8), mode="L").save(folder / "nine.png")
    (folder / "text.png").write_text("this is not a picture")
    np.save(folder / "two_channels.npy", np.zeros((2, 8, 8), dtype=np.float32))
    return {"folder": folder, "weights": folder / "digits.pt", "ink": data.ink()[:3]}


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_explain_writes_heatmaps_with_relevance_on_the_ink(digits: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    folder, out = digits["folder"], digits["folder"] / "out"
    images = [str(folder / f"digit{index}.png") for index in range(3)]
    code, stdout, stderr = run(["explain", "--model", DIGITS_MODEL, "--weights", str(digits["weights"]),
                                "--batch-size", "2", *images, "--out", str(out)], capsys)
    assert code == 0, stderr
    assert len(stdout.strip().splitlines()) == 3 and "class" in stdout
    maps = []
    for index in range(3):
        assert (out / f"digit{index}.overlay.png").is_file()
        values = image.signed_values_from_bwr(image.read_png(out / f"digit{index}.heatmap.png"))
        assert values.shape == (256, 256)  # 8x8 enlarged 32 times (a short side of 256 pixels)
        maps.append(torch.from_numpy(values.reshape(8, 32, 8, 32).mean(axis=(1, 3))))
    on_ink = positive_relevance_on_ink(torch.stack(maps), digits["ink"])
    assert (on_ink > 0.8).all(), on_ink


def test_report_prints_the_node_table(digits: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(["report", DIGITS_MODEL, "--composite", "lrp0"], capsys)
    assert code == 0
    assert re.search(r"features_0\s+features\.0\s+conv", stdout)
    assert "Epsilon(epsilon=0.0" in stdout and "coverage 100.00%" in stdout


def bad_inputs(folder: Path, weights: Path) -> list[tuple[list[str], str]]:
    digit, out = str(folder / "digit0.png"), str(folder / "bad_out")
    explain = ["explain", "--model", DIGITS_MODEL, "--weights", str(weights)]
    return [
        (["explain", "--model", "torchvision:resnet99", digit, "--out", out], "unknown torchvision model 'resnet99'"),
        (["explain", "--model", "nomodel", digit, "--out", out], "is not of the form torchvision:NAME"),
        (["report", "no_such_package.models:Net"], "cannot import 'no_such_package.models'"),
        ([*explain, "--composite", "magic", digit, "--out", out], "unknown composite 'magic'"),
        ([*explain, str(folder / "missing.png"), "--out", out], "missing.png' does not exist"),
        ([*explain, str(folder / "text.png"), "--out", out], "is not an image"),
        ([*explain, str(folder / "two_channels.npy"), "--out", out], "has shape (2, 8, 8); the model takes [1, "),
        ([*explain, digit, str(folder / "nine.png"), "--out", out], "inputs differ in size"),
        ([*explain, str(folder / "tiny.png"), "--out", out], "tiny.png: the model itself rejects input"),
        (["explain", "--model", DIGITS_MODEL, "--weights", str(folder / "none.pt"), digit, "--out", out],
         "weights file"),
        (["explain", "--model", DIGITS_MODEL, "--weights", str(folder / "text.png"), digit, "--out", out],
         "cannot read weights"),
        (["explain", "--model", DIGITS_MODEL, "--weights", str(folder / "five_classes.pt"), digit, "--out", out],
         "do not fit fxlrp.toys.digits:DigitsCNN"),
        ([*explain, "--target", "10", digit, "--out", out], "--target 10 is out of range"),
        ([*explain, "--cmap", "rainbowish", digit, "--out", out], "unknown colour map"),
        ([*explain, digit], "required: --out"),
        (["explode"], "invalid choice: 'explode'"),
    ]


def test_each_bad_input_gives_one_line_and_exit_code_2(digits: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for arguments, message in bad_inputs(digits["folder"], digits["weights"]):
        code, stdout, stderr = run(arguments, capsys)
        assert code == 2, (arguments, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fxlrp: error: "), (arguments, stderr)
        assert message in lines[0], (message, lines[0])
        assert stdout == ""
    assert not (digits["folder"] / "bad_out").exists()  # nothing written before the inputs were checked


def test_console_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "fxlrp.app.cli", "explain", "--model", "torchvision:resnet18",
                             str(tmp_path / "missing.jpg"), "--out", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, env=environment, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"fxlrp: error: image '{tmp_path / 'missing.jpg'}' does not exist"


def test_demo_runs_fast_and_checks_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run(["demo", "--fast", "--out", str(tmp_path)], capsys)
    assert code == 0, stderr
    difference = float(re.search(r"relative difference ([0-9.e+-]+)", stdout).group(1))
    assert difference < 1e-12  # LRP-0 == gradient x input on the torchvision ResNet-18
    assert re.search(r"node relevance:\n\s+node\s+\d+ sick\s+\+", stdout)  # the top node for "gets sick" is sick
    assert re.search(r"edge most for: \d+ -> \d+ \(real contact, sick sender\) \+", stdout)  # and infects by a contact
    for name in ("digits_heatmaps.png", "resnet18_random_weights.png", "infection_graph.png"):
        assert (tmp_path / name).stat().st_size > 5_000
    # the ResNet-18's heatmap beside a colour bar from +max|R| (top) to -max|R| (bottom), the
    # heatmap's own scale
    assert len(colour_bars(image.read_png(tmp_path / "resnet18_random_weights.figure.png"))) >= 1
