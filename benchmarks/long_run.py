"""Many explanations in one process: does memory stay flat?

Runs ``--rounds`` explanations (5,000 by default) of a small CNN with ``fxlrp.attribute`` and as
many of a two-layer GAT through PyG's ``Explainer`` with :class:`fxlrp.integrations.pyg.LRPExplainer`, and
prints at intervals the resident memory of the process (``/proc/self/statm``), the number and
bytes of the tensors Python still holds (``gc``: torch has no allocator statistics on CPU) and,
on a GPU, torch's allocated memory. A leak shows as a count or a size that grows with the rounds.

    python benchmarks/long_run.py [--rounds 5000] [--every 500] [--device cpu]
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import warnings

import torch
from torch import nn


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_tensors() -> tuple[int, float]:
    """Tensors reachable by Python's garbage collector: how many, and their bytes in MB."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on some library objects warns
        warnings.simplefilter("ignore")
        tensors = [item for item in gc.get_objects() if isinstance(item, torch.Tensor)]
    return len(tensors), sum(tensor.untyped_storage().nbytes() for tensor in tensors) / 2**20


def report(name: str, round_: int, started: float, device: torch.device) -> None:
    count, size = live_tensors()
    allocated = f", allocated {torch.cuda.memory_allocated(device) / 2**20:.1f} MB" if device.type == "cuda" else ""
    print(f"{name:4} {round_:6d} explanations: resident {resident_mb():7.1f} MB, live tensors {count} "
          f"({size:.2f} MB){allocated}, {time.perf_counter() - started:6.1f} s", flush=True)


def cnn_run(rounds: int, every: int, device: torch.device) -> None:
    import fxlrp
    from fxlrp.rules.composites import EpsilonPlusFlat

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, 10)).eval().to(device)
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    started = time.perf_counter()
    for round_ in range(rounds + 1):
        if round_ % every == 0:
            report("cnn", round_, started, device)
        images = torch.randn(4, 3, 32, 32, device=device)
        fxlrp.attribute(explain, images, target=None)


def graph_run(rounds: int, every: int, device: torch.device) -> None:
    from torch_geometric.explain import Explainer
    from torch_geometric.nn import GATConv

    from fxlrp.integrations.pyg import LRPExplainer

    class GAT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = GATConv(8, 8, heads=2, concat=False), GATConv(8, 3, heads=1)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.second(torch.relu(self.first(x, edge_index)), edge_index)

    torch.manual_seed(0)
    model = GAT().eval().to(device)
    explainer = Explainer(model, algorithm=LRPExplainer(), explanation_type="model", node_mask_type="attributes",
                          edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
    started = time.perf_counter()
    for round_ in range(rounds + 1):
        if round_ % every == 0:
            report("gat", round_, started, device)
        x = torch.randn(20, 8, device=device)
        edge_index = torch.randint(0, 20, (2, 60), device=device)
        explainer(x, edge_index, index=round_ % 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    device = torch.device(arguments.device)
    print(f"torch {torch.__version__}, {arguments.threads} thread(s), device {device}")
    cnn_run(arguments.rounds, arguments.every, device)
    graph_run(arguments.rounds, arguments.every, device)


if __name__ == "__main__":
    main()
