"""Worker processes shared by the benchmarks that compare fxlrp with LXT (``llama_cost.py``,
``generation.py``): each configuration is timed and measured in a process of its own, in the main
environment or in LXT's (``.venv-lxt``, transformers 4.x), started by the driver with the same
command line plus the options that say what to run. Light: imported in LXT's environment too."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LXT_PYTHON = os.path.join(ROOT, ".venv-lxt", "bin", "python")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every such benchmark has: threads, repeats, a tiny model to check the script,
    and the hidden ones a worker process is started with."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tiny model, to check the script")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--worker", choices=("time", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--names", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)


def ran_as_worker(arguments: argparse.Namespace, time_worker: Callable[[argparse.Namespace], dict],
                  memory_worker: Callable[[argparse.Namespace], dict]) -> bool:
    """Where this process is a worker: runs it, prints its report as the last line (what
    :func:`spawn` reads) and says so."""
    if not arguments.worker:
        return False
    work = time_worker if arguments.worker == "time" else memory_worker
    print(json.dumps(work(arguments)))
    return True


def spawn(script: str, python: str, mode: str, names: tuple[str, ...], arguments: argparse.Namespace,
          state: str, options: list[str], environment: dict[str, str] | None = None) -> dict:
    """Run ``script`` as a ``mode`` worker ("time" or "memory") of the configurations ``names``
    under ``python``, on the weights saved at ``state``, with the common options of
    ``arguments`` and the script's own ``options``; its report."""
    command = [python, os.path.abspath(script), "--worker", mode, "--names", *names, "--state", state,
               "--threads", str(arguments.threads), "--repeats", str(arguments.repeats), *options]
    command += ["--quick"] if arguments.quick else []
    variables = dict(os.environ, PYTHONPATH=ROOT, TRANSFORMERS_VERBOSITY="error", **(environment or {}))
    completed = subprocess.run(command, cwd=ROOT, env=variables, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(names)} ({mode}) failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def timed_rounds(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds of one call of each configuration, the order rotating from round to
    round (so that no configuration always runs after the same one); each call's seconds."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for repeat in range(repeats):
        for name in order[repeat % len(order):] + order[:repeat % len(order)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times
