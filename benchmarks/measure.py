"""Timing (interleaved repeats in one process, medians) and peak memory, in a fresh process per
configuration: the peak of the bytes torch's allocator has handed out during a call (its own
statistics), and the peak resident set size above the resident size just before the call."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.allocator import allocated_peak_of_call, resident_peak_of_call
from benchmarks.configurations import CONFIGURATIONS, Unavailable
from benchmarks.workloads import Workload, build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Result:
    """One configuration on one workload."""

    setup: float | None = None
    """Seconds of the one-off work: ``fxlrp.convert``, registering zennit's hooks."""
    times: list[float] = field(default_factory=list)
    status: str = "ok"
    """``ok``, or why the configuration did not run (``unsupported: ...``, ``n/a: ...``)."""
    allocated: float | None = None
    """Peak of the memory torch allocated during a call and still held, in MB (third call)."""
    memory: float | None = None
    """Peak resident memory of a call above the resident size before it, in MB (second call)."""
    first_call_memory: float | None = None
    """The same for the first call, which also builds what a conversion caches."""

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:160]


def prepare(workload: Workload, name: str, result: Result) -> Callable[[], Any] | None:
    """The configuration's run function after one warm-up call, or None (``result.status``
    says why)."""
    try:
        start = time.perf_counter()
        run = CONFIGURATIONS[name].prepare(workload)
        result.setup = time.perf_counter() - start
        run()
        return run
    except Unavailable as error:
        result.status = f"n/a: {error}"
    except Exception as error:  # a library that cannot explain this model is a result, not a crash
        result.status = f"unsupported: {_first_line(error)}"
    return None


def time_interleaved(workload: Workload, names: list[str], repeats: int) -> dict[str, Result]:
    """Run every configuration once per round, ``repeats`` rounds, rotating the order so that
    no configuration always follows the same one; machine load hits all of them alike."""
    results = {name: Result() for name in names}
    runs = {}
    for name in names:
        run = prepare(workload, name, results[name])
        if run is not None:
            runs[name] = run
    order = list(runs)
    synchronize = _synchronizer(workload.device)
    for round_ in range(repeats):
        shift = round_ % max(len(order), 1)
        for name in order[shift:] + order[:shift]:
            gc.collect()
            synchronize()
            start = time.perf_counter()
            runs[name]()
            synchronize()  # a GPU runs the call's kernels after the host has queued them
            results[name].times.append(time.perf_counter() - start)
    if workload.device.type == "cuda":
        for name, run in runs.items():
            results[name].allocated = cuda_allocated_peak_of_call(run, workload.device)
    return results


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def cuda_allocated_peak_of_call(run: Callable[[], Any], device: torch.device) -> float:
    """The highest total of GPU memory torch's caching allocator handed out during the call,
    above what was allocated before it, in MB (what a GPU's memory must hold for the call)."""
    gc.collect()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    output = run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del output
    return (peak - before) / 2**20


def probe_memory(model: str, name: str, quick: bool) -> dict[str, Any]:
    """In this (fresh) process: peak resident memory of a call of the configuration above the
    resident memory right before it, in MB, for the first call (with one-off work such as
    modified weights cached per conversion) and for the next one; then the allocator's peak of
    a third call (:func:`allocated_peak_of_call`). Linux only (/proc/self/clear_refs resets the
    resident peak)."""
    workload = build(model, quick)
    try:
        run = CONFIGURATIONS[name].prepare(workload)
        first = resident_peak_of_call(run)
        peak = resident_peak_of_call(run)
        return {"peak_mb": peak, "first_mb": first, "allocated_mb": allocated_peak_of_call(run)}
    except Exception as error:
        return {"error": _first_line(error)}


def memory_in_subprocess(model: str, name: str, quick: bool, threads: int | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.run", "--probe-memory", model, name]
    if quick:
        command.append("--quick")
    if threads:
        command += ["--threads", str(threads)]
    environment = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        return {"error": (completed.stderr.strip().splitlines() or ["no output"])[-1][:160]}
    return json.loads(lines[-1])


IMPORT_PROBE = "import time, torch; start = time.perf_counter(); import fxlrp; print(time.perf_counter() - start)"


def import_seconds(repeats: int) -> float:
    """Median seconds of ``import fxlrp`` after ``import torch``, each in a fresh process."""
    times = [
        float(subprocess.run([sys.executable, "-c", IMPORT_PROBE], check=True, capture_output=True, text=True,
                             cwd=ROOT).stdout.strip().splitlines()[-1])
        for _ in range(max(repeats, 1))
    ]
    return statistics.median(times)
