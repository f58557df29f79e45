"""fxlrp benchmark: forward, gradient x input, fxlrp, zennit and captum side by side.

    python benchmarks/run.py                      # everything; writes its section of docs/benchmarks.md
    python benchmarks/run.py --quick              # small inputs, a smoke check (writes nothing)
    python benchmarks/run.py --models resnet50,gcn --configs fxlrp,zennit --repeats 3

Timings: all configurations of a model in one process, interleaved repeats, medians.
Memory: a fresh process per configuration (``--no-memory`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.allocator import release_freed_memory  # noqa: E402
from benchmarks.configurations import CONFIGURATIONS, FLOOR  # noqa: E402
from benchmarks.measure import (  # noqa: E402
    import_seconds,
    memory_in_subprocess,
    probe_memory,
    time_interleaved,
)
from benchmarks.table import document, model_table, summary, write  # noqa: E402
from benchmarks.workloads import DESCRIPTIONS, FULL, QUICK_DESCRIPTION, build  # noqa: E402


def _select(available: list[str], selectors: str | None) -> list[str]:
    """Names containing any of the comma-separated ``selectors`` (case-insensitive)."""
    if not selectors:
        return available
    wanted = [selector.strip().lower() for selector in selectors.split(",") if selector.strip()]
    chosen = [name for name in available if any(selector in name.lower() for selector in wanted)]
    if not chosen:
        raise SystemExit(f"nothing matches {selectors!r}; choose from: {', '.join(available)}")
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help=f"comma-separated, from: {', '.join(FULL)}")
    parser.add_argument("--configs", help="comma-separated substrings of configuration names "
                        f"(gradient x input is always included): {', '.join(CONFIGURATIONS)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int,
                        help="torch threads (default: torch's choice); 1 is steadier on a busy machine")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default) or cuda; on cuda, memory is the GPU allocator's peak of a call "
                             "and the figures are printed, not written")
    parser.add_argument("--batch", type=int, help="images per call, instead of each workload's default")
    parser.add_argument("--quick", action="store_true", help="small inputs; a smoke check, writes nothing")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-configuration memory processes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--probe-memory", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)

    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    if arguments.probe_memory:
        print(json.dumps(probe_memory(*arguments.probe_memory, arguments.quick)))
        return

    models = _select(list(FULL), arguments.models)
    # Configurations marked by_default=False (their preparation takes minutes) run when named in full.
    requested = [selector.strip().lower() for selector in (arguments.configs or "").split(",") if selector.strip()]
    on_request = [name for name, configuration in CONFIGURATIONS.items()
                  if not configuration.by_default and name.lower() in requested]
    others = [selector for selector in requested if selector not in {name.lower() for name in on_request}]
    defaults = [name for name, configuration in CONFIGURATIONS.items() if configuration.by_default]
    names = (_select(defaults, ",".join(others)) if others or not requested else []) + on_request
    if FLOOR not in names:
        names.insert(0, FLOOR)
    all_results = {}
    for model in models:
        print(f"{model}: timing {len(names)} configurations x {arguments.repeats} repeats", flush=True)
        workload = build(model, arguments.quick, arguments.device, arguments.batch)
        results = time_interleaved(workload, names, arguments.repeats)
        del workload
        release_freed_memory()  # the timed explainers and model copies, before the memory processes
        if not arguments.no_memory and arguments.device == "cpu":
            for name, result in results.items():
                if result.status == "ok":
                    print(f"{model}: memory of {name}", flush=True)
                    memory = memory_in_subprocess(model, name, arguments.quick, arguments.threads)
                    result.memory, result.first_call_memory = memory.get("peak_mb"), memory.get("first_mb")
                    result.allocated = memory.get("allocated_mb")
                    if "error" in memory:
                        result.status = f"memory probe failed: {memory['error']}"
        all_results[model] = results
        print("\n".join(model_table(results)), flush=True)  # as it comes: a long run may be cut short
    command = "make bench" if argv is None and len(sys.argv) == 1 else "python benchmarks/run.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    descriptions = {model: "quick: " + QUICK_DESCRIPTION for model in models} if arguments.quick else DESCRIPTIONS
    if arguments.batch:
        descriptions = {model: re.sub(r"batch \d+", f"batch {arguments.batch}", text)
                        for model, text in descriptions.items()}
    import_time = import_seconds(arguments.repeats) if arguments.device == "cpu" else None
    text = document(all_results, descriptions, arguments.repeats, arguments.quick, command.strip(), import_time)
    print(text)
    if not (arguments.quick or arguments.no_write or arguments.device != "cpu" or arguments.batch):
        for path in write(text, summary(all_results, command.strip())):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
