"""Issue 59, point 2: every ```python block of README.md and docs/*.md runs as written.

Each markdown file is one test: its blocks run in order in one fresh interpreter (later blocks use
what earlier ones made, as a reader runs them), in a temporary folder, with random weights and the
sizes the docs give. A block a reader cannot run from the docs alone (it loads a model or files of
the reader's own: a model folder, a data set, what a command line run wrote) is preceded by
``<!-- runs after the setup NAME (tests/support/doc_setups.py): REASON -->``, and runs as written
after ``NAME`` made a tiny stand-in for it (:mod:`support.doc_setups`). One that cannot run here
(it needs a GPU) is preceded by ``<!-- not run: REASON -->``, one that a test of its own runs by
``<!-- this block runs in tests/...::test_... -->``. Every
document takes longer than the fast lane allows (20 s to minutes on two cores, measured), so they
run in the slow lane; the markers are checked in the fast one.
A failing block is named by its file and line, with the error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_setups import SETUPS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^(?:<!--\s*(?P<marker>.*?)\s*-->\n)?```python\n(?P<code>.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"not run: \S.*|this block runs in tests/\S+")
SET_UP = re.compile(r"runs after the setup (?P<setup>\w+) \(tests/support/doc_setups\.py\): \S.*")
TIMEOUT = 600

RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for line, setup, code in json.loads(sys.stdin.read()):
    try:
        if setup is not None:
            from support.doc_setups import SETUPS
            SETUPS[setup](namespace)
        exec(compile(code, f"block at line {line}", "exec"), namespace)
    except BaseException:
        print(f"FAILED: the block at line {line}:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def _blocks(document: Path) -> list[tuple[int, str | None, str]]:
    """``(line, marker, code)`` of each python block."""
    text = document.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start("code")), match.group("marker"), match.group("code"))
            for match in BLOCK.finditer(text)]


def _name(document: Path) -> str:
    return document.relative_to(ROOT).as_posix()


def _setup(marker: str | None) -> str | None:
    """The setup a block runs after; None for a block that runs without one."""
    found = SET_UP.fullmatch(marker) if marker is not None else None
    return found.group("setup") if found else None


def _runs(marker: str | None) -> bool:
    return marker is None or SET_UP.fullmatch(marker) is not None


RUNNABLE = [document for document in DOCUMENTS if any(_runs(marker) for _, marker, _ in _blocks(document))]


@pytest.mark.slow  # each document 20 s to minutes on two cores (measured): networks at 224 pixels, detectors
@pytest.mark.parametrize("document", [pytest.param(document, id=_name(document)) for document in RUNNABLE])
def test_the_blocks_of_a_document_run_as_written(document: Path, tmp_path: Path) -> None:
    runnable = [(line, _setup(marker), code) for line, marker, code in _blocks(document) if _runs(marker)]
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(runnable), cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT, env=_environment())
    assert done.returncode == 0, f"{_name(document)}: {done.stderr[-3000:]}"


def test_markers_say_why() -> None:
    # A block left out says why in the markdown; no other comment may stand right before a block.
    for document in DOCUMENTS:
        for line, marker, _ in _blocks(document):
            assert marker is None or NOT_RUN.fullmatch(marker) or _setup(marker) in SETUPS, \
                f"{_name(document)}:{line}: {marker!r}"


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), environment.get("PYTHONPATH", "")])
    environment.setdefault("MPLBACKEND", "Agg")
    environment["HF_HUB_OFFLINE"] = "1"  # (no downloads: the docs' models are made from configs)
    return environment
