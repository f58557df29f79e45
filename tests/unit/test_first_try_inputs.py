"""Issue 47, "the first try works": inputs and targets as a user first gives them.

A missing batch dimension, another dtype or device than the model's, a NumPy array, a list of
numbers, a misspelt or out-of-range target: each is one error in the user's terms (what it names,
what to do), raised before the relevance machinery explains anything, with no traceback through
fxlrp's functions; where the model itself rejects the input, the error carries the model's own
message (and is raised from the model's own error). Valid calls are untouched: ``target=-1`` is the
last class, as in torch indexing (the decision documented in ``fxlrp.attribute`` and
docs/faq.md), checked against gradient x input computed on the model itself.

Models: torchvision's ResNet-18 and a small tabular MLP with BatchNorm (random weights), a
two-layer BERT from a config, a two-layer PyG GCN.
"""

from __future__ import annotations

import copy
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torchvision
from torch import Tensor, nn

import fxlrp
import fxlrp.errors
from fxlrp.rules import Epsilon

FXLRP = str(Path(fxlrp.__file__).parent) + os.sep
"""The package's folder, ending in a separator: a file in a folder beside it whose name starts the same
(fxlrp_old/, fxlrp-data/) is not fxlrp's."""
LRP0 = Epsilon(0.0)


def refusal(call: Callable[[], Any]) -> str:
    """The message of the error ``call`` raises, checked to be a ``ValueError`` or ``TypeError``
    whose traceback as Python prints it (its own, then its cause's, or its context's unless
    suppressed) passes through at most one frame of fxlrp: the public function the user called,
    never the internals that found the problem."""
    with pytest.raises((ValueError, TypeError)) as caught:
        call()
    shown, error, seen = [], caught.value, set()
    while error is not None and id(error) not in seen:  # (as Python prints a chain: once each)
        seen.add(id(error))
        shown += traceback.extract_tb(error.__traceback__)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    inside = [f"{Path(frame.filename).name}:{frame.lineno} {frame.name}" for frame in shown
              if frame.filename.startswith(FXLRP)]
    assert len(inside) <= 1, f"the traceback shows fxlrp's internals: {inside}"
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def own_message(call: Callable[[], Any]) -> str:
    """The error message of the model's own forward (run as the user would)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever the model raises
        call()
    return str(caught.value).splitlines()[0]


def test_the_error_is_an_fxlrp_error_and_a_value_and_type_error() -> None:
    """Code catching the ValueError or TypeError torch raised for such inputs still catches it."""
    error = fxlrp.errors.ExplanationInputError
    assert issubclass(error, fxlrp.errors.FxlrpError)
    assert issubclass(error, ValueError) and issubclass(error, TypeError)


# ResNet-18: the report's cases.


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, fxlrp.Explainer]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    return model, fxlrp.convert(model)


def test_a_missing_batch_dimension_is_the_models_own_refusal(resnet) -> None:
    """BatchNorm folded into the first convolution took the model's ``expected 4D input`` check
    with it: the explanation ran until a matrix product failed (``mat1 and mat2 shapes cannot be
    multiplied``, 28 frames). Now the model's own message, before the explainer runs at all."""
    model, explain = resnet
    image = torch.randn(3, 32, 32)
    calls = []
    explain.graph_module.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        message = refusal(lambda: fxlrp.attribute(explain, image))
    finally:
        explain.graph_module._forward_pre_hooks.clear()
    assert message.startswith("the model itself rejects input 'x' (shape [3, 32, 32])")
    assert "its BatchNorm2d 'bn1' raises ValueError: " + own_message(lambda: model(image)) in message
    assert own_message(lambda: model(image)) == "expected 4D input (got 3D input)"
    assert message.endswith("a single sample needs its batch dimension: pass x.unsqueeze(0)")
    assert not calls, "the explainer ran"
    assert fxlrp.attribute(explain, image.unsqueeze(0)).shape == (1, 3, 32, 32)


def test_float64_inputs_for_a_float32_model_are_the_models_own_refusal(resnet) -> None:
    model, explain = resnet
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    said = own_message(lambda: model(images))
    message = refusal(lambda: fxlrp.attribute(explain, images))
    assert message.startswith("the model itself rejects input 'x' (shape [2, 3, 32, 32], float64, on cpu): "
                              f"RuntimeError: {said}")
    assert "Input 'x' is float64 but the model's parameters are float32: pass x.to(torch.float32), or convert a " \
           "copy of the model in float64 (fxlrp.convert(copy.deepcopy(model).to(torch.float64)))" in message
    # attribute_nodes takes the same inputs
    assert refusal(lambda: fxlrp.attribute_nodes(explain, images, ["layer1_0_relu"])) == message


def test_the_model_is_asked_only_when_the_explanation_fails(resnet) -> None:
    """The model's own forward runs once, for inputs the explanation failed on; never for valid
    ones (no extra forward on the happy path)."""
    model, explain = resnet
    forward = type(model).forward
    with mock.patch.object(type(model), "forward", autospec=True, side_effect=forward) as ran:
        fxlrp.attribute(explain, torch.randn(2, 3, 32, 32))
        assert ran.call_count == 0
        refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 3, 32, 32, dtype=torch.float64)))
        assert ran.call_count == 1


def test_the_model_error_is_the_cause_with_the_models_traceback(resnet) -> None:
    """``raise ... from`` the model's own error: its traceback is the model's code, the
    explanation's failure is not shown."""
    _, explain = resnet
    with pytest.raises(fxlrp.errors.ExplanationInputError) as caught:
        fxlrp.attribute(explain, torch.randn(2, 3, 32, 32, dtype=torch.float64))
    cause = caught.value.__cause__
    assert isinstance(cause, RuntimeError) and caught.value.__suppress_context__
    frames = traceback.extract_tb(cause.__traceback__)
    assert any(frame.filename.endswith("torchvision/models/resnet.py") for frame in frames)
    assert not any(frame.filename.startswith(FXLRP) for frame in frames)


def test_an_input_on_another_device_is_the_models_own_refusal(resnet) -> None:
    """A tensor on the meta device stands for a device the parameters are not on."""
    model, explain = resnet
    images = torch.randn(2, 3, 32, 32, device="meta")
    said = own_message(lambda: model(images))
    message = refusal(lambda: fxlrp.attribute(explain, images))
    assert message.startswith(f"the model itself rejects input 'x' (shape [2, 3, 32, 32], float32, on meta): "
                              f"RuntimeError: {said}")
    assert message.endswith("Input 'x' is on meta but the model's parameters are on cpu: pass x.to('cpu').")


def test_numpy_arrays_and_lists_are_refused_before_anything_runs(resnet) -> None:
    _, explain = resnet
    images = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    assert refusal(lambda: fxlrp.attribute(explain, images)) == (
        "the input is a NumPy array (shape [2, 3, 32, 32], float32); fxlrp explains the torch tensors the model "
        "takes: pass torch.from_numpy(x)")
    assert refusal(lambda: fxlrp.attribute(explain, images.astype(np.float64))).endswith(
        "pass torch.from_numpy(x).to(torch.float32)")
    assert refusal(lambda: fxlrp.attribute(explain, [images])).startswith("input 0 ('x') is a NumPy array")
    assert refusal(lambda: fxlrp.attribute(explain, images.tolist())) == (
        "the input is a list of numbers (shape [2, 3, 32, 32]); fxlrp explains the torch tensors the model takes: "
        "pass torch.tensor(x, dtype=torch.float32)")
    assert refusal(lambda: fxlrp.attribute_nodes(explain, images, ["layer1_0_relu"])).startswith(
        "the input is a NumPy array")
    assert refusal(lambda: fxlrp.attribute(explain, "a cat")).startswith(
        "the input is text; the model takes tensors: tokenize it first")


# Targets.


def gradient_times_input(model: nn.Module, x: Tensor, logit: int) -> Tensor:
    """The reference: LRP-0 on a ReLU network is gradient x input, here of one logit per sample."""
    x = x.detach().clone().requires_grad_()
    model(x)[:, logit].sum().backward()
    return (x.grad * x).detach()


def test_a_negative_target_counts_from_the_end_as_torch_indexing_does(resnet) -> None:
    """target=-1 is the last class: documented, and equal to gradient x input of the last logit."""
    model, _ = resnet
    model = copy.deepcopy(model).double()
    explain = fxlrp.convert(model, LRP0)
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    last = fxlrp.attribute(explain, images, target=-1)
    expected = gradient_times_input(model, images, 9)
    assert ((last - expected).abs().max() / expected.abs().max()).item() < 1e-12
    # the last class, not another (class 8's relevance is far from it)
    assert ((last - fxlrp.attribute(explain, images, target=9)).abs().max() / expected.abs().max()).item() < 1e-12
    assert ((last - fxlrp.attribute(explain, images, target=8)).abs().max() / expected.abs().max()).item() > 1e-3
    assert "negative ones count from the end, as in torch indexing" in " ".join(fxlrp.attribute.__doc__.split())


@pytest.mark.parametrize("target", [10, -11, torch.tensor([0, 10])])
def test_a_target_out_of_range_says_the_range_both_ways(resnet, target) -> None:
    _, explain = resnet
    message = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 3, 32, 32), target=target))
    assert message.endswith("is out of range: the explained output [2, 10] has 10 classes in its last dimension "
                            "(indices 0 to 9, or -10 to -1 counting from the end)")


def test_a_target_of_the_wrong_shape(resnet) -> None:
    _, explain = resnet
    message = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 3, 32, 32), target=torch.tensor([0, 1, 2])))
    assert message == "target has 3 class indices; the explained output [2, 10] needs one index, or one per sample (2)"


@pytest.mark.parametrize(("target", "start"), [
    ("cat", "target 'cat' is not a target fxlrp knows. A target is None (each sample's highest output: the "
            "predicted class), a class index (an int; negative ones count from the end"),
    ("predicted", "target 'predicted' is not a target fxlrp knows (for the predicted class pass target=None)."),
    ("labels", "target 'labels' is not a target fxlrp knows (for each sample's label pass the labels as a tensor"),
    (2.0, "target 2.0 is a float; a class is given by its index, an int (target=2)."),
    (2.5, "target 2.5 is a float; a class is given by its index, an int."),
    (True, "target True is a bool; a class is given by its index, an int."),
    ({"class": 2}, "target is a dict, which is not a target fxlrp knows."),
    ([1, "x"], "target 'x' is not a target fxlrp knows."),
    ((1, 2.5), "target 2.5 is a float"),
    (torch.tensor([True, False]), "target is a tensor of torch.bool; class indices are integers"),
    (torch.tensor([1, 2], device="meta"), "target is a tensor on the meta device, which holds no values: give it on "
                                          "the CPU or on the inputs' device"),
])
def test_targets_of_no_known_kind_are_refused_before_anything_runs(resnet, target, start) -> None:
    """A name, a float, a bool, a dict, a mask, a tensor without values: before, a float was
    rounded down, a bool taken for class 1, a string or dict an error from inside torch."""
    _, explain = resnet
    calls = []
    explain.graph_module.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        message = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 3, 32, 32), target=target))
    finally:
        explain.graph_module._forward_pre_hooks.clear()
    assert message.startswith(start), message
    assert not calls, "the explainer ran"


def test_a_float_tensor_of_labels_is_not_rounded_to_indices(resnet) -> None:
    """A float tensor is the output relevance itself, of the output's shape; labels held as floats
    were taken as indices, 1.7 as 1."""
    _, explain = resnet
    message = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 3, 32, 32), target=torch.tensor([1.7, 2.0])))
    assert message == ("target is a float tensor of shape [2]: a float tensor is taken as the output relevance itself "
                       "and must have the explained output's shape [2, 10]; class indices are integers (pass "
                       "target.long() for labels held as floats)")


def test_convert_refuses_what_is_not_a_model_or_a_composite(resnet) -> None:
    model, explain = resnet
    assert refusal(lambda: fxlrp.convert(model, fxlrp.composites.EpsilonPlusFlat)) == (
        "composite is the class EpsilonPlusFlat; give an instance of it: EpsilonPlusFlat(...)")
    assert refusal(lambda: fxlrp.convert(model, concrete_args=["x"])) == (
        "concrete_args must be a dict {input name: value}, got list")
    assert refusal(lambda: fxlrp.convert(explain)) == (
        "the model given to fxlrp.convert is already an explainer (what fxlrp.convert returns): explain with it as it "
        "is, or convert the original model")
    assert refusal(lambda: fxlrp.convert(np.zeros(3))) == "fxlrp.convert expects an nn.Module, got ndarray"


# A small MLP on tabular features, with BatchNorm first.


class Tabular(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.norm, self.hidden, self.out = nn.BatchNorm1d(4), nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, features: Tensor) -> Tensor:
        return self.out(torch.relu(self.hidden(self.norm(features))))


def test_mlp_one_sample_without_its_batch_dimension() -> None:
    """BatchNorm computed as its affine map broadcast a single sample ``[4]`` and explained it,
    where the model refuses it."""
    model = Tabular().eval()
    explain = fxlrp.convert(model)
    sample = torch.randn(4)
    message = refusal(lambda: fxlrp.attribute(explain, sample))
    assert message == (f"the model itself rejects input 'features' (shape [4]): its BatchNorm1d 'norm' raises "
                       f"ValueError: {own_message(lambda: model(sample))}; a single sample needs its batch dimension: "
                       f"pass features.unsqueeze(0)")


def test_mlp_inputs_the_model_rejects_leave_the_model_as_it_was() -> None:
    """The model asked about the inputs runs in evaluation mode and is given back as it was: in
    training mode, its BatchNorm's statistics untouched."""
    model = Tabular().train()
    explain = fxlrp.convert(model)
    statistics = [tensor.clone() for tensor in (model.norm.running_mean, model.norm.running_var)]
    counted = model.norm.num_batches_tracked.clone()
    attributes = {name: dict(vars(module)) for name, module in model.named_modules()}
    wide = torch.randn(2, 5)
    said = own_message(lambda: model.eval()(wide))
    model.train()
    message = refusal(lambda: fxlrp.attribute(explain, wide))
    assert message == (f"the model itself rejects input 'features' (shape [2, 5], float32, on cpu): RuntimeError: "
                       f"{said}. Give the inputs as the model itself takes them.")
    half = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 4).half()))
    assert half.endswith("Input 'features' is float16 but the model's parameters are float32: pass "
                         "features.to(torch.float32), or convert a copy of the model in float16 "
                         "(fxlrp.convert(copy.deepcopy(model).to(torch.float16))).")
    assert all(module.training for module in model.modules())
    assert torch.equal(model.norm.running_mean, statistics[0]) and torch.equal(model.norm.running_var, statistics[1])
    assert torch.equal(model.norm.num_batches_tracked, counted)
    assert {name: dict(vars(module)) for name, module in model.named_modules()} == attributes


def test_mlp_a_numpy_array_among_the_inputs_and_on_meta() -> None:
    explain = fxlrp.convert(Tabular().eval())
    features = np.zeros((2, 4), dtype=np.float32)
    assert refusal(lambda: fxlrp.attribute(explain, (features,))) == (
        "input 0 ('features') is a NumPy array (shape [2, 4], float32); fxlrp explains the torch tensors the model "
        "takes: pass torch.from_numpy(features)")
    message = refusal(lambda: fxlrp.attribute(explain, torch.randn(2, 4, device="meta"), check_finite=False))
    assert message.endswith("Input 'features' is on meta but the model's parameters are on cpu: pass "
                            "features.to('cpu').")


# A two-layer BERT (from a config, random weights).


@pytest.fixture(scope="module")
def bert() -> tuple[nn.Module, fxlrp.Explainer]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    return model, fxlrp.convert(model, fxlrp.composites.AttnLRP())


def test_bert_a_tokenizers_lists_are_refused_with_return_tensors(bert) -> None:
    _, explain = bert
    ids = [[5, 7, 9, 11]]
    encoded = {"input_ids": ids, "attention_mask": [[1, 1, 1, 1]]}  # tokenizer(text) without return_tensors
    assert refusal(lambda: fxlrp.attribute(explain, encoded)) == (
        "input 'input_ids' is a list of numbers (shape [1, 4]); fxlrp explains the torch tensors the model takes: "
        "pass torch.tensor(input_ids) (a tokenizer gives tensors with return_tensors='pt')")
    assert refusal(lambda: fxlrp.attribute(explain, np.array(ids))) == (
        "the input is a NumPy array (shape [1, 4], int64); fxlrp explains the torch tensors the model takes: pass "
        "torch.from_numpy(input_ids)")


def test_bert_ids_without_a_batch_dimension_or_as_floats_are_the_models_own_refusal(bert) -> None:
    model, explain = bert
    ids = torch.tensor([5, 7, 9, 11])
    message = refusal(lambda: fxlrp.attribute(explain, ids))
    assert message == (f"the model itself rejects input 'input_ids' (shape [4], int64, on cpu): ValueError: "
                       f"{own_message(lambda: model(ids))}. A single sample needs its batch dimension: pass "
                       f"input_ids.unsqueeze(0).")
    floats = ids.unsqueeze(0).float()
    assert refusal(lambda: fxlrp.attribute(explain, floats)).startswith(
        f"the model itself rejects input 'input_ids' (shape [1, 4], float32, on cpu): RuntimeError: "
        f"{own_message(lambda: model(floats))}")


def test_bert_ids_on_meta_hold_nothing_to_explain(bert) -> None:
    """An embedding looks meta ids up in a CPU table without complaint (the model takes them):
    there are no values to explain."""
    _, explain = bert
    assert refusal(lambda: fxlrp.attribute(explain, torch.tensor([[5, 7, 9]], device="meta"))) == (
        "input 'input_ids' (shape [1, 3]) is on the meta device, which holds no values to explain; give it on the "
        "device of the model's parameters: pass input_ids.to('cpu')")


def test_bert_a_misspelt_target(bert) -> None:
    _, explain = bert
    ids = torch.tensor([[5, 7, 9, 11]])
    assert refusal(lambda: fxlrp.attribute(explain, ids, target="label")).startswith(
        "target 'label' is not a target fxlrp knows (for each sample's label pass the labels as a tensor of class "
        "indices).")
    assert refusal(lambda: fxlrp.attribute(explain, ids, target=3)).endswith(
        "(indices 0 to 2, or -3 to -1 counting from the end)")


# A two-layer GCN (PyTorch Geometric): graph_relevance and relevant_walks.


@pytest.fixture(scope="module")
def gcn() -> tuple[nn.Module, fxlrp.Explainer, Tensor, Tensor]:
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GCNConv

    class GCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = GCNConv(4, 8), GCNConv(8, 3)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.second(self.first(x, edge_index).relu(), edge_index)

    torch.manual_seed(7)
    model = GCN().double().eval()
    x = torch.randn(6, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 4]])
    return model, fxlrp.convert(model, LRP0), x, edge_index


def graph_calls(model: nn.Module, explain: fxlrp.Explainer) -> dict[str, Callable[..., Any]]:
    from fxlrp.integrations.pyg import graph_relevance, relevant_walks

    return {"graph_relevance": lambda x, edge_index, **kwargs: graph_relevance(explain, x, edge_index, **kwargs),
            "relevant_walks": lambda x, edge_index, **kwargs: relevant_walks(model, x, edge_index, **kwargs)}


@pytest.mark.parametrize("entry", ["graph_relevance", "relevant_walks"])
def test_graph_inputs_as_numpy_or_lists(gcn, entry) -> None:
    model, explain, x, edge_index = gcn
    call = graph_calls(model, explain)[entry]
    assert refusal(lambda: call(x.numpy(), edge_index, index=2)) == (
        "x is a NumPy array (shape [6, 4], float64); the model takes torch tensors: pass torch.from_numpy(x)")
    assert refusal(lambda: call(x, edge_index.tolist(), index=2)) == (
        "edge_index is a list of numbers (shape [2, 7]); the model takes torch tensors: pass "
        "torch.tensor(edge_index, dtype=torch.long)")
    assert refusal(lambda: call(x, edge_index.numpy(), index=2)).endswith("pass torch.from_numpy(edge_index).long()")


@pytest.mark.parametrize("entry", ["graph_relevance", "relevant_walks"])
def test_graph_inputs_the_model_rejects(gcn, entry) -> None:
    model, explain, x, edge_index = gcn
    call = graph_calls(model, explain)[entry]
    single = x.float()
    message = refusal(lambda: call(single, edge_index, index=2))
    assert message == (
        "the model itself rejects the inputs 'x' (shape [6, 4], float32, on cpu) and 'edge_index' (shape [2, 7], "
        f"int64, on cpu): RuntimeError: {own_message(lambda: model(single, edge_index))}. Input 'x' is float32 but "
        "the model's parameters are float64: pass x.to(torch.float64), or convert a copy of the model in float32 "
        "(fxlrp.convert(copy.deepcopy(model).to(torch.float32))).")
    meta = x.to("meta")
    message = refusal(lambda: call(meta, edge_index, index=2))
    assert f"RuntimeError: {own_message(lambda: model(meta, edge_index))}" in message
    assert message.endswith("Input 'x' is on meta but the model's parameters are on cpu: pass x.to('cpu').")
    features = x[:, 0]  # one feature per node, without its feature dimension
    assert refusal(lambda: call(features, edge_index, index=2)).startswith(
        "the model itself rejects the inputs 'x' (shape [6], float64, on cpu) and 'edge_index' (shape [2, 7], int64, "
        f"on cpu): IndexError: {own_message(lambda: model(features, edge_index))}")


def test_graph_relevance_mode_target_and_index(gcn) -> None:
    from fxlrp.integrations.pyg import graph_relevance

    _, explain, x, edge_index = gcn
    assert refusal(lambda: graph_relevance(explain, x, edge_index, mode="multi-class")) == (
        "mode='multi-class' is not one of 'multiclass', 'binary', 'regression'")
    assert refusal(lambda: graph_relevance(explain, x, edge_index, index=2, target=3)) == (
        "target 3 is out of range: the model's output [6, 3] has 3 classes (indices 0 to 2, or -3 to -1 counting "
        "from the end)")
    assert refusal(lambda: graph_relevance(explain, x, edge_index, index=2, target=1.5)).startswith(
        "target 1.5 is not a class: in mode='multiclass' a target is None (each row's highest output), a class index")
    assert refusal(lambda: graph_relevance(explain, x, edge_index, index=2, target="cat")).startswith(
        "target 'cat' is not a class")
    assert refusal(lambda: graph_relevance(explain, x, edge_index, target=torch.tensor([0, 1]))) == (
        "target has 2 values; the model's output [6, 3] needs one class, or one per row (6)")
    assert refusal(lambda: graph_relevance(explain, x, edge_index, index=6)) == (
        "index 6 picks no rows of the model's output [6, 3] (6 rows: nodes, graphs or node pairs): give a row (0 to "
        "5; negative ones count from the end), a tensor or list of rows, or a mask of 6 bools")


def test_relevant_walks_target_and_index(gcn) -> None:
    from fxlrp.integrations.pyg import relevant_walks

    model, _, x, edge_index = gcn
    assert refusal(lambda: relevant_walks(model, x, edge_index, index=6)) == (
        "index 6 is out of range: the model's output [6, 3] has 6 rows (nodes, graphs or node pairs; 0 to 5, or -6 to "
        "-1 counting from the end)")
    assert refusal(lambda: relevant_walks(model, x, edge_index, index=2, target=3)) == (
        "target 3 is out of range: the model's output [6, 3] has 3 classes (indices 0 to 2, or -3 to -1 counting "
        "from the end)")
    assert refusal(lambda: relevant_walks(model, x, edge_index, index=1.0)).startswith(
        "index 1.0 is not a row of the output: give one row")
    assert refusal(lambda: relevant_walks(model, x, edge_index, index=2, target=1.5)).startswith(
        "target 1.5 is not a class")


def test_graph_target_minus_one_is_the_last_class(gcn) -> None:
    """Documented as torch indexing in the graph functions too; checked against gradient x input
    of the last logit of node 2 (LRP-0 on a ReLU GCN)."""
    from fxlrp.integrations.pyg import graph_relevance, relevant_walks

    model, explain, x, edge_index = gcn
    leaf = x.clone().requires_grad_()
    model(leaf, edge_index)[2, 2].backward()
    expected = (leaf.grad * x).detach()
    found = graph_relevance(explain, x, edge_index, index=2, target=-1).node
    assert ((found - expected).abs().max() / expected.abs().max()).item() < 1e-12
    walks, relevance = relevant_walks(model, x, edge_index, index=2, target=-1, composite=LRP0)
    per_node = torch.zeros(6, dtype=torch.float64).index_add_(0, walks[:, 0], relevance)
    assert ((per_node - expected.sum(dim=1)).abs().max() / expected.abs().max()).item() < 1e-12
    assert "negative ones count from the end, as in torch indexing" in " ".join(graph_relevance.__doc__.split())


class SparseAdjacency(nn.Module):
    """A graph layer taking its adjacency as a (sparse or dense) matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False)

    def forward(self, x, adjacency):
        return self.second(torch.relu(adjacency @ self.first(x)))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_input_is_refused_with_the_dense_one_to_pass(layout: str) -> None:
    """A sparse adjacency given as an input failed deep inside (``aten::ne.Scalar`` on SparseCPU);
    the dense one it names is explained: a float input, it carries relevance too, and LRP-0's
    uniform rule on the product of two carrying factors gives each half, so the features get half
    their gradient x input (float64)."""
    torch.manual_seed(0)
    model = SparseAdjacency().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    dense = torch.zeros(4, 4, dtype=torch.float64)
    dense[[0, 1, 2, 3, 1], [1, 0, 3, 2, 2]] = 1.0
    sparse = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    explain = fxlrp.convert(model, Epsilon(0.0))
    with pytest.raises(fxlrp.errors.ExplanationInputError) as raised:
        fxlrp.attribute(explain, [x, sparse], target=0)
    assert str(raised.value) == (
        f"input 1 ('adjacency') is a sparse tensor (sparse_{layout}, shape [4, 4]); fxlrp takes dense inputs: pass "
        "adjacency.to_dense(), or give the model the indices and values and build the sparse matrix inside its "
        "forward (torch.sparse_coo_tensor), where it is explained")
    relevance = fxlrp.attribute(explain, [x, sparse.to_dense()], target=0)[0]
    leaf = x.clone().requires_grad_()
    model(leaf, dense)[:, 0].sum().backward()
    assert torch.allclose(relevance, leaf.grad * x / 2, rtol=1e-12, atol=1e-14)
