"""Every rule against its formula written out on an explicit matrix, in float64.

For a layer ``z = f(x; W, b)`` the Jacobian ``J = dz/dx`` (from
``torch.autograd.functional.jacobian``) has one weight per connected input/output pair, so the
modified weights of a rule are elementwise functions of ``J`` (``W+`` is ``max(J, 0)``, ``W^2`` is
``J^2``, the flat rule's ones are ``[J != 0]``) and the bias per output is ``c = f(0)``. The
references below are zennit 0.5.1's definitions in that notation, computed without fxlrp.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from functools import partial

import pytest
import torch
from support.references import (
    alpha_beta_dense,
    dense_jacobians,
    epsilon_dense,
    epsilon_reference,
    explained_relevance,
    flat_dense,
    gamma_dense,
    relative_error,
    wsquare_dense,
    zbox_dense,
    zplus_dense,
)
from torch import Tensor, nn

import fxlrp
from fxlrp.relevance import AffineLayer
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules import AlphaBeta, Epsilon, Flat, Gamma, Norm, Pass, Rule, WSquare, ZBox, ZPlus
from fxlrp.rules.composites import Composite

LAYERS: dict[str, tuple[Callable[[bool], nn.Module], tuple[int, ...]]] = {
    "linear": (lambda bias: nn.Linear(7, 5, bias=bias), (3, 7)),
    "conv1d": (lambda bias: nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, bias=bias), (2, 4, 9)),
    "conv2d": (lambda bias: nn.Conv2d(4, 6, (3, 2), padding=1, dilation=(1, 2), groups=2, bias=bias), (2, 4, 5, 6)),
    "conv3d": (lambda bias: nn.Conv3d(2, 3, 2, stride=(1, 2, 1), bias=bias), (1, 2, 4, 5, 3)),
    "conv_transpose1d": (
        lambda bias: nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, bias=bias),
        (2, 4, 5),
    ),
    "conv_transpose2d": (lambda bias: nn.ConvTranspose2d(2, 3, 3, stride=2, dilation=2, bias=bias), (1, 2, 3, 4)),
}


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny; torch's threaded kernels for dilated convolutions cost ~0.1 s per
    call on a busy 2-core machine against ~30 us on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


RULES: dict[str, tuple[Callable[[Tensor], Rule], Callable[..., Tensor]]] = {
    "epsilon": (lambda high: Epsilon(1e-6), epsilon_dense),
    "epsilon_large": (lambda high: Epsilon(0.5), partial(epsilon_dense, epsilon=0.5)),
    "epsilon_zero_bias": (lambda high: Epsilon(1e-6, zero_params="bias"), partial(epsilon_dense, zero_bias=True)),
    "zplus": (lambda high: ZPlus(), zplus_dense),
    "zplus_zero_bias": (lambda high: ZPlus(zero_params=["bias"]), partial(zplus_dense, zero_bias=True)),
    "alpha2_beta1": (lambda high: AlphaBeta(2, 1), partial(alpha_beta_dense, alpha=2.0, beta=1.0)),
    "alpha1_beta0": (lambda high: AlphaBeta(1, 0), partial(alpha_beta_dense, alpha=1.0, beta=0.0)),
    "gamma": (lambda high: Gamma(0.25), partial(gamma_dense, gamma=0.25)),
    "gamma_zero": (lambda high: Gamma(0.0), partial(gamma_dense, gamma=0.0)),
    "gamma_large": (lambda high: Gamma(2.0), partial(gamma_dense, gamma=2.0)),
    "gamma_zero_bias": (lambda high: Gamma(0.7, zero_params="bias"), partial(gamma_dense, gamma=0.7, zero_bias=True)),
    "zbox": (lambda high: ZBox(-2.0, high), zbox_dense),
    "flat": (lambda high: Flat(), flat_dense),
    "wsquare": (lambda high: WSquare(), wsquare_dense),
}


@pytest.mark.parametrize("inputs", ["signed", "nonnegative"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("layer_name", list(LAYERS))
@pytest.mark.parametrize("rule_name", list(RULES))
def test_rule_equals_dense_formula(rule_name: str, layer_name: str, bias: bool, inputs: str) -> None:
    torch.manual_seed(zlib.crc32(f"{rule_name} {layer_name} {bias} {inputs}".encode()))
    build, shape = LAYERS[layer_name]
    layer = build(bias).double()
    x = torch.randn(shape, dtype=torch.float64)
    if inputs == "nonnegative":  # as behind a ReLU: the rules skip their x- terms
        x = x.clamp(min=0)
    high = torch.rand(1, shape[1], dtype=torch.float64) + 1.0  # per channel, zennit's (1, C) form
    make_rule, dense = RULES[rule_name]
    with torch.no_grad():
        output = layer(x)
    relevance = torch.randn_like(output)

    # in a container, the layer is a leaf of the capture (a transposed convolution's own forward
    # has Python control flow on its optional output_size)
    (actual,) = explained_relevance(fxlrp.convert(nn.Sequential(layer), make_rule(high)), [x], relevance)

    (J,) = dense_jacobians(layer, [x])
    with torch.no_grad():
        c = layer(torch.zeros_like(x)).reshape(-1)
    high_full = high.reshape(*high.shape, *(1,) * (x.dim() - 2)).expand_as(x).reshape(-1)
    expected = dense(J, c, x.reshape(-1), relevance.reshape(-1),
                     low=torch.full_like(x, -2.0).reshape(-1), high=high_full).reshape(x.shape)
    assert expected.abs().sum() > 0
    assert relative_error(actual, expected) < 1e-12, relative_error(actual, expected)


class WeightProduct(nn.Module):
    """A dense layer written as a product with parameters: ``spelling(x, *weights)``."""

    def __init__(self, spelling: Callable[..., Tensor], *shapes: tuple[int, ...]) -> None:
        super().__init__()
        self.spelling = spelling
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(shape)) for shape in shapes)

    def forward(self, x: Tensor) -> Tensor:
        return self.spelling(x, *self.weights)


PRODUCT_LAYERS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "matmul": (lambda: WeightProduct(lambda x, w: x @ w.T, (5, 7)), (3, 7)),
    "matmul_weight_first": (lambda: WeightProduct(lambda x, w: (w @ x.transpose(-1, -2)).transpose(-1, -2), (5, 7)),
                            (2, 3, 7)),
    "einsum": (lambda: WeightProduct(lambda x, w: torch.einsum("bi,oi->bo", x, w), (5, 7)), (3, 7)),
    "einsum_ellipsis_weight_first": (
        lambda: WeightProduct(lambda x, w: torch.einsum("oi,...i->...o", w, x), (5, 7)), (2, 3, 7)),
    "einsum_implicit_output": (lambda: WeightProduct(lambda x, w: torch.einsum("bci,io", x, w), (7, 5)), (2, 3, 7)),
    "einsum_two_weights": (
        lambda: WeightProduct(lambda x, a, b: torch.einsum("bi,ij,jo->bo", x, a, b), (7, 4), (4, 5)), (3, 7)),
}


@pytest.mark.parametrize("layer_name", list(PRODUCT_LAYERS))
@pytest.mark.parametrize("rule_name", list(RULES))
def test_rule_on_products_with_parameters_equals_dense_formula(rule_name: str, layer_name: str) -> None:
    """A matrix product or einsum of the input with parameters is a dense layer whose weight is
    the constant factor (several constant operands: their contraction): rules that change
    weights (z+, gamma, flat, ...) change that one."""
    torch.manual_seed(zlib.crc32(f"{rule_name} {layer_name}".encode()))
    build, shape = PRODUCT_LAYERS[layer_name]
    layer = build().double()
    x = torch.randn(shape, dtype=torch.float64)
    make_rule, dense = RULES[rule_name]
    with torch.no_grad():
        output = layer(x)
    relevance = torch.randn_like(output)
    (actual,) = explained_relevance(fxlrp.convert(layer, make_rule(1.5)), [x], relevance)
    (J,) = dense_jacobians(layer, [x])
    bounds = {"low": torch.full_like(x, -2.0).reshape(-1), "high": torch.full_like(x, 1.5).reshape(-1)}
    no_bias = torch.zeros(output.numel(), dtype=torch.float64)
    expected = dense(J, no_bias, x.reshape(-1), relevance.reshape(-1), **bounds).reshape(x.shape)
    assert expected.abs().sum() > 0
    assert relative_error(actual, expected) < 1e-12, relative_error(actual, expected)


class Residual(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b


class Doubled(nn.Module):
    def forward(self, a: Tensor) -> Tensor:
        return a + a


@pytest.mark.parametrize("stabilizer", [1e-6, 0.3])
def test_norm_on_sums_and_average_pooling(stabilizer: float) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 4, 4, dtype=torch.float64).unbind(0)
    explain = fxlrp.convert(Residual(), Composite(operation_rules={"add": Norm(stabilizer)}))
    relevance = torch.randn_like(a)
    actual = explained_relevance(explain, [a, b], relevance)
    expected = epsilon_reference(lambda u, v: u + v, [a, b], relevance, epsilon=stabilizer)
    assert max(relative_error(x, y) for x, y in zip(actual, expected, strict=True)) < 1e-12

    # a + a: both summands' gradients are one tensor, which the second product overwrites
    explain = fxlrp.convert(Doubled(), Composite(operation_rules={"add": Norm(stabilizer)}))
    (actual,) = explained_relevance(explain, [a], relevance)
    (expected,) = epsilon_reference(lambda u: u + u, [a], relevance, epsilon=stabilizer)
    assert relative_error(actual, expected) < 1e-12

    pool = nn.AdaptiveAvgPool2d((3, 2))
    explain = fxlrp.convert(pool, Composite(operation_rules={"avg_pool": Norm(stabilizer)}))
    relevance = torch.randn(3, 3, 2, dtype=torch.float64)
    (actual,) = explained_relevance(explain, [a], relevance)
    (expected,) = epsilon_reference(pool, [a], relevance, epsilon=stabilizer)
    assert relative_error(actual, expected) < 1e-12


def test_pass_hands_relevance_through() -> None:
    torch.manual_seed(0)
    norm = nn.Sequential(nn.BatchNorm2d(3)).double().eval()
    norm[0].running_mean.uniform_(-1, 1)
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    relevance = torch.randn_like(x)
    explain = fxlrp.convert(norm, Composite(operation_rules={"batch_norm": Pass()}), fold_batch_norm=False)
    (actual,) = explained_relevance(explain, [x], relevance)
    assert torch.equal(actual, relevance)

    # two relevance-carrying summands share it equally; a broadcast summand gets its sum
    explain = fxlrp.convert(Residual(), Composite(operation_rules={"add": Pass()}))
    b = torch.randn(1, 3, 1, 1, dtype=torch.float64)
    relevance_a, relevance_b = explained_relevance(explain, [x, b], relevance)
    assert torch.allclose(relevance_a, relevance / 2, rtol=0, atol=1e-15)
    assert torch.allclose(relevance_b, (relevance / 2).sum(dim=(0, 2, 3), keepdim=True), rtol=0, atol=1e-14)


def test_pass_refuses_shape_changing_layers() -> None:
    explain = fxlrp.convert(nn.Linear(4, 3), Pass())
    with pytest.raises(ValueError, match="Pass rule .* maps \\(2, 4\\) to \\(2, 3\\)"):
        explain(torch.randn(2, 4, requires_grad=True))


def test_rule_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="alpha - beta = 1"):
        AlphaBeta(2.0, 0.5)
    with pytest.raises(ValueError, match="alpha >= 0 and beta >= 0"):
        AlphaBeta(-1.0, -2.0)
    with pytest.raises(ValueError, match="zero_params may name"):
        ZPlus(zero_params=["weights"])
    with pytest.raises(ValueError, match="does not fit the input"):
        explain = fxlrp.convert(nn.Conv2d(3, 2, 3), ZBox(torch.zeros(1, 4, 1, 1), 1.0))
        explain(torch.randn(1, 3, 5, 5, requires_grad=True))


def test_callable_stabiliser() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(6, 4).double()
    x = torch.randn(3, 6, dtype=torch.float64)
    relevance = torch.randn(3, 4, dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(layer, Epsilon(lambda z: z + 0.1 * z.sign())), [x], relevance)
    (J,) = dense_jacobians(layer, [x])
    with torch.no_grad():
        z = layer(x).reshape(-1)
    expected = x.reshape(-1) * (J.T @ (relevance.reshape(-1) / (z + 0.1 * z.sign())))
    assert relative_error(actual, expected.reshape(x.shape)) < 1e-12


# Cost: the number of times each rule runs the layer per explanation (forward and backward), for
# inputs with and without negative entries (the original output included). Forward runs it once:
# terms with modified parameters are computed in backward, so that they are not held in between.
RUNS = {
    "epsilon": (1, 1), "zplus": (3, 2), "alpha2_beta1": (5, 3), "alpha1_beta0": (3, 2), "gamma": (5, 3),
    "zbox": (3, 3), "flat": (2, 2), "wsquare": (2, 2),
}


@pytest.mark.parametrize("rule_name", list(RUNS))
def test_each_term_costs_one_run_and_parameters_are_prepared_once(rule_name: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(5, 4, 3, 3, dtype=torch.float64)
    bias = torch.randn(5, dtype=torch.float64)
    calls = []

    def convolution(x, w, b):
        calls.append(1)
        return torch.nn.functional.conv2d(x, w, b, padding=1)

    rule = RULES[rule_name][0](1.0)
    prepared = []
    original_prepare = rule.prepare
    rule.prepare = lambda layer: prepared.append(1) or original_prepare(layer)
    call = RelevanceCall(rule)
    layer = AffineLayer(convolution, weight, bias, has_parameters=True)
    for inputs, expected_calls in zip(("signed", "nonnegative"), RUNS[rule_name], strict=True):
        x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
        x = x.clamp(min=0) if inputs == "nonnegative" else x
        calls.clear()
        output = call.affine(layer, x.requires_grad_())
        assert len(calls) == 1, f"{inputs}: forward runs the layer once"
        output.backward(torch.randn_like(output))
        assert len(calls) == expected_calls, inputs
    assert len(prepared) == 1
    with torch.no_grad():
        weight.mul_(2.0)  # an in-place change of the weights is noticed
    call.affine(layer, x)
    assert len(prepared) == 2


def test_epsilon_too_small_for_the_dtype_still_drops_zero_denominators() -> None:
    """An epsilon that float32 flushes to 0 must not skip the zero check: no Inf or NaN."""
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -1.0]]))
    explain = fxlrp.convert(torch.nn.Sequential(layer), fxlrp.rules.Epsilon(1e-50))
    relevance = fxlrp.attribute(explain, torch.tensor([[2.0, 2.0]]), target=torch.tensor([[1.0]]))
    assert torch.equal(relevance, torch.zeros(1, 2))


def test_every_rule_implements_the_engines_contract() -> None:
    """The engine runs rules by :class:`~fxlrp.relevance.rule_function.AffineRule`: every rule class
    fxlrp ships has its methods; a class without ``backward`` is not one."""
    import inspect

    import fxlrp.rules
    from fxlrp.relevance.rule_function import AffineRule

    rules = [value for value in vars(fxlrp.rules).values()
             if inspect.isclass(value) and issubclass(value, fxlrp.rules.Rule)]
    assert len(rules) >= 15 and all(issubclass(rule, AffineRule) for rule in rules)

    class Incomplete:
        def prepare(self, layer):
            return None

    assert not isinstance(Incomplete(), AffineRule)


@pytest.mark.parametrize("inputs", ["signed", "nonnegative"])
@pytest.mark.parametrize("rule_name", ["gamma", "gamma_zero_bias"])
@pytest.mark.parametrize("layer_name", ["linear", "conv2d"])
def test_gamma_behind_a_relu_that_it_gates_equals_the_dense_formula(layer_name: str, rule_name: str,
                                                                    inputs: str) -> None:
    """Gamma applies the gate of the ReLU that rectifies its output itself (after its quotient, or
    first where it takes its general form): relevance given at the ReLU's output, non-zero where
    the ReLU cut the layer's output off, reaches the layer only where its output is positive."""
    torch.manual_seed(zlib.crc32(f"{rule_name} {layer_name} {inputs} behind a ReLU".encode()))
    build, shape = LAYERS[layer_name]
    layer = build(True).double()
    x = torch.randn(shape, dtype=torch.float64)
    if inputs == "nonnegative":
        x = x.clamp(min=0)
    make_rule, dense = RULES[rule_name]
    with torch.no_grad():
        output = layer(x)
    relevance = torch.randn_like(output)
    (actual,) = explained_relevance(fxlrp.convert(nn.Sequential(layer, nn.ReLU()), make_rule(None)), [x], relevance)
    (J,) = dense_jacobians(layer, [x])
    with torch.no_grad():
        c = layer(torch.zeros_like(x)).reshape(-1)
    expected = dense(J, c, x.reshape(-1), (relevance * (output > 0)).reshape(-1)).reshape(x.shape)
    assert (output <= 0).any() and expected.abs().sum() > 0
    assert relative_error(actual, expected) < 1e-12, relative_error(actual, expected)
