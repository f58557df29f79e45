"""AttnLRP and CP-LRP composites against the Gradient x Input formulation of LXT's efficient mode.

LXT computes AttnLRP as gradient x input of the model with modified backward passes: the
gradient through the query and key of an attention head divided by 4 and through its value by 2
(each matmul shares uniformly), through a gating product by 2, through an activation scaled by
``act(x) / x`` (the identity rule), through a normalisation's ``1 / sigma`` stopped; CP-LRP
stops the gradient through query, key and gate. The references here build exactly that with
small autograd Functions written in this file (not fxlrp's), in float64; with ``epsilon=0`` the
composites must give the same relevance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from support.references import relative_error
from torch import nn

import fxlrp
from fxlrp.rules.composites import CPLRP, AttnLRP


class DivideGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value, factor):
        ctx.factor = factor
        return value.view_as(value)

    @staticmethod
    def backward(ctx, gradient):
        return gradient / ctx.factor, None


class IdentityRule(torch.autograd.Function):
    """``act(x)`` whose backward scales by ``act(x) / x``: gradient x input passes ``R`` unchanged."""

    @staticmethod
    def forward(ctx, x, function):
        output = function(x)
        ctx.save_for_backward(output / x)
        return output

    @staticmethod
    def backward(ctx, gradient):
        return gradient * ctx.saved_tensors[0], None


class Block(nn.Module):
    """RMSNorm -> one attention head with a residual -> RMSNorm -> SwiGLU MLP with a residual ->
    head. ``mode``: None (the model), "attnlrp" or "cplrp" (LXT's modified backward)."""

    def __init__(self, width: int = 8, mode: str | None = None) -> None:
        super().__init__()
        self.mode = mode
        self.query, self.key, self.value, self.out = (nn.Linear(width, width) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(width, 12), nn.Linear(width, 12), nn.Linear(12, width)
        self.norm_weight = nn.Parameter(torch.rand(width) + 0.5)
        self.head = nn.Linear(width, 3)

    def normalise(self, x):
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.mode is not None:
            scale = scale.detach()
        return self.norm_weight * (x * scale)

    def forward(self, x):
        q, k, v = self.query(self.normalise(x)), self.key(self.normalise(x)), self.value(self.normalise(x))
        if self.mode == "attnlrp":
            q, k, v = DivideGradient.apply(q, 4), DivideGradient.apply(k, 4), DivideGradient.apply(v, 2)
        elif self.mode == "cplrp":
            q, k = q.detach(), k.detach()
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.out(weights @ v)
        hidden = self.normalise(x)
        gate = self.gate(hidden)
        if self.mode == "cplrp":
            gate = F.silu(gate.detach())
        elif self.mode == "attnlrp":
            gate = IdentityRule.apply(gate, F.silu)
        else:
            gate = F.silu(gate)
        product = gate * self.up(hidden)
        if self.mode == "attnlrp":
            product = DivideGradient.apply(product, 2)
        x = x + self.down(product)
        return self.head(x[:, -1])


def lxt_relevance(model: Block, x: torch.Tensor, target: int) -> torch.Tensor:
    leaf = x.clone().requires_grad_()
    output = model(leaf)
    output[:, target].sum().backward()
    return (leaf.grad * leaf).detach()


@pytest.mark.parametrize(("composite", "mode"), [(AttnLRP, "attnlrp"), (CPLRP, "cplrp")])
def test_composites_equal_lxts_gradient_times_input(composite, mode: str) -> None:
    torch.manual_seed(0)
    model = Block().double().eval()
    reference = Block(mode=mode).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    expected = lxt_relevance(reference, x, target=1)
    relevance = fxlrp.attribute(fxlrp.convert(model, composite(epsilon=0.0)), x, target=1)
    assert relative_error(relevance, expected) < 1e-10
    # and the two composites differ: the test tells them apart
    other = CPLRP if composite is AttnLRP else AttnLRP
    assert relative_error(fxlrp.attribute(fxlrp.convert(model, other(epsilon=0.0)), x, target=1), expected) > 1e-3


def test_attnlrp_on_torchvision_vit_runs_through_the_graph_with_finite_relevance() -> None:
    import torchvision

    torch.manual_seed(1)
    model = torchvision.models.VisionTransformer(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3).eval()
    nn.init.normal_(model.heads.head.weight)  # torchvision starts the head at 0
    x = torch.randn(2, 3, 16, 16)
    for composite in (AttnLRP(), CPLRP()):
        explain = fxlrp.convert(model, composite)
        assert "eager" not in {row.handling for row in explain.report().rows}
        relevance = fxlrp.attribute(explain, x)
        assert torch.isfinite(relevance).all() and relevance.abs().sum() > 0


class ComplexRotary(nn.Module):
    """A rotary embedding as Llama 4 writes it: pairs of features as complex numbers times
    ``e^(i theta)`` (``as_complex=True``), or as its real form on the pairs (``False``), between
    two linear layers; a branch on the input's values makes it run eagerly (``eager=True``)."""

    def __init__(self, as_complex: bool, eager: bool) -> None:
        super().__init__()
        self.as_complex, self.eager = as_complex, eager
        self.query, self.out = nn.Linear(6, 8), nn.Linear(8, 3)
        self.register_buffer("angles", torch.randn(5, 4))

    def forward(self, x):
        if self.eager and x.sum() > 1e9:
            x = -x
        q = self.query(x).reshape(*x.shape[:-1], 4, 2)  # (batch, 5, 4 pairs, 2)
        if self.as_complex:
            rotation = torch.polar(torch.ones_like(self.angles), self.angles)
            rotated = torch.view_as_real(torch.view_as_complex(q) * rotation).flatten(-2)
        else:
            cos, sin = self.angles.cos(), self.angles.sin()
            real, imaginary = q[..., 0], q[..., 1]
            rotated = torch.stack((real * cos - imaginary * sin, real * sin + imaginary * cos), -1).flatten(-2)
        return self.out(F.gelu(rotated)).sum(-2)


@pytest.mark.parametrize("epsilon", [0.0, 1e-6])
@pytest.mark.parametrize("eager", [False, True])
def test_a_complex_rotary_embedding_is_explained_as_its_real_form(eager: bool, epsilon: float) -> None:
    """Llama 4 rotates query and key as complex numbers (``view_as_complex``, a product with
    ``e^(i theta)``, ``view_as_real``): views had no rule for them, and an elementwise product's
    rule (relevance passes unchanged) would not see that a complex product mixes the two parts of
    each number. The same rotation written on the real pairs is the reference: the same relevance,
    in the gradient form (epsilon 0) and the relevance form (1e-6), captured and run eagerly."""
    torch.manual_seed(0)
    complex_model = ComplexRotary(as_complex=True, eager=eager).double()
    real_model = ComplexRotary(as_complex=False, eager=eager).double()
    real_model.load_state_dict(complex_model.state_dict())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    explain = fxlrp.convert(complex_model, AttnLRP(epsilon))
    reference = fxlrp.convert(real_model, AttnLRP(epsilon))
    assert torch.equal(explain(x), complex_model(x))
    expected = fxlrp.attribute(reference, x, target=1)
    for _ in range(3):  # (run eagerly: the second call records, the third replays)
        assert relative_error(fxlrp.attribute(explain, x, target=1), expected) < 1e-12


class ComplexSum(nn.Module):
    """Two complex tensors added (``as_complex=True``), or the same sum on their real pairs."""

    def __init__(self, as_complex: bool) -> None:
        super().__init__()
        self.as_complex = as_complex
        self.first, self.second, self.out = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        a, b = self.first(x).reshape(-1, 4, 2), self.second(x).reshape(-1, 4, 2)
        if self.as_complex:
            return self.out(torch.view_as_real(torch.view_as_complex(a) + torch.view_as_complex(b)).flatten(-2))
        return self.out((a + b).flatten(-2))


def test_other_operations_on_complex_numbers_are_refused_where_their_rule_would_divide() -> None:
    """Rules divide relevance by values; for complex values that mixes their two parts (a sum of
    two complex tensors under the z-rule: 107% other relevance than the same sum on real pairs).
    In the relevance form such an operation is refused, naming the way out; in the gradient form
    the sum's z-rule is the modified gradient, which equals the real form's (epsilon 0, and 1e-6
    on the layers)."""
    torch.manual_seed(0)
    complex_model, real_model = ComplexSum(as_complex=True).double(), ComplexSum(as_complex=False).double()
    real_model.load_state_dict(complex_model.state_dict())
    x = torch.randn(5, 6, dtype=torch.float64)
    in_relevance_form = fxlrp.convert(complex_model, AttnLRP(1e-6))
    in_relevance_form.keep_to_relevance_form()
    with pytest.raises(fxlrp.UnsupportedOperationError, match="on complex numbers"):
        fxlrp.attribute(in_relevance_form, x, target=1)
    for epsilon in (0.0, 1e-6):
        expected = fxlrp.attribute(fxlrp.convert(real_model, AttnLRP(epsilon)), x, target=1)
        explained = fxlrp.attribute(fxlrp.convert(complex_model, AttnLRP(epsilon)), x, target=1)
        assert relative_error(explained, expected) < 1e-12
