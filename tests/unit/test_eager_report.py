"""The report of a part run eagerly lists the operations its runs made, as a traced graph's lists
its nodes: module, operation, handling, rule, source line; and says why a part runs eagerly in the
model's terms, not torch.fx's or fxlrp's exceptions.

Reference: the model's own modules (``named_modules``) and the rules a traced twin of the model
gets for the same layers.
"""

from __future__ import annotations

import re
import warnings

import torch
from support.references import LRP0
from torch import nn

import fxlrp
from fxlrp.rules.composites import EpsilonPlusFlat


class PerToken(nn.Module):
    """A loop over the tokens, which torch.fx cannot trace: the whole model runs eagerly."""

    def __init__(self, loop: bool = True) -> None:
        super().__init__()
        self.loop = loop
        self.embed, self.mix, self.head = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        hidden = torch.relu(self.embed(x))
        if self.loop:
            steps = [torch.relu(self.mix(hidden[:, index])) for index in range(x.shape[1])]
            hidden = torch.stack(steps, dim=1)
        else:
            hidden = torch.relu(self.mix(hidden))
        return self.head(hidden.sum(dim=1))


def rows_of(report, operation):
    return [row for row in report.all_rows if row.operation == operation]


def test_a_part_run_eagerly_reports_each_layer_with_the_rule_a_traced_graph_gives_it() -> None:
    torch.manual_seed(0)
    eager, traced = PerToken(loop=True), PerToken(loop=False)
    traced.load_state_dict(eager.state_dict())
    explain = fxlrp.convert(eager, EpsilonPlusFlat())
    assert not rows_of(explain.report(), "linear")  # nothing has run yet
    fxlrp.attribute(explain, torch.randn(2, 5, 4), target=1)
    report = explain.report()
    ran = {row.name.rpartition(" › ")[2]: row for row in rows_of(report, "linear")}
    expected = {row.target: row for row in rows_of(fxlrp.convert(traced, EpsilonPlusFlat()).report(), "linear")}
    assert ran.keys() == expected.keys() == {name for name, module in eager.named_modules()
                                             if isinstance(module, nn.Linear)}
    for name, row in ran.items():
        assert (row.handling, row.rule) == (expected[name].handling, expected[name].rule), name
        assert re.search(r"test_eager_report\.py:\d+: ", row.source), row.source
    assert ran["mix"].target == "x5" and ran["head"].target == "x1"  # calls in one run: 5 tokens
    text = str(report)
    assert "operation(s) run eagerly (by module)" in text
    assert "its code uses a tensor's value or shape in Python control flow" in text
    assert "Proxy" not in text and "TypeError" not in text


def test_an_operation_without_a_rule_run_eagerly_is_a_row_of_the_report_and_lowers_coverage() -> None:
    class Unexplained(PerToken):
        def forward(self, x):
            return torch.special.erfinv(torch.tanh(super().forward(x)) * 0.5)

    explain = fxlrp.convert(Unexplained(), LRP0, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fxlrp.attribute(explain, torch.randn(2, 3, 4), target=0)
    report = explain.report()
    [row] = [row for row in report.all_rows if row.handling == "gradient"]
    assert "erfinv" in row.operation and "test_eager_report.py" in row.source
    assert report.coverage < 1.0


def test_a_hugging_face_model_reports_its_layers_and_why_it_runs_eagerly() -> None:
    import transformers

    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    explain = fxlrp.convert(model)
    ids = torch.randint(0, 50, (1, 6))
    for _ in range(3):  # the relevance mode, then the recording and its replay
        fxlrp.attribute(explain, ids, target=0)
    report = explain.report()
    linear = {row.name.rpartition(" › ")[2] for row in rows_of(report, "linear")}
    assert linear == {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    text = str(report)
    assert "torch.fx cannot take the arguments of its forward" in text
    for internal in ("co_varnames", "RecordingFailed", "Proxy", "ValueError"):
        assert internal not in text
