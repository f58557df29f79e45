"""issue 59 (the first try, second round), the command line: a model's own refusal of an image
in the API's one line, ``--device``/``--dtype`` for image files, the help, tokens shown as text,
pictures at the image's aspect with a colour bar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

import fxlrp
from fxlrp.app import cli

TINY_VIT = "app.test_cli_second_round:tiny_vit"


def tiny_vit() -> torch.nn.Module:
    """torchvision's ViT with a fixed 32 x 32 input (its forward asserts the image's height), small."""
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                                hidden_dim=8, mlp_dim=16, num_classes=5)


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def picture(path: Path, width: int, height: int, seed: int = 0) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


# ---------------------------------------------------------------------------------------------
# 1. the model's own refusal: the API's one line, exit code 2


def test_an_image_the_model_refuses_gives_the_apis_one_line_and_exit_code_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ViT's ``torch._assert`` on the image height failed inside the traced graph (``Expected 32
    but got Proxy(getitem_2)``, 40 lines of traceback); the command now asks the model, as
    ``fxlrp.attribute`` does, and prints the API's message."""
    image = picture(tmp_path / "small.png", 60, 50)
    code, stdout, stderr = run(["explain", "--model", TINY_VIT, str(image), "--size", "20", "--out",
                                str(tmp_path / "out")], capsys)
    inputs = torch.from_numpy(np.asarray(Image.open(image).resize((20, 20), Image.Resampling.BILINEAR),
                                         dtype=np.float32).transpose(2, 0, 1) / 255.0)[None]
    with pytest.raises(fxlrp.ExplanationInputError) as api:
        fxlrp.attribute(fxlrp.convert(tiny_vit().eval()), inputs)
    assert code == 2 and stdout == ""
    assert stderr == f"fxlrp: error: {image}: {api.value}\n"
    assert "Expected 32 but got 20!" in stderr  # (the model's message with the number, not a tracer's proxy)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 6. --device and --dtype for image files


def test_image_files_take_dtype_float64_and_give_the_apis_float64_relevance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dtype``/``--device`` were refused for image files (only ``--data`` took them). With
    ``--dtype float64`` the model and the image run in float64: the relevance the command computes
    (recorded from its call of ``attribute``) is float64 and equals ``fxlrp.attribute`` on a float64
    copy of the model within 1e-9."""
    from fxlrp.app import commands
    from fxlrp.toys.digits import DigitsCNN

    recorded = []

    def recording(*args: object, **kwargs: object) -> torch.Tensor:
        relevance = fxlrp.attribute(*args, **kwargs)
        recorded.append(relevance)
        return relevance

    monkeypatch.setattr(commands, "attribute", recording)
    torch.manual_seed(0)
    weights = tmp_path / "digits.pt"
    torch.save(DigitsCNN().state_dict(), weights)
    pixels = np.random.default_rng(1).integers(0, 256, size=(8, 8), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "digit.png")
    code, stdout, stderr = run(["explain", "--model", "fxlrp.toys.digits:DigitsCNN", "--weights", str(weights),
                                "--dtype", "float64", "--device", "cpu", "--target", "3", str(tmp_path / "digit.png"),
                                "--out", str(tmp_path / "out")], capsys)
    assert code == 0, stderr
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights))
    inputs = torch.from_numpy(pixels.astype(np.float32) / 255.0).double()[None, None]  # (pixels read in float32)
    expected = fxlrp.attribute(fxlrp.convert(model.double().eval(), fxlrp.rules.Epsilon(1e-6)), inputs, target=3)
    (relevance,) = recorded
    assert relevance.dtype == torch.float64
    difference = (relevance - expected).abs().max() / expected.abs().max()
    assert difference < 1e-9, difference
    assert "class 3" in stdout
