"""fxlrp's package layout (issues 46, 56): imports point down the floors of the pipeline, no modules
import each other in a circle, and an import made inside a function is one of the few listed
here with its reason (never a way round a circle).

An import is an import statement, or a module's name written out where the module imports by
name (``importlib.import_module``, ``__import__``) or hands names on through a module
``__getattr__``: a module doing either imports each fxlrp module whose name it spells.

Read from the source with ``ast``; one test imports fxlrp in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fxlrp
from fxlrp.registry.integrations import INTEGRATIONS

PACKAGE = Path(__file__).resolve().parents[2] / "fxlrp"

FLOORS = ["errors", "relevance", "registry", "rules", "capture", "graph", "eager", "operations", "explain",
          "", "integrations", "jax", "evaluate", "viz", "concepts", "toys", "app", "__main__"]
"""From the bottom up, by the name under ``fxlrp`` (``""``: the package itself, whose
``fxlrp.convert``, ``fxlrp.attribute``, ... the integrations and the command use)."""

LAZY = {
    ("fxlrp", "fxlrp.app.explanations_store"): "fxlrp.read_explanations: import fxlrp loads no data-set code",
    ("fxlrp", "fxlrp.explain.convert"): "fxlrp.convert: import fxlrp imports no torch (fxlrp --help answers at once)",
    ("fxlrp", "fxlrp.explain.attribute"): "fxlrp.attribute and attribute_nodes, likewise",
    ("fxlrp", "fxlrp.explain.compiled"): "fxlrp.compile, likewise",
    ("fxlrp", "fxlrp.explain.explainer"): "fxlrp.Explainer, likewise",
    ("fxlrp", "fxlrp.explain.generation"): "fxlrp.explain_generation and GenerationExplanation, likewise",
    ("fxlrp", "fxlrp.explain.targets"): "fxlrp.Region, likewise",
    ("fxlrp", "fxlrp.rules"): "fxlrp.rules, likewise",
    ("fxlrp", "fxlrp.rules.composites"): "fxlrp.composites, likewise",
    ("fxlrp", "fxlrp.evaluate"): "fxlrp.evaluate, likewise",
    ("fxlrp.app.cli", "fxlrp.app.commands"): "torch, only to run a command: fxlrp --help needs none of it",
    ("fxlrp.app.commands", "fxlrp.viz.image"): "matplotlib and pillow, only for pictures",
    ("fxlrp.app.commands", "fxlrp.app.demo"): "the demo draws with matplotlib",
    ("fxlrp.app.commands", "fxlrp.app.evaluate_dataset"): "torch and the evaluation, only to run fxlrp evaluate",
    ("fxlrp.viz.generation", "fxlrp.viz.image"): "matplotlib, only for the matrix picture",
    ("fxlrp.app.explain_dataset", "fxlrp.viz.image"): "matplotlib and pillow, only for --png",
    ("fxlrp.concepts.prediction", "fxlrp.viz.image"): "matplotlib and pillow, only for TopConcepts.picture",
    **{("fxlrp.explain.loader", integration): "a plug-in, loaded when a model uses its library"
       for integration in INTEGRATIONS.values()},
}
"""Imports of fxlrp's modules made inside functions: (importer, imported) -> why."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> list[tuple[str, bool]]:
    """The fxlrp modules ``path`` imports (``from fxlrp.x import y``: fxlrp.x.y if that is a module,
    else fxlrp.x), each with whether the import is made inside a function."""
    name, found = module_name(path), []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = name.split(".") if is_package(path) else name.split(".")[:-1]
                    base = ".".join(package[:len(package) - child.level + 1] + ([base] if base else []))
                found.extend((f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base, inside)
                             for alias in child.names)
            visit(child, inside)

    tree = ast.parse(path.read_text())
    visit(tree, False)
    if imports_by_name(tree):
        found.extend((node.value, True) for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES)
    if name == "fxlrp.explain.loader":  # (the plug-ins' table, which it imports by name)
        found.extend((integration, True) for integration in INTEGRATIONS.values())
    return [(module, inside) for module, inside in found if module in MODULES]


def imports_by_name(tree: ast.Module) -> bool:
    """Whether a module imports modules by name: calls ``import_module`` or ``__import__``, or
    defines a module ``__getattr__``."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body) or any(
        isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
        in ("import_module", "__import__") for node in ast.walk(tree))


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1] if len(parts) > 1 else "")


def test_every_module_has_a_floor() -> None:
    assert all(module.split(".")[1] in FLOORS for module in MODULES if module != "fxlrp")


def test_imports_point_down() -> None:
    upward = [(importer, imported) for importer, path in MODULES.items()
              for imported, _ in imported_modules(path)
              if floor(imported) > floor(importer) and (importer, imported) not in LAZY]
    assert not upward, upward


def test_the_operations_need_only_the_registry_and_relevance() -> None:
    """The operation library stands below the engine (issue 56): what an operation needs from the
    interpreter comes through its call (``RelevanceCall.decompose``). Besides ``relevance/`` and
    ``registry/`` it names only the rules it gives as defaults and fxlrp's errors."""
    allowed = ("fxlrp.relevance", "fxlrp.registry", "fxlrp.rules", "fxlrp.errors", "fxlrp.operations")
    beyond = [(importer, imported) for importer, path in MODULES.items() if importer.startswith("fxlrp.operations")
              for imported, _ in imported_modules(path)
              if not any(imported == base or imported.startswith(base + ".") for base in allowed)]
    assert not beyond, beyond


def test_imports_inside_functions_are_the_listed_ones() -> None:
    """Imports inside functions, and the package's attributes imported on first use by name
    (``fxlrp.LAZY``, which no import statement shows)."""
    lazy = {(importer, imported) for importer, path in MODULES.items()
            for imported, inside in imported_modules(path) if inside and imported != "fxlrp"}
    lazy |= {("fxlrp", module) for module, _ in fxlrp.LAZY.values()}
    assert lazy == set(LAZY), (sorted(lazy - set(LAZY)), sorted(set(LAZY) - lazy))


def test_import_fxlrp_imports_no_torch_and_its_attributes_load_on_first_use() -> None:
    code = ("import sys, fxlrp; assert 'torch' not in sys.modules, 'torch'; "
            "assert callable(fxlrp.convert) and fxlrp.composites.EpsilonPlusFlat and fxlrp.rules.Epsilon; "
            "assert 'torch' in sys.modules; print(sorted(set(fxlrp.__all__) - set(dir(fxlrp))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Every import, at the top or inside a function. Importing fxlrp.a.b runs fxlrp.a's __init__
    first, unless the importer is inside fxlrp.a (then it has run, or is running) or fxlrp.a is the
    package fxlrp (which every import runs first)."""
    edges: dict[str, set[str]] = {}
    for importer, path in MODULES.items():
        targets = edges.setdefault(importer, set())
        for imported, _ in imported_modules(path):
            parts = imported.split(".")
            targets.update(parent for parent in (".".join(parts[:end]) for end in range(2, len(parts)))
                           if not importer.startswith(parent + ".") and importer != parent)
            targets.add(imported)
        targets.discard(importer)
        targets.discard("fxlrp")
    done: set[str] = set()

    def circle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for target in sorted(edges[module]):
            found = circle_from(target, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    circles = [circle for module in MODULES if (circle := circle_from(module, []))]
    assert not circles, circles[0]
