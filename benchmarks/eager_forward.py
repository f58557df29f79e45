"""Where the forward of an explanation run eagerly spends its time, against LXT's on the same model.

The Llama of benchmarks/llama_cost.py (its configuration and random weights), one sequence of
``--length`` tokens, the forward pass alone (no backward), each under autograd as an explanation
runs it:

- ``plain``: the model on its word embeddings (what gradient x input runs);
- ``mode``: the same under a ``TorchFunctionMode`` that only passes every call on: what
  intercepting each torch call from Python costs by itself;
- ``fxlrp``: the explainer's forward in the gradient form (what ``fxlrp.attribute`` runs for
  ``AttnLRP(0.0)``): interception, fxlrp's choice of handling per call, and the rules' work;
- ``lxt``: LXT 2.1's efficient mode (its patch in force around its own calls only; run with
  ``.venv-lxt/bin/python``, else left out).

The methods run interleaved in one process, in rotating order; the paired ratio is the median
over repeats of the ratio of two calls of the same repeat.

    .venv-lxt/bin/python benchmarks/eager_forward.py --length 512 --repeats 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.llama_cost import CONFIG, LxtPatch, next_token_explainer  # noqa: E402
from fxlrp.relevance.form import gradient_form  # noqa: E402
from fxlrp.relevance.sources import sources_collected  # noqa: E402


class PassOn(TorchFunctionMode):
    def __torch_function__(self, function, types, args=(), kwargs=None):
        return function(*args, **(kwargs or {}))


def forwards(length: int) -> dict[str, Any]:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa"))
    model = model.eval().requires_grad_(False)
    ids = torch.randint(3, CONFIG["vocab_size"], (1, length), generator=torch.Generator().manual_seed(1))
    embedding = model.get_input_embeddings()
    explain = next_token_explainer(model)
    assert explain.gradient_form

    def plain() -> torch.Tensor:
        with torch.enable_grad():
            return model(inputs_embeds=embedding(ids).requires_grad_(), logits_to_keep=1).logits

    def mode() -> torch.Tensor:
        with PassOn():
            return plain()

    def explained() -> torch.Tensor:
        with torch.enable_grad(), sources_collected(), gradient_form(True):
            return explain(ids)

    runs = {"plain": plain, "mode": mode, "fxlrp": explained}
    try:
        patch = LxtPatch()
    except ImportError:
        return runs

    def lxt() -> torch.Tensor:
        with patch:
            return plain()

    return {**runs, "lxt": lxt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    runs = forwards(arguments.length)
    for run in runs.values():
        run()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(arguments.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start = time.perf_counter()
            output = runs[name]()
            times[name].append(time.perf_counter() - start)
            del output
    base = "lxt" if "lxt" in runs else "plain"
    print(f"forward alone, {arguments.length} tokens, {arguments.threads} threads, {arguments.repeats} calls each")
    for name in names:
        paired = statistics.median(a / b for a, b in zip(times[name], times[base], strict=True))
        print(f"{name:6s} median {statistics.median(times[name]) * 1000:7.2f} ms   paired / {base} {paired:.3f}")


if __name__ == "__main__":
    main()
