"""What explaining every generated token costs: fxlrp's whole matrix against the steps one by one.

A ``LlamaForCausalLM`` with random weights (``benchmarks/llama_cost.py``'s: 8 layers, hidden 512,
vocabulary 32000, SDPA attention, float32; ``--large``: about 1B parameters, 16 layers, hidden
2048, intermediate 5632, 32 heads, 8 key/value heads, vocabulary 32000), a prompt of ``--prompt``
tokens (default 128; the issue's size: 512) and ``--generated`` generated ones (default 16; the
issue's: 64), random token ids (what is computed does not depend on which tokens they are).
Configurations, each giving the relevance of every earlier token for each generated token (the
matrix ``[generated, length]``):

- ``fxlrp``: ``fxlrp.explain_generation`` with ``AttnLRP(0.0)``: one forward over the whole
  sequence, one backward pass per generated token (transformers 5);
- ``gxi``: gradient x input at the word embeddings, one forward and backward per generated token
  on the prefix before it (plain autograd; the LM head for the last position only);
- ``lxt_fxlrp`` and ``lxt_gxi``: the same two in LXT's environment (transformers 4.54.1), so that
  LXT is compared on the same transformers code;
- ``lxt``: LXT 2.1's efficient mode (``monkey_patch(modeling_llama)``), gradient x input of the
  patched model on each prefix, step by step as LXT explains a generation (``.venv-lxt``).

Both environments load one saved ``state_dict``, its parameters made in ``--dtype`` (no float32
copy of a bfloat16 model: ``llama_cost.save_llama``, ``llama_cost._model``). Time: per process
``--warm-up`` calls of each configuration (default 2: fxlrp runs a part it cannot trace eagerly
at the first call of an input signature, records it at the second and replays the recorded graph
from the third on), then
``--repeats`` calls each, the order rotating; medians, and the ratio to the gradient x input of
the same environment. Memory: in a fresh process per configuration, after the warm-up calls, the
peak of one call: by default (``--peak allocator``) the peak of the bytes torch's allocator handed
out during it, from the profiler's memory events (``allocator.allocated_peak_of_call``); with
``--peak resident``, for the large sizes (the profiler keeps an event per allocation, and at a
billion parameters writing them out took more memory than the call), the process's resident peak
above its resident size before the call (``allocator.resident_peak_of_call``: the kernel's peak,
reset before the call; exact to tens of MB, no trace, no slowdown).
The check: fxlrp's matrix against LXT's (scaled by the logit, as LXT seeds with it), relative
error. For sizes where explaining every step one by one takes too long, ``--subset K`` has the
per-prefix methods explain ``K`` of the steps (evenly spread, the longest prefix among them) and
extrapolates their time to all steps; ``--single`` measures one call per configuration, time and
memory of the same call, each in its own process, and with ``--subset`` fxlrp too explains only
those steps: its forward (from the call's beginning to its first row's backward pass) counts once
and the rest of the call is extrapolated to all steps (each backward pass goes through the whole
sequence, so they cost alike; the peak is that of any number of rows, the forward's graph being
the same); with ``--whole-matrix`` fxlrp explains every step there (measured, not extrapolated).
``--without`` leaves configurations out of a ``--single`` run.

    python benchmarks/generation.py --threads 2 [--repeats 2]
    python benchmarks/generation.py --large --prompt 512 --generated 64 --single --whole-matrix --warm-up 0 \
        --subset 4 --dtype bfloat16 --peak resident --without lxt_fxlrp lxt_gxi
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.llama_cost import CONFIG, QUICK, LxtPatch, _cpu_name, _model, save_llama  # noqa: E402
from benchmarks.workers import LXT_PYTHON, add_worker_arguments, ran_as_worker, spawn, timed_rounds  # noqa: E402

LARGE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=1024)
MAIN = ("gxi", "fxlrp")
LXT = ("lxt_gxi", "lxt_fxlrp", "lxt")
FULL_MATRIX = ("fxlrp", "lxt_fxlrp")
"""The configurations that explain every step in each call (the others: the measured subset)."""
BASE = {"fxlrp": "gxi", "gxi": "gxi", "lxt_fxlrp": "lxt_gxi", "lxt": "lxt_gxi", "lxt_gxi": "lxt_gxi"}


# -- inside a worker process -----------------------------------------------------------------------


def subset_steps(generated: int, subset: int | None) -> list[int]:
    """The steps the per-prefix methods explain: all, or ``subset`` of them evenly spread, the
    last (the longest prefix, the highest peak) among them."""
    if subset is None or subset >= generated:
        return list(range(generated))
    return sorted({round(index * (generated - 1) / max(subset - 1, 1)) for index in range(subset)})


def _runner(name: str, model: Any, sequence: Any, start: int, patch: LxtPatch | None, steps: list[int],
            whole_matrix: bool = True, row_starts: list[float] | None = None) -> Any:
    """A call of configuration ``name``: the matrix ``[generated, length]`` (gradient x input and
    LXT seed each step with 1 and with the logit: relevance times the logit for LXT; they explain
    only ``steps``, their other rows 0). fxlrp explains every step where ``whole_matrix``, else
    only ``steps`` too; ``row_starts`` (a list) gets the time at which each of its rows' backward
    pass begins (its target, the generated token's logit, given as a function of the logits, which
    is called there)."""
    import torch

    length = sequence.shape[1]
    if name in ("fxlrp", "lxt_fxlrp"):
        import fxlrp
        from fxlrp.rules.composites import AttnLRP

        explain = fxlrp.convert(model, AttnLRP(0.0))
        rows = None if whole_matrix else steps

        def logit(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            if row_starts is not None:
                row_starts.append(time.perf_counter())
            return logits.gather(1, tokens[:, None])[:, 0]

        def matrix() -> torch.Tensor:
            found = fxlrp.explain_generation(explain, sequence, start, steps=rows, target=logit).relevance[0]
            if rows is None:
                return found
            return torch.zeros(length - start, length, dtype=found.dtype).index_copy_(0, torch.tensor(rows), found)

        return matrix

    embedding = model.get_input_embeddings()

    def per_prefix(seed_with_logit: bool) -> torch.Tensor:
        rows = []
        for position in range(start, length):
            if position - start not in steps:
                rows.append(torch.zeros(length, dtype=embedding.weight.dtype))
                continue
            embeddings = embedding(sequence[:, :position]).detach().requires_grad_()
            logit = model(inputs_embeds=embeddings, logits_to_keep=1).logits[0, -1, sequence[0, position]]
            logit.backward(logit.detach() if seed_with_logit else None)
            row = (embeddings * embeddings.grad).sum(-1)[0].detach()
            rows.append(torch.nn.functional.pad(row, (0, length - position)))
        return torch.stack(rows)

    if name == "lxt":
        def lxt() -> torch.Tensor:
            with patch:
                return per_prefix(seed_with_logit=True)

        return lxt
    return lambda: per_prefix(seed_with_logit=False)


def _setup(arguments: argparse.Namespace) -> tuple[Any, Any, int]:
    import torch

    torch.set_num_threads(arguments.threads)
    config = QUICK if arguments.quick else LARGE if arguments.large else CONFIG
    model = _model(config, arguments.state, dtype=arguments.dtype)
    length = arguments.prompt + arguments.generated
    sequence = torch.randint(3, config["vocab_size"], (1, length), generator=torch.Generator().manual_seed(1))
    return model, sequence, arguments.prompt


def worker_time(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    model, sequence, start = _setup(arguments)
    patch = LxtPatch() if "lxt" in arguments.names else None
    steps = subset_steps(arguments.generated, arguments.subset)
    runs = {name: _runner(name, model, sequence, start, patch, steps) for name in arguments.names}
    for _ in range(arguments.warm_up - 1):
        for run in runs.values():
            run()
    matrices = {name: run().float().tolist() for name, run in runs.items()}  # (the last warm-up call)
    times = timed_rounds(runs, arguments.repeats)
    with torch.no_grad():  # each step's logit, to scale fxlrp's rows to LXT's seeding
        logits = model(input_ids=sequence).logits[0, start - 1:-1].gather(1, sequence[0, start:, None])[:, 0]
    return {"times": times, "matrices": matrices, "logits": logits.float().tolist(), "steps": steps,
            "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}"}


def worker_memory(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    from benchmarks.allocator import allocated_peak_of_call, resident_peak_of_call

    model, sequence, start = _setup(arguments)
    patch = LxtPatch() if "lxt" in arguments.names else None
    steps = subset_steps(arguments.generated, arguments.subset)
    row_starts: list[float] = []
    whole_matrix = not arguments.single or arguments.whole_matrix
    run = _runner(arguments.names[0], model, sequence, start, patch, steps, whole_matrix=whole_matrix,
                  row_starts=row_starts)
    for _ in range(arguments.warm_up):
        run()
    row_starts.clear()
    begin = time.perf_counter()
    peak = (resident_peak_of_call if arguments.peak == "resident" else allocated_peak_of_call)(run)
    seconds = time.perf_counter() - begin
    # (fxlrp's forward: from the call's beginning to its first row's backward pass)
    forward = row_starts[0] - begin if row_starts else None
    # (the rows the call explained: fxlrp's backward passes, else the prefixes)
    rows = len(row_starts) if row_starts else len(steps)
    return {"peak_mb": peak, "seconds": seconds, "forward_seconds": forward, "rows": rows,
            "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}"}


# -- the driver ------------------------------------------------------------------------------------


def _spawn(python: str, mode: str, names: tuple[str, ...], arguments: argparse.Namespace, state: str) -> dict:
    options = ["--prompt", str(arguments.prompt), "--generated", str(arguments.generated), "--warm-up",
               str(arguments.warm_up), "--dtype", arguments.dtype, "--peak", arguments.peak]
    options += ["--large"] if arguments.large else []
    options += ["--subset", str(arguments.subset)] if arguments.subset else []
    options += ["--single"] * arguments.single + ["--whole-matrix"] * arguments.whole_matrix
    return spawn(__file__, python, mode, names, arguments, state, options)


def _relative_error(ours: Any, theirs: Any) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def drive(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    config = QUICK if arguments.quick else LARGE if arguments.large else CONFIG
    steps = subset_steps(arguments.generated, arguments.subset)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        state = os.path.join(directory, "llama.pt")
        parameters = save_llama(config, state, arguments.dtype)
        main = lxt = None
        if not arguments.single:
            main = _spawn(sys.executable, "time", MAIN, arguments, state)
            lxt = _spawn(LXT_PYTHON, "time", LXT, arguments, state) if not arguments.no_lxt else None
        names = tuple(name for name in MAIN + (() if arguments.no_lxt else LXT) if name not in arguments.without)
        memory = {name: _spawn(LXT_PYTHON if name.startswith("lxt") else sys.executable, "memory", (name,),
                               arguments, state) for name in names}
    if arguments.single:  # (one call each, timed where its memory was measured)
        times = {name: [found["seconds"]] for name, found in memory.items()}
    else:
        times = {**main["times"], **(lxt["times"] if lxt is not None else {})}
    # The per-prefix methods explained len(steps) of the steps: their time for all, extrapolated;
    # so did fxlrp under --single without --whole-matrix: its forward once, its backward passes
    # extrapolated (from the rows its worker says it explained).
    explained = {name: memory[name]["rows"] if arguments.single else
                 arguments.generated if name in FULL_MATRIX else len(steps) for name in times}
    scale = {name: arguments.generated / explained[name] for name in times}
    forward = {name: memory[name]["forward_seconds"] or 0.0 if arguments.single and name in FULL_MATRIX else 0.0
               for name in times}
    report = {
        "config": config, "parameters": parameters, "prompt": arguments.prompt, "generated": arguments.generated,
        "dtype": arguments.dtype, "warm_up": arguments.warm_up, "single": arguments.single,
        "steps_measured": steps, "rows_explained": explained, "threads": arguments.threads,
        "seconds": {name: forward[name] + (statistics.median(values) - forward[name]) * scale[name]
                    for name, values in times.items()},
        "forward_seconds": {name: value for name, value in forward.items() if value},
        "times": times, "peak": arguments.peak, "peak_mb": {name: found["peak_mb"] for name, found in memory.items()},
        "versions": {name: found["versions"] for name, found in (("main", main or memory["fxlrp"]),
                                                                 ("lxt", lxt or memory.get("lxt"))) if found},
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
    }
    if lxt is not None:
        rows = torch.tensor(steps)
        scale = torch.tensor(lxt["logits"])[rows, None]
        theirs = torch.tensor(lxt["matrices"]["lxt"])[rows]
        report["fxlrp_vs_lxt_relative_error"] = _relative_error(torch.tensor(main["matrices"]["fxlrp"])[rows] * scale,
                                                                theirs)
        report["same_environment_relative_error"] = _relative_error(
            torch.tensor(lxt["matrices"]["lxt_fxlrp"])[rows] * scale, theirs)
    return report


def table(report: dict[str, Any]) -> str:
    """Medians and allocated peaks, as multiples of the gradient x input of the same environment."""
    seconds, memory = report["seconds"], report["peak_mb"]
    labels = {"gxi": "gradient x input per prefix (transformers 5)",
              "fxlrp": "fxlrp explain_generation, AttnLRP(0.0) (transformers 5)",
              "lxt_gxi": "gradient x input per prefix (transformers 4.54.1)",
              "lxt_fxlrp": "fxlrp explain_generation, AttnLRP(0.0) (transformers 4.54.1)",
              "lxt": "LXT 2.1 efficient mode per prefix (transformers 4.54.1)"}
    peak = "allocated peak" if report["peak"] == "allocator" else "resident peak"
    lines = [f"| method | median (s) | x gradient x input | {peak} (MB) | x gradient x input |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, label in labels.items():
        if name in seconds:
            base = BASE[name]  # (left out of the run: no ratio)
            time_ratio, memory_ratio = ((f"{seconds[name] / seconds[base]:.2f}x", f"{memory[name] / memory[base]:.2f}x")
                                        if base in seconds else ("-", "-"))
            lines.append(f"| {label} | {seconds[name]:.2f} | {time_ratio} | {memory[name]:.1f} | {memory_ratio} |")
    for name, label in (("fxlrp", "transformers 5"), ("lxt_fxlrp", "transformers 4.54.1")):
        if name in seconds and "lxt" in seconds:
            lines.append(f"\nfxlrp ({label}) / LXT: time {seconds[name] / seconds['lxt']:.2f}x, {peak} "
                         f"{memory[name] / memory['lxt']:.2f}x")
    for name, rows in report["rows_explained"].items():
        if rows < report["generated"]:
            lines.append(f"\n({name}: {rows} of {report['generated']} steps explained, time extrapolated to all"
                         + ("; its forward once and its backward passes times "
                            f"{report['generated'] / rows:g})" if name in FULL_MATRIX else ")"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_worker_arguments(parser)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--generated", type=int, default=16, help="generated tokens explained (default 16)")
    parser.add_argument("--large", action="store_true", help="the ~1B-parameter configuration")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--warm-up", type=int, default=2,
                        help="calls before the measured ones (default 2: the second records fxlrp's eager parts)")
    parser.add_argument("--subset", type=int, help="the per-prefix methods explain this many of the steps (evenly "
                        "spread, the last among them); their time for all steps is extrapolated")
    parser.add_argument("--single", action="store_true", help="one measured call per method, in its own process: "
                        "time and memory of that call (for the large sizes)")
    parser.add_argument("--peak", choices=("allocator", "resident"), default="allocator",
                        help="the memory measured: the peak of torch's allocator, from the profiler's events "
                        "(default; small sizes), or the process's resident peak above its size before the call "
                        "(the large sizes, where the profiler's events take more memory than the call)")
    parser.add_argument("--table", help="print the table of a report written with --json, and stop")
    parser.add_argument("--no-lxt", action="store_true", help="leave out LXT's environment (.venv-lxt)")
    parser.add_argument("--whole-matrix", action="store_true",
                        help="with --single: fxlrp explains every step (measured, not extrapolated)")
    parser.add_argument("--without", nargs="+", default=[], choices=MAIN + LXT,
                        help="with --single: leave out these configurations")
    arguments = parser.parse_args()
    if ran_as_worker(arguments, worker_time, worker_memory):
        return
    if arguments.table:
        with open(arguments.table) as file:
            print(table(json.load(file)))
        return
    if arguments.without and not arguments.single:
        parser.error("--without leaves configurations out of --single runs only")
    report = drive(arguments)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump(report, file)
    shown = {key: value for key, value in report.items() if key not in ("times",)}
    print(json.dumps(shown, indent=1))
    print(table(report))


if __name__ == "__main__":
    main()
