"""Custom ``torch.autograd.Function``s in a model are explained by the operations of their
``forward``, as a captured graph explains them (torch.fx traces through ``forward``): their
``backward`` is a rule of training (a straight-through estimator, a gradient reversal), which
relevance must not follow. Reference: the same model with the forward's operations written
inline. A forward whose operations fxlrp cannot see is an operation without a rule."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from support.references import LRP0, gradient_times_input, onehot_relevance, relative_error
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import fxlrp
from fxlrp.rules.composites import EpsilonPlusFlat


class StraightThrough(torch.autograd.Function):
    """Forward: ReLU. Backward: the gradient halved (a training device, not the ReLU's)."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx: object, gradient: Tensor) -> Tensor:
        return gradient * 0.5


class GradientReversal(torch.autograd.Function):
    """Forward: the identity. Backward: the gradient negated (domain-adversarial training); written
    in the style with ``setup_context``."""

    @staticmethod
    def forward(x: Tensor, scale: float) -> Tensor:
        return x * scale

    @staticmethod
    def setup_context(ctx: object, inputs: tuple, output: Tensor) -> None:
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx: object, gradient: Tensor) -> tuple[Tensor, None]:
        return -gradient * ctx.scale, None


class ThroughNumpy(torch.autograd.Function):
    """Forward: the identity, computed outside torch (where fxlrp sees no operation)."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return torch.from_numpy(x.detach().numpy().copy())

    @staticmethod
    def backward(ctx: object, gradient: Tensor) -> Tensor:
        return gradient


class Net(nn.Module):
    def __init__(self, inline: bool = False, activation: type[torch.autograd.Function] = StraightThrough) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second, self.head = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.inline, self.activation = inline, activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        h = h.clamp(min=0) if self.inline else self.activation.apply(h)
        h = self.second(h)
        h = h * 1.5 if self.inline else GradientReversal.apply(h, 1.5)
        return self.head(torch.relu(h))


def _inputs() -> Tensor:
    return torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("composite", [LRP0, EpsilonPlusFlat()], ids=["LRP-0", "EpsilonPlusFlat"])
def test_custom_functions_are_explained_by_their_forward(composite: object, capture: str) -> None:
    x = _inputs()
    expected = fxlrp.attribute(fxlrp.convert(Net(inline=True).double().eval(), composite, capture=capture), x,
                               target=1)
    explain = fxlrp.convert(Net().double().eval(), composite, capture=capture)
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12


def test_a_forward_fxlrp_cannot_see_is_an_operation_without_a_rule() -> None:
    model, x = Net(activation=ThroughNumpy).double().eval(), _inputs()
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"ThroughNumpy\.apply \(a custom autograd Function\)"):
        fxlrp.attribute(fxlrp.convert(model, LRP0), x, target=1)
    # strict=False: its own backward (here the identity's gradient) carries relevance, with a warning
    explain = fxlrp.convert(model, LRP0, strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relevance = fxlrp.attribute(explain, x, target=1)
    assert any("ThroughNumpy.apply" in str(warning.message) for warning in caught)
    reference = Net(inline=True, activation=ThroughNumpy).double().eval()
    reference.forward = lambda x: reference.head(torch.relu(reference.second(reference.first(x)) * 1.5))
    [expected] = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(relevance, expected) < 1e-12


def test_explanations_on_two_threads_at_once_and_function_apply_given_back() -> None:
    """``Function.apply`` dispatches per thread while explanations run (the model's Functions on
    another thread keep their own backward) and is torch's own again afterwards."""
    original = torch.autograd.Function.__dict__["apply"]
    x = _inputs()
    explain = fxlrp.convert(Net().double().eval(), LRP0, capture="eager")
    expected = fxlrp.attribute(fxlrp.convert(Net(inline=True).double().eval(), LRP0, capture="eager"), x, target=1)
    plain = Net().double().eval()
    leaf = x.clone().requires_grad_()
    plain(leaf)[:, 1].sum().backward()
    own_gradient = leaf.grad.clone()  # through the Functions' own backward

    results: dict[str, list[Tensor]] = {"explained": [], "plain": []}

    def explain_repeatedly() -> None:
        results["explained"] += [fxlrp.attribute(explain, x, target=1) for _ in range(20)]

    def differentiate_repeatedly() -> None:
        for _ in range(40):
            leaf = x.clone().requires_grad_()
            plain(leaf)[:, 1].sum().backward()
            results["plain"].append(leaf.grad)

    threads = [threading.Thread(target=explain_repeatedly), threading.Thread(target=differentiate_repeatedly)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(relative_error(found, expected) < 1e-12 for found in results["explained"])
    assert all(torch.equal(found, own_gradient) for found in results["plain"])
    assert torch.autograd.Function.__dict__["apply"] is original


class Checkpointed(nn.Module):
    """A residual block run through activation checkpointing (or plainly, the reference)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.first, self.head, self.how = nn.Linear(5, 8), nn.Linear(8, 3), how
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(x)
        if self.how == "plain":
            h = h + self.block(h)
        elif self.how == "sequential":
            h = h + checkpoint_sequential(self.block, 2, h, use_reentrant=False)
        else:
            h = h + checkpoint(self.block, h, use_reentrant=self.how == "reentrant")
        return self.head(torch.relu(h))


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("how", ["reentrant", "not reentrant", "sequential"])
def test_activation_checkpointing_is_explained_as_the_function_it_runs(how: str, capture: str) -> None:
    """Checkpointing runs the block again in backward, outside the relevance mode: relevance
    followed plain gradients there (EpsilonPlusFlat 19-56% off) or torch's recomputation check
    failed (LRP-0); an explanation runs the block itself."""
    x = _inputs()
    for composite in (LRP0, EpsilonPlusFlat()):
        expected = fxlrp.attribute(fxlrp.convert(Checkpointed("plain").double().eval(), composite), x, target=1)
        explain = fxlrp.convert(Checkpointed(how).double().eval(), composite, capture=capture)
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
