"""fxlrp.evaluate against Quantus 0.6 on the same curves: pixel flipping and region perturbation of
a batch of 64 images, timed in the same process (interleaved repeats, medians), with the ratio.

Workloads (random weights; the curves' cost does not depend on what the model learnt):

- digits: ``fxlrp.toys.digits.DigitsCNN`` on 64 scikit-learn digits ``[1, 8, 8]``: pixel flipping one
  pixel per step (64 steps) and region perturbation with 2 x 2 patches (16 regions);
- cifar-sized: a 3-layer CNN on 64 random images ``[3, 32, 32]``: pixel flipping 64 values per step
  (48 steps) and region perturbation with 4 x 4 patches (64 regions).

The attributions have the input's shape (Quantus's pixel flipping then flips single values, and
fxlrp with ``per_channel=True``).

Both libraries compute the same curves (tests/evaluate/test_quantus_parity.py), the MoRF order
only, logits (``softmax=False``), the per-image minimum as baseline ("black"); Quantus with
``batch_size=64`` (the whole batch per model call and step), fxlrp with ``batch_size=4096`` rows
(perturbed images) per model call. The curves are checked to agree (1e-4, float32) before timing.

Beside each library's total, the model's forwards alone: the same number of images (random ones;
these models' cost does not depend on the pixels) in each library's batches, fxlrp's
``samples x (steps + 1)`` rows in batches of 4096 plus the unperturbed batch, Quantus's one
forward of the 64 images per step plus the unperturbed batch. ``bound`` = Quantus's total over
fxlrp's forwards: the speed-up fxlrp would reach if everything but its forwards took no time.

On CUDA (``--device cuda``) the models, images and attributions live on the GPU, fxlrp's curves
run there, Quantus is given ``device="cuda"`` (it moves each step's NumPy batch there), and every
timed run ends when the device has finished. ``benchmarks/gpu_checks.sh`` runs it so.

Run: ``python benchmarks/faithfulness_speed.py [--repeats 5] [--device cpu|cuda]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fxlrp.evaluate import image_curves
from fxlrp.toys.digits import DigitsCNN, load_digits_split

ROWS = 4096
"""fxlrp's perturbed images per model call."""


def cifar_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def workloads(device: torch.device) -> dict[str, tuple[nn.Module, torch.Tensor, int, int]]:
    torch.manual_seed(0)
    digits = load_digits_split().test_images[:64]
    cifar = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return {"digits [1, 8, 8]": (DigitsCNN().eval().to(device), digits.to(device), 1, 2),
            "cifar-sized [3, 32, 32]": (cifar_cnn().eval().to(device), cifar.to(device), 64, 4)}


def interleaved_medians(runs: list[Callable[[], object]], repeats: int, device: torch.device) -> list[float]:
    """Median seconds of each run, the runs alternating (a machine busier for a while slows both); on
    CUDA each run's time ends when the device has finished its work (a run returns before it)."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, found in zip(runs, times, strict=True):
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            found.append(time.perf_counter() - start)
    return [statistics.median(found) for found in times]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forwards(model: nn.Module, images: torch.Tensor, batch: int) -> None:
    """The model on ``images`` in batches of ``batch`` (without gradients)."""
    with torch.no_grad():
        for start in range(0, len(images), batch):
            model(images[start:start + batch])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    import quantus

    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    machine = platform.processor() or platform.machine()
    print(f"fxlrp.evaluate vs Quantus {quantus.__version__}, batch of 64, {machine}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(f"{'workload':<26} {'metric':<22} {'Quantus s':>10} {'forwards':>9} {'fxlrp s':>9} {'forwards':>9} "
          f"{'speed-up':>9} {'bound':>7}")
    for name, (model, images, per_step, patch) in workloads(device).items():
        with torch.no_grad():
            labels = model(images).argmax(dim=1)
        # of the input's shape: Quantus's pixel flipping flips single values (fxlrp: per_channel=True)
        attributions = torch.randn(images.shape, generator=torch.Generator().manual_seed(2)).to(device)
        x_numpy, y_numpy, a_numpy = images.cpu().numpy(), labels.cpu().numpy(), attributions.cpu().numpy()
        baseline = images.amin(dim=(1, 2, 3), keepdim=True)
        regions = (images.shape[2] // patch) * (images.shape[3] // patch)
        cases = {
            f"pixel flipping ({per_step}/step)": (
                lambda: np.array(quantus.PixelFlipping(features_in_step=per_step, normalise=False,
                                                       disable_warnings=True)(
                    model=model, x_batch=x_numpy, y_batch=y_numpy, a_batch=a_numpy, device=args.device,
                    softmax=False, channel_first=True, batch_size=64)),
                lambda: image_curves(model, images, attributions, labels, orders="morf", baseline=baseline,
                                     per_channel=True, features_per_step=per_step, batch_size=ROWS,
                                     progress=False).morf[:, 1:],
            ),
            f"region perturbation ({patch}x{patch})": (
                lambda: np.array(quantus.RegionPerturbation(patch_size=patch, regions_evaluation=regions,
                                                            normalise=False, disable_warnings=True)(
                    model=model, x_batch=x_numpy, y_batch=y_numpy, a_batch=a_numpy, device=args.device,
                    softmax=False, channel_first=True, batch_size=64)),
                lambda: (lambda curve: curve[:, :1] - curve[:, 1:])(
                    image_curves(model, images, attributions, labels, orders="morf", patch=patch, baseline=baseline,
                                 batch_size=ROWS, progress=False).morf),
            ),
        }
        for metric, (theirs, ours) in cases.items():
            found = ours()
            difference = np.abs(theirs() - found.cpu().numpy()).max()
            if difference > 1e-4:
                raise SystemExit(f"{name} {metric}: the curves differ by {difference:.3g}")
            steps = found.shape[1]  # (both cases return the L points after the unperturbed one)
            perturbed = torch.rand(len(images) * (steps + 1), *images.shape[1:], device=device)
            quantus_seconds, quantus_forwards, fxlrp_seconds, fxlrp_forwards = interleaved_medians(
                [theirs, lambda: forwards(model, perturbed, len(images)),
                 ours, lambda: (forwards(model, perturbed, ROWS), forwards(model, images, len(images)))],
                args.repeats, device)
            print(f"{name:<26} {metric:<22} {quantus_seconds:>10.3f} {quantus_forwards:>9.3f} {fxlrp_seconds:>9.3f} "
                  f"{fxlrp_forwards:>9.3f} {quantus_seconds / fxlrp_seconds:>8.1f}x "
                  f"{quantus_seconds / fxlrp_forwards:>6.1f}x")


if __name__ == "__main__":
    main()
