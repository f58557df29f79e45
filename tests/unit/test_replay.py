"""Parts run eagerly are recorded at the second call of an input signature and replayed as graphs.

References: gradient x input for LRP-0 (float64), and the relevance mode itself - a fresh
explainer's first call of each input runs the part under the relevance mode, which is tested
against graphs, zennit and LXT elsewhere. What a replay must never do: bake a decision the code
took on values (an input's, a parameter's) or hand back a stale object.
"""

from __future__ import annotations

import inspect
import weakref

import pytest
import torch
from support.references import LRP0, gradient_times_input, onehot_relevance, recordings, relative_error
from torch import nn

import fxlrp
from fxlrp.eager.replay import KEPT
from fxlrp.rules import Epsilon, Gamma
from fxlrp.rules.composites import Composite, EpsilonPlusFlat


class PerToken(nn.Module):
    """A loop over the tokens (``range(x.shape[1])``): torch.fx cannot trace it, a recording can."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix, self.head = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        hidden = torch.relu(self.embed(x))
        steps = [torch.relu(self.mix(hidden[:, index])) * (index + 1) for index in range(x.shape[1])]
        pooled = torch.stack(steps, dim=1).sum(dim=1)
        if x.shape[1] > 3:  # a branch on a shape: each length records its own graph
            pooled = pooled - hidden.mean(dim=1)
        return self.head(pooled)


class Wrapped(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.stem, self.inner, self.out = nn.Linear(4, 4), inner, nn.Linear(3, 2)

    def forward(self, x):
        return self.out(torch.relu(self.inner(torch.relu(self.stem(x)))))


def _fresh_relevance(model: nn.Module, composite, x: torch.Tensor) -> torch.Tensor:
    """The relevance mode's relevance: a new explainer's first call."""
    return fxlrp.attribute(fxlrp.convert(model, composite), x, target=1)


@pytest.mark.parametrize("wrapped", [False, True], ids=["whole", "inside"])
@pytest.mark.parametrize("composite", [LRP0, EpsilonPlusFlat(), Composite(
    Epsilon(1e-3), name_rules={"mix": Gamma(0.25), "inner.mix": Gamma(0.25)})], ids=["lrp0", "plusflat", "names"])
def test_replays_equal_the_relevance_mode(wrapped: bool, composite) -> None:
    """Replayed calls of two lengths (two graphs, the shape branch taken differently), against
    the relevance mode with the same rules (first layer and name rules inside the part), and
    LRP-0 against gradient x input."""
    torch.manual_seed(0)
    model = (Wrapped(PerToken()) if wrapped else PerToken()).double().eval()
    explain = fxlrp.convert(model, composite)
    for length in (3, 5, 3, 5, 3, 5):
        x = torch.randn(2, length, 4, dtype=torch.float64)
        with torch.no_grad():
            assert torch.equal(explain(x), model(x))  # (the signature without gradients)
        relevance = fxlrp.attribute(explain, x, target=1)
        assert relative_error(relevance, _fresh_relevance(model, composite, x)) < 1e-12
        if composite is LRP0:
            [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
            assert relative_error(relevance, expected) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 4 and not recorded.refused  # 2 lengths x with and without gradients


class ValueBranch(nn.Module):
    """A branch on the input's values inside a loop over tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.mix, self.positive, self.negative = nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        hidden = torch.stack([self.mix(x[:, index]) for index in range(x.shape[1])], dim=1).sum(dim=1)
        if hidden.sum() > 0:
            return self.positive(hidden)
        return self.negative(hidden) * 2


class ParameterBranch(PerToken):
    """A branch on a parameter's value, which may be changed in place between calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.ones(()))

    def forward(self, x):
        out = super().forward(x)
        return out if self.gate > 0 else -2 * out


def _both_branches_as_gradient_times_input(model: nn.Module, offset: float):
    """Inputs of one signature whose values take the model's branch both ways (the sign of
    ``model.mix``'s outputs): every call's LRP-0 relevance is gradient x input. Returns the
    recordings of the model's part run eagerly."""
    explain = fxlrp.convert(model, LRP0)
    taken = set()
    for sign in (1.0, 1.0, -1.0, -1.0, 1.0):
        x = sign * (torch.rand(2, 3, 4, dtype=torch.float64) + offset)
        with torch.no_grad():
            taken.add(bool(model.mix(x).sum() > 0))
        relevance = fxlrp.attribute(explain, x, target=1)
        [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(relevance, expected) < 1e-12
    assert len(taken) == 2
    [recorded] = recordings(explain)
    return recorded


def test_a_branch_on_values_is_never_recorded() -> None:
    """The inputs' (and a parameter's) values decide a branch: the same signature takes both
    branches, and every call is the relevance mode's (gradient x input under LRP-0)."""
    torch.manual_seed(0)
    recorded = _both_branches_as_gradient_times_input(ValueBranch().double().eval(), offset=0.5)
    [reason] = recorded.refused.values()
    # the whole reason, ending with the model's line: where to look
    line = inspect.getsourcelines(ValueBranch.forward)[1] + 2
    assert not recorded.replays and "reads values of the run" in reason
    assert reason.endswith(f'test_replay.py", line {line}, in forward: if hidden.sum() > 0:'), reason
    assert reason in str(recorded.summary())

    model = ParameterBranch().double().eval()
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    for gate in (1.0, 1.0, 1.0, -1.0, -1.0):
        with torch.no_grad():
            model.gate.fill_(gate)  # in place: the explainer follows the value
        relevance = fxlrp.attribute(explain, x, target=1)
        [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(relevance, expected) < 1e-12
    [recorded] = recordings(explain)
    assert not recorded.replays


class WritesIntoItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        x.mul_(2)
        x[:, 0] = self.mix(x[:, 1])
        steps = [self.mix(x[:, index]) for index in range(x.shape[1])]
        return self.head(torch.stack(steps, dim=1).sum(dim=1))


def test_a_recording_does_not_write_into_the_callers_tensors() -> None:
    torch.manual_seed(0)
    model = WritesIntoItsInput().double().eval()
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    given = x.clone()
    results = [fxlrp.attribute(explain, x, target=1) for _ in range(3)]
    assert torch.equal(x, given)
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 1
    for relevance in results[1:]:
        assert relative_error(relevance, results[0]) < 1e-12
    with torch.no_grad():
        for _ in range(3):  # (the model writes into the tensor it is given, so each call gets a copy)
            assert torch.equal(explain(x.clone()), model(x.clone()))


KEPT_STEPS: list[int] = []
"""Per run of :class:`DropsItsSteps`, how many of its dropped tensors were still alive at the end
(outside the model: fxlrp gives the model's state back as it was after each run)."""


class DropsItsSteps(nn.Module):
    """A loop over the tokens whose per-step tensors the code drops once added (no backward
    keeps them: a product with a number, a sum): weak references say which the run kept."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        total, steps = torch.zeros_like(x[:, 0]), []
        for index in range(x.shape[1]):
            step = x[:, index] * 2.0 + 1.0
            steps.append(weakref.ref(step))
            total = total + step
        KEPT_STEPS.append(sum(step() is not None for step in steps[:-1]))
        return self.head(total)


def test_a_recording_frees_what_the_run_drops() -> None:
    """The recorded run (the signature's second call) frees the tensors the code no longer uses,
    as an unrecorded run does, instead of keeping every value of the forward alive; the replay's
    relevance is gradient x input's (LRP-0)."""
    torch.manual_seed(0)
    model = DropsItsSteps().double().eval()
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    KEPT_STEPS.clear()
    for _ in range(3):
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 1
    assert KEPT_STEPS == [0, 0]  # (the first run's, then the recorded run's; the replay runs no code)


class Noisy(PerToken):
    def forward(self, x):
        return super().forward(x + 1e-3 * torch.randn_like(x))


def test_random_operations_are_never_recorded() -> None:
    explain = fxlrp.convert(Noisy().eval(), LRP0)
    x = torch.randn(2, 4, 4)
    for _ in range(3):
        fxlrp.attribute(explain, x, target=1)
    [recorded] = recordings(explain)
    assert not recorded.replays and "differ from run to run" in next(iter(recorded.refused.values()))


def test_only_the_latest_signatures_are_kept() -> None:
    torch.manual_seed(0)
    model = PerToken().double().eval()
    explain = fxlrp.convert(model, LRP0)
    lengths = list(range(1, KEPT + 3))
    for length in [*lengths, *lengths]:
        x = torch.randn(1, length, 4, dtype=torch.float64)
        relevance = fxlrp.attribute(explain, x, target=1)
        [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(relevance, expected) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == KEPT


class OutputOfAClassMadePerCall(nn.Module):
    """Returns an object of a class made at each call, whose tensor is a class attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = PerToken()

    def forward(self, x):
        return type("Output", (), {"logits": self.inner(x)})()


def test_an_output_holding_the_runs_tensor_in_its_class_is_never_recorded() -> None:
    """A copy of such an output would hand back the recorded run's tensor: relevance 0 from the
    second call on (before). It runs eagerly at every call, with the relevance mode's relevance."""
    torch.manual_seed(0)
    model = OutputOfAClassMadePerCall().double().eval()
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    [expected] = gradient_times_input(model.inner, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    for _ in range(3):
        relevance = fxlrp.attribute(explain, x, target=1, output=lambda out: out.logits)
        assert relative_error(relevance, expected) < 1e-12
    assert all(not recorded.replays for recorded in recordings(explain))


class WritesThroughAView(nn.Module):
    """A fresh buffer written through a view with values of the input; Python then reads the
    buffer: its value depends on the input, though the buffer was made from a shape."""

    def __init__(self) -> None:
        super().__init__()
        self.mix, self.positive, self.negative = nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        totals = torch.zeros(x.shape[0], x.shape[1], dtype=x.dtype)
        for index in range(x.shape[1]):
            totals[:, index].add_(self.mix(x[:, index]).sum(dim=-1))
        hidden = self.mix(x).sum(dim=1)
        if totals.sum() > 0:
            return self.positive(hidden)
        return self.negative(hidden)


def test_values_written_through_a_view_are_values_of_the_run() -> None:
    torch.manual_seed(0)
    recorded = _both_branches_as_gradient_times_input(WritesThroughAView().double().eval(), offset=2.0)
    assert not recorded.replays



class DropsOut(PerToken):
    """Functional dropout left in training form (``F.dropout``'s default): the identity at
    explanation time, in the relevance mode and in a replay alike."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        return super().forward(torch.nn.functional.dropout(x, self.p) if self.p else x)


def test_dropout_is_recorded_as_the_identity() -> None:
    torch.manual_seed(0)
    model = DropsOut(0.5).double().eval()
    without = DropsOut(0.0).double().eval()
    without.load_state_dict(model.state_dict())
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    [expected] = gradient_times_input(without, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    for _ in range(3):
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 1


def test_the_report_says_what_each_part_run_eagerly_replays_and_why_not() -> None:
    """explain.report() counts the recorded graphs of each part run eagerly and gives, once, the
    reason a signature keeps running eagerly."""
    torch.manual_seed(0)
    explain = fxlrp.convert(Wrapped(PerToken()).double().eval(), LRP0)
    assert "recorded runs" not in str(explain.report())  # nothing run yet
    for length in (3, 3, 5, 5, 5):
        fxlrp.attribute(explain, torch.randn(2, length, 4, dtype=torch.float64), target=1)
    [[size_3, size_5]] = [[len(replay.graph_module.graph.nodes) for replay in recorded.replays.values()]
                          for recorded in recordings(explain)]
    assert str(explain.report()).splitlines()[-1] == (
        f"recorded runs of inner: 2 input signature(s) replayed as recorded graphs ({size_3}, {size_5} nodes)")

    branching = fxlrp.convert(ValueBranch().double().eval(), LRP0)
    for _ in range(3):
        fxlrp.attribute(branching, torch.rand(2, 3, 4, dtype=torch.float64), target=1)
    last = str(branching.report()).splitlines()[-1]
    assert last.startswith("recorded runs of the whole model: no recorded graph; 1 signature(s) run eagerly, "
                           "not recorded: Python reads values of the run (__bool__) at ")


class RolesThroughViews(nn.Module):
    """Attention weights, a gate and a gating activation reach their products through views (two
    transposes, a copy, a cast, a slice, reshapes), as in Hugging Face's eager attention; a loop
    over the tokens keeps it from torch.fx. ``held``: the reference, with the outputs CP-LRP
    treats as constants detached."""

    def __init__(self, held: bool = False) -> None:
        super().__init__()
        self.held = held
        self.q, self.k, self.v, self.up = (nn.Linear(4, 4) for _ in range(4))
        self.gate, self.activated, self.head = nn.Linear(4, 6), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        x = torch.stack([x[:, index] for index in range(x.shape[1])], dim=1)
        hold = torch.Tensor.detach if self.held else (lambda value: value)
        weights = hold(torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1))
        weights = weights.transpose(-1, -2).contiguous().transpose(-1, -2).to(x.dtype)
        gate = hold(torch.sigmoid(self.gate(x)))[..., :4]
        activation = hold(torch.nn.functional.silu(self.activated(x))).reshape(x.shape[0], -1).view(x.shape)
        return self.head((weights @ self.v(x)) * gate + activation * self.up(x)).sum(dim=1)


def test_roles_reach_products_through_views_in_a_replay() -> None:
    """CP-LRP(0) holds attention weights, gates and gating activations constant: each product's
    other factor takes its relevance, which is gradient x input of the model with those outputs
    detached. The roles pass through the views of the replayed graph (where views that can hand
    on no role are plain calls); without them each product would split its relevance."""
    from fxlrp.rules.composites import CPLRP

    torch.manual_seed(0)
    model = RolesThroughViews().double().eval()
    reference_model = RolesThroughViews(held=True).double().eval()
    reference_model.load_state_dict(model.state_dict())
    explain = fxlrp.convert(model, CPLRP(0.0))
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    [expected] = gradient_times_input(reference_model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    for _ in range(3):  # relevance mode, recording, replay
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 1 and not recorded.refused


class GatedPerToken(nn.Module):
    """A product of two relevance-carrying factors after a loop over the tokens (run eagerly)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.left, self.right, self.head = (nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 6),
                                                        nn.Linear(6, 3))

    def forward(self, x):
        hidden = torch.stack([torch.relu(self.embed(x[:, index])) for index in range(x.shape[1])], dim=1)
        return self.head((self.left(hidden) * -self.right(hidden)).sum(dim=1))


def test_a_replay_in_the_gradient_form_keeps_the_rule_of_a_product_of_two_carriers() -> None:
    """Under LRP-0 the replay runs layers, sums, the negation as plain calls, but not the product
    of two relevance-carrying factors: its uniform rule gives each half of its relevance, where
    gradient x input gives each all of it. Everything else is LRP-0 = gradient x input, so the
    relevance is half of gradient x input (a plain call there: twice it)."""
    torch.manual_seed(0)
    model = GatedPerToken().double().eval()
    explain = fxlrp.convert(model, LRP0)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    for _ in range(3):  # relevance mode, recording, replay
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected / 2) < 1e-12
    assert explain.gradient_form
    # The explainer's own forward carries relevance itself (the relevance form): a graph of its
    # own, recorded at its second call (the gradient form's would give gradient x input).
    for _ in range(3):
        leaf = x.clone().requires_grad_()
        output = explain(leaf)
        [relevance] = torch.autograd.grad(output, leaf, onehot_relevance(output, 1))
        assert relative_error(relevance, expected / 2) < 1e-12
    [recorded] = recordings(explain)
    assert len(recorded.replays) == 2 and not recorded.refused


class HalvedGradient(Epsilon):
    """A user's rule whose gradient form is not the layer's gradient: LRP-0 at half strength."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def gradient_forward(self, layer, inputs):
        from fxlrp.relevance.form import scaled_gradient

        return scaled_gradient(layer.forward(inputs), 0.5)

    def gradient_is_native(self) -> bool:
        return False


class LayersPerToken(GatedPerToken):
    def forward(self, x):
        hidden = torch.stack([torch.relu(self.embed(x[:, index])) for index in range(x.shape[1])], dim=1)
        return self.head(hidden.sum(dim=1))


def test_a_replay_in_the_gradient_form_keeps_a_rule_whose_gradient_is_not_native() -> None:
    """Only rules whose gradient form is the native gradient make a layer a plain call; a rule of
    the user's that modifies it keeps running (two linear layers at half strength: 1/4 of
    gradient x input)."""
    torch.manual_seed(0)
    model = LayersPerToken().double().eval()
    explain = fxlrp.convert(model, Composite(LRP0, type_rules={nn.Linear: HalvedGradient()}))
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    for _ in range(3):  # relevance mode, recording, replay
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected / 4) < 1e-12
    assert explain.gradient_form


class RepeatedBy(PerToken):
    """``repeat_interleave`` by an int (GPT-J's rotary sines: a shape of the signature) or by
    counts computed from the input (a shape of the run's values)."""

    def __init__(self, counts_from_input: bool) -> None:
        super().__init__()
        self.counts_from_input = counts_from_input

    def forward(self, x):
        hidden = torch.relu(self.embed(x))
        if self.counts_from_input:
            counts = (x[0, :, 0] > 0).long() + 1
            repeated = hidden.repeat_interleave(counts, dim=1)
        else:
            repeated = torch.repeat_interleave(hidden, 2, 1)
        steps = [torch.relu(self.mix(repeated[:, index])) for index in range(repeated.shape[1])]
        return self.head(torch.stack(steps, dim=1).sum(dim=1))


@pytest.mark.parametrize("counts_from_input", [False, True])
def test_repeat_interleave_is_recorded_where_its_repeats_are_no_values_of_the_run(counts_from_input: bool) -> None:
    """By an int the shape is the signature's: recorded and replayed. By counts from the input,
    never: inputs of one signature repeat differently (gradient x input each call, LRP-0)."""
    torch.manual_seed(0)
    model = RepeatedBy(counts_from_input).double().eval()
    explain = fxlrp.convert(model, LRP0)
    for seed in range(4):
        x = torch.randn(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        relevance = fxlrp.attribute(explain, x, target=1)
        [expected] = gradient_times_input(model, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(relevance, expected) < 1e-12
    [recorded] = recordings(explain)
    if counts_from_input:
        assert not recorded.replays and "shape depends on values" in next(iter(recorded.refused.values()))
    else:
        assert len(recorded.replays) == 1 and not recorded.refused
