"""The module paths fxlrp had before its package layout (issue 46) import as the modules they
became (the same objects: fxlrp._moved), the public names the docs use are where they were, and an
explainer saved with torch.save by code that named its classes by the old paths loads and
explains as before.

References: the modules by their new paths; the explainer's relevance before it was saved.
"""

from __future__ import annotations

import contextlib
import importlib
import pickletools
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import fxlrp
from fxlrp import _moved
from fxlrp.graph.nodes import TensorMethod
from fxlrp.rules.composites import EpsilonPlusFlat

TESTS = Path(__file__).resolve().parents[1]

OLD_PATHS = {
    "fxlrp.attention_rules": "fxlrp.rules.attention",
    "fxlrp.call": "fxlrp.relevance.call",
    "fxlrp.canonicalise": "fxlrp.graph.canonicalise",
    "fxlrp.cli": "fxlrp.app.cli",
    "fxlrp.cli_inputs": "fxlrp.app.cli_inputs",
    "fxlrp.compiled": "fxlrp.explain.compiled",
    "fxlrp.composites": "fxlrp.rules.composites",
    "fxlrp.convert": "fxlrp.explain.convert",
    "fxlrp.datasets": "fxlrp.app.datasets",
    "fxlrp.demo": "fxlrp.app.demo",
    "fxlrp.distributed": "fxlrp.app.distributed",
    "fxlrp.explain_dataset": "fxlrp.app.explain_dataset",
    "fxlrp.explainer": "fxlrp.explain.explainer",
    "fxlrp.explanations_store": "fxlrp.app.explanations_store",
    "fxlrp.fold_batchnorm": "fxlrp.graph.fold_batchnorm",
    "fxlrp.graph_image": "fxlrp.viz.graph_image",
    "fxlrp.graph_module": "fxlrp.graph.graph_module",
    "fxlrp.image": "fxlrp.viz.image",
    "fxlrp.input_checks": "fxlrp.explain.input_checks",
    "fxlrp.interpret": "fxlrp.eager.interpret",
    "fxlrp.leaf_functions": "fxlrp.capture.interception",
    "fxlrp.capture.leaf_functions": "fxlrp.capture.interception",
    "fxlrp.model_snapshot": "fxlrp.explain.model_snapshot",
    "fxlrp.module_state": "fxlrp.capture.module_state",
    "fxlrp.nodes": "fxlrp.graph.nodes",
    "fxlrp.operations.torchvision_ops": "fxlrp.integrations.torchvision",
    "fxlrp.placement": "fxlrp.explain.placement",
    "fxlrp.pyg": "fxlrp.integrations.pyg",
    "fxlrp.pyg.attention": "fxlrp.integrations.pyg.attention",
    "fxlrp.pyg.edge_map": "fxlrp.integrations.pyg.edge_map",
    "fxlrp.pyg.explainer": "fxlrp.integrations.pyg.explainer",
    "fxlrp.pyg.forward_reuse": "fxlrp.integrations.pyg.forward_reuse",
    "fxlrp.pyg.messages": "fxlrp.integrations.pyg.messages",
    "fxlrp.pyg.operations": "fxlrp.integrations.pyg.operations",
    "fxlrp.pyg.relevance": "fxlrp.integrations.pyg.relevance",
    "fxlrp.pyg.walks": "fxlrp.integrations.pyg.walks",
    "fxlrp.record": "fxlrp.eager.record",
    "fxlrp.relevance_flow": "fxlrp.graph.relevance_flow",
    "fxlrp.replay": "fxlrp.eager.replay",
    "fxlrp.report": "fxlrp.graph.report",
    "fxlrp.rewrite": "fxlrp.graph.rewrite",
    "fxlrp.scatter_library": "fxlrp.operations.scatter_library",
    "fxlrp.source": "fxlrp.capture.source",
    "fxlrp.text": "fxlrp.viz.text",
    "fxlrp.transformers": "fxlrp.integrations.transformers",
}
"""Every module of the flat layout that moved (written out here, not read from fxlrp._moved)."""

KEPT = ["fxlrp.rules", "fxlrp.registry", "fxlrp.capture", "fxlrp.eager", "fxlrp.errors", "fxlrp.relevance",
        "fxlrp.operations", "fxlrp.operations.helpers", "fxlrp.toys", "fxlrp.toys.digits", "fxlrp.toys.infection"]
"""Modules of the flat layout that kept their path (four are now a package's __init__)."""


NEEDS = {"fxlrp.pyg": "torch_geometric", "fxlrp.transformers": "transformers", "fxlrp.image": "matplotlib",
         "fxlrp.graph_image": "networkx", "fxlrp.demo": "matplotlib"}
"""Old paths whose module imports an optional library."""


def fresh_python(code: str) -> str:
    """stdout of ``code`` in a new interpreter (imports there go through the finder for the first time)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_table_names_every_moved_module() -> None:
    assert {old: _moved.new_name(old) for old in OLD_PATHS} == OLD_PATHS


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_imports_as_the_module_it_became(old: str) -> None:
    for path, library in NEEDS.items():
        if old == path or old.startswith(path + "."):
            pytest.importorskip(library)
    new = importlib.import_module(OLD_PATHS[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new and new.__name__ == OLD_PATHS[old]


def test_old_paths_in_a_new_process_load_each_file_once() -> None:
    """From a fresh interpreter: ``import fxlrp.x``, ``from fxlrp.x import y``, ``fxlrp.x`` as an
    attribute, for every old path; no file of fxlrp is then loaded as two module objects, and
    ``fxlrp.convert`` (the function, whose name is also an old module's) is still the function."""
    for library in set(NEEDS.values()) | {"matplotlib"}:
        pytest.importorskip(library)
    code = f"""
import importlib, sys, types
import fxlrp
old_paths = {OLD_PATHS!r}
for old, new in old_paths.items():
    module = importlib.import_module(old)
    assert module is sys.modules[new], old
    parent, _, child = old.rpartition(".")
    if parent == "fxlrp" and child != "convert":
        assert getattr(fxlrp, child) is module, old
import fxlrp.convert
from fxlrp.convert import convert
from fxlrp.explainer import Explainer, output_relevance
from fxlrp.pyg.walks import relevant_walks
assert convert is fxlrp.convert and isinstance(fxlrp.convert, types.FunctionType)
assert Explainer is fxlrp.Explainer and relevant_walks is fxlrp.integrations.pyg.relevant_walks
files = {{}}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name.startswith("fxlrp") and path:
        files.setdefault(path, set()).add(id(module))
twice = sorted(path for path, modules in files.items() if len(modules) > 1)
assert not twice, twice
print("ok")
"""
    assert fresh_python(code).strip() == "ok"


def test_the_public_names_the_docs_use() -> None:
    from fxlrp.composites import EpsilonPlusFlat as FromOldPath
    from fxlrp.integrations import register_integration
    from fxlrp.registry import Kind, Operation, register
    from fxlrp.rules import Epsilon

    assert FromOldPath is EpsilonPlusFlat is fxlrp.composites.EpsilonPlusFlat
    assert Epsilon is fxlrp.rules.Epsilon
    assert (Kind, Operation, register) == (fxlrp.registry.Kind, fxlrp.registry.Operation, fxlrp.registry.register)
    assert register_integration is importlib.import_module("fxlrp.registry.integrations").register_integration
    explainer = importlib.import_module("fxlrp.explain.explainer")
    assert fxlrp.convert is importlib.import_module("fxlrp.explain.convert").convert
    assert fxlrp.compile is importlib.import_module("fxlrp.explain.compiled").compile
    assert (fxlrp.attribute, fxlrp.attribute_nodes, fxlrp.Explainer) == (
        explainer.attribute, explainer.attribute_nodes, explainer.Explainer)
    for name, path in [("image", "fxlrp.viz.image"), ("text", "fxlrp.viz.text"),
                       ("graph_image", "fxlrp.viz.graph_image"), ("transformers", "fxlrp.integrations.transformers")]:
        if f"fxlrp.{name}" in NEEDS:
            pytest.importorskip(NEEDS[f"fxlrp.{name}"])
        assert getattr(fxlrp, name) is importlib.import_module(path)
    assert fxlrp.operations.helpers.affine is importlib.import_module("fxlrp.operations.helpers").affine
    assert fxlrp.relevance.AffineLayer is importlib.import_module("fxlrp.relevance.layer").AffineLayer


def test_python_m_with_an_old_path_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "fxlrp.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: fxlrp"), done.stderr[-2000:]


# -- An explainer saved with the old paths in its pickle ----------------------------------------


class Gate(nn.Module):
    """A branch on values: torch.fx cannot trace it, so it runs eagerly (pickled: its LayerRunner)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if bool(h.amax() < -1e9):  # never taken, but only known at run time
            h = h * 0
        return torch.relu(h) + 0.25 * h


class Saved(nn.Module):
    """Conv, BatchNorm (folded), a part run eagerly, a Tensor method (``view``) and an optional
    input (its retrace is a partial of convert): what an explainer's pickle names of fxlrp."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.gate = Gate()
        self.classifier = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            x = x * mask.view(x.shape[0], 1, 5, 5)
        h = self.gate(self.features(x))
        return self.classifier(h.view(h.shape[0], -1))


@contextlib.contextmanager
def named_by_old_paths() -> Iterator[None]:
    """Inside, the classes and functions of every moved module say they live at its old path, so
    that pickle writes what the flat layout wrote (``fxlrp.explainer Explainer``,
    ``fxlrp.call RelevanceCall``, ``fxlrp.operations.helpers TensorMethod``)."""
    renamed: list[tuple[object, str]] = []
    for name, module in list(sys.modules.items()):
        old = next((o + name[len(n):] for o, n in OLD_PATHS.items() if name == n or name.startswith(n + ".")), None)
        if old is None or not isinstance(module, types.ModuleType):
            continue
        for value in vars(module).values():
            if isinstance(value, (type, types.FunctionType)) and value.__module__ == name:
                renamed.append((value, name))
                value.__module__ = old
    renamed.append((TensorMethod, TensorMethod.__module__))
    TensorMethod.__module__ = "fxlrp.operations.helpers"
    try:
        yield
    finally:
        for value, name in renamed:
            value.__module__ = name


def pickled_globals(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(name for name in archive.namelist() if name.endswith("data.pkl")))
    return {argument for opcode, argument, _ in pickletools.genops(data)
            if opcode.name == "GLOBAL" and argument.startswith("fxlrp")}


def test_an_explainer_saved_with_the_old_module_paths_loads_and_explains_the_same(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Saved().double().eval()
    with torch.no_grad():
        model.features[1].running_mean.uniform_(-0.5, 0.5)
        model.features[1].running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    relevance = fxlrp.attribute(explain, x, target=1)
    assert torch.equal(fxlrp.attribute(explain, x, target=1), relevance)  # (the eager part replayed)
    with named_by_old_paths():
        torch.save({"explain": explain, "x": x, "relevance": relevance}, tmp_path / "explain.pt")
    named = pickled_globals(tmp_path / "explain.pt")
    assert {"fxlrp.explainer Explainer", "fxlrp.call RelevanceCall", "fxlrp.composites EpsilonPlusFlat",
            "fxlrp.composites Site", "fxlrp.nodes RelevanceNode", "fxlrp.graph_module _rebuilt",
            "fxlrp.report Report", "fxlrp.interpret LayerRunner", "fxlrp.operations.helpers TensorMethod",
            "fxlrp.convert convert", "fxlrp.capture RelevanceTracer", "fxlrp.registry registered_operation",
            "fxlrp.rules Epsilon"} <= named, sorted(named)
    moved_to = tuple(f"{new} " for new in OLD_PATHS.values())
    assert not [name for name in named if name.startswith(moved_to)], sorted(named)
    code = f"""
import sys, torch, fxlrp
torch.set_num_threads({torch.get_num_threads()})  # the same kernels with the same threads: the same bits
saved = torch.load({str(tmp_path / 'explain.pt')!r}, weights_only=False)
assert type(saved["explain"]) is fxlrp.Explainer
relevance = fxlrp.attribute(saved["explain"], saved["x"], target=1)
print(bool(torch.equal(relevance, saved["relevance"])))
"""
    assert fresh_python(code).strip() == "True"
    loaded = torch.load(tmp_path / "explain.pt", weights_only=False)["explain"]
    assert torch.equal(fxlrp.attribute(loaded, x, target=1), relevance)
