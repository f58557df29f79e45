"""Per-operation dense references for softmax, products of relevance-carrying tensors, gates and
normalisation layers, in float64.

References are written out by hand from the rules' formulas, with Jacobians from
``torch.autograd.functional.jacobian`` (see support.references): AttnLRP's softmax rule
``R_x = x (R - s sum R)``, the uniform epsilon rule ``R_a = 1/2 x_a J_a^T (R / stab(z))`` for
bilinear products, CP-LRP (attention weights constant), gating (signal takes all, or halves),
LayerNorm/GroupNorm as the affine map with sigma held constant.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from support.references import epsilon_reference, explained_relevance, gradient_times_input, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.registry import REGISTRY
from fxlrp.rules import Product as ProductRule
from fxlrp.rules.attention import cp_lrp, uniform_gates
from fxlrp.rules.composites import Composite, Site

TOLERANCE = 1e-12


def random(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class Softmax(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x, dim=-1)


class MatrixProduct(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a @ b


class Einsum(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.einsum("bij,bjk->bik", a, b)


class AttentionTimesValue(nn.Module):
    def forward(self, scores: Tensor, value: Tensor) -> Tensor:
        return scores.softmax(dim=-1) @ value


class Gated(nn.Module):
    """Squeeze-excitation's product: a per-channel gate broadcast over the signal."""

    def forward(self, signal: Tensor, gate_input: Tensor) -> Tensor:
        return signal * torch.sigmoid(gate_input)


class Product(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a * b


def softmax_reference(x: Tensor, relevance: Tensor) -> Tensor:
    s = torch.softmax(x, dim=-1)
    return x * (relevance - s * relevance.sum(-1, keepdim=True))


def test_softmax_rule_matches_formula_and_jacobian_form() -> None:
    x, relevance = random(2, 3, 7), random(2, 3, 7, seed=1)
    explain = fxlrp.convert(Softmax())
    [actual] = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, softmax_reference(x, relevance)) < TOLERANCE
    # the same rule as x * J^T (R / s): the epsilon rule (epsilon = 0) on the linearised softmax
    [dense] = epsilon_reference(lambda value: torch.softmax(value, dim=-1), [x], relevance, 0.0)
    assert relative_error(actual, dense) < TOLERANCE


class SoftmaxSpelled(nn.Module):
    """A softmax over ``dim``, written one of the ways models write it."""

    def __init__(self, spelling: str, dim: int) -> None:
        super().__init__()
        self.spelling, self.dim = spelling, dim
        self.module = nn.Softmax(dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.spelling == "F.softmax":
            return F.softmax(x, self.dim)
        if self.spelling == "torch.softmax(dim=)":
            return torch.softmax(x, dim=self.dim)
        if self.spelling == "Tensor.softmax":
            return x.softmax(self.dim)
        return self.module(x)


@pytest.mark.parametrize("dim", [0, 1, -2, 2])
@pytest.mark.parametrize("spelling", ["F.softmax", "torch.softmax(dim=)", "Tensor.softmax", "nn.Softmax"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_softmax_rule_over_any_dimension(spelling: str, dim: int, capture: str) -> None:
    # The rule's closed form sums over the dimension the softmax names: the dense reference is
    # x * J^T (R / s) with the Jacobian of the softmax over that dimension.
    x, relevance = random(2, 3, 4), random(2, 3, 4, seed=1)
    explain = fxlrp.convert(SoftmaxSpelled(spelling, dim), capture=capture)
    [actual] = explained_relevance(explain, [x], relevance)
    [dense] = epsilon_reference(lambda value: torch.softmax(value, dim=dim), [x], relevance, 0.0)
    assert relative_error(actual, dense) < TOLERANCE


class UpcastSoftmax(nn.Module):
    """Llama's eager attention: the softmax taken in float32 whatever the scores' dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, dim=-1, dtype=torch.float64)


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_softmax_rule_with_a_cast_output(capture: str) -> None:
    x, relevance = random(2, 3, 4).float(), random(2, 3, 4, seed=1)
    [actual] = explained_relevance(fxlrp.convert(UpcastSoftmax(), capture=capture), [x], relevance)
    assert actual.dtype == torch.float32
    # The rule runs in float64 (the softmax's dtype) on the float32 input's values; only the
    # relevance handed back through the cast to the float32 input is rounded, once: within half a
    # unit in float32's last place (2^-24 relative) of the formula in float64, plus float64's own
    # rounding (1e-12 is far above it)
    bound = torch.finfo(torch.float32).eps / 2 + 1e-12
    assert relative_error(actual.double(), softmax_reference(x.double(), relevance)) <= bound


def test_softmax_masked_inputs_get_no_relevance_and_no_nan() -> None:
    x = random(4, 5)
    x[:, 0] = float("-inf")
    [actual] = explained_relevance(fxlrp.convert(Softmax()), [x], random(4, 5, seed=1))
    assert torch.isfinite(actual).all()
    assert (actual[:, 0] == 0).all()


@pytest.mark.parametrize("module", [MatrixProduct(), Einsum()], ids=["matmul", "einsum"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_bilinear_product_uniform_epsilon_rule(module: nn.Module, epsilon: float) -> None:
    a, b, relevance = random(2, 3, 4), random(2, 4, 5, seed=1), random(2, 3, 5, seed=2)
    explain = fxlrp.convert(module, fxlrp.rules.Epsilon(epsilon))
    actual = explained_relevance(explain, [a, b], relevance)
    expected = epsilon_reference(module, [a, b], relevance, epsilon)  # each factor, the other fixed
    for got, reference in zip(actual, expected, strict=True):
        assert relative_error(got, reference / 2) < TOLERANCE
    if epsilon == 0.0:  # bilinear without bias: the two halves add up to the output relevance
        total = sum(value.sum() for value in actual)
        assert abs(total - relevance.sum()) < 1e-10 * relevance.abs().sum()


def test_attention_times_value_attnlrp_default() -> None:
    scores, value, relevance = random(2, 3, 4), random(2, 4, 5, seed=1), random(2, 3, 5, seed=2)
    explain = fxlrp.convert(AttentionTimesValue(), fxlrp.rules.Epsilon(0.0))
    actual_scores, actual_value = explained_relevance(explain, [scores, value], relevance)
    attention = torch.softmax(scores, dim=-1)
    relevance_attention, relevance_value = epsilon_reference(MatrixProduct(), [attention, value], relevance, 0.0)
    assert relative_error(actual_value, relevance_value / 2) < TOLERANCE
    assert relative_error(actual_scores, softmax_reference(scores, relevance_attention / 2)) < TOLERANCE


def test_attention_times_value_cp_lrp_gives_the_values_everything() -> None:
    scores, value, relevance = random(2, 3, 4), random(2, 4, 5, seed=1), random(2, 3, 5, seed=2)
    composite = Composite(fxlrp.rules.Epsilon(0.0), operation_rules=cp_lrp(0.0))
    actual_scores, actual_value = explained_relevance(fxlrp.convert(AttentionTimesValue(), composite),
                                                      [scores, value], relevance)
    attention = torch.softmax(scores, dim=-1)
    [expected] = epsilon_reference(lambda v: attention @ v, [value], relevance, 0.0)
    assert relative_error(actual_value, expected) < TOLERANCE
    assert (actual_scores == 0).all()
    assert abs(actual_value.sum() - relevance.sum()) < 1e-10 * relevance.abs().sum()


def test_gate_gets_no_relevance_by_default() -> None:
    signal, gate_input, relevance = random(2, 3, 4, 4), random(2, 3, 1, 1, seed=1), random(2, 3, 4, 4, seed=2)
    actual_signal, actual_gate = explained_relevance(fxlrp.convert(Gated()), [signal, gate_input], relevance)
    assert torch.equal(actual_signal, relevance)
    assert (actual_gate == 0).all()


def test_gate_uniform_split_is_selectable() -> None:
    signal, gate_input, relevance = random(2, 3, 4, 4), random(2, 3, 1, 1, seed=1), random(2, 3, 4, 4, seed=2)
    explain = fxlrp.convert(Gated(), Composite(fxlrp.rules.Epsilon(), operation_rules=uniform_gates()))
    actual_signal, actual_gate = explained_relevance(explain, [signal, gate_input], relevance)
    assert relative_error(actual_signal, relevance / 2) < TOLERANCE
    # sigmoid takes the identity rule; the broadcast gate collects its share over the positions
    assert relative_error(actual_gate, (relevance / 2).sum((2, 3), keepdim=True)) < TOLERANCE


def test_product_of_two_signals_splits_equally() -> None:
    a, b, relevance = random(3, 4), random(3, 4, seed=1), random(3, 4, seed=2)
    actual = explained_relevance(fxlrp.convert(Product()), [a, b], relevance)
    for got in actual:
        assert relative_error(got, relevance / 2) < TOLERANCE


class MultiplyAdd(nn.Module):
    """``b + x * y``: ``addcmul`` with two relevance-carrying multiplicands and a constant summand."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Parameter(random(4))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.addcmul(self.shift, a, b)


class AttentionBias(nn.Module):
    """``bias + a @ b / 2`` as BLOOM writes its ALiBi scores: ``bias.baddbmm(batch1=a, batch2=b)``."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(random(2, 3, 5))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.bias.baddbmm(batch1=a, batch2=b, alpha=0.5)


BILINEAR = {
    "matmul": (MatrixProduct, ((2, 3, 4), (2, 4, 5))),
    "einsum": (Einsum, ((2, 3, 4), (2, 4, 5))),
    "mul": (Product, ((3, 4), (3, 4))),
    "addcmul": (MultiplyAdd, ((3, 4), (3, 4))),
    "baddbmm": (AttentionBias, ((2, 3, 4), (2, 4, 5))),
}


@pytest.mark.parametrize("capture", ["fx", "eager"])
@pytest.mark.parametrize("operation", list(BILINEAR))
def test_bilinear_product_is_half_gradient_times_input_for_each_factor(operation: str, capture: str) -> None:
    """The uniform rule under LRP-0: ``R_a = a d<z, R / z>/da / 2``, half of gradient x input
    (taken by autograd on the model itself), on a captured graph and in code run eagerly alike."""
    module, shapes = BILINEAR[operation]
    model = module().double()
    inputs = [random(*shape, seed=seed) for seed, shape in enumerate(shapes)]
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0), capture=capture)
    actual = explained_relevance(explain, inputs, lambda output: output)
    expected = gradient_times_input(model, inputs, lambda output: output, lambda output: output)
    for got, reference in zip(actual, expected, strict=True):
        assert relative_error(got, reference / 2) < TOLERANCE


class LayerThenProduct(nn.Module):
    """Two matrix products: ``x @ W``, a layer (its weight the constant factor), then ``h @ x.T``,
    a product of two relevance-carrying tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(random(4, 4))

    def forward(self, x: Tensor) -> Tensor:
        return (x @ self.weight) @ x.transpose(-1, -2)


def test_a_product_of_two_relevance_carrying_tensors_has_the_product_rule_once_converted() -> None:
    """The composite's rule becomes the Product rule when the graph is converted (its epsilon
    kept), where a factor is a parameter it stays the layer rule."""
    explain = fxlrp.convert(LayerThenProduct(), fxlrp.rules.Epsilon(0.25), capture="fx")
    rules = [row.rule for row in explain.report().rows if row.operation == "matmul"]
    assert len(rules) == 2
    assert rules[0].startswith("Epsilon(epsilon=0.25")
    assert rules[1].startswith("Product(epsilon=0.25")


def test_a_rule_without_meaning_on_a_product_warns_at_conversion() -> None:
    composite = Composite(fxlrp.rules.ZPlus())
    with pytest.warns(UserWarning, match="no meaning"):
        explain = fxlrp.convert(MatrixProduct(), composite, capture="fx")
    assert [row.rule for row in explain.report().rows if row.operation == "matmul"] == [repr(ProductRule())]
    a, b, relevance = random(2, 3, 4), random(2, 4, 5, seed=1), random(2, 3, 5, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is chosen any more when the explainer runs
        actual = explained_relevance(explain, [a, b], relevance)
    expected = epsilon_reference(MatrixProduct(), [a, b], relevance, 1e-6)
    for got, reference in zip(actual, expected, strict=True):
        assert relative_error(got, reference / 2) < TOLERANCE


def test_resolve_gives_products_of_relevance_carrying_factors_a_product_rule_made_once() -> None:
    layer = fxlrp.rules.Epsilon(0.5)
    composite = Composite(layer)
    matmul = REGISTRY.operations["matmul"]

    def resolved(factors: int) -> object:
        return composite.resolve(Site("matmul", "matmul", True, None, None, False, relevance_factors=factors), matmul)

    assert resolved(1) is layer
    product = resolved(2)
    assert isinstance(product, ProductRule) and product.epsilon == 0.5 and resolved(3) is product


def test_code_run_eagerly_chooses_per_call_whether_a_product_has_several_relevance_carrying_factors() -> None:
    """In one module run eagerly, ``x @ W`` keeps the layer rule (z+) and ``h @ x.T`` gets the
    Product rule, as on the captured graph."""
    model, x = LayerThenProduct(), random(2, 3, 4, seed=1)
    relevance = {}
    for capture in ("fx", "eager"):
        with pytest.warns(UserWarning, match="no meaning"):  # z+ on the product of x and x W
            relevance[capture] = explained_relevance(
                fxlrp.convert(model, fxlrp.rules.ZPlus(), capture=capture), [x], lambda output: output)[0]
    assert relative_error(relevance["eager"], relevance["fx"]) < TOLERANCE


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor, relevance: Tensor, eps: float) -> Tensor:
    """The epsilon rule (epsilon = 0) on ``(x - mean x) / sigma * w + b`` with sigma fixed at x."""
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)

    def linearised(value: Tensor) -> Tensor:
        return (value - value.mean(-1, keepdim=True)) / sigma * weight + bias

    [expected] = epsilon_reference(linearised, [x], relevance, 0.0)
    return expected


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_identity_rule_on_sigma(with_bias: bool) -> None:
    norm = nn.LayerNorm(6, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(random(6, seed=3) + 1.5)
        norm.bias.copy_(random(6, seed=4) if with_bias else torch.zeros(6))
    x, relevance = random(2, 5, 6), random(2, 5, 6, seed=1)
    explain = fxlrp.convert(norm)
    assert torch.equal(explain(x), norm(x))  # the native kernel's values
    [actual] = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, layer_norm_reference(x, norm.weight.detach(), norm.bias.detach(), relevance,
                                                       1e-3)) < TOLERANCE
    if not with_bias:  # centring, scaling: linear, so the z-rule conserves
        assert abs(actual.sum() - relevance.sum()) < 1e-10 * relevance.abs().sum()


@pytest.mark.parametrize("rule", [fxlrp.rules.Epsilon(0.25), fxlrp.rules.Epsilon(0.25, zero_params="bias")],
                         ids=["closed form", "inner graph"])
def test_layer_norm_under_the_epsilon_rule_with_and_without_an_inner_graph(rule) -> None:
    """The epsilon rule takes LayerNorm's product with sigma held constant in closed form (no inner
    graph: the layer's input_gradient from the kernel's 1 / sigma); with zero_params it builds a
    graph of the modified layer, through HeldStatisticsGradient. Both against the rule by hand on
    the linearised map (the bias left out with zero_params)."""
    norm = nn.LayerNorm(6, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(random(6, seed=3) + 1.5)
        norm.bias.copy_(random(6, seed=4))
    x, relevance = random(2, 5, 6), random(2, 5, 6, seed=1)
    [actual] = explained_relevance(fxlrp.convert(norm, Composite(operation_rules={"layer_norm": rule})), [x], relevance)
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-3)
    bias = torch.zeros(6, dtype=torch.float64) if rule.zero_params else norm.bias.detach()

    def linearised(value: Tensor) -> Tensor:
        return (value - value.mean(-1, keepdim=True)) / sigma * norm.weight.detach() + bias

    [expected] = epsilon_reference(linearised, [x], relevance, 0.25)
    assert relative_error(actual, expected) < TOLERANCE


@pytest.mark.parametrize("rule", [fxlrp.rules.Epsilon(0.0), fxlrp.rules.Epsilon(0.25)], ids=repr)
def test_rms_norm_holds_the_root_mean_square_constant(rule) -> None:
    """``nn.RMSNorm``: ``x / rms(x) * w`` with the root mean square a constant of x, a per-feature
    scaling; the rule's product in closed form from x, against the rule by hand."""
    norm = nn.RMSNorm(6, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(random(6, seed=3) + 1.5)
    x, relevance = random(2, 5, 6), random(2, 5, 6, seed=1)
    explain = fxlrp.convert(norm, Composite(operation_rules={"rms_norm": rule}))
    assert torch.equal(explain(x), norm(x))
    [actual] = explained_relevance(explain, [x], relevance)
    rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-3)
    [expected] = epsilon_reference(lambda value: value / rms * norm.weight.detach(), [x], relevance, rule.epsilon)
    assert relative_error(actual, expected) < TOLERANCE


def test_functional_layer_norm_as_convnext_calls_it() -> None:
    """ConvNeXt's LayerNorm2d: permute, F.layer_norm with the weights, permute back."""
    from torchvision.models.convnext import LayerNorm2d

    norm = LayerNorm2d(4, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(random(4, seed=3))
        norm.bias.copy_(random(4, seed=4))
    x, relevance = random(2, 4, 3, 5), random(2, 4, 3, 5, seed=1)
    [actual] = explained_relevance(fxlrp.convert(norm), [x], relevance)
    to_last = x.permute(0, 2, 3, 1)
    expected = layer_norm_reference(to_last, norm.weight.detach(), norm.bias.detach(),
                                    relevance.permute(0, 2, 3, 1), 1e-6).permute(0, 3, 1, 2)
    assert relative_error(actual, expected) < TOLERANCE


def test_group_norm_identity_rule_on_sigma() -> None:
    norm = nn.GroupNorm(2, 4, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(random(4, seed=3))
        norm.bias.copy_(random(4, seed=4))
    x, relevance = random(2, 4, 3, 3), random(2, 4, 3, 3, seed=1)
    grouped = x.reshape(2, 2, -1)
    sigma = torch.sqrt(grouped.var(-1, unbiased=False, keepdim=True) + 1e-3)

    def linearised(value: Tensor) -> Tensor:
        groups = value.reshape(2, 2, -1)
        centred = ((groups - groups.mean(-1, keepdim=True)) / sigma).reshape(value.shape)
        return centred * norm.weight.detach().view(1, -1, 1, 1) + norm.bias.detach().view(1, -1, 1, 1)

    [expected] = epsilon_reference(linearised, [x], relevance, 0.0)
    [actual] = explained_relevance(fxlrp.convert(norm), [x], relevance)
    assert torch.equal(fxlrp.convert(norm)(x), norm(x))
    assert relative_error(actual, expected) < TOLERANCE


def bias_free_attention(batch_first: bool) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=batch_first).double().eval()
    with torch.no_grad():
        attention.in_proj_bias.zero_()
        attention.out_proj.bias.zero_()
    return attention


class SelfAttention(nn.Module):
    def __init__(self, attention: nn.MultiheadAttention, need_weights: bool) -> None:
        super().__init__()
        self.attention, self.need_weights = attention, need_weights

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(x, x, x, need_weights=self.need_weights)[0]


class FusedAttention(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_outputs_and_cp_lrp_conservation(batch_first: bool, need_weights: bool) -> None:
    model = SelfAttention(bias_free_attention(batch_first), need_weights)
    x = random(2, 5, 8)
    composite = Composite(fxlrp.rules.Epsilon(0.0), operation_rules=cp_lrp(0.0))
    explain = fxlrp.convert(model, composite)
    assert torch.equal(explain(x), model(x))
    relevance = random(2, 5, 8, seed=1)
    [actual] = explained_relevance(explain, [x], relevance)
    assert abs(actual.sum() - relevance.sum()) < 1e-10 * relevance.abs().sum()


def test_fused_attention_decomposition_cp_lrp_reference() -> None:
    """Under CP-LRP, sdpa is the linear map v -> softmax(q k^T / sqrt d) v in v; q, k get nothing."""
    q, k, v = random(2, 2, 3, 4), random(2, 2, 5, 4, seed=1), random(2, 2, 5, 4, seed=2)
    relevance = random(2, 2, 3, 4, seed=3)
    composite = Composite(fxlrp.rules.Epsilon(0.0), operation_rules=cp_lrp(0.0))
    explain = fxlrp.convert(FusedAttention(), composite)
    assert torch.equal(explain(q, k, v), F.scaled_dot_product_attention(q, k, v))
    relevance_q, relevance_k, relevance_v = explained_relevance(explain, [q, k, v], relevance)
    attention = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    [expected] = epsilon_reference(lambda value: attention @ value, [v], relevance, 0.0)
    assert relative_error(relevance_v, expected) < 1e-10
    assert (relevance_q == 0).all() and (relevance_k == 0).all()


@pytest.mark.parametrize("given", [
    ((1, 2, 3), {}),
    ((1, 2, 3), {"attn_mask": 4, "dropout_p": 0.1, "scale": 0.5, "is_causal": True, "enable_gqa": True}),
    ((1, 2, 3, 4, 0.2), {"enable_gqa": True}),
    ((1,), {"value": 3, "key": 2, "scale": 0.25}),
    ((), {"query": 1, "key": 2, "value": 3, "is_causal": True}),
])
def test_attention_arguments_bound_as_inspect_binds_them(given) -> None:
    """The attention rules bind a call's arguments by a plan made at its pattern's first call
    (how many by position, which by keyword); the reference is ``inspect``'s binding, every call."""
    from fxlrp.operations.attention import _ATTENTION, _bound

    args, kwargs = given
    expected = _ATTENTION.bind(*args, **kwargs)
    expected.apply_defaults()
    for _ in range(2):  # made, then followed
        assert _bound(_ATTENTION, args, kwargs) == (expected.args, expected.kwargs)
    with pytest.raises(TypeError):  # a call that does not fit the signature, as torch refuses it
        _bound(_ATTENTION, (1, 2), {"unknown": 3})
