"""issue 59 (the first try, second round), the command line: a model's own refusal of an image
in the API's one line, ``--device``/``--dtype`` for image files, the help, tokens shown as text,
pictures at the image's aspect with a colour bar."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from support.command_line import MODEL, run

import fxlrp

TINY_VIT = "app.test_cli_second_round:tiny_vit"


def tiny_vit() -> torch.nn.Module:
    """torchvision's ViT with a fixed 32 x 32 input (its forward asserts the image's height), small."""
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                                hidden_dim=8, mlp_dim=16, num_classes=5)


def fxlrp_lines(stderr: str) -> str:
    """Standard error without torch's own log lines (``W1202 02:16:04.41 ... _pytree.py:630] ...``,
    printed once per process when a library registers itself), which are no part of fxlrp's."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not re.match(r"[WIE]\d{4} \d\d:", line))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The relevance each of the command's calls of ``attribute`` returned, in order."""
    from fxlrp.app import commands

    calls: list[torch.Tensor] = []

    def recording(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(fxlrp.attribute(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(commands, "attribute", recording)
    return calls


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
    assert fxlrp_lines(stderr) == f"fxlrp: error: {image}: {api.value}\n"
    assert "Expected 32 but got 20!" in stderr  # (the model's message with the number, not a tracer's proxy)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 6. --device and --dtype for image files


def test_image_files_take_dtype_float64_and_give_the_apis_float64_relevance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: list[torch.Tensor]) -> None:
    """``--dtype``/``--device`` were refused for image files (only ``--data`` took them). With
    ``--dtype float64`` the model and the image run in float64: the relevance the command computes
    (recorded from its call of ``attribute``) is float64 and equals ``fxlrp.attribute`` on a float64
    copy of the model within 1e-9."""
    from fxlrp.toys.digits import DigitsCNN
    torch.manual_seed(0)
    weights = tmp_path / "digits.pt"
    torch.save(DigitsCNN().state_dict(), weights)
    pixels = np.random.default_rng(1).integers(0, 256, size=(8, 8), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "digit.png")
    code, stdout, stderr = run(["explain", "--model", MODEL, "--weights", str(weights),
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


# ---------------------------------------------------------------------------------------------
# 8. the help: version, hf:DIR in report, --mean/--std, a contrast target, demo, --out


def help_of(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, stdout, stderr = run(arguments, capsys)
    assert code == 0, stderr
    return " ".join(stdout.split())  # (argparse wraps lines at the terminal's width)


def test_the_help_states_version_sources_formats_contrast_demo_and_required_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert help_of(["--version"], capsys) == f"fxlrp {metadata.version('fxlrp')}"
    report = help_of(["report", "--help"], capsys)
    assert "torchvision:NAME, timm:NAME, package.module:FACTORY or hf:DIR" in report
    explain = help_of(["explain", "--help"], capsys)
    assert ("--mean M1,M2,... per-channel mean for normalisation (x - mean) / std of pixels in [0, 1), one number per "
            "channel separated by commas, e.g. 0.485,0.456,0.406") in explain
    assert "--std S1,S2,... per-channel std, one positive number per channel separated by commas" in explain
    assert "A,B for image files and a classifier: a contrast, logit A minus logit B" in explain
    assert "required for image files and --data, optional for --text" in explain
    assert "(required) directory for the shards" in help_of(["evaluate", "--help"], capsys)
    demo = help_of(["demo", "--help"], capsys)
    assert "Three explanations, offline: a small CNN trained for seconds on scikit-learn's bundled digits" in demo


def test_a_contrast_target_explains_logit_a_minus_logit_b_as_the_api_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: list[torch.Tensor]) -> None:
    """``--target 3,5``: the relevance of logit 3 minus logit 5, equal (float64, 1e-9) to
    ``fxlrp.attribute(..., target=(3, 5))`` and, by linearity of LRP-0 in the output relevance,
    to the relevance of class 3 minus that of class 5; a third class or a bad one is one line."""
    from fxlrp.toys.digits import DigitsCNN
    torch.manual_seed(0)
    weights = tmp_path / "digits.pt"
    torch.save(DigitsCNN().state_dict(), weights)
    pixels = np.random.default_rng(2).integers(0, 256, size=(8, 8), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "digit.png")
    command = ["explain", "--model", MODEL, "--weights", str(weights), "--dtype", "float64",
               "--composite", "lrp0", str(tmp_path / "digit.png"), "--out", str(tmp_path / "out")]
    code, stdout, stderr = run([*command, "--target", "3,5"], capsys)
    assert code == 0, stderr
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights))
    explain = fxlrp.convert(model.double().eval(), fxlrp.rules.Epsilon(0.0))
    inputs = torch.from_numpy(pixels.astype(np.float32) / 255.0).double()[None, None]
    expected = fxlrp.attribute(explain, inputs, target=(3, 5))
    difference = fxlrp.attribute(explain, inputs, target=3) - fxlrp.attribute(explain, inputs, target=5)
    (relevance,) = recorded
    scale = expected.abs().max()
    assert (relevance - expected).abs().max() / scale < 1e-9
    assert (difference - expected).abs().max() / scale < 1e-9
    logits = model(inputs)[0]
    assert f"digit.png: class 3 minus class 5 (output {logits[3]:.3g} - {logits[5]:.3g}), relevance sum " in stdout
    for given, message in (("3,5,7", "--target '3,5,7' names 3 classes; give one class, or two A,B: logit A minus "
                                     "logit B"),
                           ("3,12", "--target 12 is out of range: the model has 10 classes (0..9)")):
        code, _, stderr = run([*command, "--target", given], capsys)
        assert code == 2 and fxlrp_lines(stderr) == f"fxlrp: error: {message}\n", stderr


# ---------------------------------------------------------------------------------------------
# 5. pictures at the image's aspect, a readable size, with a colour bar and a title


def test_pictures_keep_the_images_aspect_and_show_the_relevance_with_a_colour_bar(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: list[torch.Tensor]) -> None:
    """A 40 x 50 image squashed to 8 x 8 (``--size``) was drawn 128 x 128; its heatmap is now
    drawn at the file's aspect with a short side of 256 pixels, nearest neighbour: each pixel
    read back (bwr inverted) is the normalised relevance of the input pixel under its centre.
    The figure holds the same heatmap, a title naming model, target and composite, and a colour
    bar running from +1 (top) to -1 (bottom)."""
    from fxlrp.viz import image
    path = picture(tmp_path / "wide.png", 50, 40)
    code, stdout, stderr = run(["explain", "--model", MODEL, "--size", "8", "--target", "2",
                                "--composite", "epsilon_plus", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, stderr
    assert stdout.rstrip().endswith(f"-> {tmp_path / 'out' / 'wide.figure.png'}")
    (relevance,) = recorded
    values = relevance[0].sum(0).double().numpy()
    normalised = values / np.abs(values).max()
    rows, columns = 256, 320  # (40 x 50 with a short side of 256)
    expected = normalised[((np.arange(rows) + 0.5) * 8 / rows).astype(int)][:, ((np.arange(columns) + 0.5) * 8
                                                                                / columns).astype(int)]
    heatmap = image.read_png(tmp_path / "out" / "wide.heatmap.png")
    assert heatmap.shape == (rows, columns, 3)
    assert np.abs(image.signed_values_from_bwr(heatmap) - expected).max() < 2.5 / 255
    assert image.read_png(tmp_path / "out" / "wide.overlay.png").shape == (rows, columns, 3)
    figure = image.read_png(tmp_path / "out" / "wide.figure.png")
    top = next(row for row in range(figure.shape[0]) if (figure[row, 0] != 255).any()
               and (figure[row:row + rows, :columns] == heatmap).all())
    assert top > 10  # (the title's line above)
    bar = figure[top:top + rows, columns + 8 + image.COLOUR_BAR_WIDTH // 2]
    shown = image.signed_values_from_bwr(bar)
    assert abs(shown[0] - 1) < 2.5 / 255 and abs(shown[-1] + 1) < 2.5 / 255
    assert np.abs(np.diff(shown)).max() < 3 / 255 and (np.diff(shown) <= 1e-12).all()  # (monotone, +1 to -1)
    title = figure[:top]
    assert (title < 128).any()  # (dark text in it: the words are not read back)


def test_save_pngs_defaults_to_a_readable_size_by_nearest_neighbour(tmp_path: Path) -> None:
    """A 32 x 32 heatmap was saved 32 x 32; by default it is enlarged 8 times (short side 256),
    pixel for pixel."""
    from fxlrp.viz import image

    maps = image.heatmap(torch.randn(2, 1, 32, 24, generator=torch.Generator().manual_seed(0)))
    paths = image.save_pngs(maps, tmp_path, ["a", "b"])
    for index, written in enumerate(paths):
        read = image.read_png(written)
        assert read.shape == (32 * 11, 24 * 11, 3)  # (ceil(256 / 24) = 11)
        assert (read == np.repeat(np.repeat(maps[index], 11, axis=0), 11, axis=1)).all()


def test_data_set_pictures_are_named_without_the_files_suffix_unless_two_would_share_a_name() -> None:
    """``--png`` wrote ``00.png.heatmap.png``; now ``00.heatmap.png``, and ``a.png`` and ``a.jpg``
    (which would both become ``a``) keep their whole names rather than overwrite each other."""
    from fxlrp.app.explain_dataset import picture_names

    names = ["cat/00.png", "cat/01.jpeg", "a.png", "a.jpg", "17", "dog/a.png"]
    assert picture_names(names) == ["cat/00", "cat/01", "a.png", "a.jpg", "17", "dog/a"]


# ---------------------------------------------------------------------------------------------
# 10. GoogLeNet and Inception v3 built for their weights as torchvision builds them


def _torchvision_state_dict(name: str, auxiliary: bool) -> dict[str, torch.Tensor]:
    """Random weights of the shape of torchvision's file for ``name`` (1000 classes; its file has
    the auxiliary heads, a state dict saved from torchvision's model built with weights has not)."""
    torch.manual_seed(0)
    model = {"googlenet": torchvision.models.GoogLeNet,
             "inception_v3": torchvision.models.Inception3}[name](aux_logits=True, init_weights=False)
    prefix = "aux1." if name == "googlenet" else "AuxLogits."
    return {key: value for key, value in model.state_dict().items()
            if auxiliary or not key.startswith((prefix, "aux2."))}


@pytest.mark.parametrize(("name", "auxiliary", "size"), [
    ("googlenet", False, 32),  # (about 2 s; the others in the slow lane)
    pytest.param("googlenet", True, 32, marks=pytest.mark.slow),
    pytest.param("inception_v3", True, 75, marks=pytest.mark.slow)])
def test_googlenet_and_inception_v3_with_weights_are_built_as_torchvision_builds_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, auxiliary: bool, size: int) -> None:
    """torchvision's builders turn ``transform_input`` on for their weights (whose ImageNet-normalised
    inputs the model maps to its training's normalisation); the command line built both with it off,
    so a pretrained model read its inputs wrongly. Reference: torchvision's own builder with its
    weights (``get_state_dict`` returning these weights instead of downloading): the same
    ``transform_input`` and bit-for-bit the same logits, for torchvision's file (with the
    auxiliary heads) and for a state dict saved from the model torchvision built (without)."""
    from fxlrp.app.models.spec import load_model

    torch.save(_torchvision_state_dict(name, auxiliary), tmp_path / "weights.pt")
    from_file = _torchvision_state_dict(name, True)  # (torchvision's builder reads its file's auxiliary heads)
    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", lambda *args, **kwargs: from_file)
    reference = torchvision.models.get_model(name, weights="DEFAULT").eval()
    model = load_model(f"torchvision:{name}", tmp_path / "weights.pt")
    assert model.transform_input is reference.transform_input is True
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    assert load_model(f"torchvision:{name}").transform_input is False  # random weights: as weights=None builds it


@pytest.mark.slow  # (12 s: GoogLeNet converted twice and explained in float64)
def test_googlenets_transform_input_is_explained_by_the_in_model_normalisation_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--weights`` and a composite whose first-layer rule (flat) does not share by the input's
    values: the raw input gets the relevance the first layer's rule gives the image
    ``transform_input`` makes (the same weights without it, explained on that image; float64,
    1e-10)."""
    from support.references import relative_error

    from fxlrp.app import commands

    state_dict = _torchvision_state_dict("googlenet", False)
    torch.save(state_dict, tmp_path / "weights.pt")
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def recording(explain: object, inputs: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append((inputs, fxlrp.attribute(explain, inputs, *args, **kwargs)))
        return calls[-1][1]

    monkeypatch.setattr(commands, "attribute", recording)
    code, _, stderr = run(["explain", "--model", "torchvision:googlenet", "--weights", str(tmp_path / "weights.pt"),
                           "--composite", "epsilon_plus_flat", "--dtype", "float64", "--size", "32", "--target", "7",
                           str(picture(tmp_path / "image.png", 40, 40)), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, stderr
    [(inputs, relevance)] = calls
    plain = torchvision.models.GoogLeNet(aux_logits=False, transform_input=False, init_weights=False)
    plain.load_state_dict(state_dict)
    plain = plain.double().eval()
    transformed = torchvision.models.GoogLeNet._transform_input(
        torchvision.models.GoogLeNet(aux_logits=False, transform_input=True, init_weights=False), inputs)
    expected = fxlrp.attribute(fxlrp.convert(plain, fxlrp.composites.EpsilonPlusFlat()), transformed, target=7)
    assert relative_error(relevance, expected) < 1e-10 and expected.abs().sum() > 0
