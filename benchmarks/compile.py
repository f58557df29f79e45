"""Compiled explanations: ``fxlrp.compile`` against compiled gradient x input and against the eager
explanation, same process, same run.

For each model (random weights), one batch of images, each way of computing the explanation:

- gradient x input, eager and ``torch.compile(model)`` (Inductor's defaults; ``torch.autograd.grad``
  runs the compiled backward);
- ``fxlrp.attribute(explain, x)`` (eager);
- ``fxlrp.compile(explain)`` (forward and relevance backward in one Inductor graph, the model's
  layout for convolutions: relevance equal to eager) and ``fxlrp.compile(explain, options={})``
  (Inductor's own layout choice).

The first call of a compiled function traces and compiles it (its seconds are reported apart);
then the ways are called in turns, ``--repeats`` times (a busy machine slows all alike), and the
median seconds are compared. The compiled relevance is checked against the eager one.

Run: ``python -m benchmarks.compile [--models resnet18] [--batch 4] [--size 224] [--repeats 7]
[--threads 2] [--composite epsilon] [--device cuda] [--mode reduce-overhead]``; prints a Markdown
table. ``--mode`` is ``torch.compile``'s, for both compiled ways (``reduce-overhead``: CUDA graphs on
a GPU); on a GPU each call is timed to the device's end (``torch.cuda.synchronize``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

import fxlrp
from benchmarks.table import machine
from fxlrp.app.composites import composite_by_name
from fxlrp.app.preprocessing import Preprocessing


def gradient_times_input(model: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def explain(images: Tensor) -> Tensor:
        images = images.detach().requires_grad_()
        output = model(images)
        start = torch.zeros_like(output).scatter_(1, output.detach().argmax(1, keepdim=True), 1.0) * output.detach()
        return images * torch.autograd.grad(output, images, start)[0]

    return explain


def ways(model: nn.Module, composite_name: str, mode: str | None = None) -> dict[str, Callable[[Tensor], Tensor]]:
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    composite = composite_by_name(composite_name, Preprocessing(None, 1, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    explain = fxlrp.convert(model, composite)
    exact, own_layout = fxlrp.compile(explain, mode=mode), fxlrp.compile(explain, mode=mode, options={})
    return {
        "gradient x input, eager": gradient_times_input(model),
        "gradient x input, torch.compile": gradient_times_input(torch.compile(model, mode=mode)),
        "fxlrp, eager": lambda images: fxlrp.attribute(explain, images),
        "fxlrp.compile": lambda images: exact(images),
        "fxlrp.compile, Inductor's layouts": lambda images: own_layout(images),
    }


def timed(run: Callable[[Tensor], Tensor], images: Tensor) -> tuple[Tensor, float]:
    """``run(images)`` and its seconds, to the device's end on a GPU."""
    synchronise = torch.cuda.synchronize if images.is_cuda else (lambda: None)
    synchronise()
    start = time.perf_counter()
    result = run(images)
    synchronise()
    return result, time.perf_counter() - start


def measure(name: str, batch: int, size: int, repeats: int, composite: str, device: str = "cpu",
            mode: str | None = None) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=1000).eval()
    for module in model.modules():  # torchvision's ViT starts its head at 0: no relevance to compare
        if isinstance(module, nn.Linear) and not module.weight.any():
            nn.init.normal_(module.weight, std=0.02)
    runs = ways(model.to(device), composite, mode)
    images = torch.randn(batch, 3, size, size, device=device)
    rows: dict[str, dict[str, Any]] = {}
    for label, run in runs.items():
        relevance, first = timed(run, images)
        rows[label] = {"model": name, "way": label, "first": first, "times": [], "relevance": relevance.detach()}
        print(f"  {name}: {label}: first call {rows[label]['first']:.1f} s", flush=True)
    for _ in range(repeats):
        images = torch.randn(batch, 3, size, size, device=device)
        for label, run in runs.items():
            rows[label]["times"].append(timed(run, images)[1])
    eager_relevance = rows["fxlrp, eager"]["relevance"]
    gradient = rows["gradient x input, eager"]["relevance"]
    for row in rows.values():
        row["seconds"] = statistics.median(row["times"])
        reference = gradient if row["way"].startswith("gradient") else eager_relevance
        row["error"] = float((row.pop("relevance") - reference).norm() / reference.norm())
    return list(rows.values())


def table(rows: list[dict[str, Any]], batch: int, size: int, composite: str) -> str:
    lines = [f"Median seconds per explanation of a batch of {batch} images 3x{size}x{size} ({composite}); "
             "ratios to compiled gradient x input and to the eager fxlrp explanation; relative error "
             "against the eager computation of the same thing.", "",
             "| model | way | seconds | / compiled gradient x input | / fxlrp eager | first call (s) | rel. error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        same_model = [other for other in rows if other["model"] == row["model"]]
        compiled_gradient = next(other["seconds"] for other in same_model
                                 if other["way"] == "gradient x input, torch.compile")
        eager = next(other["seconds"] for other in same_model if other["way"] == "fxlrp, eager")
        lines.append(f"| {row['model']} | {row['way']} | {row['seconds']:.3f} | "
                     f"{row['seconds'] / compiled_gradient:.2f}x | {row['seconds'] / eager:.2f}x | "
                     f"{row['first']:.1f} | {row['error']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18", help="torchvision model names, comma-separated")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--composite", default="epsilon")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default=None, help="torch.compile's mode for the compiled ways (reduce-overhead)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    description = machine()
    rows = []
    for name in args.models.split(","):
        rows += measure(name, args.batch, args.size, args.repeats, args.composite, args.device, args.mode)
    print(description)
    print(table(rows, args.batch, args.size, args.composite))


if __name__ == "__main__":
    main()
