"""Random models as a user would write them, for the property tests (``test_properties.py``).

:func:`examples` is a hypothesis strategy. Each example is a small :class:`RandomModel` whose
forward is a random DAG over a few tensors (features ``[N, F]``, sequences ``[B, C, L]``, images
``[B, C, H, W]``, tokens ``[B, T, E]``), an input for it, a target class and the flags saying which
properties apply. The forward interprets a list of steps fixed at construction, so it has no
data-dependent control flow and torch.fx can trace it. Every step is written the way a user
writes it, in one of several spellings (modules, functional calls, operators, Tensor methods,
in-place ops), and is listed as code in the example's ``repr``, which is what hypothesis prints
for a failing (shrunk) example.

The operations: convolutions (groups, stride, padding, dilation, bias on/off), linear layers
(module, ``F.linear``, ``@`` with the weight), eval BatchNorm with random running statistics,
ReLU / LeakyReLU / abs, piecewise-constant gates (``sign(h) * h``, ``floor(h).detach() + h``,
``round(h) * h``, ``(h > 0).to(h.dtype) * h``), max / average / adaptive pooling, residual add
and sub, cat, stack, reshape / permute / flatten, ``index_select`` and advanced indexing,
``gather``, sums and means over dimensions, torch_scatter's and native scatter reductions over
random indices (empty segments included), attention with softmax weights cast through dtypes,
and token ids through ``nn.Embedding`` / ``F.embedding``.

A :class:`Family` restricts what may be drawn, to what a property needs (bias-free for
conservation, ReLU networks on non-negative inputs for the sign of z+, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch_scatter
from hypothesis import strategies as st
from torch import Tensor, nn

DTYPE = torch.float64


@dataclass(frozen=True)
class Family:
    """What the generated models may contain."""

    bias: bool = True
    """Biases, BatchNorm shifts and constant summands (``floor(h).detach() + h``); without them
    the relevance of the bias-free rules is conserved."""
    smooth: bool = False
    """Maps that are not piecewise linear (GELU, tanh, SiLU, sigmoid gates)."""
    attention: bool = True
    """Softmax attention (its weights times values), explained by CP-LRP."""
    rectified: bool = False
    """Every weighted layer (with its BatchNorm) is followed by a ReLU and used by nothing else."""
    nonnegative: bool = False
    """A non-negative input and only maps that keep every tensor non-negative (implies
    ``rectified``; no subtraction, LeakyReLU, smooth maps or attention): every parameterless sum
    (add, mean, pooling, scatter) adds non-negative tensors."""
    tokens: bool = True
    """Token ids looked up in an embedding as the input (some of the time)."""
    max_steps: int = 6


@dataclass(frozen=True)
class WeightedCall:
    """One call of a weighted layer as the explainer sees it (BatchNorm folded into the layer
    before it): ``layer(input, weight)`` is its output without bias."""

    input: Tensor
    layer: Callable[[Tensor, Tensor], Tensor]
    weight: Tensor


@dataclass(frozen=True)
class Step:
    code: str
    """The step as a user writes it (``v3 = F.relu(v1)``), for the example's ``repr``."""
    run: Callable[[RandomModel, list[Tensor]], Tensor]


class RandomModel(nn.Module):
    """``values = [input]``; every step appends one tensor computed from earlier ones; the last
    is the output. Layers live in ``self.layers``, index tensors are buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        self.steps: list[Step] = []
        self.weighted_calls: list[WeightedCall] | None = None
        """Set to a list to record the weighted layers' inputs while the model runs eagerly."""

    def forward(self, x):
        values = [x]
        for step in self.steps:
            values.append(step.run(self, values))
        return values[-1]

    def record_weighted_calls(self, *inputs: Tensor) -> list[WeightedCall]:
        """Run the model eagerly and return its weighted layers' calls in execution order."""
        self.weighted_calls = []
        try:
            with torch.no_grad():
                self(*inputs)
            return self.weighted_calls
        finally:
            self.weighted_calls = None

    def program(self) -> str:
        return "\n".join(step.code for step in self.steps)

    def __repr__(self) -> str:
        layers = "\n".join(f"  m.layers[{name!r}] = {layer}" for name, layer in self.layers.items())
        buffers = "\n".join(f"  m.{name} = {value.tolist()}" for name, value in self.named_buffers()
                            if not name.startswith("layers."))
        program = "\n".join(f"  {line}" for line in self.program().splitlines())
        return f"RandomModel(\n{layers}\n{buffers}\n{program}\n)".replace("\n\n", "\n")


@dataclass
class Example:
    model: RandomModel
    inputs: tuple[Tensor, ...]
    target: int
    flags: frozenset[str]
    """``piecewise_linear`` (no smooth maps), ``attention``, ``bias_free``, ``batch_norm``,
    ``rectified``, ``nonnegative``, ``tokens``."""

    def __repr__(self) -> str:
        shapes = ", ".join(f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}" for value in self.inputs)
        return f"Example(inputs=[{shapes}], target={self.target}, flags={sorted(self.flags)},\n{self.model!r})"


@dataclass
class Value:
    """A tensor of the forward as the generator knows it."""

    index: int
    kind: str
    """``features`` [N, F], ``sequence`` [B, C, L], ``image`` [B, C, H, W], ``tokens`` [B, T, E], ``ids``."""
    example: Tensor
    nonnegative: bool
    fresh: bool
    """A tensor of its own (not a view or another value): may be changed in place if unused."""
    uses: int = 0
    usable: bool = True

    @property
    def name(self) -> str:
        return f"v{self.index}"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.example.shape)


@st.composite
def examples(draw: st.DrawFn, family: Family = Family()) -> Example:
    """A random model of ``family``, an input for it and a target class."""
    if family.nonnegative:
        family = replace(family, rectified=True, smooth=False, attention=False, tokens=False)
    seed = draw(st.integers(0, 2**16))
    builder = _Builder(draw, family, torch.Generator().manual_seed(seed))
    return builder.build()


class _Builder:
    def __init__(self, draw: st.DrawFn, family: Family, generator: torch.Generator) -> None:
        self.draw, self.family, self.generator = draw, family, generator
        self.model = RandomModel().to(DTYPE)
        self.values: list[Value] = []
        self.flags: set[str] = set()
        self.names = 0

    # -- drawing ------------------------------------------------------------------------------

    def choice(self, options: Sequence):
        return self.draw(st.sampled_from(list(options)))

    def integer(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, max(low, high)))

    def boolean(self) -> bool:
        return self.draw(st.booleans())

    def randn(self, *shape: int) -> Tensor:
        return torch.randn(shape, generator=self.generator, dtype=DTYPE)

    def index(self, length: int, high: int) -> Tensor:
        """``length`` random indices in ``[0, high)`` (repeats and missing values included)."""
        return torch.tensor([self.integer(0, high - 1) for _ in range(length)], dtype=torch.long)

    def new_name(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def layer(self, prefix: str, module: nn.Module) -> str:
        name = self.new_name(prefix)
        self.model.layers[name] = module.to(DTYPE).eval()
        return name

    def buffer(self, prefix: str, value: Tensor) -> str:
        name = self.new_name(prefix)
        self.model.register_buffer(name, value)
        return name

    # -- values -------------------------------------------------------------------------------

    def add(
        self, code: str, run: Callable[[RandomModel, list[Tensor]], Tensor], inputs: Sequence[Value], kind: str, *,
        fresh: bool = True, nonnegative: bool | None = None, in_place: Value | None = None,
    ) -> Value:
        """Append a step computing a new value from ``inputs`` (run at once on the example)."""
        index = len(self.values)
        self.model.steps.append(Step(code.replace("OUT", f"v{index}"), run))
        with torch.no_grad():
            example = run(self.model, [value.example for value in self.values])
        for value in inputs:
            value.uses += 1
        if in_place is not None:
            in_place.usable = False
        if nonnegative is None:
            nonnegative = all(value.nonnegative for value in inputs)
        value = Value(index, kind, example, nonnegative, fresh)
        self.values.append(value)
        return value

    def usable(self, kind: str | None = None) -> list[Value]:
        return [value for value in self.values if value.usable and value.kind != "ids"
                and (kind is None or value.kind == kind)]

    def may_change_in_place(self, value: Value) -> bool:
        return value.fresh and value.uses == 0 and value.usable

    def partner(self, value: Value, fits: Callable[[Value], bool]) -> Value | None:
        """Another usable value (or ``value`` itself) that fits."""
        candidates = [other for other in self.usable() if fits(other)]
        return self.choice(candidates) if candidates else None

    # -- the model ----------------------------------------------------------------------------

    def build(self) -> Example:
        value = self.input()
        steps = self.integer(2, self.family.max_steps)
        for _ in range(steps):
            usable = self.usable()
            # Mostly the latest value, sometimes an earlier one: a DAG, not a chain.
            source = usable[-1 - self.integer(0, min(2, len(usable) - 1))]
            value = self.step(source) or value
        value = self.head(self.usable()[-1])
        inputs = (self.values[0].example,)
        if not self.flags & {"smooth"}:
            self.flags.add("piecewise_linear")
        if self.family.rectified:
            self.flags.add("rectified")
        if self.family.nonnegative:
            self.flags.add("nonnegative")
        if not self.family.bias:
            self.flags.add("bias_free")
        target = self.integer(0, value.shape[-1] - 1)
        return Example(self.model, inputs, target, frozenset(self.flags))

    def input(self) -> Value:
        kinds = ["features", "sequence", "image"] + (["tokens"] if self.family.tokens else [])
        kind = self.choice(kinds)
        batch = self.integer(1, 3)
        if kind == "tokens":
            self.flags.add("tokens")
            vocabulary, length, width = self.integer(2, 9), self.integer(1, 5), self.integer(1, 6)
            ids = torch.tensor([[self.integer(0, vocabulary - 1) for _ in range(length)] for _ in range(batch)])
            self.values.append(Value(0, "ids", ids, False, False))
            if self.boolean():
                name = self.layer("embedding", nn.Embedding(vocabulary, width))
                return self.add(f"OUT = m.layers[{name!r}](v0)", lambda m, v: m.layers[name](v[0]),
                                [self.values[0]], "tokens", nonnegative=False)
            table = self.new_name("table")
            self.model.register_parameter(table, nn.Parameter(self.randn(vocabulary, width)))
            return self.add(f"OUT = F.embedding(v0, m.{table})", lambda m, v: F.embedding(v[0], getattr(m, table)),
                            [self.values[0]], "tokens", nonnegative=False)
        shape = {
            "features": (batch, self.integer(1, 8)),
            "sequence": (batch, self.integer(1, 5), self.integer(1, 8)),
            "image": (batch, self.integer(1, 3), self.integer(1, 6), self.integer(1, 6)),
        }[kind]
        x = torch.rand(shape, generator=self.generator, dtype=DTYPE) if self.family.nonnegative else self.randn(*shape)
        value = Value(0, kind, x, self.family.nonnegative, False)
        self.values.append(value)
        return value

    def step(self, value: Value) -> Value | None:
        operations: dict[str, Callable[[Value], Value | None]] = {
            "weighted": self.weighted,
            "activation": self.activation,
            "binary": self.binary,
            "cat": self.cat,
            "stack": self.stack,
            "reshape": self.reshape,
            "reduce": self.reduce,
            "index": self.select,
            "scatter": self.scatter,
        }
        if value.kind in ("sequence", "image"):
            operations["pool"] = self.pool
        if value.kind == "tokens" and self.family.attention:
            operations["attention"] = self.attention
        # Layers, activations and the operations of interest more often than shape changes.
        weights = {"weighted": 4, "activation": 2, "binary": 2, "scatter": 3, "pool": 2, "attention": 2, "index": 2}
        names = [name for name in sorted(operations) for _ in range(weights.get(name, 1))]
        return operations[self.choice(names)](value)

    def head(self, value: Value) -> Value:
        """Flatten to ``[N, F]`` and a final linear layer to a few classes."""
        if value.kind != "features":
            value = self.to_features(value)
        bias = self.family.bias and self.boolean()
        name = self.layer("head", nn.Linear(value.shape[-1], self.integer(1, 4), bias=bias))
        functional = self.boolean()
        i = value.index

        def run(m, v):
            x = v[i]
            if m.weighted_calls is not None:
                m.weighted_calls.append(WeightedCall(x, _linear_without_bias, m.layers[name].weight.detach()))
            if functional:
                return F.linear(x, m.layers[name].weight, m.layers[name].bias)
            return m.layers[name](x)

        if functional:
            code = f"OUT = F.linear({value.name}, m.layers[{name!r}].weight, m.layers[{name!r}].bias)"
        else:
            code = f"OUT = m.layers[{name!r}]({value.name})"
        return self.add(code, run, [value], "features", nonnegative=False)

    # -- weighted layers ----------------------------------------------------------------------

    def weighted(self, value: Value) -> Value | None:
        """Linear layer or convolution, then maybe BatchNorm, an activation and a residual."""
        bias = self.family.bias and self.boolean()
        i = value.index
        if value.kind in ("features", "tokens"):
            width = self.integer(1, 8)
            name = self.layer("linear", nn.Linear(value.shape[-1], width, bias=bias))
            # ``x @ W.T + b`` adds the bias to the signed pre-activation in a sum of its own (the
            # z-rule's), which a non-negative family must not have.
            spelling = self.choice(["module", "F.linear"] + ([] if self.family.nonnegative and bias else ["@"]))
            if spelling == "module":
                code, call = f"m.layers[{name!r}]({value.name})", lambda m, x: m.layers[name](x)
            elif spelling == "F.linear":
                code = f"F.linear({value.name}, m.layers[{name!r}].weight, m.layers[{name!r}].bias)"
                call = lambda m, x: F.linear(x, m.layers[name].weight, m.layers[name].bias)  # noqa: E731
            elif bias:
                code = f"{value.name} @ m.layers[{name!r}].weight.T + m.layers[{name!r}].bias"
                call = lambda m, x: x @ m.layers[name].weight.T + m.layers[name].bias  # noqa: E731
            else:
                code = f"torch.matmul({value.name}, m.layers[{name!r}].weight.t())"
                call = lambda m, x: torch.matmul(x, m.layers[name].weight.t())  # noqa: E731
            layer_without_bias = _linear_without_bias
            channels = width
        else:
            dimensions = 1 if value.kind == "sequence" else 2
            convolution = self.convolution(value, dimensions, bias)
            if convolution is None:
                return None
            name, module, layer_without_bias = convolution
            channels = module.out_channels
            spelling = self.choice(["module", "functional"])
            function = F.conv1d if dimensions == 1 else F.conv2d
            if spelling == "module":
                code, call = f"m.layers[{name!r}]({value.name})", lambda m, x: m.layers[name](x)
            else:
                code = (f"F.conv{dimensions}d({value.name}, m.layers[{name!r}].weight, m.layers[{name!r}].bias, "
                        f"{module.stride}, {module.padding}, {module.dilation}, {module.groups})")
                call = lambda m, x: function(  # noqa: E731
                    x, m.layers[name].weight, m.layers[name].bias, module.stride, module.padding, module.dilation,
                    module.groups)
        lines = [f"h = {code}"]

        # BatchNorm: folded into a module layer by fxlrp, a layer of its own after a functional one.
        norm = None
        if value.kind != "tokens" and self.draw(st.integers(0, 2)) == 0 and (self.family.bias or spelling == "module"):
            norm = self.layer("norm", self.batch_norm(channels, value.kind))
            lines.append(f"h = m.layers[{norm!r}](h)")
            self.flags.add("batch_norm")
        folded = norm is not None and spelling == "module"

        def record(m, x):
            weight = m.layers[name].weight.detach()
            if norm is None:
                return [WeightedCall(x, layer_without_bias, weight)]
            scale = _batch_norm_scale(m.layers[norm])
            if folded:
                return [WeightedCall(x, layer_without_bias, weight * scale.view(-1, *[1] * (weight.dim() - 1)))]
            output = call(m, x)
            shape = (-1,) + (1,) * (output.dim() - 2)
            return [WeightedCall(x, layer_without_bias, weight),
                    WeightedCall(output, lambda y, s: y * s.view(shape), scale)]

        # A residual before the activation (ResNet) or after it (always in rectified families,
        # where the layer's output goes to its ReLU only).
        residual_first = not self.family.rectified and self.boolean()
        partner, residual = None, None
        if self.boolean():
            with torch.no_grad():
                shape = tuple(call(self.model, value.example).shape)
            partner = self.partner(value, lambda other: other.shape == shape
                                   and (other.nonnegative or not self.family.nonnegative))
        if partner is not None:
            residual = self.choice(["+=", ".add_", "+"])
            residual_line = {"+=": f"h += {partner.name}", ".add_": f"h.add_({partner.name})",
                             "+": f"h = h + {partner.name}"}[residual]
        if residual_first and partner is not None:
            lines.append(residual_line)
        activation, nonnegative = self.block_activation(lines)
        if not residual_first and partner is not None:
            lines.append(residual_line)
        lines = [f"OUT = {code}"] if len(lines) == 1 else [*lines, "OUT = h"]
        j = None if partner is None else partner.index

        def add_residual(h, v):
            if residual == "+=":
                h += v[j]
            elif residual == ".add_":
                h.add_(v[j])
            else:
                h = h + v[j]
            return h

        def run(m, v):
            x = v[i]
            h = call(m, x)
            if norm is not None:
                h = m.layers[norm](h)
            if m.weighted_calls is not None:
                m.weighted_calls.extend(record(m, x))
            if residual_first and j is not None:
                h = add_residual(h, v)
            h = activation(m, h)
            if not residual_first and j is not None:
                h = add_residual(h, v)
            return h

        inputs = [value] + ([partner] if partner is not None else [])
        if partner is not None:
            nonnegative = nonnegative and partner.nonnegative and not residual_first
        return self.add("; ".join(lines), run, inputs, value.kind, nonnegative=nonnegative)

    def convolution(self, value: Value, dimensions: int, bias: bool):
        channels = value.shape[1]
        sizes = value.shape[2:]
        groups = self.choice([g for g in range(1, channels + 1) if channels % g == 0])
        out_channels = groups * self.integer(1, max(1, 6 // groups))
        kernel = self.integer(1, 3)
        dilation = self.integer(1, 2)
        padding = self.integer(0, kernel // 2 + 1)
        stride = self.integer(1, 2)
        if any((size + 2 * padding - dilation * (kernel - 1) - 1) < 0 for size in sizes):
            kernel, dilation = 1, 1
        module_type = nn.Conv1d if dimensions == 1 else nn.Conv2d
        module = module_type(channels, out_channels, kernel, stride=stride, padding=padding, dilation=dilation,
                             groups=groups, bias=bias)
        name = self.layer("conv", module)
        function = F.conv1d if dimensions == 1 else F.conv2d
        settings = dict(stride=module.stride, padding=module.padding, dilation=module.dilation, groups=groups)

        def without_bias(x: Tensor, weight: Tensor) -> Tensor:
            return function(x, weight, None, **settings)

        return name, module, without_bias

    def batch_norm(self, channels: int, kind: str) -> nn.Module:
        affine = self.boolean()
        module = (nn.BatchNorm2d if kind == "image" else nn.BatchNorm1d)(channels, affine=affine).to(DTYPE)
        with torch.no_grad():
            if self.family.bias:
                module.running_mean.copy_(self.randn(channels) * 0.5)
            module.running_var.copy_(torch.rand(channels, generator=self.generator, dtype=DTYPE) * 1.5 + 0.5)
            if affine:
                signs = torch.where(torch.rand(channels, generator=self.generator) < 0.2, -1.0, 1.0).to(DTYPE)
                module.weight.copy_((torch.rand(channels, generator=self.generator, dtype=DTYPE) + 0.5) * signs)
                module.bias.copy_(self.randn(channels) * 0.5 if self.family.bias else torch.zeros(channels))
        return module.eval()

    # -- activations --------------------------------------------------------------------------

    def activation_spellings(self, *, block: bool = False) -> list[str]:
        """Spellings of ``h = activation(h)`` this family allows (``block``: after a weighted
        layer, always a ReLU in rectified families)."""
        spellings = list(RELU)
        if block and self.family.rectified:
            return spellings
        spellings += ABS + GATES
        if self.family.bias:
            spellings += CONSTANT_SUMMANDS
        if not self.family.nonnegative:
            spellings += LEAKY_RELU
        if self.family.smooth:
            spellings += SMOOTH
        return spellings

    def make_activation(self, spelling: str) -> tuple[Callable[[RandomModel, Tensor], Tensor], str]:
        """``(m, h) -> activation(h)`` and its statement on ``h``; module spellings get a module."""
        if spelling in SMOOTH:
            self.flags.add("smooth")
        if spelling.startswith("nn."):
            name = self.layer("activation", eval(spelling, {"nn": nn}))  # noqa: S307 - our own spellings
            return (lambda m, h: m.layers[name](h)), f"h = m.layers[{name!r}](h)  # {spelling}"
        if spelling == "h.relu_()":
            def relu_in_place(m, h):
                h.relu_()
                return h
            return relu_in_place, spelling
        function = eval(f"lambda h: {spelling}", {"torch": torch, "F": F, "nn": nn})  # noqa: S307
        return (lambda m, h: function(h)), f"h = {spelling}"

    def block_activation(self, lines: list[str]) -> tuple[Callable[[RandomModel, Tensor], Tensor], bool]:
        """The activation after a weighted layer, whose output is fresh (in place is fine)."""
        options = self.activation_spellings(block=True)
        spelling = self.choice(options if self.family.rectified else ["none", *options])
        if spelling == "none":
            return (lambda m, h: h), False
        function, statement = self.make_activation(spelling)
        lines.append(statement)
        return function, spelling in NONNEGATIVE_OUTPUTS

    def activation(self, value: Value) -> Value | None:
        spellings = self.activation_spellings()
        if not self.may_change_in_place(value):
            spellings = [spelling for spelling in spellings if spelling not in IN_PLACE]
        spelling = self.choice(spellings)
        function, statement = self.make_activation(spelling)
        statement = re.sub(r"\bh\b", value.name, statement)
        if statement.startswith(f"{value.name} = "):
            code = "OUT = " + statement.removeprefix(f"{value.name} = ")
        else:
            code = f"{statement}; OUT = {value.name}"
        nonnegative = spelling in NONNEGATIVE_OUTPUTS or (value.nonnegative and spelling in CONSTANT_SUMMANDS)
        i = value.index
        return self.add(code, lambda m, v: function(m, v[i]), [value], value.kind, nonnegative=nonnegative,
                        in_place=value if spelling in IN_PLACE else None)

    # -- sums, products, shapes ---------------------------------------------------------------

    def binary(self, value: Value) -> Value | None:
        operations = ["+", "torch.add", ".add", "broadcast +"]
        if not self.family.nonnegative:
            operations += ["-", "torch.sub"]
        if self.may_change_in_place(value):
            operations += ["+=", ".add_"] + ([] if self.family.nonnegative else ["-="])
        operation = self.choice(operations)
        i = value.index
        if operation == "broadcast +":
            dimension = self.integer(0, len(value.shape) - 1)
            mean = self.boolean()
            reduce = "mean" if mean else "sum"
            return self.add(f"OUT = {value.name} + {value.name}.{reduce}({dimension}, keepdim=True)",
                            lambda m, v: v[i] + (v[i].mean(dimension, keepdim=True) if mean
                                                 else v[i].sum(dimension, keepdim=True)),
                            [value], value.kind)
        subtracts = operation in ("-", "torch.sub", "-=")
        # x - x is 0 (its relevance is dropped): subtract another value.
        partner = self.partner(value, lambda other: other.shape == value.shape and not (subtracts and other is value))
        if partner is None:
            return None
        j = partner.index
        a, b = value.name, partner.name
        functions = {
            "+": (f"OUT = {a} + {b}", lambda m, v: v[i] + v[j]),
            "torch.add": (f"OUT = torch.add({a}, {b})", lambda m, v: torch.add(v[i], v[j])),
            ".add": (f"OUT = {a}.add({b})", lambda m, v: v[i].add(v[j])),
            "-": (f"OUT = {a} - {b}", lambda m, v: v[i] - v[j]),
            "torch.sub": (f"OUT = torch.sub({a}, {b})", lambda m, v: torch.sub(v[i], v[j])),
            "+=": (f"{a} += {b}; OUT = {a}", lambda m, v: _iadd(v[i], v[j])),
            "-=": (f"{a} -= {b}; OUT = {a}", lambda m, v: _isub(v[i], v[j])),
            ".add_": (f"OUT = {a}.add_({b})", lambda m, v: v[i].add_(v[j])),
        }
        code, run = functions[operation]
        in_place = operation in ("+=", "-=", ".add_")
        nonnegative = value.nonnegative and partner.nonnegative and not subtracts
        return self.add(code, run, [value, partner], value.kind, nonnegative=nonnegative,
                        in_place=value if in_place else None)

    def cat(self, value: Value) -> Value | None:
        dimension = self.integer(1, len(value.shape) - 1)
        partner = self.partner(value, lambda other: other.kind == value.kind and all(
            size == other_size for d, (size, other_size) in enumerate(zip(value.shape, other.shape, strict=True))
            if d != dimension))
        if partner is None:
            return None
        i, j = value.index, partner.index
        spelling = self.choice(["torch.cat", "torch.concat", "torch.cat(-)"])
        if spelling == "torch.cat(-)":
            negative = dimension - len(value.shape)
            return self.add(f"OUT = torch.cat(({value.name}, {partner.name}), {negative})",
                            lambda m, v: torch.cat((v[i], v[j]), negative), [value, partner], value.kind)
        function = torch.cat if spelling == "torch.cat" else torch.concat
        return self.add(f"OUT = {spelling}([{value.name}, {partner.name}], dim={dimension})",
                        lambda m, v: function([v[i], v[j]], dim=dimension), [value, partner], value.kind)

    def stack(self, value: Value) -> Value | None:
        if value.kind not in ("features", "sequence"):
            return None
        partner = self.partner(value, lambda other: other.shape == value.shape)
        i, j = value.index, partner.index
        kind = "sequence" if value.kind == "features" else "image"
        return self.add(f"OUT = torch.stack([{value.name}, {partner.name}], dim=1)",
                        lambda m, v: torch.stack([v[i], v[j]], dim=1), [value, partner], kind)

    def reshape(self, value: Value) -> Value | None:
        i = value.index
        contiguous = value.example.is_contiguous()
        if value.kind == "features":
            width = value.shape[1]
            channels = self.choice([c for c in range(1, width + 1) if width % c == 0])
            length = width // channels
            spellings = {
                "reshape": (f"OUT = {value.name}.reshape({value.name}.shape[0], {channels}, {length})",
                            lambda m, v: v[i].reshape(v[i].shape[0], channels, length)),
                "unflatten": (f"OUT = {value.name}.unflatten(1, ({channels}, {length}))",
                              lambda m, v: v[i].unflatten(1, (channels, length))),
            }
            if contiguous:
                spellings["view"] = (f"OUT = {value.name}.view(-1, {channels}, {length})",
                                     lambda m, v: v[i].view(-1, channels, length))
            kind = "sequence"
        elif value.kind in ("sequence", "tokens"):
            target = self.choice(["features", "transpose", "image"])
            if target == "features":
                return self.to_features(value)
            if target == "image":
                spellings = {
                    "unsqueeze": (f"OUT = {value.name}.unsqueeze(-1)", lambda m, v: v[i].unsqueeze(-1)),
                    "None": (f"OUT = {value.name}[:, :, None]", lambda m, v: v[i][:, :, None]),
                }
                kind = "image"
            else:
                spellings = {
                    "permute": (f"OUT = {value.name}.permute(0, 2, 1)", lambda m, v: v[i].permute(0, 2, 1)),
                    "transpose": (f"OUT = {value.name}.transpose(1, 2)", lambda m, v: v[i].transpose(1, 2)),
                    "transpose.contiguous": (f"OUT = {value.name}.transpose(-1, -2).contiguous()",
                                             lambda m, v: v[i].transpose(-1, -2).contiguous()),
                }
                kind = "tokens" if value.kind == "sequence" else "sequence"
        else:  # image
            if self.boolean():
                return self.to_features(value)
            spellings = {
                "flatten": (f"OUT = {value.name}.flatten(2)", lambda m, v: v[i].flatten(2)),
                "reshape": (f"OUT = {value.name}.reshape({value.shape[0]}, {value.shape[1]}, -1)",
                            lambda m, v, b=value.shape[0], c=value.shape[1]: v[i].reshape(b, c, -1)),
            }
            kind = "sequence"
        code, run = spellings[self.choice(sorted(spellings))]
        return self.add(code, run, [value], kind, fresh=False)

    def to_features(self, value: Value) -> Value:
        i = value.index
        spellings = {
            "flatten": (f"OUT = {value.name}.flatten(1)", lambda m, v: v[i].flatten(1)),
            "torch.flatten": (f"OUT = torch.flatten({value.name}, 1)", lambda m, v: torch.flatten(v[i], 1)),
            "reshape": (f"OUT = {value.name}.reshape({value.name}.shape[0], -1)",
                        lambda m, v: v[i].reshape(v[i].shape[0], -1)),
        }
        if value.example.is_contiguous():
            spellings["view"] = (f"OUT = {value.name}.view({value.name}.size(0), -1)",
                                 lambda m, v: v[i].view(v[i].size(0), -1))
        code, run = spellings[self.choice(sorted(spellings))]
        return self.add(code, run, [value], "features", fresh=False)

    def reduce(self, value: Value) -> Value | None:
        """Sum or mean over dimensions (to fewer dimensions, or keeping them)."""
        i = value.index
        mean = self.boolean()
        name = "mean" if mean else "sum"
        function = torch.mean if mean else torch.sum
        if value.kind in ("sequence", "tokens"):
            dimension = 2 if value.kind == "sequence" else 1
            if self.boolean():
                return self.add(f"OUT = {value.name}.{name}({dimension})",
                                lambda m, v: getattr(v[i], name)(dimension), [value], "features")
            return self.add(f"OUT = torch.{name}({value.name}, dim={dimension})",
                            lambda m, v: function(v[i], dim=dimension), [value], "features")
        if value.kind == "image":
            return self.add(f"OUT = {value.name}.{name}((2, 3))", lambda m, v: getattr(v[i], name)((2, 3)),
                            [value], "features")
        dimension = self.integer(0, 1)
        return self.add(f"OUT = {value.name}.{name}({dimension}, keepdim=True)",
                        lambda m, v: getattr(v[i], name)(dimension, keepdim=True), [value], "features")

    # -- indexing and scatter -----------------------------------------------------------------

    def select(self, value: Value) -> Value | None:
        """Rows or columns by an index tensor (repeats and omissions): index_select, advanced
        indexing, gather."""
        i = value.index
        dimension = self.integer(0, len(value.shape) - 1)
        size = value.shape[dimension]
        index = self.buffer("index", self.index(self.integer(1, 6), size))
        spelling = self.choice(["torch.index_select", ".index_select", "[]", "gather"])
        if spelling == "gather":
            columns = self.integer(1, 6)
            shape = list(value.shape)
            shape[dimension] = columns
            gathered = torch.stack([self.index(columns, size) for _ in range(math.prod(shape) // columns)])
            rows = [s for d, s in enumerate(shape) if d != dimension]
            gathered = gathered.reshape(*rows, columns).movedim(-1, dimension).contiguous()
            setattr(self.model, index, gathered)
            return self.add(f"OUT = torch.gather({value.name}, {dimension}, m.{index})",
                            lambda m, v: torch.gather(v[i], dimension, getattr(m, index)), [value], value.kind)
        if spelling == "torch.index_select":
            return self.add(f"OUT = torch.index_select({value.name}, {dimension}, m.{index})",
                            lambda m, v: torch.index_select(v[i], dimension, getattr(m, index)), [value], value.kind)
        if spelling == ".index_select":
            return self.add(f"OUT = {value.name}.index_select({dimension}, m.{index})",
                            lambda m, v: v[i].index_select(dimension, getattr(m, index)), [value], value.kind)
        prefix = (slice(None),) * dimension
        text = ":, " * dimension
        return self.add(f"OUT = {value.name}[{text}m.{index}]", lambda m, v: v[i][(*prefix, getattr(m, index))],
                        [value], value.kind)

    def scatter(self, value: Value) -> Value | None:
        """Slices along the first (rows, as a graph network's messages) or last dimension
        reduced into segments by a random index: torch_scatter's and native spellings; segments
        may be empty."""
        i = value.index
        along_rows = self.integer(0, 3) > 0
        dimension = 0 if along_rows else len(value.shape) - 1
        segments = self.integer(1, 6)
        index = self.buffer("index", self.index(value.shape[dimension], segments))
        spellings = ["torch_scatter.scatter_add", "torch_scatter.scatter_mean", "torch_scatter.scatter_max",
                     "torch_scatter.scatter"]
        if along_rows:
            spellings += ["scatter_add_", "torch.zeros().scatter_add", "torch.scatter_add", "scatter_reduce",
                          "index_add"]
        spelling = self.choice(spellings)
        a, kind = value.name, value.kind
        if spelling == "torch_scatter.scatter":
            reduce = self.choice(["sum", "mean", "max"])
            return self.add(
                f"OUT = torch_scatter.scatter({a}, m.{index}, {dimension}, dim_size={segments}, reduce={reduce!r})",
                lambda m, v: torch_scatter.scatter(v[i], getattr(m, index), dimension, dim_size=segments,
                                                   reduce=reduce), [value], kind)
        if spelling.startswith("torch_scatter."):
            function_name = spelling.removeprefix("torch_scatter.")
            maximum = function_name == "scatter_max"

            def run(m, v):
                # Looked up when called, as ``torch_scatter.scatter_add(...)`` in a forward is.
                function = getattr(torch_scatter, function_name)
                result = function(v[i], getattr(m, index), dim=dimension, dim_size=segments)
                return result[0] if maximum else result

            return self.add(f"OUT = torch_scatter.{function_name}({a}, m.{index}, dim={dimension}, "
                            f"dim_size={segments}){'[0]' if maximum else ''}", run, [value], kind)
        rest = value.shape[1:]
        ones = (1,) * len(rest)
        expanded = f"m.{index}.view(-1, {', '.join(map(str, ones))}).expand_as({a})"
        if len(rest) == 1:
            zeros = f"{a}.new_zeros({segments}, {a}.size(1))"
        else:
            zeros = f"{a}.new_zeros({segments}, {', '.join(map(str, rest))})"

        def spread(m, v):
            return getattr(m, index).view(-1, *ones).expand_as(v[i])

        def new_zeros(v):
            return v[i].new_zeros(segments, v[i].size(1)) if len(rest) == 1 else v[i].new_zeros(segments, *rest)

        if spelling == "scatter_add_":
            return self.add(f"OUT = {zeros}.scatter_add_(0, {expanded}, {a})",
                            lambda m, v: new_zeros(v).scatter_add_(0, spread(m, v), v[i]), [value], kind)
        if spelling == "torch.zeros().scatter_add":
            shape = ", ".join(map(str, (segments, *rest)))
            return self.add(f"OUT = torch.zeros({shape}, dtype={a}.dtype).scatter_add(0, {expanded}, {a})",
                            lambda m, v: torch.zeros(segments, *rest, dtype=v[i].dtype).scatter_add(
                                0, spread(m, v), v[i]), [value], kind)
        if spelling == "torch.scatter_add":
            return self.add(f"OUT = torch.scatter_add({zeros}, 0, {expanded}, {a})",
                            lambda m, v: torch.scatter_add(new_zeros(v), 0, spread(m, v), v[i]), [value], kind)
        if spelling == "index_add":
            return self.add(f"OUT = {zeros}.index_add(0, m.{index}, {a})",
                            lambda m, v: new_zeros(v).index_add(0, getattr(m, index), v[i]), [value], kind)
        reduce = self.choice(["sum", "mean", "amax"])
        include_self = self.boolean()
        return self.add(
            f"OUT = {zeros}.scatter_reduce(0, {expanded}, {a}, {reduce!r}, include_self={include_self})",
            lambda m, v: new_zeros(v).scatter_reduce(0, spread(m, v), v[i], reduce, include_self=include_self),
            [value], kind)

    # -- pooling ------------------------------------------------------------------------------

    def pool(self, value: Value) -> Value | None:
        i = value.index
        dimensions = 1 if value.kind == "sequence" else 2
        sizes = value.shape[2:]
        kind = self.choice(["max", "avg", "adaptive_avg", "adaptive_max"])
        if kind.startswith("adaptive"):
            output = tuple(self.integer(1, size) for size in sizes)
            arguments = (output[0] if dimensions == 1 else output,)
            keywords = {}
        else:
            kernel = self.integer(1, min(3, min(sizes)))
            arguments = (kernel, self.integer(1, 2), self.integer(0, kernel // 2))
            keywords = {"count_include_pad": self.boolean()} if kind == "avg" else {}
        function = getattr(F, f"{kind}_pool{dimensions}d")
        text = ", ".join([*map(repr, arguments), *(f"{key}={item!r}" for key, item in keywords.items())])
        if self.boolean():
            module_name = "".join(part.capitalize() for part in kind.split("_")) + f"Pool{dimensions}d"
            module = getattr(nn, module_name)(*arguments, **keywords)
            name = self.layer("pool", module)
            return self.add(f"OUT = m.layers[{name!r}]({value.name})  # nn.{module_name}({text})",
                            lambda m, v: m.layers[name](v[i]), [value], value.kind)
        return self.add(f"OUT = F.{function.__name__}({value.name}, {text})",
                        lambda m, v: function(v[i], *arguments, **keywords), [value], value.kind)

    # -- attention ----------------------------------------------------------------------------

    def attention(self, value: Value) -> Value | None:
        """One head: ``softmax(q k^T / sqrt(d)) v`` with the weights spelled as Hugging Face and
        others do (dtype casts, contiguous, views, dropout in eval)."""
        self.flags.add("attention")
        width = value.shape[-1]
        inner = self.integer(1, 6)
        bias = self.family.bias and self.boolean()
        q, k, v_ = (self.layer(prefix, nn.Linear(width, inner, bias=bias)) for prefix in ("query", "key", "value"))
        spellings = {
            "F.softmax(s, dim=-1, dtype=torch.float32).to(h.dtype)":
                lambda m, s, h: F.softmax(s, dim=-1, dtype=torch.float32).to(h.dtype),
            "torch.softmax(s, -1).contiguous()": lambda m, s, h: torch.softmax(s, -1).contiguous(),
            "s.softmax(-1).view(s.shape)": lambda m, s, h: s.softmax(-1).view(s.shape),
            "F.dropout(F.softmax(s, -1), 0.1, training=False)":
                lambda m, s, h: F.dropout(F.softmax(s, -1), 0.1, training=False),
            "F.softmax(s.float(), dim=-1).type_as(h)": lambda m, s, h: F.softmax(s.float(), dim=-1).type_as(h),
        }
        weights_spelling = self.choice([*sorted(spellings), "nn.Softmax(dim=-1)"])
        if weights_spelling == "nn.Softmax(dim=-1)":
            softmax = self.layer("softmax", nn.Softmax(dim=-1))
            weights_spelling = f"m.layers[{softmax!r}](s)"
            spellings[weights_spelling] = lambda m, s, h: m.layers[softmax](s)
        weights = spellings[weights_spelling]
        product = self.choice(["@", "torch.matmul", "torch.bmm"])
        i = value.index
        scale = 1 / math.sqrt(inner)

        def run(m, v):
            h = v[i]
            query, key, values = m.layers[q](h), m.layers[k](h), m.layers[v_](h)
            scores = torch.matmul(query, key.transpose(-2, -1)) * scale
            w = weights(m, scores, h)
            if product == "@":
                return w @ values
            if product == "torch.matmul":
                return torch.matmul(w, values)
            return torch.bmm(w, values)

        a = value.name
        output = {"@": "w @ v", "torch.matmul": "torch.matmul(w, v)", "torch.bmm": "torch.bmm(w, v)"}[product]
        code = (f"q, k, v = m.layers[{q!r}]({a}), m.layers[{k!r}]({a}), m.layers[{v_!r}]({a}); "
                f"s = torch.matmul(q, k.transpose(-2, -1)) * {scale:.4g}; "
                f"w = {weights_spelling.replace('h.dtype', f'{a}.dtype').replace('(h)', f'({a})')}; OUT = {output}")
        return self.add(code, run, [value], "tokens", nonnegative=False)


RELU = ["nn.ReLU()", "nn.ReLU(inplace=True)", "F.relu(h)", "torch.relu(h)", "h.relu()", "h.relu_()",
        "F.relu(h, inplace=True)"]
ABS = ["torch.abs(h)", "h.abs()", "abs(h)", "h.abs_()"]
GATES = ["torch.sign(h) * h", "h.sign() * h", "torch.round(h) * h", "(h > 0).to(h.dtype) * h"]
"""Products with piecewise-constant maps: gates, not factors carrying relevance."""
CONSTANT_SUMMANDS = ["torch.floor(h).detach() + h"]
"""A constant summand, which takes relevance like a bias."""
LEAKY_RELU = ["nn.LeakyReLU(0.1)", "F.leaky_relu(h, 0.2)"]
SMOOTH = ["F.gelu(h)", "torch.tanh(h)", "h * torch.sigmoid(h)", "F.silu(h)"]
IN_PLACE = ["nn.ReLU(inplace=True)", "h.relu_()", "F.relu(h, inplace=True)", "h.abs_()"]
NONNEGATIVE_OUTPUTS = RELU + ABS + GATES


def _iadd(a: Tensor, b: Tensor) -> Tensor:
    a += b
    return a


def _isub(a: Tensor, b: Tensor) -> Tensor:
    a -= b
    return a


def _linear_without_bias(x: Tensor, weight: Tensor) -> Tensor:
    return F.linear(x, weight)


def _batch_norm_scale(norm: nn.Module) -> Tensor:
    scale = torch.rsqrt(norm.running_var.detach() + norm.eps)
    return scale * norm.weight.detach() if norm.weight is not None else scale


