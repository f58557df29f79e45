"""The second capture path: modules torch.fx cannot trace run eagerly, with the same rules.

References: gradient x input for LRP-0 (float64), and the same network written so that torch.fx
can trace it, explained through the graph with the same composite (name, type and first-layer
rules included): the eager path must give the graph path's relevance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.models import COMPOSITES, Network, OptionalMask
from support.references import LRP0, explained_relevance, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp


class Branchy(nn.Module):
    """A branch on the input's value: torch.fx cannot record it."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.positive, self.negative = nn.Linear(4, 6), nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        hidden = torch.relu(self.first(x))
        if x.sum() > 0:
            return self.positive(hidden)
        return self.negative(hidden) * 2 - hidden.sum(dim=1, keepdim=True)


class Wrapped(nn.Module):
    """Traceable layers around a part that is not."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.inner, self.head = nn.Linear(4, 4), Branchy(), nn.Linear(3, 2)

    def forward(self, x):
        return self.head(torch.relu(self.inner(torch.relu(self.stem(x))) + 0.5))


@pytest.mark.parametrize("model_type", [Branchy, Wrapped])
def test_a_branch_on_the_input_is_taken_per_input(model_type: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = model_type().double().eval()
    explain = fxlrp.convert(model, LRP0)
    taken = set()
    for sign in (1.0, -1.0):
        x = sign * torch.rand(3, 4, dtype=torch.float64) + sign * 0.1
        taken.add(bool(x.sum() > 0))
        with torch.no_grad():
            assert torch.equal(explain(x), model(x))
        relevance = fxlrp.attribute(explain, x, target=1)
        [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(relevance, expected) < 1e-12
    assert taken == {True, False}


def test_report_says_which_part_runs_eagerly() -> None:
    report = fxlrp.convert(Wrapped()).report()
    handling = {row.name: row.handling for row in report.rows}
    assert handling["inner"] == "eager" and handling["stem"] == "rule" and handling["head"] == "rule"
    assert report.capture.startswith("captured by torch.fx, except 1 module(s) run eagerly: inner")
    assert "control flow" in report.capture
    whole = fxlrp.convert(Branchy()).report()
    assert whole.capture.startswith("run eagerly as a whole")


@pytest.mark.parametrize("composite", list(COMPOSITES))
@pytest.mark.parametrize("path", ["auto", "eager"])
def test_rules_inside_an_eager_part_are_those_of_the_graph(composite: str, path: str) -> None:
    torch.manual_seed(1)
    traceable, branchy = Network(branch=False).double().eval(), Network(branch=True).double().eval()
    branchy.load_state_dict(traceable.state_dict())
    x = torch.rand(2, 3, 7, 7, dtype=torch.float64) * 2 - 1
    expected = fxlrp.attribute(fxlrp.convert(traceable, COMPOSITES[composite]()), x, target=2)
    explain = fxlrp.convert(branchy, COMPOSITES[composite](), capture=path)
    assert "eager" in explain.report().capture
    assert relative_error(fxlrp.attribute(explain, x, target=2), expected) < 1e-12


def test_capture_fx_refuses_what_it_cannot_trace_and_eager_takes_everything() -> None:
    with pytest.raises(fxlrp.CaptureError, match="control flow"):
        fxlrp.convert(Branchy(), capture="fx")
    with pytest.raises(ValueError, match="capture must be one of"):
        fxlrp.convert(Branchy(), capture="dynamo")
    torch.manual_seed(2)
    model = Network(branch=False).double().eval()
    x = torch.rand(2, 3, 7, 7, dtype=torch.float64)
    graph = fxlrp.attribute(fxlrp.convert(model, LRP0), x, target=0)
    eager = fxlrp.convert(model, LRP0, capture="eager")
    assert eager.report().capture.startswith("run eagerly as a whole")
    assert relative_error(fxlrp.attribute(eager, x, target=0), graph) < 1e-12


class Unexplainable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        hidden = self.layer(x)
        if hidden.sum() > -1e9:  # always taken, but torch.fx cannot know
            hidden = torch.exp(hidden)  # no LRP rule
        return torch.logsumexp(hidden, dim=1)  # no LRP rule either


def test_strict_names_every_operation_without_a_rule_with_its_line() -> None:
    explain = fxlrp.convert(Unexplainable())
    x = torch.ones(2, 4)
    with pytest.raises(fxlrp.UnsupportedOperationError) as error:
        fxlrp.attribute(explain, x, target=None)
    message = str(error.value)
    assert "2 operation(s)" in message
    assert "torch.exp " in message and "torch.logsumexp " in message
    assert "test_eager_capture.py" in message and "torch.exp(hidden)" in message
    with pytest.warns(UserWarning, match="follows the gradient"):
        fxlrp.attribute(fxlrp.convert(Unexplainable(), strict=False), x, target=None)


class CountingTokens(nn.Module):
    """Token ids, a forward that counts its calls and caches, and a branch on the ids."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(9, 4)
        self.layer = nn.Linear(4, 3)
        self.calls = 0
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, ids):
        self.calls += 1
        embedded = self.tokens(ids)
        if int(ids.max()) > 4:
            embedded = F.relu(embedded)
        self.cache["last"] = embedded
        return self.layer(embedded).sum(dim=1)


def test_token_ids_through_an_eager_model_and_the_model_is_untouched() -> None:
    torch.manual_seed(3)
    model = CountingTokens().double().eval()
    ids = torch.tensor([[1, 7, 3], [2, 2, 8]])
    state = {name: value.clone() for name, value in model.state_dict().items()}
    explain = fxlrp.convert(model, LRP0)
    relevance = fxlrp.attribute(explain, ids, target=0)
    assert model.calls == 0 and model.cache == {}  # what the forward wrote into the model is taken back
    embedded = model.tokens(ids).detach().requires_grad_()
    output = model.layer(F.relu(embedded)).sum(dim=1)
    [gradient] = torch.autograd.grad(output, [embedded], onehot_relevance(output, 0) / output.detach())
    assert relative_error(relevance, (embedded * gradient).detach().sum(dim=-1)) < 1e-12
    assert all(torch.equal(model.state_dict()[name], value) for name, value in state.items())
    assert all(parameter.grad is None for parameter in model.parameters())


def test_an_lstm_run_eagerly_keeps_its_own_flat_weights() -> None:
    """An eager run gives nn.LSTM's kernel detached parameters (its own list of flat weights is
    made again from them); the list must point at the model's own parameters again afterwards."""

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, 4, batch_first=True)

        def forward(self, x):
            if any(weight.requires_grad for weight in self.lstm._flat_weights):
                raise AssertionError("the recurrent kernel was given the model's own parameters")
            out, _ = self.lstm(x)
            return out[:, -1] if out.sum() > -1e9 else out[:, 0]  # torch.fx cannot trace this

    model = Recurrent().double().eval()
    fxlrp.attribute(fxlrp.convert(model), torch.randn(2, 5, 3, dtype=torch.float64))
    assert all(weight is parameter for weight, parameter in zip(model.lstm._flat_weights, model.lstm.parameters(),
                                                                strict=True))


class AugmentedInEagerCode(nn.Module):
    """Hiera tiles with ``x.tile`` in code torch.fx cannot trace; ConViT's ``attn /= attn.sum(-1)``
    writes into a tensor that operations before it keep for backward (an error, never a silently
    changed value)."""

    def __init__(self, in_place_division: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.in_place_division = in_place_division

    def forward(self, x):
        hidden = torch.relu(self.layer(x)) + 0.1
        if hidden.sum() > -1e9:  # torch.fx cannot trace this
            if self.in_place_division:
                hidden /= hidden.sum(dim=-1, keepdim=True).detach()
            hidden = hidden * 2.0 + 1.0
        return hidden.tile((1, 2)).sum(dim=1, keepdim=True) + hidden


def test_tile_in_eager_code_equals_gradient_times_input() -> None:
    torch.manual_seed(4)
    model = AugmentedInEagerCode().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 2))
    assert relative_error(fxlrp.attribute(explain, x, target=2), expected) < 1e-12


class InPlaceWrites(nn.Module):
    """Code run eagerly that writes into relevance-carrying tensors, each spelling once: into a
    layer's output that its rule keeps (the epsilon denominator), into a view, into the model's
    own input, through an alias. Plain autograd accepts every one of them (no write touches a
    tensor its backward keeps), so gradient x input is the reference."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.first, self.second, self.last = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.spelling = spelling

    def forward(self, x):
        if x.sum() > -1e9:  # torch.fx cannot trace this
            pass
        if self.spelling == "input":
            x.mul_(2.0)
            x[:, 0] = 0.5
        h, g = self.first(x), self.second(x)
        if self.spelling == "augmented":
            h /= h.sum(dim=-1, keepdim=True).detach()
            h *= 3.0
        elif self.spelling == "method":
            g.add_(h).mul_(0.5)
        elif self.spelling == "setitem":
            g[:, 1:] = g[:, 1:] * 2.0 + h[:, :-1]
        elif self.spelling == "view":
            g[:, :2].mul_(3.0)
            g.narrow(1, 3, 2).add_(h[:, :2])
        elif self.spelling == "alias":
            alias = g
            g += h
            g = alias * 1.0
        elif self.spelling == "experts":  # a mixture of experts adds its experts' rows into a buffer
            buffer = torch.zeros_like(g)
            for expert, rows in ((self.first, [0, 2]), (self.second, []), (self.second, [1, 2, 3])):
                rows = torch.tensor(rows, dtype=torch.long)
                buffer.index_add_(0, rows, expert(x[rows]))
            g = buffer
        elif self.spelling == "copy":
            g[:, :2].copy_(h[:, 4:])
            g.masked_fill_(torch.arange(6) == 5, 0.25)
            g.index_add_(1, torch.tensor([0, 0, 3]), h[:, :3])
        return self.last(torch.relu(g + h))


@pytest.mark.parametrize("spelling", ["augmented", "method", "setitem", "view", "alias", "copy", "input", "experts"])
def test_writes_into_relevance_carrying_tensors_in_eager_code_equal_gradient_times_input(spelling: str) -> None:
    torch.manual_seed(5)
    model = InPlaceWrites(spelling).double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    given = x.clone()
    explain = fxlrp.convert(model, LRP0)
    assert "" in explain.report().eager_modules  # the whole model runs eagerly
    # (the reference writes into a copy of its leaf: autograd refuses writes into a leaf)
    [expected] = gradient_times_input(lambda leaf: model(leaf * 1.0), [x], lambda out: out,
                                      lambda out: onehot_relevance(out, 1))
    relevance = fxlrp.attribute(explain, x, target=1)
    assert torch.equal(x, given)  # the caller's tensor is not written into
    assert relative_error(relevance, expected) < 1e-12
    assert torch.allclose(explain(x.clone()), model(x.clone()), rtol=0, atol=1e-12)


class EagerMultiheadAttention(nn.Module):
    """nn.MultiheadAttention inside code torch.fx cannot trace reaches torch as
    F.multi_head_attention_forward (SigLIP's pooling head)."""

    def __init__(self, batch_first: bool, branch: bool = True) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.head = nn.Linear(8, 3)
        self.branch = branch

    def forward(self, x):
        if self.branch and x.sum() > -1e9:  # torch.fx cannot trace this
            x = x * 1.0
        return self.head(self.attention(x, x, x)[0]).sum(dim=1)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_run_eagerly_equals_the_graphs(batch_first: bool) -> None:
    torch.manual_seed(5)
    eager_model = EagerMultiheadAttention(batch_first).double().eval()
    traced_model = EagerMultiheadAttention(batch_first, branch=False).double().eval()
    traced_model.load_state_dict(eager_model.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    eager, traced = fxlrp.convert(eager_model), fxlrp.convert(traced_model)
    assert eager.report().capture.startswith("run eagerly") and "eager" not in traced.report().capture
    with torch.no_grad():  # (the model itself may take torch's fused inference path: rounding)
        assert relative_error(eager(x), eager_model(x)) < 1e-14
    assert relative_error(fxlrp.attribute(eager, x, target=1), fxlrp.attribute(traced, x, target=1)) < 1e-12


class InPlaceActivations(nn.Module):
    """timm's MobileViT and VGG: activation modules built with inplace=True, in code run eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        hidden = self.act(self.conv(x))
        hidden = F.relu(hidden * 2.0 - 0.1, inplace=True) if hidden.sum() > -1e9 else hidden
        hidden = F.leaky_relu(hidden - 0.2, 0.1, True)  # the flag given by position
        return self.head(hidden.mean(dim=(2, 3)))


def test_in_place_activations_in_eager_code_equal_gradient_times_input() -> None:
    torch.manual_seed(6)
    model = InPlaceActivations().double().eval()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    assert explain.report().capture.startswith("run eagerly")
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12


class SmoothInPlace(nn.Module):
    """timm's MobileViT: nn.SiLU(inplace=True) in code run eagerly (F.silu(x, inplace=True))."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.conv, self.act, self.head = nn.Conv2d(3, 4, 3), nn.SiLU(inplace=inplace), nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > -1e9:  # torch.fx cannot trace this
            x = self.act(self.conv(x))
        return self.head(F.gelu(x, approximate="tanh").mean(dim=(2, 3)))


def test_a_smooth_activation_in_place_in_eager_code_equals_its_out_of_place_form() -> None:
    torch.manual_seed(7)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    in_place, out_of_place = SmoothInPlace(True).double(), SmoothInPlace(False).double()
    out_of_place.load_state_dict(in_place.state_dict())
    relevance = fxlrp.attribute(fxlrp.convert(in_place), x, target=0)
    expected = fxlrp.attribute(fxlrp.convert(out_of_place), x, target=0)
    assert torch.equal(relevance, expected) and relevance.abs().sum() > 0


@pytest.mark.parametrize("call", ["without", "positional None", "keyword None", "positional", "keyword"])
def test_an_optional_input_left_none_takes_the_models_none_branch(call: str) -> None:
    torch.manual_seed(6)
    model = OptionalMask().double().eval()
    x = torch.randn(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1]])
    args, kwargs = {"without": ((), {}), "positional None": ((None,), {}), "keyword None": ((), {"mask": None}),
                    "positional": ((mask,), {}), "keyword": ((), {"mask": mask})}[call]
    explain = fxlrp.convert(model, LRP0)
    assert explain.report().eager_modules == {}  # the graph takes it, no eager part
    [expected] = gradient_times_input(lambda leaf: model(leaf, *args, **kwargs), [x], lambda out: out,
                                      lambda out: onehot_relevance(out, 0))
    relevance = fxlrp.attribute(lambda leaf: explain(leaf, *args, **kwargs), x, target=0)
    assert relative_error(relevance, expected) < 1e-12
    assert torch.equal(explain(x, *args, **kwargs), model(x, *args, **kwargs))
    taking, _, _ = explain.explainer_for(x, *args, **kwargs)
    assert taking.explainer_for(x, *args, **kwargs)[0] is taking  # traced once per set of missing inputs
    # the report of this call is that of the graph it runs: the mask's product only where a mask is given
    products = [row for row in explain.report(x, *args, **kwargs).rows if row.operation == "mul"]
    assert bool(products) == (call in ("positional", "keyword"))
    assert [row for row in explain.report().rows if row.operation == "mul"]  # traced with a mask


class MaskAndFlags(nn.Module):
    """timm's ViT: ``forward(x, attn_mask=None, is_causal=False)`` with ``if attn_mask is not None or
    is_causal:``, and a ``str`` setting. Traced with the flags as symbolic values the ``if`` fails
    once ``attn_mask`` is None; they are settings, traced at the values of the call."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x, attn_mask=None, is_causal: bool = False, pool: str = "sum"):
        if attn_mask is not None or is_causal:
            keep = torch.ones_like(x).tril() if attn_mask is None else attn_mask.to(x.dtype)
            x = x * keep
        hidden = torch.relu(self.layer(x))
        return hidden.sum(1) if pool == "sum" else hidden.amax(1)


@pytest.mark.parametrize("settings", [{}, {"is_causal": True}, {"pool": "max"}, {"is_causal": True, "pool": "max"},
                                      {"is_causal": False}])
def test_flags_are_traced_at_the_value_each_call_gives(settings: dict) -> None:
    torch.manual_seed(7)
    model = MaskAndFlags().double().eval()
    x = torch.randn(4, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    assert explain.report(x, **settings).eager_modules == {}  # the graph takes every call, no eager part
    taking, _, _ = explain.explainer_for(x, **settings)
    [expected] = gradient_times_input(lambda leaf: model(leaf, **settings), [x], lambda out: out.unsqueeze(1),
                                      lambda out: onehot_relevance(out, 0))
    relevance = fxlrp.attribute(lambda leaf: explain(leaf, **settings).unsqueeze(1), x, target=0)
    assert relative_error(relevance, expected) < 1e-12
    assert torch.equal(explain(x, **settings), model(x, **settings))
    assert taking.explainer_for(x, **settings)[0] is taking  # traced once per set of values


def test_a_tensor_given_for_a_flag_is_refused_with_what_to_do() -> None:
    explain = fxlrp.convert(MaskAndFlags().eval(), LRP0)
    with pytest.raises(TypeError, match=r"is_causal=Tensor was given where .* is_causal=False.*concrete_args"):
        explain(torch.randn(4, 4), is_causal=torch.tensor(True))


class TiedLanguageModel(nn.Module):
    """Output weights tied to the embedding's (checked in forward), parameters that require
    gradients (as a model fresh from its constructor), and a branch on the ids."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(7, 5)
        self.hidden = nn.Linear(5, 5)
        self.head = nn.Linear(5, 7, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids):
        if self.head.weight is not self.tokens.weight:
            raise AssertionError("the tied weights were untied")
        hidden = torch.relu(self.hidden(self.tokens(ids)))
        if int(ids[:, -1].max()) > 3:
            hidden = hidden * 2
        return self.head(hidden)[:, -1]


def test_parameters_are_detached_for_an_eager_run_tied_ones_together_and_put_back() -> None:
    torch.manual_seed(5)
    model = TiedLanguageModel().double().eval()
    parameters = dict(model.named_parameters(remove_duplicate=False))
    ids = torch.tensor([[1, 5, 6], [2, 0, 4]])
    explain = fxlrp.convert(model, LRP0)
    relevance = fxlrp.attribute(explain, ids, target=2)
    embedded = model.tokens(ids).detach().requires_grad_()
    hidden = torch.relu(model.hidden(embedded)) * 2
    output = model.head(hidden)[:, -1]
    [gradient] = torch.autograd.grad(output, [embedded], onehot_relevance(output, 2) / output.detach())
    assert relative_error(relevance, (embedded * gradient).detach().sum(dim=-1)) < 1e-12
    assert dict(model.named_parameters(remove_duplicate=False)) == parameters  # the same objects
    assert model.head.weight is model.tokens.weight
    assert all(isinstance(parameter, nn.Parameter) and parameter.requires_grad and parameter.grad is None
               for parameter in model.parameters())


class Positive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > -1e9:  # torch.fx cannot trace this
            x = torch.positive(x)
        return self.layer(x)


def test_an_operation_registered_after_an_eager_run_is_used_at_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """How an eager part handles each torch function is looked up once; a change of the registry
    (an integration loaded later, a user's extension) must reach the next run."""
    from fxlrp.errors import UnsupportedOperationError
    from fxlrp.explain.loader import load_integrations
    from fxlrp.registry import REGISTRY

    # The copies below are the whole registry - the core's operations and those of the libraries
    # imported by now (PyG's, whose wrapper of torch.index_select other tests' imports put in place)
    # - which undoing gives back.
    load_integrations()
    for name in ("operations", "_by_function", "_functions", "_by_method", "_by_module", "_by_base_module"):
        monkeypatch.setattr(REGISTRY, name, dict(getattr(REGISTRY, name)))
    torch.manual_seed(2)
    model = Positive().double().eval()
    x = torch.randn(2, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    with pytest.raises(UnsupportedOperationError, match="positive"):
        fxlrp.attribute(explain, x, target=1)
    REGISTRY.extend("view", functions=(torch.positive,))
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12


def test_the_observer_sees_each_call_of_a_part_run_eagerly_as_the_module_code_makes_it() -> None:
    # benchmarks/timm_sweep.py counts coverage of eager parts this way: every torch call of the
    # module's own code whose result carries relevance, seen from an interpretation that runs a
    # module (not one of fxlrp's decompositions). The reference count: the same forward under a
    # plain TorchFunctionMode, an input that requires grad standing for relevance.
    from torch.overrides import TorchFunctionMode

    from fxlrp.eager.rule_choice import current_observer, operations_observed

    class Counting(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, function, types, args=(), kwargs=None):
            result = function(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and result.requires_grad:
                self.calls.append(getattr(function, "__name__", str(function)))
            return result

    torch.manual_seed(3)
    model = Network(branch=True).eval().requires_grad_(False)
    x = torch.rand(1, 3, 7, 7)
    leaf = x.clone().requires_grad_()
    with Counting() as reference:
        model(leaf)
    explain = fxlrp.convert(model, capture="eager")
    for _ in range(3):  # (observed, the second and third calls run in the relevance mode too, not replayed)
        seen: list[tuple[bool, str]] = []
        def observe(interpretation, name, has_rule, seen=seen):
            seen.append((interpretation.runs_module, name))

        with operations_observed(observe):
            fxlrp.attribute(explain, x, target=0)
        assert len(reference.calls) > 5
        assert len([name for runs_module, name in seen if runs_module]) == len(reference.calls)
    assert current_observer() is None


class NumpyConstants(nn.Module):
    """Constants NumPy made (CTRL scales its embeddings by ``np.sqrt(d_model)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 6)

    def forward(self, x):
        return self.layer(x).reshape(-1, np.int64(2), 3).sum(dim=1) * np.sqrt(4.0)


@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_numpy_constants_in_graphs_and_recordings(capture: str) -> None:
    """A graph's code took NumPy scalars as written (``np.float64(2.0)``) and failed at its run
    for want of ``np``; torch.fx refused ``np.int64`` (and so ran the model eagerly). Both paths,
    three calls each (the second records, the third replays), against gradient x input."""
    torch.manual_seed(0)
    model, x = NumpyConstants().double(), torch.randn(4, 3, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0, capture=capture)
    assert (str(explain.report()).splitlines()[-1] == "captured by torch.fx") is (capture == "auto")
    [expected] = gradient_times_input(model, [x], lambda output: output, onehot_relevance)
    for _ in range(3):
        assert torch.equal(explain(x), model(x))
        assert relative_error(fxlrp.attribute(explain, x, target=0), expected) < 1e-12


class GradientsOffInside(nn.Module):
    """A branch computed with gradients off (HRM runs its early recurrent cycles so)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept, self.cut, self.head = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        kept = self.kept(x)
        with torch.no_grad():
            cut = torch.relu(self.cut(x))
        return self.head(kept + cut)


@pytest.mark.parametrize("converted_without_gradients", [False, True])
@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_relevance_does_not_pass_where_the_model_turns_gradients_off(capture: str,
                                                                      converted_without_gradients: bool) -> None:
    """torch.fx graphs and recordings do not keep the grad mode: relevance went through the
    branch the model computes under ``torch.no_grad()`` in captured graphs and in replays, and
    not on the first eager call (HRM's replays 19% off its first explanation). Against the
    model's own gradient x input (LRP-0), which the branch does not reach: three calls each."""
    torch.manual_seed(0)
    model, x = GradientsOffInside().double(), torch.randn(4, 3, dtype=torch.float64)
    with torch.set_grad_enabled(not converted_without_gradients):
        explain = fxlrp.convert(model, LRP0, capture=capture)
    [expected] = gradient_times_input(model, [x], lambda output: output, onehot_relevance)
    for _ in range(3):
        assert torch.equal(explain(x), model(x))
        assert relative_error(fxlrp.attribute(explain, x, target=0), expected) < 1e-12


class HandsOnKeywords(nn.Module):
    """An untraceable forward that hands its ``**kwargs`` to a layer taking only what it names
    (Hugging Face's TimmWrapper hands them to a timm model)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Scaled()

    def forward(self, x, **kwargs):
        if x.sum() > 1e9:  # (a branch on values: torch.fx cannot trace it)
            x = -x
        return self.inner(x, **kwargs)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)

    def forward(self, x, scale: float = 1.0):
        return self.layer(x) * scale


@pytest.mark.parametrize("keywords", [{}, {"scale": 3.0}])
def test_keywords_of_a_model_run_eagerly_reach_its_code_and_no_others(keywords: dict) -> None:
    """The model's ``**kwargs`` came with fxlrp's own keyword for them in it: a layer given them
    failed with an error naming fxlrp's internals (TimmWrapperForImageClassification)."""
    torch.manual_seed(0)
    model, x = HandsOnKeywords().double(), torch.randn(4, 3, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    [expected] = gradient_times_input(lambda value: model(value, **keywords), [x], lambda output: output,
                                      onehot_relevance)
    for _ in range(3):
        assert torch.equal(explain(x, **keywords), model(x, **keywords))
        [relevance] = explained_relevance(lambda value: explain(value, **keywords), [x], onehot_relevance)
        assert relative_error(relevance, expected) < 1e-12


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projection = nn.Linear(5, 5)

    def forward(self, x):
        return torch.relu(self.projection(x))


class Sparse(Dense):
    def forward(self, x):
        return torch.relu(self.projection(x)) * 3.0


class SwitchesToANewModule(nn.Module):
    """BigBird: a short input switches the attention to a new module (its own layers initialised,
    then replaced by the old module's) from inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.attention, self.head = Sparse(), nn.Linear(5, 3)

    def forward(self, x):
        if x.shape[-2] < 8 and isinstance(self.attention, Sparse):
            dense = Dense()
            dense.projection = self.attention.projection
            self.attention = dense
        return self.head(self.attention(x)).sum(-2)


class BuildsALayer(nn.Module):
    """A layer built in ``forward`` from the model's buffers, and a product with its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(3, 5))

    def forward(self, x):
        layer = nn.Linear(5, 3, bias=False, dtype=self.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(self.weight)
        return (layer(x.abs()) + (layer.weight @ x.transpose(-1, -2)).transpose(-1, -2)).sum(-2)


@pytest.mark.parametrize("model_type", [SwitchesToANewModule, BuildsALayer])
@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_modules_the_model_builds_while_it_runs(model_type: type[nn.Module], capture: str) -> None:
    """The parameters of a module built inside ``forward`` require gradients, and were taken for
    relevance-carrying tensors: their initialisation was refused as operations without a rule
    (BigBird, which switches to full attention for a short input). They are constants, like the
    model's own parameters: three calls each (the second records, the third replays), against the
    gradient x input of the model, which is left as it was."""
    torch.manual_seed(0)
    model, x = model_type().double(), torch.randn(2, 4, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0, capture=capture)
    for _ in range(3):
        relevance = fxlrp.attribute(explain, x, target=1)
        assert getattr(model, "attention", Sparse()).__class__ is Sparse  # the model's own switch is not made
    [expected] = gradient_times_input(model, [x], lambda output: output, lambda output: output * F.one_hot(
        torch.tensor(1), 3).to(output))
    assert relative_error(relevance, expected) < 1e-12


class Transposes(nn.Module):
    """Transposes read as properties, in code torch.fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 1e9:  # (a branch on values: torch.fx cannot trace it)
            x = -x
        hidden = self.layer(x).mT  # (batch, 4, length)
        return (hidden.mH @ self.layer.weight.T).relu().sum(-2) + x[0].T.sum(-1)


def test_transposes_read_as_properties_in_eager_code() -> None:
    """``x.T``, ``x.mT``, ``x.mH`` call the property's getter, which code run eagerly did not match
    to the view it is: refused as an operation without a rule. Three calls (the second records,
    the third replays) against gradient x input."""
    torch.manual_seed(0)
    model, x = Transposes().double(), torch.randn(4, 3, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    [expected] = gradient_times_input(model, [x], lambda output: output, onehot_relevance)
    for _ in range(3):
        assert torch.equal(explain(x), model(x))
        assert relative_error(fxlrp.attribute(explain, x, target=0), expected) < 1e-12


class SlidingWindows(nn.Module):
    """Overlapping windows of a sequence made by ``as_strided`` (Longformer's and LED's local
    attention chunks its sequence so), each window summed; eagerly or captured."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.spelling, self.layer, self.head = spelling, nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, x):  # x: (batch, 6, 3)
        hidden = torch.relu(self.layer(x)).contiguous()
        size, stride = (hidden.shape[0], 2, 4, 3), (18, 6, 3, 1)  # 2 windows of 4 steps, half overlapping
        windows = hidden.as_strided(size, stride) if self.spelling == "method" else torch.as_strided(
            hidden, size, stride)
        return self.head(windows.sum(2)).sum(1)


@pytest.mark.parametrize("spelling", ["method", "function"])
@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_overlapping_windows_made_by_as_strided_route_relevance_to_each_value(capture: str, spelling: str) -> None:
    """``as_strided`` had no rule (Longformer and LED were refused): it is a view, whose values may
    repeat, and its gradient adds up what reaches each value, as for any gather. Three calls
    against gradient x input (LRP-0)."""
    torch.manual_seed(0)
    model, x = SlidingWindows(spelling).double(), torch.randn(2, 6, 3, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0, capture=capture)
    [expected] = gradient_times_input(model, [x], lambda output: output, onehot_relevance)
    for _ in range(3):
        assert torch.equal(explain(x), model(x))
        assert relative_error(fxlrp.attribute(explain, x, target=0), expected) < 1e-12
