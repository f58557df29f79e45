"""Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their cells) under Arras et al.'s rule,
in float64, against references that do not use fxlrp:

- a ReLU ``nn.RNN`` is piecewise linear, so LRP-0 equals gradient x input;
- LSTM, GRU and tanh RNN against the rule written out by hand below: a loop over the timesteps
  for the forward pass, then the backward LRP pass with the epsilon rule on each linear map from
  its dense weight matrices, the z-rule on the sums, the identity on tanh, gates constant
  (signal-take-all);
- conservation where the rule conserves (no bias, LRP-0), and the leak where it does not;
- outputs bit-equal to the module's, and a clear error for packed sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from support.references import gradient_times_input, onehot_relevance, relative_error
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

import fxlrp
from fxlrp.errors import UnsupportedOperationError
from fxlrp.rules.composites import CPLRP, AttnLRP, Composite

TOLERANCE = 1e-10
LENGTH, BATCH, FEATURES, HIDDEN = 5, 2, 3, 4


def random(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def recurrent(kind: type[nn.Module], seed: int = 0, **settings: object) -> nn.Module:
    torch.manual_seed(seed)
    module = kind(FEATURES, HIDDEN, **settings).double()
    with torch.no_grad():  # weights of order 1, so that gates and tanh are not all saturated or linear
        for parameter in module.parameters():
            parameter.mul_(2.0)
    return module


class LayerOutputs(nn.Module):
    """``(output, *final states)`` of a recurrent layer run from its default zero state."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.pair = isinstance(layer, (nn.LSTM, nn.LSTMCell))

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        output, finals = self.layer(x)
        return self.flat(output, finals)

    def flat(self, output: Tensor, finals: tuple[Tensor, Tensor] | Tensor) -> tuple[Tensor, ...]:
        if self.pair:
            h, c = finals
            return output, h, c
        return output, finals


class LayerOutputsFromState(LayerOutputs):
    """The same from a given initial state ``h0`` (and ``c0`` for an LSTM)."""

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor | None = None) -> tuple[Tensor, ...]:
        output, finals = self.layer(x, (h0, c0) if self.pair else h0)
        return self.flat(output, finals)


class CellLoop(LayerOutputs):
    """A cell run over ``steps`` timesteps (time first), as the cells' documentation shows."""

    def __init__(self, cell: nn.Module, steps: int) -> None:
        super().__init__(cell)
        self.steps = steps

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor | None = None) -> tuple[Tensor, ...]:
        outputs, h, c = [], h0, c0
        for time in range(self.steps):
            if self.pair:
                h, c = self.layer(x[time], (h, c))
            else:
                h = self.layer(x[time], h)
            outputs.append(h)
        finals = (h, c) if self.pair else h
        return self.flat(torch.stack(outputs), finals)


# --- the reference: Arras et al.'s rule by hand ---------------------------------------------------


def stabilised(z: Tensor, epsilon: float) -> Tensor:
    return z + epsilon * (z.sign() + (z == 0).to(z.dtype))


def share(part: Tensor, whole: Tensor) -> Tensor:
    """``part / whole`` with 0 where ``whole == 0`` (relevance there is dropped)."""
    return torch.where(whole == 0, torch.zeros_like(part), part / torch.where(whole == 0, 1.0, whole))


def epsilon_rule(x: Tensor, weight: Tensor, z: Tensor, relevance: Tensor, epsilon: float) -> Tensor:
    """``R_x = x * W^T (R / s(z))`` for ``z = W x + b`` (rows: batch), from the dense matrix ``W``."""
    return x * (share(relevance, stabilised(z, epsilon)) @ weight)


@dataclass
class Weights:
    w_ih: Tensor
    w_hh: Tensor
    b_ih: Tensor
    b_hh: Tensor
    w_hr: Tensor | None


def weights_of(module: nn.Module, suffix: str) -> Weights:
    def get(name: str) -> Tensor | None:
        value = getattr(module, name + suffix, None)
        return None if value is None else value.detach()

    w_ih, w_hh = get("weight_ih"), get("weight_hh")
    zeros = torch.zeros(w_ih.shape[0], dtype=w_ih.dtype)
    b_ih, b_hh = get("bias_ih"), get("bias_hh")
    return Weights(w_ih, w_hh, zeros if b_ih is None else b_ih, zeros if b_hh is None else b_hh, get("weight_hr"))


def lstm_forward(w: Weights, x: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], dict]:
    h, c = state
    z = x @ w.w_ih.T + w.b_ih + h @ w.w_hh.T + w.b_hh
    size = z.shape[-1] // 4
    i, f, z_g, o = (z[:, k * size:(k + 1) * size] for k in range(4))
    i, f, o, g = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o), torch.tanh(z_g)
    c_new = f * c + i * g
    m = o * torch.tanh(c_new)
    h_new = m if w.w_hr is None else m @ w.w_hr.T
    return (h_new, c_new), dict(x=x, h=h, c=c, i=i, f=f, g=g, z_g=z_g, c_new=c_new, m=m, h_new=h_new, size=size)


def lstm_backward(w: Weights, record: dict, relevance: tuple[Tensor, ...], epsilon: float) -> tuple[Tensor, ...]:
    """``(R_x, R_h_prev, R_c_prev)`` from ``(R_h_new, R_c_new)``."""
    relevance_h, relevance_c = relevance
    size = record["size"]
    if w.w_hr is None:
        relevance_m = relevance_h
    else:  # projection h = W_hr m, no bias
        relevance_m = epsilon_rule(record["m"], w.w_hr, record["h_new"], relevance_h, epsilon)
    relevance_c = relevance_c + relevance_m  # o is a gate, tanh the identity
    c_new = record["c_new"]
    relevance_previous_c = share(record["f"] * record["c"], c_new) * relevance_c  # z-rule on the sum
    relevance_g = share(record["i"] * record["g"], c_new) * relevance_c  # i is a gate, tanh(z_g) identity
    rows = slice(2 * size, 3 * size)
    stabilised_share = share(relevance_g, stabilised(record["z_g"], epsilon))  # one map over [x; h]
    relevance_x = record["x"] * (stabilised_share @ w.w_ih[rows])
    relevance_h_previous = record["h"] * (stabilised_share @ w.w_hh[rows])
    return relevance_x, relevance_h_previous, relevance_previous_c


def gru_forward(w: Weights, x: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], dict]:
    (h,) = state
    gi, gh = x @ w.w_ih.T + w.b_ih, h @ w.w_hh.T + w.b_hh
    size = gi.shape[-1] // 3
    r = torch.sigmoid(gi[:, :size] + gh[:, :size])
    u = torch.sigmoid(gi[:, size:2 * size] + gh[:, size:2 * size])
    a, b = gi[:, 2 * size:], gh[:, 2 * size:]
    pre = a + r * b
    n = torch.tanh(pre)
    h_new = (1 - u) * n + u * h
    return (h_new,), dict(x=x, h=h, r=r, u=u, a=a, b=b, pre=pre, n=n, h_new=h_new, size=size)


def gru_backward(w: Weights, record: dict, relevance: tuple[Tensor, ...], epsilon: float) -> tuple[Tensor, ...]:
    (relevance_h,) = relevance
    size, h_new, pre = record["size"], record["h_new"], record["pre"]
    relevance_n = share((1 - record["u"]) * record["n"], h_new) * relevance_h  # (1 - u) a gate
    relevance_h_direct = share(record["u"] * record["h"], h_new) * relevance_h  # u a gate
    relevance_a = share(record["a"], pre) * relevance_n  # tanh identity, z-rule on a + r b
    relevance_b = share(record["r"] * record["b"], pre) * relevance_n  # r a gate: b takes all
    rows = slice(2 * size, 3 * size)
    relevance_x = epsilon_rule(record["x"], w.w_ih[rows], record["a"], relevance_a, epsilon)
    relevance_h_linear = epsilon_rule(record["h"], w.w_hh[rows], record["b"], relevance_b, epsilon)
    return relevance_x, relevance_h_direct + relevance_h_linear


def tanh_rnn_forward(w: Weights, x: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], dict]:
    (h,) = state
    z = x @ w.w_ih.T + w.b_ih + h @ w.w_hh.T + w.b_hh
    return (torch.tanh(z),), dict(x=x, h=h, z=z)


def tanh_rnn_backward(w: Weights, record: dict, relevance: tuple[Tensor, ...], epsilon: float) -> tuple[Tensor, ...]:
    stabilised_share = share(relevance[0], stabilised(record["z"], epsilon))  # tanh identity; one map over [x; h]
    return record["x"] * (stabilised_share @ w.w_ih), record["h"] * (stabilised_share @ w.w_hh)


RULES = {"LSTM": (lstm_forward, lstm_backward), "GRU": (gru_forward, gru_backward),
         "RNN_TANH": (tanh_rnn_forward, tanh_rnn_backward)}


def arras_reference(
    mode: str, weights: Sequence[Weights], num_layers: int, bidirectional: bool, x: Tensor,
    states: Sequence[Tensor], output_relevance: Tensor, final_relevance: Sequence[Tensor], epsilon: float,
) -> tuple[Tensor, list[Tensor]]:
    """Input and initial-state relevance. Time-major ``x`` ``[T, B, F]``; ``states``, ``final_relevance``:
    ``[layers * directions, B, size]`` each; ``weights[layer * directions + direction]``."""
    forward, backward = RULES[mode]
    directions = 2 if bidirectional else 1
    length = x.shape[0]
    layer_inputs, records = [], []
    sequence = x
    for layer in range(num_layers):
        layer_inputs.append(sequence)
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            state = tuple(value[index] for value in states)
            hidden, steps = [None] * length, {}
            for time in (range(length) if direction == 0 else reversed(range(length))):
                state, steps[time] = forward(weights[index], sequence[time], state)
                hidden[time] = state[0]
            outputs.append(torch.stack(hidden))
            records.append(steps)
        sequence = torch.cat(outputs, dim=-1)
    initial_relevance = [torch.zeros_like(value) for value in states]
    relevance_sequence = output_relevance
    for layer in reversed(range(num_layers)):
        relevance_input = torch.zeros_like(layer_inputs[layer])
        for direction in range(directions):
            index = layer * directions + direction
            size = relevance_sequence.shape[-1] // directions
            carried = [value[index] for value in final_relevance]
            for time in (reversed(range(length)) if direction == 0 else range(length)):
                carried[0] = carried[0] + relevance_sequence[time][:, direction * size:(direction + 1) * size]
                relevance_x, *carried = backward(weights[index], records[index][time], tuple(carried), epsilon)
                relevance_input[time] += relevance_x
            for position, value in enumerate(carried):
                initial_relevance[position][index] = value
        relevance_sequence = relevance_input
    return relevance_sequence, initial_relevance


def module_reference(
    module: nn.Module, x: Tensor, states: Sequence[Tensor] | None, output_relevance: Tensor,
    final_relevance: Sequence[Tensor], epsilon: float,
) -> tuple[Tensor, list[Tensor]]:
    """:func:`arras_reference` for an ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (batch_first handled here)."""
    directions = 2 if module.bidirectional else 1
    suffixes = [f"_l{layer}{'_reverse' if direction else ''}" for layer in range(module.num_layers)
                for direction in range(directions)]
    weights = [weights_of(module, suffix) for suffix in suffixes]
    if states is None:
        out_size = getattr(module, "proj_size", 0) or module.hidden_size
        sizes = (out_size, module.hidden_size) if module.mode == "LSTM" else (out_size,)
        states = [torch.zeros(len(suffixes), x.shape[0 if module.batch_first else 1], size, dtype=x.dtype)
                  for size in sizes]
    if module.batch_first:
        x, output_relevance = x.transpose(0, 1), output_relevance.transpose(0, 1)
    relevance_x, relevance_states = arras_reference(module.mode, weights, module.num_layers, module.bidirectional,
                                                    x, states, output_relevance, final_relevance, epsilon)
    return (relevance_x.transpose(0, 1) if module.batch_first else relevance_x), relevance_states


# --- helpers ---------------------------------------------------------------------------------------


def explained(explain: nn.Module, inputs: Sequence[Tensor], relevance: Sequence[Tensor]) -> list[Tensor]:
    """Relevance of every input for the given relevance of every output."""
    leaves = [value.detach().clone().requires_grad_() for value in inputs]
    outputs = explain(*leaves)
    grads = torch.autograd.grad(outputs, leaves, relevance, allow_unused=True)
    return [torch.zeros_like(leaf) if grad is None else grad for grad, leaf in zip(grads, leaves, strict=True)]


def initial_states(module: nn.Module, seed: int) -> list[Tensor]:
    directions = 2 if module.bidirectional else 1
    out_size = getattr(module, "proj_size", 0) or module.hidden_size
    sizes = (out_size, module.hidden_size) if module.mode == "LSTM" else (out_size,)
    return [random(module.num_layers * directions, BATCH, size, seed=seed + k) for k, size in enumerate(sizes)]


def layer_input(module: nn.Module) -> Tensor:
    return random(BATCH, LENGTH, FEATURES, seed=7) if module.batch_first else random(LENGTH, BATCH, FEATURES, seed=7)


def output_relevances(outputs: Sequence[Tensor]) -> list[Tensor]:
    return [random(*value.shape, seed=20 + k) for k, value in enumerate(outputs)]


CONFIGURATIONS = [
    dict(num_layers=1),
    dict(num_layers=2, bidirectional=True, batch_first=True),
    dict(num_layers=2, batch_first=False),
    dict(num_layers=1, bidirectional=True, bias=False),
]
CONFIGURATION_IDS = ["single", "2-layer-bidirectional-batch-first", "2-layer", "bidirectional-no-bias"]


def check_against_reference(module: nn.Module, with_state: bool, rule: object, epsilon: float) -> None:
    model = LayerOutputsFromState(module) if with_state else LayerOutputs(module)
    x = layer_input(module)
    states = initial_states(module, seed=11) if with_state else []
    inputs = [x, *states]
    explain = fxlrp.convert(model, rule)
    outputs = model(*inputs)
    assert all(torch.equal(got, expected) for got, expected in zip(explain(*inputs), outputs, strict=True))
    relevance = output_relevances(outputs)
    actual = explained(explain, inputs, relevance)
    expected_x, expected_states = module_reference(module, x, states or None, relevance[0], relevance[1:], epsilon)
    assert relative_error(actual[0], expected_x) < TOLERANCE
    for got, expected in zip(actual[1:], expected_states if with_state else [], strict=True):
        assert relative_error(got, expected) < TOLERANCE


# --- tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("settings", CONFIGURATIONS, ids=CONFIGURATION_IDS)
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
def test_arras_rule_matches_the_hand_written_reference(kind: type[nn.Module], settings: dict,
                                                       with_state: bool) -> None:
    check_against_reference(recurrent(kind, **settings), with_state, fxlrp.rules.Epsilon(0.1), 0.1)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_lstm_projection_matches_the_reference(with_state: bool) -> None:
    module = recurrent(nn.LSTM, num_layers=2, bidirectional=True, proj_size=2)
    check_against_reference(module, with_state, fxlrp.rules.Epsilon(0.1), 0.1)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_composites_reach_the_parts(kind: type[nn.Module]) -> None:
    """The default composite, a type rule for the module, and the transformer composites (whose product
    rules keep gates constant; CP-LRP's constant smooth activations do not make tanh(c) a constant)."""
    module = recurrent(kind, num_layers=2, batch_first=True)
    check_against_reference(module, True, None, 1e-6)  # the default: Epsilon(1e-6)
    composite = Composite(fxlrp.rules.Epsilon(1e-6), type_rules={kind: fxlrp.rules.Epsilon(0.25)})
    check_against_reference(module, True, composite, 0.25)
    check_against_reference(module, True, AttnLRP(0.1), 0.1)
    check_against_reference(module, True, CPLRP(0.1), 0.1)


@pytest.mark.parametrize("kind", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_cells_run_over_time_match_the_reference(kind: type[nn.Module]) -> None:
    cell = recurrent(kind)
    mode = {nn.LSTMCell: "LSTM", nn.GRUCell: "GRU", nn.RNNCell: "RNN_TANH"}[kind]
    model = CellLoop(cell, LENGTH)
    x = random(LENGTH, BATCH, FEATURES, seed=7)
    states = [random(BATCH, HIDDEN, seed=11 + k) for k in range(2 if mode == "LSTM" else 1)]
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    outputs = model(x, *states)
    assert all(torch.equal(got, expected) for got, expected in zip(explain(x, *states), outputs, strict=True))
    relevance = output_relevances(outputs)
    actual = explained(explain, [x, *states], relevance)
    expected_x, expected_states = arras_reference(
        mode, [weights_of(cell, "")], 1, False, x, [state[None] for state in states], relevance[0],
        [value[None] for value in relevance[1:]], 0.1)
    assert relative_error(actual[0], expected_x) < TOLERANCE
    for got, expected in zip(actual[1:], expected_states, strict=True):
        assert relative_error(got, expected[0]) < TOLERANCE


class WrittenOutGRU(CellLoop):
    """A GRU cell written out in torch operations, as models that do not use ``nn.GRUCell`` do:
    the update ``h = (1 - z) * n + z * h`` multiplies the signal by ``1 - z``, a gate too."""

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor | None = None) -> tuple[Tensor, ...]:
        cell, outputs, h = self.layer, [], h0
        for time in range(self.steps):
            input_reset, input_update, input_new = F.linear(x[time], cell.weight_ih, cell.bias_ih).chunk(3, 1)
            hidden_reset, hidden_update, hidden_new = F.linear(h, cell.weight_hh, cell.bias_hh).chunk(3, 1)
            reset = torch.sigmoid(input_reset + hidden_reset)
            update = torch.sigmoid(input_update + hidden_update)
            new = torch.tanh(input_new + reset * hidden_new)
            h = (1 - update) * new + update * h
            outputs.append(h)
        return torch.stack(outputs), h


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_a_gru_written_out_in_operations_matches_the_reference(capture: str) -> None:
    """Captured, and run eagerly (the relevance mode, the recording, a replay). (Before: ``1 - z``
    was no gate, so the product gave it half of the signal's relevance: 117% off here.)"""
    cell = recurrent(nn.GRUCell)
    model = WrittenOutGRU(cell, LENGTH)
    x = random(LENGTH, BATCH, FEATURES, seed=7)
    state = random(BATCH, HIDDEN, seed=11)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1), capture=capture)
    outputs = model(x, state)
    relevance = output_relevances(outputs)
    expected_x, [expected_state] = arras_reference(
        "GRU", [weights_of(cell, "")], 1, False, x, [state[None]], relevance[0], [relevance[1][None]], 0.1)
    for _ in range(3):
        actual = explained(explain, [x, state], relevance)
        assert relative_error(actual[0], expected_x) < TOLERANCE
        assert relative_error(actual[1], expected_state[0]) < TOLERANCE


def test_a_gru_written_out_and_replayed_in_the_gradient_form_matches_the_reference() -> None:
    """``fxlrp.attribute`` under LRP-0 explains in the gradient form, where a replay runs sums and
    products with one relevance-carrying factor as plain calls: not ``1 - z``, which hands the
    gate's role on to the product that reads it (a plain call there: 119% off here)."""
    cell = recurrent(nn.GRUCell)
    model = WrittenOutGRU(cell, LENGTH)
    x = random(LENGTH, BATCH, FEATURES, seed=7)
    state = random(BATCH, HIDDEN, seed=11)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0), capture="eager")
    final_relevance = random(BATCH, HIDDEN, seed=21)
    expected_x, [expected_state] = arras_reference(
        "GRU", [weights_of(cell, "")], 1, False, x, [state[None]], torch.zeros(LENGTH, BATCH, HIDDEN,
                                                                               dtype=x.dtype),
        [final_relevance[None]], 0.0)
    for _ in range(3):  # the relevance mode, the recording, a replay
        actual = fxlrp.attribute(explain, (x, state), target=final_relevance, output=lambda outputs: outputs[1])
        assert explain.gradient_form
        assert relative_error(actual[0], expected_x) < TOLERANCE
        assert relative_error(actual[1], expected_state[0]) < TOLERANCE


class WrittenOutLSTM(CellLoop):
    """An LSTM cell written out in torch operations, with one linear map over input and state as in
    Arras et al.: ``i * g`` and ``o * tanh(c)`` are gates times activations."""

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor | None = None) -> tuple[Tensor, ...]:
        cell, outputs, h, c = self.layer, [], h0, c0
        weight = torch.cat([cell.weight_ih, cell.weight_hh], dim=1)
        for time in range(self.steps):
            gates = F.linear(torch.cat([x[time], h], dim=1), weight, cell.bias_ih + cell.bias_hh)
            input_gate, forget_gate, candidate, output_gate = gates.chunk(4, 1)
            c = torch.sigmoid(forget_gate) * c + torch.sigmoid(input_gate) * torch.tanh(candidate)
            h = torch.sigmoid(output_gate) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs), h, c


@pytest.mark.parametrize("composite", [fxlrp.rules.Epsilon(0.1), CPLRP(0.1)], ids=["epsilon", "cp-lrp"])
def test_an_lstm_written_out_in_operations_matches_the_reference(composite) -> None:
    """CP-LRP holds gates and activations constant: where a gate multiplies an activation the
    gate stays the constant, as ``nn.LSTM`` has it. (Before: both were, and the product split its
    relevance between them: 79% off here.)"""
    cell = recurrent(nn.LSTMCell)
    model = WrittenOutLSTM(cell, LENGTH)
    x = random(LENGTH, BATCH, FEATURES, seed=7)
    states = [random(BATCH, HIDDEN, seed=11 + k) for k in range(2)]
    explain = fxlrp.convert(model, composite)
    relevance = output_relevances(model(x, *states))
    actual = explained(explain, [x, *states], relevance)
    expected_x, expected_states = arras_reference(
        "LSTM", [weights_of(cell, "")], 1, False, x, [state[None] for state in states], relevance[0],
        [value[None] for value in relevance[1:]], 0.1)
    assert relative_error(actual[0], expected_x) < TOLERANCE
    for got, expected in zip(actual[1:], expected_states, strict=True):
        assert relative_error(got, expected[0]) < TOLERANCE


def test_unbatched_input_equals_a_batch_of_one() -> None:
    module = recurrent(nn.GRU, num_layers=2, bidirectional=True)
    x, state = random(LENGTH, FEATURES, seed=7), random(4, HIDDEN, seed=11)
    model = LayerOutputsFromState(module)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    outputs = model(x, state)
    assert all(torch.equal(got, expected) for got, expected in zip(explain(x, state), outputs, strict=True))
    relevance = output_relevances(outputs)
    actual = explained(explain, [x, state], relevance)
    batched = explained(explain, [x[:, None], state[:, None]], [relevance[0][:, None], relevance[1][:, None]])
    assert torch.equal(actual[0], batched[0][:, 0]) and torch.equal(actual[1], batched[1][:, 0])


class ReluRnnClassifier(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.rnn = recurrent(nn.RNN, nonlinearity="relu", num_layers=2, bidirectional=True, batch_first=batch_first)
        torch.manual_seed(1)
        self.head = nn.Linear(2 * HIDDEN, 3).double()

    def forward(self, x: Tensor, h0: Tensor) -> Tensor:
        output, _ = self.rnn(x, h0)
        return self.head(output)


@pytest.mark.parametrize("batch_first", [True, False])
def test_relu_rnn_lrp0_equals_gradient_times_input(batch_first: bool) -> None:
    """Piecewise linear with biases: LRP-0 (z-rule on the joint map, ReLU native) is gradient x input."""
    model = ReluRnnClassifier(batch_first)
    x = random(BATCH, LENGTH, FEATURES, seed=7) if batch_first else random(LENGTH, BATCH, FEATURES, seed=7)
    h0 = random(4, BATCH, HIDDEN, seed=11)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))
    # (not bit-equal with batch_first: the head's matrix product on the non-contiguous output rounds
    # differently for a weight that requires gradients and its detached twin)
    assert relative_error(explain(x, h0), model(x, h0)) < 1e-14
    actual = explained(explain, [x, h0], [onehot_relevance(model(x, h0), 1)])
    expected = gradient_times_input(model, [x, h0], lambda output: output, lambda output: onehot_relevance(output, 1))
    for got, reference in zip(actual, expected, strict=True):
        assert relative_error(got, reference) < TOLERANCE
    # relevance of h0 is not trivially zero, and x's is not the plain gradient
    assert expected[1].abs().max() > 1e-3


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_conservation_without_bias_under_lrp0(kind: type[nn.Module]) -> None:
    """Gates take none and pass none on, sums split by the z-rule, linear maps without bias under LRP-0
    conserve, tanh passes unchanged: the inputs' relevance adds up to the outputs'. A given initial
    state takes its share; biases absorb theirs (so with biases the sums differ)."""
    module = recurrent(kind, num_layers=2, bidirectional=True, bias=False)
    x = layer_input(module)
    relevance = output_relevances(LayerOutputs(module)(x))
    total = sum(value.sum() for value in relevance)
    scale = sum(value.abs().sum() for value in relevance)

    [relevance_x] = explained(fxlrp.convert(LayerOutputs(module), fxlrp.rules.Epsilon(0.0)), [x], relevance)
    assert abs(relevance_x.sum() - total) < TOLERANCE * scale

    states = initial_states(module, seed=11)
    actual = explained(fxlrp.convert(LayerOutputsFromState(module), fxlrp.rules.Epsilon(0.0)), [x, *states], relevance)
    assert abs(sum(value.sum() for value in actual) - total) < TOLERANCE * scale
    assert all(value.abs().max() > 1e-3 for value in actual[1:])  # the state took a share

    biased = recurrent(kind, num_layers=2, bidirectional=True)
    relevance = output_relevances(LayerOutputs(biased)(x))
    [relevance_x] = explained(fxlrp.convert(LayerOutputs(biased), fxlrp.rules.Epsilon(0.0)), [x], relevance)
    assert abs(relevance_x.sum() - sum(value.sum() for value in relevance)) > 1e-3


def test_lstm_relevance_is_not_gradient_times_input() -> None:
    """The gates make the difference: the reference tests above can tell the rule from the gradient."""
    module = recurrent(nn.LSTM, bias=False)
    model = LayerOutputs(module)
    x = layer_input(module)
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))
    outputs = model(x)
    relevance = [onehot_relevance(outputs[0]), torch.zeros_like(outputs[1]), torch.zeros_like(outputs[2])]
    [actual] = explained(explain, [x], relevance)
    [gradient] = gradient_times_input(model, [x], lambda output: output[0], onehot_relevance)
    assert relative_error(actual, gradient) > 0.05


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
def test_outputs_are_the_modules_own(kind: type[nn.Module], dtype: torch.dtype) -> None:
    """The native kernel runs in forward: bit-equal outputs, also for a module in training mode
    with dropout between layers (explanations are of inference: equal to the module in eval mode)."""
    module = recurrent(kind, num_layers=2, bidirectional=True, batch_first=True, dropout=0.5).to(dtype)
    model = LayerOutputsFromState(module).train()
    x = layer_input(module).to(dtype)
    states = [state.to(dtype) for state in initial_states(module, seed=11)]
    explain = fxlrp.convert(model)
    leaves = [value.clone().requires_grad_() for value in (x, *states)]
    actual = explain(*leaves)
    expected = model.eval()(*leaves)
    assert all(torch.equal(got, wanted) for got, wanted in zip(actual, expected, strict=True))
    assert all(parameter.grad is None for parameter in module.parameters())
    assert all(weight is getattr(module, name) for weight, name in zip(module._flat_weights,
                                                                      module._flat_weights_names, strict=True))


class Branching(LayerOutputs):
    """Python control flow on a tensor's value: torch.fx cannot trace it, the model runs eagerly and
    its recurrent layer is explained through the kernel ``nn.LSTM``'s forward calls (``torch._VF.lstm``)."""

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor | None = None) -> tuple[Tensor, ...]:
        if x.sum() > 1e9:
            x = -x
        if isinstance(self.layer, nn.RNNBase):
            output, finals = self.layer(x, (h0, c0) if self.pair else h0)
            return self.flat(output, finals)
        outputs, state = [], ((h0, c0) if self.pair else h0)
        for x_t in x.unbind(0):
            state = self.layer(x_t, state)
            outputs.append(state[0] if self.pair else state)
        return self.flat(torch.stack(outputs), state)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRUCell])
def test_recurrent_layers_in_code_run_eagerly(kind: type[nn.Module]) -> None:
    settings = dict(num_layers=2, bidirectional=True) if kind is nn.LSTM else {}
    module = recurrent(kind, **settings)
    model = Branching(module)
    x = random(LENGTH, BATCH, FEATURES, seed=7)
    states = initial_states(module, seed=11) if kind is nn.LSTM else [random(BATCH, HIDDEN, seed=11)]
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    outputs = model(x, *states)
    assert all(relative_error(got, expected) < 1e-14
               for got, expected in zip(explain(x, *states), outputs, strict=True))
    assert "eager" in str(explain.report())
    relevance = output_relevances(outputs)
    actual = explained(explain, [x, *states], relevance)
    if kind is nn.LSTM:
        expected_x, expected_states = module_reference(module, x, states, relevance[0], relevance[1:], 0.1)
    else:
        expected_x, expected_states = arras_reference("GRU", [weights_of(module, "")], 1, False, x, [states[0][None]],
                                                      relevance[0], [relevance[1][None]], 0.1)
        expected_states = [expected_states[0][0]]
    assert relative_error(actual[0], expected_x) < TOLERANCE
    for got, expected in zip(actual[1:], expected_states, strict=True):
        assert relative_error(got, expected) < TOLERANCE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (cuDNN kernels)")
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
def test_cudnn_outputs_are_the_modules_own(kind: type[nn.Module]) -> None:
    """On the GPU the forward is cuDNN's, bit for bit (the same kernel on the same values); relevance
    is the reference's computed on the CPU. Both in float64, which cuDNN's recurrent kernels take
    (``torch.backends.cudnn.is_acceptable``: half, float and double), so the two differ by float64
    rounding in other orders of the same sums: within the file's float64 ``TOLERANCE``."""
    module = recurrent(kind, num_layers=2, bidirectional=True, batch_first=True)
    x, states = layer_input(module), initial_states(module, seed=11)
    relevance = output_relevances(LayerOutputsFromState(module)(x, *states))
    expected_x, _ = module_reference(module, x, states, relevance[0], relevance[1:], 0.1)
    module = module.cuda()
    model = LayerOutputsFromState(module)
    inputs = [value.cuda() for value in (x, *states)]
    assert inputs[0].dtype == torch.float64 and torch.backends.cudnn.is_acceptable(inputs[0])
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.1))
    leaves = [value.clone().requires_grad_() for value in inputs]
    assert all(torch.equal(got, wanted) for got, wanted in zip(explain(*leaves), model(*inputs), strict=True))
    actual = explained(explain, inputs, [value.cuda() for value in relevance])
    assert relative_error(actual[0].cpu(), expected_x) < TOLERANCE


class PackedClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = recurrent(nn.LSTM, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]


class ReceivesPacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = recurrent(nn.GRU)

    def forward(self, packed: Tensor) -> Tensor:
        return self.gru(packed)[1]


def test_packed_sequences_are_refused_with_what_to_do() -> None:
    x, lengths = random(BATCH, LENGTH, FEATURES), torch.tensor([LENGTH, 3])
    explain = fxlrp.convert(PackedClassifier())
    with pytest.raises(UnsupportedOperationError, match="PackedSequence.*pass the padded tensor"):
        fxlrp.attribute(explain, (x, lengths), target=0)
    explain = fxlrp.convert(ReceivesPacked())
    packed = pack_padded_sequence(x.requires_grad_(), lengths, batch_first=True)
    with pytest.raises(UnsupportedOperationError, match=r"nn\.GRU on a PackedSequence"):
        explain(packed)
