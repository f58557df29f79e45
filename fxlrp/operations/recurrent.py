r"""Recurrent layers: ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their cells, by Arras et al.'s rule.

The rule for gated recurrent networks (Arras et al. 2017, "Explaining Recurrent Neural Network
Predictions in Sentiment Analysis"; Arras et al. 2019, "Evaluating Recurrent Neural Network
Explanations"): gates are constants and the signal they multiply takes all of the product's
relevance ("signal-take-all"), linear maps take the composite's layer rule, sums the proportional
z-rule, ``tanh`` the identity rule. With ``s(z) = z + ε (sign(z) + [z = 0])`` the layer rule's
stabilised denominator (the epsilon rule by default; outputs with ``s(z) = 0`` drop their
relevance):

LSTM, gates ``i, f, o = σ(·)``, ``g = tanh(z_g)`` with ``z = W [x_t; h_{t-1}] + b_ih + b_hh``
(one linear map over the input and the previous state, as in Arras et al.)::

    c_t = f * c_{t-1} + i * g          R_{c_{t-1}} = f c_{t-1} / c_t · R_{c_t}
                                       R_g         = i g / c_t · R_{c_t}        (R_i = R_f = 0)
    h_t = o * tanh(c_t)                R_{c_t}    += R_{h_t}                     (R_o = 0)
    z_g = W_g [x_t; h_{t-1}] + b_g     R_{[x_t; h_{t-1}]} = [x_t; h_{t-1}] · W_g^T (R_g / s(z_g))
    (proj_size: h_t = W_hr (o * tanh(c_t)), the layer rule on W_hr)

GRU, gates ``r, u = σ(·)`` (``u`` is PyTorch's ``z_t``), ``a = W_in x_t + b_in``,
``b = W_hn h_{t-1} + b_hn``::

    h_t = (1 - u) * n + u * h_{t-1}    R_n = (1 - u) n / h_t · R_{h_t},  R_{h_{t-1}} += u h_{t-1} / h_t · R_{h_t}
    n = tanh(a + r * b)                R_a = a / (a + r b) · R_n,         R_b = r b / (a + r b) · R_n
    a, b                               the layer rule: R_{x_t} = x_t · W_in^T (R_a / s(a)),
                                       R_{h_{t-1}} += h_{t-1} · W_hn^T (R_b / s(b))

RNN: ``h_t = act(W [x_t; h_{t-1}] + b_ih + b_hh)``, the layer rule on the linear map; ``tanh``
passes relevance unchanged, ReLU routes it natively (where it is active), so that with
``nonlinearity="relu"`` LRP-0 equals gradient x input.

Relevance reaching ``h_t`` from the output and from the next step adds up. Multi-layer and
bidirectional layers, ``batch_first``, layers without bias, unbatched inputs, LSTM projections
and an initial state are supported; an initial state passed as an explained input gets its share,
otherwise (the default zeros, a constant) it absorbs it as a bias does. Relevance is conserved
(input relevance sums to output relevance) under LRP-0 for layers without bias from a zero
state; biases and the stabiliser absorb their share otherwise.

The outputs are the native kernel's (cuDNN or CPU), bit for bit; the decomposition above runs in
plain torch by the engine (:meth:`~fxlrp.relevance.call.RelevanceCall.decompose`) in backward
(:func:`~fxlrp.relevance.straight_through.decomposed_in_backward`), so the per-timestep
intermediates exist only while relevance crosses the layer, and every part gets the rule the
registry and the composite give it: the linear maps the layer rule (a ``name_rules`` or
``type_rules`` entry for the recurrent module reaches them; a first-layer rule, meant for pixels,
does not), the products the ``"mul"`` operation's :class:`~fxlrp.rules.Product` rule
(``operation_rules={"mul": Product(constants=())}`` gives Arras et al.'s "half" variant), the sums
the ``"add"`` rule (the z-rule unless the composite says otherwise). Dropout between layers is off:
explanations are of inference. Packed sequences are refused with an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import _VF, Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from fxlrp.errors import UnsupportedOperationError
from fxlrp.registry import Affine, Operation, Spelling, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.roles import GATE, mark
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.straight_through import decomposed_in_backward

SIGNAL = "signal"
"""Role of the signal in a gated product (``g`` in ``i * g``, ``tanh(c)`` in ``o * tanh(c)``): it is
never a constant by role, so that it takes the relevance whatever roles the composite's product
rule treats as constants (CP-LRP's smooth activations included)."""

Step = Callable[[Tensor, tuple[Tensor, ...]], tuple[Tensor, ...]]

LSTM, GRU, RNN_TANH, RNN_RELU = "LSTM", "GRU", "RNN_TANH", "RNN_RELU"
"""Modes, named as ``nn.RNNBase.mode`` names them."""

LAYER_KERNELS = {LSTM: _VF.lstm, GRU: _VF.gru, RNN_TANH: _VF.rnn_tanh, RNN_RELU: _VF.rnn_relu}
CELL_KERNELS = {LSTM: _VF.lstm_cell, GRU: _VF.gru_cell, RNN_TANH: _VF.rnn_tanh_cell, RNN_RELU: _VF.rnn_relu_cell}
_MODE_OF_KERNEL = {id(kernel): mode for kernels in (LAYER_KERNELS, CELL_KERNELS) for mode, kernel in kernels.items()}

PACKED_MESSAGE = (
    "fxlrp cannot explain {what} on a PackedSequence (pack_padded_sequence, pack_sequence): pass the "
    "padded tensor instead, e.g. explain sequences of one length (or one sequence at a time) without "
    "packing them, which gives the same outputs as the packed call."
)


def _signal(value: Tensor) -> Tensor:
    return mark(value, SIGNAL)


def _carrying(state: Tensor) -> Tensor:
    """An initial state enters the decomposition as a relevance-carrying tensor even when it is a
    constant, so that every gated product sees its signal as a factor (the gate stays a constant);
    the relevance such a state receives is absorbed, as a bias's is."""
    return state if carries_relevance(state) else state.detach().requires_grad_()


def _sum_of(first: Tensor | None, second: Tensor | None) -> Tensor | None:
    return None if first is None or second is None else first + second


Joined = tuple[Tensor, Tensor | None]
"""``([w_ih w_hh], b_ih + b_hh)``: the one linear map over ``[x_t; h_{t-1}]`` of an LSTM or Elman
step, whose joint denominator is Arras et al.'s."""


def joined(weights: Sequence[Tensor | None]) -> Joined:
    w_ih, w_hh, b_ih, b_hh = weights[:4]
    return torch.cat([w_ih, w_hh], dim=1), _sum_of(b_ih, b_hh)


def lstm_step(weights: Sequence[Tensor | None], projected: bool, joint_map: Joined) -> Step:
    """One LSTM step ``(x_t, (h, c)) -> (h_t, c_t)``; ``weights``: ``w_ih, w_hh, b_ih, b_hh[, w_hr]``,
    ``joint_map`` their :func:`joined` map."""
    w_hr = weights[4] if projected else None
    joint, bias = joint_map

    def step(x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        h, c = state
        gates = F.linear(torch.cat([x, h], dim=-1), joint, bias)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * _signal(c) + torch.sigmoid(i) * _signal(torch.tanh(g))
        h = torch.sigmoid(o) * _signal(torch.tanh(c))
        if w_hr is not None:
            h = F.linear(h, w_hr)
        return h, c

    return step


def gru_step(weights: Sequence[Tensor | None]) -> Step:
    """One GRU step ``(x_t, (h,)) -> (h_t,)``; ``weights``: ``w_ih, w_hh, b_ih, b_hh``."""
    w_ih, w_hh, b_ih, b_hh = weights[:4]

    def step(x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        (h,) = state
        input_reset, input_update, input_new = F.linear(x, w_ih, b_ih).chunk(3, dim=-1)
        hidden_reset, hidden_update, hidden_new = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
        reset = torch.sigmoid(input_reset + hidden_reset)
        update = torch.sigmoid(input_update + hidden_update)
        new = _signal(torch.tanh(input_new + reset * _signal(hidden_new)))
        return (mark(1 - update, GATE) * new + update * _signal(h),)

    return step


def rnn_step(joint_map: Joined, relu: bool) -> Step:
    """One Elman RNN step ``(x_t, (h,)) -> (act(W [x_t; h] + b),)`` with the :func:`joined` map."""
    joint, bias = joint_map
    activation = torch.relu if relu else torch.tanh

    def step(x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        (h,) = state
        return (activation(F.linear(torch.cat([x, h], dim=-1), joint, bias)),)

    return step


def _step(mode: str, weights: Sequence[Tensor | None], joint_map: Joined | None, projected: bool = False) -> Step:
    if mode == LSTM:
        return lstm_step(weights, projected, joint_map)
    if mode == GRU:
        return gru_step(weights)
    return rnn_step(joint_map, relu=mode == RNN_RELU)


def joined_maps(call: RelevanceCall, mode: str, groups: Sequence[Sequence[Tensor | None]],
                originals: Sequence[Any]) -> list[Joined | None]:
    """The :func:`joined` map of each group of weights (None for a GRU, which has none), made once
    per conversion: the cache is keyed by the module's own parameters ``originals``."""
    if mode == GRU:
        return [None] * len(groups)
    return call.cached(f"recurrent_joined_{len(groups)}", [tensor for tensor in originals if tensor is not None],
                       lambda: [joined(group) for group in groups])


def _projected(mode: str, states: Sequence[Tensor]) -> bool:
    """Whether an LSTM's hidden state is projected (``proj_size``): h and c differ in size."""
    return mode == LSTM and states[0].shape[-1] != states[1].shape[-1]


def _layer_weights(params: Sequence[Tensor], has_biases: bool, projected: bool) -> list[list[Tensor | None]]:
    """``params`` as ``nn.RNNBase._flat_weights`` orders them, per layer and direction:
    ``[w_ih, w_hh, b_ih, b_hh, w_hr]`` with ``None`` for the parts that are absent."""
    per_layer = 2 + 2 * has_biases + projected
    groups = []
    for start in range(0, len(params), per_layer):
        group = list(params[start:start + per_layer])
        w_ih, w_hh = group[:2]
        biases = group[2:4] if has_biases else [None, None]
        groups.append([w_ih, w_hh, *biases, group[-1] if projected else None])
    return groups


def decomposed_layers(
    mode: str, params: Sequence[Tensor], joint_maps: Sequence[Joined | None], has_biases: bool, num_layers: int,
    bidirectional: bool, batch_first: bool, input: Tensor, *states: Tensor,
) -> tuple[Tensor, ...]:
    """What ``_VF.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` compute (batched input, initial states
    ``[layers * directions, batch, hidden]``), step by step in plain torch: ``(output, *final states)``;
    ``joint_maps``: :func:`joined_maps` of the layers' weights."""
    directions = 2 if bidirectional else 1
    projected = _projected(mode, states)
    weights = _layer_weights(params, has_biases, projected)
    sequence = input.transpose(0, 1) if batch_first else input
    finals: list[tuple[Tensor, ...]] = []
    for layer in range(num_layers):
        steps = sequence.unbind(0)
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            step = _step(mode, weights[index], joint_maps[index], projected)
            state = tuple(_carrying(value[index]) for value in states)
            hidden: list[Tensor] = [state[0]] * len(steps)
            order = range(len(steps)) if direction == 0 else reversed(range(len(steps)))
            for time in order:
                state = step(steps[time], state)
                hidden[time] = state[0]
            outputs.append(torch.stack(hidden))
            finals.append(state)
        sequence = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
    output = sequence.transpose(0, 1) if batch_first else sequence
    return (output, *(torch.stack([final[position] for final in finals]) for position in range(len(states))))


def decomposed_cell(mode: str, weights: Sequence[Tensor | None], joint_map: Joined | None, input: Tensor,
                    *states: Tensor) -> Any:
    """What ``_VF.lstm_cell``/``gru_cell``/``rnn_*_cell`` compute (batched), in plain torch:
    ``(h, c)`` for an LSTM cell, ``h`` for the others."""
    result = _step(mode, [*weights, None], joint_map)(input, tuple(_carrying(state) for state in states))
    return result if mode == LSTM else result[0]


def _explained(call: RelevanceCall, exact: Callable[..., Any], decomposition: Callable[..., Any],
               input: Tensor, states: tuple[Tensor, ...]) -> Any:
    """``exact(input, *states)`` (the native kernel), with relevance through ``decomposition``
    run in backward under the relevance mode."""
    # The kernel runs as the model runs it on these inputs, in the caller's grad mode (with gradients
    # off the CPU kernel may take another path that rounds differently: an LSTM in float32 on AVX2,
    # 1 ulp); its outputs are detached, since it may be handed the model's own parameters.
    result = exact(input, *states)
    result = tuple(output.detach() for output in result) if isinstance(result, tuple) else result.detach()
    if not torch.is_grad_enabled() or not any(carries_relevance(value) for value in (input, *states)):
        return result
    return decomposed_in_backward(partial(_given, result), partial(_inner_call(call).decompose, decomposition),
                                  input, *states)


def _given(result: Any, *inputs: Tensor) -> Any:
    """The kernel's outputs, computed before (see :func:`_explained`)."""
    return result


def _inner_call(call: RelevanceCall) -> RelevanceCall:
    """The call whose composite chooses the rules inside: a first-layer rule (ZBox, Flat: for pixels)
    would reach only the first step's linear map, so inside a recurrent layer there is none."""
    site = call.site
    if site is None or not site.is_first_layer:
        return call
    return call.cached("recurrent_inner_call", (), lambda: RelevanceCall(
        call.rule, call.warn_lost_relevance, site=dataclasses.replace(site, is_first_layer=False),
        composite=call.composite, strict=call.strict))


def _layer_kernel(mode: str, params: Sequence[Tensor], has_biases: bool, num_layers: int, bidirectional: bool,
                  batch_first: bool, input: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
    """The native kernel at inference (no dropout between layers), outputs as one flat tuple."""
    hx: Any = states if mode == LSTM else states[0]
    return tuple(LAYER_KERNELS[mode](input, hx, params, has_biases, num_layers, 0.0, False, bidirectional,
                                     batch_first))


def _cell_kernel(mode: str, weights: Sequence[Tensor | None], input: Tensor, *states: Tensor) -> Any:
    hx: Any = states if mode == LSTM else states[0]
    return CELL_KERNELS[mode](input, hx, *weights)


def explained_layers(
    call: RelevanceCall, mode: str, params: Sequence[Tensor], has_biases: bool, num_layers: int,
    bidirectional: bool, batch_first: bool, input: Tensor, states: tuple[Tensor, ...],
) -> tuple[Tensor, ...]:
    """The kernel's outputs ``(output, *final states)`` from ``params`` as given (the module's own
    parameters: the CPU kernel's matrix products round differently for tensors that require
    gradients), relevance from :func:`decomposed_layers` on detached copies."""
    settings = (has_biases, num_layers, bidirectional, batch_first)
    detached = [param.detach() for param in params]
    joint_maps = joined_maps(call, mode, _layer_weights(detached, has_biases, _projected(mode, states)), params)
    return _explained(call, partial(_layer_kernel, mode, params, *settings),
                      partial(decomposed_layers, mode, detached, joint_maps, *settings), input, states)


def explained_cell(call: RelevanceCall, mode: str, weights: Sequence[Tensor | None], input: Tensor,
                   states: tuple[Tensor, ...]) -> Any:
    """The cell kernel's outputs from ``weights`` as given, relevance from :func:`decomposed_cell`."""
    detached = [None if weight is None else weight.detach() for weight in weights]
    [joint_map] = joined_maps(call, mode, [detached], weights)
    return _explained(call, partial(_cell_kernel, mode, weights), partial(decomposed_cell, mode, detached, joint_map),
                      input, states)


@dataclasses.dataclass(frozen=True, eq=False)
class RecurrentModule:
    """A recurrent module as the explainer calls it: its settings, and its own parameters for the
    native kernel (never given gradients: the kernel runs without autograd)."""

    module: nn.Module

    @property
    def mode(self) -> str:
        if isinstance(self.module, nn.RNNBase):
            return self.module.mode
        if isinstance(self.module, nn.LSTMCell):
            return LSTM
        if isinstance(self.module, nn.GRUCell):
            return GRU
        return RNN_RELU if self.module.nonlinearity == "relu" else RNN_TANH


def _states(hx: Any) -> tuple[Tensor, ...]:
    return () if hx is None else (hx,) if isinstance(hx, Tensor) else tuple(hx)


def _module_name(module: nn.Module) -> str:
    name = type(module).__name__
    return f"nn.{name}" if type(module).__module__.startswith("torch.nn.") else name


def _module_layers(call: RelevanceCall, layer: RecurrentModule, input: Any, hx: Any = None) -> Any:
    """``nn.LSTM``/``nn.GRU``/``nn.RNN``'s forward (its checks, unbatched inputs, default zero
    states, outputs nested as the module nests them) around :func:`explained_layers`."""
    module = layer.module
    if isinstance(input, PackedSequence):
        raise UnsupportedOperationError(PACKED_MESSAGE.format(what=_module_name(module)))
    if input.dim() not in (2, 3):
        raise ValueError(f"{_module_name(module)}: expected a 2-D or 3-D input, got {input.dim()}-D")
    mode, states = layer.mode, _states(hx)
    batched = input.dim() == 3
    if not batched:
        input = input.unsqueeze(0 if module.batch_first else 1)
        states = tuple(state.unsqueeze(1) for state in states)
    if not states:
        directions = 2 if module.bidirectional else 1
        batch = input.shape[0 if module.batch_first else 1]
        hidden = module.proj_size if mode == LSTM and module.proj_size > 0 else module.hidden_size
        sizes = (hidden, module.hidden_size) if mode == LSTM else (hidden,)
        states = tuple(torch.zeros(module.num_layers * directions, batch, size, dtype=input.dtype,
                                   device=input.device) for size in sizes)
    module.check_forward_args(input, states if mode == LSTM else states[0], None)  # the module's own messages
    params = [getattr(module, name) for name in module._flat_weights_names]
    output, *finals = explained_layers(call, mode, params, module.bias, module.num_layers, module.bidirectional,
                                       module.batch_first, input, states)
    if not batched:
        output = output.squeeze(0 if module.batch_first else 1)
        finals = [final.squeeze(1) for final in finals]
    return output, (tuple(finals) if mode == LSTM else finals[0])


def _module_cell(call: RelevanceCall, cell: RecurrentModule, input: Tensor, hx: Any = None) -> Any:
    """``nn.LSTMCell``/``nn.GRUCell``/``nn.RNNCell``'s forward around :func:`explained_cell`."""
    module, mode = cell.module, cell.mode
    states = _states(hx)
    if any(value.dim() not in (1, 2) for value in (input, *states)):
        raise ValueError(f"{_module_name(module)}: expected 1-D or 2-D inputs and states")
    batched = input.dim() == 2
    if not batched:
        input = input.unsqueeze(0)
        states = tuple(state.unsqueeze(0) for state in states)
    if not states:
        zeros = torch.zeros(input.shape[0], module.hidden_size, dtype=input.dtype, device=input.device)
        states = (zeros, zeros) if mode == LSTM else (zeros,)
    weights = [getattr(module, name) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    result = explained_cell(call, mode, weights, input, states)
    if not batched:
        return tuple(value.squeeze(0) for value in result) if mode == LSTM else result.squeeze(0)
    return tuple(result) if mode == LSTM else result


def _kernel_call(call: RelevanceCall, kernel: Any, *args: Any) -> Any:
    """``_VF.lstm(input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first)``
    and its relatives as ``nn.LSTM``'s forward calls them in code run eagerly; cells
    ``_VF.lstm_cell(input, hx, w_ih, w_hh, b_ih, b_hh)``."""
    mode = _MODE_OF_KERNEL[id(kernel)]
    if kernel is CELL_KERNELS[mode]:
        input, hx, *weights = args
        weights = [*weights, None, None][:4]
        result = explained_cell(call, mode, weights, input, _states(hx))
        return tuple(result) if mode == LSTM else result
    if len(args) > 3 and isinstance(args[3], (list, tuple)):  # (data, batch_sizes, hx, params, ...)
        raise UnsupportedOperationError(PACKED_MESSAGE.format(what=f"torch._VF.{kernel.__name__}"))
    input, hx, params, has_biases, num_layers, _dropout, _train, bidirectional, batch_first = args
    return explained_layers(call, mode, params, has_biases, num_layers, bidirectional, batch_first, input,
                            _states(hx))


def recurrent(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Any:
    """Relevance function of the recurrent modules and, in code run eagerly, of their kernels."""
    if isinstance(function, RecurrentModule):
        explain = _module_layers if isinstance(function.module, nn.RNNBase) else _module_cell
        return explain(call, function, *args, **kwargs)
    if kwargs:
        raise UnsupportedOperationError(
            f"fxlrp explains torch._VF.{function.__name__} called with positional arguments only, as "
            "torch.nn's recurrent modules call it; call the module instead."
        )
    return _kernel_call(call, function, *args)


def recurrent_module(module: nn.Module, parameters: dict[str, Any]) -> tuple[RecurrentModule, dict[str, Any]]:
    return RecurrentModule(module), {}


def _kernels(*modes: str) -> tuple[Any, ...]:
    return tuple(kernels[mode] for mode in modes for kernels in (LAYER_KERNELS, CELL_KERNELS))


register(
    Operation(
        "lstm",
        Spelling(functions=_kernels(LSTM), modules=(nn.LSTM, nn.LSTMCell), module_function=recurrent_module),
        Affine(recurrent, weighted=True),
        description="LSTM (Arras et al.): gates constant (the signal takes all), linear maps by the layer rule, "
        "c = f c + i g by the z-rule, tanh identity",
    )
)
register(
    Operation(
        "gru",
        Spelling(functions=_kernels(GRU), modules=(nn.GRU, nn.GRUCell), module_function=recurrent_module),
        Affine(recurrent, weighted=True),
        description="GRU (Arras et al.'s rule): gates constant (the signal takes all), linear maps by the layer "
        "rule, sums by the z-rule, tanh identity",
    )
)
register(
    Operation(
        "rnn",
        Spelling(
            functions=_kernels(RNN_TANH, RNN_RELU),
            modules=(nn.RNN, nn.RNNCell),
            module_function=recurrent_module,
        ),
        Affine(recurrent, weighted=True),
        description="Elman RNN: the linear map by the layer rule, tanh identity, ReLU native",
    )
)
