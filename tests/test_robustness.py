"""Off the beaten path: saved and copied explainers, moves and casts, memory layouts, float16 and
bfloat16, hostile inputs, long runs.

References: gradient x input (LRP-0, float64), the explainer's own relevance before it was saved,
copied or given another layout, float32 relevance for low precision (correlation bounds measured
on these models, docs/faq.md), the model's own outputs, rules' formulas by hand.
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import LRP0, gradient_times_input, onehot_relevance, relative_error
from pyg_networks import Stack
from test_eager_capture import COMPOSITES, Network, OptionalMask
from test_threads import MessagePassing
from torch import nn

import fxlrp
from fxlrp.composites import EpsilonPlusFlat


def resnet18(classes: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=classes).double().eval()


def small_vit() -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10).eval()
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision initialises the head to 0: no relevance
    return model


def pickled(explain: nn.Module) -> nn.Module:
    return pickle.loads(pickle.dumps(explain))


def saved_and_loaded(explain: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(explain, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {"pickle": pickled, "torch.save": saved_and_loaded, "deepcopy": copy.deepcopy}


# -- Serialisation -------------------------------------------------------------------------


@pytest.mark.parametrize("how", list(COPIES))
def test_a_saved_or_copied_explainer_explains_identically(how: str) -> None:
    model = resnet18()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    before = fxlrp.attribute(explain, x, target=1, nodes=["layer1_0_relu"])
    loaded = COPIES[how](explain)
    after = fxlrp.attribute(loaded, x, target=1, nodes=["layer1_0_relu"])
    assert torch.equal(after[0], before[0]) and torch.equal(after[1]["layer1_0_relu"], before[1]["layer1_0_relu"])
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(after[0], expected) < 1e-12
    assert loaded.report().rows == explain.report().rows
    with torch.no_grad():
        assert torch.equal(loaded(x), explain(x))
        assert relative_error(loaded(x), model(x)) < 1e-12  # BatchNorm is folded: rounding differs


@pytest.mark.parametrize("how", list(COPIES))
def test_saved_or_copied_explainers_of_eager_graph_and_optional_input_models(how: str) -> None:
    """A model run eagerly in part, with name rules: a copy names its own modules again (it once
    kept the original's module ids, so name rules missed inside the copy's eager part); a model
    with an optional input keeps its retrace (a functools.partial of convert) and traces again."""
    torch.manual_seed(1)
    traceable, branchy = Network(branch=False).double().eval(), Network(branch=True).double().eval()
    branchy.load_state_dict(traceable.state_dict())
    x = torch.rand(2, 3, 7, 7, dtype=torch.float64) * 2 - 1
    composite = COMPOSITES["name and type rules"]
    expected = fxlrp.attribute(fxlrp.convert(traceable, composite()), x, target=2)
    explain = fxlrp.convert(branchy, composite())
    fxlrp.attribute(explain, x, target=2)  # the original has named its modules
    assert relative_error(fxlrp.attribute(COPIES[how](explain), x, target=2), expected) < 1e-12

    optional = OptionalMask().double().eval()
    features = torch.randn(2, 4, dtype=torch.float64)
    explain = COPIES[how](fxlrp.convert(optional, LRP0))
    [expected] = gradient_times_input(optional, [features], lambda out: out, lambda out: onehot_relevance(out, 0))
    assert relative_error(fxlrp.attribute(explain, features, target=0), expected) < 1e-12


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_saved_graph_network_explainers(how: str) -> None:
    torch.manual_seed(2)
    x = torch.randn(5, 5, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 2])
    for model, inputs in [(Stack("gat").double().eval(), (x, torch.stack([senders, receivers]))),
                          (MessagePassing().double().eval(), (x[:, :3], senders, receivers))]:
        explain = fxlrp.convert(model, LRP0)
        expected = fxlrp.attribute(explain, inputs, target=1)[0]
        assert torch.equal(fxlrp.attribute(COPIES[how](explain), inputs, target=1)[0], expected)


def test_an_explainer_saved_with_torch_save_loads_in_a_fresh_process(tmp_path: Path) -> None:
    """The operations are found by name in the loading process's registry (the integrations of
    installed libraries loaded as needed), not unpickled as closures."""
    torch.manual_seed(3)
    model = Stack("gcn").double().eval()
    x, edge_index = torch.randn(5, 5, dtype=torch.float64), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    torch.save({"explain": explain, "inputs": (x, edge_index),
                "relevance": fxlrp.attribute(explain, (x, edge_index), target=2)[0]}, tmp_path / "explain.pt")
    script = (
        "import sys, torch, fxlrp\n"
        f"saved = torch.load({str(tmp_path / 'explain.pt')!r}, weights_only=False)\n"
        "relevance = fxlrp.attribute(saved['explain'], saved['inputs'], target=2)[0]\n"
        "print(float((relevance - saved['relevance']).abs().max()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) == 0.0


# -- Moving and casting ---------------------------------------------------------------------

MOVES = {
    ".double()": lambda module: module.double(),
    ".half()": lambda module: module.half(),
    ".bfloat16()": lambda module: module.bfloat16(),
    ".to(float64)": lambda module: module.to(torch.float64),
    ".to('meta')": lambda module: module.to("meta"),
    ".cuda()": lambda module: module.cuda(),
}


@pytest.mark.parametrize("move", list(MOVES))
def test_moving_an_explainer_is_refused_and_moves_nothing(move: str) -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)).eval()
    state = copy.deepcopy(model.state_dict())
    x = torch.randn(2, 3, 6, 6)
    explain = fxlrp.convert(model)
    before = fxlrp.attribute(explain, x, target=0)
    with pytest.raises(TypeError, match=r"cannot be moved or cast.*fxlrp\.convert\(model\.to\(") as raised:
        MOVES[move](explain)
    assert "fxlrp." not in str(raised.value).replace("fxlrp.convert", "")  # the user's terms, not internals
    assert torch.equal(fxlrp.attribute(explain, x, target=0), before)  # nothing half-moved
    assert all(tensor.dtype == torch.float32 and tensor.device.type == "cpu"
               for tensor in [*explain.buffers(), *explain.parameters()])
    after = model.state_dict()
    assert all(torch.equal(after[name], value) and after[name].dtype == value.dtype for name, value in state.items())


def test_moves_that_change_nothing_are_allowed_and_a_moved_copy_converts() -> None:
    model = resnet18().float()
    x = torch.randn(1, 3, 32, 32)
    explain = fxlrp.convert(model, LRP0)
    before = fxlrp.attribute(explain, x, target=1)
    assert explain.to("cpu") is explain and explain.float() is explain and explain.to(torch.float32) is explain
    assert explain.cpu() is explain
    assert torch.equal(fxlrp.attribute(explain, x, target=1), before)
    # What the error says to do: convert a moved copy. The user's model stays float32.
    explain64 = fxlrp.convert(copy.deepcopy(model).double(), LRP0)
    x64 = x.double()
    [expected] = gradient_times_input(model.double(), [x64], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(fxlrp.attribute(explain64, x64, target=1), expected) < 1e-12


# -- Memory layouts ----------------------------------------------------------------------------


def test_channels_last_and_strided_inputs_give_the_relevance_of_contiguous_ones() -> None:
    model = resnet18()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    wide = torch.randn(2, 3, 64, 128, dtype=torch.float64)
    wide[:1, :, :, ::2] = x
    layouts = {"contiguous": x, "channels_last": x.to(memory_format=torch.channels_last),
               "strided": wide[:1, :, :, ::2], "transposed": x.transpose(2, 3).contiguous().transpose(2, 3)}
    assert not any(value.is_contiguous() for name, value in layouts.items() if name != "contiguous")
    explain, explain0 = fxlrp.convert(model), fxlrp.convert(model, LRP0)
    channels_last_model = copy.deepcopy(model).to(memory_format=torch.channels_last)
    explain_last = fxlrp.convert(channels_last_model)
    expected = fxlrp.attribute(explain, x, target=1)
    for name, value in layouts.items():
        [gradient_input] = gradient_times_input(model, [value], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(fxlrp.attribute(explain0, value, target=1), gradient_input) < 1e-12, name
        # epsilon amplifies the convolutions' rounding (another summation order): 1.2e-13 measured
        assert relative_error(fxlrp.attribute(explain, value, target=1), expected) < 1e-11, name
        assert relative_error(fxlrp.attribute(explain_last, value, target=1), expected) < 1e-11, name
