"""Piecewise-constant and piecewise-linear elementwise maps, and roles that survive casts.

- Maps whose derivative is 0 almost everywhere (sign, heaviside, round, floor, ceil, trunc) carry
  no relevance: a product with them is a gate on the other factor, and LRP-0 equals gradient x
  input (float64) for every spelling. ``abs`` passes relevance as an activation does.
- Attention weights stay attention weights through a dtype cast, ``contiguous``, views and
  dropout in eval, as Hugging Face's eager attention computes them: CP-LRP under LRP-0 equals
  gradient x input of the model with the attention weights detached, whatever the spelling.
- Gates stay gates when they are cut into pieces (slices, ``chunk``, ``split``, ``unbind``,
  ``tensor_split``) or put together (``cat``, ``stack``): LRP-0, which gives a gate no relevance,
  equals gradient x input of the model with the gates detached, captured, run eagerly and replayed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from support.references import LRP0, gradient_times_input, onehot_relevance, relative_error
from torch import nn

import fxlrp
from fxlrp.rules import Epsilon, ZPlus
from fxlrp.rules.attention import Product, cp_lrp
from fxlrp.rules.composites import Composite

TOLERANCE = 1e-12


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class Elementwise(nn.Module):
    """``Linear -> spelling(h, constant) -> Linear``; ``constant`` is applied to the input of a
    zero-derivative map (the identity for fxlrp; ``detach`` for the gradient reference, where it
    changes nothing but lets torch differentiate heaviside, which has no derivative formula)."""

    def __init__(self, spelling: Callable[..., torch.Tensor], constant: Callable = _identity) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, 6), nn.Linear(6, 3)
        self.spelling, self.constant = spelling, constant

    def forward(self, x):
        return self.last(self.spelling(self.first(x), self.constant))


def _in_place_sign(h, c):
    gate = c(h).clone()
    gate.sign_()
    return gate * h


def _in_place_floor(h, c):
    low = c(h).clone()
    low.floor_()
    return h - low


def _in_place_abs(h, c):
    h = h * 1.0
    h.abs_()
    return h


SPELLINGS = {
    "torch.sign(h) * h": lambda h, c: torch.sign(c(h)) * h,
    "h.sign() * h": lambda h, c: c(h).sign() * h,
    "h * torch.sgn(h)": lambda h, c: h * torch.sgn(c(h)),
    "sign_ in place": _in_place_sign,
    "heaviside(h, 0.5) * h": lambda h, c: torch.heaviside(c(h), torch.tensor(0.5, dtype=h.dtype)) * h,
    "h.heaviside(v) * h": lambda h, c: c(h).heaviside(torch.full_like(h, 0.25)) * h,
    "round(h) * h": lambda h, c: torch.round(c(h) * 2) * h,
    "h.round() + h": lambda h, c: c(h).round() + h,
    "floor(h).detach() + h": lambda h, c: torch.floor(c(h)).detach() + h,
    "torch.floor(h) * h": lambda h, c: torch.floor(c(h)) * h,
    "h.ceil() * h": lambda h, c: c(h).ceil() * h,
    "trunc(h) * h": lambda h, c: torch.trunc(c(h) * 3) * h,
    "floor_ in place": _in_place_floor,
    "(h > 0).float() * h": lambda h, c: (c(h) > 0).to(h.dtype) * h,
    "torch.abs(h)": lambda h, c: torch.abs(h),
    "h.abs()": lambda h, c: h.abs(),
    "abs(h)": lambda h, c: abs(h),
    "h.abs_()": _in_place_abs,
    "abs(h) * sign(h)": lambda h, c: torch.abs(h) * torch.sign(c(h)),
    "hardshrink(h)": lambda h, c: F.hardshrink(h, 0.3),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_lrp0_equals_gradient_times_input_through_piecewise_maps(spelling: str) -> None:
    torch.manual_seed(0)
    model = Elementwise(SPELLINGS[spelling]).double().eval()
    reference = Elementwise(SPELLINGS[spelling], constant=torch.Tensor.detach).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(5, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    relevance = fxlrp.attribute(explain, x, target=1)
    [expected] = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    assert torch.isfinite(relevance).all()
    assert relative_error(relevance, expected) < TOLERANCE


def test_piecewise_constant_maps_are_reported_as_carrying_no_relevance() -> None:
    explain = fxlrp.convert(Elementwise(SPELLINGS["torch.sign(h) * h"]).double(), LRP0)
    rows = {row.operation: row for row in explain.report().rows}
    assert rows["step"].handling == "native"
    assert rows["mul"].handling == "rule"


class Attention(nn.Module):
    """One attention head over a sequence; ``weights`` computes the attention weights from the
    scores (the spellings differ only there); ``detach_weights`` gives the gradient reference of
    CP-LRP (attention weights as constants)."""

    def __init__(self, weights: Callable[..., torch.Tensor], detach_weights: bool = False) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(8, 8) for _ in range(4))
        self.weights, self.detach_weights = weights, detach_weights

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        weights = self.weights(scores, q)
        if self.detach_weights:
            weights = weights.detach()
        return self.out(torch.matmul(weights, v)).sum(dim=1)


def _hugging_face_eager(scores, q):
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return F.dropout(weights, p=0.1, training=False)


ATTENTION_SPELLINGS = {
    "softmax": lambda scores, q: torch.softmax(scores, dim=-1),
    "softmax(dtype=float32).to(q.dtype), dropout": _hugging_face_eager,
    "softmax().contiguous()": lambda scores, q: scores.softmax(-1).contiguous(),
    "softmax().double() through a view": lambda scores, q: F.softmax(scores, -1).view(scores.shape).double(),
    "nn.Softmax then type_as": lambda scores, q: nn.functional.softmax(scores.float(), dim=-1).type_as(q),
    "softmax per sample, stacked": lambda scores, q: torch.stack(torch.softmax(scores, -1).unbind(0)),
    "torch.where(mask, softmax, 0)": lambda scores, q: torch.where(
        torch.ones_like(scores, dtype=torch.bool).tril(), torch.softmax(scores, -1), 0.0),
    "softmax.where(mask, 0)": lambda scores, q: torch.softmax(scores, -1).where(
        torch.ones_like(scores, dtype=torch.bool).tril(), 0.0),
}


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("spelling", list(ATTENTION_SPELLINGS))
def test_cp_lrp_treats_attention_weights_as_constants_whatever_their_dtype(spelling: str, capture: str) -> None:
    """(Before: ``torch.where(mask, weights, 0)`` took the mask's role, none, and the product
    split its relevance with the weights: 52% off.)"""
    torch.manual_seed(1)
    model = Attention(ATTENTION_SPELLINGS[spelling]).double().eval()
    reference = Attention(ATTENTION_SPELLINGS[spelling], detach_weights=True).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    # cp_lrp() follows the layer rule's epsilon: LRP-0 everywhere, so gradient x input is exact.
    explain = fxlrp.convert(model, Composite(Epsilon(0.0), operation_rules=cp_lrp()), capture=capture)
    [expected] = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 2))
    for _ in range(3):  # eagerly: the relevance mode, the recording, a replay
        assert relative_error(fxlrp.attribute(explain, x, target=2), expected) < 1e-10


def test_cp_lrp_with_its_own_epsilon_keeps_it() -> None:
    torch.manual_seed(1)
    model = Attention(ATTENTION_SPELLINGS["softmax"]).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    following = fxlrp.convert(model, Composite(Epsilon(0.0), operation_rules=cp_lrp()))
    own = fxlrp.convert(model, Composite(Epsilon(0.0), operation_rules=cp_lrp(epsilon=0.5)))
    products = [row.rule for row in following.report().rows if row.operation == "matmul"]
    assert products and all("epsilon=0.0" in rule for rule in products)
    difference = relative_error(fxlrp.attribute(own, x, target=2), fxlrp.attribute(following, x, target=2))
    assert difference > 1e-3  # a large epsilon on the products changes the relevance


def test_a_rule_without_meaning_on_a_product_of_two_tensors_warns() -> None:
    torch.manual_seed(1)
    model = Attention(ATTENTION_SPELLINGS["softmax"]).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with pytest.warns(UserWarning, match="no meaning"):  # at conversion, where the rule is chosen
        explain = fxlrp.convert(model, Composite(Epsilon(0.0), operation_rules={"matmul": ZPlus()}))
    warned = fxlrp.attribute(explain, x, target=2)
    uniform = fxlrp.convert(model, Composite(Epsilon(0.0), operation_rules={"matmul": Product(1e-6)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = fxlrp.attribute(uniform, x, target=2)
    assert relative_error(warned, expected) < 1e-12


def _pieces_by_slicing(gates):
    return gates[..., :4], gates[..., 4:]


GATE_SPELLINGS = {
    "slices": _pieces_by_slicing,
    "chunk": lambda gates: gates.chunk(2, dim=-1),
    "split": lambda gates: torch.split(gates, 4, dim=-1),
    "tensor_split": lambda gates: gates.tensor_split(2, dim=-1),
    "unbind": lambda gates: gates.unflatten(-1, (2, 4)).unbind(-2),
    "cat of pieces, chunk": lambda gates: torch.cat(_pieces_by_slicing(gates), dim=-1).chunk(2, dim=-1),
    "stack of pieces, unbind": lambda gates: torch.stack(_pieces_by_slicing(gates)).unbind(0),
}


class Gated(nn.Module):
    """Two sigmoid gates computed as one tensor and cut into pieces (the spellings differ only
    there), each multiplied with a signal; ``detach_gates``: the gradient reference."""

    def __init__(self, pieces: Callable, detach_gates: bool = False) -> None:
        super().__init__()
        self.gates, self.signal, self.out = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(4, 3)
        self.pieces, self.detach_gates = pieces, detach_gates

    def forward(self, x):
        gates = torch.sigmoid(self.gates(x))
        if self.detach_gates:
            gates = gates.detach()
        first, second = self.pieces(gates)
        left, right = self.signal(x).chunk(2, dim=-1)
        return self.out(first * left + second * right)


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("spelling", list(GATE_SPELLINGS))
def test_gates_stay_gates_when_cut_into_pieces(spelling: str, capture: str) -> None:
    """(Before: ``chunk``, ``split`` and ``unbind`` handed the role to none of their pieces, and
    the products split their relevance with the gates: relevance sums 6x apart.)"""
    torch.manual_seed(2)
    model = Gated(GATE_SPELLINGS[spelling]).double().eval()
    reference = Gated(GATE_SPELLINGS[spelling], detach_gates=True).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 4, dtype=torch.float64)
    [expected] = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    explain = fxlrp.convert(model, LRP0, capture=capture)
    for _ in range(3):  # eagerly: the relevance mode, the recording, a replay
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < TOLERANCE


class GatedLinearUnit(nn.Module):
    """A convolution's channels halved by a GLU (a Conformer's convolution module), as
    ``F.glu``, as ``nn.GLU``, or written out; ``detach_gates``: the gradient reference."""

    def __init__(self, spelling: str, detach_gates: bool = False) -> None:
        super().__init__()
        self.convolution, self.out = nn.Conv1d(4, 8, 3, padding=1), nn.Linear(4, 3)
        self.spelling, self.detach_gates, self.glu = spelling, detach_gates, nn.GLU(dim=1)

    def forward(self, x):
        hidden = self.convolution(x)  # (batch, 8 channels, length)
        if self.spelling == "F.glu":
            gated = F.glu(hidden, dim=1)
        elif self.spelling == "nn.GLU":
            gated = self.glu(hidden)
        else:
            signal, gates = hidden.chunk(2, dim=1)
            gated = signal * (torch.sigmoid(gates).detach() if self.detach_gates else torch.sigmoid(gates))
        return self.out(gated.broadcast_to(torch.stack((gated, gated)).shape).sum(0).mean(-1))


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("spelling", ["F.glu", "nn.GLU"])
def test_a_gated_linear_unit_is_a_product_with_a_gate(spelling: str, capture: str) -> None:
    """GLU (``a * sigmoid(b)`` on the halves of its input) had no rule, and ``Tensor.broadcast_to``
    none in code run eagerly (wav2vec2-Conformer and WavLM were refused). LRP-0 gives the gate no
    relevance: gradient x input of the model written out with the gates detached; captured, run
    eagerly and replayed."""
    torch.manual_seed(3)
    model = GatedLinearUnit(spelling).double().eval()
    reference = GatedLinearUnit("written out", detach_gates=True).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    [expected] = gradient_times_input(reference, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
    explain = fxlrp.convert(model, LRP0, capture=capture)
    assert torch.equal(explain(x), model(x))
    for _ in range(3):  # eagerly: the relevance mode, the recording, a replay
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < TOLERANCE
