"""One table of spellings: ``x op= y`` means the same operation whether torch.fx traces it
(``operator.iadd``), the relevance mode runs it (``Tensor.__iadd__``) or a recording replays it.

Reference: gradient x input for LRP-0 (float64) on bias-free maps, where the two are equal, and
the traced graph's relevance for every path.
"""

from __future__ import annotations

import torch
from support.references import LRP0, gradient_times_input, onehot_relevance, recordings, relative_error
from torch import nn

import fxlrp
from fxlrp.registry.spellings import AUGMENTED_ASSIGNMENTS, OPERATORS, OUT_OF_PLACE_OPERATORS


class Augmented(nn.Module):
    """Every arithmetic augmented assignment on relevance-carrying tensors; ``per_token`` loops over
    the tokens (``range(x.shape[1])``), which torch.fx cannot trace: the module runs eagerly,
    under the relevance mode at its first call, recorded at its second, replayed after."""

    def __init__(self, per_token: bool) -> None:
        super().__init__()
        self.per_token = per_token
        self.a, self.b, self.c = (nn.Linear(4, 5, bias=False) for _ in range(3))
        self.head = nn.Linear(5, 3, bias=False)

    def forward(self, x):
        if self.per_token:
            x = torch.stack([x[:, index] for index in range(x.shape[1])], dim=1)
        h = self.a(x)
        h += self.b(x)
        h -= self.c(x)
        h *= 2.0
        h /= 4.0
        h = torch.relu(h)
        return self.head(h.sum(dim=1))


def test_augmented_assignments_explain_alike_on_every_path() -> None:
    torch.manual_seed(0)
    traced, eager = Augmented(per_token=False).double(), Augmented(per_token=True).double()
    eager.load_state_dict(traced.state_dict())
    explain_traced, explain_eager = fxlrp.convert(traced, LRP0), fxlrp.convert(eager, LRP0)
    assert fxlrp.convert(traced, LRP0, capture="fx") is not None  # traced by torch.fx as a whole
    for _ in range(4):  # relevance mode, recording, replays
        x = torch.randn(2, 3, 4, dtype=torch.float64)
        expected = fxlrp.attribute(explain_traced, x, target=1)
        [reference] = gradient_times_input(traced, [x], lambda out: out, lambda out: onehot_relevance(out, 1))
        assert relative_error(expected, reference) < 1e-12
        assert relative_error(fxlrp.attribute(explain_eager, x, target=1), expected) < 1e-12
    [recorded] = recordings(explain_eager)
    assert recorded.replays and not recorded.refused


def test_every_spelling_table_holds_each_augmented_assignment() -> None:
    """Each augmented assignment Tensor has is in the table, with the operator torch.fx records."""
    methods = {name for name in vars(torch.Tensor) if name.startswith("__i") and name[3:-2] in
               {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
                "matmul"}}
    assert methods <= AUGMENTED_ASSIGNMENTS.keys()
    for spelling in AUGMENTED_ASSIGNMENTS.values():
        assert OUT_OF_PLACE_OPERATORS[spelling.in_place_operator] is spelling.operator
        assert OPERATORS[spelling.operator_method] == (spelling.operator, False)
        a, b = torch.tensor([[6, 5], [3, 1]]), torch.tensor([[4, 2], [1, 3]])
        if spelling.method == "__itruediv__":
            a, b = a.double(), b.double()
        assert torch.equal(spelling.operator(a, b), getattr(a, spelling.operator_method)(b))
        if hasattr(torch.Tensor, spelling.method):
            c = a.clone()
            assert torch.equal(getattr(c, spelling.method)(b), spelling.operator(a, b))

