"""Every model of ``torchvision.models.list_models()`` through fxlrp: converts, outputs, reference.

    python benchmarks/torchvision_sweep.py                     # every model; writes docs/torchvision-coverage.md
    python benchmarks/torchvision_sweep.py --families detection --redo
    python benchmarks/torchvision_sweep.py --models resnet18,raft_small --no-write

Families: classification, segmentation, detection, video, optical flow, quantized (reported: int8
kernels have no rules). Each model is built with random weights (no downloads) at the smallest
input it takes, and checked by ``support.zoo.check`` (tests/support/zoo.py), which
``tests/models/test_torchvision_families.py`` runs on a subset:

- converts: ``fxlrp.convert(model)`` (strict, the default composite);
- outputs equal: the explainer's outputs while relevance flows, bit for bit where they are the
  model's; else within twice the model's own float32 rounding, measured against the model in
  float64 (the rules compute BatchNorm as its affine map), for detectors and RAFT (few output
  values) or within 1e-4 of float64;
- relevance of the explained output (the top class; class 1 at every pixel of a segmentation; a
  detector's detection 0's class logit; the horizontal flow of a region) finite and not all zero;
- reference, float64: LRP-0 = gradient x input on piecewise-linear models, else conservation:
  with biases, BatchNorm means, tokens and position embeddings zeroed, LRP-0 with CP-LRP's
  products passes the whole output relevance to the input (relative error < 1e-9).

Each model runs in its own process (``--timeout``; a crash or a hang costs one row), one torch
thread; results are cached in ``out/torchvision_sweep/results.json`` after each model, and the
document is written from the whole cache (a rerun skips the cached models; ``--redo``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # fxlrp from this checkout, and the tests' support.zoo
from benchmarks.timm_sweep import _commit, _read_json, _write_json  # noqa: E402

CACHE = os.path.join(ROOT, "out", "torchvision_sweep", "results.json")
DOCUMENT = os.path.join(ROOT, "docs", "torchvision-coverage.md")
FAMILY_ORDER = ("classification", "segmentation", "detection", "video", "optical_flow", "quantization")


def _worker(name: str, path: str) -> None:
    import torch
    from support.zoo import check

    torch.set_num_threads(1)
    record = check(name)
    record.update(commit=_commit(), load=os.getloadavg()[0])
    with open(path, "w") as out:
        json.dump(record, out)


def run_in_subprocess(name: str, family: str, timeout: float) -> dict[str, Any]:
    """One model in a fresh process; a timeout or a crash is a result."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", name, "--worker-out", path]
        start = time.perf_counter()
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"family": family, "model": name, "error": f"no result after {timeout:.0f} s",
                    "seconds": time.perf_counter() - start}
        if not os.path.exists(path):
            tail = (finished.stderr or finished.stdout).strip().splitlines()[-1:] or [""]
            return {"family": family, "model": name, "error": f"crashed ({finished.returncode}): {tail[0][:300]}",
                    "seconds": time.perf_counter() - start}
        with open(path) as source:
            return json.load(source)


def passed(record: dict[str, Any]) -> bool:
    """Converts, outputs equal, relevance finite and not zero, and the reference holds where checked."""
    return bool(record.get("converts") and record.get("outputs_equal") and record.get("relevance_ok")
                and record.get("reference_ok") is not False and "error" not in record)


def _yes(value: Any) -> str:
    return "" if value is None else "yes" if value else "**no**"


def _reference(record: dict[str, Any]) -> str:
    if "reference" not in record:
        return ""
    error = record["reference_error"]
    verdict = {True: "", False: " **fails**", None: ""}[record["reference_ok"]]
    return f"{record['reference']}: {error:.0e}{verdict}"


def _note(record: dict[str, Any]) -> str:
    note = record.get("error") or record.get("detail") or ""
    if record.get("outputs_equal") is False:
        note = f"outputs {record['outputs']}; {note}"
    return note.replace("|", "\\|")


WHY = {
    "quantization": "int8 modules (`torch.ao.nn.quantized`) have no rules: explain the float model (`quantize=False`, "
                    "or the model before `torch.ao.quantization.convert`)",
    "maskrcnn_resnet50_fpn_v2": "with these random weights every score is exactly 1.0 in float32 (the softmax "
                                "saturates), and `explain_detection` finds the class logit from the gradient of the "
                                "score, which is 0 there",
}
"""Why a model does not pass, shown while it does not (by model name, else by family)."""


def failures(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per model that does not pass (the quantized ones as one line)."""
    lines, quantized = [], []
    for name, record in sorted(results.items(), key=lambda item: (FAMILY_ORDER.index(item[1]["family"]), item[0])):
        if passed(record):
            continue
        if record["family"] == "quantization" and not record.get("converts"):
            quantized.append(name)
            continue
        why = WHY.get(name, "")
        lines.append(f"- **{name}** ({record['family']}): {_note(record) or record.get('outputs', '')}"
                     + (f": {why}" if why else ""))
    if quantized:
        lines.append(f"- the {len(quantized)} quantized models are refused (`fxlrp.UnsupportedOperationError` in one "
                     f"line): {WHY['quantization']}.")
    return lines or ["Every model passes."]


def summary(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| family | models | convert strictly | outputs equal | reference holds (checked) | all checks pass |",
             "|---|---:|---:|---:|---:|---:|"]
    for family in FAMILY_ORDER:
        records = [record for record in results.values() if record["family"] == family]
        if not records:
            continue
        checked = [record for record in records if record.get("reference_ok") is not None]
        lines.append(
            f"| {family} | {len(records)} | {sum(bool(record.get('converts')) for record in records)} | "
            f"{sum(bool(record.get('outputs_equal')) for record in records)} | "
            f"{sum(bool(record['reference_ok']) for record in checked)} ({len(checked)}) | "
            f"{sum(passed(record) for record in records)} |")
    return lines


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| family | model | input | converts | outputs equal | reference checked | seconds | note |",
             "|---|---|---|---|---|---|---:|---|"]
    for name, record in sorted(results.items(), key=lambda item: (FAMILY_ORDER.index(item[1]["family"]), item[0])):
        outputs = record.get("outputs", "")
        lines.append(f"| {record['family']} | {name} | {record.get('input', '')} | {_yes(record.get('converts'))} | "
                     f"{outputs} | {_reference(record)} | {record.get('seconds', 0):.1f} | {_note(record)} |")
    return lines


def machine() -> str:
    import torch
    import torchvision

    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    cpu = names[0] if names else platform.processor() or "unknown CPU"
    return (f"{cpu}, {os.cpu_count()} cores, 1 torch thread per model; torch {torch.__version__}, torchvision "
            f"{torchvision.__version__}; Python {platform.python_version()}")


def document(results: dict[str, dict[str, Any]]) -> str:
    commits = sorted({record["commit"] for record in results.values() if record.get("commit")})
    loads = [record["load"] for record in results.values() if "load" in record]
    minutes = sum(record.get("seconds", 0.0) for record in results.values()) / 60
    return "\n".join([
        "# torchvision coverage",
        "",
        "Every model of `torchvision.models.list_models()` through `fxlrp.convert(model)` (strict, the default "
        "composite): random weights, the smallest input each model takes, float32, one process each. Written by "
        "`benchmarks/torchvision_sweep.py`, whose docstring defines the checks; the checks are "
        "`check` in `tests/support/zoo.py`, which the slow test `tests/models/test_torchvision_families.py` runs "
        "on 15 models beyond classification (each family, each kind of reference, each detector head; about a "
        "minute of checks), as `tests/models/test_torchvision_zoo.py` checks the classifiers; the whole sweep is "
        "this script's.",
        "",
        "- *outputs equal*: the explainer's outputs while relevance flows against the model's: bit for bit in "
        "float32, or else, both in float64, the same outputs, shapes and integer outputs and floating-point "
        "outputs within 1e-9 relative (the rules compute BatchNorm as its affine map, other kernels for the same "
        "sums, which round differently; in float32 by an amount no bound holds for on every CPU); a detector's "
        "detections compared in the order of their scores (ties in the order of label and box). Shown as well: "
        "the float32 explainer's error against the model in float64 over the model's own float32 error, and the "
        "float64 error (`OUTPUT_TOLERANCE` in tests/support/zoo.py).",
        "- *reference checked* (float64, relative error; it holds below 1e-9): `LRP-0 = gradient x input` on "
        "piecewise-linear paths (of the explained output: the top class, class 1 at every pixel of a segmentation, "
        "the class logit of a detector's first detection); `conservation (bias-free)` on the others: with "
        "biases, BatchNorm means, class tokens, position embeddings and a detector's image mean zeroed, LRP-0 "
        "with CP-LRP's products gives input relevance summing to the explained output. RAFT (run in float64 with "
        "its grid of pixel coordinates made in float64 too) has no exact reference: the relative error of its "
        "bias-free sum is shown, and it is not small (relevance is not conserved through RAFT's rules; where it "
        "goes is open).",
        "- *seconds*: the whole check of the model (building it, conversion, the float32 runs and the float64 "
        "reference).",
        "",
        f"Machine: {machine()}; load average (1 min) at the models' starts "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}, shared with other work. Date: "
        f"{datetime.date.today().isoformat()}; {minutes:.0f} min of checks in all (each model's process also "
        f"starts torch and torchvision); fxlrp at commit(s) "
        f"{', '.join(commits)} plus the working tree of that time. Rerun: `python benchmarks/torchvision_sweep.py` "
        "(it skips the models cached in out/torchvision_sweep/results.json; `--redo` runs them again).",
        "",
        "## Summary",
        "",
        *summary(results),
        "",
        "## Not passing",
        "",
        *failures(results),
        "",
        "## Models",
        "",
        *table(results),
        "",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", help=f"comma-separated, of {', '.join(FAMILY_ORDER)} (default: all)")
    parser.add_argument("--models", help="comma-separated model names (default: every model of the families)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per model")
    parser.add_argument("--redo", action="store_true", help="run the selected models again")
    parser.add_argument("--no-write", action="store_true", help="print the document instead of writing it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        _worker(arguments.worker, arguments.worker_out)
        return
    from support.zoo import FAMILIES, family_of

    families = arguments.families.split(",") if arguments.families else list(FAMILY_ORDER)
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"unknown families {', '.join(sorted(unknown))}; choose from {', '.join(FAMILY_ORDER)}")
    names = arguments.models.split(",") if arguments.models else [name for family in families
                                                                   for name in FAMILIES[family]]
    results = _read_json(CACHE)
    pending = [name for name in names if arguments.redo or name not in results]
    print(f"{len(pending)} models to run, {len(names) - len(pending)} cached", flush=True)
    for number, name in enumerate(pending, 1):
        record = run_in_subprocess(name, family_of(name), arguments.timeout)
        results[name] = record
        _write_json(CACHE, results)
        print(f"[{number}/{len(pending)}] {name}: {'pass' if passed(record) else 'FAIL'} {_note(record)[:160]} "
              f"({record.get('seconds', 0):.0f} s)", flush=True)
    text = document(results)
    if arguments.no_write:
        print(text)
    else:
        with open(DOCUMENT, "w") as out:
            out.write(text)
        print(f"wrote {DOCUMENT}")


if __name__ == "__main__":
    main()
