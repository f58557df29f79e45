"""``fxlrp explain --data ... --concepts NODE``: the reference samples of every concept of the named
nodes, found during the data-set pass, against ``fxlrp.concepts.relevance_maximisation`` on the
same data; their receptive regions against the receptive field of a neuron; a run killed and
started again, and two processes under torchrun, against one uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support.command_line import ENVIRONMENT, MODEL, ROOT, explainer, run, snapshot
from support.concepts import at_peak, separated
from support.references import relative_error
from support.slow_data import Digits

import fxlrp
from fxlrp.concepts import ReferenceSamples, TopSamples, read_references, relevance_maximisation, with_boxes
from fxlrp.toys.digits import DigitsCNN

NODES = ["features.2", "features.0"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("concepts") / "weights.pt"
    torch.manual_seed(0)
    torch.save(DigitsCNN().state_dict(), path)
    return path


def command(out: Path, weights: Path, data: str = "support.slow_data:DIGITS", *options: str) -> list[str]:
    return ["explain", "--model", MODEL, "--weights", str(weights), "--data", data, "--out", str(out), *options]


def test_references_of_the_command_are_those_of_relevance_maximisation(
        tmp_path: Path, weights: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """18 digits in shards of 5, batches of 3, float64: per node and concept the 3 samples of largest
    score by relevance and by activation, as ``relevance_maximisation`` finds them on the same data
    in other batches; peaks where the concept's values are largest; boxes those ``with_boxes`` finds
    and inside the receptive field of the neuron (5x5 two 3x3 convolutions deep, 3x3 one deep); the
    explanations themselves those of ``fxlrp.attribute``."""
    monkeypatch.setenv("FXLRP_TEST_SAMPLES", "18")
    out = tmp_path / "out"
    code, stdout, stderr = run(command(out, weights, "support.slow_data:DIGITS", "--target", "label", "--dtype",
                                       "float64", "--shard-size", "5", "--batch-size", "3", "--concepts",
                                       ",".join(NODES), "--concepts-top", "3"), capsys)
    assert code == 0, stderr
    assert "reference samples of features.2 (32 concepts), features.0 (16 concepts), 3 per concept" in stdout
    data = Digits(18)
    inputs, labels = data.inputs.double(), data.labels
    explain = explainer(weights, torch.float64)
    explanations = fxlrp.read_explanations(out)
    assert relative_error(torch.from_numpy(explanations.relevance),
                          fxlrp.attribute(explain, inputs, target=labels)) < 1e-12
    assert explanations.index["concepts"] == {node: f"concepts/{node}.npz" for node in NODES}

    found = read_references(out)
    assert set(found) == set(NODES)
    expected = relevance_maximisation(explain, [(inputs[start:start + 6], labels[start:start + 6])
                                                for start in range(0, 18, 6)], NODES, k=3)
    whole = fxlrp.concepts.conditional_relevance(explain, inputs, [{}], target=labels, record=NODES)
    for node, receptive in (("features.2", 2), ("features.0", 1)):
        references = found[node]
        assert references.seen == 18 and references.layer == node
        for mode, values in (("relevance", whole.relevance[node][0]), ("activation", whole.activation[node])):
            top, reference = getattr(references, mode), getattr(expected[node], mode)
            assert relative_error(top.scores, reference.scores) < 1e-12
            distinct = separated(reference.scores)
            assert distinct.sum() > distinct.numel() // 2
            assert torch.equal(top.samples[distinct], reference.samples[distinct])
            value, peak = at_peak(values.reshape(*values.shape[:2], -1), top.samples, top.positions)
            assert relative_error(value, peak) < 1e-12
            rows, columns = top.positions // 8, top.positions % 8
            assert (top.boxes[..., 0] >= (rows - receptive).clamp_min(0)).all()
            assert (top.boxes[..., 1] <= (rows + receptive + 1).clamp_max(8)).all()
            assert (top.boxes[..., 2] >= (columns - receptive).clamp_min(0)).all()
            assert (top.boxes[..., 3] <= (columns + receptive + 1).clamp_max(8)).all()
            assert (top.boxes[..., 1] > top.boxes[..., 0]).all() and (top.boxes[..., 3] > top.boxes[..., 2]).all()
        bare = ReferenceSamples(node, references.concept, *(TopSamples(top.samples, top.scores, top.positions)
                                                            for top in (references.relevance, references.activation)),
                                references.seen)
        boxed = with_boxes(explain, bare, lambda index: inputs[index], batch_size=3)
        assert torch.equal(boxed.relevance.boxes, references.relevance.boxes)
        assert torch.equal(boxed.activation.boxes, references.activation.boxes)
    assert not list((out / "concepts").glob("*.png"))  # pictures with --png


def test_png_draws_an_atlas_per_node(tmp_path: Path, weights: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FXLRP_TEST_SAMPLES", "4")
    out = tmp_path / "out"
    code, _, stderr = run(command(out, weights, "support.slow_data:DIGITS", "--concepts", "features.0",
                                  "--concepts-top", "2", "--png"), capsys)
    assert code == 0, stderr
    for mode in ("relevance", "activation"):
        picture = Image.open(out / "concepts" / f"features.0.{mode}.png")
        assert picture.format == "PNG" and picture.height > 4 * picture.width  # 16 concepts, 2 samples each


def test_bad_concept_options_give_one_line_and_exit_code_2(tmp_path: Path, weights: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    image = tmp_path / "digit.npy"
    np.save(image, np.zeros((1, 8, 8), dtype=np.float32))
    data = "support.slow_data:DIGITS"
    run(command(tmp_path / "taken", weights, data, "--concepts", "features.0", "--shard-size", "40"), capsys)
    cases = [
        (command(tmp_path / "out", weights, data, "--concepts", "feature.2"),
         "no node or module named 'feature.2' in the explained model (close names: features.2"),
        (command(tmp_path / "out", weights, data, "--concepts", "features.2,"), "give node names separated by commas"),
        (command(tmp_path / "out", weights, data, "--concepts", "features.2", "--concepts-top", "0"),
         "--concepts-top must be at least 1, got 0"),
        (command(tmp_path / "out", weights, data, "--concepts", "features.2", "--compile"), "leave out --compile"),
        (command(tmp_path / "taken", weights, data, "--concepts", "features.2", "--shard-size", "40"),
         "made with other settings (concepts: {'nodes': ['features.0'], 'top': 8} there"),
        (["explain", "--model", MODEL, str(image), "--out", str(tmp_path / "out"), "--concepts", "features.2"],
         "--concepts applies to data sets (--data)"),
        (["explain", "--model", MODEL, "--text", "a sentence", "--out", str(tmp_path / "out"), "--concepts",
          "features.2"], "--concepts finds the reference samples of concepts in a data set of images (--data)"),
    ]
    for arguments, message in cases:
        code, stdout, stderr = run(arguments, capsys)
        assert code == 2, (arguments, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fxlrp: error: "), (arguments, stderr)
        assert message in lines[0], (message, lines[0])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # (three runs of the command in processes of their own, ~10 s; the data-set command's own
# resumption and torchrun tests stay in the fast lane)
def test_killed_and_resumed_and_two_processes_write_the_references_of_one_run(tmp_path: Path, weights: Path) -> None:
    """A run killed after its first shard and started again, and two processes under torchrun
    (gloo, CPU), end with the files of one uninterrupted process, byte for byte: the shards' and
    the merged reference samples (ties to the earlier sample, whichever process found them)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun is not installed beside this Python")
    # each sample of the killed run takes 0.1 s to read: the kill lands within the 2.4 s the other
    # four shards take, however late a loaded machine runs this test's loop
    environment = {**ENVIRONMENT, "FXLRP_TEST_SAMPLES": "30", "FXLRP_TEST_DELAY": "0.1"}
    options = ["--shard-size", "6", "--batch-size", "4", "--concepts", ",".join(NODES), "--concepts-top", "4"]

    def arguments(out: Path) -> list[str]:
        return ["-m", "fxlrp", *command(out, weights, "support.slow_data:SLOW_DIGITS", *options)]

    killed = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, *arguments(killed)], env=environment, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = killed / "shards" / "relevance-000000.json"
    deadline = time.monotonic() + 120
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()
    finished = sorted((killed / "shards").glob("relevance-*.json"))
    assert 1 <= len(finished) < 5 and not (killed / "concepts").exists(), finished
    environment["FXLRP_TEST_DELAY"] = "0"
    resumed = subprocess.run([sys.executable, *arguments(killed)], env=environment, cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(finished)} of 5 shards were already complete" in resumed.stdout

    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", *arguments(tmp_path / "two")],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert "process 1 of 2: 2 shard(s), 12 samples" in two.stderr, two.stderr
    one = subprocess.run([sys.executable, *arguments(tmp_path / "one")], env=environment, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    expected = snapshot(tmp_path / "one")
    assert {"concepts/features.2.npz", "concepts/features.0.npz", "shards/concepts-000004.npz"} <= set(expected)
    assert snapshot(killed) == expected
    assert snapshot(tmp_path / "two") == expected
    references = read_references(tmp_path / "one")["features.2"]
    assert references.seen == 30 and references.relevance.samples.shape == (32, 4)
