"""Issue 59, point 3: relevance that vanished on its way to the inputs is warned of.

``fxlrp.attribute`` warns (:class:`fxlrp.VanishedRelevanceWarning`, once per call, in the
user's terms) when the relevance reaching the inputs sums, in absolute value, to less than 1e-6
of the explained output's: the threshold is checked on both sides with a one-weight layer whose
bias makes up a known share of its output (LRP-0 gives the input ``w x`` of ``w x + b``), the
message in full on a layer whose epsilon dwarfs its outputs, and the layer it names where one
layer's bias absorbs the relevance (a layer of the graph; a module run eagerly; a module of a
model run eagerly as a whole, followed as it runs). Silent on ordinary models (ResNet-18 and a
small ViT with random weights, under the default and zennit's composites), and with
``check_finite=False``, which keeps the call free of the check's synchronisation.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
import torchvision
from torch import nn

import fxlrp
from fxlrp.rules import Epsilon


def _vanishing_warnings(function) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function()
    return [str(each.message) for each in caught if issubclass(each.category, fxlrp.VanishedRelevanceWarning)]


def _one_weight(bias: float) -> nn.Module:
    layer = nn.Linear(1, 1).double()
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(bias)
    return layer


@pytest.mark.parametrize(("bias", "warned"), [(1e7 - 1.0, True), (1e5 - 1.0, False)])
def test_the_threshold_is_a_millionth_of_the_output(bias: float, warned: bool) -> None:
    # z = w x + b = 1 + b, and LRP-0 gives the input w x = 1: a share of 1e-7 warns, 1e-5 does not.
    explain = fxlrp.convert(_one_weight(bias), Epsilon(0.0))
    x = torch.ones(1, 1, dtype=torch.float64)
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0))
    assert len(found) == int(warned)


def _warning_text(reached: float, output: float, found: str, which: str = "") -> str:
    return (
        f"fxlrp: the relevance reaching the inputs is {reached:.2g} in all{which}, a negligible share (under 1e-06) of "
        f"the explained output's {output:.2g} (absolute values summed): the rules absorbed it on the way - biases "
        "that make up nearly all of the output (weights left at their random initialisation), an epsilon larger "
        "than the layers' outputs, or a rule that finds no contribution to share it by (z+ where none is positive) "
        "- so a heatmap of it shows rounding noise, not the model's reasons. Load the trained weights or use a "
        f"smaller epsilon; {found}"
    )


def _named(layer: str, explain, x, node: str, before: str, target: int = 0, of: str = "") -> str:
    """The warning's clause naming ``layer`` (report node ``node``, fed by node ``before``), with
    the relevance totals attribute_nodes gives at its output and input."""
    _, found = fxlrp.attribute_nodes(explain, x, [node, before], target=target, check_finite=False)
    return (f"the layer that absorbed most{of} (the largest fall of the absolute relevance from its output to its "
            f"inputs) is {layer}: {found[node].abs().sum().item():.2g} reached its output, "
            f"{found[before].abs().sum().item():.2g} its inputs")


HOW_TO_FIND = ("to find the layer that absorbs it, compare the relevance sums of nodes of explain.report() from "
               "fxlrp.attribute_nodes(explain, inputs, nodes=[...], target=...)")


def test_the_warning_says_how_much_reached_the_inputs_and_what_to_do() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(1e9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relevance = fxlrp.attribute(explain, x, target=0)
    [warning] = caught
    assert warning.category is fxlrp.VanishedRelevanceWarning and issubclass(warning.category, UserWarning)
    assert warning.filename == __file__  # the user's call, not fxlrp's inside
    reached, output = relevance.abs().sum().item(), model(x)[:, 0].abs().sum().item()
    # An epsilon of 1e9 on outputs of ~1 keeps a share of ~1e-9 per layer: the last one takes nearly all.
    assert str(warning.message) == _warning_text(reached, output, _named("2 (Linear, node '_2' of explain.report())",
                                                                          explain, x, "_2", "_1"))
    # once per call, however many passes explain its targets
    assert len(_vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=[0, 1, 2], repeat=2))) == 1
    assert _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0, check_finite=False)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fxlrp.FxlrpWarning)  # users can filter fxlrp's warnings
        fxlrp.attribute(explain, x, target=0)


class _Gated(nn.Module):
    """A linear layer and a ReLU behind a branch on a value, which torch.fx cannot trace: run eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e30:
            return torch.relu(self.linear(x))
        return x


def _absorbing_middle(make_body, bias_of) -> nn.Module:
    """stem, ReLU, body, head: a bias of 1e9 in the body's linear layer makes up nearly all of its
    output, so LRP-0 passes ~1e-9 of the relevance reaching the body on to the stem; the stem
    and the head, without such biases, absorb nothing (a layer nearest the output or the input is
    the wrong answer)."""
    torch.manual_seed(0)
    body = make_body()
    with torch.no_grad():
        bias_of(body).bias.fill_(1e9)
    return nn.Sequential(OrderedDict(stem=nn.Linear(4, 8), act=nn.ReLU(), body=body, head=nn.Linear(8, 3))).double()


def test_the_warning_names_the_layer_that_absorbed_the_relevance() -> None:
    model = _absorbing_middle(lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU()), lambda body: body[0])
    x = torch.randn(2, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relevance = fxlrp.attribute(explain, x, target=[1, 0])
    [message] = [str(each.message) for each in caught]
    reached, output = relevance[0].abs().sum().item(), model(x)[:, 1].abs().sum().item()
    named = _named("body.0 (Linear, node 'body_0' of explain.report())", explain, x, "body_0", "act", target=1,
                   of=" of target 0")
    assert message == _warning_text(reached, output, named, " (for 2 of 2 targets)")


def test_a_layer_is_named_in_a_graph_with_tuple_outputs() -> None:
    """A ViT (attention's output is a tuple, taken apart by getitem: no one relevance tensor to
    record) whose classifier's bias of 1e9 absorbs the relevance."""
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2,
                                                 hidden_dim=16, mlp_dim=32, num_classes=3).double().eval()
    with torch.no_grad():
        model.heads.head.weight.normal_()
        model.heads.head.bias.fill_(1e9)
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0))
    reached = fxlrp.attribute(explain, x, target=0, check_finite=False).abs().sum().item()
    rows = [row.name for row in explain.report().rows]
    before = rows[rows.index("heads_head") - 1]  # (the class token taken out: x[:, 0])
    assert found == [_warning_text(reached, abs(model(x)[0, 0].item()), _named(
        "heads.head (Linear, node 'heads_head' of explain.report())", explain, x, "heads_head", before))]


class _Pooled(nn.Module):
    """Node features pooled per graph by a batch vector (integer indices, which a layer of the
    graph, the pooling sum, takes as an input: no relevance of them to count)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        return self.head(torch.zeros(3, 4, dtype=h.dtype).index_add(0, batch, h))


def test_a_layer_is_named_where_a_layer_takes_integer_indices() -> None:
    torch.manual_seed(0)
    model = _Pooled().double().eval()
    with torch.no_grad():
        model.head.bias.fill_(1e9)
    inputs = (torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 0, 2, 2, 2]))
    explain = fxlrp.convert(model, Epsilon(0.0))
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, inputs, target=0))
    reached = fxlrp.attribute(explain, inputs, target=0, check_finite=False)[0].abs().sum().item()
    output = model(*inputs)[:, 0].abs().sum().item()
    assert found == [_warning_text(reached, output, _named("head (Linear, node 'head' of explain.report())", explain,
                                                           inputs, "head", "index_add"))]


def test_a_module_run_eagerly_is_named_and_so_is_a_module_of_a_model_run_eagerly() -> None:
    model = _absorbing_middle(_Gated, lambda body: body.linear)
    x = torch.randn(2, 4, dtype=torch.float64)
    output = model(x)[:, 0].abs().sum().item()
    explain = fxlrp.convert(model, Epsilon(0.0))
    assert "body" in explain.report().eager_modules
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0))
    reached = fxlrp.attribute(explain, x, target=0, check_finite=False).abs().sum().item()
    assert found == [_warning_text(reached, output, _named("body (_Gated, node 'body' of explain.report())",
                                                           explain, x, "body", "act"))]
    # Run eagerly as a whole, the model is one node: its modules are followed as they run, and the
    # one absorbing is the linear layer inside the body (whose output's relevance, through the
    # ReLU, is the body node's of the graph above; its input is the same).
    eager = fxlrp.convert(model, Epsilon(0.0), capture="eager")
    found = _vanishing_warnings(lambda: fxlrp.attribute(eager, x, target=0))
    reached = fxlrp.attribute(eager, x, target=0, check_finite=False).abs().sum().item()
    assert found == [_warning_text(reached, output, _named(
        "body.linear (Linear, row 'model › body.linear' of explain.report())", explain, x, "body", "act"))]
    assert "model › body.linear" in [row.name for row in eager.report().all_rows]


class _OneLayer(nn.Module):
    """A linear map written out in the model's own code, behind a branch on a value: run eagerly,
    with no module inside it to name."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 4, dtype=torch.float64))
        self.bias = nn.Parameter(torch.full((3,), 1e9, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e30:
            return x @ self.weight.T + self.bias
        return x


def test_a_model_run_eagerly_without_modules_says_how_to_find_the_layer() -> None:
    model = _OneLayer()
    x = torch.rand(2, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    assert "" in explain.report().eager_modules
    found = _vanishing_warnings(lambda: fxlrp.attribute(explain, x, target=0))
    reached = fxlrp.attribute(explain, x, target=0, check_finite=False).abs().sum().item()
    assert found == [_warning_text(reached, model(x)[:, 0].abs().sum().item(), HOW_TO_FIND)]


def _small_vit() -> nn.Module:
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64)


ZENNIT = [fxlrp.composites.EpsilonPlusFlat(), fxlrp.composites.EpsilonAlpha2Beta1()]


@pytest.mark.parametrize(("make", "composite"), [
    (_small_vit, None), *[(_small_vit, composite) for composite in ZENNIT],
    (torchvision.models.resnet18, None),
    *[pytest.param(torchvision.models.resnet18, composite, marks=pytest.mark.slow) for composite in ZENNIT],
])
def test_ordinary_models_are_not_warned_of(make, composite) -> None:
    torch.manual_seed(0)
    explain = fxlrp.convert(make().eval(), composite)
    x = torch.randn(2, 3, 32, 32)
    assert _vanishing_warnings(lambda: fxlrp.attribute(explain, x)) == []


@pytest.mark.slow  # (a detector at 320 pixels: 20 s on two cores)
def test_a_detector_left_at_random_weights_is_warned_of() -> None:
    # The case: the features of a random MobileNet are ~1e-8, its logits nearly all bias.
    from fxlrp.integrations.torchvision import explain_detection

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
    explain = fxlrp.convert(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = explain_detection(explain, torch.rand(1, 3, 320, 320), 0)
    [message] = [str(each.message) for each in caught if each.category is fxlrp.VanishedRelevanceWarning]
    reached, output = explained.relevance.abs().sum().item(), abs(explained.explained)
    assert reached < 1e-6 * output
    assert message.startswith(f"fxlrp: the relevance reaching the inputs is {reached:.2g} in all, a negligible share "
                              f"(under 1e-06) of the explained output's {output:.2g} (absolute values summed)")
