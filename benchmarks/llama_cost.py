"""What AttnLRP costs on a Llama-style model, against gradient x input and LXT 2.1's efficient mode.

A ``LlamaForCausalLM`` with random weights (8 layers, hidden 512, intermediate 1376, 8 heads,
vocabulary 32000, SDPA attention, float32), one sequence of 512 tokens, explained at the last
position's predicted token (``logits_to_keep=1``: the LM head runs for that position only, on
every side). Configurations:

- ``gxi``: gradient x input at the word embeddings, plain autograd (transformers 5);
- ``attnlrp``: ``fxlrp.attribute(fxlrp.convert(model, AttnLRP(0.0)), ids)`` (transformers 5);
- ``lxt_gxi``: gradient x input of the unpatched model in LXT's environment (transformers 4.54.1);
- ``lxt_attnlrp``: fxlrp as ``attnlrp``, in LXT's environment: the same transformers code as LXT
  runs, so that the two are compared on equal terms;
- ``lxt``: LXT 2.1's efficient mode, ``monkey_patch(modeling_llama)``, gradient x input of the
  patched model (transformers 4.54.1, the version LXT needs: it runs in ``.venv-lxt``). LXT
  patches classes and module globals; its patch is in force only around its own calls
  (:class:`LxtPatch`), so the three configurations of LXT's environment share one process and
  one model.

Both environments load one saved ``state_dict``, so the weights are the same. Time: each
timing process makes two warm-up calls per configuration (fxlrp records its eager part's graph at
the second) and then ``--repeats`` rounds of one
call each, the order rotating (``gxi`` and ``attnlrp`` in one process; ``lxt_gxi``,
``lxt_attnlrp`` and ``lxt`` in another); ``--rounds`` rounds alternate the processes of the two
environments; medians of all calls, and paired ratios: the median over repeats of the ratio of
two configurations' calls of the same repeat, which ran one after the other, with a 95% interval
of that median (order statistics: no assumption on how the ratios spread).

Calls of different methods in one process share glibc's heap, which hands freed memory back to
the system and faults it in again when the next call needs it: which method pays for that
depends on which ran before it (on this benchmark's machine, 0 to 8,000 page faults per forward,
moving between methods as the order changed). Two options take that out:

- ``--isolated``: each configuration times in a process of its own (its steady state, as a user
  explaining many inputs runs it); paired ratios are then the median over rounds of the ratio of
  two configurations' median calls in the same round;
- ``--keep-heap``: every process runs with glibc's trimming off and its mmap threshold fixed at
  32 MB (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``), so no call faults memory in.
Memory: in a fresh process per configuration, after a warm-up call, the peak of the bytes
torch's allocator handed out during one call (profiler statistics, as benchmarks/measure.py).

    python benchmarks/llama_cost.py --threads 2 --rounds 3 --repeats 2 [--isolated] [--keep-heap]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.workers import LXT_PYTHON, add_worker_arguments, ran_as_worker, spawn, timed_rounds  # noqa: E402

CONFIG = dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)
QUICK = dict(CONFIG, num_hidden_layers=2, hidden_size=128, intermediate_size=344, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=1000)
LONG_CONTEXT = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192, attention_dropout=0.0)
"""The layers of a Llama-style model of about 0.5B parameters (38 such layers: 0.49B), for
benchmarks/long_context.py (which sets the number of layers)."""
LONG_CONTEXT_QUICK = dict(QUICK, num_key_value_heads=2, max_position_embeddings=8192)
MAIN = ("gxi", "attnlrp")
LXT_UNPATCHED = ("lxt_gxi", "lxt_attnlrp")
LXT = (*LXT_UNPATCHED, "lxt")
FXLRP = ("attnlrp", "lxt_attnlrp")
PAIRS = (("attnlrp", "gxi"), ("lxt_attnlrp", "lxt_gxi"), ("lxt", "lxt_gxi"), ("lxt_attnlrp", "lxt"))
"""Ratios taken call by call: the two configurations' calls of one repeat ran one after the other."""
KEPT_HEAP = {"MALLOC_TRIM_THRESHOLD_": str(2**40), "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
"""glibc keeps freed memory for the process (``--keep-heap``)."""


# -- inside a worker process -----------------------------------------------------------------------


@contextlib.contextmanager
def _made_in(dtype: str) -> Iterator[None]:
    """Parameters made inside are made in ``dtype`` (torch's default dtype, restored after): a
    model of a billion parameters in bfloat16 is built without its float32 copy (3.4 GB)."""
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(default)


def save_llama(config: dict[str, Any], state: str, dtype: str = "float32") -> int:
    """Random weights of the Llama of ``config`` (seed 0), made in ``dtype`` and saved at
    ``state`` for the worker processes (:func:`_model`); the number of parameters."""
    import torch
    import transformers

    torch.manual_seed(0)
    with _made_in(dtype):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    torch.save(model.state_dict(), state)
    return sum(parameter.numel() for parameter in model.parameters())


def _model(config: dict[str, Any], state: str, attention: str = "sdpa", dtype: str = "float32") -> Any:
    """The Llama of ``config`` with the weights saved at ``state``, made in ``dtype``, in
    evaluation mode, its parameters requiring no gradient. The weights are copied into the
    model's own memory from the memory-mapped file (not a second copy in memory; resident before
    any call, not paged in from the file during one)."""
    import torch
    import transformers

    with _made_in(dtype):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, attn_implementation=attention))
    model.load_state_dict(torch.load(state, weights_only=True, mmap=True))
    return model.eval().requires_grad_(False)


class LxtPatch:
    """LXT's efficient-mode patch of ``modeling_llama`` (``monkey_patch``: class methods and module
    globals), in force only inside ``with patch:``. LXT patches classes, not instances, so LXT,
    fxlrp and gradient x input can run interleaved in one process on one model: the calls of all
    three meet the same machine load, and their ratios are taken call by call."""

    def __init__(self) -> None:
        from lxt.efficient import monkey_patch
        from lxt.efficient.models import get_default_map
        from transformers.models.llama import modeling_llama

        targets = list(get_default_map(modeling_llama))
        before = [dict(vars(target)) for target in targets]
        monkey_patch(modeling_llama)
        missing = object()
        self.changes = [
            (target, {name: (before_target.get(name, missing), value) for name, value in vars(target).items()
                      if before_target.get(name, missing) is not value})
            for target, before_target in zip(targets, before, strict=True)
        ]
        self.missing = missing
        self._set(original=True)

    def _set(self, original: bool) -> None:
        for target, changed in self.changes:
            for name, (old, new) in changed.items():
                value = old if original else new
                if value is self.missing:
                    delattr(target, name)
                else:
                    setattr(target, name, value)

    def __enter__(self) -> None:
        self._set(original=False)

    def __exit__(self, *exc: Any) -> None:
        self._set(original=True)


def next_token_explainer(model: Any, composite: Any = None) -> Any:
    """``fxlrp.convert`` with ``composite`` (``AttnLRP(0.0)`` where None) of the model's logits at
    the last position (the LM head run for that position only)."""
    import torch

    import fxlrp
    from fxlrp.rules.composites import AttnLRP

    class NextToken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, logits_to_keep=1).logits[:, -1]

    return fxlrp.convert(NextToken(), AttnLRP(0.0) if composite is None else composite)


def _runner(name: str, model: Any, ids: Any, target: int, patch: LxtPatch | None = None,
            checkpointing: bool = False) -> Any:
    """A call of configuration ``name``: the relevance per token (``lxt``: gradient x input with
    LXT's patch in force). With ``checkpointing`` gradient x input runs the model in training
    mode, where transformers checkpoints the layers of a model with
    ``gradient_checkpointing_enable()`` (Llama has no dropout: the values are evaluation mode's)."""
    import torch

    if name in FXLRP:
        import fxlrp

        explain = next_token_explainer(model)
        return lambda: fxlrp.attribute(explain, ids, target=target)[0]

    embedding = model.get_input_embeddings()

    def gradient_times_input() -> torch.Tensor:
        model.train(checkpointing)
        try:
            embeddings = embedding(ids).requires_grad_()
            logit = model(inputs_embeds=embeddings, logits_to_keep=1).logits[0, -1, target]
            # seeded with 1 (LXT's README seeds with the logit: the same cost, relevance times the
            # logit); fxlrp's output relevance is the logit, so the two relevances are equal
            logit.backward()
        finally:
            model.eval()
        return (embeddings * embeddings.grad).sum(-1).detach()[0]

    if name == "lxt":
        def lxt() -> torch.Tensor:
            with patch:
                return gradient_times_input()

        return lxt
    return gradient_times_input


def _setup(arguments: argparse.Namespace) -> tuple[Any, Any, int]:
    import torch

    torch.set_num_threads(arguments.threads)
    config = QUICK if arguments.quick else CONFIG
    model = _model(config, arguments.state)
    ids = torch.randint(3, config["vocab_size"], (1, arguments.length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = int(model(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax())
    return model, ids, target


def worker_time(arguments: argparse.Namespace) -> dict[str, Any]:
    import torch

    model, ids, target = _setup(arguments)
    patch = LxtPatch() if "lxt" in arguments.names else None
    runs = {name: _runner(name, model, ids, target, patch) for name in arguments.names}
    # Two warm-up calls: fxlrp records the part it runs eagerly at the second call of an input
    # signature and replays the graph from then on (fxlrp/eager/replay.py); the second's relevance, the
    # replay's, is kept for the check.
    for run in runs.values():
        run()
    relevance = {name: run().tolist() for name, run in runs.items()}
    return {"times": timed_rounds(runs, arguments.repeats), "relevance": relevance, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__}


def worker_memory(arguments: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.allocator import allocated_peak_of_call

    model, ids, target = _setup(arguments)
    patch = LxtPatch() if "lxt" in arguments.names else None
    run = _runner(arguments.names[0], model, ids, target, patch)
    run()
    run()  # (the second call of a signature records fxlrp's graph)
    return {"allocated_mb": allocated_peak_of_call(run)}


# -- the driver ------------------------------------------------------------------------------------


def _spawn(python: str, mode: str, names: tuple[str, ...], arguments: argparse.Namespace, state: str) -> dict:
    return spawn(__file__, python, mode, names, arguments, state, ["--length", str(arguments.length)],
                 KEPT_HEAP if arguments.keep_heap else None)


def _ratios(times: dict[str, list[float]], name: str, base: str) -> list[float]:
    """The ratios of ``name``'s times to ``base``'s, taken position by position (calls of one
    repeat, or one round's medians)."""
    return [a / b for a, b in zip(times[name], times[base], strict=True)]


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics ``k`` and ``n + 1 - k``
    with ``k`` the largest rank where ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2`` (the
    whole range where ``n`` is too small for the confidence)."""
    ordered, n = sorted(values), len(values)
    tail, k = 0.0, 0
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(B = k), B ~ Binomial(n, 1/2)
        if tail > (1 - confidence) / 2:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def _relative_error(ours: list, theirs: list) -> float:
    import torch

    ours_tensor, theirs_tensor = torch.tensor(ours), torch.tensor(theirs)
    return float((ours_tensor - theirs_tensor).abs().max() / theirs_tensor.abs().max())


def drive(arguments: argparse.Namespace) -> dict[str, Any]:
    config = QUICK if arguments.quick else CONFIG
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        state = os.path.join(directory, "llama.pt")
        save_llama(config, state)
        times: dict[str, list[float]] = {name: [] for name in MAIN + LXT}
        round_medians: dict[str, list[float]] = {name: [] for name in MAIN + LXT}
        relevance: dict[str, list] = {}
        versions: dict[str, str] = {}
        for _ in range(arguments.rounds):
            for python, names in ((sys.executable, MAIN), (LXT_PYTHON, LXT)):
                for group in ([(name,) for name in names] if arguments.isolated else [names]):
                    result = _spawn(python, "time", group, arguments, state)
                    for name in group:
                        times[name] += result["times"][name]
                        round_medians[name].append(statistics.median(result["times"][name]))
                    relevance.update(result["relevance"])
                    versions[names[0]] = f"torch {result['torch']}, transformers {result['transformers']}"
        memory = {name: _spawn(LXT_PYTHON if name.startswith("lxt") else sys.executable, "memory", (name,),
                               arguments, state)["allocated_mb"] for name in MAIN + LXT}
    return {
        "config": config, "length": arguments.length, "threads": arguments.threads,
        "seconds": {name: statistics.median(values) for name, values in times.items()},
        "paired": {f"{name} / {base}": statistics.median(_ratios(round_medians if arguments.isolated else times,
                                                                name, base)) for name, base in PAIRS},
        "paired_interval": {f"{name} / {base}": median_interval(_ratios(round_medians if arguments.isolated
                                                                        else times, name, base))
                            for name, base in PAIRS},
        "isolated": arguments.isolated, "keep_heap": arguments.keep_heap,
        "times": times, "allocated_mb": memory, "versions": versions,
        "attnlrp_vs_lxt_relative_error": _relative_error(relevance["attnlrp"], relevance["lxt"]),
        "same_environment_relative_error": _relative_error(relevance["lxt_attnlrp"], relevance["lxt"]),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(report: dict[str, Any]) -> str:
    """Medians, and the fastest call (the least disturbed by other load), as multiples of the
    gradient x input of the same environment."""
    seconds, memory = report["seconds"], report["allocated_mb"]
    fastest = {name: min(values) for name, values in report["times"].items()}
    rows = [("gradient x input (transformers 5)", "gxi", "gxi"),
            ("fxlrp AttnLRP(0.0) (transformers 5)", "attnlrp", "gxi"),
            ("gradient x input (transformers 4.54.1)", "lxt_gxi", "lxt_gxi"),
            ("fxlrp AttnLRP(0.0) (transformers 4.54.1)", "lxt_attnlrp", "lxt_gxi"),
            ("LXT 2.1 efficient mode (AttnLRP)", "lxt", "lxt_gxi")]
    lines = ["| method | median (s) | x gradient x input | fastest (s) | x gradient x input | allocated peak (MB) "
             "| x gradient x input |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, name, base in rows:
        lines.append(f"| {label} | {seconds[name]:.2f} | {seconds[name] / seconds[base]:.2f}x | "
                     f"{fastest[name]:.2f} | {fastest[name] / fastest[base]:.2f}x | "
                     f"{memory[name]:.1f} | {memory[name] / memory[base]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_worker_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--isolated", action="store_true", help="time each configuration in a process of its own")
    parser.add_argument("--keep-heap", action="store_true", help="glibc keeps freed memory (no trimming)")
    parser.add_argument("--table", help="print the table of a report written with --json, and stop")
    arguments = parser.parse_args()
    if arguments.table:
        with open(arguments.table) as file:
            print(table(json.load(file)))
        return
    if ran_as_worker(arguments, worker_time, worker_memory):
        return
    report = drive(arguments)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump(report, file, indent=1)
    print(table(report))
    pairing = "of the rounds' medians" if report.get("isolated") else "over repeats of adjacent calls"
    print(f"Paired ratios (median ratio {pairing}; heap kept: {report.get('keep_heap', False)}): " + ", ".join(
        f"{pair} {ratio:.3f}" for pair, ratio in report["paired"].items()))
    if "paired_interval" in report:
        print("95% intervals of those medians: " + ", ".join(
            f"{pair} {low:.3f}-{high:.3f}" for pair, (low, high) in report["paired_interval"].items()))
    print(f"AttnLRP vs LXT relative error: {report['attnlrp_vs_lxt_relative_error']:.1e} "
          f"(same environment: {report.get('same_environment_relative_error', float('nan')):.1e}); "
          f"{report['cpu']}, {report['threads']} threads; load {report['load_average']}")


if __name__ == "__main__":
    main()
