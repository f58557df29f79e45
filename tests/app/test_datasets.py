"""``fxlrp explain --data``: folders, tensor files and factories into resumable shards.

Relevance read back with ``fxlrp.read_explanations`` is compared with ``fxlrp.attribute`` on the
same inputs; a run killed with SIGKILL and restarted ends with the files of an uninterrupted run.
"""

from __future__ import annotations

import os
import re
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

import fxlrp
from fxlrp.toys.digits import DigitsCNN


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Weights of a DigitsCNN, a folder of 8x8 PNGs in three class folders (one broken file,
    one stray text file), and the same pixels as .npy and .pt tensor files."""
    folder = tmp_path_factory.mktemp("datasets")
    torch.manual_seed(0)
    torch.save(DigitsCNN().state_dict(), folder / "weights.pt")
    pixels = torch.randint(0, 256, (15, 8, 8), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    images = folder / "images"
    for index in range(15):
        path = images / f"class{index % 3}" / f"{index:02d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[index].numpy(), mode="L").save(path)
    (images / "class1" / "07b_broken.png").write_text("not a picture")
    (images / "class2" / "notes.txt").write_text("ignored: not an image")
    inputs = pixels[:, None].float() / 255.0
    np.save(folder / "inputs.npy", inputs.numpy())
    torch.save((inputs, torch.arange(15) % 3), folder / "inputs.pt")
    return {"folder": folder, "weights": folder / "weights.pt", "images": images}


def relative_error(actual: np.ndarray, expected: torch.Tensor) -> float:
    """Largest difference over the largest magnitude."""
    return float(np.abs(actual - expected.numpy()).max() / np.abs(expected.numpy()).max())


def equals_attribute(computed: np.ndarray, inputs: torch.Tensor, target: torch.Tensor | None, weights: Path) -> None:
    """The command's relevance (its own batches, in float64) equals ``fxlrp.attribute`` on all
    inputs at once in float64. Other batchings sum in other orders (GEMM blocking depends on the
    sizes), which epsilon 1e-6 amplifies near small denominators: by up to 3e-5 relative in
    float32, so the two paths are compared in float64, where the same amplification of a rounding
    of 1e-16 stays below 1e-13 and a bound of 1e-9 holds by construction."""
    exact = fxlrp.attribute(explainer(weights, torch.float64), inputs.double(), target=target)
    assert computed.dtype == np.float64
    assert relative_error(computed, exact) <= 1e-9


def explain_command(data: Path | str, out: Path, weights: Path, *options: str) -> list[str]:
    return ["explain", "--model", MODEL, "--weights", str(weights), "--data", str(data), "--out", str(out), *options]


def test_folder_with_labels_a_broken_file_skipped_and_named(files: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = files["folder"] / "folder_out"
    arguments = explain_command(files["images"], out, files["weights"], "--target", "label", "--batch-size", "4",
                                "--shard-size", "5", "--png", "--dtype", "float64")
    code, stdout, stderr = run(arguments, capsys)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fxlrp: error: sample 8 ('class1/07b_broken.png')"), stderr
    assert "--on-error skip" in lines[0]

    code, stdout, stderr = run([*arguments, "--on-error", "skip", "--workers", "2"], capsys)
    assert code == 0, stderr
    assert "skipped sample 8 ('class1/07b_broken.png')" in stderr and "1 skipped" in stdout
    explanations = fxlrp.read_explanations(out)
    assert len(explanations) == 16 and explanations.classes == ["class0", "class1", "class2"]
    assert explanations.names[8] == "class1/07b_broken.png" and "notes.txt" not in explanations.names
    assert [entry["index"] for entry in explanations.skipped] == [8]
    assert np.isnan(explanations.relevance[8]).all() and explanations.targets[8] == -1
    kept = [index for index in range(16) if index != 8]
    assert np.isfinite(explanations.relevance[kept]).all()
    labels = np.array([int(name.split("/")[0][-1]) for name in explanations.names])
    assert (explanations.labels == labels).all() and (explanations.targets[kept] == labels[kept]).all()

    inputs = torch.stack([torch.from_numpy(np.asarray(Image.open(files["images"] / name), dtype=np.float32)
                                           / 255.0)[None] for index, name in enumerate(explanations.names)
                          if index != 8])
    label = torch.from_numpy(labels[kept])
    equals_attribute(explanations.relevance[kept], inputs, label, files["weights"])
    with torch.no_grad():
        exact = explainer(files["weights"], torch.float64)(inputs.double())
    assert (explanations.predictions[kept] == exact.argmax(1).numpy()).all()
    assert relative_error(explanations.scores[kept], exact.gather(1, label[:, None])[:, 0]) <= 1e-12
    sums = explanations.relevance[kept].reshape(15, -1).sum(axis=1, dtype=np.float64)
    assert np.allclose(explanations.relevance_sums[kept], sums, rtol=1e-12)
    assert (out / "png" / "class0" / "00.heatmap.png").is_file()  # (not 00.png.heatmap.png)
    assert len(list((out / "png").rglob("*.heatmap.png"))) == 15
    assert not list(out.rglob(".*.tmp"))


@pytest.mark.parametrize("suffix", [".npy", ".pt"])
def test_tensor_files_and_a_factory_give_the_relevance_of_attribute(files: dict[str, Path], suffix: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = files["folder"] / f"tensor_out{suffix}"
    code, _, stderr = run(explain_command(files["folder"] / f"inputs{suffix}", out, files["weights"],
                                          "--shard-size", "4", "--batch-size", "3", "--dtype", "float64"), capsys)
    assert code == 0, stderr
    explanations = fxlrp.read_explanations(out)
    inputs = torch.from_numpy(np.load(files["folder"] / "inputs.npy"))
    assert explanations.relevance.shape == (15, 1, 8, 8)
    equals_attribute(explanations.relevance, inputs, None, files["weights"])
    assert (explanations.targets == explanations.predictions).all()
    assert [shard["stop"] - shard["start"] for shard in explanations.index["shards"]] == [4, 4, 4, 3]
    if suffix == ".pt":
        assert (explanations.labels == np.arange(15) % 3).all()


def test_a_factory_data_set_with_labels(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from support.slow_data import Digits

    out = files["folder"] / "factory_out"
    code, _, stderr = run(explain_command("support.slow_data:DIGITS", out, files["weights"], "--target", "label",
                                          "--shard-size", "16", "--dtype", "float64"), capsys)
    assert code == 0, stderr
    explanations = fxlrp.read_explanations(out)
    data = Digits(40)
    expected = fxlrp.attribute(explainer(files["weights"], torch.float64), data.inputs.double(), target=data.labels)
    assert explanations.relevance.dtype == np.float64 and relative_error(explanations.relevance, expected) < 1e-12
    assert (explanations.targets == data.labels.numpy()).all()


def test_bad_data_set_inputs_give_one_line_and_exit_code_2(files: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder, weights = files["folder"], files["weights"]
    out = folder / "bad_out"
    run(explain_command(folder / "inputs.npy", folder / "taken", weights, "--shard-size", "8"), capsys)
    cases = [
        (explain_command(folder / "missing", out, weights), "data '" + str(folder / "missing") + "' does not exist"),
        (explain_command(folder / "weights.pt", out, weights), "holds a dict without inputs"),
        (explain_command("no_such_module:DATA", out, weights), "cannot import 'no_such_module'"),
        (explain_command("support.slow_data:NOTHING", out, weights), "has no attribute 'NOTHING'"),
        (explain_command(folder / "inputs.npy", out, weights, "--target", "label"), "has no labels"),
        (explain_command(folder / "inputs.npy", out, weights, "--target", "12"), "--target 12 is out of range"),
        (explain_command(folder / "inputs.npy", out, weights, "--shard-size", "0"), "--shard-size must be at least"),
        (explain_command(folder / "inputs.npy", weights, weights), "is a file, not a directory"),
        (explain_command(folder / "inputs.npy", folder / "taken", weights, "--shard-size", "4"),
         "holds explanations made with other settings (shard_size: 8 there, 4 now)"),
        (explain_command(folder / "inputs.npy", out, weights, "--device", "warp"), "unknown --device 'warp'"),
        (["explain", "--model", MODEL, "--data", str(folder / "inputs.npy")], "required: --out"),
        ([*explain_command(folder / "inputs.npy", out, weights), str(folder / "x.png")], "either image files or"),
        (["explain", "--model", MODEL, str(files["images"] / "class0" / "00.png"), "--out", str(out),
          "--shard-size", "4"], "--shard-size applies to data sets (--data)"),
    ]
    if not torch.cuda.is_available():
        cases.append((explain_command(folder / "inputs.npy", out, weights, "--device", "cuda"),
                      "CUDA is not available"))
    for arguments, message in cases:
        code, stdout, stderr = run(arguments, capsys)
        assert code == 2, (arguments, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fxlrp: error: "), (arguments, stderr)
        assert message in lines[0], (message, lines[0])
        assert stdout == ""
    assert not out.exists()


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_and_ends_identical(tmp_path: Path, files: dict[str, Path]) -> None:
    """SIGKILL after the first shard is complete; the restart computes only the missing shards
    (complete ones are not rewritten) and the directory ends byte-identical to an uninterrupted run.
    Each sample of the killed run takes 0.1 s to read: the kill lands within the 4.2 s the other
    seven shards take, however late a loaded machine runs this test's loop."""
    environment = {**ENVIRONMENT, "FXLRP_TEST_SAMPLES": "48", "FXLRP_TEST_DELAY": "0.1"}

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "fxlrp", *explain_command("support.slow_data:SLOW_DIGITS", out, files["weights"],
                                                                 "--shard-size", "6", "--batch-size", "4",
                                                                 "--composite", "epsilon_plus_flat")]

    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), env=environment, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    first = killed / "shards" / "relevance-000000.json"
    deadline = time.monotonic() + 120
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()  # killed, not finished
    assert not (killed / "index.json").exists()
    finished = sorted(path.name for path in (killed / "shards").glob("*.json"))
    assert 1 <= len(finished) < 8, finished
    for path in (killed / "shards").glob("*.npy"):  # every file under its final name is complete
        assert np.load(path).shape[0] == 6
    kept = {name: os.stat(killed / "shards" / name).st_mtime_ns for name in finished}
    kept.update({name.replace(".json", ".npy"): os.stat(killed / "shards" / name.replace(".json", ".npy")).st_mtime_ns
                 for name in finished})

    environment["FXLRP_TEST_DELAY"] = "0"
    resumed = subprocess.run(command(killed), env=environment, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(finished)} of 8 shards were already complete" in resumed.stdout
    assert {name: os.stat(killed / "shards" / name).st_mtime_ns for name in kept} == kept  # not recomputed

    whole = tmp_path / "whole"
    uninterrupted = subprocess.run(command(whole), env=environment, cwd=ROOT, capture_output=True, text=True,
                                   timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    assert snapshot(killed) == snapshot(whole)
    assert not list(killed.rglob(".*.tmp"))
    assert fxlrp.read_explanations(killed).relevance.shape == (48, 1, 8, 8)


def test_import_fxlrp_loads_no_data_set_code() -> None:
    """(tqdm is not in the list: ``import torch`` imports it, through torch.hub.)"""
    code = ("import sys, fxlrp; heavy = [name for name in ('fxlrp.app.datasets', 'fxlrp.app.explanations_store', "
            "'fxlrp.app.explain_dataset', 'fxlrp.app.distributed', 'fxlrp.app.cli', 'PIL', 'matplotlib') "
            "if name in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], env=ENVIRONMENT, cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_two_processes_with_torchrun_write_the_files_of_one(tmp_path: Path, files: dict[str, Path]) -> None:
    """torchrun --nproc-per-node 2 (gloo, CPU): 18 samples in 5 shards (the last of 2 samples), 3
    for the first process and 2 for the second; the directory is byte-identical to one process's."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun is not installed beside this Python")
    environment = {**ENVIRONMENT, "FXLRP_TEST_SAMPLES": "18"}
    options = ["--shard-size", "4", "--batch-size", "3", "--target", "label"]
    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "fxlrp",
                          *explain_command("support.slow_data:DIGITS", tmp_path / "two", files["weights"], *options)],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert "process 0 of 2: 3 shard(s), 10 samples" in two.stderr, two.stderr
    assert "process 1 of 2: 2 shard(s), 8 samples" in two.stderr, two.stderr
    one = subprocess.run([sys.executable, "-m", "fxlrp",
                          *explain_command("support.slow_data:DIGITS", tmp_path / "one", files["weights"], *options)],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")
    explanations = fxlrp.read_explanations(tmp_path / "two")
    assert explanations.relevance.shape == (18, 1, 8, 8) and [shard["start"] for shard in
                                                              explanations.index["shards"]] == [0, 4, 8, 12, 16]
    assert (explanations.targets == np.arange(18) % 10).all()


def test_progress_without_tqdm_is_a_plain_line(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from fxlrp.app.sharded_run import progress_bar

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now fails
    progress = progress_bar(10, enabled=True)
    for _ in range(5):
        progress.update(2)
    progress.close()
    line = capsys.readouterr().err.strip().split("\r")[-1]
    assert re.fullmatch(r"explaining: 10/10 samples, [0-9.]+ samples/s, 0 s left", line), line
