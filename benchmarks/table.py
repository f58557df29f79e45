"""The benchmark's table: machine description, one section per model, target checks; written
between the markers of its section in docs/benchmarks.md, with the date and commit of the run."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Mapping

import torch

from benchmarks.configurations import FLOOR
from benchmarks.measure import ROOT, Result

START_MARKER = "<!-- benchmarks/run.py:start -->"
END_MARKER = "<!-- benchmarks/run.py:end -->"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = [f"torch {torch.__version__}"]
    for package in ("zennit", "captum"):
        try:
            from importlib.metadata import version

            versions.append(f"{package} {version(package)}")
        except Exception:
            pass
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    if torch.cuda.is_available():
        cpu = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}) with {cpu}"
    return (f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads; "
            f"{', '.join(versions)}; Python {platform.python_version()}; load average at start {load}")


def _number(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, floor: float | None) -> str:
    return "" if value is None or not floor else f"{value / floor:.2f}x"


def model_table(results: Mapping[str, Result]) -> list[str]:
    floor = results.get(FLOOR, Result())
    lines = [
        "| configuration | setup (s) | time (s) | / gradient | allocated (MB) | / gradient "
        "| resident (MB) | / gradient | first call resident (MB) | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, result in results.items():
        note = "" if result.status == "ok" else result.status.replace("|", "/")
        lines.append(
            f"| {name} | {_number(result.setup)} | {_number(result.seconds)} | "
            f"{_ratio(result.seconds, floor.seconds)} | {_number(result.allocated, 0)} | "
            f"{_ratio(result.allocated, floor.allocated)} | {_number(result.memory, 0)} | "
            f"{_ratio(result.memory, floor.memory)} | {_number(result.first_call_memory, 0)} | {note} |"
        )
    return lines


def _check(label: str, value: float | None, limit: float, compare: str = "<=") -> str | None:
    if value is None:
        return None
    met = value <= limit if compare == "<=" else value >= limit
    return f"- {label}: {value:.2f} (target {compare} {limit}) {'met' if met else 'MISSED'}"


def target_checks(all_results: Mapping[str, Mapping[str, Result]]) -> list[str]:
    """The issue's targets, as ratios from this run."""
    lines = []
    for model, results in all_results.items():
        floor = results.get(FLOOR)
        if floor is None or floor.seconds is None:
            continue

        def time_of(name: str) -> float | None:
            result = results.get(name)
            return result.seconds if result is not None else None

        def ratio(name: str, attribute: str = "seconds") -> float | None:
            result = results.get(name)
            value = getattr(result, attribute) if result is not None else None
            base = getattr(floor, attribute)
            return value / base if value is not None and base else None

        checks = [
            _check(f"{model}: fxlrp Epsilon time / gradient", ratio("fxlrp Epsilon"),
                   1.2 if model == "gcn" else 1.15),
            _check(f"{model}: fxlrp EpsilonPlusFlat time / gradient", ratio("fxlrp EpsilonPlusFlat"), 1.6),
        ]
        ours, theirs = time_of("fxlrp EpsilonPlusFlat"), time_of("zennit EpsilonPlusFlat")
        if ours and theirs:
            checks.append(_check(f"{model}: zennit EpsilonPlusFlat time / fxlrp's", theirs / ours, 3.0, ">="))
        for name in ("fxlrp Epsilon", "fxlrp EpsilonPlusFlat", "fxlrp EpsilonGammaBox"):
            checks.append(_check(f"{model}: {name} peak allocated / gradient", ratio(name, "allocated"), 1.25))
            checks.append(_check(f"{model}: {name} peak resident / gradient", ratio(name, "memory"), 1.25))
        if model == "resnet50":
            epsilon = results.get("fxlrp Epsilon")
            checks.append(_check("resnet50: convert (s)", epsilon.setup if epsilon else None, 0.5))
        lines += [check for check in checks if check is not None]
    return lines


def document(all_results: Mapping[str, Mapping[str, Result]], descriptions: Mapping[str, str],
             repeats: int, quick: bool, command: str, import_time: float | None = None) -> str:
    lines = [
        f"Machine: {machine()}.",
        "",
        f"Median of {repeats} interleaved repeats in one process. Memory, each configuration in a "
        "fresh process: *allocated* is the peak of the bytes torch's allocator handed out during a "
        "call and still held (the allocator's own statistics, reported to torch's profiler; third "
        "call); *resident* is the peak resident memory of a call above the resident memory right "
        "before it (second call; the first call, also shown, builds what a conversion caches, such "
        "as z+ and gamma weights). The resident peak also depends on how glibc's malloc places and "
        "keeps freed blocks, which moves it by tens of MB between runs of the same computation; "
        "the allocated peak does not. Setup is `fxlrp.convert` (or registering zennit's composite "
        "and canonizers). Ratios are to gradient x input with frozen parameters, measured in the same run."
        + (" **Quick mode: small inputs, for smoke checks only.**" if quick else ""),
        f"Rerun: `{command}`.",
        "",
    ]
    for model, results in all_results.items():
        lines += [f"### {model} ({descriptions.get(model, '')})", "", *model_table(results), ""]
    checks = target_checks(all_results)
    if import_time is not None:
        lines += [f"`import fxlrp` after `import torch`: {import_time:.3f} s (median of {repeats} fresh "
                  "processes).", ""]
        checks.append(_check("import fxlrp after torch (s)", import_time, 0.2))
    if checks:
        lines += ["Targets:", "", *checks, ""]
    return "\n".join(lines)


SUMMARY_COLUMNS = ("fxlrp Epsilon", "fxlrp EpsilonPlusFlat", "fxlrp EpsilonGammaBox", "zennit EpsilonPlusFlat")


def summary(all_results: Mapping[str, Mapping[str, Result]], command: str) -> str:
    """One row per model: time and memory as multiples of gradient x input."""
    lines = [
        "Time (and peak allocated memory) as multiples of gradient x input; the tables per model below.",
        "",
        "| model | gradient x input (s) | " + " | ".join(SUMMARY_COLUMNS) + " | convert (s) |",
        "|---|---:|" + "---:|" * len(SUMMARY_COLUMNS) + "---:|",
    ]
    for model, results in all_results.items():
        floor = results.get(FLOOR, Result())
        cells = []
        for name in SUMMARY_COLUMNS:
            result = results.get(name)
            if result is None or result.seconds is None:
                cells.append("unsupported" if result is not None and result.status.startswith("unsupported") else "")
                continue
            memory = _ratio(result.allocated, floor.allocated)
            cells.append(_ratio(result.seconds, floor.seconds) + (f" ({memory})" if memory else ""))
        epsilon = results.get("fxlrp Epsilon")
        lines.append(f"| {model} | {_number(floor.seconds, 2)} | " + " | ".join(cells)
                     + f" | {_number(epsilon.setup if epsilon else None, 2)} |")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"


def write(text: str, summary_text: str) -> list[str]:
    """Replace the run's section of docs/benchmarks.md (between its markers) with this run, dated
    and with its commit; the rest of the page (other benchmarks' dated figures) is kept. Returns
    the files written."""
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as source:
        content = source.read()
    start, end = content.find(START_MARKER), content.find(END_MARKER)
    if not 0 <= start < end:
        raise SystemExit(f"{path} has no section between {START_MARKER} and {END_MARKER}: add the markers "
                         "where the run's figures go, or pass --no-write")
    run = f"Run: {datetime.date.today().isoformat()} at {_commit()}."
    body = "\n\n".join([run, summary_text, text.rstrip()])
    with open(path, "w") as out:
        out.write(content[: start + len(START_MARKER)] + "\n" + body + "\n" + content[end:])
    return [path]
