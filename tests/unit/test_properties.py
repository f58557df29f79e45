"""Properties of every explanation, searched for failures on random models (hypothesis).

The models come from ``support.random_models.examples``: random DAGs of convolutions, linear layers,
BatchNorm, ReLU / LeakyReLU / abs, piecewise-constant gates, pooling, residual sums, cat, stack,
reshapes, indexing, scatter reductions (torch_scatter and native) and attention, written in many
spellings, on feature, sequence, image or token-id inputs (float64). The properties:

1. LRP-0 equals gradient x input, at the input and at every node of the explainer, for
   piecewise-linear models with ``R_out = out * onehot`` (biases and BatchNorm included). The
   reference is the gradient of a plain torch.fx capture of the model in which the maps LRP holds
   constant are held constant: piecewise-constant maps (their derivative is 0 almost everywhere
   anyway) and, under CP-LRP, the attention weights (the softmax output). Token ids: relevance
   ends at the embedding lookup (gradient x input there).
2. Conservation: without biases the input relevance sums to the output relevance under LRP-0,
   z+, alpha-beta (2, 1) and gamma (0.25), up to the relevance a rule drops where its
   denominator is 0 and the stabiliser's leak, both computed from the weighted layers' inputs
   (examples whose explained output is rounding noise, a sum cancelled to ~1e-17, are left out).
3. z+ relevance is non-negative for non-negative inputs and output relevance (ReLU networks).
4. The explainer's outputs equal the model's (bit-equal; relative 1e-12 with BatchNorm, which the
   explainer computes as its affine map).

Examples are derandomized (the same ones on every run). A longer search with fresh random
examples: ``FXLRP_PROPERTY_EXAMPLES=5000 .venv/bin/python -m pytest -q tests/unit/test_properties.py``
(that many examples per property and rule); a failure prints the shrunk model as code.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torch_scatter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.random_models import Example, Family, RandomModel, WeightedCall, examples
from support.references import LRP0, relative_error
from torch import Tensor, fx, nn

import fxlrp
from fxlrp.rules import AlphaBeta, Epsilon, Gamma, Rule, ZPlus
from fxlrp.rules.attention import cp_lrp
from fxlrp.rules.composites import Composite

LONG_RUN = int(os.environ.get("FXLRP_PROPERTY_EXAMPLES", "0"))


def search(examples_in_ci: int):
    """Settings of one property: a fixed set of examples in CI, ``FXLRP_PROPERTY_EXAMPLES``
    fresh ones in a long run."""
    return settings(
        max_examples=LONG_RUN or examples_in_ci,
        deadline=None,
        derandomize=not LONG_RUN,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models are tiny: one thread. With two, torch's dilated convolution waits ~10 ms per
    call for the second thread on a busy machine, which would be most of the file's time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TOLERANCE = 1e-9
"""Relative error of LRP-0 against gradient x input: both are exact in float64 up to rounding."""


# -- 1. LRP-0 equals gradient x input ----------------------------------------------------------

STEP_FUNCTIONS = {torch.sign, torch.sgn, torch.round, torch.floor, torch.ceil, torch.trunc}
SOFTMAX_FUNCTIONS = {torch.softmax, F.softmax}
EMBEDDING_FUNCTIONS = {F.embedding, torch.embedding}


class GradientReference(fx.Interpreter):
    """Runs a plain torch.fx capture of the model and keeps every tensor a node produces.

    Maps whose derivative is 0 almost everywhere (sign, round, floor) and attention weights
    (CP-LRP) are held constant (detached); embedding lookups start the relevance (their outputs
    are leaves). In-place operations run out of place, and later uses see the new value, so that
    each node's recorded value is the one it computed.
    """

    def __init__(self, graph_module: fx.GraphModule) -> None:
        super().__init__(graph_module, garbage_collect_values=False)
        self.values: dict[str, Tensor] = {}
        self.lookups: list[Tensor] = []

    def run_node(self, node: fx.Node):
        arguments = [self.env[argument] for argument in node.all_input_nodes]
        value = self._run_out_of_place(node)
        if any(value is argument for argument in arguments):
            value = value.view_as(value)  # an op that returns its input (dropout in eval): a node of its own
        if self._holds_constant(node):
            value = value.detach()
        if self._is_lookup(node):
            value = value.detach().requires_grad_()
            self.lookups.append(value)
        if isinstance(value, Tensor) and value.is_floating_point() and node.op not in ("placeholder", "output"):
            self.values[node.name] = value
            if value.requires_grad:
                # LRP-0 drops the relevance of values that are exactly 0 (its denominator): a sum
                # |h| + h that is 0 for h < 0 passes none to its summands, the gradient would.
                value.register_hook(lambda grad, nonzero=value != 0: grad * nonzero)
        return value

    def _run_out_of_place(self, node: fx.Node):
        in_place_method = node.op == "call_method" and node.target.endswith("_") and not node.target.endswith("__")
        in_place_call = node.op == "call_function" and node.kwargs.get("inplace") is True
        module = self.module.get_submodule(node.target) if node.op == "call_module" else None
        in_place_module = getattr(module, "inplace", False) is True
        if not (in_place_method or in_place_call or in_place_module):
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        if in_place_method:
            value = getattr(args[0], node.target[:-1])(*args[1:], **kwargs)
        elif in_place_call:
            value = node.target(*args, **{**kwargs, "inplace": False})
        else:
            module.inplace = False
            try:
                value = module(*args, **kwargs)
            finally:
                module.inplace = True
        # What the operation changed in place is its result for every later use.
        self.env[node.args[0]] = value
        return value

    def _holds_constant(self, node: fx.Node) -> bool:
        if node.op == "call_function":
            return node.target in STEP_FUNCTIONS or node.target in SOFTMAX_FUNCTIONS
        if node.op == "call_method":
            return node.target in {"sign", "sgn", "round", "floor", "ceil", "trunc", "softmax"}
        if node.op == "call_module":
            return isinstance(self.module.get_submodule(node.target), nn.Softmax)
        return False

    def _is_lookup(self, node: fx.Node) -> bool:
        if node.op == "call_function":
            return node.target in EMBEDDING_FUNCTIONS
        if node.op == "call_module":
            return isinstance(self.module.get_submodule(node.target), nn.Embedding)
        return False


@contextlib.contextmanager
def _torchs_own_index_select():
    """torch_geometric (imported by other tests) replaces torch.index_select with a Python wrapper
    that branches on its input's dimensions, which plain torch.fx cannot trace: the reference is
    traced with torch's own function."""
    patched = sys.modules.get("torch_geometric.hash_tensor")
    original = getattr(patched, "_old_index_select", None)
    if original is None or torch.index_select is original:
        yield
        return
    replacement, torch.index_select = torch.index_select, original
    try:
        yield
    finally:
        torch.index_select = replacement


def gradient_times_activation(model: RandomModel, inputs: tuple[Tensor, ...], target: int):
    """``a * d(sum out[..., target])/da`` for the input (per token for ids) and every node."""
    model.requires_grad_(False)
    tracer = fx.Tracer(autowrap_modules=(math, torch_scatter))  # torch_scatter's functions as leaves
    with _torchs_own_index_select():
        graph_module = fx.GraphModule(model, tracer.trace(model))
    leaves = [value.detach().clone().requires_grad_() if value.is_floating_point() else value for value in inputs]
    reference = GradientReference(graph_module)
    output = reference.run(*leaves)
    # Relevance starts at the float input, or at the embedding lookup of token ids.
    [start] = [leaf for leaf in leaves if leaf.requires_grad] + reference.lookups
    carrying = {name: value for name, value in reference.values.items() if value.requires_grad}
    grads = torch.autograd.grad(output[..., target].sum(), [start, *carrying.values()], allow_unused=True)

    def times_value(value: Tensor, grad: Tensor | None) -> Tensor:
        return value.detach() * (torch.zeros_like(value) if grad is None else grad)

    relevance = times_value(start, grads[0])
    if reference.lookups:  # per token: summed over the embedding dimension
        relevance = relevance.sum(-1)
    nodes = {name: times_value(value, grad) for (name, value), grad in zip(carrying.items(), grads[1:], strict=True)}
    constants = [name for name, value in reference.values.items() if not value.requires_grad]
    return relevance, nodes, constants


def lrp0_composite(example: Example) -> Rule | Composite:
    # CP-LRP with LRP-0 on the products too: attention weights are constants.
    return Composite(Epsilon(0.0), operation_rules=cp_lrp()) if "attention" in example.flags else LRP0


def lrp0_is_gradient_times_input_at_every_node(example: Example) -> None:
    model, inputs, target = example.model, example.inputs, example.target
    expected_input, expected_nodes, constants = gradient_times_activation(model, inputs, target)
    [x] = inputs

    # BatchNorm as a layer of its own: every node of the model is a node of the explainer (both
    # captured with torch's own index_select, so that the node names agree).
    with _torchs_own_index_select():
        explain = fxlrp.convert(model, lrp0_composite(example), fold_batch_norm=False)
    assert relative_error(fxlrp.attribute(explain, x, target), expected_input) < TOLERANCE
    names = {row.name for row in explain.report().rows}
    missing = sorted(set(expected_nodes) - names)
    assert not missing, f"nodes of the model missing from the explainer: {missing}"
    constants = [name for name in constants if name in names]
    # Recording nodes keeps their values for the caller (a ReLU does not rectify them in place).
    relevance, node_relevance = fxlrp.attribute_nodes(explain, x, [*expected_nodes, *constants], target)
    assert relative_error(relevance, expected_input) < TOLERANCE
    errors = {name: relative_error(node_relevance[name], expected) for name, expected in expected_nodes.items()}
    worst = max(errors, key=errors.get, default=None)
    assert worst is None or errors[worst] < TOLERANCE, f"{worst}: relative error {errors[worst]:.2e}"
    # What LRP holds constant gets no relevance (gates, attention weights, parameters, zeros).
    carrying = [name for name in constants if node_relevance[name].abs().max() > 0]
    assert not carrying, f"relevance at constants: {carrying}"

    # Folded into the layer before it (the default), BatchNorm's shift joins that layer's bias.
    folded = fxlrp.attribute(fxlrp.convert(model, lrp0_composite(example)), x, target)
    assert relative_error(folded, expected_input) < TOLERANCE


# The fast lane searches 100 models; the slow lane (make test-all) 400.
test_lrp0_is_gradient_times_input_at_every_node = search(examples_in_ci=100)(
    given(examples(Family()))(lrp0_is_gradient_times_input_at_every_node))
test_lrp0_is_gradient_times_input_at_every_node_long_search = pytest.mark.slow(search(examples_in_ci=400)(
    given(examples(Family()))(lrp0_is_gradient_times_input_at_every_node)))


# -- 2. Conservation -----------------------------------------------------------------------------

RULES = {"lrp0": Epsilon(0.0), "z+": ZPlus(), "alpha2beta1": AlphaBeta(2.0, 1.0), "gamma": Gamma(0.25)}

ROUNDING = 1e-12
"""Conservation error from rounding, relative to the largest total absolute relevance of any
node: float64 rounds each of the few dozen operations at 1.1e-16 relative to the magnitudes
involved, so the sums may differ by ~1e-14 of that mass; 1e-12 leaves a margin of 100."""


def halves(rule: Rule, call: WeightedCall) -> list[tuple[Tensor, Tensor | float]]:
    """``(denominator, weight)`` of each part of the rule at a layer without bias: the share of
    an output's relevance ``R_k`` that part passes to the inputs is ``weight * d / s(d)``, and
    ``weight * R_k`` is dropped where ``d = 0`` (its contributions are 0 too)."""
    x, weight, layer = call.input, call.weight, call.layer
    positive, negative = x.clamp(min=0), x.clamp(max=0)
    if isinstance(rule, ZPlus):
        return [(layer(positive, weight.clamp(min=0)) + layer(negative, weight.clamp(max=0)), 1.0)]
    if isinstance(rule, AlphaBeta):
        more = layer(positive, weight.clamp(min=0)) + layer(negative, weight.clamp(max=0))
        less = layer(positive, weight.clamp(max=0)) + layer(negative, weight.clamp(min=0))
        return [(more, rule.alpha), (less, -rule.beta)]
    if isinstance(rule, Gamma):
        output = layer(x, weight)
        raised, lowered = weight + rule.gamma * weight.clamp(min=0), weight + rule.gamma * weight.clamp(max=0)
        up = layer(positive, raised) + layer(negative, lowered)
        down = layer(positive, lowered) + layer(negative, raised)
        return [(up, (output > 0).to(x.dtype)), (down, (output < 0).to(x.dtype))]
    assert isinstance(rule, Epsilon) and rule.epsilon == 0
    return [(layer(x, weight), 1.0)]


WEIGHTED = ("linear", "conv", "matmul", "batch_norm")
"""Operations of the generator's weighted layers (``x @ weight.T`` is a matmul with a parameter)."""


def stabiliser(rule: Rule) -> float:
    return rule.epsilon if isinstance(rule, Epsilon) else rule.stabilizer


@pytest.mark.parametrize("rule_name", list(RULES))
@search(examples_in_ci=80)
@given(example=examples(Family(bias=False, attention=False)))
def test_relevance_is_conserved_without_biases(rule_name: str, example: Example) -> None:
    rule = RULES[rule_name]
    model, inputs, target = example.model, example.inputs, example.target
    calls = model.record_weighted_calls(*inputs)
    explain = fxlrp.convert(model, rule)
    rows = explain.report().rows
    weighted = [row.name for row in rows if row.handling == "rule" and row.operation in WEIGHTED]
    assert len(weighted) == len(calls), f"weighted nodes {weighted}, {len(calls)} weighted calls"
    output, values = explain.run_recording([row.name for row in rows if row.handling not in ("input", "output")],
                                           *inputs)
    values = {name: value for name, value in values.items() if isinstance(value, Tensor) and value.is_floating_point()}
    explained = output.detach()[..., target]
    # An explained output that a sum cancelled to rounding noise (|h - h'| for equal h, h') is
    # rounded differently by each forward pass (BatchNorm folded, BLAS kernels), and so is its
    # relevance: such examples say nothing about conservation.
    activations = [*inputs, *values.values()]
    largest = max(value.abs().max().item() for value in activations if value.is_floating_point() and value.numel())
    assume(explained.abs().max().item() > 1e-10 * largest)
    output_relevance = explained.sum()
    relevance = fxlrp.attribute(explain, inputs[0], target)
    recorded, node_relevance = fxlrp.attribute_nodes(explain, inputs[0], list(values), target)
    assert relative_error(recorded, relevance) < 1e-12

    # Relevance a rule drops (denominator 0) and the stabiliser's leak, layer by layer:
    # an output k passes weight * R_k * |d| / (|d| + eps) of each part, not weight * R_k.
    eps = stabiliser(rule)
    dropped, leak = 0.0, 0.0
    for name, call in zip(weighted, calls, strict=True):
        received = node_relevance[name]
        for denominator, weight in halves(rule, call):
            assert denominator.shape == received.shape, name
            share = received * weight
            dropped += share[denominator == 0].sum().item()
            leak += (share.abs() * eps / (denominator.abs() + eps))[denominator != 0].sum().item()

    mass = max([relevance.abs().sum().item(), abs(output_relevance.item())]
               + [value.abs().sum().item() for value in node_relevance.values()])
    error = abs(relevance.sum().item() - (output_relevance.item() - dropped))
    assert error <= leak + ROUNDING * mass, (
        f"input total {relevance.sum().item():.10g}, output {output_relevance.item():.10g}, dropped {dropped:.3g}, "
        f"error {error:.3g} > leak bound {leak:.3g} + rounding {ROUNDING * mass:.3g}")


# -- 3. z+ relevance is non-negative ----------------------------------------------------------------

@search(examples_in_ci=120)
@given(example=st.booleans().flatmap(lambda bias: examples(Family(nonnegative=True, bias=bias))),
       seed=st.integers(0, 2**16))
def test_z_plus_relevance_is_non_negative(example: Example, seed: int) -> None:
    # Only the positive part of a bias enters z+'s denominator, so biases keep the sign too.
    model, inputs = example.model, example.inputs
    assert (inputs[0] >= 0).all()
    with torch.no_grad():
        output = model(*inputs)
    start = torch.rand(output.shape, generator=torch.Generator().manual_seed(seed), dtype=output.dtype)
    relevance = fxlrp.attribute(fxlrp.convert(model, ZPlus()), inputs[0], start)
    assert torch.isfinite(relevance).all()
    assert relevance.min() >= 0, f"relevance {relevance.min().item():.3g} < 0"


# -- 4. The explainer computes the model's outputs ------------------------------------------------

@search(examples_in_ci=160)
@given(example=examples(Family(smooth=True)), seed=st.integers(0, 2**16))
def test_explainer_outputs_equal_model_outputs(example: Example, seed: int) -> None:
    model = example.model
    explain = fxlrp.convert(model, Composite(Epsilon(), operation_rules=cp_lrp()))
    generator = torch.Generator().manual_seed(seed)
    given_input = example.inputs[0]
    if given_input.is_floating_point():
        other = torch.randn(given_input.shape, generator=generator, dtype=given_input.dtype)
    else:
        other = torch.randint(0, int(given_input.max()) + 1, given_input.shape, generator=generator)
    for inputs in (example.inputs, (other,)):
        with torch.no_grad():
            output, trainable = explain(*inputs), model(*inputs)
            model.requires_grad_(False)
            frozen = model(*inputs)
            model.requires_grad_(True)
        if "batch_norm" in example.flags:  # computed as its affine map x * scale + shift
            assert relative_error(output, frozen) < 1e-12
        else:
            assert torch.equal(output, frozen)
        # torch folds a linear layer's matmul differently when its weight requires grad (see
        # the next test): the same numbers up to rounding.
        assert relative_error(output, trainable) < 1e-12


def test_a_linear_layer_on_a_permuted_input_gives_the_models_output_within_its_rounding() -> None:
    """torch computes ``F.linear`` on a non-contiguous 3-D input by different kernels depending
    on whether the weight requires grad (a batched matmul and an add, or a copy and one fused
    ``addmm``), and the explainer holds detached weights: the sums are the same, their order and
    so their rounding may not be (1e-16 apart in float64 on one machine, equal on another). What
    holds on every machine is the rounding bound of a dot product: each output of a sum of
    ``n`` products is within ``gamma_n = n u / (1 - n u)`` times the sum of their absolute values
    of the exact one, whatever the order (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.1), here in float32 against the exact value in float64."""
    class Permuted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(5, 2)

        def forward(self, x):
            return self.linear(x.permute(0, 2, 1))

    torch.manual_seed(0)
    model = Permuted()
    x = torch.randn(2, 5, 5)
    with torch.no_grad():
        output, trainable = fxlrp.convert(model)(x), model(x)
        model.requires_grad_(False)
        frozen = model(x)
    weight, bias, inputs = model.linear.weight.double(), model.linear.bias.double(), x.double().permute(0, 2, 1)
    exact = F.linear(inputs, weight, bias)
    terms = weight.shape[1] + 1  # the products and the bias
    unit = torch.finfo(torch.float32).eps / 2
    bound = terms * unit / (1 - terms * unit) * F.linear(inputs.abs(), weight.abs(), bias.abs())
    for computed in (output, trainable, frozen):
        assert bool(((computed.double() - exact).abs() <= bound).all())


def test_scatter_reduce_followed_by_relu() -> None:
    """Found by the search: a ReLU rectified scatter_reduce's output in place, which
    scatter_reduce's backward had saved (RuntimeError: modified by an inplace operation)."""
    class ScatterReduceReLU(nn.Module):
        def forward(self, x):
            index = torch.zeros_like(x, dtype=torch.long)
            return torch.relu(x.new_zeros(1, 1).scatter_reduce(0, index, x, "sum"))

    x = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    relevance = fxlrp.attribute(fxlrp.convert(ScatterReduceReLU(), LRP0), x, 0)
    assert torch.equal(relevance, x)  # LRP-0 = gradient x input
