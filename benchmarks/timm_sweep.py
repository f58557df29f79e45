"""Every timm architecture family through fxlrp: strict conversion, outputs, relevance, coverage.

    python benchmarks/timm_sweep.py                        # every family; writes docs/timm-coverage.md
    python benchmarks/timm_sweep.py --families resnet,levit --redo
    python benchmarks/timm_sweep.py --limit 5 --no-write   # the next 5 families not yet in the cache

A *family* is the timm module a model's entrypoint lives in (``timm.models.resnet``): the names
``timm.list_modules()`` gives, with ``timm.list_models(module=family)`` as its models. Each family
is represented by its smallest model by parameter count (ties: the first name in sorting order;
``test_*`` models are timm's own small configurations of the family's code and count like any
other name), at its default input size (``pretrained_cfg["input_size"]``); a family whose
smallest model has more than 150M parameters is skipped. Parameters are counted on the meta
device (no memory, no weights), once, cached in ``out/timm_sweep/parameters.json``.

Each model runs in its own process (``--timeout``, a cap on its address space), so a hang, a
crash or running out of memory costs one row: random weights (seed 0), ``pretrained=False``,
eval, batch 1, float32, ``--threads`` torch threads (1: the machine is shared, and timings are
steadier). Results are cached in ``out/timm_sweep/results.json`` after each model; a rerun skips
the families already there (``--redo`` runs the selected ones again) and the document is written
from the whole cache.

Per model: ``fxlrp.convert(model, strict=True, capture="auto")`` with the default composite, one
forward of the explainer (outputs compared with the model's: ``max|diff| / max|out| <= 1e-4``,
BatchNorm folding rounds), one ``fxlrp.attribute(explain, x)`` (target None: the top class;
timed; relevance must be finite), and coverage as DynamicLRP reports it: covered nodes / all
nodes. Graph nodes are the rows of ``explain.report()`` (covered: handling not ``gradient``); an
eager part is counted by the torch operations it runs on relevance-carrying tensors (arguments
and result), seen through ``fxlrp.eager.rule_choice.operations_observed`` (covered: the registry has
the operation). A model that fails strictly is converted again with ``strict=False`` to count its
coverage and check its outputs and relevance without the missing rules.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # fxlrp from this checkout, in the sweep and in its workers
CACHE = os.path.join(ROOT, "out", "timm_sweep")
DOCUMENT = os.path.join(ROOT, "docs", "timm-coverage.md")
MAX_PARAMETERS = 150_000_000
OUTPUT_TOLERANCE = 1e-4
"""``max|explainer - model| / max|model|``: BatchNorm is computed as its affine map (folded into the
layer before it), which rounds differently from the native kernel."""

STATUSES = ("ok", "unsupported", "capture error", "wrong outputs", "non-finite relevance", "zero relevance", "error",
            "timeout", "crashed", "skipped")


# Families and their smallest models ------------------------------------------------------------


def families() -> dict[str, list[str]]:
    """Every timm module that registers models, with its model names."""
    import timm

    return {family: timm.list_models(module=family) for family in timm.list_modules()}


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as source:
            return json.load(source)
    except (OSError, json.JSONDecodeError):
        return {}


def _write_json(path: str, value: Any) -> None:
    """Through a temporary file, so an interrupted sweep never leaves half a cache."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False, suffix=".tmp") as out:
        json.dump(value, out, indent=1, sort_keys=True)
    os.replace(out.name, path)


def parameter_counts(names: Sequence[str]) -> dict[str, int]:
    """Parameters of each model, built on the meta device (no memory, no initialisation work);
    cached, since building all of timm's 1,300 models takes minutes."""
    import timm
    import torch

    path = os.path.join(CACHE, "parameters.json")
    counts = _read_json(path)
    missing = [name for name in names if name not in counts]
    for number, name in enumerate(missing, 1):
        if number % 100 == 0:
            _write_json(path, counts)  # an interrupted count resumes
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            try:
                model = timm.create_model(name, pretrained=False)
                counts[name] = sum(parameter.numel() for parameter in model.parameters())
            except Exception:  # a model that cannot be built on meta is never the family's choice
                counts[name] = -1
    if missing:
        _write_json(path, counts)
    return {name: counts[name] for name in names}


def smallest(names: Sequence[str]) -> tuple[str, int]:
    """The family's smallest model by parameter count; ties go to the first name."""
    counts = {name: count for name, count in parameter_counts(names).items() if count >= 0}
    if not counts:
        raise RuntimeError("no model of the family can be built")
    name = min(sorted(counts), key=counts.__getitem__)
    return name, counts[name]


# One model, in its own process -----------------------------------------------------------------


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _where(error: BaseException) -> str:
    """The innermost frame of the traceback outside torch's own code (fxlrp's or timm's line):
    where a bug report starts."""
    import torch

    frames = traceback.extract_tb(error.__traceback__)
    torch_directory = os.path.dirname(torch.__file__)
    outside = [frame for frame in frames if not frame.filename.startswith(torch_directory)] or frames
    if not outside:
        return ""
    frame = outside[-1]
    filename = frame.filename.replace(ROOT + os.sep, "")
    return f"{filename.split('site-packages/')[-1]}:{frame.lineno}"


_LISTED = re.compile(r"^  - (?:[\w.]+: )?(?P<call>.+?)(?:  at .*)?$")


def unsupported_operations(message: str) -> list[str]:
    """The operations an :class:`fxlrp.UnsupportedOperationError` lists, each once, as a user
    writes them: ``Tensor.tile`` for a method, the type for a module (``torch.nn.Upsample``).
    Graph errors list ``  - node: call  at line``, errors of eager parts ``  - call  at line``."""
    found: dict[str, None] = {}
    for line in message.splitlines():
        match = _LISTED.match(line)
        if match is None:
            continue
        call = match.group("call").strip()
        module = re.fullmatch(r"\S+ \((?P<type>.+)\)", call)
        if module is not None:
            call = module.group("type")
        elif call.startswith(".") and call.endswith("()"):
            call = "Tensor" + call[:-2]
        found[call] = None
    # an eager part's in-place operation on a relevance-carrying tensor is one error of its own
    for name in re.findall(r"in-place (\w+) on a relevance-carrying tensor", message):
        found[f"in-place Tensor.{name}"] = None
    return list(found)


class OperationCounter:
    """Counts the torch operations eager parts run on relevance-carrying tensors. Only calls
    made by the part's own code are counted (an interpretation that runs a module): an
    operation fxlrp explains through a decomposition of its own (fused attention) is one
    operation, as it is one node of a graph."""

    def __init__(self) -> None:
        self.total = 0
        self.without_rule: Counter[str] = Counter()

    def __call__(self, interpretation: Any, name: str, has_rule: bool) -> None:
        if not interpretation.runs_module or interpretation.site.operation != "eager":
            return
        self.total += 1
        if not has_rule:
            self.without_rule[name] += 1

    @contextmanager
    def counting(self) -> Iterator[OperationCounter]:
        from fxlrp.eager.rule_choice import operations_observed

        with operations_observed(self):
            yield self


def _capture_path(report: Any) -> str:
    if not report.eager_modules:
        return "fx"
    if "" in report.eager_modules:
        return "whole eager"
    return f"partly eager ({len(report.eager_modules)})"


def _check(model: Any, x: Any, expected: Any, strict: bool, record: dict[str, Any], prefix: str = "") -> None:
    """Convert, run once under the operation counter, compare outputs, explain (timed), and
    write what was found into ``record`` (keys with ``prefix``). Raises what fxlrp raises."""
    import torch

    import fxlrp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # strict=False lists the operations without a rule
        record[prefix + "phase"] = "convert"
        start = time.perf_counter()
        explain = fxlrp.convert(model, strict=strict, capture="auto")
        record[prefix + "convert_s"] = time.perf_counter() - start
        report = explain.report(x)  # the graph this call runs (traced for the inputs it leaves at None)
        record[prefix + "capture"] = _capture_path(report)
        record[prefix + "eager_modules"] = dict(report.eager_modules)
        rows = [row for row in report.rows if row.handling != "eager"]
        record[prefix + "graph_nodes"] = len(rows)
        record[prefix + "graph_covered"] = sum(row.handling != "gradient" for row in rows)
        record[prefix + "graph_without_rule"] = sorted(
            {row.target for row in report.rows if row.handling == "gradient"})
        counter = OperationCounter()
        leaf = x.clone().requires_grad_()
        record[prefix + "phase"] = "explainer's first run"
        record[prefix + "eager_complete"] = False
        try:
            with counter.counting(), torch.enable_grad():
                output = explain(leaf)  # an eager part's strict check happens here, on its first run
            record[prefix + "eager_complete"] = True
        finally:
            # what ran before an error counts too (marked partial): where the sweep stopped
            record[prefix + "eager_operations"] = counter.total
            record[prefix + "eager_covered"] = counter.total - sum(counter.without_rule.values())
            record[prefix + "eager_without_rule"] = sorted(counter.without_rule)
        scale = expected.abs().max().item()
        difference = (output.detach() - expected).abs().max().item()
        record[prefix + "output_error"] = difference / scale if scale > 0 else difference
        del output, leaf  # the graph of that run
        record[prefix + "phase"] = "attribute"
        start = time.perf_counter()
        relevance = fxlrp.attribute(explain, x)
        record[prefix + "explain_s"] = time.perf_counter() - start
    record[prefix + "relevance_finite"] = bool(torch.isfinite(relevance).all())
    record[prefix + "relevance_nonzero"] = bool(relevance.abs().sum() > 0)
    top = expected.max().item()
    record[prefix + "relevance_sum"] = relevance.sum().item() / top if top else None


def _commit() -> str:
    """The checkout's commit, so a document written over a long sweep says which code ran."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_model(name: str, threads: int) -> dict[str, Any]:
    """Everything the sweep records about one model (the worker process's job)."""
    import timm
    import torch

    import fxlrp

    torch.set_num_threads(threads)
    # the machine is shared: the load says how far timings are from an idle machine's
    record: dict[str, Any] = {"model": name, "threads": threads, "load": os.getloadavg()[0], "commit": _commit()}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model(name, pretrained=False).eval()
    record["parameters"] = sum(parameter.numel() for parameter in model.parameters())
    # Some families start from an all-zero weight (MLP-Mixer's classifier head): the output, and
    # so all relevance, would be 0, and the checks would compare nothing. Random weights are the
    # point of the sweep, so such weights get random values too.
    record["randomised"] = []
    with torch.no_grad():
        for name_of_parameter, parameter in model.named_parameters():
            if parameter.dim() >= 2 and not parameter.any():
                parameter.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
                record["randomised"].append(name_of_parameter)
    record["input_size"] = list(model.pretrained_cfg["input_size"])
    x = torch.randn(1, *record["input_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        start = time.perf_counter()
        expected = model(x)
        record["forward_s"] = time.perf_counter() - start
    record["output_max"] = expected.abs().max().item()
    try:
        _check(model, x, expected, True, record)
    except fxlrp.UnsupportedOperationError as error:
        record["status"] = "unsupported"
        record["operations"] = unsupported_operations(str(error))
        record["detail"] = ", ".join(record["operations"]) or _first_line(error)
    except fxlrp.CaptureError as error:
        record["status"], record["detail"], record["where"] = "capture error", _first_line(error), _where(error)
    except Exception as error:
        record["status"], record["detail"], record["where"] = "error", _first_line(error), _where(error)
    if "status" not in record:
        if record["output_error"] > OUTPUT_TOLERANCE:
            record["status"] = "wrong outputs"
            record["detail"] = f"max|diff| / max|out| = {record['output_error']:.2e}"
        elif not record["relevance_finite"]:
            record["status"], record["detail"] = "non-finite relevance", ""
        elif not record["relevance_nonzero"]:
            record["status"] = "zero relevance"
            record["detail"] = (f"max|out| = {record['output_max']:.1e}: with random weights the signal fades, "
                                "and an epsilon rule's stabiliser (1e-6) takes it all")
        else:
            record["status"] = "ok"
        return record
    if record["status"] == "unsupported":
        # What the model gives without the missing rules: coverage, outputs, finite relevance.
        try:
            _check(model, x, expected, False, record, prefix="lenient_")
        except Exception as error:
            record["lenient_error"] = f"{_first_line(error)} ({record['lenient_phase']} at {_where(error)})"
    return record


def _worker(name: str, threads: int, memory_gb: float, path: str) -> None:
    if memory_gb > 0:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        record = run_model(name, threads)
    except MemoryError as error:
        record = {"model": name, "status": "error", "detail": f"out of memory (> {memory_gb} GB): {error}"}
    except Exception as error:  # building or running the model itself
        record = {"model": name, "status": "error", "detail": _first_line(error), "where": _where(error),
                  "phase": "model"}
    with open(path, "w") as out:
        json.dump(record, out)


def run_in_subprocess(name: str, threads: int, timeout: float, memory_gb: float) -> dict[str, Any]:
    """One model in a fresh process; a timeout or a crash is a result."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", name, "--worker-out", path,
                   "--threads", str(threads), "--memory-gb", str(memory_gb)]
        start = time.perf_counter()
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"model": name, "status": "timeout", "detail": f"no result after {timeout:.0f} s",
                    "wall_s": time.perf_counter() - start}
        wall = time.perf_counter() - start
        if not os.path.exists(path):
            tail = (finished.stderr or finished.stdout).strip().splitlines()[-1:] or [""]
            return {"model": name, "status": "crashed",
                    "detail": f"exit status {finished.returncode}: {tail[0][:300]}", "wall_s": wall}
        with open(path) as source:
            record = json.load(source)
    record["wall_s"] = wall
    return record


# The document ------------------------------------------------------------------------------------


def machine(threads: int) -> str:
    import timm
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {threads} torch thread(s) per model; torch {torch.__version__}, "
            f"timm {timm.__version__}; Python {platform.python_version()}")


def coverage(record: dict[str, Any], prefix: str = "") -> tuple[int, int] | None:
    """(covered, all) over graph nodes and operations run eagerly, or None when not measured."""
    if prefix + "graph_nodes" not in record or prefix + "eager_operations" not in record:
        return None
    covered = record[prefix + "graph_covered"] + record[prefix + "eager_covered"]
    return covered, record[prefix + "graph_nodes"] + record[prefix + "eager_operations"]


def measured_coverage(record: dict[str, Any]) -> tuple[int, int] | None:
    """The strict run's coverage, or the lenient run's where strict conversion failed (the strict
    run of an eager part stops at the first part with an operation without a rule)."""
    return coverage(record, "lenient_" if record["status"] == "unsupported" else "")


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _cell(text: str) -> str:
    """Table-safe, with paths shortened to the package (``timm/models/convit.py``)."""
    text = re.sub(r"\S*site-packages/", "", text.replace(ROOT + os.sep, ""))
    return text.replace("|", "\\|").replace("\n", " ")


def _note(record: dict[str, Any]) -> str:
    status = record["status"]
    if status == "ok":
        return ""
    note = record.get("detail", "")
    if record.get("where"):
        note += f" ({record.get('phase', '')} at {record['where']})"
    if status == "unsupported" and "lenient_output_error" in record:
        finite = "finite" if record.get("lenient_relevance_finite") else "NOT finite"
        note += (f"; strict=False: output error {record['lenient_output_error']:.1e}, relevance {finite}")
    elif status == "unsupported" and "lenient_error" in record:
        lenient = record["lenient_error"]
        if lenient.split(" (")[0] in record.get("detail", "") or "in-place" in lenient:
            lenient = "the same error"  # an in-place operation is an error with strict=False as well
        note += f"; strict=False: {lenient}"
    return note


def family_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| family | model | params (M) | input | status | capture | convert (s) | forward (s) | explain (s) "
        "| coverage | output error | ΣR / R_out | note |",
        "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for family in sorted(results):
        record = results[family]
        size = record.get("input_size")
        measured = measured_coverage(record)
        cover = f"{measured[0]}/{measured[1]} ({measured[0] / measured[1]:.1%})" if measured and measured[1] else ""
        lenient = "lenient_" if record["status"] == "unsupported" else ""
        if measured and lenient:
            cover += " (strict=False)"
        if measured and not record.get(lenient + "eager_complete", True):
            cover += " (partial: the run stopped)"
        parameters = record.get("parameters")
        error = record.get("output_error")
        total = record.get("relevance_sum")
        capture = record.get("capture") or record.get("lenient_capture", "")
        lines.append(
            f"| {family} | {record.get('model', '')} | "
            f"{'' if parameters is None else f'{parameters / 1e6:.2f}'} | "
            f"{'' if not size else 'x'.join(str(value) for value in size[1:])} | {record['status']} | "
            f"{_cell(capture)} | {_seconds(record.get('convert_s'))} | {_seconds(record.get('forward_s'))} | "
            f"{_seconds(record.get('explain_s'))} | {cover} | {'' if error is None else f'{error:.1e}'} | "
            f"{'' if total is None else f'{total:.3g}'} | {_cell(_note(record))} |"
        )
    return lines


def summary(results: dict[str, dict[str, Any]]) -> list[str]:
    statuses = Counter(record["status"] for record in results.values())
    ran = {family: record for family, record in results.items() if record["status"] != "skipped"}
    lines = [f"- families: {len(results)}; run: {len(ran)}; "
             + ", ".join(f"{statuses[status]} {status}" for status in STATUSES if statuses[status]) + "."]
    captures = Counter(record.get("capture", "").split(" (")[0] for record in ran.values() if record.get("capture"))
    if captures:
        lines.append("- capture path of the strict conversions: "
                     + ", ".join(f"{count} {path}" for path, count in captures.most_common()) + ".")
    fractions = []
    covered_sum = total_sum = 0
    for record in ran.values():
        measured = measured_coverage(record)
        if measured and measured[1]:
            fractions.append(measured[0] / measured[1])
            covered_sum, total_sum = covered_sum + measured[0], total_sum + measured[1]
    if fractions:
        lines.append(
            f"- coverage (covered / all nodes, eager parts by operations run; strict=False counts for "
            f"unsupported families), {len(fractions)} families: {sum(f == 1 for f in fractions)} at 100%, "
            f"median {statistics.median(fractions):.2%}, mean {statistics.fmean(fractions):.2%}, "
            f"minimum {min(fractions):.2%}; all nodes together {covered_sum}/{total_sum} "
            f"({covered_sum / total_sum:.2%})."
        )
    operations: Counter[str] = Counter()
    for record in ran.values():
        operations.update(set(record.get("operations", [])))
    if operations:
        lines.append("- operations without a rule (families that need each): "
                     + ", ".join(f"`{name}` ({count})" for name, count in operations.most_common()) + ".")
    explained = [record["explain_s"] / record["forward_s"] for record in ran.values()
                 if record["status"] == "ok" and record.get("forward_s")]
    if explained:
        lines.append(f"- one explanation / one forward of the model (ok families): median "
                     f"{statistics.median(explained):.1f}x, maximum {max(explained):.1f}x.")
    return lines


def failures(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per family that did not pass, for a reader looking for what to fix."""
    lines = []
    for family, record in sorted(results.items()):
        if record["status"] not in ("ok", "skipped"):
            lines.append(f"- **{family}** (`{record.get('model', '')}`): {record['status']}: {_cell(_note(record))}")
    return lines or ["Every family that ran passed."]


def document(results: dict[str, dict[str, Any]], threads: int, command: str) -> str:
    wall = sum(record.get("wall_s", 0.0) for record in results.values())
    commits = sorted({record["commit"] for record in results.values() if record.get("commit")})
    loads = [record["load"] for record in results.values() if "load" in record]
    load = f"; load average (1 min) at each model's start {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    code = f"fxlrp at commit(s) {', '.join(commits)} plus the working tree of that time" if commits else ""
    jobs = max((record.get("side_by_side", 1) for record in results.values()), default=1)
    pace = "one at a time" if jobs == 1 else f"up to {jobs} side by side"
    lines = [
        "# timm coverage",
        "",
        "Every timm architecture family, one model each, through `fxlrp.convert(model, strict=True, "
        "capture=\"auto\")` with the default composite. Written by `benchmarks/timm_sweep.py`, whose "
        "docstring defines family, model choice and coverage. In short: a family is the timm module a "
        "model's entrypoint lives in; its model is the smallest by parameter count (timm's own `test_*` "
        "configurations included), at its default input size, random weights, eval, batch 1, float32, "
        "each in its own process; families whose smallest model has more than 150M parameters are "
        "skipped.",
        "",
        f"Machine: {machine(threads)}{load}. Date: {datetime.date.today().isoformat()}; the models' "
        f"processes took {wall / 60:.0f} min in all, {pace}, on a machine shared with other work; "
        f"{code}. Rerun: `{command}` (it skips the families cached in out/timm_sweep/results.json; "
        "`--redo` runs them again).",
        "",
        "## Summary",
        "",
        *summary(results),
        "",
        "Status: *ok* = strict conversion, outputs equal (max|diff| / max|out| <= 1e-4: BatchNorm folding "
        "rounds) and finite relevance; *unsupported* = `fxlrp.UnsupportedOperationError`, the operations "
        "it names in the note (then the model is converted with `strict=False` for its coverage, outputs "
        "and relevance); *capture error* = `fxlrp.CaptureError`; *wrong outputs*, *non-finite relevance*, "
        "*zero relevance*: the checks that failed; *error* = anything else, with its first line, the "
        "step (convert, the explainer's first run, attribute) and the innermost line outside torch. "
        "Weights a family initialises to all zeros (MLP-Mixer's head, LeViT's attention biases, NFNet's "
        "last gains) are drawn at random as well, so that no output and no branch is 0.",
        "",
        "Columns: *capture*: `fx` (the whole model as a graph), `partly eager (n)` (n modules torch.fx "
        "could not trace run eagerly), `whole eager`. *convert*: `fxlrp.convert`. *forward*: the model's "
        "own forward (no gradients). *explain*: one `fxlrp.attribute(explain, x)` after one explainer "
        "run. *coverage*: covered / all nodes; graph nodes are the rows of `explain.report()` "
        "(covered unless their handling is `gradient`), an eager part counts the torch operations it "
        "runs on relevance-carrying tensors (covered if the registry has the operation). *output "
        "error*: max|explainer - model| / max|model|. *ΣR / R_out*: the input relevance's sum over "
        "the explained logit (conservation; biases and epsilon take their share). With random weights a "
        "deep model's output may hardly depend on its input (gradient x input then sums to a tiny "
        "fraction of the logit as well), so sums far below 1 are expected; a magnitude above 1 means "
        "relevance was amplified somewhere (e.g. the z-rule on a sum of terms of opposite sign).",
        "",
        "## Not passing",
        "",
        *failures(results),
        "",
        "## Families",
        "",
        *family_table(results),
        "",
    ]
    return "\n".join(lines)


# Driver --------------------------------------------------------------------------------------------


def select(available: dict[str, list[str]], wanted: str | None) -> list[str]:
    if not wanted:
        return sorted(available)
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise SystemExit(f"unknown families {', '.join(unknown)}; choose from: {', '.join(sorted(available))}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", help="comma-separated timm modules (default: all)")
    parser.add_argument("--limit", type=int, help="run at most this many models (after skipping cached ones)")
    parser.add_argument("--jobs", type=int, default=1, help="models run side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per model")
    parser.add_argument("--memory-gb", type=float, default=12, help="address space per model; 0: no cap")
    parser.add_argument("--redo", action="store_true", help="run the selected families again")
    parser.add_argument("--no-write", action="store_true", help="leave docs/timm-coverage.md alone")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        _worker(arguments.worker, arguments.threads, arguments.memory_gb, arguments.worker_out)
        return

    available = families()
    chosen = select(available, arguments.families)
    results_path = os.path.join(CACHE, "results.json")
    results = _read_json(results_path)
    pending = [family for family in chosen if arguments.redo or family not in results]
    if arguments.limit is not None:
        pending = pending[: arguments.limit]
    lock = threading.Lock()
    finished = Counter()

    def one(family: str) -> None:
        name, parameters = smallest(available[family])
        if parameters > MAX_PARAMETERS:
            record = {"model": name, "parameters": parameters, "status": "skipped",
                      "detail": f"smallest model has {parameters / 1e6:.0f}M parameters (> 150M)"}
        else:
            record = run_in_subprocess(name, arguments.threads, arguments.timeout, arguments.memory_gb)
            record["side_by_side"] = max(1, arguments.jobs)  # for the document: timings of shared cores
        with lock:
            results[family] = record
            _write_json(results_path, results)
            finished["models"] += 1
            done = finished["models"]
        print(f"[{done}/{len(pending)}] {family}: {name} {record['status']} {record.get('detail', '')[:160]} "
              f"({record.get('wall_s', 0):.0f} s)", flush=True)

    print(f"{len(pending)} families to run, {len(chosen) - len(pending)} cached", flush=True)
    if pending:
        # parameter counts first, in this process, so the workers' choices need no second count
        parameter_counts([name for family in pending for name in available[family]])
    with ThreadPoolExecutor(max_workers=max(1, arguments.jobs)) as pool:
        list(pool.map(one, pending))

    # the document covers the whole cache, whatever this run selected
    command = "python benchmarks/timm_sweep.py" + (f" --threads {arguments.threads}" if arguments.threads != 1 else "")
    text = document(results, arguments.threads, command)
    if not arguments.no_write:
        with open(DOCUMENT, "w") as out:
            out.write(text)
        print(f"wrote {DOCUMENT}")
    else:
        print(text)


if __name__ == "__main__":
    main()
