"""Module calls that do more than ``forward``: forward hooks and pre-hooks (the user's, pruning's
mask, the older weight and spectral norm) and parametrized parameters. A captured graph calls
neither (torch.fx traces ``forward``; fxlrp's layers call the functional form), so such modules
run eagerly, their calls as the model makes them. References: the same model with the hook's
work written into ``forward``, gradient x input for LRP-0, and the model's own outputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.prune as prune
from support.references import LRP0, gradient_times_input, onehot_relevance, relative_error
from torch import Tensor, nn
from torch.nn.utils import parametrizations

import fxlrp
from fxlrp import CaptureError
from fxlrp.rules.composites import EpsilonAlpha2Beta1Flat, EpsilonPlusFlat


class Net(nn.Module):
    """conv -> ReLU -> linear, with the hooks' work optionally written into ``forward``: the input
    scaled by 1/2 before the linear layer, the convolution's output by 3, the output by 2."""

    def __init__(self, written_out: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.act, self.head = nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Linear(4 * 4 * 4, 5)
        self.written_out = written_out

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        h = self.act(h * 3 if self.written_out else h)
        h = h.flatten(1)
        out = self.head(h * 0.5 if self.written_out else h)
        return out * 2 if self.written_out else out


def _hooked() -> nn.Module:
    model = Net()
    model.conv.register_forward_hook(lambda module, args, output: output * 3)
    model.head.register_forward_pre_hook(lambda module, args: (args[0] * 0.5,))
    model.register_forward_hook(lambda module, args, output: output * 2)
    return model


def _recording(seen: list[Tensor]) -> nn.Module:
    model = Net()
    model.conv.register_forward_hook(lambda module, args, output: seen.append(output.detach()))
    return model


def _images() -> Tensor:
    return torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


COMPOSITES = {"LRP-0": LRP0, "EpsilonPlusFlat": EpsilonPlusFlat(), "EpsilonAlpha2Beta1Flat": EpsilonAlpha2Beta1Flat()}


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("composite", list(COMPOSITES))
def test_hooks_that_change_values_are_explained_as_the_same_work_written_in_forward(composite: str,
                                                                                     capture: str) -> None:
    x = _images()
    expected = fxlrp.attribute(fxlrp.convert(Net(written_out=True).double().eval(), COMPOSITES[composite]), x,
                               target=1)
    model = _hooked().double().eval()
    explain = fxlrp.convert(model, COMPOSITES[composite], capture=capture)
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-14
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12


@pytest.mark.parametrize("composite", list(COMPOSITES))
def test_a_hook_that_records_leaves_relevance_as_it_is_and_sees_the_explanations_forward(composite: str) -> None:
    x = _images()
    expected = fxlrp.attribute(fxlrp.convert(Net().double().eval(), COMPOSITES[composite]), x, target=1)
    seen: list[Tensor] = []
    model = _recording(seen).double().eval()
    explain = fxlrp.convert(model, COMPOSITES[composite])
    assert fxlrp.attribute(explain, x, target=1).equal(expected)
    with torch.no_grad():
        assert seen and seen[-1].equal(model.conv(x))


def _pruned() -> nn.Module:
    model = Net()
    prune.l1_unstructured(model.head, "weight", amount=0.5)
    prune.random_unstructured(model.conv, "weight", amount=0.3)
    return model


def _weight_normed() -> nn.Module:
    model = Net()
    model.head = parametrizations.weight_norm(model.head)
    model.conv = nn.utils.weight_norm(model.conv)  # the older form: a pre-hook
    return model


def _spectral_normed() -> nn.Module:
    model = Net()
    model.head = parametrizations.spectral_norm(model.head)
    model.conv = nn.utils.spectral_norm(model.conv)  # the older form: a pre-hook
    return model


@pytest.mark.parametrize("build", [_pruned, _weight_normed, _spectral_normed], ids=lambda build: build.__name__[1:])
def test_pruned_and_reparametrized_layers_give_gradient_times_input_under_lrp0(build: Callable[[], nn.Module]) -> None:
    model, x = build().double().eval(), _images()
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        assert relative_error(explain(x), model(x)) < 1e-14
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
    assert explain.report().coverage == 1.0


def test_torch_fx_capture_refuses_hooks_and_parametrizations_naming_them() -> None:
    model = _weight_normed().double().eval()
    with pytest.raises(CaptureError, match=r"(?s)conv: it has forward hooks.*head: its parameters are parametrized"
                                           r".*capture='auto'"):
        fxlrp.convert(model, LRP0, capture="fx")
