"""``fxlrp.compile``: the explanation compiled into one graph per input shape, relevance equal to
eager, no recompilation for a new input of the same shape; ``fxlrp explain --compile``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torchvision
from torch._dynamo.utils import counters

import fxlrp
from fxlrp.app import cli
from fxlrp.rules import Epsilon
from fxlrp.rules.composites import AttnLRP, EpsilonGammaBox, EpsilonPlusFlat
from fxlrp.toys.digits import DigitsCNN

# Each test compiles with Inductor (tens of seconds on a CPU): `make test-all` runs them.
pytestmark = pytest.mark.slow


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm())


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process (a recompilation makes one more)."""
    return counters["stats"]["unique_graphs"]


def check_compiled_equals_eager(model: torch.nn.Module, shape: tuple[int, ...], target=None) -> None:
    """Inductor's kernels sum in other orders than eager's and fuse the relevance computation's
    divisions, softmax and LayerNorm: in float32 the two differ by rounding that the epsilon rule
    amplifies near small denominators, by an amount no bound holds for on every CPU. So both run
    in float64 (Inductor compiles float64 kernels as well): the same amplification of a rounding
    of 1e-16 stays far below the bound of 1e-9 relative, which a wrong rule or a lost term breaks
    by orders of magnitude."""
    explain = fxlrp.convert(model.double())
    compiled = fxlrp.compile(explain)
    graphs = compiled_graphs()
    first = torch.randn(shape, dtype=torch.float64)
    relevance = compiled(first, target)
    assert compiled.graphs == 1 and compiled_graphs() == graphs + 1  # forward and backward: one graph
    assert relevance.shape == first.shape and relevance.dtype == torch.float64
    assert relevance.abs().sum() > 0
    assert relative_error(relevance, fxlrp.attribute(explain, first, target=target)) <= 1e-9
    second = torch.randn(shape, dtype=torch.float64)
    with torch._dynamo.config.patch(error_on_recompile=True):
        relevance = compiled(second, target)
    assert compiled.graphs == 1 and compiled_graphs() == graphs + 1  # no recompilation
    assert relative_error(relevance, fxlrp.attribute(explain, second, target=target)) <= 1e-9


def test_resnet18_compiles_once_and_explains_as_eager() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    check_compiled_equals_eager(model, (1, 3, 64, 64))


def test_vision_transformer_compiles_once_and_explains_as_eager() -> None:
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10).eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at 0: no relevance
    check_compiled_equals_eager(model, (2, 3, 32, 32), target=torch.tensor([3, 7]))


def test_reduce_overhead_mode_runs_on_the_cpu_and_explains_as_eager() -> None:
    """``mode="reduce-overhead"`` (CUDA graphs on a GPU) is given to Inductor as that mode's options
    beside the exact layout's (``torch.compile`` takes a mode or options, not both); on the CPU it
    compiles as the default mode: the eager relevance (float64), once per shape."""
    torch.manual_seed(0)
    explain = fxlrp.convert(DigitsCNN().eval().double(), EpsilonPlusFlat())
    compiled = fxlrp.compile(explain, mode="reduce-overhead")
    for seed in range(2):
        images = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        assert relative_error(compiled(images, 2), fxlrp.attribute(explain, images, target=2)) <= 1e-10
    assert compiled.graphs == 1


@pytest.mark.parametrize("composite", [EpsilonPlusFlat(), EpsilonGammaBox(-3.0, 3.0), Epsilon(0.0)], ids=repr)
def test_rules_that_skip_work_by_value_do_all_of_it_when_traced(composite: object) -> None:
    """z+ skips its x- terms behind a ReLU, gamma an output sign that does not occur, LRP-0's
    division the search for zero denominators when the quotient's sum is finite: decisions from
    values, which a trace may not take. Traced, the general case is recorded; the relevance is the
    same, for inputs whose signs differ from the traced one's (the first layer sees negative pixels)."""
    torch.manual_seed(0)
    explain = fxlrp.convert(DigitsCNN().eval().double(), composite)
    compiled = fxlrp.compile(explain, backend="aot_eager")
    for images in (torch.rand(3, 1, 8, 8, dtype=torch.float64), torch.randn(3, 1, 8, 8, dtype=torch.float64)):
        reference = fxlrp.attribute(explain, images, target=2)
        assert torch.allclose(compiled(images, 2), reference, rtol=1e-12, atol=1e-15)
    assert compiled.graphs == 1


def test_targets_and_outputs() -> None:
    torch.manual_seed(0)
    model = DigitsCNN().eval().double()
    explain = fxlrp.convert(model)
    compiled = fxlrp.compile(explain, backend="aot_eager")
    images = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    for target in (None, torch.tensor([1, 2, 3, 9]), torch.tensor([0, 0, 0, 9])):
        relevance, output = compiled(images, target, return_output=True)
        assert torch.equal(output, model(images))
        assert torch.allclose(relevance, fxlrp.attribute(explain, images, target=target), rtol=1e-12, atol=1e-15)
    relevance = torch.zeros(4, 10, dtype=torch.float64)
    relevance[:, 4] = 1.0  # the output relevance itself
    assert torch.allclose(compiled(images, relevance), fxlrp.attribute(explain, images, target=relevance))
    with pytest.raises(ValueError, match="out of range"):
        compiled(images, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="floating-point inputs"):
        compiled(images.long())


def test_autocast_is_recorded_in_the_graph() -> None:
    """A call under ``torch.autocast`` is traced into a graph of its own, which holds autocast's
    casts to bfloat16 (the graph runs with autocast off: without them it would compute in
    float32). Compared by what the graphs hold, not by value: the traced graph computes the
    rules' general case (terms that are 0 here, in place or not), other code paths for the same
    bfloat16 sums, whose rounding no bound holds for on every CPU; that the traced rules compute
    the eager relevance is checked in float64 (the tests above)."""
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    graphs: list[torch.fx.GraphModule] = []

    def recording(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(graph)
        return graph.forward

    compiled = fxlrp.compile(explain, backend=recording)
    images = torch.randn(4, 1, 8, 8)
    full = compiled(images, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        relevance = compiled(images, 3)
    assert compiled.graphs == 2 and len(graphs) == 2  # autocast is part of a graph's key
    casts = [sum(node.kwargs.get("dtype") == torch.bfloat16 for node in graph.graph.nodes) for graph in graphs]
    assert casts[0] == 0 and casts[1] > 0, casts
    assert relevance.dtype == torch.float32 and torch.isfinite(relevance).all() and not torch.equal(relevance, full)


def test_torch_compile_of_the_explainer_runs_relevance_functions_as_in_eager() -> None:
    """``torch.compile(explain)`` skips the relevance Functions (Dynamo cannot trace them) instead of
    recompiling them for every node: eager relevance, no recompilation."""
    torch.manual_seed(0)
    explain = fxlrp.convert(DigitsCNN().eval())
    compiled = torch.compile(explain)
    graphs = compiled_graphs()
    for call in range(2):
        images = torch.randn(3, 1, 8, 8)
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            relevance = fxlrp.attribute(compiled, images, target=1)
        assert torch.equal(relevance, fxlrp.attribute(explain, images, target=1))  # (traced: not equal)
    assert compiled_graphs() <= graphs + 1  # (traced into each relevance function: 8 graphs)


def test_command_line_compile_gives_the_eager_relevance(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    np.save(tmp_path / "samples.npy", torch.randn(4, 1, 8, 8).numpy())
    common = ["explain", "--model", "fxlrp.toys.digits:DigitsCNN", "--data", str(tmp_path / "samples.npy"),
              "--batch-size", "2", "--dtype", "float64"]
    assert cli.main([*common, "--out", str(tmp_path / "eager")]) == 0
    assert cli.main([*common, "--compile", "--out", str(tmp_path / "compiled")]) == 0
    eager, compiled = (fxlrp.read_explanations(tmp_path / name) for name in ("eager", "compiled"))
    assert eager.relevance.dtype == np.float64 and np.abs(eager.relevance).sum() > 0
    # Inductor's kernels sum in other orders: in float64 the two agree to far below 1e-9 relative
    # (as check_compiled_equals_eager)
    assert np.abs(compiled.relevance - eager.relevance).max() <= 1e-9 * np.abs(eager.relevance).max()
    np.testing.assert_array_equal(compiled.predictions, eager.predictions)
    image = tmp_path / "image.npy"
    np.save(image, torch.randn(1, 8, 8).numpy())
    lines = []
    for flags in ([], ["--compile"]):
        capsys.readouterr()
        torch.manual_seed(0)  # a factory model without --weights: the same random weights for both runs
        assert cli.main(["explain", "--model", "fxlrp.toys.digits:DigitsCNN", str(image), *flags,
                         "--out", str(tmp_path / f"png{len(flags)}")]) == 0
        lines.append(capsys.readouterr().out.replace("png1", "png0"))
    # The same lines; their numbers (3 significant digits) as far apart as float32 rounding of
    # two summation orders can put them: one unit of the last digit printed.
    assert re.sub(NUMBER, "#", lines[0]) == re.sub(NUMBER, "#", lines[1]) and "relevance sum" in lines[0]
    for eager_number, compiled_number in zip(re.findall(NUMBER, lines[0]), re.findall(NUMBER, lines[1]), strict=True):
        assert abs(float(eager_number) - float(compiled_number)) <= 1e-2 * abs(float(eager_number))


NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def test_a_part_run_eagerly_is_compiled_as_it_runs() -> None:
    """A Hugging Face ViT, which torch.fx cannot trace (fxlrp runs it eagerly): the trace records
    what the eager run computes, rules included (the epsilon rule's stabiliser, AttnLRP-style
    products and the softmax rule of the decomposed attention), so the compiled relevance equals
    the eager one in float64, for a second input without recompiling."""
    import transformers

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = transformers.ViTForImageClassification(transformers.ViTConfig(
                image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, num_labels=3))

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.vit(pixel_values=pixels).logits

    torch.manual_seed(0)
    explain = fxlrp.convert(Logits().eval().double(), Epsilon(1e-6))
    assert explain.report().eager_modules  # the case this test is about
    compiled = fxlrp.compile(explain, backend="aot_eager")
    for _ in range(2):
        images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
        reference = fxlrp.attribute(explain, images)
        assert reference.abs().sum() > 0
        assert torch.allclose(compiled(images), reference, rtol=1e-12, atol=1e-15)
    assert compiled.graphs == 1


def _bert_classifier() -> torch.nn.Module:
    import transformers

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertForSequenceClassification(transformers.BertConfig(
                vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                num_labels=3, attn_implementation="sdpa"))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).logits

    return Logits()


def _llama() -> torch.nn.Module:
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa"))


@pytest.mark.parametrize(("build", "composite", "backend"), [
    (_bert_classifier, AttnLRP(), "inductor"), (_llama, AttnLRP(0.0), "aot_eager")], ids=["bert", "llama"])
def test_token_ids_compile_once_and_get_the_eager_relevance_per_token(build, composite, backend) -> None:
    """Token ids receive the relevance that reaches the embedding lookups made with them, summed
    over the embedding's features, as from ``fxlrp.attribute``: a BERT classifier and a causal LM
    (its last position's prediction explained), float64, a second batch of ids without
    recompiling."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    explain = fxlrp.convert(build().eval().double(), composite)
    compiled = fxlrp.compile(explain, backend=backend)
    for seed in (1, 2):
        ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(seed))
        reference = fxlrp.attribute(explain, ids)
        assert reference.shape == ids.shape and reference.abs().sum() > 0
        assert relative_error(compiled(ids), reference) <= 1e-12
    assert compiled.graphs == 1


def test_inputs_that_receive_no_relevance_are_refused_by_compile() -> None:
    """Integer inputs no embedding looks up (indices, a mask) and no floating-point input: nothing
    can receive relevance, as ``fxlrp.attribute`` says too."""

    class Gathered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(10, 3))

        def forward(self, index: torch.Tensor) -> torch.Tensor:
            return self.table[index].sum(0, keepdim=True)

    explain = fxlrp.convert(Gathered())
    with pytest.raises(ValueError, match="none of the inputs can receive relevance"):
        fxlrp.compile(explain, backend="aot_eager")(torch.tensor([1, 2]))


class Logits:
    """A model output with ``logits`` (as Hugging Face's)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class PerPositionLogits(torch.nn.Module):
    """A causal-LM-shaped toy: logits per position, a linear map of that position's embedding
    (``x W^T``), in an output with ``logits``, and a padding mask among the inputs by
    Hugging Face's name."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 5, bias=False)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Logits:
        return Logits(self.head(inputs_embeds))


def test_a_padded_batch_is_explained_at_each_sequences_last_token() -> None:
    """The default output of per-position logits is each sequence's last position the padding
    mask marks (right padding), compiled and not; LRP-0 of the linear head is x W[target] at that
    position (the dense reference) and nothing elsewhere."""
    torch.manual_seed(0)
    model = PerPositionLogits().double().eval()
    explain = fxlrp.convert(model, Epsilon(0.0))
    embeds = torch.randn(2, 6, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    expected = torch.zeros_like(embeds)
    for sample, last in enumerate((5, 2)):
        expected[sample, last] = embeds[sample, last] * model.head.weight[3]
    compiled = fxlrp.compile(explain, backend="aot_eager")
    for relevance in (fxlrp.attribute(explain, (embeds, mask), target=3)[0], compiled((embeds, mask), 3)[0]):
        assert torch.allclose(relevance, expected, rtol=1e-12, atol=0)
    unpadded = fxlrp.attribute(explain, (embeds, torch.ones_like(mask)), target=3)[0]  # the last position
    assert torch.equal(unpadded[:, :5], torch.zeros_like(unpadded[:, :5])) and unpadded[1, 5].abs().sum() > 0
