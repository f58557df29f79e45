"""Errors say what went wrong, where in the user's code, and what to do."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.references import relative_error
from torch import nn

import fxlrp


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        hidden = self.layer(x)
        hidden = torch.exp(hidden)  # no LRP rule: line named in the error
        return torch.logsumexp(hidden, dim=1)  # no LRP rule either


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        hidden = self.layer(x)
        if hidden.sum() > 0:  # control flow on a value: cannot be captured
            return hidden
        return -hidden


def test_unsupported_operation_error_names_nodes_operations_and_source_lines() -> None:
    with pytest.raises(fxlrp.UnsupportedOperationError) as error:
        fxlrp.convert(Unsupported())
    message = str(error.value)
    assert "2 operation(s)" in message
    assert "exp" in message and "logsumexp" in message
    assert "test_errors.py" in message
    assert "hidden = torch.exp(hidden)  # no LRP rule" in message
    assert "return torch.logsumexp(hidden, dim=1)" in message
    assert "strict=False" in message


def test_non_strict_warns_and_follows_the_gradient() -> None:
    model = Unsupported().double()
    with pytest.warns(UserWarning, match="exp"):
        explain = fxlrp.convert(model, strict=False)
    x = torch.randn(3, 4, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    # Through exp and logsumexp relevance follows the gradient; the linear layer keeps its rule.
    leaf = x.clone().requires_grad_()
    explain(leaf).sum().backward()
    assert torch.isfinite(leaf.grad).all() and leaf.grad.abs().sum() > 0
    rows = {row.name: row.handling for row in explain.report().rows}
    assert rows["exp"] == "gradient" and rows["layer"] == "rule"
    assert explain.report().coverage < 1.0


def test_data_dependent_control_flow_raises_capture_error_with_line_and_advice() -> None:
    with pytest.raises(fxlrp.CaptureError) as error:
        fxlrp.convert(DataDependent(), capture="fx")
    message = str(error.value)
    assert "DataDependent" in message
    assert "test_errors.py" in message and "if hidden.sum() > 0:" in message
    assert "concrete_args" in message and "What you can do" in message and "capture='auto'" in message
    assert isinstance(error.value, fxlrp.FxlrpError)


def test_concrete_args_make_a_flag_argument_capturable() -> None:
    class Flagged(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)

        def forward(self, x, negate):
            return -self.layer(x) if negate else self.layer(x)

    model = Flagged()
    explain = fxlrp.convert(model, concrete_args={"negate": True})
    x = torch.randn(3, 2)
    with torch.no_grad():
        assert relative_error(explain(x, True), model(x, True)) == 0


@pytest.mark.parametrize("composite", ["epsilon", 0.1, [fxlrp.rules.Epsilon(0.0)], nn.Linear])
def test_bad_composite_type_is_rejected(composite) -> None:
    with pytest.raises(TypeError, match="composite must be None, a rule"):
        fxlrp.convert(nn.Sequential(nn.Linear(2, 2)), composite)


def test_non_module_is_rejected() -> None:
    with pytest.raises(TypeError, match="expects an nn.Module"):
        fxlrp.convert(lambda x: x)


def test_unknown_node_name_lists_the_known_ones() -> None:
    explain = fxlrp.convert(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    with pytest.raises(ValueError, match="no node named 'conv9'.*report"):
        fxlrp.attribute_nodes(explain, torch.randn(1, 2), ["conv9"], 0)
    with pytest.raises(TypeError, match="nodes must be a list of node names"):
        fxlrp.attribute_nodes(explain, torch.randn(1, 2), "_0", 0)  # one name, not a list


def test_an_unsupported_module_is_named_by_its_path_and_its_type() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LocalResponseNorm(2))
    with pytest.raises(fxlrp.UnsupportedOperationError, match=r"1 \(torch\.nn\.LocalResponseNorm\)"):
        fxlrp.convert(model)


def test_a_forward_torch_fx_cannot_take_is_explained_in_the_users_terms() -> None:
    import functools

    def logged(forward):
        @functools.wraps(forward)
        def wrapper(self, *args, **kwargs):
            return forward(self, *args, **kwargs)
        return wrapper

    class Decorated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(3, 2)

        @logged
        def forward(self, x, scale=None, **options):
            return self.layer(x)

    model = Decorated()
    with pytest.raises(fxlrp.CaptureError) as error:
        fxlrp.convert(model, capture="fx")
    message = str(error.value)
    assert "Decorated.forward(x, scale=None, **options)" in message and "capture='auto'" in message
    assert "co_varnames" not in message
    x = torch.randn(4, 3)
    with torch.no_grad():  # and the default path takes it
        assert torch.equal(fxlrp.convert(model)(x), model(x))


@pytest.mark.parametrize("capture", ["auto", "eager", "fx"])
def test_torchscript_modules_are_refused_by_name(capture: str) -> None:
    """Operations inside TorchScript reach neither a graph nor the relevance mode: relevance would
    follow their gradient without a rule (before: AttributeError from inside fxlrp)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (torch.jit.script is deprecated)
        inner = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
        scripted_root = torch.jit.script(nn.Sequential(nn.Linear(4, 2)))
    model = nn.Sequential(nn.Linear(3, 4), inner, nn.Linear(4, 2))
    with pytest.raises(fxlrp.CaptureError, match=r"TorchScript modules \(1\): .* Convert the Python module"):
        fxlrp.convert(model, capture=capture)
    with pytest.raises(fxlrp.CaptureError, match=r"TorchScript modules \(the model itself\)"):
        fxlrp.convert(scripted_root, capture=capture)


class DetachedInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.detach() * 2).sum(-1, keepdim=True)


class SqrtOnTheOnlyPath(nn.Module):
    """A sqrt of an input-dependent value is a statistic (held constant): no path is left."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(self.layer(x) ** 2 + 1)


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("model", [DetachedInput, SqrtOnTheOnlyPath])
def test_an_output_no_relevance_can_reach_says_why(model: type[nn.Module], capture: str) -> None:
    """Not autograd's "element 0 of tensors does not require grad": the paths and what cuts them."""
    explain = fxlrp.convert(model(), capture=capture)
    with pytest.raises(ValueError, match="does not depend on the inputs along any path relevance can take.*sqrt"):
        fxlrp.attribute(explain, torch.randn(2, 4), target=0)


def test_a_model_on_the_meta_device_is_refused_at_conversion() -> None:
    # Issue 59: it converted, then a CPU input was told to move to 'meta', which failed in torch.
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("meta")
    with pytest.raises(ValueError) as raised:
        fxlrp.convert(model)
    assert str(raised.value) == (
        "the model's weights are on the meta device (9 of its 9 parameters and buffers, e.g. '0.weight'): it holds "
        "their shapes but no values, so there is nothing to explain. Load the weights first, then convert: "
        "model.to_empty(device='cpu') and model.load_state_dict(torch.load(FILE)), or accelerate's "
        "load_checkpoint_and_dispatch(model, FILE) for a model made under init_empty_weights()")
    # the advice works: the same model with values converts and explains (LRP-0 = gradient x input)
    loaded = model.to_empty(device="cpu")
    loaded.load_state_dict(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).state_dict())
    loaded = loaded.double().eval()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    loaded(x)[:, 1].sum().backward()
    relevance = fxlrp.attribute(fxlrp.convert(loaded, fxlrp.rules.Epsilon(0.0)), x.detach(), target=1)
    assert relative_error(relevance, x.grad * x.detach()) < 1e-12
