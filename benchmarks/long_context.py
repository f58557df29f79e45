"""Long contexts: time and peak memory of an explanation against gradient x input and LXT 2.1.

A ``LlamaForCausalLM`` with random weights built from a config (``llama_cost.LONG_CONTEXT``: the layer of a
model of about 0.5B parameters - hidden 1024, intermediate 2816, 8 heads of 128, 2 key/value
heads, vocabulary 32000 - with ``--layers`` of them; memory per token and layer is what the ratios
measure), in bfloat16 (``--dtype``), one sequence of 2048, 4096 and 8192 tokens (``--lengths``),
explained at the last position's predicted token (``logits_to_keep=1``), with the model's own
attention implementation (``--attention``: ``sdpa``, ``eager``), without and with gradient
checkpointing (``model.gradient_checkpointing_enable()``). Configurations:

- ``gxi``: gradient x input at the word embeddings, plain autograd (transformers 5); with
  checkpointing the model runs in training mode, where transformers checkpoints its layers
  (Llama has no dropout: the values are those of evaluation mode);
- ``attnlrp``: ``fxlrp.attribute(fxlrp.convert(model, AttnLRP(0.0)), ids)`` (transformers 5), the
  model converted as it is (checkpointing enabled or not);
- ``lxt_gxi`` and ``lxt``: gradient x input of the unpatched and of the patched model in LXT's
  environment (LXT 2.1's efficient mode, ``monkey_patch(modeling_llama)``, transformers 4.54.1 in
  ``.venv-lxt``: ``make .venv-lxt/.installed``), as ``benchmarks/llama_cost.py`` runs them;
  with checkpointing in training mode, the recomputation inside LXT's patch. LXT's patch wraps
  ``eager_attention_forward`` and every function of ``ALL_ATTENTION_FUNCTIONS`` (sdpa, flash,
  flex), so it explains each implementation;
- ``lxt_attnlrp``: fxlrp as ``attnlrp``, in LXT's environment, timed only: its calls alternate
  with LXT's in one process, so fxlrp's time over LXT's is a paired ratio (the median over rounds
  of the ratio of the two calls of a round).

One worker process per environment, attention, length and checkpointing; in it two warm-up calls
for fxlrp (it records its eager part's graph at the second), one for the others, ``--repeats`` calls each,
the order rotating, medians; then, per configuration, the peak of the bytes torch's allocator
handed out during one call above what it held before the call (the activations an explanation
keeps and its transient buffers; the weights are left out: they are the same for all). Ratios
are to the gradient x input of the same environment, same length, same checkpointing. Before
each worker the driver waits until ``--free-gb`` of memory are available (a shared machine).

    python benchmarks/long_context.py --threads 2 --layers 2 --lengths 2048 4096 8192
    python benchmarks/long_context.py --quick   # a tiny model, to check the script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.allocator import allocated_growth_of_call  # noqa: E402
from benchmarks.llama_cost import (  # noqa: E402
    LONG_CONTEXT,
    LONG_CONTEXT_QUICK,
    LXT_PYTHON,
    LxtPatch,
    _cpu_name,
    _model,
    _runner,
    save_llama,
)

MAIN = ("gxi", "attnlrp")
LXT = ("lxt_gxi", "lxt_attnlrp", "lxt")
BASE = {"gxi": "gxi", "attnlrp": "gxi", "lxt_gxi": "lxt_gxi", "lxt_attnlrp": "lxt", "lxt": "lxt_gxi"}
"""What each configuration's time is paired with (the same process, call by call): fxlrp in LXT's
environment with LXT."""
FXLRP = ("attnlrp", "lxt_attnlrp")
TIMED_ONLY = ("lxt_attnlrp",)
"""Configurations timed, not measured for memory (fxlrp's memory is that of the main environment)."""


# -- inside a worker process -----------------------------------------------------------------------


def _config(arguments: argparse.Namespace) -> dict[str, Any]:
    return dict(LONG_CONTEXT_QUICK if arguments.quick else LONG_CONTEXT, num_hidden_layers=arguments.layers)


def _setup(arguments: argparse.Namespace) -> tuple[Any, Any, int]:
    import torch

    torch.set_num_threads(arguments.threads)
    config = _config(arguments)
    model = _model(config, arguments.state, arguments.attention, arguments.dtype)
    if arguments.checkpointing:
        model.gradient_checkpointing_enable()
    ids = torch.randint(3, config["vocab_size"], (1, arguments.length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = int(model(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax())
    return model, ids, target


def worker(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    model, ids, target = _setup(arguments)
    patch = LxtPatch() if "lxt" in arguments.names else None
    runs = {name: _runner(name, model, ids, target, patch, arguments.checkpointing) for name in arguments.names}
    # fxlrp records its eager part's graph at the second call of an input signature and replays it
    # from then on: two warm-up calls for it, one for the others
    for name, run in runs.items():
        for _ in range(2 if name in FXLRP else 1):
            run()
    relevance = {name: run().float().flatten().tolist() for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for repeat in range(arguments.repeats):
        for name in order[repeat % len(order):] + order[:repeat % len(order)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    memory = {name: allocated_growth_of_call(run) for name, run in runs.items() if name not in TIMED_ONLY}
    return {"times": times, "allocated_mb": memory, "relevance": relevance,
            "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}"}


# -- the driver ------------------------------------------------------------------------------------


def _available_gb() -> float:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def _spawn(python: str, names: tuple[str, ...], arguments: argparse.Namespace, state: str, attention: str,
           length: int, checkpointing: bool) -> dict[str, Any]:
    while _available_gb() < arguments.free_gb:  # a shared machine: wait for room
        time.sleep(30)
    command = [python, os.path.abspath(__file__), "--worker", "--names", *names, "--state", state,
               "--threads", str(arguments.threads), "--repeats", str(arguments.repeats), "--length", str(length),
               "--attention", attention, "--layers", str(arguments.layers), "--dtype", arguments.dtype]
    command += ["--checkpointing"] * checkpointing + ["--quick"] * arguments.quick
    environment = dict(os.environ, PYTHONPATH=ROOT, TRANSFORMERS_VERBOSITY="error")
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(names)} ({attention}, {length}) failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _relative_error(ours: list, theirs: list) -> float:
    import torch

    ours_tensor, theirs_tensor = torch.tensor(ours), torch.tensor(theirs)
    return float((ours_tensor - theirs_tensor).abs().max() / theirs_tensor.abs().max())


def _correlation(ours: list, theirs: list) -> float:
    import torch

    return float(torch.corrcoef(torch.stack([torch.tensor(ours), torch.tensor(theirs)]))[0, 1])


def drive(arguments: argparse.Namespace) -> dict[str, Any]:
    config = _config(arguments)
    with_lxt = not arguments.no_lxt and os.path.exists(LXT_PYTHON)
    rows = []
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        state = os.path.join(directory, "llama.pt")
        parameters = save_llama(config, state, arguments.dtype)
        for attention in arguments.attention:
            for length in arguments.lengths:
                for checkpointing in arguments.checkpointing_runs:
                    row: dict[str, Any] = {"attention": attention, "length": length, "checkpointing": checkpointing}
                    for python, names in ((sys.executable, MAIN), (LXT_PYTHON, LXT))[:1 + with_lxt]:
                        result = _spawn(python, names, arguments, state, attention, length, checkpointing)
                        row.setdefault("times", {}).update(result["times"])
                        row.setdefault("allocated_mb", {}).update(result["allocated_mb"])
                        row.setdefault("relevance", {}).update(result["relevance"])
                        row.setdefault("versions", {})[names[0]] = result["versions"]
                    row["seconds"] = {name: statistics.median(values) for name, values in row["times"].items()}
                    ratios = {name: [a / b for a, b in zip(row["times"][name], row["times"][BASE[name]], strict=True)]
                              for name in row["times"]}
                    row["paired"] = {name: statistics.median(values) for name, values in ratios.items()}
                    row["paired_range"] = {name: (min(values), max(values)) for name, values in ratios.items()}
                    relevance = row.pop("relevance")
                    if "lxt" in relevance:
                        ours, theirs = relevance["attnlrp"], relevance["lxt"]
                        row["attnlrp_vs_lxt"] = {"relative_error": _relative_error(ours, theirs),
                                                 "correlation": _correlation(ours, theirs)}
                    rows.append(row)
                    print(_row_line(row), flush=True)
    return {"config": config, "parameters": parameters,
            "dtype": arguments.dtype, "threads": arguments.threads, "repeats": arguments.repeats, "rows": rows,
            "load_average": {"start": load_start, "end": os.getloadavg()}, "cpu": _cpu_name(),
            "cores": os.cpu_count()}


def _row_line(row: dict[str, Any]) -> str:
    seconds, memory = row["seconds"], row["allocated_mb"]
    parts = [f"{row['attention']} {row['length']} checkpointing={row['checkpointing']}:"]
    for name in seconds:
        low, high = row["paired_range"][name]
        parts.append(f"{name} {seconds[name]:.2f}s ({row['paired'][name]:.2f}x {BASE[name]}, {low:.2f}-{high:.2f})" + (
            f" {memory[name]:.0f} MB ({memory[name] / memory[BASE[name]]:.2f}x)" if name in memory else ""))
    return " | ".join(parts)


def _median_and_range(row: dict[str, Any], name: str) -> str:
    """The median of ``name``'s paired ratios and, where the row has them (and more than one),
    their smallest and largest."""
    low, high = row.get("paired_range", {}).get(name, (None, None))
    spread = f" ({low:.2f}-{high:.2f})" if low is not None and len(row["times"][name]) > 1 else ""
    return f"{row['paired'][name]:.2f}{spread}"


def table(report: dict[str, Any]) -> str:
    """One line per attention, length and checkpointing: fxlrp's and LXT's time and peak memory
    as multiples of the gradient x input of their environment, and fxlrp's time over LXT's: the
    median of the ratios of fxlrp's and LXT's calls of one round in LXT's environment (one
    process, the same transformers code), with the smallest and largest of those ratios."""
    lines = ["| attention | tokens | checkpointing | gradient x input (s, MB) | fxlrp AttnLRP (s, MB) "
             "| x gradient (time, memory) | LXT 2.1 (s, MB) | x gradient (time, memory) "
             "| fxlrp / LXT time (paired: median, range) |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in report["rows"]:
        seconds, memory, paired = row["seconds"], row["allocated_mb"], row["paired"]
        cells = [row["attention"], str(row["length"]), "yes" if row["checkpointing"] else "no",
                 f"{seconds['gxi']:.1f}, {memory['gxi']:.0f}", f"{seconds['attnlrp']:.1f}, {memory['attnlrp']:.0f}",
                 f"{paired['attnlrp']:.2f}x, {memory['attnlrp'] / memory['gxi']:.2f}x"]
        if "lxt" in seconds:
            cells += [f"{seconds['lxt']:.1f}, {memory['lxt']:.0f}",
                      f"{paired['lxt']:.2f}x, {memory['lxt'] / memory['lxt_gxi']:.2f}x",
                      _median_and_range(row, "lxt_attnlrp") if "lxt_attnlrp" in paired else "-"]
        else:
            cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--attention", nargs="+", default=["sdpa", "eager"])
    parser.add_argument("--with-checkpointing", nargs="+", choices=("no", "yes"), default=["no", "yes"],
                        help="rows without and with gradient checkpointing")
    parser.add_argument("--free-gb", type=float, default=12.0, help="wait for this much available memory")
    parser.add_argument("--quick", action="store_true", help="a tiny model, to check the script")
    parser.add_argument("--no-lxt", action="store_true", help="leave out LXT's environment (.venv-lxt)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--table", help="print the table of a report written with --json, and stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--names", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    arguments.checkpointing_runs = [choice == "yes" for choice in arguments.with_checkpointing]
    if arguments.table:
        with open(arguments.table) as file:
            print(table(json.load(file)))
        return
    if arguments.worker:
        arguments.attention = arguments.attention[0]
        print(json.dumps(worker(arguments)))
        return
    report = drive(arguments)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump(report, file, indent=1)
    print(table(report))
    print(f"{report['parameters'] / 1e6:.0f}M parameters ({report['config']['num_hidden_layers']} layers), "
          f"{report['dtype']}; {report['cpu']}, {report['threads']} threads; load {report['load_average']}")


if __name__ == "__main__":
    main()
