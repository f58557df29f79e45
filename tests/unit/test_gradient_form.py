"""The gradient form (fxlrp/relevance/form.py): explanations whose rules all have epsilon 0 carry
``R / x`` backward on native autograd. Each test compares it with the relevance form of the same
explainer (the engine every other test checks against zennit, LXT and dense formulas), or with a
dense LRP formula where the gradient form must not be used; float64 throughout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.references import onehot_relevance, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.relevance.form import GradientFormUnavailable, gradient_form, require_relevance_form
from fxlrp.relevance.roles import ATTENTION, GATE
from fxlrp.rules import Epsilon, Product
from fxlrp.rules.composites import CPLRP, AttnLRP, Composite, EpsilonPlusFlat


class Residual(nn.Module):
    """Convolutions, ReLU, max and average pooling, a residual add, smooth activations, LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.inner = nn.Conv2d(6, 6, 3, padding=1)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(F.relu(self.stem(x)), 2)
        h = h + F.gelu(self.inner(h)) * 0.5
        pooled = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(torch.tanh(self.norm(pooled)) - F.silu(pooled))


class Attention(nn.Module):
    """Self-attention written out: products of two relevance-carrying tensors, softmax, a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out, self.gate = nn.Linear(8, 24), nn.Linear(8, 3), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
        mixed = (weights @ v) * F.silu(self.gate(x)) * torch.sigmoid(x)
        return self.out(mixed.mean(dim=1))


def _forms(explain: nn.Module, inputs: Tensor, target: object, **settings: Any) -> tuple[Tensor, Tensor]:
    assert explain.gradient_form
    gradient = fxlrp.attribute(explain, inputs, target=target, **settings)
    assert explain.gradient_form  # nothing on the way made it fall back
    explain.keep_to_relevance_form()
    return gradient, fxlrp.attribute(explain, inputs, target=target, **settings)


class InPlaceBlock(nn.Module):
    """A residual block as torchvision writes it: BatchNorm, ``ReLU(inplace=True)``, ``out += identity``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.inner, self.norm = nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = self.relu(self.stem(x))
        out = self.norm(self.inner(h))
        out += h
        out = self.relu(out)
        return self.head(F.adaptive_avg_pool2d(out, 1).flatten(1))


@pytest.mark.parametrize(("build", "shape", "composite"), [
    (Residual, (2, 3, 8, 8), Epsilon(0.0)),
    (Attention, (2, 5, 8), AttnLRP(0.0)),
    (Attention, (2, 5, 8), CPLRP(0.0)),
    # a stabiliser (StabilisedGradient: g z / s(z)); epsilon large enough to move every share
    (Residual, (2, 3, 8, 8), Epsilon(0.1)),
    (InPlaceBlock, (2, 3, 8, 8), Epsilon(0.1)),
    (Attention, (2, 5, 8), AttnLRP(0.1)),
    (Attention, (2, 5, 8), CPLRP(0.1)),
], ids=["cnn-lrp0", "attention-attnlrp", "attention-cplrp", "cnn-epsilon", "in-place-block-epsilon",
        "attention-attnlrp-epsilon", "attention-cplrp-epsilon"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_gradient_form_equals_relevance_form(build, shape, composite, capture) -> None:
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(*shape, dtype=torch.float64)
    gradient, relevance = _forms(fxlrp.convert(model, composite, capture=capture), inputs, 1)
    assert relative_error(gradient, relevance) <= 1e-12


class ZeroInputs(nn.Module):
    """Activations whose input is exactly 0 at a unit with non-zero inputs and weights (a weight
    row ``(1, -1, 0, 0)`` on inputs with ``x_0 = x_1``): the relevance form drops the relevance of
    a zero output (LRP-0's ``R / z``), so must the gradient form, whose ``g`` there would otherwise
    reach ``x_0`` and ``x_1`` (with opposite signs) through the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.head = nn.Linear(4, 6, bias=False), nn.Linear(6, 3)
        with torch.no_grad():
            self.inner.weight[2] = torch.tensor([1.0, -1.0, 0.0, 0.0])

    def forward(self, x: Tensor) -> Tensor:
        h = self.inner(x)
        return self.head(F.silu(h) + F.gelu(h)).sum(dim=1)


@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_identity_rule_at_inputs_of_zero(capture) -> None:
    torch.manual_seed(0)
    inputs = torch.randn(2, 5, 4, dtype=torch.float64)
    inputs[..., 1] = inputs[..., 0]  # unit 2 of the inner layer is exactly 0
    gradient, relevance = _forms(fxlrp.convert(ZeroInputs().double().eval(), Epsilon(0.0), capture=capture),
                                 inputs, 1)
    assert relative_error(gradient, relevance) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_silu_identity_rule_over_its_whole_range(dtype) -> None:
    """SiLU's identity rule in the gradient form (``g y / x``, the ratio kept from forward)
    conserves relevance at every unit: ``x g_x = silu(x) g`` from -120 to 120 (where ``exp(x)``
    overflows float32 and the sigmoid rounds to 1), and 0 at ``x = 0``.

    Both sides start from the same ``y = silu(x)`` (the same kernel on the same values): ``x g_x``
    is ``fl(x fl(g fl(y / x)))``, three roundings of relative size at most ``u`` (half a unit in the
    last place), ``y g`` one; so they differ by at most ``((1 + u)^3 - 1 + u) |y g|`` (values that
    underflow add less than 1e-30 here)."""
    unit = torch.finfo(dtype).eps / 2
    tolerance = 4 * unit + 3 * unit**2 + unit**3 + 1e-30  # (1 + u)^3 - 1 + u, written out
    x = torch.cat([torch.linspace(-120, 120, 2001, dtype=dtype), torch.zeros(3, dtype=dtype)]).requires_grad_()
    g = torch.linspace(-2, 3, x.numel(), dtype=dtype)
    with gradient_form(True):
        y = fxlrp.relevance.apply_pass(F.silu, (0,), x, recomputable=True)
        (x_gradient,) = torch.autograd.grad(y, x, g)
    conserved = (F.silu(x) * g).detach()
    assert torch.isfinite(x_gradient).all()
    assert relative_error((x * x_gradient).double(), conserved.double()) <= tolerance
    assert (x_gradient[-3:] == 0).all()


def test_a_relevance_given_as_the_target_is_left_as_it_was_given() -> None:
    """The gradient form divides the relevance it starts from by the output in place where fxlrp
    made it (a class index's), never where the user gave it: a tensor and a NumPy array of the
    output's shape (the array shares its memory with the tensor made of it) keep their values, and
    explain what the relevance form does with them."""
    torch.manual_seed(0)
    model = Residual().double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    given = torch.randn(2, 4, dtype=torch.float64)
    array = given.numpy().copy()
    for target in (given, array):
        kept = torch.as_tensor(target).clone()
        gradient, relevance = _forms(fxlrp.convert(model, Epsilon(0.0)), x, target)
        assert torch.equal(torch.as_tensor(target), kept)
        assert relative_error(gradient, relevance) <= 1e-10


def test_gradient_form_for_token_ids_and_several_targets() -> None:
    """GPT-2 (run eagerly; its LayerNorm computes in float64, where Llama's RMSNorm would upcast to
    float32) explained per token for three candidates of the next token at once, AttnLRP(0) (a list
    of targets on per-position logits names its position: ``output=``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    ids = torch.randint(0, 50, (1, 6))
    gradient, relevance = _forms(fxlrp.convert(model, AttnLRP(0.0)), ids, [3, 7, 11],
                                 output=lambda out: out.logits[:, -1])
    assert gradient.shape == (3, 1, 6)
    assert relative_error(gradient, relevance) <= 1e-10


class FusedAttention(nn.Module):
    """``F.scaled_dot_product_attention`` with grouped-query heads and a causal or padding mask."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.query, self.key_value, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.register_buffer("mask", torch.ones(5, 5, dtype=torch.bool).tril(1))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        q = self.query(x).reshape(batch, length, 4, 2).transpose(1, 2)
        k, v = self.key_value(x).reshape(batch, length, 2, 4).transpose(1, 2).chunk(2, dim=-1)
        mask = None if self.causal else self.mask
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, 8).mean(dim=1))


def _backward_nodes(output: Tensor) -> set[str]:
    """The names of every node of ``output``'s autograd graph."""
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


@pytest.mark.parametrize("composite", [
    AttnLRP(0.0), CPLRP(0.0),
    # weights constant in the product only, the softmax keeping its rule: v takes all
    AttnLRP(0.0, operation_rules={"matmul": Product(0.0, constants=(GATE, ATTENTION))}),
    Composite(Epsilon(0.0)),  # LRP-0: products by the uniform rule of the layer rule's epsilon
], ids=["attnlrp", "cplrp", "product-constants", "lrp0"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "padding-mask"])
@pytest.mark.parametrize("capture", ["fx", "eager"])  # eager: the whole model one part, holding the first layer
def test_fused_attention_keeps_its_kernel_in_the_gradient_form(composite, causal, capture) -> None:
    """In the gradient form fused attention runs the kernel's own backward with the shares of its
    decomposition (q, k: 1/4 and v: 1/2 under AttnLRP; v all under CP-LRP); equal to the
    decomposition the relevance form explains, which runs in backward."""
    torch.manual_seed(0)
    model = FusedAttention(causal).double().eval()
    inputs = torch.randn(2, 5, 8, dtype=torch.float64)
    explain = fxlrp.convert(model, composite, capture=capture)
    with torch.enable_grad(), gradient_form():
        output = explain(inputs.clone().requires_grad_())
    assert "DecomposedInBackwardBackward" not in _backward_nodes(output)  # the kernel's own backward
    gradient, relevance = _forms(explain, inputs, 1)
    assert relative_error(gradient, relevance) <= 1e-12


@pytest.mark.parametrize("composite", [
    AttnLRP(0.1), CPLRP(0.1),
    # the mask's sum under the epsilon rule too (a stabiliser on the logits), products by Epsilon's
    AttnLRP(0.1, operation_rules={"add": Epsilon(0.05)}), Composite(Epsilon(0.1)),
], ids=["attnlrp", "cplrp", "epsilon-sum", "epsilon"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "padding-mask"])
@pytest.mark.parametrize("capture", ["fx", "eager"])
def test_fused_attention_with_a_stabiliser_in_the_gradient_form(composite, causal, capture) -> None:
    """With a stabiliser, which acts on the scores inside the kernel, fused attention's relevance
    is the decomposition's closed form in the gradient form (``R_q / q``, ...); equal to the
    relevance form's."""
    torch.manual_seed(0)
    model = FusedAttention(causal).double().eval()
    inputs = torch.randn(2, 5, 8, dtype=torch.float64)
    gradient, relevance = _forms(fxlrp.convert(model, composite, capture=capture), inputs, 1)
    assert relative_error(gradient, relevance) <= 1e-12


def _recurrent(kind: type[nn.Module]) -> tuple[nn.Module, list[Tensor]]:
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.recurrent, self.head = kind(4, 5, num_layers=2, batch_first=True), nn.Linear(5, 3)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.recurrent(x)[0][:, -1])

    return Recurrent(), [torch.randn(2, 6, 4)]


def _graph(make: str) -> tuple[nn.Module, list[Tensor]]:
    gnn = pytest.importorskip("torch_geometric.nn")
    layers = {"gat": lambda: gnn.GATConv(4, 5, heads=2, concat=False),
              "transformer": lambda: gnn.TransformerConv(4, 5, heads=2, concat=False),
              "edge": lambda: gnn.EdgeConv(nn.Sequential(nn.Linear(8, 5), nn.ReLU()), aggr="max")}

    class Graph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.head = layers[make](), nn.Linear(5, 3)

        def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
            return self.head(torch.relu(self.layer(x, edge_index)))

    return Graph(), [torch.randn(10, 4), torch.randint(0, 10, (2, 30))]


def _bags() -> tuple[nn.Module, list[Tensor]]:
    class Bags(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag, self.head = nn.EmbeddingBag(20, 6, mode="mean"), nn.Linear(6, 3)

        def forward(self, ids: Tensor, offsets: Tensor) -> Tensor:
            return self.head(self.bag(ids, offsets))

    return Bags(), [torch.randint(0, 20, (8,)), torch.tensor([0, 3])]


@pytest.mark.parametrize("build", [
    lambda: _recurrent(nn.LSTM), lambda: _recurrent(nn.GRU), lambda: _graph("gat"), lambda: _graph("transformer"),
    lambda: _graph("edge"), _bags,
], ids=["lstm", "gru", "gat", "transformer-conv", "edge-conv", "embedding-bag"])
@pytest.mark.parametrize("composite", [Epsilon(0.0), CPLRP(0.0)], ids=["lrp0", "cplrp"])
def test_gradient_form_of_recurrent_graph_and_bag_models(build, composite) -> None:
    """Gates as constants (LSTM, GRU), graph attention and max aggregation, embedding bags: each
    equal to the relevance form."""
    torch.manual_seed(0)
    model, inputs = build()
    model = model.double().eval()
    inputs = [value.double() if value.is_floating_point() else value for value in inputs]
    gradient, relevance = _forms(fxlrp.convert(model, composite), inputs, 1)
    assert relative_error(gradient[0], relevance[0]) <= 1e-12


def test_composites_of_other_rules_keep_the_relevance_form() -> None:
    model = Residual().double().eval()
    assert fxlrp.convert(model, Epsilon(0.0)).gradient_form
    assert fxlrp.convert(model).gradient_form  # Epsilon(1e-6)
    assert fxlrp.convert(model, AttnLRP()).gradient_form
    assert not fxlrp.convert(model, EpsilonPlusFlat()).gradient_form
    assert not fxlrp.convert(model, Epsilon(0.0, zero_params="bias")).gradient_form
    assert not fxlrp.convert(model, Epsilon(lambda z: z + 0.1 * z.sign())).gradient_form  # a function


@pytest.mark.parametrize(("build", "shape", "composite"), [
    (InPlaceBlock, (2, 3, 8, 8), Epsilon(0.1)), (Attention, (2, 5, 8), AttnLRP(0.1)),
], ids=["in-place-block", "attention"])
def test_stabilised_layers_keep_their_output_through_saved_tensor_hooks(build, shape, composite) -> None:
    """Under saved-tensor hooks (gradient checkpointing's; here ``save_on_cpu``, which copies what
    is saved) a stabilised layer's kept output goes through them, and a ReLU after it runs natively
    (gating the gradient itself): the relevance is the relevance form's."""
    torch.manual_seed(0)
    model = build().double().eval()
    inputs = torch.randn(*shape, dtype=torch.float64)
    explain = fxlrp.convert(model, composite)
    with torch.autograd.graph.save_on_cpu():
        hooked = fxlrp.attribute(explain, inputs, target=1)
    assert explain.gradient_form
    explain.keep_to_relevance_form()
    assert relative_error(hooked, fxlrp.attribute(explain, inputs, target=1)) <= 1e-12


class CancellingUnit(nn.Module):
    """A unit whose output is exactly 0 from contributions that are not (weights ``(1, -1, 0, 0)``
    on inputs with ``x_0 = x_1``), before a sigmoid, which the identity rule passes relevance
    through although its input is 0."""

    def __init__(self, cancelling: bool = True) -> None:
        super().__init__()
        self.inner, self.head = nn.Linear(4, 6, bias=False), nn.Linear(6, 3)
        with torch.no_grad():
            self.inner.weight[2] = torch.tensor([1.0, -1.0, 0.0, 0.0]) if cancelling else 0.0

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.sigmoid(self.inner(x))).sum(dim=1)


def test_a_stabilised_output_of_zero_passes_no_relevance_in_the_gradient_form() -> None:
    """At ``z = 0`` the gradient form's ``g z / s(z)`` is 0, where the relevance form shares the
    relevance the identity rule brought there as ``x_j w_j R / epsilon`` (``+-x_0 R / epsilon``,
    summing to 0): the gradient form equals the relevance form of the same model with that unit's
    contributions 0 (its weights zeroed: the same outputs)."""
    torch.manual_seed(0)
    inputs = torch.randn(2, 5, 4, dtype=torch.float64)
    inputs[..., 1] = inputs[..., 0]
    model = CancellingUnit().double().eval()
    zeroed = CancellingUnit(cancelling=False).double().eval()
    zeroed.load_state_dict({**model.state_dict(), "inner.weight": model.inner.weight.detach().clone().index_fill(
        0, torch.tensor([2]), 0.0)})
    gradient, relevance = _forms(fxlrp.convert(model, Epsilon(1e-3)), inputs, 1)
    explain_zeroed = fxlrp.convert(zeroed, Epsilon(1e-3))
    explain_zeroed.keep_to_relevance_form()
    reference = fxlrp.attribute(explain_zeroed, inputs, target=1)
    assert torch.isfinite(gradient).all()
    assert relative_error(gradient, reference) <= 1e-12
    # the relevance form's shares of the zero output are large and cancel
    assert (relevance - reference)[..., :2].abs().max() > 1.0
    assert relative_error((relevance - reference)[..., :2].sum(-1), torch.zeros(2, 5, dtype=torch.float64)) <= 1e-9


def test_prelu_falls_back_to_the_relevance_form() -> None:
    """PReLU's native backward scales relevance (not R / x) by its slope: no gradient form. The
    explanation equals LRP-0 by hand with that scaling, and the explainer keeps the relevance form."""
    torch.manual_seed(0)
    first, prelu, second = nn.Linear(4, 6).double(), nn.PReLU(6, init=0.3).double(), nn.Linear(6, 2).double()
    model = nn.Sequential(first, prelu, second).eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    assert explain.gradient_form
    relevance = fxlrp.attribute(explain, x, target=1)
    assert not explain.gradient_form
    with torch.no_grad():
        z1 = first(x)
        a = prelu(z1)
        z2 = second(a)
        r2 = torch.zeros_like(z2)
        r2[:, 1] = z2[:, 1]
        r_a = a * ((r2 / z2).nan_to_num(0.0) @ second.weight)
        r_z1 = torch.where(z1 > 0, r_a, r_a * prelu.weight)
        expected = x * ((r_z1 / z1) @ first.weight)
    assert relative_error(relevance, expected) <= 1e-12


def test_an_operation_without_a_rule_falls_back() -> None:
    """``strict=False`` lets relevance follow the gradient through an operation without a rule
    (here torch.exp, run eagerly): that is the relevance's gradient, so the gradient form is left."""

    class Exponential(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            if x.sum() > -1e9:  # data-dependent: run eagerly
                return self.second(torch.exp(self.first(x)))
            return x

    torch.manual_seed(0)
    model = Exponential().double()
    x = torch.randn(2, 3, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0), strict=False)
    with pytest.warns(UserWarning, match="follows the gradient through torch.exp"):
        relevance = fxlrp.attribute(explain, x, target=0)
    assert not explain.gradient_form
    with torch.no_grad():
        h = torch.exp(model.first(x))
        z = model.second(h)
        r = torch.zeros_like(z)
        r[:, 0] = z[:, 0]
        r_h = h * ((r / z) @ model.second.weight)
        r_z = r_h * h  # the gradient of exp, applied to relevance
        expected = x * ((r_z / model.first(x)) @ model.first.weight)
    assert relative_error(relevance, expected) <= 1e-12


def test_the_fallback_signal_passes_through_a_backward_pass() -> None:
    """A relevance function computed in backward (a fused kernel's decomposition) may meet a rule
    without gradient form there; the signal must reach fxlrp.attribute unchanged through autograd."""

    class Raising(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx, gradient: Tensor) -> Tensor:
            require_relevance_form("a rule")
            return gradient

    x = torch.ones(2, requires_grad=True)
    with gradient_form(True):
        y = Raising.apply(x).sum()
        with pytest.raises(GradientFormUnavailable):
            torch.autograd.grad(y, x)


class TwoBranches(nn.Module):
    """``a(x) + b(x)``; ``branch``: a branch on the input's value (the part runs eagerly)."""

    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.a, self.b, self.branch = nn.Linear(4, 3), nn.Linear(4, 3), branch

    def forward(self, x):
        if self.branch and x.sum() < -1e9:
            x = x * 2
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("branch", [False, True], ids=["fx", "eager"])
def test_a_rule_whose_gradient_form_is_not_the_gradient_is_applied_in_the_gradient_form(branch: bool) -> None:
    """Layers whose rule's gradient form is their native gradient (LRP-0) run as they are in the
    gradient form; a rule with another gradient form (here: ``b`` held constant) must still be
    applied. Reference: gradient x input of ``a(x) + b(x).detach()``, seeded with ``R / y``."""
    from fxlrp.rules import AttentionAsConstant

    torch.manual_seed(4)
    model = TwoBranches(branch).double().eval()
    x = torch.randn(5, 4, dtype=torch.float64)
    explain = fxlrp.convert(model, Composite(Epsilon(0.0), name_rules={"b": AttentionAsConstant()}))
    assert explain.gradient_form
    relevance = fxlrp.attribute(explain, x, target=1)
    leaf = x.clone().requires_grad_()
    output = model.a(leaf) + model.b(leaf).detach()
    [gradient] = torch.autograd.grad(output, [leaf], onehot_relevance(output, 1) / output.detach())
    assert relative_error(relevance, leaf.detach() * gradient) < 1e-12


@pytest.mark.parametrize("pattern", ["one-row", "one-row-of-negatives-and-zeros", "one-column", "one-entry",
                                     "entries-in-two-rows", "rows-at-both-ends", "every-row-in-12-columns",
                                     "every-row-in-13-columns", "half-zeros", "dense", "nan-in-a-row"])
def test_linear_input_gradient_multiplies_only_what_carries_relevance(pattern: str) -> None:
    """``g @ W`` over the rows and columns of ``g`` that are not all 0 (fxlrp/operations/layers.py)
    against the dense product, and the rows and columns it keeps against an enumeration: columns
    looked for among few carrying rows, and over all rows where most carry (at the bound of a
    sixteenth of the columns and past it)."""
    from fxlrp.operations.layers import carrying_rows_and_columns, linear_input_gradient

    generator = torch.Generator().manual_seed(0)
    gradient = torch.zeros(2, 96, 200, dtype=torch.float64)  # (batch, positions, out features)
    values = torch.randn(gradient.shape, generator=generator, dtype=torch.float64)
    if pattern == "one-row":
        gradient[1, 40] = values[1, 40]
    elif pattern == "one-row-of-negatives-and-zeros":  # (its largest entry is 0)
        gradient[1, 40] = -values[1, 40].clamp(min=0)
    elif pattern == "one-column":
        gradient[..., 7] = values[..., 7]
    elif pattern == "one-entry":
        gradient[0, -1, 123] = 2.5
    elif pattern == "entries-in-two-rows":  # (the columns of both rows, not of the first alone)
        gradient[0, 3, 10], gradient[1, 50, 150] = 1.0, -2.0
    elif pattern == "rows-at-both-ends":
        gradient[0, 0], gradient[1, -1] = values[0, 0], values[1, -1]
    elif pattern.startswith("every-row-in-"):  # every row carries: columns at the bound (12 of 200), past it
        columns = list(range(5, 200, 16))[:int(pattern.split("-")[3])]
        gradient[..., columns] = values[..., columns]
    elif pattern == "half-zeros":
        gradient = values * (values > 0)
    elif pattern == "dense":
        gradient = values
    else:
        gradient[0, 5, 3] = float("nan")
    weight = torch.randn(200, 64, generator=generator, dtype=torch.float64)
    matrix = gradient.reshape(-1, 200)
    carrying_rows = [i for i in range(len(matrix)) if any(value != 0 for value in matrix[i].tolist())]
    carrying_columns = [j for j in range(200) if any(value != 0 for value in matrix[:, j].tolist())]
    rows, columns = carrying_rows_and_columns(matrix, 64)
    expected_rows = carrying_rows if 2 * len(carrying_rows) <= len(matrix) else None
    expected_columns = carrying_columns if 16 * len(carrying_columns) <= 200 else None
    assert (rows if rows is None else rows.tolist()) == expected_rows
    assert (columns if columns is None else columns.tolist()) == expected_columns
    assert (pattern in ("half-zeros", "dense", "every-row-in-13-columns")) == (rows is None and columns is None)
    product = linear_input_gradient(gradient, weight)
    assert product.shape == (2, 96, 64)
    torch.testing.assert_close(product, gradient @ weight, rtol=1e-12, atol=1e-12, equal_nan=True)


class LastPositionHead(nn.Module):
    """A sequence model explained at its last position through a wide head, as a causal LM is."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.mix, self.head = nn.Linear(16, 24), nn.Linear(24, 16), nn.Linear(16, 300)

    def forward(self, x: Tensor) -> Tensor:
        return self.head((self.mix(torch.relu(self.inner(x))) + x)[:, -1])


def _record_skipped_zeros(monkeypatch) -> list[tuple[bool, bool]]:
    """Every product large enough to look for zeros; which of them left out rows, columns."""
    from fxlrp.operations import layers

    kept, carrying_rows_and_columns = [], layers.carrying_rows_and_columns

    def recorded(matrix: Tensor, inner: int) -> tuple[Tensor | None, Tensor | None]:
        rows, columns = carrying_rows_and_columns(matrix, inner)
        kept.append((rows is not None, columns is not None))
        return rows, columns

    monkeypatch.setattr(layers, "SPARSE_CHECK_MIN_PRODUCT", 0)
    monkeypatch.setattr(layers, "carrying_rows_and_columns", recorded)
    return kept


def test_epsilon_rule_through_linear_layers_of_selected_rows_and_columns(monkeypatch) -> None:
    """The epsilon rule (relevance form) with the products over carrying rows and columns against
    the same explainer with every product dense."""
    from fxlrp.operations import layers

    torch.manual_seed(0)
    model = LastPositionHead().double().eval()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    explain = fxlrp.convert(model, Composite(Epsilon(0.1)))
    monkeypatch.setattr(layers, "SPARSE_CHECK_MIN_PRODUCT", 2**62)
    dense = fxlrp.attribute(explain, x, target=torch.tensor([17, 250]))
    kept = _record_skipped_zeros(monkeypatch)
    relevance = fxlrp.attribute(explain, x, target=torch.tensor([17, 250]))
    assert relative_error(relevance, dense) <= 1e-12
    assert sorted(set(kept)) == [(False, True), (True, False)]


class ComputedWeight(nn.Module):
    """A linear layer whose weight is computed from the input (a hypernetwork's)."""

    def __init__(self) -> None:
        super().__init__()
        self.make_weight, self.head = nn.Linear(16, 16 * 16), nn.Linear(16, 300)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.make_weight(x.mean(dim=(0, 1))).reshape(16, 16)
        return self.head(F.linear(x, weight)[:, -1])


@pytest.mark.parametrize(("build", "gradient_form", "skipped"), [
    (LastPositionHead, True, [(False, True), (True, False)]),  # the head's columns, the rows below it
    (LastPositionHead, False, [(False, True), (True, False)]),
    # a weight computed from the inputs carries relevance: that layer keeps autograd's backward,
    # which gives the weight its share (a backward that skips zeros gave only the input's); the
    # layer computing the weight gets a dense gradient and looks in vain
    (ComputedWeight, True, [(False, False), (False, True)]),
], ids=["gradient-form", "relevance-form", "computed-weight"])
def test_lrp0_through_linear_layers_of_selected_rows_and_columns_is_gradient_times_input(
        monkeypatch, build: type[nn.Module], gradient_form: bool, skipped: list[tuple[bool, bool]]) -> None:
    """Below the head only the last position's rows carry relevance and the head's gradient is one
    column per sample: linear layers multiply only those, and LRP-0 is still gradient x input
    computed by torch's own backward."""
    kept = _record_skipped_zeros(monkeypatch)
    torch.manual_seed(0)
    model = build().double().eval()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    targets = torch.tensor([17, 250])
    explain = fxlrp.convert(model, Composite(Epsilon(0.0)))
    explain.conversion = dataclasses.replace(explain.conversion, gradient_form=gradient_form)
    relevance = fxlrp.attribute(explain, x, target=targets)
    assert explain.gradient_form == gradient_form
    leaf = x.clone().requires_grad_()
    model(leaf)[[0, 1], targets].sum().backward()
    assert relative_error(relevance, leaf.grad * x) <= 1e-12
    assert sorted(set(kept)) == skipped
