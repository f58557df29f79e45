"""CPU proxies for what an explanation costs on a GPU, against gradient x input on the same model and input.

A GPU runs a small batch faster than the host issues its kernels, so there an explanation costs
what the host spends per call: the ATen operations it dispatches (each a kernel launch on a GPU)
and its Python. Two proxies, measured on the CPU:

- *operations*: the ATen operations one explanation dispatches (forward and backward, one call
  after two warm-up calls, counted with a ``TorchDispatchMode``), and among them those that
  synchronise a GPU with the host (``_local_scalar_dense``: ``.item()``, ``bool(tensor)``,
  ``float(tensor)``; ``equal``; ``is_nonzero``; operations whose output's size depends on values:
  ``nonzero``, ``masked_select``, ``unique``), beside ``Tensor.tolist`` / ``.numpy`` calls
  (counted with a ``TorchFunctionMode``, in a call of their own: on the CPU they dispatch
  nothing). Counted twice: on the
  CPU's path, and on the path the rules take on a GPU (:func:`as_on_a_gpu`: no work skipped by
  reading values, fxlrp/relevance/tracing.py; after a warm-up call on that path, which makes the
  parameter variants the CPU's path skipped, as a GPU's first call does);
- *tiny-input time*: wall time at batch 1 on the smallest sensible input, where the host's cost
  dominates as on a GPU: paired calls (gradient x input and the explanation one after the other,
  the order alternating), the ratio per pair, min and median over pairs; on the CPU's path and on
  a GPU's.

Beside them, the *FLOPs* of the products, convolutions and attention kernels (torch's formulas,
``torch.utils.flop_counter``), explanation / gradient: where the CPU's kernels, not its host,
set the time (the convolutions of the CNNs at 64 x 64), the tiny-input time cannot fall below
this ratio whatever the host does - z+ and gamma compute a second product per layer.

Explanations are ``fxlrp.attribute`` (the model check, the finiteness checks and the target
included); gradient x input is plain autograd with the same target (each sample's highest output;
the next token's for a causal LM) at the input (the embeddings for token models).

    python benchmarks/dispatch_proxies.py [--models resnet50,hf_vit] [--pairs 15] [--threads 1]
    python benchmarks/dispatch_proxies.py --where-synchronised resnet50:Epsilon   # a traceback each
    python benchmarks/dispatch_proxies.py --models hf_vit_base --compiled   # also fxlrp.compile
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.configurations import _fxlrp_composite, _WithOthersFixed, gradient_times_input  # noqa: E402
from benchmarks.workloads import build  # noqa: E402

SYNCHRONISING = frozenset({
    "aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::nonzero", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::nonzero_static",
})
"""ATen operations after which the host waits for a GPU: a value read on the host, or an output
whose size depends on values."""
HOST_READS = (torch.Tensor.tolist, torch.Tensor.numpy)
TOKENS = 16
"""Sequence length of the token models' input."""
IMAGE_MODELS = ("resnet50", "vgg16", "densenet121")
TRANSFORMERS_SMALL = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
"""As benchmarks/workloads.py's quick Hugging Face ViT."""


def _flop_formulas() -> dict[Any, Callable[..., int]]:
    """torch's FLOP formulas by operation (``torch.utils.flop_counter``: products, convolutions,
    attention kernels; elementwise work is not counted), also for the CPU's fused attention
    kernels (the formulas of the GPU's: two products forward, four backward). (``FlopCounterMode``
    itself tracks modules with hooks that ``torch.autograd.grad`` of an input refuses.)"""
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper

    def attention(query, key, value, *_: Any, out_shape: Any = None, **__: Any) -> int:
        return sdpa_flop_count(query, key, value)

    def attention_backward(gradient, query, key, value, *_: Any, out_shape: Any = None, **__: Any) -> int:
        return sdpa_backward_flop_count(gradient, query, key, value)

    aten = torch.ops.aten
    return {**flop_registry, aten._scaled_dot_product_flash_attention_for_cpu: shape_wrapper(attention),
            aten._scaled_dot_product_flash_attention_for_cpu_backward: shape_wrapper(attention_backward)}


class DispatchCounter(TorchDispatchMode):
    """How many times each ATen operation is dispatched and the FLOPs of those torch has a formula
    for (:func:`_flop_formulas`); ``where``: a traceback per synchronising one."""

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.where = where
        self.places: list[str] = []
        self.flops = 0
        self.formulas = _flop_formulas()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        name = "aten::" + name.split("::", 1)[-1].split(".", 1)[0]
        self.counts[name] += 1
        if self.where and name in SYNCHRONISING:
            self.places.append(f"{name}\n" + "".join(traceback.format_stack(limit=12)[:-1]))
        output = func(*args, **(kwargs or {}))
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **(kwargs or {}), out_val=output)
        return output


class HostReads(TorchFunctionMode):
    """``Tensor.tolist`` and ``Tensor.numpy`` calls (a device-to-host copy on a GPU)."""

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.count = 0
        self.where = where
        self.places: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.count += 1
            if self.where:
                self.places.append(f"{func.__name__}\n" + "".join(traceback.format_stack(limit=12)[:-1]))
        return func(*args, **(kwargs or {}))


@dataclass
class Counted:
    operations: int
    synchronising: int
    by_name: Counter[str]
    places: list[str]
    flops: int
    """Floating-point operations of the products, convolutions and attention kernels
    (:class:`DispatchCounter`; elementwise work is not counted)."""



@contextmanager
def as_on_a_gpu() -> Iterator[None]:
    """Rules that read values on the host to skip work do so on the CPU only
    (fxlrp/relevance/tracing.py): inside this block they take the path they take on a GPU."""
    from fxlrp.relevance import tracing

    kept = tracing.HOST_DEVICE_TYPES
    tracing.HOST_DEVICE_TYPES = frozenset()
    try:
        yield
    finally:
        tracing.HOST_DEVICE_TYPES = kept


def counted(run: Callable[[], Any], where: bool = False, gpu_path: bool = False) -> Counted:
    """The ATen operations of one call of ``run`` and its synchronisations (see the module's
    text); ``gpu_path``: with the rules on the path they take on a GPU (:func:`as_on_a_gpu`).

    Operations are counted in a call of their own, without :class:`HostReads`: a
    ``TorchFunctionMode`` turns off fast paths that check for one (``nn.MultiheadAttention``'s
    fused kernel in inference, which the explanation's forward takes: about 28 operations more
    per layer otherwise)."""
    with as_on_a_gpu() if gpu_path else nullcontext():
        with HostReads(where) as reads:
            run()
        with DispatchCounter(where) as dispatched:
            run()
    synchronising = sum(dispatched.counts[name] for name in SYNCHRONISING) + reads.count
    return Counted(sum(dispatched.counts.values()), synchronising, dispatched.counts,
                   dispatched.places + reads.places, dispatched.flops)


# -- the models and the two calls compared ---------------------------------------------------------


def _image_explainer(model: str, composite: str) -> tuple[Any, torch.nn.Module, torch.Tensor]:
    """benchmarks/workloads.py's quick workload, its explainer under ``composite`` and the explained input."""
    import fxlrp
    from fxlrp.rules.composites import AttnLRP

    workload = build(model, quick=True)
    chosen = AttnLRP(0.0) if composite == "AttnLRP(0.0)" else _fxlrp_composite(composite, workload)
    return workload, fxlrp.convert(_WithOthersFixed(workload), chosen), workload.inputs[workload.explained]


def _image_pair(model: str, composite: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """Gradient x input and ``fxlrp.attribute`` on benchmarks/workloads.py's quick workload."""
    import fxlrp

    workload, explain, explained = _image_explainer(model, composite)
    return gradient_times_input(workload), lambda: fxlrp.attribute(explain, explained)


@dataclass
class CompiledRow:
    model: str
    composite: str
    generated: int
    """Inductor's generated kernels (fused loops), counted at the compilation; each runs once a call."""
    called: int
    """ATen operations the compiled call dispatches at run time (matrix products, convolutions,
    attention kernels), the profiler's top-level ``aten::`` events of one call."""
    gradient: int
    """The eager gradient x input's dispatched operations."""
    first_call: float
    error: float
    """Largest difference from the eager relevance, relative to its largest value."""
    ratios: list[float]


def top_level_operations(run: Callable[[], Any]) -> int:
    """The ATen operations one call of ``run`` makes outside other ATen operations, by torch's profiler
    (a ``TorchDispatchMode`` would make TorchDynamo skip a compiled function)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        run()
    return sum(1 for event in profiled.events() if event.name.startswith("aten::")
               and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))


def measure_compiled(model: str, composite: str, pairs: int) -> CompiledRow:
    """``fxlrp.compile`` of a row built from benchmarks/workloads.py: its kernels per call (Inductor's
    generated ones and the ATen operations it calls), its first call, and its tiny-input time paired
    with the eager gradient x input."""
    from torch._inductor import metrics

    import fxlrp

    gradient, explain, explained, target = _compiled_parts(model, composite)
    compiled = fxlrp.compile(explain)
    metrics.reset()
    start = time.perf_counter()
    relevance = compiled(explained, target)
    first_call, generated = time.perf_counter() - start, metrics.generated_kernel_count
    eager = fxlrp.attribute(explain, explained, target=target)
    error = float((relevance - eager).abs().max() / eager.abs().max())
    for _ in range(2):
        gradient(), compiled(explained, target)
    with DispatchCounter() as dispatched:
        gradient()
    return CompiledRow(model, composite, generated, top_level_operations(lambda: compiled(explained, target)),
                       sum(dispatched.counts.values()), first_call, error,
                       paired_ratios(gradient, lambda: compiled(explained, target), pairs))


def compiled_table(rows: list[CompiledRow]) -> str:
    lines = ["| model, input | composite | kernels per compiled call: generated + ATen | / gradient's operations "
             "| tiny-input time / gradient: min, median | first call (s) | relevance vs eager |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        kernels = row.generated + row.called
        lines.append(
            f"| {DESCRIPTIONS[row.model]} | {row.composite} | {row.generated} + {row.called} = {kernels} "
            f"| {kernels} / {row.gradient} = {kernels / row.gradient:.2f}x "
            f"| {min(row.ratios):.2f}x, {statistics.median(row.ratios):.2f}x | {row.first_call:.0f} "
            f"| {row.error:.1e} |")
    return "\n".join(lines)


class _Logits(torch.nn.Module):
    """A sequence classifier's logits from ids or from embeddings."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def _bert_pair(composite: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """A small BERT classifier run eagerly: gradient x input at the word embeddings and
    ``fxlrp.attribute`` of the ids (relevance per token)."""
    import fxlrp

    gradient, explain, ids, target = _bert_parts(composite)
    return gradient, lambda: fxlrp.attribute(explain, ids, target=target)


def _bert_parts(composite: str) -> tuple[Callable[[], Any], Any, torch.Tensor, int]:
    """:func:`_bert_pair`'s gradient x input, explainer, ids and target."""
    import transformers

    import fxlrp
    from fxlrp.rules.composites import AttnLRP

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=1000, num_labels=2, attn_implementation="sdpa", **TRANSFORMERS_SMALL)).eval().requires_grad_(False)
    ids = torch.randint(3, 1000, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = int(model(input_ids=ids).logits[0].argmax())
    explain = fxlrp.convert(_Logits(model), AttnLRP(0.0) if composite == "AttnLRP(0.0)" else fxlrp.rules.Epsilon(1e-6))
    embedding = model.get_input_embeddings()

    def gradient() -> torch.Tensor:
        embeddings = embedding(ids).requires_grad_()
        model(inputs_embeds=embeddings).logits[0, target].backward()
        return (embeddings * embeddings.grad).sum(-1)

    return gradient, explain, ids, target


def _llama_pair() -> tuple[Callable[[], Any], Callable[[], Any]]:
    """benchmarks/llama_cost.py's small Llama-style LM (its ``QUICK`` configuration) and its two
    calls: gradient x input at the embeddings and ``fxlrp.attribute`` under AttnLRP(0.0)."""
    from benchmarks.llama_cost import _runner

    model, ids, target = _llama()
    return _runner("gxi", model, ids, target), _runner("attnlrp", model, ids, target)


def _llama() -> tuple[Any, torch.Tensor, int]:
    """:func:`_llama_pair`'s model, ids and target (the predicted next token)."""
    import transformers

    from benchmarks.llama_cost import QUICK

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**QUICK, attn_implementation="sdpa"))
    model.eval().requires_grad_(False)
    ids = torch.randint(3, QUICK["vocab_size"], (1, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = int(model(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax())
    return model, ids, target


def _compiled_parts(model: str, composite: str) -> tuple[Callable[[], Any], Any, torch.Tensor, int | None]:
    """A row's gradient x input, explainer, explained input and target, for ``fxlrp.compile``."""
    if model == "hf_bert":
        return _bert_parts(composite)
    if model == "llama":
        from benchmarks.llama_cost import _runner, next_token_explainer

        language_model, ids, target = _llama()
        return _runner("gxi", language_model, ids, target), next_token_explainer(language_model), ids, target
    workload, explain, explained = _image_explainer(model, composite)
    return gradient_times_input(workload), explain, explained, None


PROXIES: dict[tuple[str, str], Callable[[], tuple[Callable[[], Any], Callable[[], Any]]]] = {
    **{(model, composite): (lambda model=model, composite=composite: _image_pair(model, composite))
       for model in IMAGE_MODELS for composite in ("Epsilon", "EpsilonPlusFlat", "EpsilonGammaBox")},
    **{(model, composite): (lambda model=model, composite=composite: _image_pair(model, composite))
       for model in ("vit_b_16", "hf_vit_base") for composite in ("Epsilon", "AttnLRP(0.0)")},
    **{("hf_bert", composite): (lambda composite=composite: _bert_pair(composite))
       for composite in ("Epsilon", "AttnLRP(0.0)")},
    ("llama", "AttnLRP(0.0)"): _llama_pair,
    ("gcn", "Epsilon"): lambda: _image_pair("gcn", "Epsilon"),
}
DESCRIPTIONS = {
    "resnet50": "resnet50, 1x3x64x64", "vgg16": "vgg16, 1x3x64x64", "densenet121": "densenet121, 1x3x64x64",
    "vit_b_16": "vit_b_16, 1x3x32x32", "hf_vit_base": "Hugging Face ViT (2 layers, width 128), 1x3x32x32, eager",
    "hf_bert": f"Hugging Face BERT (2 layers, width 128), {TOKENS} tokens, eager",
    "llama": f"Llama-style LM (llama_cost.py's quick config), {TOKENS} tokens",
    "gcn": "GCN (2k nodes, 20k edges)",
}


@dataclass
class Row:
    model: str
    composite: str
    gradient: Counted
    explanation: Counted
    on_a_gpu: Counted
    """The explanation's count on the path its rules take on a GPU."""
    ratios: list[float]
    on_a_gpu_ratios: list[float]
    """The tiny-input time ratios with the rules on the path they take on a GPU."""


def paired_ratios(gradient: Callable[[], Any], explanation: Callable[[], Any], pairs: int) -> list[float]:
    """Explanation time / gradient time per pair of consecutive calls, the order alternating."""
    ratios = []
    for pair in range(pairs):
        seconds = {}
        for name in (("gradient", "explanation") if pair % 2 == 0 else ("explanation", "gradient")):
            run = gradient if name == "gradient" else explanation
            start = time.perf_counter()
            run()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds["explanation"] / seconds["gradient"])
    return ratios


def measure(model: str, composite: str, pairs: int) -> Row:
    gradient, explanation = PROXIES[model, composite]()
    for _ in range(2):  # the eager path records its graph at the second call and replays it from then on
        gradient(), explanation()
    on_the_cpu = counted(explanation)
    with as_on_a_gpu():  # parameter variants the CPU's path skipped are made at a first call on a GPU's
        explanation()
    on_a_gpu = counted(explanation, gpu_path=True)
    ratios = paired_ratios(gradient, explanation, pairs)
    with as_on_a_gpu():
        on_a_gpu_ratios = paired_ratios(gradient, explanation, pairs)
    return Row(model, composite, counted(gradient), on_the_cpu, on_a_gpu, ratios, on_a_gpu_ratios)


def table(rows: list[Row]) -> str:
    lines = ["| model, input | composite | ATen ops: explanation / gradient | on a GPU's path "
             "| host reads: CPU, on a GPU's path | FLOPs / gradient "
             "| tiny-input time / gradient: min, median | on a GPU's path: min, median |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        operations = row.explanation.operations / row.gradient.operations
        lines.append(
            f"| {DESCRIPTIONS[row.model]} | {row.composite} | {row.explanation.operations} / "
            f"{row.gradient.operations} = {operations:.2f}x | {row.on_a_gpu.operations / row.gradient.operations:.2f}x "
            f"| {row.explanation.synchronising}, {row.on_a_gpu.synchronising} "
            f"| {row.explanation.flops / row.gradient.flops:.2f}x "
            f"| {min(row.ratios):.2f}x, {statistics.median(row.ratios):.2f}x "
            f"| {min(row.on_a_gpu_ratios):.2f}x, {statistics.median(row.on_a_gpu_ratios):.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated, from: " + ", ".join(dict.fromkeys(m for m, _ in PROXIES)))
    parser.add_argument("--pairs", type=int, default=15, help="timed pairs per row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a busy machine)")
    parser.add_argument("--where-synchronised", metavar="MODEL:COMPOSITE",
                        help="print where each synchronising operation of that explanation comes from")
    parser.add_argument("--gpu-path", action="store_true",
                        help="with --where-synchronised: the rules on the path they take on a GPU")
    parser.add_argument("--compiled", action="store_true",
                        help="also fxlrp.compile of each row: kernels per call, first call, tiny-input time")
    parser.add_argument("--top", type=int, default=0,
                        help="also print the N operations each explanation dispatches most beyond the gradient's")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)

    if arguments.where_synchronised:
        model, composite = arguments.where_synchronised.split(":", 1)
        _, explanation = PROXIES[model, composite]()
        explanation(), explanation()
        for place in counted(explanation, where=True, gpu_path=arguments.gpu_path).places:
            print(place)
        return

    chosen = set(arguments.models.split(",")) if arguments.models else None
    rows = []
    for model, composite in PROXIES:
        if chosen is None or model in chosen:
            row = measure(model, composite, arguments.pairs)
            rows.append(row)
            print(f"{model} {composite}: {row.explanation.operations} / {row.gradient.operations} ops, "
                  f"{row.explanation.synchronising} host reads ({row.on_a_gpu.synchronising} on a GPU's path)",
                  flush=True)
            if arguments.top:
                for path, explanation in (("the CPU's path", row.explanation), ("a GPU's path", row.on_a_gpu)):
                    surplus = explanation.by_name.copy()
                    surplus.subtract(row.gradient.by_name)
                    print(f"    beyond the gradient, on {path}:",
                          ", ".join(f"{name[6:]} {count:+d}" for name, count in surplus.most_common(arguments.top)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {arguments.pairs} pairs per row")
    print(table(rows))
    if arguments.compiled:
        compiled = [measure_compiled(row.model, row.composite, arguments.pairs) for row in rows]
        print(compiled_table(compiled))


if __name__ == "__main__":
    main()
