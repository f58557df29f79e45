"""fxlrp.jax: exactness against independent references.

- LRP-0 equals gradient x input (``jax.grad`` in float64) on a Flax CNN (convolution, ReLU, average
  and max pooling, dense layers, a residual add), an MLP, GCN/GIN-style graph networks written
  with ``jax.ops.segment_sum``, jraph's ``GraphConvolution`` and ``GraphNetwork``, a scan, a
  ``fori_loop``, a counted ``while_loop``, cumulative sums and comparisons, to 1e-12;
- parity with fxlrp's PyTorch path on the same weights (a torch CNN copied into its Flax twin:
  NCHW -> NHWC, OIHW -> HWIO kernels, (out, in) -> (in, out) dense kernels) for LRP-0, Epsilon,
  EpsilonPlus, EpsilonPlusFlat, EpsilonAlpha2Beta1Flat, EpsilonGammaBox, AlphaBeta(2, 1), WSquare,
  and zero_params, in float64 to 1e-10, with and without BatchNorm (folded on both sides); smooth
  activations (GELU, SiLU) and powers under the identity rule, cumulative sums under the sums'
  rule, on both sides; a jraph GCN and PyG's GCNConv under LRP-0, Epsilon and AlphaBeta(2, 1);
- the tables of seed notebook 004 (``JaxMatMul``, ``JaxAdd``, ``JaxIndexSelect``, ``JaxDense``
  with alpha 1 and 2), on the seed's inputs, in float32 as the seed ran;
- ``jax.jit`` of the explanation gives the un-jitted numbers; a primitive without a rule is an
  error naming it and the user's source line (while loops, exp, log: with what to do);
  ``import fxlrp`` imports no JAX.
"""

from __future__ import annotations

import functools
import inspect
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")  # the `jax` extra; `make setup` and CI install it
import flax.linen as fnn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fxlrp  # noqa: E402
import fxlrp.jax as fxjax  # noqa: E402
from fxlrp.errors import ExplanationInputError, UnsupportedOperationError  # noqa: E402
from fxlrp.rules import AlphaBeta, Epsilon, Gamma, Product, WSquare, composites  # noqa: E402

jax.config.update("jax_enable_x64", True)


def relative_error(actual: Any, expected: Any) -> float:
    """``max |actual - expected| / max |expected|``."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "relevance with NaN or Inf"
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def gradient_times_input(fn: Callable[..., Any], x: Any, target: Any) -> Any:
    """The reference of LRP-0: ``x * d(out * onehot)/dx`` summed over the batch, by ``jax.grad``."""
    def explained(x: Any) -> Any:
        out = fn(x)
        return out[jnp.arange(out.shape[0]), jnp.asarray(target)].sum()
    return jax.grad(explained)(x) * x


# ---- a Flax CNN and its torch twin ------------------------------------------------------------

class FlaxCNN(fnn.Module):
    """conv -> relu -> conv -> relu + residual -> avg pool -> max pool -> dense -> relu -> dense."""

    activation: Callable[[Any], Any] = fnn.relu

    @fnn.compact
    def __call__(self, x: Any) -> Any:
        kwargs = {"param_dtype": jnp.float64, "dtype": jnp.float64, "padding": ((1, 1), (1, 1))}
        h = fnn.relu(fnn.Conv(4, (3, 3), name="conv1", **kwargs)(x))
        h = fnn.relu(fnn.Conv(4, (3, 3), name="conv2", **kwargs)(h)) + h
        h = fnn.avg_pool(h, (2, 2), (2, 2))
        h = fnn.max_pool(h, (2, 2), (2, 2))
        h = h.transpose(0, 3, 1, 2).reshape(h.shape[0], -1)  # torch's flatten order (C, H, W)
        h = self.activation(fnn.Dense(10, name="fc1", param_dtype=jnp.float64, dtype=jnp.float64)(h))
        return fnn.Dense(5, name="fc2", param_dtype=jnp.float64, dtype=jnp.float64)(h)


class TorchCNN(nn.Module):
    def __init__(self, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 2 * 2, 10)
        self.activation = activation or nn.ReLU()
        self.fc2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h)) + h
        h = F.max_pool2d(F.avg_pool2d(h, 2), 2)
        return self.fc2(self.activation(self.fc1(h.flatten(1))))


def flax_twin(model: TorchCNN) -> dict[str, Any]:
    """The torch model's weights as the Flax twin's variables."""
    def array(tensor: torch.Tensor) -> Any:
        return jnp.asarray(tensor.detach().numpy())
    params = {name: {"kernel": array(getattr(model, name).weight.permute(2, 3, 1, 0)),
                     "bias": array(getattr(model, name).bias)} for name in ("conv1", "conv2")}
    params.update({name: {"kernel": array(getattr(model, name).weight.T), "bias": array(getattr(model, name).bias)}
                   for name in ("fc1", "fc2")})
    return {"params": params}


@pytest.fixture(scope="module")
def twins() -> tuple[TorchCNN, Callable[..., Any], torch.Tensor, Any]:
    torch.manual_seed(0)
    model = TorchCNN().double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)  # enough negative pre-activations and outputs of both signs
    images = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    apply = functools.partial(FlaxCNN().apply, flax_twin(model))
    return model, apply, images, jnp.asarray(images.permute(0, 2, 3, 1).numpy())


TARGETS = [0, 2, 4]
PARITY: dict[str, Callable[[], Any]] = {
    "LRP-0": lambda: Epsilon(0.0),
    "Epsilon": lambda: Epsilon(1e-3),
    "EpsilonPlusFlat": lambda: composites.EpsilonPlusFlat(),
    "EpsilonGammaBox": lambda: composites.EpsilonGammaBox(low=-3.0, high=3.0),
    "AlphaBeta(2,1)": lambda: AlphaBeta(2.0, 1.0),
    "EpsilonPlus": lambda: composites.EpsilonPlus(),
    "EpsilonAlpha2Beta1Flat": lambda: composites.EpsilonAlpha2Beta1Flat(),
    "WSquare": lambda: WSquare(),
    "Epsilon(zero_params=bias)": lambda: Epsilon(1e-3, zero_params="bias"),
    "Gamma(zero_params=bias)": lambda: Gamma(0.5, zero_params="bias"),
}


def test_flax_cnn_outputs_are_the_torch_twins(twins: Any) -> None:
    model, apply, images, images_nhwc = twins
    explain = fxjax.convert(apply, Epsilon(0.0), images_nhwc)
    expected = model(images).detach().numpy()
    assert relative_error(apply(images_nhwc), expected) < 1e-14
    assert np.array_equal(np.asarray(explain(images_nhwc)), np.asarray(apply(images_nhwc)))


def test_lrp0_is_gradient_times_input_on_a_flax_cnn(twins: Any) -> None:
    _, apply, _, images = twins
    explain = fxjax.convert(apply, Epsilon(0.0), images)
    relevance = fxjax.attribute(explain, images, target=TARGETS)
    assert relative_error(relevance, gradient_times_input(apply, images, TARGETS)) < 1e-12


@pytest.mark.parametrize("name", list(PARITY))
@pytest.mark.parametrize("models", ["twins", pytest.param("batch_norm_twins", marks=pytest.mark.slow)])
def test_parity_with_the_pytorch_path(models: str, name: str, request: pytest.FixtureRequest) -> None:
    """The Flax twin gives the PyTorch path's relevance; with BatchNorm, folded on both sides."""
    model, apply, images, images_nhwc = request.getfixturevalue(models)
    torch_relevance = fxlrp.attribute(fxlrp.convert(model, PARITY[name]()), images, target=torch.tensor(TARGETS))
    explain = fxjax.convert(apply, PARITY[name](), images_nhwc)
    relevance = fxjax.attribute(explain, images_nhwc, target=TARGETS)
    expected = torch_relevance.permute(0, 2, 3, 1).numpy()
    assert relative_error(relevance, expected) < 1e-10
    # the rules differ: the comparison can fail (LRP-0 is not EpsilonPlusFlat on this model)
    if name != "LRP-0":
        lrp0 = fxjax.attribute(fxjax.convert(apply, Epsilon(0.0), images_nhwc), images_nhwc, target=TARGETS)
        assert relative_error(lrp0, expected) > 1e-6


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_smooth_activations_take_the_identity_rule_as_in_pytorch(activation: str) -> None:
    torch.manual_seed(1)
    torch_activation = nn.GELU(approximate="tanh") if activation == "gelu" else nn.SiLU()
    model = TorchCNN(torch_activation).double().eval()
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    flax_activation = fnn.gelu if activation == "gelu" else jax.nn.silu  # flax's gelu is tanh-approximated
    apply = functools.partial(FlaxCNN(activation=flax_activation).apply, flax_twin(model))
    images_nhwc = jnp.asarray(images.permute(0, 2, 3, 1).numpy())
    explain = fxjax.convert(apply, Epsilon(1e-6), images_nhwc)
    assert f"{activation} " in explain.report() and "Pass()" in explain.report()
    assert relative_error(explain(images_nhwc), model(images).detach().numpy()) < 1e-12
    expected = fxlrp.attribute(fxlrp.convert(model, Epsilon(1e-6)), images, target=torch.tensor([1, 3]))
    relevance = fxjax.attribute(explain, images_nhwc, target=[1, 3])
    assert relative_error(relevance, expected.permute(0, 2, 3, 1).numpy()) < 1e-10


@pytest.mark.slow
def test_jit_gives_the_unjitted_explanation(twins: Any) -> None:
    _, apply, _, images = twins
    explain = fxjax.convert(apply, composites.EpsilonGammaBox(low=-3.0, high=3.0), images)
    with jax.disable_jit():  # operation by operation (fxjax.attribute compiles otherwise)
        eager = fxjax.attribute(explain, images, target=TARGETS)
    jitted = jax.jit(lambda x: fxjax.attribute(explain, x, target=TARGETS))(images)
    assert relative_error(fxjax.attribute(explain, images, target=TARGETS), eager) < 1e-13
    assert relative_error(jitted, eager) < 1e-13
    assert relative_error(fxjax.attribute(jax.jit(explain), images, target=TARGETS), eager) < 1e-13


def test_converted_inside_jit_with_the_weights_as_arguments(twins: Any) -> None:
    model, apply, _, images = twins
    variables = flax_twin(model)

    def relevance(variables: Any, x: Any) -> Any:  # the weights are values traced by jit here
        explain = fxjax.convert(functools.partial(FlaxCNN().apply, variables), composites.EpsilonPlusFlat(), x)
        return fxjax.attribute(explain, x, target=TARGETS)

    eager = fxjax.attribute(fxjax.convert(apply, composites.EpsilonPlusFlat(), images), images, target=TARGETS)
    assert relative_error(jax.jit(relevance)(variables, images), eager) < 1e-13


def test_predicted_class_by_default(twins: Any) -> None:
    _, apply, _, images = twins
    explain = fxjax.convert(apply, Epsilon(0.0), images)
    predicted = np.asarray(apply(images)).argmax(-1)
    # two compiled programs (the argmax inside one), float64: equal up to XLA's fusions' rounding
    assert relative_error(fxjax.attribute(explain, images), fxjax.attribute(explain, images, predicted)) < 1e-13


@pytest.mark.parametrize("target", [5, -6, [0, 1, 5]])
def test_a_class_out_of_range_is_refused_in_one_line(twins: Any, target: Any) -> None:
    _, apply, _, images = twins
    explain = fxjax.convert(apply, Epsilon(0.0), images)
    with pytest.raises(ExplanationInputError) as raised:
        fxjax.attribute(explain, images, target=target)
    assert str(raised.value) == f"fxlrp.jax: target {np.asarray(target)} is out of range for 5 classes"


# ---- an MLP and graph networks ----------------------------------------------------------------

class MLP(fnn.Module):
    @fnn.compact
    def __call__(self, x: Any) -> Any:
        for width in (16, 16):
            x = fnn.relu(fnn.Dense(width, param_dtype=jnp.float64)(x))
        return fnn.Dense(4, param_dtype=jnp.float64)(x)


def test_lrp0_is_gradient_times_input_on_an_mlp() -> None:
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 7), jnp.float64)
    model = MLP()
    apply = functools.partial(model.apply, model.init(jax.random.PRNGKey(1), x))
    relevance = fxjax.attribute(fxjax.convert(apply, Epsilon(0.0), x), x, target=[0, 1, 2, 3, 0])
    assert relative_error(relevance, gradient_times_input(apply, x, [0, 1, 2, 3, 0])) < 1e-12


def graph_parameters(features: int, hidden: int, seed: int) -> dict[str, Any]:
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    return {"w1": jax.random.normal(keys[0], (features, hidden), jnp.float64) / np.sqrt(features),
            "b1": 0.1 * jax.random.normal(keys[1], (hidden,), jnp.float64),
            "w2": jax.random.normal(keys[2], (hidden, hidden), jnp.float64) / np.sqrt(hidden),
            "b2": 0.1 * jax.random.normal(keys[3], (hidden,), jnp.float64),
            "w3": jax.random.normal(keys[4], (hidden, 1), jnp.float64) / np.sqrt(hidden),
            "b3": 0.1 * jax.random.normal(keys[5], (1,), jnp.float64)}


def gcn(params: dict[str, Any], x: Any, senders: Any, receivers: Any) -> Any:
    """A GCN-style network as jraph writes it: gather at senders, segment sum at receivers."""
    nodes = x.shape[0]
    degree = jax.ops.segment_sum(jnp.ones_like(receivers, jnp.float64), receivers, nodes) + 1.0
    h = x @ params["w1"] + params["b1"]
    h = jax.nn.relu((jax.ops.segment_sum(h[senders], receivers, nodes) + h) / degree[:, None])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return (h @ params["w3"] + params["b3"])[:, 0]


def gin(params: dict[str, Any], x: Any, senders: Any, receivers: Any) -> Any:
    """A GIN-style layer: ``MLP((1 + eps) h + sum of neighbours)``."""
    h = 1.25 * x + jax.ops.segment_sum(x[senders], receivers, x.shape[0])
    h = jax.nn.relu(h @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return (h @ params["w3"] + params["b3"])[:, 0]


@pytest.mark.parametrize("network", [gcn, gin])
def test_lrp0_is_gradient_times_input_on_graph_networks(network: Callable[..., Any]) -> None:
    x = jax.random.normal(jax.random.PRNGKey(2), (6, 3), jnp.float64)
    senders, receivers = jnp.array([0, 1, 2, 3, 4, 5, 1]), jnp.array([1, 2, 3, 4, 5, 0, 3])
    fn = functools.partial(network, graph_parameters(3, 8, 3))
    explain = fxjax.convert(fn, Epsilon(0.0), x, senders, receivers)
    for node in (0, 3):
        relevance = fxjax.attribute(explain, (x, senders, receivers), target=node)[0]
        expected = jax.grad(lambda x: fn(x, senders, receivers)[node])(x) * x
        assert relative_error(relevance, expected) < 1e-12
        node_relevance = relevance.sum(axis=1)  # relevance of each node for the node's score
        assert node_relevance.shape == (6,)


def test_segment_sum_shares_by_contribution() -> None:
    """Each summand of a segment gets its share ``x_i / z * R`` (not the whole ``R``, as the gradient)."""
    x = jnp.array([1.0, 3.0, -2.0, 4.0])
    segments = jnp.array([0, 0, 1, 1])
    explain = fxjax.convert(lambda x: jax.ops.segment_sum(x, segments, 2), None, x)
    relevance = fxjax.attribute(explain, x, target=jnp.array([4.0, 2.0]))
    assert relative_error(relevance, [1.0, 3.0, -2.0, 4.0]) < 1e-15


# ---- seed notebook 004: its JAX tables --------------------------------------------------------
# The seed's jax_safe_divide divides by z + 1e-9, which is z in float32 where |z| ~ 1: LRP-0.

# (NumPy arrays: a JAX array made when pytest collects this module would start JAX's threads before
# other tests fork worker processes)
SEED_A = np.ones((2, 2), np.float32)
SEED_B = np.array([[-2.0, 1], [1, -2]], np.float32)
SEED_R = np.array([[1.0, 0], [0, 0]], np.float32)


def seed_close(actual: Any, printed: Any) -> bool:
    return bool(np.allclose(np.asarray(actual), np.asarray(printed, np.float32), rtol=1e-6, atol=1e-7))


def test_seed004_matmul() -> None:
    """``JaxMatMul.relprop``: each factor's share with the other factor held constant."""
    of_a = fxjax.attribute(fxjax.convert(lambda a: a @ SEED_B, Epsilon(0.0), SEED_A), SEED_A, target=SEED_R)
    of_b = fxjax.attribute(fxjax.convert(lambda b: SEED_A @ b, Epsilon(0.0), SEED_B), SEED_B, target=SEED_R)
    assert seed_close(of_a, [[2.0, -1.0], [0.0, 0.0]])
    assert seed_close(of_b, [[2.0, 0.0], [-1.0, -0.0]])
    # Both factors carrying relevance: the Product rule gives each half of that (the seed's
    # table hands out twice the relevance it received).
    both = fxjax.attribute(fxjax.convert(lambda a, b: a @ b, Product(0.0), SEED_A, SEED_B), (SEED_A, SEED_B),
                           target=SEED_R)
    assert seed_close(both[0], [[1.0, -0.5], [0.0, 0.0]]) and seed_close(both[1], [[1.0, 0.0], [-0.5, 0.0]])
    # jax.lax.stop_gradient makes a factor a constant of the explanation: the other takes its whole share
    held = fxjax.convert(lambda a, b: a @ jax.lax.stop_gradient(b), Product(0.0), SEED_A, SEED_B)
    of_a, of_b = fxjax.attribute(held, (SEED_A, SEED_B), target=SEED_R)
    assert seed_close(of_a, [[2.0, -1.0], [0.0, 0.0]]) and seed_close(of_b, np.zeros((2, 2)))


def seed_safe_divide(a: Any, b: Any) -> Any:
    den = jnp.clip(b, min=1e-9) + jnp.clip(b, max=1e-9)
    den = den + (den == 0).astype(den.dtype) * 1e-9
    return a / den * (b != 0).astype(b.dtype)


def test_seed004_add() -> None:
    """``JaxAdd.relprop`` is fxlrp's z-rule on ``a + b`` followed by the seed's rescaling of each
    operand's total to ``|sum R_a| / (|sum R_a| + |sum R_b|) * sum R`` (not an fxlrp rule)."""
    explain = fxjax.convert(lambda a, b: a + b, None, SEED_A, SEED_B)
    rel_a, rel_b = fxjax.attribute(explain, (SEED_A, SEED_B), target=SEED_R)
    assert seed_close(rel_a, [[-1.0, 0.0], [0.0, 0.0]]) and seed_close(rel_b, [[2.0, 0.0], [0.0, 0.0]])
    a_sum, b_sum = rel_a.sum(), rel_b.sum()
    a_fact = seed_safe_divide(jnp.abs(a_sum), jnp.abs(a_sum) + jnp.abs(b_sum)) * SEED_R.sum()
    b_fact = seed_safe_divide(jnp.abs(b_sum), jnp.abs(a_sum) + jnp.abs(b_sum)) * SEED_R.sum()
    assert seed_close(rel_a * seed_safe_divide(a_fact, a_sum), [[0.33333334, -0.0], [-0.0, 0.0]])
    assert seed_close(rel_b * seed_safe_divide(b_fact, b_sum), [[0.6666667, 0.0], [0.0, 0.0]])


def test_seed004_index_select() -> None:
    indices = jnp.zeros(1, dtype=jnp.int32)
    explain = fxjax.convert(lambda b: jnp.take(b, indices, axis=1), None, SEED_B)
    relevance = fxjax.attribute(explain, SEED_B, target=jnp.array([[1.0], [0.0]], jnp.float32))
    assert seed_close(relevance, [[1.0, 0.0], [0.0, -0.0]])


# The printed kernel of the seed's Dense(2) (rows 0-17; row 18's first entry is printed as
# -3.6075..., the rest is cut off). The printed relevance gives rows 18 and 19 none, so their
# first column is not positive; the unprinted entries are filled with such values.
SEED_KERNEL = np.array([
    [1.53342038e-01, 3.29581231e-01], [4.70121145e-01, 1.81581691e-01], [1.80420190e-01, 3.35969597e-01],
    [-1.62113383e-01, -2.02395543e-01], [-1.18919984e-01, -6.62900805e-02], [-4.10243064e-01, 7.33509436e-02],
    [4.96547073e-02, -2.71931272e-02], [-2.19073966e-01, 4.65010494e-01], [1.54693127e-02, 1.10250756e-01],
    [-3.89764100e-01, 8.84109288e-02], [-3.79199862e-01, -2.35682800e-02], [3.24670374e-01, 2.04515398e-01],
    [1.44210760e-04, 1.65998340e-01], [-3.36234242e-01, -3.94779295e-01], [-1.40488684e-01, -5.03639765e-02],
    [-2.11226270e-02, 2.08313853e-01], [9.56470072e-02, 2.05471292e-01], [-9.69679356e-02, -3.74182016e-01],
    [-3.6075e-01, 0.25], [-0.2, -0.15],
], np.float32)
SEED_DENSE_ALPHA1 = [[1.1891876e-01, 3.6458510e-01, 1.3991822e-01, 0.0, 0.0, 0.0, 3.8507875e-02, 0.0, 1.1996655e-02,
                      0.0, 0.0, 2.5178614e-01, 1.1183733e-04, 0.0, 0.0, 0.0, 7.4175507e-02, 0.0, 0.0, 0.0]]


def seed_dense_relprop(relevance: Any, x: Any, w: Any, alpha: float) -> Any:
    """The seed's ``JaxDense.relprop``, as written there."""
    beta = alpha - 1
    pw, nw, px, nx = jnp.clip(w, min=0), jnp.clip(w, max=0), jnp.clip(x, min=0), jnp.clip(x, max=0)

    def f(r: Any, w1: Any, w2: Any, x1: Any, x2: Any) -> Any:
        z1, vjp_x1 = jax.vjp(lambda x: jnp.dot(x, w1), x1)
        z2, vjp_x2 = jax.vjp(lambda x: jnp.dot(x, w2), x2)
        s = seed_safe_divide(r, z1 + z2)
        return x1 * vjp_x1(s)[0] + x2 * vjp_x2(s)[0]

    return alpha * f(relevance, pw, nw, px, nx) - beta * f(relevance, nw, pw, px, nx)


def seed_dense(x: Any) -> Any:
    return fnn.Dense(2).apply({"params": {"kernel": jnp.asarray(SEED_KERNEL), "bias": jnp.zeros(2, jnp.float32)}}, x)


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_seed004_dense_alpha_beta(alpha: float) -> None:
    start = jnp.array([[1.0, 0.0]], jnp.float32)
    ones = jnp.ones((1, 20), jnp.float32)
    rule = AlphaBeta(alpha, alpha - 1.0, stabilizer=1e-9)
    relevance = fxjax.attribute(fxjax.convert(seed_dense, rule, ones), ones, target=start)
    if alpha == 1.0:
        assert seed_close(relevance, SEED_DENSE_ALPHA1)
    assert seed_close(relevance, seed_dense_relprop(start, ones, jnp.asarray(SEED_KERNEL), alpha))
    # inputs of both signs, both output columns, in float32 as the seed ran: the two formulations
    # of the same sums round differently, so they are compared within a forward error bound
    x = jax.random.normal(jax.random.PRNGKey(4), (3, 20), jnp.float32)
    start = jax.random.normal(jax.random.PRNGKey(5), (3, 2), jnp.float32)
    relevance = fxjax.attribute(fxjax.convert(seed_dense, rule, x), x, target=start)
    expected = seed_dense_relprop(start, x, jnp.asarray(SEED_KERNEL), alpha)
    difference = np.abs(np.asarray(relevance, np.float64) - np.asarray(expected, np.float64))
    assert (difference <= alpha_beta_rounding_bound(start, x, SEED_KERNEL, alpha)).all()


def alpha_beta_rounding_bound(relevance: Any, x: Any, w: Any, alpha: float) -> np.ndarray:
    """How far two float32 computations of the alpha-beta rule of ``x @ w`` (the seed's and
    fxlrp's, each with a stabiliser of 1e-9 on its denominators) can be apart, by input: computed
    in float64 from the operands. Each denominator ``z`` (``n`` products of one sign, no
    cancellation) and quotient ``s = R / z`` is within ``gamma_(n+1)`` relative of its exact value
    (``gamma_k = k u / (1 - k u)``, ``u = 2^-24``), the two stabilisers (``z + 1e-9`` and
    ``z + 1e-9 sign(z)``) within ``2e-9 / |z|``; the products ``x_j w_jk s_k``, the sums over ``k``
    and over the parts, the weights alpha and beta round at most 7 times more. So each computation
    is within ``delta_k |x_j| |w_jk| |s_k|``, summed, of the exact rule, and the two within twice that."""
    x, w, relevance = (np.asarray(value, np.float64) for value in (x, w, relevance))
    u, n = 2.0 ** -24, x.shape[-1]
    gamma = lambda k: k * u / (1 - k * u)  # noqa: E731
    total = np.zeros_like(x)
    for weight, up, down in ((alpha, np.clip(w, 0, None), np.clip(w, None, 0)),
                             (alpha - 1, np.clip(w, None, 0), np.clip(w, 0, None))):
        z = np.clip(x, 0, None) @ up + np.clip(x, None, 0) @ down
        quotient = np.abs(relevance) / np.maximum(np.abs(z) - 1e-9, 1e-300) * (z != 0)
        delta = gamma(n + 8) + 2e-9 / np.maximum(np.abs(z) - 1e-9, 1e-300)
        total += weight * (np.abs(np.clip(x, 0, None)) * ((np.abs(up) @ (delta * quotient).T).T)
                           + np.abs(np.clip(x, None, 0)) * ((np.abs(down) @ (delta * quotient).T).T))
    return 2 * total


# ---- errors and layout ------------------------------------------------------------------------

def test_a_primitive_without_a_rule_is_named_with_its_source_line() -> None:
    def model(x: Any) -> Any:
        return jnp.exp(x) @ jnp.ones((3, 2))  # the line the error names

    line = model.__code__.co_firstlineno + 1
    with pytest.raises(UnsupportedOperationError) as error:
        fxjax.convert(model, None, jnp.ones((4, 3)))
    message = str(error.value)
    assert "exp at " in message and f"{__file__}:{line}" in message and "stop_gradient" in message


def test_cp_lrp_is_refused_where_roles_are_unknown() -> None:
    with pytest.raises(UnsupportedOperationError, match="stop_gradient"):
        fxjax.convert(lambda q, k: q @ k.T, composites.CPLRP(), jnp.ones((2, 3)), jnp.ones((4, 3)))


def test_import_fxlrp_imports_no_jax() -> None:
    code = "import sys, fxlrp, fxlrp.rules, fxlrp.rules.composites; fxlrp.convert; print('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ---- NNX, vmap, scan --------------------------------------------------------------------------

def test_an_nnx_module_and_vmap() -> None:
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.a = nnx.Linear(6, 8, rngs=rngs, param_dtype=jnp.float64)
            self.b = nnx.Linear(8, 3, rngs=rngs, param_dtype=jnp.float64)

        def __call__(self, x: Any) -> Any:
            return self.b(nnx.relu(self.a(x)))

    net = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 6), jnp.float64)
    targets = [0, 1, 2, 0]
    relevance = fxjax.attribute(fxjax.convert(net, Epsilon(0.0), x), x, target=targets)
    assert relative_error(relevance, gradient_times_input(net, x, targets)) < 1e-12
    one = fxjax.convert(net, Epsilon(0.0), x[0])  # traced for one sample, mapped over the batch
    mapped = jax.vmap(lambda sample, target: fxjax.attribute(one, sample, target))(x, jnp.asarray(targets))
    assert relative_error(mapped, relevance) < 1e-15


def test_lrp0_is_gradient_times_input_through_a_scan() -> None:
    keys = jax.random.split(jax.random.PRNGKey(6), 5)
    w, u = 0.5 * jax.random.normal(keys[0], (5, 5), jnp.float64), jax.random.normal(keys[1], (3, 5), jnp.float64)
    b, v = 0.1 * jax.random.normal(keys[2], (5,), jnp.float64), jax.random.normal(keys[3], (5, 2), jnp.float64)

    def rnn(x: Any) -> Any:
        def step(h: Any, x_t: Any) -> tuple[Any, Any]:
            h = jax.nn.relu(h @ w + x_t @ u + b)
            return h, h.sum()

        h, _ = jax.lax.scan(step, jnp.zeros(5, jnp.float64), x)
        return h @ v

    x = jax.random.normal(keys[4], (6, 3), jnp.float64)
    explain = fxjax.convert(rnn, Epsilon(0.0), x)
    assert np.array_equal(np.asarray(explain(x)), np.asarray(rnn(x)))
    expected = jax.grad(lambda x: rnn(x)[1])(x) * x
    assert relative_error(fxjax.attribute(explain, x, target=1), expected) < 1e-12


# ---- AttnLRP: an attention block --------------------------------------------------------------

class TorchAttentionBlock(nn.Module):
    """Single-head self-attention with a residual, a ReLU MLP with a residual, a mean and a head;
    with ``norm``, LayerNorm or RMSNorm before the attention and the MLP (a pre-norm block)."""

    def __init__(self, width: int = 8, classes: int = 3, norm: str | None = None) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down, self.head = nn.Linear(width, 16), nn.Linear(16, width), nn.Linear(width, classes)
        kind = {"layer_norm": nn.LayerNorm, "rms_norm": nn.RMSNorm, None: lambda width: nn.Identity()}[norm]
        self.norm1, self.norm2 = kind(width), kind(width)
        self.scale = float(np.sqrt(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm1(x)
        weights = torch.softmax(self.q(n) @ self.k(n).transpose(-1, -2) / self.scale, dim=-1)
        h = x + self.o(weights @ self.v(n))
        h = h + self.down(F.relu(self.up(self.norm2(h))))
        return self.head(h.mean(1))


def jax_attention_block(model: TorchAttentionBlock) -> Callable[[Any], Any]:
    """The torch block as a JAX function of the same weights (LayerNorm, RMSNorm: Flax's)."""
    weights = {name: (jnp.asarray(layer.weight.detach().numpy()),
                      None if getattr(layer, "bias", None) is None else jnp.asarray(layer.bias.detach().numpy()))
               for name, layer in model.named_children() if not isinstance(layer, nn.Identity)}

    def dense(name: str, x: Any) -> Any:
        weight, bias = weights[name]
        return x @ weight.T + bias

    def norm(name: str, x: Any) -> Any:
        if name not in weights:
            return x
        scale, bias = weights[name]
        if bias is None:  # RMSNorm (torch's eps None: the dtype's epsilon)
            return fnn.RMSNorm(epsilon=float(np.finfo(np.float64).eps), param_dtype=jnp.float64).apply(
                {"params": {"scale": scale}}, x)
        return fnn.LayerNorm(epsilon=1e-5, param_dtype=jnp.float64).apply({"params": {"scale": scale, "bias": bias}}, x)

    def block(x: Any) -> Any:
        n = norm("norm1", x)
        scores = dense("q", n) @ jnp.swapaxes(dense("k", n), -1, -2) / model.scale
        h = x + dense("o", jax.nn.softmax(scores, axis=-1) @ dense("v", n))
        h = h + dense("down", jax.nn.relu(dense("up", norm("norm2", h))))
        return dense("head", h.mean(1))

    return block


@pytest.mark.parametrize("norm", [None, "layer_norm", "rms_norm"])
@pytest.mark.parametrize("composite", ["AttnLRP", "AttnLRP(0)"])
def test_attnlrp_attention_block_parity_with_the_pytorch_path(composite: str, norm: str | None) -> None:
    torch.manual_seed(2)
    model = TorchAttentionBlock(norm=norm).double().eval()
    if norm:
        with torch.no_grad():  # LayerNorm parameters away from their initial ones and zeros
            for layer in (model.norm1, model.norm2):
                layer.weight.add_(0.3 * torch.randn_like(layer.weight))
                if getattr(layer, "bias", None) is not None:
                    layer.bias.add_(0.3 * torch.randn_like(layer.bias))
    tokens = torch.randn(2, 5, 8, dtype=torch.float64)
    block = jax_attention_block(model)
    x = jnp.asarray(tokens.numpy())
    make = (lambda: composites.AttnLRP()) if composite == "AttnLRP" else (lambda: composites.AttnLRP(0.0))
    explain = fxjax.convert(block, make(), x)
    report = explain.report()
    assert "softmax" in report and "SoftmaxRule()" in report and "Product(" in report
    assert all((kind in report) == (kind == norm) for kind in ("layer_norm", "rms_norm"))
    assert relative_error(explain(x), model(tokens).detach().numpy()) < 1e-13
    expected = fxlrp.attribute(fxlrp.convert(model, make()), tokens, target=torch.tensor([0, 2]))
    relevance = fxjax.attribute(explain, x, target=[0, 2])
    assert relative_error(relevance, expected.numpy()) < 1e-10


# ---- a scatter graph network and its torch_scatter twin ---------------------------------------

class TorchMessagePassing(nn.Module):
    """The README's torch_scatter network: messages from both ends of each edge, summed at receivers."""

    def __init__(self, features: int = 3, hidden: int = 8) -> None:
        super().__init__()
        self.message = nn.Sequential(nn.Linear(2 * features, hidden), nn.ReLU())
        self.readout = nn.Linear(features + hidden, 1)

    def forward(self, x: torch.Tensor, senders: torch.Tensor, receivers: torch.Tensor) -> torch.Tensor:
        torch_scatter = pytest.importorskip("torch_scatter")
        messages = self.message(torch.cat([x[senders], x[receivers]], dim=1))
        incoming = torch_scatter.scatter_add(messages, receivers, dim=0, dim_size=x.shape[0])
        return self.readout(torch.cat([x, incoming], dim=1)).squeeze(-1)


def jax_message_passing(model: TorchMessagePassing) -> Callable[..., Any]:
    """The twin with ``jax.ops.segment_sum``, as jraph writes message passing."""
    (w1, b1), (w2, b2) = ((jnp.asarray(layer.weight.detach().numpy().T), jnp.asarray(layer.bias.detach().numpy()))
                          for layer in (model.message[0], model.readout))

    def network(x: Any, senders: Any, receivers: Any) -> Any:
        messages = jax.nn.relu(jnp.concatenate([x[senders], x[receivers]], axis=1) @ w1 + b1)
        incoming = jax.ops.segment_sum(messages, receivers, x.shape[0])
        return (jnp.concatenate([x, incoming], axis=1) @ w2 + b2)[:, 0]

    return network


@pytest.mark.parametrize("name", ["LRP-0", "Epsilon", "AlphaBeta(2,1)"])
def test_node_relevance_parity_with_a_torch_scatter_network(name: str) -> None:
    torch.manual_seed(3)
    model = TorchMessagePassing().double().eval()
    x = torch.randn(6, 3, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3, 4, 5, 1]), torch.tensor([1, 2, 3, 4, 5, 0, 3])
    explain_torch = fxlrp.convert(model, PARITY[name]())
    leaf = x.clone().requires_grad_()
    scores = explain_torch(leaf, senders, receivers)
    start = torch.zeros_like(scores)
    start[3] = scores[3].detach()
    scores.backward(start)
    network = jax_message_passing(model)
    arguments = (jnp.asarray(x.numpy()), jnp.asarray(senders.numpy()), jnp.asarray(receivers.numpy()))
    explain = fxjax.convert(network, PARITY[name](), *arguments)
    assert relative_error(explain(*arguments), scores.detach().numpy()) < 1e-14
    relevance = fxjax.attribute(explain, arguments, target=3)[0]
    assert relative_error(relevance, leaf.grad.numpy()) < 1e-10


# ---- cumulative sums, powers, comparisons, loops ----------------------------------------------

class TorchElementwise(nn.Module):
    """dense -> ReLU -> ``kind`` (a cumulative sum or a power) -> dense -> ReLU -> dense."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h = {"cumsum": lambda: torch.cumsum(h, dim=1), "reverse cumsum": lambda: torch.flip(h, [1]).cumsum(1),
             "square": lambda: h ** 2, "cube": lambda: torch.pow(self.a(x), 3),
             "torch.square": lambda: torch.square(h), "root": lambda: h ** 1.5}[self.kind]()
        return self.c(F.relu(self.b(h)))


def jax_elementwise(model: TorchElementwise) -> Callable[[Any], Any]:
    """The torch model as a JAX function of the same weights."""
    layers = {name: (jnp.asarray(layer.weight.detach().numpy().T), jnp.asarray(layer.bias.detach().numpy()))
              for name, layer in model.named_children()}

    def dense(name: str, x: Any) -> Any:
        return x @ layers[name][0] + layers[name][1]

    def network(x: Any) -> Any:
        h = jax.nn.relu(dense("a", x))
        h = {"cumsum": lambda: jnp.cumsum(h, axis=1), "reverse cumsum": lambda: jnp.cumsum(h[:, ::-1], axis=1),
             "square": lambda: h ** 2, "cube": lambda: jnp.power(dense("a", x), 3),
             "torch.square": lambda: jnp.square(h), "root": lambda: h ** 1.5}[model.kind]()
        return dense("c", jax.nn.relu(dense("b", h)))

    return network


@pytest.mark.parametrize("kind", ["cumsum", "reverse cumsum"])
def test_lrp0_is_gradient_times_input_through_a_cumulative_sum(kind: str) -> None:
    torch.manual_seed(4)
    network = jax_elementwise(TorchElementwise(kind).double())
    x = jax.random.normal(jax.random.PRNGKey(7), (5, 4), jnp.float64)
    targets = [0, 1, 2, 0, 1]
    explain = fxjax.convert(network, Epsilon(0.0), x)
    # the report names the user's own line (the lambda in jax_elementwise), not a file of JAX's
    source, first = inspect.getsourcelines(jax_elementwise)
    line = next(number for number, text in enumerate(source, first) if '"cumsum": lambda: jnp.cumsum' in text)
    [cumsum] = [row for row in explain.report().splitlines() if row.startswith("cumsum")]
    # (the function as JAX names it: "<lambda>", or its qualified name where JAX gives that)
    assert f" {__file__}:{line} (" in cumsum and cumsum.endswith("<lambda>)"), cumsum
    assert relative_error(fxjax.attribute(explain, x, target=targets), gradient_times_input(network, x, targets)) \
        < 1e-12


@pytest.mark.parametrize("composite", ["Epsilon", *(pytest.param(name, marks=pytest.mark.slow)
                                                   for name in ("EpsilonPlusFlat", "AlphaBeta(2,1)"))])
@pytest.mark.parametrize("kind", ["cumsum", "reverse cumsum", "square", "cube", "torch.square", "root"])
def test_cumulative_sums_and_powers_parity_with_the_pytorch_path(kind: str, composite: str) -> None:
    torch.manual_seed(5)
    model = TorchElementwise(kind).double().eval()
    inputs = torch.randn(4, 4, dtype=torch.float64)
    network = jax_elementwise(model)
    x = jnp.asarray(inputs.numpy())
    explain = fxjax.convert(network, PARITY[composite](), x)
    assert relative_error(explain(x), model(inputs).detach().numpy()) < 1e-13
    if kind not in ("cumsum", "reverse cumsum"):
        assert "pow        Pass()" in explain.report()
    expected = fxlrp.attribute(fxlrp.convert(model, PARITY[composite]()), inputs, target=torch.tensor([0, 1, 2, 1]))
    relevance = fxjax.attribute(explain, x, target=[0, 1, 2, 1])
    assert relative_error(relevance, expected.numpy()) < 1e-10
    # the rules differ: the comparison can fail
    lrp0 = fxjax.attribute(fxjax.convert(network, Epsilon(0.0), x), x, target=[0, 1, 2, 1])
    assert relative_error(lrp0, expected.numpy()) > 1e-6


def test_comparisons_carry_no_relevance() -> None:
    w = jax.random.normal(jax.random.PRNGKey(8), (4, 3), jnp.float64)

    def leaky(x: Any) -> Any:
        h = x @ w
        return jnp.where(h > 0, h, 0.1 * h) @ w.T  # a comparison, a selection

    x = jax.random.normal(jax.random.PRNGKey(9), (6, 4), jnp.float64)
    explain = fxjax.convert(leaky, Epsilon(0.0), x)
    targets = [0, 1, 2, 3, 0, 1]
    assert relative_error(fxjax.attribute(explain, x, target=targets), gradient_times_input(leaky, x, targets)) \
        < 1e-12


def test_a_while_loop_is_refused_with_what_to_do_and_fori_loop_with_int_bounds_is_explained() -> None:
    w = jax.random.normal(jax.random.PRNGKey(10), (3, 3), jnp.float64)

    def steps(x: Any, count: Any) -> Any:
        return jax.lax.fori_loop(0, count, lambda i, h: jax.nn.relu(h @ w) + h, x)  # the line the error names

    line = steps.__code__.co_firstlineno + 1
    x = jax.random.normal(jax.random.PRNGKey(11), (2, 3), jnp.float64)
    with pytest.raises(UnsupportedOperationError) as error:
        fxjax.convert(steps, Epsilon(0.0), x, jnp.asarray(3))
    message = str(error.value)
    assert f"while at {__file__}:{line}" in message and "fori_loop" in message and "jax.lax.scan" in message

    def three_steps(x: Any) -> Any:
        return steps(x, 3)

    explain = fxjax.convert(three_steps, Epsilon(0.0), x)
    assert relative_error(fxjax.attribute(explain, x, target=[1, 2]), gradient_times_input(three_steps, x, [1, 2])) \
        < 1e-12


def test_a_while_loop_with_a_constant_number_of_steps_is_unrolled() -> None:
    w = jax.random.normal(jax.random.PRNGKey(16), (3, 3), jnp.float64)

    def step(h: Any) -> Any:
        return jax.nn.relu(h @ w) + h

    def counted(x: Any) -> Any:  # a counter from 0 while below 4: four steps, whatever x is
        return jax.lax.while_loop(lambda carry: carry[0] < 4, lambda carry: (carry[0] + 1, step(carry[1])), (0, x))[1]

    def written_out(x: Any) -> Any:  # the reference: JAX cannot differentiate the while loop backwards
        for _ in range(4):
            x = step(x)
        return x

    x = jax.random.normal(jax.random.PRNGKey(17), (2, 3), jnp.float64)
    explain = fxjax.convert(counted, Epsilon(0.0), x)
    assert explain.report().count("linear") == 4
    relevance = jax.jit(lambda x: fxjax.attribute(explain, x, target=[0, 2]))(x)
    expected = jax.jit(lambda x: gradient_times_input(written_out, x, [0, 2]))(x)
    assert relative_error(relevance, expected) < 1e-12

    def until_large(x: Any) -> Any:  # the number of steps depends on x
        return jax.lax.while_loop(lambda h: jnp.abs(h).sum() < 100.0, step, x)

    with pytest.raises(UnsupportedOperationError, match="while at "):
        fxjax.convert(until_large, Epsilon(0.0), x)


@pytest.mark.parametrize("function", ["exp", "log", "power"])
def test_exp_log_and_powers_of_the_input_are_refused_as_in_pytorch(function: str) -> None:
    def model(x: Any) -> Any:
        return {"exp": jnp.exp, "log": jnp.log, "power": lambda x: 2.0 ** x}[function](x) @ jnp.ones((3, 2))

    with pytest.raises(UnsupportedOperationError, match="as on the PyTorch side"):
        fxjax.convert(model, None, jnp.ones((4, 3)))
    with pytest.raises(fxlrp.errors.UnsupportedOperationError):  # the PyTorch side refuses them too
        torch_function = {"exp": torch.exp, "log": torch.log, "power": lambda x: 2.0 ** x}[function]
        fxlrp.attribute(fxlrp.convert(TorchFunction(torch_function), Epsilon(0.0)), torch.ones(4, 3), target=0)


class TorchFunction(nn.Module):
    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function, self.dense = function, nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.function(x))


# ---- BatchNorm in evaluation mode, folded into the layer before it ----------------------------

class TorchBatchNormCNN(nn.Module):
    """conv -> BN -> relu -> conv (no bias) -> BN -> relu + residual -> pools -> dense -> BN -> relu -> dense."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.fc1, self.bn3, self.fc2 = nn.Linear(16, 10), nn.BatchNorm1d(10), nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h))) + h
        h = F.max_pool2d(F.avg_pool2d(h, 2), 2)
        return self.fc2(F.relu(self.bn3(self.fc1(h.flatten(1)))))


class FlaxBatchNormCNN(fnn.Module):
    @fnn.compact
    def __call__(self, x: Any) -> Any:
        kwargs = {"param_dtype": jnp.float64, "dtype": jnp.float64}
        conv = {**kwargs, "padding": ((1, 1), (1, 1))}
        norm = {**kwargs, "use_running_average": True, "epsilon": 1e-5}
        h = fnn.relu(fnn.BatchNorm(name="bn1", **norm)(fnn.Conv(4, (3, 3), name="conv1", **conv)(x)))
        second = fnn.Conv(4, (3, 3), use_bias=False, name="conv2", **conv)(h)
        h = fnn.relu(fnn.BatchNorm(name="bn2", **norm)(second)) + h
        h = fnn.max_pool(fnn.avg_pool(h, (2, 2), (2, 2)), (2, 2), (2, 2))
        h = h.transpose(0, 3, 1, 2).reshape(h.shape[0], -1)
        h = fnn.relu(fnn.BatchNorm(name="bn3", **norm)(fnn.Dense(10, name="fc1", **kwargs)(h)))
        return fnn.Dense(5, name="fc2", **kwargs)(h)


def flax_batch_norm_twin(model: TorchBatchNormCNN) -> dict[str, Any]:
    """The torch model's weights and running statistics as the Flax twin's variables."""
    def array(tensor: torch.Tensor) -> Any:
        return jnp.asarray(tensor.detach().numpy())
    params: dict[str, Any] = {"conv1": {"kernel": array(model.conv1.weight.permute(2, 3, 1, 0)),
                                        "bias": array(model.conv1.bias)},
                              "conv2": {"kernel": array(model.conv2.weight.permute(2, 3, 1, 0))}}
    params.update({name: {"kernel": array(getattr(model, name).weight.T), "bias": array(getattr(model, name).bias)}
                   for name in ("fc1", "fc2")})
    params.update({name: {"scale": array(getattr(model, name).weight), "bias": array(getattr(model, name).bias)}
                   for name in ("bn1", "bn2", "bn3")})
    stats = {name: {"mean": array(getattr(model, name).running_mean), "var": array(getattr(model, name).running_var)}
             for name in ("bn1", "bn2", "bn3")}
    return {"params": params, "batch_stats": stats}


@pytest.fixture(scope="module")
def batch_norm_twins() -> tuple[TorchBatchNormCNN, Callable[..., Any], torch.Tensor, Any]:
    torch.manual_seed(6)
    model = TorchBatchNormCNN().double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)
        for norm in (model.bn1, model.bn2, model.bn3):  # statistics and affine parameters of both signs
            norm.running_mean.normal_(0.0, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.normal_(0.0, 1.0)
            norm.bias.normal_(0.0, 0.5)
    images = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    apply = functools.partial(FlaxBatchNormCNN().apply, flax_batch_norm_twin(model))
    return model, apply, images, jnp.asarray(images.permute(0, 2, 3, 1).numpy())


def test_batch_norm_is_folded_into_the_layer_before_it(batch_norm_twins: Any) -> None:
    model, apply, images, images_nhwc = batch_norm_twins
    explain = fxjax.convert(apply, Epsilon(0.0), images_nhwc)
    assert relative_error(explain(images_nhwc), model(images).detach().numpy()) < 1e-13
    operations = [line.split()[0] for line in explain.report().splitlines()]
    assert operations.count("conv") == 2 and operations.count("linear") == 2 and "sub" not in operations
    relevance = fxjax.attribute(explain, images_nhwc, target=TARGETS)
    assert relative_error(relevance, gradient_times_input(apply, images_nhwc, TARGETS)) < 1e-12


def test_an_nnx_batch_norm_is_folded() -> None:
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.a, self.b = nnx.Linear(6, 8, rngs=rngs), nnx.Linear(8, 3, rngs=rngs)
            self.norm = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.b(nnx.relu(self.norm(self.a(x))))

    report = fxjax.convert(Net(nnx.Rngs(0)), Epsilon(0.0), jnp.ones((4, 6))).report()
    assert [line.split()[0] for line in report.splitlines()] == ["linear", "linear"]


# ---- jraph networks ----------------------------------------------------------------------------

def jraph_dense(key: Any, inputs: int, outputs: int, relu: bool = True) -> Callable[[Any], Any]:
    """A dense layer with a bias, and a ReLU unless ``relu`` is False, as a function of arrays."""
    w = jax.random.normal(key, (inputs, outputs), jnp.float64) / np.sqrt(inputs)
    b = 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (outputs,), jnp.float64)
    return (lambda x: jax.nn.relu(x @ w + b)) if relu else (lambda x: x @ w + b)


def jraph_graphs(jraph: Any, features: int = 3) -> Any:
    """Two graphs (3 and 4 nodes, edges both ways) with node, edge and global features."""
    senders = jnp.asarray([0, 1, 1, 2, 3, 4, 4, 5, 5, 6, 3, 6])
    receivers = jnp.asarray([1, 0, 2, 1, 4, 3, 5, 4, 6, 5, 6, 3])
    keys = jax.random.split(jax.random.PRNGKey(12), 3)
    return jraph.GraphsTuple(nodes=jax.random.normal(keys[0], (7, features), jnp.float64),
                             edges=jax.random.normal(keys[1], (12, 2), jnp.float64),
                             senders=senders, receivers=receivers,
                             globals=jax.random.normal(keys[2], (2, 2), jnp.float64),
                             n_node=jnp.asarray([3, 4]), n_edge=jnp.asarray([4, 8]))


def test_lrp0_is_gradient_times_input_on_a_jraph_gcn() -> None:
    jraph = pytest.importorskip("jraph")
    keys = jax.random.split(jax.random.PRNGKey(13), 3)
    layers = [jraph.GraphConvolution(jraph_dense(keys[0], 3, 8), add_self_edges=True),
              jraph.GraphConvolution(jraph_dense(keys[1], 8, 8), add_self_edges=True)]
    head = jraph_dense(keys[2], 8, 4, relu=False)

    def gcn(graph: Any) -> Any:
        for layer in layers:
            graph = layer(graph)
        return head(graph.nodes)  # one score per node and class

    graph = jraph_graphs(jraph)
    explain = fxjax.convert(gcn, Epsilon(0.0), graph)
    targets = [0, 1, 2, 3, 0, 1, 2]

    @jax.jit  # one compilation instead of one per operation run eagerly (seconds)
    def relevance_and_gradient_times_input(graph: Any) -> Any:
        (relevance,) = fxjax.attribute(explain, (graph,), target=targets)
        return relevance, gradient_times_input(lambda nodes: gcn(graph._replace(nodes=nodes)), graph.nodes, targets)

    relevance, expected = relevance_and_gradient_times_input(graph)
    assert relative_error(relevance.nodes, expected) < 1e-12
    # a GCN reads no edge or global features: they get no relevance
    assert np.all(np.asarray(relevance.edges) == 0) and np.all(np.asarray(relevance.globals) == 0)


def test_lrp0_is_gradient_times_input_on_a_jraph_graph_network() -> None:
    jraph = pytest.importorskip("jraph")
    keys = jax.random.split(jax.random.PRNGKey(14), 4)
    edge_mlp, node_mlp = jraph_dense(keys[0], 2 + 3 + 3 + 2, 6), jraph_dense(keys[1], 3 + 6 + 6 + 2, 5)
    global_mlp, head = jraph_dense(keys[2], 5 + 6 + 2, 6), jraph_dense(keys[3], 6, 3, relu=False)
    network = jraph.GraphNetwork(
        update_edge_fn=lambda e, s, r, g: edge_mlp(jnp.concatenate([e, s, r, g], axis=-1)),
        update_node_fn=lambda n, sent, received, g: node_mlp(jnp.concatenate([n, sent, received, g], axis=-1)),
        update_global_fn=lambda n, e, g: global_mlp(jnp.concatenate([n, e, g], axis=-1)))

    def classify(graph: Any) -> Any:
        return head(network(graph).globals)  # one score per graph and class

    graph = jraph_graphs(jraph)
    explain = fxjax.convert(classify, Epsilon(0.0), graph)

    @jax.jit  # one compilation instead of one per operation run eagerly (seconds)
    def outputs_relevance_and_gradient_times_inputs(graph: Any) -> Any:
        (relevance,) = fxjax.attribute(explain, (graph,), target=[2, 0])
        gradient = jax.grad(lambda graph: classify(graph)[jnp.arange(2), jnp.asarray([2, 0])].sum(),
                            allow_int=True)(graph)
        products = {field: getattr(gradient, field) * getattr(graph, field) for field in ("nodes", "edges", "globals")}
        return explain(graph), classify(graph), relevance, products

    explained, original, relevance, products = outputs_relevance_and_gradient_times_inputs(graph)
    assert relative_error(explained, original) < 1e-13
    for field, expected in products.items():
        assert relative_error(getattr(relevance, field), expected) < 1e-12


# ---- what the compiled explanation computes ---------------------------------------------------

class TorchPooledCNN(nn.Module):
    """conv -> ReLU -> average pooling -> minus ``shift`` (if any) -> conv -> ReLU -> mean -> dense."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift
        self.conv1, self.conv2, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.avg_pool2d(F.relu(self.conv1(x)), 2)
        h = h - self.shift if self.shift else h
        return self.fc(F.relu(self.conv2(h)).mean((2, 3)))


def jax_pooled_cnn(model: TorchPooledCNN) -> Callable[[Any], Any]:
    """The torch model as a JAX function of NHWC images, with the same weights."""
    kernels = [jnp.asarray(conv.weight.detach().permute(2, 3, 1, 0).numpy()) for conv in (model.conv1, model.conv2)]
    biases = [jnp.asarray(layer.bias.detach().numpy()) for layer in (model.conv1, model.conv2, model.fc)]
    dense = jnp.asarray(model.fc.weight.detach().numpy().T)

    def conv(x: Any, kernel: Any, bias: Any) -> Any:
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), ((1, 1), (1, 1)),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias

    def network(x: Any) -> Any:
        h = fnn.avg_pool(jax.nn.relu(conv(x, kernels[0], biases[0])), (2, 2), (2, 2))
        h = h - model.shift if model.shift else h
        return jax.nn.relu(conv(h, kernels[1], biases[1])).mean(axis=(1, 2)) @ dense + biases[2]

    return network


@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_z_plus_after_pooling_of_relu_outputs_needs_no_negative_weights(shift: float) -> None:
    torch.manual_seed(7)
    model = TorchPooledCNN(shift).double().eval()
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    network, x = jax_pooled_cnn(model), jnp.asarray(images.permute(0, 2, 3, 1).numpy())
    explain = fxjax.convert(network, composites.EpsilonPlus(), x)
    relevance = jax.jit(lambda x: fxjax.attribute(explain, x, target=[0, 2]))
    expected = fxlrp.attribute(fxlrp.convert(model, composites.EpsilonPlus()), images, target=torch.tensor([0, 2]))
    assert relative_error(relevance(x), expected.permute(0, 2, 3, 1).numpy()) < 1e-10
    # z+ of the first convolution (inputs of both signs): the positive and the negative part, a
    # convolution forward and backward each; of the second: the positive part only, unless the
    # shift makes its inputs negative; and the model's two convolutions
    convolutions = relevance.lower(x).as_text().count("stablehlo.convolution")
    assert convolutions == 2 + 4 + (2 if shift == 0.0 else 4)


def test_flat_weights_and_denominator_are_constants_of_the_compiled_explanation() -> None:
    torch.manual_seed(8)
    model = TorchPooledCNN(0.0).double().eval()
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    network, x = jax_pooled_cnn(model), jnp.asarray(images.permute(0, 2, 3, 1).numpy())
    explain = fxjax.convert(network, composites.EpsilonPlusFlat(), x)  # Flat on the first convolution
    relevance = jax.jit(lambda x: fxjax.attribute(explain, x, target=[1, 2]))
    # the model's two, z+ of the second forward and backward, Flat's backward (its denominator,
    # the convolution of ones, is computed while tracing)
    assert relevance.lower(x).as_text().count("stablehlo.convolution") == 2 + 2 + 1
    expected = fxlrp.attribute(fxlrp.convert(model, composites.EpsilonPlusFlat()), images, target=torch.tensor([1, 2]))
    assert relative_error(relevance(x), expected.permute(0, 2, 3, 1).numpy()) < 1e-10


class TorchGCN(nn.Module):
    """Two PyG ``GCNConv`` layers with a ReLU between them: one score per node and class."""

    def __init__(self) -> None:
        super().__init__()
        geometric = pytest.importorskip("torch_geometric.nn")
        self.first, self.second = geometric.GCNConv(3, 8), geometric.GCNConv(8, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.second(F.relu(self.first(x, edge_index)), edge_index)


@pytest.mark.parametrize("name", ["LRP-0", "Epsilon", "AlphaBeta(2,1)"])
def test_jraph_gcn_parity_with_pyg_gcnconv_on_the_pytorch_path(name: str) -> None:
    jraph = pytest.importorskip("jraph")
    torch.manual_seed(9)
    model = TorchGCN().double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.7)
    graph = jraph_graphs(jraph)._replace(edges=None, globals=None)
    (w1, b1), (w2, b2) = ((jnp.asarray(conv.lin.weight.detach().numpy().T), jnp.asarray(conv.bias.detach().numpy()))
                          for conv in (model.first, model.second))
    # GCNConv normalises by the degrees with self-loops, as jraph's GraphConvolution with self
    # edges does on a graph whose edges go both ways; its bias comes after the aggregation
    first, second = (jraph.GraphConvolution(lambda h, w=w: h @ w, add_self_edges=True) for w in (w1, w2))

    def gcn(graph: Any) -> Any:
        h = jax.nn.relu(first(graph).nodes + b1)
        return second(graph._replace(nodes=h)).nodes + b2

    x, edge_index = torch.tensor(np.asarray(graph.nodes)), torch.from_numpy(np.stack(
        [np.asarray(graph.senders), np.asarray(graph.receivers)]))
    targets = [0, 1, 2, 3, 0, 1, 2]
    explain_torch = fxlrp.convert(model, PARITY[name]())
    leaf = x.clone().requires_grad_()
    scores = explain_torch(leaf, edge_index)
    start = torch.zeros_like(scores)
    start[torch.arange(7), torch.tensor(targets)] = scores[torch.arange(7), torch.tensor(targets)].detach()
    scores.backward(start)
    explain = fxjax.convert(gcn, PARITY[name](), graph)

    @jax.jit  # one compilation instead of one per operation run eagerly (seconds)
    def outputs_and_relevance(graph: Any) -> Any:
        return explain(graph), fxjax.attribute(explain, (graph,), target=targets)[0].nodes

    outputs, relevance = outputs_and_relevance(graph)
    assert relative_error(outputs, scores.detach().numpy()) < 1e-13
    assert relative_error(relevance, leaf.grad.numpy()) < 1e-10
