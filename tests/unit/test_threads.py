"""Capture swaps the code of library functions (torch_scatter's, PyG's) while it records them;
other threads must see the libraries unchanged. Two threads at once: one converts and explains a
torch_scatter model over and over, the other calls torch_scatter natively with gradients and
explains a PyG model (whose layers run with library functions intercepted); every result must
equal the one computed alone."""

from __future__ import annotations

import threading

import torch
import torch_scatter
from support.models import COMPOSITES, MessagePassing, Network
from support.references import LRP0, relative_error
from torch import nn
from torch_geometric.nn import GATConv, GCNConv

import fxlrp

ROUNDS = 30


class PyGModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = GCNConv(3, 6), GATConv(6, 2, heads=1)

    def forward(self, x, edge_index):
        return self.second(torch.relu(self.first(x, edge_index)), edge_index)


def native_gradient(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    leaf = x.clone().requires_grad_()
    (torch_scatter.scatter_add(leaf * leaf, index, dim=0, dim_size=4) ** 2).sum().backward()
    return leaf.grad


def test_capture_on_one_thread_leaves_library_calls_on_another_unchanged() -> None:
    torch.manual_seed(0)
    model = MessagePassing().double().eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 2])
    values, index = torch.randn(7, 2, dtype=torch.float64), torch.tensor([0, 1, 1, 3, 2, 0, 3])
    expected_relevance = fxlrp.attribute(fxlrp.convert(model, LRP0), (x, senders, receivers), target=1)[0]
    expected_gradient = native_gradient(values, index)
    pyg_model = PyGModel().double().eval()
    edge_index = torch.stack([senders, receivers])
    pyg_explain = fxlrp.convert(pyg_model, LRP0)
    expected_pyg = fxlrp.attribute(pyg_explain, (x, edge_index), target=0)[0]
    start, failures = threading.Barrier(2), []

    def explaining() -> None:
        start.wait()
        for _ in range(ROUNDS):
            try:
                relevance = fxlrp.attribute(fxlrp.convert(model, LRP0), (x, senders, receivers), target=1)[0]
            except Exception as error:  # a recorded call handed to the other thread's handler
                failures.append(f"capture failed: {type(error).__name__}: {error}")
                continue
            if relative_error(relevance, expected_relevance) > 1e-12:
                failures.append("relevance changed")

    def calling_natively() -> None:
        start.wait()
        for _ in range(ROUNDS * 2):
            if not torch.equal(native_gradient(values, index), expected_gradient):
                failures.append("native gradient changed")
            try:
                relevance = fxlrp.attribute(pyg_explain, (x, edge_index), target=0)[0]
            except Exception as error:  # a call routed to the other thread's handler
                failures.append(f"PyG explanation failed: {type(error).__name__}: {error}")
                continue
            if relative_error(relevance, expected_pyg) > 1e-12:
                failures.append("relevance of the PyG explainer changed")

    threads = [threading.Thread(target=explaining), threading.Thread(target=calling_natively)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [], failures[:3]


def test_one_explainer_from_several_threads_and_several_explainers_of_one_model() -> None:
    """Explainers share their model's parameters and keep per-conversion caches (rules' parameter
    transforms, the rules chosen inside a part run eagerly): four threads at once, two on one
    explainer of a model with an eager part and name rules, two on two more explainers of the
    same model (other composites), each with its own inputs and targets, must give the relevance
    of serial use."""
    from fxlrp.rules.composites import EpsilonGammaBox, EpsilonPlusFlat

    torch.manual_seed(3)
    model = Network(branch=True).double().eval()
    shared = fxlrp.convert(model, COMPOSITES["name and type rules"]())
    explainers = [shared, shared, fxlrp.convert(model, EpsilonPlusFlat()),
                  fxlrp.convert(model, EpsilonGammaBox(-1.0, 1.0))]
    inputs = [torch.rand(2, 3, 7, 7, dtype=torch.float64) * 2 - 1 for _ in explainers]
    expected = [fxlrp.attribute(explain, x, target=index % 3)
                for index, (explain, x) in enumerate(zip(explainers, inputs, strict=True))]
    start, failures = threading.Barrier(len(explainers)), []

    def explaining(index: int) -> None:
        start.wait()
        for _ in range(ROUNDS):
            try:
                relevance = fxlrp.attribute(explainers[index], inputs[index], target=index % 3)
            except Exception as error:
                failures.append(f"thread {index}: {type(error).__name__}: {error}")
                continue
            if relative_error(relevance, expected[index]) > 1e-12:
                failures.append(f"thread {index}: relevance changed")

    threads = [threading.Thread(target=explaining, args=(index,)) for index in range(len(explainers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [], failures[:3]


class SlowBranch(nn.Module):
    """Runs eagerly (a branch on a value) and lingers inside its forward, where fxlrp has put
    detached twins of its parameters in the model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.layer, self.head = nn.Linear(4, 4), nn.Linear(4, 2)
        self.inside = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(x)
        if h.sum() > -1e9:  # a branch on a value: run eagerly
            self.inside.set()
            threading.Event().wait(0.3)
        return self.head(torch.relu(h))


def test_a_check_for_changes_on_one_thread_waits_for_an_eager_run_on_another() -> None:
    """While an eager part runs, the model holds fxlrp's detached twins of its parameters; another
    thread's check for changes took them for replaced parameters and converted again mid-run, and
    two runs interleaving their restores could leave twins in the model."""
    model = SlowBranch().double().eval()
    parameters = dict(model.named_parameters())
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(3, 4, dtype=torch.float64)
    expected = fxlrp.attribute(explain, x, target=1)
    model.inside.clear()
    found: dict[str, object] = {}
    running = threading.Thread(target=lambda: found.update(relevance=fxlrp.attribute(explain, x, target=1)))
    running.start()
    assert model.inside.wait(120)  # (only against a hang: a loaded machine may take seconds to get there)
    found["converted again"] = explain.follow_model()
    running.join()
    assert found["converted again"] is False
    assert torch.equal(found["relevance"], expected)
    assert all(value is parameters[name] for name, value in model.named_parameters())
