"""Throughput: images per second explaining a generated data set written to disk, fxlrp against
zennit and Captum's LRP, in one process and in two, same run.

The data set is a folder of random 224x224 PNGs in two class sub-folders (ImageFolder layout),
read by ``fxlrp.app.datasets.ImageFolder`` through a ``DataLoader`` in batches of ``--batch``
(ImageNet normalisation). Each method explains each image's predicted class:

- ``fxlrp EpsilonPlusFlat``: ``fxlrp.attribute`` of the converted model;
- ``zennit EpsilonPlusFlat``: zennit's composite (with its ResNet canonizer) registered on a copy;
- ``captum LRP``: ``captum.attr.LRP`` on a copy (its default rules);
- ``fxlrp explain --data`` end to end: the command line with ``python -m fxlrp`` and with
  ``torchrun --nproc-per-node 2``, including start-up, conversion and writing the shards.

"Two processes" split the batches between two processes (rank r takes batches r, r + 2, ...),
each with ``threads / 2`` torch threads; one process has all ``--threads``. Images per second
are the images over the wall time of the slowest process's loop, reading included (each process
first explains two images untimed, a warm-up). Models have random weights (no downloads).

Run: ``python -m benchmarks.throughput [--models resnet50 vit_b_16] [--images 96] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("fxlrp EpsilonPlusFlat", "zennit EpsilonPlusFlat", "captum LRP")


def write_data_set(folder: Path, count: int, size: int = 224) -> Path:
    """``count`` random RGB PNGs in ``folder/class0`` and ``folder/class1``."""
    from PIL import Image

    generator = np.random.default_rng(0)
    for index in range(count):
        path = folder / f"class{index % 2}" / f"{index:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(generator.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
    return folder


def build_model(name: str) -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


def prepare(method: str, model_name: str, model: nn.Module, device: torch.device) -> Callable[[Tensor], Tensor]:
    """The function explaining a batch of images (each image's predicted class)."""
    if method == "fxlrp EpsilonPlusFlat":
        import fxlrp

        explain = fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat())
        return lambda images: fxlrp.attribute(explain, images, target=None)
    if method == "zennit EpsilonPlusFlat":
        from zennit.composites import EpsilonPlusFlat
        from zennit.torchvision import ResNetCanonizer

        if not model_name.startswith("resnet"):
            raise RuntimeError(f"no zennit canonizer for {model_name} (attention, class token)")
        copied = copy.deepcopy(model)
        EpsilonPlusFlat(canonizers=[ResNetCanonizer()]).register(copied)
        return lambda images: _through_hooks(copied, images)
    if method == "captum LRP":
        from captum.attr import LRP

        lrp = LRP(copy.deepcopy(model))

        def explain_with_captum(images: Tensor) -> Tensor:
            with torch.no_grad():
                target = model(images).argmax(dim=1)
            return lrp.attribute(images, target=target)

        return explain_with_captum
    raise ValueError(method)


def _through_hooks(model: nn.Module, images: Tensor) -> Tensor:
    from fxlrp.explain.targets import output_relevance

    leaf = images.detach().requires_grad_()
    output = model(leaf)
    (relevance,) = torch.autograd.grad(output, leaf, output_relevance(output, None))
    return relevance


def worker(rank: int, world: int, method: str, model_name: str, folder: str, batch: int, threads: int,
           device_name: str, results: Any) -> None:
    """One process's share of the batches; puts ``(images, seconds)`` or an error into ``results``."""
    from torch.utils.data import DataLoader

    from fxlrp.app.datasets import ImageFolder, as_list
    from fxlrp.app.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
    from fxlrp.app.sharded_run import ShardBatches

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    device = torch.device(device_name)
    try:
        model = build_model(model_name).to(device)
        explain = prepare(method, model_name, model, device)
        source = ImageFolder(Path(folder), Preprocessing(224, 3, IMAGENET_MEAN, IMAGENET_STD))
        spans = [range(start, min(start + batch, len(source))) for start in range(0, len(source), batch)]
        loader = DataLoader(source, batch_sampler=ShardBatches(spans[rank::world], batch), collate_fn=as_list)
        explain(torch.stack([source[index].values for index in range(2)]).to(device))  # warm-up, not timed
        counted, start = 0, time.perf_counter()
        for items in loader:
            images = torch.stack([item.values for item in items]).to(device)
            relevance = explain(images)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if not torch.isfinite(relevance).all():
                raise RuntimeError("non-finite relevance")
            counted += len(items)
        results.put((rank, counted, time.perf_counter() - start, None))
    except Exception as error:  # noqa: BLE001 - reported as the method's status
        results.put((rank, 0, 0.0, f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"))


def in_processes(method: str, model_name: str, folder: Path, batch: int, threads: int, processes: int,
                 device: str) -> tuple[float | None, str]:
    """Images per second of ``method`` over the data set in ``processes`` processes."""
    import torch.multiprocessing as multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=worker, args=(rank, processes, method, model_name, str(folder), batch,
                                                    max(1, threads // processes), device, results))
               for rank in range(processes)]
    for process in workers:
        process.start()
    reports = []
    while len(reports) < len(workers):
        try:
            reports.append(results.get(timeout=5))
        except queue.Empty:
            dead = [process for process in workers if process.exitcode not in (None, 0)]
            if dead:  # killed (out of memory, say) before reporting
                for process in workers:
                    process.kill()
                return None, f"a process died (exit code {dead[0].exitcode}; -9: killed, e.g. out of memory)"
    for process in workers:
        process.join()
    errors = [error for _, _, _, error in reports if error]
    if errors:
        return None, errors[0]
    images = sum(count for _, count, _, _ in reports)
    seconds = max(spent for _, _, spent, _ in reports)
    return images / seconds, f"{images} images in {seconds:.1f} s"


def command_line(model_name: str, folder: Path, batch: int, threads: int, processes: int,
                 device: str) -> tuple[float | None, str]:
    """Images per second of ``fxlrp explain --data`` end to end (start-up and writing included)."""
    out = Path(tempfile.mkdtemp(prefix="fxlrp_throughput_"))
    arguments = ["-m", "fxlrp", "explain", "--model", f"torchvision:{model_name}", "--composite",
                 "epsilon_plus_flat", "--data", str(folder), "--out", str(out / "run"), "--batch-size", str(batch),
                 "--shard-size", str(batch), "--device", device]
    launcher = [sys.executable] if processes == 1 else [str(Path(sys.executable).with_name("torchrun")),
                                                        "--standalone", f"--nproc-per-node={processes}"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(max(1, threads // processes)),
                   "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    finished = subprocess.run([*launcher, *arguments], capture_output=True, text=True, env=environment)
    seconds = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    if finished.returncode != 0:
        return None, f"failed: {finished.stderr.strip().splitlines()[-1][:100]}"
    images = sum(1 for path in folder.rglob("*.png"))
    return images / seconds, f"{images} images in {seconds:.1f} s, start-up included"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "vit_b_16"])
    parser.add_argument("--images", type=int, default=64, help="images in the data set (default 64)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS) + ["fxlrp explain --data"])
    args = parser.parse_args()
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.processor() or 'CPU'}, " \
        f"{args.threads} threads in all"
    print(f"images per second; {where}; torch {torch.__version__}; batch {args.batch}; {args.images} random "
          f"224x224 PNGs on disk")
    with tempfile.TemporaryDirectory() as directory:
        folder = write_data_set(Path(directory) / "images", args.images)
        for model_name in args.models:
            print(f"\n### {model_name}\n\n| method | processes | images/s | note |\n|---|---:|---:|---|")
            for method in args.methods:
                for processes in args.processes:
                    if method == "fxlrp explain --data":
                        rate, note = command_line(model_name, folder, args.batch, args.threads, processes, args.device)
                    else:
                        rate, note = in_processes(method, model_name, folder, args.batch, args.threads, processes,
                                                  args.device)
                    shown = f"{rate:.2f}" if rate is not None else "-"
                    print(f"| {method} | {processes} | {shown} | {note} |", flush=True)


if __name__ == "__main__":
    main()
