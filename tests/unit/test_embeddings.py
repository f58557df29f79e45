"""Models that take token ids: relevance ends at the embedding lookup's output.

Reference: gradient x input at the lookup's output (the embeddings as leaves), which LRP-0 equals
for a piecewise-linear network (float64); per token it is summed over the embedding dimension.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from support.references import LRP0, onehot_relevance, relative_error
from torch import nn

import fxlrp

TOLERANCE = 1e-12
VOCABULARY, WIDTH, LENGTH = 11, 6, 5


class TokenModel(nn.Module):
    """``embed(ids)`` -> per-token layer, ReLU -> sum over tokens -> classifier."""

    def __init__(self, embed: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.embed_with = embed
        self.tokens = nn.Embedding(VOCABULARY, WIDTH, padding_idx=0)
        self.table = nn.Parameter(torch.randn(VOCABULARY, WIDTH))
        self.positions = nn.Embedding(LENGTH, WIDTH)
        self.hidden, self.head = nn.Linear(WIDTH, 8), nn.Linear(8, 3)

    def embed(self, ids):
        return self.embed_with(self, ids)

    def rest(self, embedded):
        return self.head(torch.relu(self.hidden(embedded)).sum(dim=1))

    def forward(self, ids):
        return self.rest(self.embed(ids))


SPELLINGS = {
    "nn.Embedding": lambda self, ids: self.tokens(ids),
    "F.embedding": lambda self, ids: F.embedding(ids, self.table),
    "torch.embedding": lambda self, ids: torch.embedding(self.table, ids),
    "viewed ids": lambda self, ids: self.tokens(ids.view(-1, ids.shape[-1])),
}


def ids_batch() -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (3, LENGTH), generator=torch.Generator().manual_seed(2))


def gradient_times_embedding(model: TokenModel, ids: torch.Tensor, target: int) -> torch.Tensor:
    embedded = model.embed(ids).detach().requires_grad_()
    output = model.rest(embedded)
    relevance = onehot_relevance(output, target)
    [gradient] = torch.autograd.grad(output, [embedded], relevance / output.detach())
    return embedded.detach() * gradient


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_token_relevance_is_gradient_times_input_at_the_embedding(spelling: str) -> None:
    torch.manual_seed(0)
    model = TokenModel(SPELLINGS[spelling]).double().eval()
    ids = ids_batch()
    expected = gradient_times_embedding(model, ids, target=1)
    explain = fxlrp.convert(model, LRP0)
    with torch.no_grad():
        assert torch.equal(explain(ids), model(ids))
    relevance = fxlrp.attribute(explain, ids, target=1)
    assert relevance.shape == ids.shape
    assert relative_error(relevance, expected.sum(dim=-1)) < TOLERANCE

    # Per token and embedding dimension: the lookup node's relevance (strict=False too).
    [lookup] = [row.name for row in explain.report().rows if row.operation == "embedding"]
    for converted in (explain, fxlrp.convert(model, LRP0, strict=False)):
        _, nodes = fxlrp.attribute_nodes(converted, ids, [lookup], target=1)
        assert relative_error(nodes[lookup], expected) < TOLERANCE


def test_position_embeddings_take_their_share_like_a_bias() -> None:
    def tokens_and_positions(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)

    torch.manual_seed(1)
    model = TokenModel(tokens_and_positions).double().eval()
    ids = ids_batch()
    # Reference: the token embeddings are the input, the position embeddings a constant term.
    tokens = model.tokens(ids).detach().requires_grad_()
    output = model.rest(tokens + model.positions.weight[: ids.shape[1]])
    [gradient] = torch.autograd.grad(output, [tokens], onehot_relevance(output, 2) / output.detach())
    relevance = fxlrp.attribute(fxlrp.convert(model, LRP0), ids, target=2)
    assert relative_error(relevance, (tokens * gradient).detach().sum(dim=-1)) < TOLERANCE


def _positions_multiplied(self, ids):
    positions = torch.arange(ids.shape[1], device=ids.device)
    return self.tokens(ids) * self.positions(positions)  # (RoFormer's rotary positions: a lookup)


@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_position_embeddings_that_multiply_are_constants(capture: str) -> None:
    """Every embedding lookup was a relevance source, so a position embedding that multiplies the
    token embeddings (RoFormer's sinusoidal rotary table is an nn.Embedding) made a product of two
    relevance-carrying factors, which took half of the relevance from the tokens (LRP-0: the
    product rule shares it). Only lookups of the explained ids are sources; the positions are a
    constant, as in the reference. Three calls each (the second records, the third replays)."""
    torch.manual_seed(1)
    model = TokenModel(_positions_multiplied).double().eval()
    ids = ids_batch()
    tokens = model.tokens(ids).detach().requires_grad_()
    output = model.rest(tokens * model.positions.weight[: ids.shape[1]])
    [gradient] = torch.autograd.grad(output, [tokens], onehot_relevance(output, 2) / output.detach())
    explain = fxlrp.convert(model, LRP0, capture=capture)
    for _ in range(3):
        relevance = fxlrp.attribute(explain, ids, target=2)
        assert relative_error(relevance, (tokens * gradient).detach().sum(dim=-1)) < TOLERANCE


def _positions_added_in_place(self, ids):
    embedded = self.tokens(ids)
    embedded += self.positions(torch.arange(ids.shape[1], device=ids.device))  # (GIT, CTRL)
    embedded[..., :2] *= 3.0  # (a write into a view of it)
    return embedded


@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_writes_into_the_lookups_output_leave_its_relevance_at_the_lookup(capture: str) -> None:
    """``embeddings += position_embeddings`` in code run eagerly gave the lookup's Python object
    the sum's values, and relevance was read at the sum: the position embeddings' share went to
    the tokens, on the first call of each input signature (GIT's first explanation 41% off its
    replays). Three calls each (the second records, the third replays)."""
    torch.manual_seed(1)
    model = TokenModel(_positions_added_in_place).double().eval()
    ids = ids_batch()
    tokens = model.tokens(ids).detach().requires_grad_()
    scale = torch.tensor([3.0, 3.0] + [1.0] * (WIDTH - 2), dtype=torch.float64)
    output = model.rest((tokens + model.positions.weight[: ids.shape[1]]) * scale)
    [gradient] = torch.autograd.grad(output, [tokens], onehot_relevance(output, 2) / output.detach())
    explain = fxlrp.convert(model, LRP0, capture=capture)
    for _ in range(3):
        assert torch.equal(explain(ids), model(ids))
        relevance = fxlrp.attribute(explain, ids, target=2)
        assert relative_error(relevance, (tokens * gradient).detach().sum(dim=-1)) < TOLERANCE


class BagModel(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.bags = nn.EmbeddingBag(VOCABULARY, WIDTH, mode=mode, padding_idx=0)
        self.hidden, self.head = nn.Linear(WIDTH, 8), nn.Linear(8, 3)

    def forward(self, ids, offsets, weights=None):
        return self.head(torch.relu(self.hidden(self.bags(ids, offsets, per_sample_weights=weights))))


def bag_by_hand(tokens: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, mode: str, weights) -> torch.Tensor:
    """EmbeddingBag written out bag by bag (the padding id 0 is left out)."""
    ends = [*offsets[1:].tolist(), ids.numel()]
    rows = []
    for start, end in zip(offsets.tolist(), ends, strict=True):
        members = [i for i in range(start, end) if ids[i] != 0]
        if not members:
            rows.append(torch.zeros(WIDTH, dtype=tokens.dtype))
            continue
        picked = tokens[members] * (weights[members, None] if weights is not None else 1.0)
        rows.append({"sum": picked.sum(0), "mean": picked.mean(0), "max": picked.amax(0)}[mode])
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_relevance_per_token(mode: str) -> None:
    torch.manual_seed(3)
    model = BagModel(mode).double().eval()
    ids = torch.tensor([3, 0, 7, 2, 9, 4, 4, 1, 10, 6])
    offsets = torch.tensor([0, 3, 4, 8])
    weights = torch.rand(10, dtype=torch.float64) + 0.5 if mode == "sum" else None
    tokens = model.bags.weight[ids].detach().requires_grad_()
    output = model.head(torch.relu(model.hidden(bag_by_hand(tokens, ids, offsets, mode, weights))))
    with torch.no_grad():
        assert relative_error(model(ids, offsets, weights), output) < 1e-13
    [gradient] = torch.autograd.grad(output, [tokens], onehot_relevance(output, 0) / output.detach())
    expected = (tokens * gradient).detach().sum(dim=-1)

    explain = fxlrp.convert(model, LRP0)
    relevance, _, _ = fxlrp.attribute(explain, (ids, offsets, weights), target=0)
    assert relevance.shape == ids.shape
    assert relative_error(relevance, expected) < TOLERANCE
    assert relevance[1] == 0  # the padding id takes no part


def test_inputs_that_cannot_receive_relevance_are_named() -> None:
    class Counter(nn.Module):
        def forward(self, ids):
            return (ids * 2).to(torch.float64)

    with pytest.raises(ValueError, match="none of the inputs can receive relevance: give the floating-point"):
        fxlrp.attribute(fxlrp.convert(Counter(), strict=False), torch.tensor([[1, 2]]))


COPIES = {
    "transposed": lambda self, ids: self.tokens(ids.t().contiguous()).transpose(0, 1),  # (XLNet: length first)
    "padded": lambda self, ids: self.tokens(F.pad(ids, (0, 3)))[:, :ids.shape[1]],  # (Longformer: to its window)
}


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize("copy", list(COPIES))
def test_a_lookup_of_a_copy_of_the_ids_names_the_copy_and_the_way_out(copy: str, capture: str) -> None:
    """A model that looks up a copy it makes of its ids (XLNet transposes them, Longformer pads
    them) had its lookup matched to no input: the error said to pass token ids the model looks
    up, which it does. It names the copy now, and says to pass the embeddings instead."""
    torch.manual_seed(1)
    model = TokenModel(COPIES[copy]).double().eval()
    explain = fxlrp.convert(model, LRP0, capture=capture)
    with pytest.raises(ValueError, match="looks up a copy it makes of the token ids it is given") as error:
        fxlrp.attribute(explain, ids_batch(), target=2)
    assert "inputs_embeds" in str(error.value)


def test_a_contrastive_target_is_the_difference_of_two_explanations() -> None:
    torch.manual_seed(4)
    model = TokenModel(SPELLINGS["nn.Embedding"]).double().eval()
    ids = ids_batch()
    explain = fxlrp.convert(model, LRP0)
    contrast = fxlrp.attribute(explain, ids, target=(2, 0))
    expected = gradient_times_embedding(model, ids, 2) - gradient_times_embedding(model, ids, 0)
    assert relative_error(contrast, expected.sum(dim=-1)) < TOLERANCE


class Output:
    """A model output with logits per position, as Hugging Face's causal LMs return it."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class CausalModel(TokenModel):
    def forward(self, ids):
        return Output(self.head(torch.relu(self.hidden(self.embed(ids)))))


def test_a_causal_lm_output_explains_the_next_token_at_the_last_position() -> None:
    torch.manual_seed(5)
    model = CausalModel(SPELLINGS["nn.Embedding"]).double().eval()
    ids = ids_batch()
    explain = fxlrp.convert(model, LRP0, capture="eager")
    relevance = fxlrp.attribute(explain, ids)  # target None: the predicted token at the last position
    embedded = model.embed(ids).detach().requires_grad_()
    last = model.head(torch.relu(model.hidden(embedded)))[:, -1]
    seed = onehot_relevance(last, 0) * 0
    seed.scatter_(1, last.argmax(1, keepdim=True), last.gather(1, last.argmax(1, keepdim=True)))
    [gradient] = torch.autograd.grad(last, [embedded], seed / last.detach())
    assert relative_error(relevance, (embedded * gradient).detach().sum(-1)) < TOLERANCE
    assert relevance[:, :-1].abs().max() == 0  # this toy model mixes no positions
