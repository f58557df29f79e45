"""Issue 47, "the first try works", on the command line: a bad sample in a data set is named and
skipped (or stops the run with one line), torchvision's segmentation and video models, timm
models and Hugging Face image classifiers are explained with their own preprocessing, and a
language model's ``--target`` that is not one token of the vocabulary is an error.

Every relevance the command writes is compared with ``fxlrp.attribute`` called from Python on
inputs preprocessed here by the model's library (a torchvision weights' ``transforms()``, timm's
eval transform of the model's data config, the saved Hugging Face image processor), in float64
(``--dtype float64``) within 1e-12, or, for a run with a skipped sample, with the same command
run on the data set without that sample.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fxlrp
from fxlrp.app import cli
from fxlrp.toys.digits import DigitsCNN

ROOT = Path(__file__).resolve().parents[2]
DIGITS = "fxlrp.toys.digits:DigitsCNN"
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def relative_error(actual: np.ndarray | torch.Tensor, expected: np.ndarray | torch.Tensor) -> float:
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fxlrp: error: "), stderr
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def random_picture(path: Path, seed: int, size: tuple[int, int] = (40, 50), mode: str = "RGB") -> Path:
    shape = (*size, 3) if mode == "RGB" else size
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode=mode).save(path)
    return path


def pixels_of(path: Path) -> torch.Tensor:
    """An 8x8 grey PNG as DigitsCNN's input [1, 8, 8], pixels in [0, 1] (no preprocessing)."""
    return torch.from_numpy(np.asarray(Image.open(path), dtype=np.float32) / 255.0)[None]


# ---------------------------------------------------------------------------------------------
# 1. a bad sample in a data set


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """DigitsCNN weights; a folder of eight 8x8 grey PNGs, and the same folder with a NaN .npy
    and a damaged PNG among them (``bad``), and with a finite .npy whose values overflow the
    float32 activations (``overflow``)."""
    folder = tmp_path_factory.mktemp("first_try")
    torch.manual_seed(0)
    torch.save(DigitsCNN().state_dict(), folder / "weights.pt")
    clean = folder / "clean"
    for index in range(8):
        random_picture(clean / f"{index:02d}.png", index, (8, 8), "L")
    bad = folder / "bad"
    shutil.copytree(clean, bad)
    nan = np.random.default_rng(9).random((1, 8, 8)).astype(np.float32)
    nan[0, 3, 4] = np.nan
    np.save(bad / "03b_nan.npy", nan)
    whole = (clean / "05.png").read_bytes()
    (bad / "05b_damaged.png").write_bytes(whole[:len(whole) // 2])  # a PNG cut in half: pillow fails to decode it
    overflow = folder / "overflow"
    shutil.copytree(clean, overflow)
    model = DigitsCNN()
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True))
    huge = torch.zeros(1, 8, 8)
    huge[0, :3, :3] = 3.4e38 * model.features[0].weight[0, 0].detach().sign()  # the first filter overflows at (1, 1)
    with torch.no_grad():
        assert torch.isfinite(huge).all() and not torch.isfinite(model.eval()(huge[None])).all()
    np.save(overflow / "03b_huge.npy", huge.numpy())
    return {"folder": folder, "weights": folder / "weights.pt", "clean": clean, "bad": bad, "overflow": overflow}


def explain_data(data: Path | str, out: Path, weights: Path, *options: str) -> list[str]:
    return ["explain", "--model", DIGITS, "--weights", str(weights), "--data", str(data), "--out", str(out), *options]


def digits_explainer(weights: Path, dtype: torch.dtype) -> torch.nn.Module:
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, weights_only=True))
    return fxlrp.convert(model.eval().to(dtype), fxlrp.rules.Epsilon(1e-6))


def test_a_nan_sample_and_a_damaged_file_are_named_skipped_and_the_rest_explained(
        digits: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's run: one NaN .npy in a folder ended in a traceback naming the batch. Now each
    bad file is named on stderr and in index.json with its reason, the others are explained
    as in a run without the bad files (float64: both within 1e-12 of fxlrp.attribute)."""
    out = digits["folder"] / "bad_skipped"
    options = ("--on-error", "skip", "--batch-size", "16", "--dtype", "float64")
    code, stdout, stderr = run(explain_data(digits["bad"], out, digits["weights"], *options), capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert "skipped sample 4 ('03b_nan.npy')" in stderr and "1 NaN among its 64 values" in stderr
    assert "skipped sample 7 ('05b_damaged.png')" in stderr and "cannot be decoded" in stderr
    assert "explained 8 of 10 samples (2 skipped" in stdout
    explanations = fxlrp.read_explanations(out)
    assert [(entry["index"], entry["name"]) for entry in explanations.skipped] == [(4, "03b_nan.npy"),
                                                                                  (7, "05b_damaged.png")]
    assert "NaN" in explanations.skipped[0]["reason"] and "decoded" in explanations.skipped[1]["reason"]
    assert np.isnan(explanations.relevance[[4, 7]]).all() and (explanations.targets[[4, 7]] == -1).all()
    kept = [index for index in range(10) if index not in (4, 7)]

    clean = digits["folder"] / "clean_run"
    code, _, stderr = run(explain_data(digits["clean"], clean, digits["weights"], *options), capsys)
    assert code == 0, stderr
    reference = fxlrp.read_explanations(clean)
    assert [explanations.names[index] for index in kept] == reference.names
    assert relative_error(explanations.relevance[kept], reference.relevance) < 1e-12
    assert (explanations.predictions[kept] == reference.predictions).all()
    assert relative_error(explanations.scores[kept], reference.scores) < 1e-12

    inputs = torch.stack([pixels_of(digits["clean"] / name) for name in reference.names]).double()
    expected = fxlrp.attribute(digits_explainer(digits["weights"], torch.float64), inputs, target=None)
    assert relative_error(explanations.relevance[kept], expected) < 1e-12


def test_with_on_error_stop_the_bad_file_is_one_line_and_exit_code_2(digits: dict[str, Path],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = digits["folder"] / "bad_stopped"
    code, stdout, stderr = run(explain_data(digits["bad"], out, digits["weights"], "--shard-size", "4"), capsys)
    assert code == 2 and stdout == ""
    line = one_error_line(stderr)
    assert line.startswith("fxlrp: error: sample 4 ('03b_nan.npy') cannot be explained: ")
    assert "1 NaN among its 64 values" in line and line.endswith("fix or remove it, or pass --on-error skip")
    assert "check_finite" not in line  # no option of fxlrp.attribute the command line does not have
    assert (out / "shards" / "relevance-000000.json").is_file()  # the shard completed before it is kept
    # image files: the file named, one line
    for name, message in (("03b_nan.npy", "has 1 NaN among its 64 values"), ("05b_damaged.png", "cannot be decoded")):
        code, stdout, stderr = run(["explain", "--model", DIGITS, "--weights", str(digits["weights"]),
                                    str(digits["bad"] / "00.png"), str(digits["bad"] / name),
                                    "--out", str(digits["folder"] / "images_out")], capsys)
        assert code == 2 and stdout == ""
        line = one_error_line(stderr)
        assert line.startswith(f"fxlrp: error: '{digits['bad'] / name}' ") and message in line, line


def test_a_sample_whose_explanation_overflows_is_skipped_and_its_batch_explained_without_it(
        digits: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A finite input (3.4e38) whose activations overflow float32: fxlrp.attribute refuses the
    whole batch. The command names the sample and explains the rest of the batch without it:
    the same batch as the folder without the file, so the same relevance, bit for bit."""
    out = digits["folder"] / "overflow_skipped"
    code, stdout, stderr = run(explain_data(digits["overflow"], out, digits["weights"], "--on-error", "skip",
                                            "--batch-size", "16"), capsys)
    assert code == 0, stderr
    assert "skipped sample 4 ('03b_huge.npy'): the model's output is NaN or Inf for it" in stderr, stderr
    explanations = fxlrp.read_explanations(out)
    assert [entry["index"] for entry in explanations.skipped] == [4]
    kept = [index for index in range(9) if index != 4]
    clean = digits["folder"] / "overflow_clean"
    code, _, stderr = run(explain_data(digits["clean"], clean, digits["weights"], "--batch-size", "16"), capsys)
    assert code == 0, stderr
    reference = fxlrp.read_explanations(clean)
    assert np.array_equal(explanations.relevance[kept], reference.relevance)
    assert np.array_equal(explanations.scores[kept], reference.scores)
    assert np.isfinite(explanations.relevance[kept]).all()

    code, stdout, stderr = run(["explain", "--model", DIGITS, "--weights", str(digits["weights"]),
                                str(digits["overflow"] / "00.png"), str(digits["overflow"] / "03b_huge.npy"),
                                "--out", str(digits["folder"] / "overflow_images")], capsys)
    assert code == 2 and stdout == ""
    assert one_error_line(stderr).startswith(f"fxlrp: error: {digits['overflow'] / '03b_huge.npy'}: the model's "
                                             f"output is NaN or Inf")


@pytest.mark.slow
def test_one_and_two_processes_and_a_resumed_run_write_the_same_files_with_a_skipped_sample(
        digits: dict[str, Path], tmp_path: Path) -> None:
    """torchrun (gloo, CPU) with 2 processes, 1 process, and a run resumed after its second shard
    was lost: the same bytes, the skipped samples included (10 samples, shards of 4, batches of 3)."""
    options = ["--shard-size", "4", "--batch-size", "3", "--on-error", "skip"]

    def command(out: Path) -> list[str]:
        return ["-m", "fxlrp", *explain_data(digits["bad"], out, digits["weights"], *options)]

    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          *command(tmp_path / "two")], env=ENVIRONMENT, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr
    assert "process 1 of 2: 1 shard(s), 4 samples" in two.stderr, two.stderr
    one = subprocess.run([sys.executable, *command(tmp_path / "one")], env=ENVIRONMENT, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert snapshot(tmp_path / "two") == snapshot(tmp_path / "one")
    index = json.loads((tmp_path / "one" / "index.json").read_text())
    assert [entry["index"] for entry in index["skipped"]] == [4, 7]

    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "one", resumed)
    (resumed / "index.json").unlink()  # as a run killed while computing shard 1 leaves the directory
    (resumed / "shards" / "relevance-000001.json").unlink()
    again = subprocess.run([sys.executable, *command(resumed)], env=ENVIRONMENT, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "2 of 3 shards were already complete" in again.stdout
    assert "skipped sample 7 ('05b_damaged.png')" in again.stderr
    assert snapshot(resumed) == snapshot(tmp_path / "one")


# ---------------------------------------------------------------------------------------------
# 2. torchvision's families, timm and Hugging Face image models


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random BatchNorm statistics (the default ones make BatchNorm nearly the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    return model.eval()


@pytest.mark.slow
def test_a_torchvision_segmentation_model_explains_a_class_over_the_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchvision:lraspp_mobilenet_v3_large, preprocessed as its weights' transforms() (shorter
    side to 520), explains each image's class with the largest logits summed over the pixels:
    relevance starts at that class's logit at every pixel."""
    import torchvision

    torch.manual_seed(0)
    model = randomised(torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5), seed=1)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    pictures = [random_picture(tmp_path / "images" / f"{index}.png", index) for index in range(2)]
    out = tmp_path / "out"
    code, stdout, stderr = run(["explain", "--model", "torchvision:lraspp_mobilenet_v3_large", "--weights",
                                str(tmp_path / "weights.pt"), "--data", str(tmp_path / "images"), "--out", str(out),
                                "--dtype", "float64"], capsys)
    assert code == 0, stderr
    explanations = fxlrp.read_explanations(out)

    transform = torchvision.models.get_model_weights("lraspp_mobilenet_v3_large").DEFAULT.transforms()
    inputs = torch.stack([transform(Image.open(path).convert("RGB")) for path in pictures]).double()
    assert explanations.relevance.shape == (2, 3, 520, 650) == tuple(inputs.shape)
    model = model.double()
    with torch.no_grad():
        logits = model(inputs)["out"]
    summed = logits.sum(dim=(2, 3))
    classes = summed.argmax(dim=1)
    assert (explanations.predictions == classes.numpy()).all() and (explanations.targets == classes.numpy()).all()
    assert relative_error(explanations.scores, summed.gather(1, classes[:, None])[:, 0]) < 1e-12
    start = torch.zeros_like(logits)
    for row, chosen in enumerate(classes.tolist()):
        start[row, chosen] = logits[row, chosen]  # the class's logit at every pixel: their sum is the score
    expected = fxlrp.attribute(fxlrp.convert(model, fxlrp.rules.Epsilon(1e-6)), inputs, target=start,
                               output=lambda result: result["out"])
    assert relative_error(explanations.relevance, expected) < 1e-12

    code, stdout, stderr = run(["explain", "--model", "torchvision:lraspp_mobilenet_v3_large", "--weights",
                                str(tmp_path / "weights.pt"), str(pictures[0]), "--target", "3", "--out",
                                str(tmp_path / "pngs")], capsys)
    assert code == 0, stderr
    assert stdout.startswith(f"{pictures[0]}: class 3 (logits summed over the pixels ")
    assert (tmp_path / "pngs" / "0.heatmap.png").is_file()
    help_text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["explain"].format_help().split())
    assert "a segmentation model explains a class over the whole image: the sum of that class's logits over all " \
           "pixels" in help_text


def test_a_torchvision_video_model_explains_clips_and_detection_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torchvision

    torch.manual_seed(0)
    model = randomised(torchvision.models.video.r3d_18(weights=None, num_classes=7), seed=2)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    clips = torch.randn(2, 3, 4, 32, 32, generator=torch.Generator().manual_seed(3))
    torch.save(clips, tmp_path / "clips.pt")
    out = tmp_path / "out"
    code, _, stderr = run(["explain", "--model", "torchvision:r3d_18", "--weights", str(tmp_path / "weights.pt"),
                           "--data", str(tmp_path / "clips.pt"), "--target", "5", "--dtype", "float64", "--out",
                           str(out)], capsys)
    assert code == 0, stderr
    explanations = fxlrp.read_explanations(out)
    expected = fxlrp.attribute(fxlrp.convert(model.double(), fxlrp.rules.Epsilon(1e-6)), clips.double(), target=5)
    assert explanations.relevance.shape == (2, 3, 4, 32, 32)
    assert relative_error(explanations.relevance, expected) < 1e-12

    np.save(tmp_path / "clip.npy", clips[0].numpy())
    code, stdout, stderr = run(["explain", "--model", "torchvision:r3d_18", "--weights", str(tmp_path / "weights.pt"),
                                str(tmp_path / "clip.npy"), "--out", str(tmp_path / "pngs")], capsys)
    assert code == 0, stderr
    assert Image.open(tmp_path / "pngs" / "clip.heatmap.png").size == (4 * 256, 256)  # the frames side by side

    picture = random_picture(tmp_path / "picture.png", 0)
    for model_name, message in (
            ("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", "is an object detection model; the command line "
                                                                  "explains classification, segmentation and video "
                                                                  "models, not detection models yet"),
            ("torchvision:raft_small", "is an optical flow model"),
            ("torchvision:quantized_resnet18", "is a quantized model (int8 kernels: explain its float version"),
            ("torchvision:r3d_18", "is an image; the model takes video clips: give .pt/.npy tensors [channels, "
                                   "frames, height, width]")):
        code, stdout, stderr = run(["explain", "--model", model_name, str(picture), "--out", str(tmp_path / "no")],
                                   capsys)
        assert code == 2 and stdout == ""
        assert message in one_error_line(stderr)
    assert not (tmp_path / "no").exists()


def test_timm_models_get_their_own_data_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """timm:NAME (and a timm factory, timm.models:NAME) are preprocessed by the model's data
    config: a 32x32 picture goes in resized and centre-cropped to 224x224, normalised."""
    import timm
    import timm.data

    torch.manual_seed(0)
    model = randomised(timm.create_model("convnext_atto", pretrained=False, num_classes=4), seed=4)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    picture = random_picture(tmp_path / "images" / "a.png", 5, (32, 32))
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    inputs = transform(Image.open(picture).convert("RGB"))[None].double()
    assert inputs.shape == (1, 3, 224, 224)
    explain = fxlrp.convert(model.double(), fxlrp.rules.Epsilon(1e-6))
    for spec, weights, reference in (("timm:convnext_atto", ["--weights", str(tmp_path / "weights.pt")], explain),
                                     ("timm.models:convnext_atto", [], None)):
        out = tmp_path / spec.replace(":", "_")
        code, _, stderr = run(["explain", "--model", spec, *weights, "--data", str(tmp_path / "images"), "--target",
                               "2", "--dtype", "float64", "--out", str(out)], capsys)
        assert code == 0, stderr
        explanations = fxlrp.read_explanations(out)
        if reference is None:  # the command's random weights: seed 0, as in every data-set run
            torch.manual_seed(0)
            reference = fxlrp.convert(timm.models.convnext_atto().eval().double(), fxlrp.rules.Epsilon(1e-6))
        expected = fxlrp.attribute(reference, inputs, target=2)
        assert explanations.relevance.shape == (1, 3, 224, 224)
        assert relative_error(explanations.relevance, expected) < 1e-12, spec


def test_a_saved_hugging_face_image_classifier_with_its_image_processor(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=3, initializer_range=0.3)
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(tmp_path / "vit")
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                                               image_std=[0.2, 0.3, 0.4])
    processor.save_pretrained(tmp_path / "vit")
    model.save_pretrained(tmp_path / "vit_without_processor")
    capsys.readouterr()  # (saving's progress bar)
    pictures = [random_picture(tmp_path / "images" / f"{index}.png", 10 + index) for index in range(2)]
    out = tmp_path / "out"
    code, _, stderr = run(["explain", "--model", f"hf:{tmp_path / 'vit'}", "--data", str(tmp_path / "images"),
                           "--target", "1", "--dtype", "float64", "--out", str(out)], capsys)
    assert code == 0, stderr
    explanations = fxlrp.read_explanations(out)
    inputs = torch.cat([processor(images=Image.open(path).convert("RGB"), return_tensors="pt")["pixel_values"]
                        for path in pictures]).double()
    expected = fxlrp.attribute(fxlrp.convert(model.double(), fxlrp.rules.Epsilon(1e-6)), inputs, target=1)
    assert explanations.relevance.shape == (2, 3, 32, 32)
    assert relative_error(explanations.relevance, expected) < 1e-12

    code, stdout, stderr = run(["explain", "--model", f"hf:{tmp_path / 'vit_without_processor'}", str(pictures[0]),
                                "--out", str(tmp_path / "pngs")], capsys)
    assert code == 0, stderr  # no image processor saved: resized to the config's image_size
    assert (tmp_path / "pngs" / "0.heatmap.png").is_file()
    code, stdout, stderr = run(["explain", "--model", f"hf:{tmp_path / 'vit'}", "--text", "a cat"], capsys)
    assert code == 2 and "is an image classifier (ViTForImageClassification); give it image files or --data" in \
        one_error_line(stderr)


# ---------------------------------------------------------------------------------------------
# 3. a language model's target token


def test_a_target_that_is_not_one_token_of_the_vocabulary_is_an_error(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A causal language model whose tokenizer has an unknown token: ``--target zzz`` used to
    explain '[UNK]' without a word."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = ["[PAD]", "[UNK]", "the", "movie", "was", "good", "plot"]
    tokenizer = Tokenizer(models.WordPiece({word: index for index, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(words), n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)).eval()
    model.save_pretrained(tmp_path / "lm")
    wrapped.save_pretrained(tmp_path / "lm")
    capsys.readouterr()  # (saving's progress bar)
    command = ["explain", "--model", f"hf:{tmp_path / 'lm'}", "--text", "the movie was"]

    code, stdout, stderr = run([*command, "--target", "zzz"], capsys)
    assert code == 2 and stdout == ""
    assert one_error_line(stderr) == (
        "fxlrp: error: --target 'zzz' is not a token of the model's vocabulary: it tokenises to [UNK] "
        "('[UNK]' = 1), where '[UNK]' is the unknown token; give one token as the vocabulary writes it or a token "
        "id (0..6)")
    code, stdout, stderr = run([*command, "--target", "good plot"], capsys)
    assert code == 2 and stdout == ""
    assert one_error_line(stderr) == (
        "fxlrp: error: --target 'good plot' is 2 tokens (good plot); give one token or a token id: a target is one "
        "token of the vocabulary ('good' = 5, 'plot' = 6), e.g. --target 'good' or --target 5")
    code, stdout, stderr = run([*command, "--target", "Good"], capsys)  # one token once lower-cased
    assert code == 0, stderr
    assert stdout.startswith("next token 'good' (id 5, logit ")


# ---------------------------------------------------------------------------------------------
# 4. --help without torch


def test_the_command_line_parses_and_prints_help_without_torch() -> None:
    """``fxlrp --help`` took 2.5-3.2 s, most of it importing torch. The parser and ``--help`` need
    none of it: with ``import torch`` failing, they run (fxlrp's package ``__init__``, which
    imports torch for ``fxlrp.convert``, is left out here: a bare package of the same folder)."""
    code = (
        "import sys, types\n"
        "sys.modules['torch'] = None  # import torch raises ImportError\n"
        f"package = types.ModuleType('fxlrp'); package.__path__ = [{str(ROOT / 'fxlrp')!r}]\n"
        "sys.modules['fxlrp'] = package\n"
        "from fxlrp.app.cli import main\n"
        "for arguments in (['--help'], ['explain', '--help'], ['report', '--help']):\n"
        "    try:\n"
        "        main(arguments)\n"
        "    except SystemExit as exit_:\n"
        "        assert exit_.code == 0, exit_.code\n"
        "print(sorted(name for name in ('numpy', 'PIL', 'fxlrp.app.models.spec', 'fxlrp.app.readers',\n"
        "                               'fxlrp.app.composites') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=ENVIRONMENT, cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: fxlrp explain" in result.stdout and "--on-error {stop,skip}" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"
    from fxlrp.app.cli_options import COMPOSITE_NAMES
    from fxlrp.app.composites import composite_by_name
    from fxlrp.app.preprocessing import Preprocessing

    for name in COMPOSITE_NAMES:  # each name --help lists is one the commands know
        composite_by_name(name, Preprocessing(None, 3, (0.0,) * 3, (1.0,) * 3))


def test_the_report_of_a_hugging_face_model_lists_what_its_run_made(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``fxlrp report hf:DIR`` (refused before): the model runs eagerly, so the report lists the
    operations of one explanation of an example sentence - every linear layer of the model, by
    its module's name, with its rule and line."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "report", "explains", "this", "sentence", "."]
    tokenizer = Tokenizer(models.WordPiece({word: index for index, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16)).eval()
    model.save_pretrained(tmp_path / "bert")
    wrapped.save_pretrained(tmp_path / "bert")
    capsys.readouterr()
    code, stdout, stderr = run(["report", f"hf:{tmp_path / 'bert'}"], capsys)
    assert code == 0, stderr
    linear = {line.split()[2] for line in stdout.splitlines() if line.startswith("model › ") and " linear " in line}
    assert linear == {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    assert "(after one explanation of 'The report explains this sentence.', its predicted class)" in stdout
    assert "co_varnames" not in stdout and "RecordingFailed" not in stdout
