"""Conditional heatmaps of many concepts of one image: fxlrp.concepts against zennit-crp 0.6.0,
same process, same run, same composite (EpsilonPlusFlat; zennit's VGGCanonizer for zennit-crp)
and conditions.

Workload: torchvision's VGG-16 with BatchNorm (random weights), one image, 32 channels of its last
convolution (``features.40``), each explained for the predicted class: the conditions
``{"features.40": [c], "y": [t]}``.

- **zennit-crp**: ``CondAttribution.generate(batch_size=b)``: the image repeated ``b`` times, one
  forward pass, one backward pass per ``b`` conditions (its default ``exclude_parallel=True``).
- **fxlrp, repeat=b**: ``conditional_relevance(..., repeat=b)``: the same batching.
- **fxlrp, repeat=0**: one forward pass of the single image, one backward pass per condition.

Times are medians of interleaved rounds (a busy machine slows all alike); memory is the peak of
the bytes torch's allocator handed out during a call (``benchmarks.allocator``). The heatmaps are
compared with zennit-crp's (max-abs difference over all conditions relative to the largest value;
zennit's BatchNorm merge made exact as in tests/models/test_crp_parity.py).

**Relevance maximisation** (``--maximisation``): the reference samples of every channel of
``features.40`` and ``features.30`` over ``--samples`` generated images, each explained for its
label (its predicted class), by relevance and by activation: zennit-crp's ``FeatureVisualization.run`` (which also keeps
per-class statistics and writes its results to files) against
:func:`fxlrp.concepts.relevance_maximisation`, batches of ``--batch``; images per second, and the
scores of the top samples compared.

**The command line** (``--command``): ``fxlrp explain --data`` on ``--samples`` generated images
(a ``.npy`` file), batches of ``--batch``, explaining each image's predicted class, without and with
``--concepts features.40 --concepts-top K`` (``--top``), in this process, interleaved: the cost of
keeping the references during the pass, and of finding the receptive regions of the references
(up to ``2 * 512 * K`` neurons, by relevance and by activation, each once) when the run ends, in
neurons per second.

Run: ``python -m benchmarks.concepts [--size 64] [--concepts 32] [--batch 8] [--repeats 3]
[--threads 2] [--maximisation | --command] [--samples 64]``; prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

import fxlrp
from benchmarks.allocator import allocated_peak_of_call
from fxlrp.concepts import conditional_relevance

LAYER = "features.40"


def model_and_image(size: int) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    model = torchvision.models.vgg16_bn().eval()
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():  # BatchNorm statistics that make folding matter
        if isinstance(module, nn.BatchNorm2d):
            with torch.no_grad():
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    return model, torch.randn(1, 3, size, size, generator=generator)


def exact_merge() -> Any:
    """A zennit canonizer, applied after ``VGGCanonizer``, that sets ``eps = 0`` on the BatchNorms
    zennit's merge leaves as ``x / sqrt(1 + eps)`` (tests/models/test_crp_parity.py): both sides then
    compute the model's own function."""
    from zennit.canonizers import Canonizer

    class ExactMerge(Canonizer):
        def apply(self, root_module: nn.Module) -> list[Canonizer]:
            self.norms = [(module, module.eps) for module in root_module.modules()
                          if isinstance(module, nn.BatchNorm2d)]
            for module, _ in self.norms:
                module.eps = 0.0
            return [self]

        def register(self) -> None:
            """Nothing to register."""

        def remove(self) -> None:
            for module, eps in self.norms:
                module.eps = eps

    return ExactMerge()


def configurations(model: nn.Module, image: Tensor, conditions: list[dict[str, Any]],
                   batch: int) -> dict[str, Callable[[], Tensor]]:
    """Each configuration's run: the heatmaps ``[conditions, H, W]`` summed over colour channels."""
    from crp.attribution import CondAttribution
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import VGGCanonizer

    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    attribution = CondAttribution(model, no_param_grad=False)
    composite = EpsilonPlusFlat(canonizers=[VGGCanonizer(), exact_merge()])

    def zennit_crp() -> Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = [result.heatmap for result in attribution.generate(
                image.clone().requires_grad_(), conditions, composite, batch_size=batch, verbose=False)]
        return torch.cat(found)

    def ours(repeat: int) -> Callable[[], Tensor]:
        return lambda: conditional_relevance(explain, image, conditions, repeat=repeat).heatmap[:, 0].sum(dim=1)

    return {f"zennit-crp generate(batch_size={batch})": zennit_crp, f"fxlrp repeat={batch}": ours(batch),
            "fxlrp repeat=0": ours(0)}


def maximisation(model: nn.Module, size: int, samples: int, batch: int, repeats: int) -> None:
    """Images per second of zennit-crp's FeatureVisualization and fxlrp's relevance maximisation."""
    import tempfile

    from crp.attribution import CondAttribution
    from crp.concepts import ChannelConcept
    from crp.helper import load_maximization
    from crp.visualization import FeatureVisualization
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import VGGCanonizer

    from fxlrp.concepts import relevance_maximisation

    layers = ["features.30", LAYER]
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(samples, 3, size, size, generator=generator)
    with torch.no_grad():  # each image explained for its predicted class, given as its label
        labels = torch.cat([model(images[i:i + batch]).argmax(dim=1) for i in range(0, samples, batch)])
    dataset = [(images[index], int(labels[index])) for index in range(samples)]
    explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
    times: dict[str, list[float]] = {"zennit-crp FeatureVisualization": [], "fxlrp relevance_maximisation": []}
    found: dict[str, Any] = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            visualization = FeatureVisualization(CondAttribution(model, no_param_grad=False), dataset,
                                                 {layer: ChannelConcept() for layer in layers}, path=directory)
            start = time.perf_counter()
            visualization.run(EpsilonPlusFlat(canonizers=[VGGCanonizer(), exact_merge()]), 0, samples,
                              batch_size=batch)
            times["zennit-crp FeatureVisualization"].append(time.perf_counter() - start)
            theirs = torch.from_numpy(load_maximization(visualization.RelMax.PATH, LAYER)[1].copy()).T
        start = time.perf_counter()
        ours = relevance_maximisation(explain, [(images[i:i + batch], labels[i:i + batch])
                                                for i in range(0, samples, batch)], layers, k=40)
        times["fxlrp relevance_maximisation"].append(time.perf_counter() - start)
        found = {"theirs": theirs, "ours": ours[LAYER].relevance.scores[:, :theirs.shape[1]]}
    difference = ((found["ours"] - found["theirs"]).abs().max() / found["theirs"].abs().max()).item()
    print(f"relevance maximisation: {samples} images 3x{size}x{size}, batches of {batch}, layers {layers}, "
          f"median of {repeats}")
    print(f"{'configuration':<34} {'seconds':>8} {'images/s':>9}")
    for name, spent in times.items():
        seconds = statistics.median(spent)
        print(f"{name:<34} {seconds:>8.2f} {samples / seconds:>9.1f}")
    print(f"top relevance scores of {LAYER}: max rel. difference {difference:.1e}")


def command_model() -> nn.Module:
    """The benchmark's VGG-16 for ``fxlrp explain --model benchmarks.concepts:command_model``."""
    return model_and_image(8)[0]


def command(size: int, samples: int, batch: int, repeats: int, top: int) -> None:
    """Seconds of ``fxlrp explain --data`` without and with ``--concepts``, and of the regions."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from fxlrp.app import cli, explain_dataset

    finishing: list[float] = []
    finish = explain_dataset._finish_references

    def timed_finish(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return finish(*args)
        finally:
            finishing.append(time.perf_counter() - start)

    explain_dataset._finish_references = timed_finish  # type: ignore[assignment]
    times: dict[str, list[float]] = {"without --concepts": [], "with --concepts": []}
    neurons = 0
    with tempfile.TemporaryDirectory() as directory:
        data = Path(directory) / "images.npy"
        np.save(data, torch.randn(samples, 3, size, size, generator=torch.Generator().manual_seed(2)).numpy())
        for round_ in range(repeats):
            names = list(times) if round_ % 2 == 0 else list(times)[::-1]
            for name in names:
                out = Path(directory) / f"out-{round_}-{name.split()[0]}"
                arguments = ["explain", "--model", "benchmarks.concepts:command_model", "--data", str(data),
                             "--out", str(out), "--batch-size", str(batch), "--shard-size", "32",
                             "--composite", "epsilon_plus_flat"]
                if name == "with --concepts":
                    arguments += ["--concepts", LAYER, "--concepts-top", str(top)]
                start = time.perf_counter()
                assert cli.main(arguments) == 0
                times[name].append(time.perf_counter() - start)
                if name == "with --concepts":  # the neurons whose regions were found (each once)
                    from fxlrp.concepts import read_references

                    references = read_references(out)[LAYER]
                    neurons = len({(int(top.samples[c, j]), c, int(top.positions[c, j]))
                                   for top in (references.relevance, references.activation)
                                   for c, j in (top.samples >= 0).nonzero().tolist()})
    explain_dataset._finish_references = finish  # type: ignore[assignment]
    without = statistics.median(times["without --concepts"])
    print(f"fxlrp explain --data: {samples} images 3x{size}x{size}, VGG-16 (BatchNorm), batches of {batch}, "
          f"median of {repeats}")
    print(f"{'configuration':<44} {'seconds':>8} {'ratio':>7}")
    for name, spent in times.items():
        print(f"{name:<44} {statistics.median(spent):>8.2f} {statistics.median(spent) / without:>6.2f}x")
    regions = statistics.median(finishing)
    print(f"{'  of which merging and receptive regions':<44} {regions:>8.2f} {regions / without:>6.2f}x "
          f"({neurons} neurons, {neurons / regions:.1f} per second; the pass: {samples / without:.1f} images "
          "per second)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--concepts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="conditions per backward pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--maximisation", action="store_true", help="relevance maximisation instead")
    parser.add_argument("--command", action="store_true", help="fxlrp explain --data with and without --concepts")
    parser.add_argument("--top", type=int, default=8, help="--concepts-top of --command")
    parser.add_argument("--samples", type=int, default=64, help="images of the relevance maximisation")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    if options.command:
        command(options.size, options.samples, options.batch, options.repeats, options.top)
        return
    model, image = model_and_image(options.size)
    if options.maximisation:
        maximisation(model, options.size, options.samples, options.batch, options.repeats)
        return
    with torch.no_grad():
        target = int(model(image).argmax())
    conditions = [{LAYER: [channel], "y": [target]} for channel in range(options.concepts)]
    runs = configurations(model, image, conditions, options.batch)
    results = {name: run() for name, run in runs.items()}  # warm-up, and the heatmaps compared
    reference = results[next(iter(runs))]
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(options.repeats):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    memory = {name: allocated_peak_of_call(run) for name, run in runs.items()}
    first = statistics.median(times[names[0]])
    print(f"VGG-16 (BatchNorm), 3x{options.size}x{options.size}, {options.concepts} concepts of {LAYER}, "
          f"{options.threads} threads, median of {options.repeats}")
    print(f"{'configuration':<34} {'seconds':>8} {'speed-up':>9} {'peak MB':>8} {'rel. difference':>16}")
    for name in names:
        seconds = statistics.median(times[name])
        difference = ((results[name] - reference).abs().max() / reference.abs().max()).item()
        print(f"{name:<34} {seconds:>8.2f} {first / seconds:>8.2f}x {memory[name]:>8.0f} {difference:>16.1e}")


if __name__ == "__main__":
    main()
