"""The module paths fxlrp had before its package layout, still importable.

fxlrp's modules once sat side by side in ``fxlrp/`` (``fxlrp.explainer``, ``fxlrp.interpret``);
they now live in packages along the pipeline (``fxlrp.explain.explainer``,
``fxlrp.eager.interpret``). User code imports the old paths, and explainers saved with ``pickle``
or ``torch.save`` name their classes by them (``fxlrp.explainer.Explainer``,
``fxlrp.call.RelevanceCall``). :data:`MOVED` maps each old path to its module, and the finder
installed by ``import fxlrp`` makes ``import fxlrp.explainer`` give that module itself: the same
object, so its classes are the same classes and old pickles load. Submodules of a moved package
follow it (``fxlrp.pyg.walks`` is ``fxlrp.integrations.pyg.walks``).

Four modules became the ``__init__`` of a package of the same name and need no entry:
``fxlrp.rules``, ``fxlrp.registry``, ``fxlrp.capture`` and ``fxlrp.eager``. ``fxlrp.integrations``,
once the loader of integrations (now :mod:`fxlrp.registry.integrations`), is the package of the
integrations, which names the loader's functions.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

MOVED = {
    "fxlrp.call": "fxlrp.relevance.call",
    "fxlrp.attention_rules": "fxlrp.rules.attention",
    "fxlrp.composites": "fxlrp.rules.composites",
    "fxlrp.leaf_functions": "fxlrp.capture.interception",
    "fxlrp.capture.leaf_functions": "fxlrp.capture.interception",
    "fxlrp.module_state": "fxlrp.capture.module_state",
    "fxlrp.source": "fxlrp.capture.source",
    "fxlrp.canonicalise": "fxlrp.graph.canonicalise",
    "fxlrp.fold_batchnorm": "fxlrp.graph.fold_batchnorm",
    "fxlrp.relevance_flow": "fxlrp.graph.relevance_flow",
    "fxlrp.rewrite": "fxlrp.graph.rewrite",
    "fxlrp.nodes": "fxlrp.graph.nodes",
    "fxlrp.graph_module": "fxlrp.graph.graph_module",
    "fxlrp.report": "fxlrp.graph.report",
    "fxlrp.interpret": "fxlrp.eager.interpret",
    "fxlrp.record": "fxlrp.eager.record",
    "fxlrp.replay": "fxlrp.eager.replay",
    "fxlrp.scatter_library": "fxlrp.operations.scatter_library",
    "fxlrp.convert": "fxlrp.explain.convert",
    "fxlrp.explainer": "fxlrp.explain.explainer",
    "fxlrp.compiled": "fxlrp.explain.compiled",
    "fxlrp.input_checks": "fxlrp.explain.input_checks",
    "fxlrp.placement": "fxlrp.explain.placement",
    "fxlrp.model_snapshot": "fxlrp.explain.model_snapshot",
    "fxlrp.operations.torchvision_ops": "fxlrp.integrations.torchvision",
    "fxlrp.transformers": "fxlrp.integrations.transformers",
    "fxlrp.pyg": "fxlrp.integrations.pyg",
    "fxlrp.image": "fxlrp.viz.image",
    "fxlrp.text": "fxlrp.viz.text",
    "fxlrp.graph_image": "fxlrp.viz.graph_image",
    "fxlrp.cli": "fxlrp.app.cli",
    "fxlrp.cli_inputs": "fxlrp.app.cli_inputs",
    "fxlrp.explain_dataset": "fxlrp.app.explain_dataset",
    "fxlrp.datasets": "fxlrp.app.datasets",
    "fxlrp.explanations_store": "fxlrp.app.explanations_store",
    "fxlrp.distributed": "fxlrp.app.distributed",
    "fxlrp.demo": "fxlrp.app.demo",
}
"""Old module path -> the module it is now."""


def new_name(name: str) -> str | None:
    """The module an old path names now (a moved module, or one inside a moved package); None for a
    path that did not move."""
    if name in MOVED:
        return MOVED[name]
    package = name.rpartition(".")[0]
    while package:
        if package in MOVED:
            return MOVED[package] + name[len(package):]
        package = package.rpartition(".")[0]
    return None


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module it names now: the loader puts that module in
    ``sys.modules`` under the old name, which the import system then returns."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("fxlrp.") or new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(new_name(module.__name__))

    def get_code(self, fullname: str) -> Any:
        """The code of the module the old path names (``python -m fxlrp.cli`` runs it)."""
        new = new_name(fullname)
        return importlib.util.find_spec(new).loader.get_code(new)


class Package(ModuleType):
    """The type of the package's module. The import system names each submodule it imports on its
    package (``import fxlrp.convert`` sets ``fxlrp.convert``); an old path whose name is also one
    of the package's own attributes (``fxlrp.convert``, the function, imported on first use) must
    not replace that attribute with the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        lazy = self.__dict__.get("LAZY", {})
        if (isinstance(value, ModuleType) and f"{self.__name__}.{name}" in MOVED and name in lazy
                and lazy[name][1] is not None):  # (the attribute is no module: a function, a class)
            return
        super().__setattr__(name, value)


def install(package: ModuleType) -> None:
    """Put the finder first on ``sys.meta_path`` (once) and give the package the type
    :class:`Package`.

    Parameters
    ----------
    package : ModuleType
        The package ``fxlrp``.
    """
    if not any(isinstance(finder, OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
    package.__class__ = Package


def moved_module(package: ModuleType, name: str) -> ModuleType | None:
    """``fxlrp.<name>`` for an old path read as an attribute (``fxlrp.explainer.output_relevance``
    after ``import fxlrp``, which once imported it); None for any other name."""
    old = f"{package.__name__}.{name}"
    if old not in MOVED:
        return None
    return importlib.import_module(old)
