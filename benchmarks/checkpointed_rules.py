"""Peak memory of explanations under stabilised rules, without and with gradient checkpointing.

The model of ``benchmarks/long_context.py`` (``llama_cost.LONG_CONTEXT``, 2 layers, bfloat16, one
sequence of ``--length`` tokens, ``--attention``), explained at the last position's predicted
token by ``fxlrp.attribute`` with each of ``AttnLRP()`` (its default epsilon: rules with a
stabiliser, which keep each layer's output), ``AttnLRP(0.0)`` (no stabiliser) and gradient x input,
first without checkpointing, then with ``model.gradient_checkpointing_enable()``. Memory: the peak of
the bytes torch's allocator handed out during one call above what it held before it, after two
warm-up calls (``allocator.allocated_growth_of_call``); each ratio is to the gradient x input of
the same checkpointing. One process, one thread (memory does not depend on the load).

    python benchmarks/checkpointed_rules.py --length 1024 --attention sdpa
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.allocator import allocated_growth_of_call  # noqa: E402
from benchmarks.llama_cost import (  # noqa: E402
    LONG_CONTEXT,
    LONG_CONTEXT_QUICK,
    _model,
    _runner,
    next_token_explainer,
    save_llama,
)

RULES = ("AttnLRP()", "AttnLRP(0.0)")


def measure(arguments: argparse.Namespace, state: str) -> dict[str, float]:
    """MB per configuration (``"gxi"`` and each of :data:`RULES`, ``" checkpointed"`` appended
    with checkpointing)."""
    import torch

    import fxlrp
    from fxlrp.rules.composites import AttnLRP

    torch.set_num_threads(arguments.threads)
    config = dict(LONG_CONTEXT_QUICK if arguments.quick else LONG_CONTEXT, num_hidden_layers=arguments.layers)
    memory = {}
    for checkpointing in (False, True):
        model = _model(config, state, arguments.attention, "bfloat16")
        if checkpointing:
            model.gradient_checkpointing_enable()
        ids = torch.randint(3, config["vocab_size"], (1, arguments.length), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            target = int(model(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax())
        runs = {"gxi": _runner("gxi", model, ids, target, None, checkpointing)}
        for name in RULES:
            explain = next_token_explainer(model, AttnLRP() if name == "AttnLRP()" else AttnLRP(0.0))
            runs[name] = lambda explain=explain: fxlrp.attribute(explain, ids, target=target)[0]
        suffix = " checkpointed" if checkpointing else ""
        for name, run in runs.items():
            run()
            run()
            memory[name + suffix] = allocated_growth_of_call(run)
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny model, to check the script")
    arguments = parser.parse_args()
    config = dict(LONG_CONTEXT_QUICK if arguments.quick else LONG_CONTEXT, num_hidden_layers=arguments.layers)
    with tempfile.TemporaryDirectory() as directory:
        state = os.path.join(directory, "llama.pt")
        save_llama(config, state, "bfloat16")
        memory = measure(arguments, state)
    print(f"| configuration | {arguments.attention}, {arguments.length} tokens (MB) | x gradient x input |")
    print("| --- | ---: | ---: |")
    for name, value in memory.items():
        base = memory["gxi checkpointed" if name.endswith("checkpointed") else "gxi"]
        print(f"| {name} | {value:.0f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main()
