"""Operations timm models use, against dense references (float64), as in ``test_operations.py``.

Each case is a small model written the way a user (or timm) writes it. Its relevance from
``fxlrp.convert`` is compared with a reference built from the explicit Jacobian
(``torch.autograd.functional.jacobian``) and the rule's formula by hand:

- powers ``x ** p`` (squared ReLU, StarReLU): the identity rule ``R_in = R_out``;
- ``torch.addcmul(b, w, x)`` (ResMLP's Affine): the epsilon rule of the layer ``z = b + w x``; both
  multiplicands relevant: half the epsilon rule's share each (the product rule);
- interpolation: the z-rule ``R_j = x_j sum_k J_kj R_k / z_k`` (linear modes) or ``R_in = J^T R``
  (nearest: the native routing of a copy);
- unfold: ``R_in = J^T R``; fold: the z-rule;
- statistics (norms, var, std, sqrt, rsqrt) held constant: the epsilon rule of the model in which
  the statistic is ``.detach()``-ed, i.e. a constant factor (GRN, EvoNorm, hand-written LayerNorm).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from support.operations import Case, Op, layer, randn
from support.references import epsilon_reference, explained_relevance, relative_error, routed_reference
from torch import Tensor, nn

import fxlrp
from fxlrp.operations.powers import power
from fxlrp.relevance.call import RelevanceCall
from fxlrp.rules import Epsilon, ZPlus
from fxlrp.rules.composites import Composite

TOLERANCE = 1e-10
Held = Callable[[Tensor], Tensor]


def _keep(tensor: Tensor) -> Tensor:
    return tensor


def _detach(tensor: Tensor) -> Tensor:
    return tensor.detach()


def _pow_in_place(m, x):
    out = x.clone()
    out.pow_(2)
    return out


def _ipow(m, x):
    out = x * 1.0
    out **= 2
    return out


def _addcmul_in_place(m, x):
    out = m.bias.expand_as(x).clone()
    out.addcmul_(m.weight, x)
    return out


def interpolation(mode: str, align_corners: bool) -> Callable[..., Tensor]:
    def spelling(m, x):
        return F.interpolate(x, scale_factor=2, mode=mode, align_corners=align_corners)

    return spelling


def sampling(**settings: object) -> Callable[..., Tensor]:
    def spelling(m, x):
        return F.grid_sample(x, m.grid, **settings)

    return spelling


SAMPLING_GRID = 2.4 * torch.rand(2, 3, 6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) - 1.2
VOLUME_GRID = 1.2 * torch.rand(1, 2, 3, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) - 0.6

POWERS = [
    Case("pow operator", lambda m, x: x ** 2, ((3, 4),), "identity"),
    Case("pow operator odd", lambda m, x: x ** 3, ((3, 4),), "identity"),
    Case("torch.pow", lambda m, x: torch.pow(x, 2), ((3, 4),), "identity"),
    Case("torch.pow negative exponent", lambda m, x: torch.pow(x, -1.0), ((3, 4),), "identity"),
    Case("torch.pow constant tensor exponent", lambda m, x: torch.pow(x, m.exponent), ((3, 4),), "identity",
         buffers={"exponent": torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)}),
    Case("torch.square", lambda m, x: torch.square(x), ((3, 4),), "identity"),
    Case("pow method", lambda m, x: x.pow(2), ((3, 4),), "identity"),
    Case("pow method keyword", lambda m, x: x.pow(exponent=4), ((3, 4),), "identity"),
    Case("square method", lambda m, x: x.square(), ((3, 4),), "identity"),
    Case("pow_ in place", _pow_in_place, ((3, 4),), "identity"),
    Case("pow **=", _ipow, ((3, 4),), "identity"),
]

ADDCMUL_PARAMETERS = {"weight": randn(4), "bias": randn(4)}
MULTIPLY_ADDS = [
    Case("torch.addcmul weight first", lambda m, x: torch.addcmul(m.bias, m.weight, x), ((2, 3, 4),), "rule", True,
         parameters=ADDCMUL_PARAMETERS),
    Case("torch.addcmul weight second value", lambda m, x: torch.addcmul(m.bias, x, m.weight, value=0.5),
         ((2, 3, 4),), "rule", True, parameters=ADDCMUL_PARAMETERS),
    Case("addcmul method", lambda m, x: m.bias.addcmul(m.weight, x), ((3, 4),), "rule", True,
         parameters=ADDCMUL_PARAMETERS),
    Case("addcmul_ in place", _addcmul_in_place, ((3, 4),), "rule", True, parameters=ADDCMUL_PARAMETERS),
    Case("addcmul relevant summand", lambda m, x, y: torch.addcmul(y, m.weight, x), ((3, 4), (3, 4)), "rule", True,
         parameters={"weight": randn(4)}),
    Case("addcmul constant product", lambda m, x: torch.addcmul(x, m.weight, m.bias), ((3, 4),), "rule", True,
         parameters=ADDCMUL_PARAMETERS),
    Case("addcmul of two relevant factors", lambda m, x, y: torch.addcmul(m.bias, x, y, value=2.0),
         ((3, 4), (3, 4)), "halves of rule", True, parameters={"bias": randn(4)}),
]
# beta * input + alpha * a @ b (GPT-2's Conv1D: addmm; BLOOM's ALiBi scores: baddbmm), factors by
# position or by keyword
ADDED_MATRIX_PRODUCTS = [
    Case("torch.addmm right factor relevant", lambda m, x: torch.addmm(m.bias, m.weight, x, beta=0.5, alpha=2.0),
         ((4, 5),), "rule", True, parameters={"weight": randn(3, 4), "bias": randn(5)}),
    Case("addmm relevant summand", lambda m, x, y: torch.addmm(y, x, m.weight), ((3, 4), (3, 5)), "rule", True,
         parameters={"weight": randn(4, 5)}),
    Case("addmm of two relevant factors by keyword", lambda m, x, y: m.bias.addmm(mat1=x, mat2=y, alpha=0.5),
         ((3, 4), (4, 5)), "halves of rule", True, parameters={"bias": randn(3, 5)}),
    Case("torch.baddbmm weight second", lambda m, x: torch.baddbmm(m.bias, x, m.weight, beta=0.5, alpha=2.0),
         ((2, 3, 4),), "rule", True, parameters={"weight": randn(2, 4, 5), "bias": randn(1, 5)}),
    Case("baddbmm method weight first by keyword", lambda m, x: m.bias.baddbmm(batch1=m.weight, batch2=x),
         ((2, 4, 5),), "rule", True, parameters={"weight": randn(2, 3, 4), "bias": randn(2, 3, 5)}),
    Case("baddbmm of two relevant factors by keyword (ALiBi)",
         lambda m, x, y: m.bias.baddbmm(batch1=x, batch2=y, beta=1.0, alpha=0.5), ((2, 3, 4), (2, 4, 5)),
         "halves of rule", True, parameters={"bias": randn(2, 3, 5)}),
    Case("torch.addbmm of two relevant factors", lambda m, x, y: torch.addbmm(m.bias, x, y), ((2, 3, 4), (2, 4, 5)),
         "halves of rule", True, parameters={"bias": randn(3, 5)}),
]

RESAMPLING = [
    *(
        Case(f"interpolate {mode} align_corners={corners}", interpolation(mode, corners), (shape,), "rule")
        for mode, shape in (("linear", (2, 3, 5)), ("bilinear", (1, 2, 4, 5)), ("bicubic", (1, 2, 4, 5)),
                            ("trilinear", (1, 2, 2, 3, 3)))
        for corners in (False, True)
    ),
    Case("interpolate bilinear to size", lambda m, x: F.interpolate(x, size=(7, 3), mode="bilinear"),
         ((1, 2, 4, 5),), "rule"),
    Case("interpolate bilinear antialiased down", lambda m, x: F.interpolate(x, size=(3, 2), mode="bilinear",
                                                                             antialias=True), ((1, 2, 7, 6),), "rule"),
    Case("interpolate bicubic non-integer scale", lambda m, x: F.interpolate(x, scale_factor=1.5, mode="bicubic"),
         ((1, 2, 4, 4),), "rule"),
    Case("interpolate area", lambda m, x: F.interpolate(x, size=(3, 2), mode="area"), ((1, 2, 7, 5),), "rule"),
    Case("Upsample bilinear module", lambda m, x: m.layer(x), ((1, 2, 3, 4),), "rule",
         modules=layer(lambda: nn.Upsample(scale_factor=2, mode="bilinear"))),
    Case("UpsamplingBilinear2d module", lambda m, x: m.layer(x), ((1, 2, 3, 4),), "rule",
         modules=layer(lambda: nn.UpsamplingBilinear2d(scale_factor=2))),
    Case("F.upsample bilinear", lambda m, x: F.upsample(x, scale_factor=2, mode="bilinear", align_corners=False),
         ((1, 2, 3, 4),), "rule"),
    Case("F.upsample_bilinear", lambda m, x: F.upsample_bilinear(x, scale_factor=2), ((1, 2, 3, 4),), "rule"),
    Case("interpolate nearest", lambda m, x: F.interpolate(x, scale_factor=2), ((1, 2, 3, 4),), "routed"),
    Case("interpolate nearest 1d", lambda m, x: F.interpolate(x, size=7, mode="nearest"), ((2, 3, 5),), "routed"),
    Case("interpolate nearest 3d", lambda m, x: F.interpolate(x, scale_factor=(1, 2, 2)), ((1, 2, 2, 3, 2),),
         "routed"),
    Case("interpolate nearest-exact down", lambda m, x: F.interpolate(x, size=(3, 2), mode="nearest-exact"),
         ((1, 2, 7, 5),), "routed"),
    Case("Upsample module default", lambda m, x: m.layer(x), ((1, 2, 3, 4),), "routed",
         modules=layer(lambda: nn.Upsample(scale_factor=3))),
    Case("UpsamplingNearest2d module", lambda m, x: m.layer(x), ((1, 2, 3, 4),), "routed",
         modules=layer(lambda: nn.UpsamplingNearest2d(size=(5, 7)))),
    Case("F.upsample_nearest", lambda m, x: F.upsample_nearest(x, scale_factor=2), ((1, 2, 3, 4),), "routed"),
    # grid_sample at fixed positions (some outside the input: zero padding, border, reflection)
    *(
        Case(f"grid_sample {mode} {padding} align_corners={corners}",
             sampling(mode=mode, padding_mode=padding, align_corners=corners), ((2, 3, 4, 5),),
             "routed" if mode == "nearest" else "rule", buffers={"grid": SAMPLING_GRID})
        for mode, padding, corners in (("bilinear", "zeros", False), ("bilinear", "border", True),
                                       ("bicubic", "reflection", False), ("nearest", "zeros", True))
    ),
    Case("grid_sample default mode 3d", lambda m, x: F.grid_sample(x, m.grid, align_corners=False),
         ((1, 2, 3, 4, 5),), "rule", buffers={"grid": VOLUME_GRID}),
]

PATCHES = [
    Case("F.unfold", lambda m, x: F.unfold(x, 2), ((1, 2, 4, 5),), "routed"),
    Case("F.unfold overlapping dilated padded", lambda m, x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1,
                                                                      stride=(2, 1)), ((2, 2, 5, 6),), "routed"),
    Case("Unfold module", lambda m, x: m.layer(x), ((1, 3, 4, 4),), "routed",
         modules=layer(lambda: nn.Unfold(3, padding=1))),
    Case("F.fold overlapping padded", lambda m, x: F.fold(x, (5, 6), 3, padding=1), ((1, 18, 30),), "rule"),
    Case("F.fold dilated strided", lambda m, x: F.fold(x, (6, 5), (2, 2), dilation=2, stride=(1, 2)),
         ((2, 8, 8),), "rule"),
    Case("Fold module disjoint", lambda m, x: m.layer(x), ((1, 8, 6),), "rule",
         modules=layer(lambda: nn.Fold((4, 6), 2, stride=2))),
    Case("fold of unfold", lambda m, x: F.fold(F.unfold(x, 3, padding=1), (4, 5), 3, padding=1), ((1, 2, 4, 5),),
         "rule"),
]

CASES = POWERS + MULTIPLY_ADDS + ADDED_MATRIX_PRODUCTS + RESAMPLING + PATCHES


def reference(case: Case, model: nn.Module, inputs: list[Tensor], relevance: Tensor, epsilon: float) -> list[Tensor]:
    if case.kind == "rule":
        return epsilon_reference(model, inputs, relevance, epsilon if case.weighted else 0.0)
    if case.kind == "halves of rule":  # the product rule: each factor half its epsilon-rule share
        return [share / 2 for share in epsilon_reference(model, inputs, relevance, epsilon)]
    if case.kind == "routed":
        return routed_reference(model, inputs, relevance)
    if case.kind == "identity":
        return [relevance]
    raise AssertionError(case.kind)


RUNS = [(case, 0.0) for case in CASES] + [(case, 0.25) for case in CASES if case.weighted]


@pytest.mark.parametrize("capture", ["auto", "eager"])
@pytest.mark.parametrize(("case", "epsilon"), RUNS, ids=[f"{case.name}-eps{epsilon}" for case, epsilon in RUNS])
def test_operation_matches_dense_reference(case: Case, epsilon: float, capture: str) -> None:
    """Captured as a graph and run eagerly (three calls: the second records the run, the third
    replays it), each spelling as the model writes it (``x ** 2`` reaches code run eagerly as
    ``Tensor.__pow__``, a wrapper named ``pow``)."""
    generator = torch.Generator().manual_seed(11)
    model, inputs = case.build(generator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # F.upsample* are deprecated
        explain = fxlrp.convert(model, Epsilon(epsilon), capture=capture)
        with torch.no_grad():
            output = model(*inputs)
            assert torch.equal(explain(*inputs), output)
        relevance = torch.randn(output.shape, generator=generator, dtype=torch.float64)
        expected = reference(case, model, inputs, relevance, epsilon)
        for _ in range(3 if capture == "eager" else 1):
            actual = explained_relevance(explain, inputs, relevance)
            for actual_input, expected_input in zip(actual, expected, strict=True):
                assert actual_input.shape == expected_input.shape
                assert torch.isfinite(actual_input).all()
                assert relative_error(actual_input, expected_input) < TOLERANCE


CONSERVING = ("interpolate bilinear align_corners=False", "interpolate bicubic align_corners=True",
              "interpolate trilinear align_corners=False", "interpolate area", "interpolate nearest",
              "F.fold overlapping padded", "Fold module disjoint", "fold of unfold", "F.unfold")


@pytest.mark.parametrize("case", [case for case in CASES if case.name in CONSERVING], ids=lambda case: case.name)
def test_resampling_conserves_relevance(case: Case) -> None:
    """Interpolation and folding are linear maps without a bias: the z-rule (or routing) keeps the
    total relevance."""
    model, inputs = case.build(torch.Generator().manual_seed(5))
    with torch.no_grad():
        output = model(*inputs)
    relevance = torch.randn(output.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(model), inputs, relevance)
    assert abs(actual.sum().item() - relevance.sum().item()) < 1e-10 * relevance.abs().sum().item()


class DeformableSampling(nn.Module):
    """Deformable attention's sampling: positions computed from the input (a pooled query's
    offsets around a base grid), values sampled there and weighted."""

    def __init__(self, positions_detached: bool = False) -> None:
        super().__init__()
        self.offsets, self.values, self.weights = nn.Linear(3, 8), nn.Conv2d(3, 3, 1), nn.Parameter(torch.randn(4))
        self.positions_detached = positions_detached

    def forward(self, x: Tensor) -> Tensor:
        query = x.mean((2, 3))
        grid = torch.tanh(self.offsets(query)).view(-1, 1, 4, 2) + torch.linspace(-0.5, 0.5, 8).view(1, 1, 4, 2)
        grid = grid.detach() if self.positions_detached else grid
        sampled = F.grid_sample(self.values(x), grid, align_corners=False)  # [batch, 3, 1, 4]
        return (sampled * self.weights).sum(-1).flatten(1)


@pytest.mark.parametrize("capture", ["auto", "eager"])
def test_grid_sample_positions_are_held_constant(capture: str) -> None:
    """The sampling positions, computed from the relevance-carrying input, receive no relevance:
    LRP-0 equals gradient x input of the model whose positions are detached (which differs from
    the model's own gradient x input), for the first call, the recording and the replay."""
    torch.manual_seed(0)
    model = DeformableSampling().double().eval()
    reference_model = DeformableSampling(positions_detached=True).double().eval()
    reference_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    leaf = x.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(reference_model(leaf)[:, 1].sum(), leaf)
    (own_gradient,) = torch.autograd.grad(model(leaf)[:, 1].sum(), leaf)
    assert relative_error(x * own_gradient, x * gradient) > 1e-3  # the positions matter to the gradient
    explain = fxlrp.convert(model, Epsilon(0.0), capture=capture)
    for _ in range(3):
        relevance = fxlrp.attribute(explain, x, target=1)
        assert relative_error(relevance, x * gradient) < TOLERANCE


def test_nearest_upsampling_keeps_relevance_of_zero_values() -> None:
    """Nearest upsampling copies values; relevance goes back to the copied value even where it
    is 0 (the z-rule would drop it there): R_in = J^T R exactly."""
    x = torch.tensor([[[[0.0, 1.5], [-2.0, 0.0]]]], dtype=torch.float64)
    model = Op(lambda m, x: F.interpolate(x, scale_factor=2))
    relevance = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4)
    (actual,) = explained_relevance(fxlrp.convert(model), [x], relevance)
    assert torch.equal(actual, torch.tensor([[[[10.0, 18.0], [42.0, 50.0]]]], dtype=torch.float64))


# --- powers: activations, exponents that carry relevance, powers of relevance-free values


class StarReLU(nn.Module):
    """MetaFormer's ``s * relu(x) ** 2 + b``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.8], dtype=torch.float64))
        self.bias = nn.Parameter(torch.tensor([-0.3], dtype=torch.float64))

    def forward(self, x):
        return self.scale * F.relu(x) ** 2 + self.bias


def star_relu_reference(x: Tensor, scale: Tensor, bias: Tensor, relevance: Tensor) -> Tensor:
    """ReLU routes, the power and the scale pass relevance, the bias absorbs its z-rule share:
    ``R_x = [x > 0] y / (y + b) R`` with ``y = s relu(x)^2``."""
    squared = scale * x.clamp(min=0) ** 2
    return torch.where(x > 0, squared / (squared + bias) * relevance, torch.zeros_like(x))


def test_star_relu_matches_its_formula() -> None:
    model = StarReLU().eval()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    relevance = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(model), [x], relevance)
    expected = star_relu_reference(x, model.scale.detach(), model.bias.detach(), relevance)
    assert relative_error(actual, expected) < TOLERANCE


class SquaredMlp(nn.Module):
    """``fc2(act(fc1(x)) ** 2)``: squared ReLU (``rectify``) or a square of the layer's output."""

    def __init__(self, rectify: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.rectify = nn.Linear(5, 7), nn.Linear(7, 3), rectify

    def forward(self, x):
        hidden = self.fc1(x)
        return self.fc2((F.relu(hidden) if self.rectify else hidden) ** 2)


@pytest.mark.parametrize("epsilon", [0.0, 0.25])
@pytest.mark.parametrize("rectify", [True, False], ids=["squared relu", "square"])
def test_squared_activation_between_layers_matches_composed_reference(rectify: bool, epsilon: float) -> None:
    """The epsilon rule of each layer and the identity rule of the square, composed by hand. Without
    a ReLU, fc2 recomputes the square of fc1's kept output in backward instead of keeping it."""
    torch.manual_seed(4)
    model = SquaredMlp(rectify).double().eval()
    x = torch.randn(6, 5, dtype=torch.float64)
    relevance = torch.randn(6, 3, dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(model, Epsilon(epsilon)), [x], relevance)
    with torch.no_grad():
        hidden = model.fc1(x)
        activated = (hidden.clamp(min=0) if rectify else hidden) ** 2
    (relevance_activated,) = epsilon_reference(model.fc2, [activated], relevance, epsilon)
    relevance_hidden = relevance_activated * (hidden > 0) if rectify else relevance_activated
    (expected,) = epsilon_reference(model.fc1, [x], relevance_hidden, epsilon)
    assert relative_error(actual, expected) < TOLERANCE


@pytest.mark.parametrize(
    ("spelling", "shapes"),
    [(lambda m, x: 2.0 ** x, ((3, 4),)), (lambda m, x, y: x ** y, ((3, 4), (3, 4))),
     (lambda m, x: torch.pow(x, x), ((3, 4),)), (lambda m, x: torch.pow(m.base, x), ((3, 4),))],
    ids=["scalar base", "tensor exponent", "torch.pow of itself", "parameter base"],
)
def test_power_with_relevant_exponent_is_an_error(spelling, shapes) -> None:
    model = Op(spelling, parameters={"base": torch.full((4,), 1.5, dtype=torch.float64)})
    inputs = [torch.rand(shape, dtype=torch.float64) + 0.5 for shape in shapes]
    explain = fxlrp.convert(model)
    with pytest.raises(fxlrp.UnsupportedOperationError, match="exponent depends on the input"):
        explain(*[value.requires_grad_() for value in inputs])
    # strict=False: the power runs natively and relevance follows its gradient, R_in = J^T R
    relevance = torch.randn(shapes[0], dtype=torch.float64)
    actual = explained_relevance(fxlrp.convert(model, strict=False), inputs, relevance)
    for actual_input, expected_input in zip(actual, routed_reference(model, inputs, relevance), strict=True):
        assert relative_error(actual_input, expected_input) < TOLERANCE


class DegreeNormalised(nn.Module):
    """A GCN layer: messages scaled by ``deg^-1/2`` of both ends, the degree computed from indices."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x, senders, receivers):
        degree = x.new_zeros(x.shape[0]).index_add(0, receivers, torch.ones_like(receivers, dtype=x.dtype))
        scale = degree.clamp(min=1).pow(-0.5)
        messages = self.linear(x)[senders] * (scale[senders] * scale[receivers]).unsqueeze(-1)
        return x.new_zeros((x.shape[0], 2)).index_add(0, receivers, messages)


def test_power_of_relevance_free_values_runs_natively() -> None:
    """``deg.pow(-0.5)`` sees no relevance: the power runs as the plain operation (no relevance
    Function), and LRP-0 of the layer equals gradient x input."""
    degree = torch.tensor([1.0, 4.0, 2.0], dtype=torch.float64)
    natively = power(RelevanceCall(None), torch.pow, degree, -0.5)
    assert natively.grad_fn is None and torch.equal(natively, degree.pow(-0.5))

    torch.manual_seed(5)
    model = DegreeNormalised().double()
    x = torch.randn(5, 3, dtype=torch.float64)
    senders, receivers = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 2])
    explain = fxlrp.convert(model, Epsilon(0.0))
    relevance, _, _ = fxlrp.attribute(explain, (x, senders, receivers), target=1)
    leaf = x.clone().requires_grad_()
    model(leaf, senders, receivers)[:, 1].sum().backward()
    assert relative_error(relevance, leaf.grad * x) < TOLERANCE


# --- addcmul: the composite's layer rules


def test_addcmul_gets_the_composites_layer_rule() -> None:
    """z+ on ``z = b + w x``: ``R = (x+ w+ + x- w-) / (b+ + x+ w+ + x- w- + eps) R`` (zennit's z+)."""
    generator = torch.Generator().manual_seed(8)
    model = Op(lambda m, x: torch.addcmul(m.beta, m.alpha, x),
               parameters={"alpha": randn(1, 1, 4)(generator), "beta": randn(1, 1, 4)(generator)})
    x = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    relevance = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    explain = fxlrp.convert(model, Composite(ZPlus()))
    rows = {row.operation: row for row in explain.report().rows}
    assert rows["addcmul"].handling == "rule" and rows["addcmul"].rule.startswith("ZPlus")
    (actual,) = explained_relevance(explain, [x], relevance)
    alpha, beta = model.alpha.detach(), model.beta.detach()
    positive = x.clamp(min=0) * alpha.clamp(min=0) + x.clamp(max=0) * alpha.clamp(max=0)
    denominator = beta.clamp(min=0) + positive
    expected = positive / (denominator + 1e-6 * (denominator.sign() + (denominator == 0).double())) * relevance
    assert relative_error(actual, expected) < TOLERANCE


@pytest.mark.parametrize(("function", "shapes"), [
    (torch.addcmul, ((3,), (3,), (3,))), (torch.baddbmm, ((2, 3, 5), (2, 3, 4), (2, 4, 5)))])
def test_a_sum_and_product_of_three_relevant_tensors_is_an_error(function, shapes) -> None:
    model = Op(lambda m, x, y, z: function(x, y, z))
    explain = fxlrp.convert(model)
    inputs = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for shape in shapes]
    with pytest.raises(fxlrp.UnsupportedOperationError, match=f"torch.{function.__name__} .* a sum and a product"):
        explain(*inputs)


# --- statistics held constant


def held_reference(function: Callable[[Tensor, Held], Tensor], x: Tensor, relevance: Tensor) -> Tensor:
    """LRP-0 of ``function`` with every statistic (and gate) detached: a linear map of ``x``."""
    (expected,) = epsilon_reference(lambda value: function(value, _detach), [x], relevance, 0.0)
    return expected


def _var_mean_layer_norm(x: Tensor, held: Held) -> Tensor:
    variance, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    return (x - mean) * torch.rsqrt(held(variance) + 1e-5)


def _std_mean_standardise(x: Tensor, held: Held) -> Tensor:
    deviation, mean = torch.std_mean(x, dim=1, keepdim=True)
    return (x - mean) / held(deviation)


STATISTICS: list[tuple[str, Callable[[Tensor, Held], Tensor], tuple[int, ...]]] = [
    ("norm method", lambda x, held: x * held(x.norm(p=2, dim=1, keepdim=True)), (2, 3, 4)),
    ("torch.norm", lambda x, held: x / held(torch.norm(x, dim=(1, 2), keepdim=True)), (2, 3, 4)),
    ("torch.norm frobenius", lambda x, held: x * held(torch.norm(x, p="fro")), (3, 4)),
    ("linalg.vector_norm", lambda x, held: x * held(torch.linalg.vector_norm(x, ord=3, dim=-1, keepdim=True)),
     (2, 3, 4)),
    ("linalg.norm", lambda x, held: x * held(torch.linalg.norm(x, dim=-1, keepdim=True)), (3, 4)),
    ("linalg.matrix_norm", lambda x, held: x * held(torch.linalg.matrix_norm(x, keepdim=True)), (2, 3, 4)),
    ("norm as a bias", lambda x, held: x + held(x.norm(dim=-1, keepdim=True)), (3, 4)),
    ("var method", lambda x, held: x / held(x.var(dim=1, keepdim=True)), (3, 4)),
    ("torch.var", lambda x, held: x * held(torch.var(x, 1, correction=0, keepdim=True)), (2, 3, 4)),
    ("std method", lambda x, held: x / held(x.std(-1, keepdim=True)), (3, 4)),
    ("torch.std all", lambda x, held: x * held(torch.std(x)), (3, 4)),
    ("torch.sqrt", lambda x, held: x / held(torch.sqrt(x.pow(2).sum(-1, keepdim=True))), (3, 4)),
    ("sqrt method", lambda x, held: x * held((x * x).sum().sqrt()), (3, 4)),
    ("rms norm by hand", lambda x, held: x * held(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)), (3, 4)),
    ("rsqrt method", lambda x, held: x * held((x * x).mean(-1, keepdim=True).rsqrt()), (3, 4)),
    ("layer norm by hand", lambda x, held: (x - x.mean(-1, keepdim=True))
     / held(torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)), (3, 5)),
    ("torch.var_mean", _var_mean_layer_norm, (3, 5)),
    ("torch.std_mean", _std_mean_standardise, (2, 4, 3)),
]


@pytest.mark.parametrize(("function", "shape"), [(function, shape) for _, function, shape in STATISTICS],
                         ids=[name for name, _, _ in STATISTICS])
def test_statistic_is_held_constant(function: Callable[[Tensor, Held], Tensor], shape: tuple[int, ...]) -> None:
    """The product or quotient that uses a statistic passes relevance through ``x`` only: LRP-0
    equals that of the model with the statistic detached (a product ``x * n(x)`` of two
    relevance-carrying factors would otherwise split its relevance)."""
    generator = torch.Generator().manual_seed(9)
    model = Op(lambda m, x: function(x, _keep)).double()
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    relevance = torch.randn(model(x).shape, generator=generator, dtype=torch.float64)
    (actual,) = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, held_reference(function, x, relevance)) < TOLERANCE


def test_statistic_output_carries_no_relevance() -> None:
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    norm = fxlrp.convert(Op(lambda m, x: x.norm(dim=-1)))(x)
    variance, mean = fxlrp.convert(Op(lambda m, x: torch.var_mean(x, -1)))(x)
    assert not norm.requires_grad and not variance.requires_grad and mean.requires_grad
    assert torch.equal(norm, x.detach().norm(dim=-1))


@pytest.mark.parametrize(
    ("by_hand", "native", "shape"),
    [
        (lambda m, x: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
         * m.weight, lambda m, x: F.layer_norm(x, (5,), m.weight, eps=1e-5), (4, 5)),
        (lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * m.weight,
         lambda m, x: F.rms_norm(x, (5,), m.weight, eps=1e-5), (4, 5)),
    ],
    ids=["layer norm", "rms norm"],
)
def test_normalisation_by_hand_is_explained_as_the_native_one(by_hand, native, shape) -> None:
    """Held constant, a hand-written LayerNorm or RMSNorm (timm's fallbacks) gets, under LRP-0,
    the relevance of ``F.layer_norm`` / ``F.rms_norm`` (whose sigma fxlrp holds constant)."""
    generator = torch.Generator().manual_seed(10)
    parameters = {"weight": torch.rand(5, generator=generator, dtype=torch.float64) + 0.5}
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    relevance = torch.randn(shape, generator=generator, dtype=torch.float64)
    (written,) = explained_relevance(fxlrp.convert(Op(by_hand, parameters), Epsilon(0.0)), [x], relevance)
    (fused,) = explained_relevance(fxlrp.convert(Op(native, parameters), Epsilon(0.0)), [x], relevance)
    assert relative_error(written, fused) < TOLERANCE


class GlobalResponseNorm(nn.Module):
    """ConvNeXt V2's GRN as timm writes it (channels last), the statistic passed through ``held``."""

    def __init__(self, channels: int, held: Held = _keep) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels, dtype=torch.float64))
        self.bias = nn.Parameter(torch.randn(channels, dtype=torch.float64))
        self.held = held

    def forward(self, x):
        x_g = self.held(x.norm(p=2, dim=(1, 2), keepdim=True))
        x_n = x_g / (x_g.mean(dim=-1, keepdim=True) + 1e-6)
        return x + torch.addcmul(self.bias.view(1, 1, 1, -1), self.weight.view(1, 1, 1, -1), x * x_n)


class PaperGlobalResponseNorm(GlobalResponseNorm):
    """GRN as the ConvNeXt V2 paper writes it: ``gamma * (x * Nx) + beta + x``."""

    def forward(self, x):
        g_x = self.held(torch.norm(x, p=2, dim=(1, 2), keepdim=True))
        n_x = g_x / (g_x.mean(dim=-1, keepdim=True) + 1e-6)
        return self.weight * (x * n_x) + self.bias + x


def group_std(x: Tensor, groups: int, eps: float = 1e-5) -> Tensor:
    """timm's ``group_std``: each group's standard deviation, broadcast to ``x``."""
    b, c, h, w = x.shape
    x = x.reshape(b, groups, c // groups, h, w)
    std = x.float().var(dim=(2, 3, 4), unbiased=False, keepdim=True).add(eps).sqrt().to(x.dtype)
    return std.expand(x.shape).reshape(b, c, h, w)


class EvoNormS0(nn.Module):
    """timm's ``EvoNorm2dS0``: ``x * sigmoid(v x) / group_std(x) * weight + bias``; ``held`` is
    applied to the statistic and to the gate."""

    def __init__(self, channels: int, groups: int, held: Held = _keep) -> None:
        super().__init__()
        self.groups, self.held = groups, held
        self.v = nn.Parameter(torch.randn(channels, dtype=torch.float64))
        self.weight = nn.Parameter(torch.rand(channels, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn(channels, dtype=torch.float64))

    def forward(self, x):
        shape = (1, -1, 1, 1)
        gate = self.held((x * self.v.view(shape)).sigmoid())
        x = x * gate / self.held(group_std(x, self.groups))
        return x * self.weight.view(shape) + self.bias.view(shape)


BLOCKS = {
    "GRN": (lambda held: GlobalResponseNorm(6, held), (2, 3, 4, 6)),
    "GRN as in the paper": (lambda held: PaperGlobalResponseNorm(6, held), (2, 3, 4, 6)),
    "EvoNorm S0": (lambda held: EvoNormS0(6, 3, held), (2, 6, 3, 4)),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_normalisation_block_matches_reference_with_statistic_constant(name: str) -> None:
    torch.manual_seed(12)
    build, shape = BLOCKS[name]
    model = build(_keep).eval()
    x = torch.randn(shape, dtype=torch.float64)
    relevance = torch.randn(shape, dtype=torch.float64)
    explain = fxlrp.convert(model, Epsilon(0.0))
    with torch.no_grad():
        assert torch.equal(explain(x), model(x))
    (actual,) = explained_relevance(explain, [x], relevance)
    detached = build(_detach)
    detached.load_state_dict(model.state_dict())
    (expected,) = epsilon_reference(detached, [x], relevance, 0.0)
    assert relative_error(actual, expected) < TOLERANCE


@pytest.mark.parametrize("name", list(BLOCKS))
def test_normalisation_block_without_bias_conserves_relevance(name: str) -> None:
    torch.manual_seed(13)
    build, shape = BLOCKS[name]
    model = build(_keep).eval()
    with torch.no_grad():
        model.bias.zero_()
    x = torch.randn(shape, dtype=torch.float64)
    relevance = torch.randn(shape, dtype=torch.float64)
    (actual,) = explained_relevance(fxlrp.convert(model, Epsilon(0.0)), [x], relevance)
    assert abs(actual.sum().item() - relevance.sum().item()) < 1e-10 * relevance.abs().sum().item()


# --- timm's own modules, where timm is installed


def test_timm_modules_match_their_references() -> None:
    timm = pytest.importorskip("timm")
    from timm.layers.evo_norm import EvoNorm2dS0
    from timm.layers.grn import GlobalResponseNorm as TimmGlobalResponseNorm
    from timm.models.metaformer import StarReLU as TimmStarReLU
    from timm.models.mlp_mixer import Affine

    del timm
    torch.manual_seed(14)
    checks = []
    grn = TimmGlobalResponseNorm(6).double().eval()
    ours = GlobalResponseNorm(6, _detach)
    for module in (grn, ours):
        nn.init.normal_(module.weight)
        nn.init.normal_(module.bias)
    ours.load_state_dict(grn.state_dict())
    checks.append((grn, (2, 3, 4, 6), lambda x, relevance: epsilon_reference(ours, [x], relevance, 0.0)[0]))
    evo = EvoNorm2dS0(6, groups=3).double().eval()
    mine = EvoNormS0(6, 3, _detach)
    for parameter in evo.parameters():
        nn.init.uniform_(parameter, 0.5, 1.5)
    mine.load_state_dict(evo.state_dict())
    checks.append((evo, (2, 6, 3, 4), lambda x, relevance: epsilon_reference(mine, [x], relevance, 0.0)[0]))
    affine = Affine(4).double().eval()
    nn.init.normal_(affine.alpha)
    nn.init.normal_(affine.beta)
    checks.append((affine, (2, 3, 4), lambda x, relevance: epsilon_reference(affine, [x], relevance, 0.0)[0]))
    star = TimmStarReLU(scale_value=0.8, bias_value=-0.3).double().eval()
    checks.append((star, (4, 6), lambda x, relevance: star_relu_reference(x, star.scale.detach(),
                                                                          star.bias.detach(), relevance)))
    for module, shape, expected in checks:
        x = torch.randn(shape, dtype=torch.float64)
        relevance = torch.randn(shape, dtype=torch.float64)
        explain = fxlrp.convert(module, Epsilon(0.0))
        with torch.no_grad():
            assert torch.equal(explain(x), module(x))
        (actual,) = explained_relevance(explain, [x], relevance)
        assert relative_error(actual, expected(x, relevance)) < TOLERANCE, type(module).__name__


def test_operation_without_rule_into_a_statistic_needs_no_rule() -> None:
    """Relevance never comes back to what a statistic alone reads (held constant, the statistic
    passes none): here ``cosh``, which has no rule, and the ``pow`` and ``mean`` of an RMSNorm-like
    scale are accepted by strict conversion and run as the model runs them; relevance is LRP-0 of
    the function with the statistic detached."""
    function = lambda x, held: x * held(torch.rsqrt(torch.cosh(x).pow(2).mean(-1, keepdim=True)))  # noqa: E731
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(16), dtype=torch.float64)
    explain = fxlrp.convert(Op(lambda m, x: function(x, _keep)), Epsilon(0.0))
    handling = {row.target: row.handling for row in explain.report().rows}
    assert [handling[name] for name in ("torch.cosh", ".pow()", ".mean()")] == ["no relevance"] * 3
    relevance = torch.randn(3, 4, dtype=torch.float64)
    (actual,) = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, held_reference(function, x, relevance)) < TOLERANCE


def test_operation_without_rule_on_a_statistic_needs_no_rule() -> None:
    """A statistic's output carries no relevance, so what is computed from it alone (here
    ``log1p``, which has no rule) is accepted by strict conversion and runs natively."""
    function = lambda x, held: x / held(torch.log1p(x.norm(dim=-1, keepdim=True)))  # noqa: E731
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    explain = fxlrp.convert(Op(lambda m, x: function(x, _keep)), Epsilon(0.0))
    assert [row.handling for row in explain.report().rows if "log1p" in row.target] == ["no relevance"]
    relevance = torch.randn(3, 4, dtype=torch.float64)
    (actual,) = explained_relevance(explain, [x], relevance)
    assert relative_error(actual, held_reference(function, x, relevance)) < TOLERANCE
