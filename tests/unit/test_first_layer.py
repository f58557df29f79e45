"""The first layer is found by one definition on both capture paths (fxlrp.rules.first_layer).

Reference: the same composite with the first layer named by a name rule, which needs no search.
"""

from __future__ import annotations

import pytest
import torch
from support.references import relative_error
from torch import nn

import fxlrp
from fxlrp.rules import Flat
from fxlrp.rules.composites import EpsilonPlus, EpsilonPlusFlat
from fxlrp.rules.first_layer import meets_inputs


class TokenModel(nn.Module):
    """Token ids -> embedding -> two linear layers; ``per_token`` loops over the tokens
    (``range(h.shape[1])``), so torch.fx cannot trace it and the whole model runs eagerly."""

    def __init__(self, per_token: bool) -> None:
        super().__init__()
        self.per_token = per_token
        self.embedding, self.first, self.second = nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, ids):
        h = self.embedding(ids)
        if self.per_token:
            h = torch.stack([h[:, index] for index in range(h.shape[1])], dim=1)
        return self.second(torch.relu(self.first(h))).sum(dim=1)


@pytest.mark.parametrize("per_token", [False, True], ids=["traced", "eager"])
def test_the_layer_after_an_embedding_lookup_is_the_first_layer_on_both_paths(per_token: bool) -> None:
    """Relevance starts at the embedding lookup (token ids carry none): the first linear layer
    meets the input, in a traced graph and in a model run eagerly, at every call (the relevance
    mode, then the recorded run)."""
    torch.manual_seed(0)
    model = TokenModel(per_token).double()
    # EpsilonPlusFlat is EpsilonPlus with Flat on the first layer: here named
    named = fxlrp.convert(model, EpsilonPlus(name_rules={"first": Flat(1e-6)}))
    explain = fxlrp.convert(model, EpsilonPlusFlat())
    for _ in range(3):
        ids = torch.randint(0, 10, (2, 5))
        expected = fxlrp.attribute(named, ids, target=1)
        assert relative_error(fxlrp.attribute(explain, ids, target=1), expected) < 1e-12
        unnamed = fxlrp.attribute(fxlrp.convert(model, EpsilonPlus()), ids, target=1)
        assert relative_error(unnamed, expected) > 1e-3  # (the first layer's rule matters here)


def test_meets_inputs_walks_back_to_where_relevance_starts() -> None:
    """A small graph by hand: x -> a (layer) -> b (layer); x -> c -> b; s (a source) -> d (layer)."""
    edges = {"x": [], "a": ["x"], "c": ["x"], "b": ["a", "c"], "s": [], "d": ["s"], "outside": None}
    layers = {"a", "b", "d"}

    def predecessors(name):
        return None if name in layers else edges[name]

    assert meets_inputs(edges["a"], predecessors)  # first
    assert not meets_inputs(edges["b"], predecessors)  # reads a's output
    assert meets_inputs(edges["d"], predecessors)  # relevance starts at s
    assert meets_inputs([], predecessors)  # relevance starts at the call itself
    assert not meets_inputs(["c", "outside"], predecessors)  # a value from outside the inputs
