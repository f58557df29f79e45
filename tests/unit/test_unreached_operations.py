"""Strict means "nothing relevance reaches goes unexplained".

An operation without an LRP rule that relevance reaches for some of a model's outputs but not for
others (a detector's box decoding, ``torch.exp``, when a class score is explained) does not block
conversion: it runs as the model runs it, is listed in the report as ``unreached``, and explaining
an output that does depend on it is the error naming it and its source line. Both capture paths:
a graph (decided at conversion) and a part run eagerly (decided when the run ends, the error in
backward), also once that part replays recorded graphs.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import fxlrp
from fxlrp.registry import REGISTRY
from fxlrp.rules import Epsilon


class ScoreAndSize(nn.Module):
    """Two outputs: a score (piecewise linear) and a size decoded with ``torch.exp`` (no rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.score = nn.Linear(8, 3)
        self.box = nn.Linear(8, 2)

    def forward(self, x):
        hidden = self.body(x)
        return self.score(hidden), torch.exp(self.box(hidden))  # exp: no LRP rule


class SizeOnly(nn.Module):
    """One output through ``torch.exp``: relevance reaches it whatever is explained."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x):
        return torch.exp(self.layer(x))  # exp: no LRP rule


CAPTURES = ["fx", "eager"]


def _model_and_input() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return ScoreAndSize().double().eval(), torch.randn(5, 4, dtype=torch.float64)


def _gradient_times_input(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(model(leaf)[0][:, target].sum(), leaf)
    return gradient * x


def test_exp_has_no_rule() -> None:
    # (else these tests test nothing: pick another operation without a rule)
    assert REGISTRY.for_function(torch.exp) is None
    assert REGISTRY.for_method("exp") is None


@pytest.mark.parametrize("capture", CAPTURES)
def test_the_output_that_does_not_depend_on_it_is_explained_strictly(capture: str) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture, strict=True)
    expected = _gradient_times_input(model, x, target=1)
    # the first call runs eagerly, the second records, the third replays the recording
    for _ in range(3):
        relevance = fxlrp.attribute(explain, x, target=1, output=lambda outputs: outputs[0])
        assert torch.allclose(relevance, expected, rtol=0, atol=1e-14)
        assert relevance.abs().sum() > 0


@pytest.mark.parametrize("capture", CAPTURES)
def test_the_outputs_are_the_models(capture: str) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    for _ in range(3):
        score, size = explain(x)
        expected_score, expected_size = model(x)
        assert torch.equal(score, expected_score) and torch.equal(size, expected_size)


@pytest.mark.parametrize("capture", CAPTURES)
def test_it_is_listed_in_the_report_as_unreached(capture: str) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    fxlrp.attribute(explain, x, target=0, output=lambda outputs: outputs[0])
    rows = [row for row in explain.report().all_rows if row.handling == "unreached"]
    assert len(rows) == 1
    assert "torch.exp" in rows[0].target + rows[0].operation
    assert "torch.exp(self.box(hidden))" in rows[0].source
    assert explain.report().coverage == 1.0


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("runs_before", [0, 2])
def test_explaining_the_output_that_depends_on_it_names_it_and_its_line(capture: str, runs_before: int) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    for _ in range(runs_before):  # (eager: the third call replays a recorded graph)
        fxlrp.attribute(explain, x, target=0, output=lambda outputs: outputs[0])
    with pytest.raises(fxlrp.UnsupportedOperationError) as error:
        fxlrp.attribute(explain, x, target=1, output=lambda outputs: outputs[1])
    message = str(error.value)
    assert "no LRP rule for torch.exp" in message
    assert "test_unreached_operations.py" in message and "torch.exp(self.box(hidden))" in message
    assert "strict=False" in message


@pytest.mark.parametrize("capture", CAPTURES)
def test_explaining_both_outputs_together_is_the_error(capture: str) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    x = x.clone().requires_grad_()
    score, size = explain(x)
    with pytest.raises(fxlrp.UnsupportedOperationError, match="torch.exp"):
        torch.autograd.backward((score, size), (score.detach(), size.detach()))


@pytest.mark.parametrize("capture", CAPTURES)
def test_zero_relevance_arriving_is_no_error(capture: str) -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    x = x.clone().requires_grad_()
    score, size = explain(x)
    torch.autograd.backward((score, size), (score.detach(), torch.zeros_like(size)))
    # (x.grad is the relevance; R = score at every class: the sum of the three explanations)
    assert torch.allclose(x.grad, _gradient_times_input(model, x.detach(), 0)
                          + _gradient_times_input(model, x.detach(), 1)
                          + _gradient_times_input(model, x.detach(), 2), rtol=0, atol=1e-14)


def test_an_operation_every_output_depends_on_is_refused_at_conversion() -> None:
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"torch\.exp.*test_unreached_operations\.py"):
        fxlrp.convert(SizeOnly(), capture="fx")


def test_an_operation_every_output_depends_on_is_refused_when_the_part_runs() -> None:
    explain = fxlrp.convert(SizeOnly(), capture="eager")
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"torch\.exp.*test_unreached_operations\.py"):
        explain(x)


@pytest.mark.parametrize("capture", CAPTURES)
def test_without_strict_relevance_follows_its_gradient(capture: str) -> None:
    model, x = _model_and_input()
    with pytest.warns(UserWarning, match="torch.exp"):  # (a graph: at conversion; eager: as it runs)
        explain = fxlrp.convert(model, Epsilon(0.0), capture=capture, strict=False)
        relevance = fxlrp.attribute(explain, x, target=1, output=lambda outputs: outputs[1])
    # exp's gradient takes the size's relevance R = exp(z_1) to z_1 as exp(z_1) R (no LRP rule),
    # then LRP-0 below z: x * d/dx sum_k (R_z,k / z_k) z_k (gradient x input of the linear part)
    leaf = x.clone().requires_grad_()
    z = model.box(model.body(leaf))
    relevance_z = torch.zeros_like(z)
    relevance_z[:, 1] = torch.exp(z[:, 1]) ** 2
    (gradient,) = torch.autograd.grad(((relevance_z / z).detach() * z).sum(), leaf)
    assert torch.allclose(relevance, gradient * x, rtol=0, atol=1e-12)


def test_the_users_model_is_not_modified() -> None:
    model, x = _model_and_input()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    explain = fxlrp.convert(model, Epsilon(0.0), capture="fx")
    fxlrp.attribute(explain, x, target=1, output=lambda outputs: outputs[0])
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert not model._forward_hooks and all(not module._forward_hooks for module in model.modules())


def test_a_saved_explainer_keeps_the_guard() -> None:
    model, x = _model_and_input()
    explain = fxlrp.convert(model, Epsilon(0.0), capture="fx")
    stored = io.BytesIO()
    torch.save(explain, stored)
    stored.seek(0)
    loaded = torch.load(stored, weights_only=False)
    relevance = fxlrp.attribute(loaded, x, target=1, output=lambda outputs: outputs[0])
    assert torch.allclose(relevance, _gradient_times_input(model, x, target=1), rtol=0, atol=1e-14)
    assert loaded.report().counts["unreached"] == 1
    with pytest.raises(fxlrp.UnsupportedOperationError, match="torch.exp"):
        fxlrp.attribute(loaded, x, target=1, output=lambda outputs: outputs[1])
