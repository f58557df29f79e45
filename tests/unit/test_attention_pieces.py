"""Fused attention's decomposition in backward, run piece by piece (groups of heads of samples,
fxlrp.operations.attention.attention_pieces) so that one piece's scores are alive at a time.
Pieces must give the relevance of the whole decomposition, and with epsilon 0 that of the fused
kernel's own backward (the gradient form); float64 throughout."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from support.references import relative_error
from torch import Tensor, nn

import fxlrp
import fxlrp.operations.attention as attention
from fxlrp.rules import Epsilon, ZPlus
from fxlrp.rules.composites import CPLRP, AttnLRP, Composite

LENGTH = 6


class Attention(nn.Module):
    """``F.scaled_dot_product_attention`` with ``heads`` query heads and ``shared`` key/value heads
    (grouped-query with ``enable_gqa``, broadcast when 1), one of several masks."""

    def __init__(self, heads: int, shared: int, mask: str) -> None:
        super().__init__()
        self.heads, self.shared, self.masking = heads, shared, mask
        self.pieces = 2 * heads  # one per query head (a group's heads reading one key head each add theirs)
        self.query, self.key, self.value = nn.Linear(5, 3 * heads), nn.Linear(5, 3 * shared), nn.Linear(5, 3 * shared)
        self.out = nn.Linear(3 * heads, 2)
        generator = torch.Generator().manual_seed(1)
        masks = {
            "none": None,
            "causal": None,
            "boolean per sample": torch.rand(2, 1, LENGTH, LENGTH, generator=generator) > 0.3,
            "additive per head": torch.randn(heads, LENGTH, LENGTH, generator=generator),
            "boolean shared": torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril(1),
        }
        masks["boolean per sample"][..., 0] = True  # every query attends somewhere
        self.register_buffer("mask", masks.get(mask))

    def forward(self, x: Tensor) -> Tensor:
        batch = x.shape[0]

        def heads(values: Tensor, count: int) -> Tensor:
            return values.reshape(batch, LENGTH, count, 3).transpose(1, 2)

        q = heads(self.query(x), self.heads)
        k, v = heads(self.key(x), self.shared), heads(self.value(x), self.shared)
        grouped = {"enable_gqa": True} if 1 < self.shared < self.heads else {}
        mask = self.mask
        if self.masking == "bias from the input":  # relevance-carrying, shared by the heads (SAM's relative positions)
            mask = (x @ x.transpose(1, 2)).unsqueeze(1) * 0.3
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.masking == "causal",
                                               **grouped)
        return self.out(mixed.transpose(1, 2).reshape(batch, LENGTH, -1).mean(dim=1))


class Unbatched(nn.Module):
    """Attention on ``[batch, length, features]`` (no head dimension): pieces are samples."""

    pieces = 2

    def __init__(self) -> None:
        super().__init__()
        self.project, self.out = nn.Linear(5, 12), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x).chunk(3, dim=-1)
        return self.out(F.scaled_dot_product_attention(q, k, v).mean(dim=1))


MODELS = {
    "heads": lambda: Attention(4, 4, "none"),
    "grouped-query": lambda: Attention(4, 2, "causal"),
    "broadcast key-value": lambda: Attention(4, 1, "boolean per sample"),
    "additive mask per head": lambda: Attention(4, 4, "additive per head"),
    "shared boolean mask": lambda: Attention(2, 2, "boolean shared"),
    "no head dimension": Unbatched,
    "causal": lambda: Attention(4, 4, "causal"),
    "bias from the input": lambda: Attention(4, 4, "bias from the input"),
    "grouped-query, bias from the input": lambda: Attention(4, 2, "bias from the input"),
}
CLOSED_FORM_MODELS = {name: MODELS[name] for name in (
    "heads", "no head dimension", "causal", "additive mask per head", "shared boolean mask", "grouped-query",
    "bias from the input", "grouped-query, bias from the input")}
"""Attention whose relevance has a closed form: queries, keys and values of the same heads or of
groups of query heads, not broadcast."""


def _relevance(explain: nn.Module, inputs: Tensor) -> Tensor:
    leaf = inputs.clone().requires_grad_()
    output = explain(leaf)
    (relevance,) = torch.autograd.grad(output, leaf, torch.ones_like(output))
    return relevance


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("composite", [Epsilon(1e-6), AttnLRP(0.0), CPLRP()], ids=["epsilon", "attnlrp0", "cplrp"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_pieces_give_the_relevance_of_the_whole(build, composite, capture, monkeypatch) -> None:
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, composite, capture=capture, strict=True)
    monkeypatch.setattr(attention, "PIECE_SCORES", 1 << 30)
    whole = _relevance(explain, inputs)
    pieces = []
    original = attention.attention_pieces

    def recorded(*args):
        pieces.append(original(*args))
        return pieces[-1]

    monkeypatch.setattr(attention, "attention_pieces", recorded)
    monkeypatch.setattr(attention, "PIECE_SCORES", 1)  # each group of heads of each sample a piece
    piecewise = _relevance(explain, inputs)
    assert len(pieces) == 1 and len(pieces[0]) == model.pieces
    assert relative_error(piecewise, whole) <= 1e-12
    assert whole.abs().sum() > 0


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_pieces_equal_the_fused_kernels_backward_at_epsilon_0(build, monkeypatch) -> None:
    """AttnLRP(0) in the gradient form runs the kernel's own backward (q, k: 1/4, v: 1/2): an
    independent reference for the decomposition run in pieces, in closed form without a mask and
    with queries, keys and values of the same heads (attention.attention_relevance), else run
    under the interpretation."""
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, AttnLRP(0.0), strict=True)
    kernel = fxlrp.attribute(explain, inputs, target=1)
    assert explain.gradient_form
    monkeypatch.setattr(attention, "PIECE_SCORES", 1)
    closed_forms = []
    original = attention.attention_relevance
    monkeypatch.setattr(attention, "attention_relevance", lambda *args: closed_forms.append(1) or original(*args))
    explain.keep_to_relevance_form()
    assert relative_error(fxlrp.attribute(explain, inputs, target=1), kernel) <= 1e-12
    assert len(closed_forms) == (model.pieces if build in CLOSED_FORM_MODELS.values() else 0)


def test_pieces_follow_the_heads_of_grouped_keys_and_the_mask() -> None:
    """Where each piece lies: query heads 2h, 2h+1 read key/value head h; a mask of size 1 in a
    dimension is read whole by every piece."""
    query = torch.zeros(2, 4, 3, 3)
    key = value = torch.zeros(2, 2, 3, 3)
    mask = torch.zeros(1, 4, 3, 3)
    try:
        saved, attention.PIECE_SCORES = attention.PIECE_SCORES, 18  # two query heads of one sample
        pieces = attention.attention_pieces(query, key, value, mask)
    finally:
        attention.PIECE_SCORES = saved
    every = slice(None)

    def piece(sample: int, query_heads: slice, shared_head: slice) -> tuple:
        samples = slice(sample, sample + 1)
        query_part = (samples, query_heads, every, every)
        key_part = (samples, shared_head, every, every)
        return query_part, key_part, key_part, (every, query_heads, every, every), query_part

    assert pieces == [piece(sample, slice(2 * head, 2 * head + 2), slice(head, head + 1))
                      for sample in range(2) for head in range(2)]



@pytest.mark.parametrize("build", CLOSED_FORM_MODELS.values(), ids=CLOSED_FORM_MODELS.keys())
@pytest.mark.parametrize("composite", [AttnLRP(0.25), CPLRP(0.25), Epsilon(0.25)], ids=["attnlrp", "cplrp", "epsilon"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_closed_form_equals_the_decomposition_run_under_the_interpretation(build, composite, capture,
                                                                           monkeypatch) -> None:
    """Unmasked attention in the relevance form takes the decomposition's relevance in closed form
    (attention.attention_relevance); the decomposition run operation by operation under the
    interpretation, each with its own rule, is the reference. A large epsilon, so that each
    stabiliser's place shows (the products' denominators are their outputs, the scale passes)."""
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    closed_forms = []
    original = attention.attention_relevance

    def counted(*args):
        closed_forms.append(args[0])
        return original(*args)

    monkeypatch.setattr(attention, "attention_relevance", counted)
    monkeypatch.setattr(attention, "PIECE_SCORES", 1)
    closed = _relevance(fxlrp.convert(model, composite, capture=capture, strict=True), inputs)
    assert len(closed_forms) == model.pieces
    rules = attention.attention_rules
    monkeypatch.setattr(attention, "attention_rules", lambda *args: replace(rules(*args), closed_form=False))
    interpreted = _relevance(fxlrp.convert(model, composite, capture=capture, strict=True), inputs)
    assert len(closed_forms) == model.pieces
    assert relative_error(closed, interpreted) <= 1e-12
    assert closed.abs().sum() > 0



@pytest.mark.parametrize("build", CLOSED_FORM_MODELS.values(), ids=CLOSED_FORM_MODELS.keys())
@pytest.mark.parametrize("composite", [AttnLRP(0.25), CPLRP(0.25), Epsilon(0.25)], ids=["attnlrp", "cplrp", "epsilon"])
def test_closed_form_in_the_gradient_form_equals_the_decomposition(build, composite, monkeypatch) -> None:
    """With stabilised products the gradient form takes the decomposition's rules in their
    gradient form in closed form (``R_q / q``, ...); the decomposition run in the gradient form
    under the interpretation (each product's stabiliser its own Function, natively differentiated)
    is the reference, piece by piece, a mask carrying relevance included."""
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    closed_forms = []
    original = attention.attention_relevance
    monkeypatch.setattr(attention, "attention_relevance", lambda *args: closed_forms.append(1) or original(*args))
    monkeypatch.setattr(attention, "PIECE_SCORES", 1)
    explain = fxlrp.convert(model, composite, strict=True)
    closed = fxlrp.attribute(explain, inputs, target=1)
    assert explain.gradient_form and len(closed_forms) == model.pieces
    rules = attention.attention_rules
    monkeypatch.setattr(attention, "attention_rules", lambda *args: replace(rules(*args), closed_form=False))
    explain = fxlrp.convert(model, composite, strict=True)
    interpreted = fxlrp.attribute(explain, inputs, target=1)
    assert explain.gradient_form and len(closed_forms) == model.pieces
    assert relative_error(closed, interpreted) <= 1e-12
    assert closed.abs().sum() > 0


@pytest.mark.parametrize("fitting, pieces", [(1, 16), (3, 8), (5, 4), (8, 2)])
def test_groups_of_query_heads_too_large_for_a_piece_are_split(fitting, pieces, monkeypatch) -> None:
    """Eight query heads in groups of four per key head: a piece takes whole groups where they
    fit the budget, else the largest part of a group that fits (3 heads' scores: 2 of the 4); the
    pieces of a group each add the relevance of the key and value head they share."""
    torch.manual_seed(0)
    model = Attention(8, 2, "causal").double().eval()
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    explain = fxlrp.convert(model, AttnLRP(0.25), strict=True)
    monkeypatch.setattr(attention, "PIECE_SCORES", 1 << 30)
    whole = fxlrp.attribute(explain, inputs, target=1)
    made = []
    original = attention.attention_pieces
    monkeypatch.setattr(attention, "attention_pieces", lambda *args: made.append(original(*args)) or made[-1])
    monkeypatch.setattr(attention, "PIECE_SCORES", fitting * LENGTH * LENGTH)
    piecewise = fxlrp.attribute(explain, inputs, target=1)
    assert len(made) == 1 and len(made[0]) == pieces
    assert relative_error(piecewise, whole) <= 1e-12


class PositionalCausal(nn.Module):
    """``F.scaled_dot_product_attention(q, k, v, None, 0.0, True)``: ``is_causal`` by position."""

    def __init__(self, positional: bool) -> None:
        super().__init__()
        self.positional = positional
        self.project, self.out = nn.Linear(5, 12), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x).chunk(3, dim=-1)
        if self.positional:
            mixed = F.scaled_dot_product_attention(q, k, v, None, 0.0, True)
        else:
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(mixed.mean(dim=1))


@pytest.mark.parametrize("composite", [AttnLRP(0.25), AttnLRP(0.0)], ids=["relevance form", "gradient form"])
def test_attention_arguments_given_by_position_are_read(composite) -> None:
    """``is_causal`` given by position takes the causal mask as given by name does (the closed
    form and the gradient form's shares read it either way)."""
    torch.manual_seed(0)
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    by_name = PositionalCausal(False).double().eval()
    by_position = PositionalCausal(True).double().eval()
    by_position.load_state_dict(by_name.state_dict())
    expected = fxlrp.attribute(fxlrp.convert(by_name, composite, strict=True), inputs, target=1)
    actual = fxlrp.attribute(fxlrp.convert(by_position, composite, strict=True), inputs, target=1)
    assert relative_error(actual, expected) <= 1e-12
    assert expected.abs().sum() > 0


def test_a_first_layer_rule_reaches_attention_run_eagerly_only_where_the_graph_gives_it() -> None:
    # The query projection is the first layer; fused attention's q k^T is not. Run eagerly as a
    # whole, the model's one node holds the first layer, which its first linear layer takes.
    torch.manual_seed(5)
    model = Attention(2, 2, "none").double().eval()
    composite = Composite(Epsilon(0.25), first_layer=Epsilon(0.5))
    inputs = torch.randn(2, LENGTH, 5, dtype=torch.float64)
    graph = fxlrp.convert(model, composite, capture="fx", strict=True)
    eager = fxlrp.convert(model, composite, capture="eager", strict=True)
    assert relative_error(_relevance(eager, inputs), _relevance(graph, inputs)) < 1e-12


class MultiheadWithInputBias(nn.Module):
    """``nn.MultiheadAttention`` given an additive mask computed from the input (a relevance-carrying
    bias, by keyword or by position), or the same computation written with
    ``F.scaled_dot_product_attention`` (``fused=True``): the two must be explained alike."""

    def __init__(self, fused: bool, by_keyword: bool = True) -> None:
        super().__init__()
        self.fused, self.by_keyword = fused, by_keyword
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        bias = (x @ x.transpose(1, 2)) * 0.3  # [batch, length, length], the same for both heads
        if not self.fused:
            mask = bias.repeat_interleave(2, 0)  # [batch * heads, length, length]
            if self.by_keyword:
                mixed, _ = self.attention(x, x, x, attn_mask=mask, need_weights=False)
            else:
                mixed, _ = self.attention(x, x, x, None, False, mask)
            return self.out(mixed.mean(1))
        weight, bias_in = self.attention.in_proj_weight, self.attention.in_proj_bias
        q, k, v = (F.linear(x, w, b).unflatten(-1, (2, 3)).transpose(1, 2)
                   for w, b in zip(weight.chunk(3), bias_in.chunk(3), strict=True))
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(1)).transpose(1, 2).flatten(2)
        mixed = self.attention.out_proj(mixed)
        return self.out(mixed.mean(1))


@pytest.mark.parametrize("by_keyword", [True, False], ids=["keyword", "positional"])
@pytest.mark.parametrize("composite", [AttnLRP(0.25), CPLRP(0.25), AttnLRP(0.0)], ids=["attnlrp", "cplrp", "attnlrp0"])
@pytest.mark.parametrize("capture", ["fx", "eager"])  # eager: F.multi_head_attention_forward, called by keyword
def test_multihead_attention_gives_a_relevance_carrying_mask_its_share(by_keyword: bool, composite, capture) -> None:
    torch.manual_seed(4)
    module = MultiheadWithInputBias(fused=False, by_keyword=by_keyword).double().eval()
    fused = MultiheadWithInputBias(fused=True).double().eval()
    fused.load_state_dict(module.state_dict())
    inputs = torch.randn(2, LENGTH, 6, dtype=torch.float64)
    assert torch.allclose(module(inputs), fused(inputs), rtol=0, atol=1e-12)
    expected = fxlrp.attribute(fxlrp.convert(fused, composite, strict=True), inputs, target=1)
    relevance = fxlrp.attribute(fxlrp.convert(module, composite, strict=True, capture=capture), inputs, target=1)
    assert relative_error(relevance, expected) <= 1e-10


class MultiheadSelfAttention(nn.Module):
    """``nn.MultiheadAttention`` on ``x`` with a boolean mask and padded keys, its weights asked
    for or not (the output alone is explained either way)."""

    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        self.out = nn.Linear(6, 2)
        self.register_buffer("mask", torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(2))  # True: may not attend
        self.register_buffer("padding", torch.tensor([[False] * LENGTH, [False] * (LENGTH - 2) + [True] * 2]))

    def forward(self, x: Tensor) -> Tensor:
        mixed, _ = self.attention(x, x, x, key_padding_mask=self.padding, attn_mask=self.mask,
                                  need_weights=self.need_weights)
        return self.out(mixed.mean(1))


@pytest.mark.parametrize("composite", [AttnLRP(0.25), Epsilon(0.25), CPLRP(0.25), AttnLRP(0.0)],
                         ids=["attnlrp", "epsilon", "cplrp", "attnlrp0"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_multihead_attention_without_weights_is_explained_as_with_them(composite, capture, monkeypatch) -> None:
    """Without its weights asked for, nn.MultiheadAttention's decomposition runs the heads'
    attention as F.scaled_dot_product_attention, explained by that entry (in closed form in the
    relevance form); with them, the decomposition's products and softmax run one by one under the
    interpretation, each with its own rule: the same relevance (float64), masks included."""
    torch.manual_seed(6)
    without, with_weights = MultiheadSelfAttention(False).double().eval(), MultiheadSelfAttention(True).double().eval()
    with_weights.load_state_dict(without.state_dict())
    inputs = torch.randn(2, LENGTH, 6, dtype=torch.float64)
    closed_forms = []
    original = attention.attention_relevance
    monkeypatch.setattr(attention, "attention_relevance", lambda *args: closed_forms.append(1) or original(*args))
    expected = fxlrp.attribute(fxlrp.convert(with_weights, composite, capture=capture, strict=True), inputs, target=1)
    assert not closed_forms
    relevance = fxlrp.attribute(fxlrp.convert(without, composite, capture=capture, strict=True), inputs, target=1)
    assert len(closed_forms) == (0 if composite.__class__ is AttnLRP and composite.epsilon == 0.0 else 1)
    assert relative_error(relevance, expected) <= 1e-12
    assert expected.abs().sum() > 0


class CopiedKeysAndValues(nn.Module):
    """``nn.MultiheadAttention`` on one tensor as query, key and value, or on copies of it as key
    and value (three tensors: three projections)."""

    def __init__(self, copies: bool) -> None:
        super().__init__()
        self.copies = copies
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        key, value = (x.clone(), x.clone()) if self.copies else (x, x)
        mixed, _ = self.attention(x, key, value, need_weights=False)
        return self.out(mixed.mean(1))


@pytest.mark.parametrize("composite", [AttnLRP(0.25), Epsilon(0.25), AttnLRP(0.0), Composite(layer_rule=ZPlus())],
                         ids=["attnlrp", "epsilon", "attnlrp0", "zplus"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_self_attention_projects_query_key_and_value_in_one_product(composite, capture) -> None:
    """Called with one tensor as query, key and value, nn.MultiheadAttention's decomposition
    projects them with the packed weight in one product; every rule shares relevance output by
    output, so the input's relevance is that of three projections of copies (float64)."""
    torch.manual_seed(7)
    one, copies = CopiedKeysAndValues(False).double().eval(), CopiedKeysAndValues(True).double().eval()
    copies.load_state_dict(one.state_dict())
    inputs = torch.randn(2, LENGTH, 6, dtype=torch.float64)
    expected = fxlrp.attribute(fxlrp.convert(copies, composite, capture=capture, strict=True), inputs, target=1)
    relevance = fxlrp.attribute(fxlrp.convert(one, composite, capture=capture, strict=True), inputs, target=1)
    assert relative_error(relevance, expected) <= 1e-12
    assert expected.abs().sum() > 0
