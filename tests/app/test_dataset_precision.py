"""``fxlrp explain --data`` on other devices and in other precisions: bfloat16 and float16 under
autocast on the CPU against float32; CUDA where present (skipped, with the reason, where not). MPS
has no float64 to compare the command in: the library's float32 relevance on MPS is held to its
rounding bound in tests/unit/test_robustness.py, and the command's device handling is CUDA's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fxlrp
from fxlrp.app import cli
from fxlrp.app.composites import composite_by_name
from fxlrp.app.preprocessing import Preprocessing
from fxlrp.toys.digits import DigitsCNN, load_digits_split, train_classifier

MODEL = "fxlrp.toys.digits:DigitsCNN"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A DigitsCNN trained for 3 epochs and 64 test digits with their labels as a .pt file."""
    folder = tmp_path_factory.mktemp("precision")
    torch.manual_seed(0)
    data = load_digits_split()
    model = train_classifier(DigitsCNN(), data.train_images, data.train_labels, epochs=3)
    torch.save(model.state_dict(), folder / "weights.pt")
    torch.save((data.test_images[:64], data.test_labels[:64]), folder / "digits.pt")
    return {"folder": folder, "weights": folder / "weights.pt", "data": folder / "digits.pt"}


def explain(trained: dict[str, Path], out: str, *options: str) -> fxlrp.app.explanations_store.Explanations:
    arguments = ["explain", "--model", MODEL, "--weights", str(trained["weights"]), "--data", str(trained["data"]),
                 "--out", str(trained["folder"] / out), "--target", "label", "--batch-size", "16", *options]
    assert cli.main(arguments) == 0
    return fxlrp.read_explanations(trained["folder"] / out)


def attribute_under_autocast(trained: dict[str, Path], dtype: str, composite: str) -> np.ndarray:
    """``fxlrp.attribute`` of the digits CNN for each digit's label, in the command's batches of
    16, under autocast to ``dtype``, stored as the command stores relevance (float16 as float16,
    bfloat16 as float32, which holds it exactly)."""
    model = DigitsCNN()
    model.load_state_dict(torch.load(trained["weights"], weights_only=True))
    explain = fxlrp.convert(model.eval(), composite_by_name(composite, Preprocessing(None, 1, (0.0,), (1.0,))))
    inputs, labels = torch.load(trained["data"], weights_only=True)
    relevance = []
    for images, targets in zip(inputs.split(16), labels.split(16), strict=True):
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            relevance.append(fxlrp.attribute(explain, images, target=targets))
    return torch.cat(relevance).numpy().astype(np.float16 if dtype == "float16" else np.float32)


@pytest.mark.parametrize("composite", ["epsilon", "epsilon_plus_flat"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_on_the_cpu_gives_finite_relevance_the_apis(trained: dict[str, Path], dtype: str,
                                                            composite: str) -> None:
    """``--dtype bfloat16`` / ``float16``: the command's relevance is finite, stored in its dtype,
    and bit for bit ``fxlrp.attribute``'s under the same autocast on the same batches (the same
    kernels on the same values: how much 16-bit arithmetic rounds depends on the CPU, but not
    between two runs of it). How far 16-bit relevance is from float32's is a measurement, not a
    bound: ``benchmarks/low_precision.py`` (docs/benchmarks.md)."""
    lower = explain(trained, f"{dtype}_{composite}", "--composite", composite, "--dtype", dtype)
    assert lower.relevance.dtype == (np.float16 if dtype == "float16" else np.float32)
    assert np.isfinite(lower.relevance).all() and np.abs(lower.relevance).sum() > 0
    assert np.array_equal(lower.relevance, attribute_under_autocast(trained, dtype, composite))


def test_float64_equals_attribute_in_float64(trained: dict[str, Path]) -> None:
    explanations = explain(trained, "float64", "--dtype", "float64")
    model = DigitsCNN()
    model.load_state_dict(torch.load(trained["weights"], weights_only=True))
    inputs, labels = torch.load(trained["data"], weights_only=True)
    expected = fxlrp.attribute(fxlrp.convert(model.double().eval(), fxlrp.rules.Epsilon(1e-6)), inputs.double(),
                               target=labels)
    assert np.abs(explanations.relevance - expected.numpy()).max() < 1e-12 * np.abs(expected.numpy()).max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")
def test_cuda_gives_the_relevance_of_the_cpu(trained: dict[str, Path]) -> None:
    """``--device cuda`` against the CPU, both in float64: other kernels, each rounding at ~1e-16,
    so 1e-10 of the largest value holds by construction. (How far 16-bit relevance is from
    float32's on a device is a measurement: ``benchmarks/low_precision.py``.)"""
    reference = explain(trained, "cpu_float64", "--dtype", "float64")
    on_gpu = explain(trained, "cuda_float64", "--dtype", "float64", "--device", "cuda")
    assert np.isfinite(on_gpu.relevance).all()
    assert np.abs(on_gpu.relevance - reference.relevance).max() < 1e-10 * np.abs(reference.relevance).max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")
def test_the_library_explains_models_and_inputs_on_cuda() -> None:
    torch.manual_seed(0)
    model = DigitsCNN().double().eval()
    inputs = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    expected = fxlrp.attribute(fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat()), inputs, target=3)
    relevance = fxlrp.attribute(fxlrp.convert(model.cuda(), fxlrp.composites.EpsilonPlusFlat()), inputs.cuda(),
                                target=3)
    assert relevance.is_cuda
    assert (relevance.cpu() - expected).abs().max() < 1e-10 * expected.abs().max()
