"""Hugging Face transformers: its activation modules are activations.

Several of transformers' activation modules compute a smooth elementwise activation from
elementary torch operations rather than one torch function: GPT-2's default ``gelu_new``
(``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``), ``gelu_fast``,
``gelu_accurate``, ``quick_gelu`` (``x * sigmoid(1.702 x)``), the Python forms of ``gelu``,
``gelu_python_tanh`` and ``mish``, ``sqrtsoftplus``, ``xielu``, ``laplace``, BLOOM's GeLU (an
autograd Function of ``gelu_new``'s formula), and ESM's and Evolla's ``gelu`` functions (the erf
formula). Run operation by operation, such a formula is a
product of two relevance-carrying factors, ``x`` and ``1 + tanh(...)``, which the product rule
would split, and part of the relevance would go round the ``tanh``'s argument (BLOOM's GeLU lost
half of it); ``sqrt(softplus(x))`` would be a statistic, which rules hold constant. AttnLRP (and LXT) explain an
activation as one elementwise map with the identity rule, ``R_in = R_out``. Registering the
modules as activations gives them that rule: a captured graph keeps them as single nodes, and
code run eagerly (every Hugging Face model) hands the call of their ``forward`` to the rule as a
whole. Their output is marked as an activation, so CP-LRP treats it as the constant gating factor
where it gates a product (GeGLU), as it does for ``F.gelu``.

Importing this module registers them. ``fxlrp.convert`` imports it whenever transformers is
imported (:mod:`fxlrp.explain.loader`); ``import fxlrp`` alone does not (the core never imports
transformers).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from transformers import activations

from fxlrp.eager.interpret import interpret
from fxlrp.operations.helpers import module_as_function, passes
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Pass, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.roles import ACTIVATION

_NAMES = (
    "NewGELUActivation",  # gelu_new (GPT-2, GPT-J, ...)
    "FastGELUActivation",  # gelu_fast
    "AccurateGELUActivation",  # gelu_accurate
    "QuickGELUActivation",  # quick_gelu (CLIP)
    "GELUActivation",  # gelu; gelu_python runs the erf formula in Python
    "GELUTanh",  # gelu_pytorch_tanh; gelu_python_tanh runs the tanh formula in Python (transformers 5)
    "PytorchGELUTanh",  # its name in transformers 4
    "MishActivation",
    "SqrtSoftplusActivation",  # sqrt(softplus(x)): a sqrt elsewhere is a statistic, held constant
    "XIELUActivation",  # xIELU (Apertus), with trainable parameters of its own
    "LaplaceActivation",  # the erf formula, which has no rule of its own
)
_MODEL_ACTIVATIONS = (
    # A family's own activation module: BLOOM's GeLU is an autograd Function of the gelu_new formula.
    ("bloom", "BloomGelu"),
)
_MODEL_ACTIVATION_FUNCTIONS = ("esm", "evolla")
"""Families with an activation function of their own, ``gelu``: the erf formula in Python."""


def _modeling(family: str) -> Any:
    """transformers' modeling file of ``family``, or None in a transformers without the family."""
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError:  # pragma: no cover - a transformers without the family
        return None


def _unwrapped(function: Any) -> Any:
    """The torch implementation behind transformers' kernel-hub wrapper (a closure, whose code
    cannot be intercepted; it calls this plain function unless a CUDA kernel package is installed)."""
    return getattr(function, "__wrapped__", function)


def _family_functions(families: tuple[str, ...], name: str) -> tuple[Callable[..., Any], ...]:
    """The function ``name`` of each family's modeling file that has one (transformers 5 writes a
    copy of a shared function into each family's file)."""
    found = (getattr(_modeling(family), name, None) for family in families)
    return tuple(_unwrapped(function) for function in found if function is not None)


def _activation_modules() -> tuple[type, ...]:
    found = [getattr(activations, name) for name in _NAMES if hasattr(activations, name)]
    for family, name in _MODEL_ACTIVATIONS:
        found += [getattr(_modeling(family), name, None)]
    return tuple(dict.fromkeys(value for value in found if value is not None))


ACTIVATION_MODULES: tuple[type, ...] = _activation_modules()
"""transformers' smooth elementwise activation modules that get the identity rule as a whole."""

_ACTIVATION = passes((0,), recomputable=True)


def activation_module(call: RelevanceCall, function: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """The identity rule on the module's input; the activation is recomputable, so that the rule
    of the layer reading it (an MLP's second linear layer) recomputes it from the input the first
    layer's rule keeps anyway, instead of keeping a second intermediate-sized tensor. Run eagerly,
    the intercepted call is ``forward(module, input)``: the module is bound into the function."""
    if args and isinstance(args[0], nn.Module):
        function, args = partial(function, args[0]), args[1:]
    return _ACTIVATION(call, function, *args, **kwargs)


TRANSFORMERS_ACTIVATION = register(
    Operation(
        "transformers_activation",
        Spelling(
            # The forward functions are intercepted when a model runs eagerly (their ``self`` carries
            # no relevance, so relevance passes to the input); the module types keep a captured
            # graph's call as one node.
            functions=(*dict.fromkeys(module_type.forward for module_type in ACTIVATION_MODULES),
                       *_family_functions(_MODEL_ACTIVATION_FUNCTIONS, "gelu")),
            modules=ACTIVATION_MODULES,
            module_function=module_as_function,
            leaf=True,
        ),
        Pass(activation_module),
        ValueFlow(role=ACTIVATION),
        description="Hugging Face transformers' activation modules (gelu_new, gelu_fast, quick_gelu, ...): "
        "smooth elementwise activations, identity rule R_in = R_out",
    )
)


# -- Mamba's selective scan (MambaLRP) ---------------------------------------------------------------


SCAN_FAMILIES = ("mamba", "falcon_mamba", "jamba", "zamba")
"""Families with a copy of Mamba's ``mamba_selective_scan`` (transformers 4.x writes the scan
inline in each mixer's ``slow_forward``)."""
CHUNKED_SCAN_FAMILIES = ("mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2")
"""Families with a copy of Mamba-2's ``mamba2_chunk_scan``."""


def _scan_of_input(call: RelevanceCall, function: Callable[..., Any], hidden_states: Tensor,
                   selective: tuple[Any, ...], *args: Any, state_flag: str, **kwargs: Any) -> tuple[Tensor, Any]:
    """``function(hidden_states, *selective, *args, **kwargs)`` with the selective parameters
    held constant: a linear map of ``hidden_states`` without bias, under the node's rule (the
    z-rule by default: ``R_u = u * J^T (R / y)``, conserving). ``state_flag``: the keyword that
    asks the scan for its last state as well; returned (without relevance) where the call asked
    for it, else None."""
    selective = tuple(value.detach() if isinstance(value, Tensor) else value for value in selective)
    wants_state = kwargs.pop(state_flag, False)
    states: list[Tensor] = []

    def scan(u: Tensor) -> Tensor:
        output, state = function(u, *selective, *args, **{state_flag: True}, **kwargs)
        states.append(state.detach())
        return output

    output = call.affine(call.layer(scan), hidden_states)
    return output, states[-1] if wants_state else None


def _as_called(output: Tensor, state: Any) -> Any:
    """The scan's result as its caller asked for it: the output, with the last state if asked."""
    return output if state is None else (output, state)


def selective_scan(call: RelevanceCall, function: Callable[..., Any], hidden_states: Tensor, dt: Tensor, A: Tensor,
                   B: Tensor, C: Tensor, D: Tensor | None = None, z: Tensor | None = None, *args: Any,
                   **kwargs: Any) -> Any:
    """MambaLRP (Jafari et al., NeurIPS 2024) for the selective scan
    ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t``, ``y_t = C_t h_t + D u_t``, ``out = y * silu(z)``.

    The selective parameters ``dt``, ``B``, ``C`` (and so the decay ``exp(dt A)``, a gate on the
    state) are held constant: they get no relevance, and the scan is a linear map of ``u``, on
    which the node's rule runs (the z-rule by default: ``R_u = u * J^T (R / y)``, conserving, as
    the map has no bias). The gate ``silu(z)`` and its product with ``y`` are explained by the
    registry's rules for ``silu`` and ``mul`` under the composite (AttnLRP: the identity rule and
    ``R / 2`` to each factor, MambaLRP's gating rule; CP-LRP: the gate is a constant).
    """
    output, state = _scan_of_input(call, function, hidden_states, (dt, A, B, C), D, None, *args,
                                   state_flag="return_last_state", **kwargs)
    if z is not None:
        output = interpret(call, _gated, output, z)
    return _as_called(output, state)


def _gated(output: Tensor, z: Tensor) -> Tensor:
    return output * F.silu(z)


SELECTIVE_SCAN = register(
    Operation(
        "selective_scan",
        Spelling(functions=_family_functions(SCAN_FAMILIES, "mamba_selective_scan"), leaf=True),
        Affine(selective_scan, default_rule=proportional),
        description="Mamba's selective scan (MambaLRP): dt, B, C and the decay exp(dt A) held constant, "
        "the z-rule on the linear map of u that remains; the gate silu(z) by the silu and mul rules",
    )
)


def chunked_selective_scan(call: RelevanceCall, function: Callable[..., Any], hidden_states: Tensor, dt: Tensor,
                           A: Tensor, B: Tensor, C: Tensor, *args: Any, **kwargs: Any) -> Any:
    """MambaLRP for Mamba-2's scan computed in chunks (the state-space duality form: within a
    chunk ``y = (C B^T * L) (dt x)`` with the decays ``L = exp(segsum(dt A))``, between chunks a
    recurrence of states), plus ``D x``: as for Mamba's scan, the time step ``dt`` and ``B`` and
    ``C`` are held constant, and what remains is a linear map of ``x`` without bias, under the
    node's rule (the z-rule by default). The gate, a separate gated RMSNorm in these models
    (``norm(y * silu(z))``), is explained by the registry's rules for its operations."""
    return _as_called(*_scan_of_input(call, function, hidden_states, (dt, A, B, C), *args,
                                      state_flag="return_final_states", **kwargs))


CHUNKED_SELECTIVE_SCAN = register(
    Operation(
        "chunked_selective_scan",
        Spelling(functions=_family_functions(CHUNKED_SCAN_FAMILIES, "mamba2_chunk_scan"), leaf=True),
        Affine(chunked_selective_scan, default_rule=proportional),
        description="Mamba-2's chunked selective scan (MambaLRP): dt, B, C and the decays held constant, "
        "the z-rule on the linear map of x that remains",
    )
)


# -- Mixture-of-experts: the router is a gate ---------------------------------------------------------


def _experts_functions() -> tuple[Callable[..., Any], ...]:
    try:
        from transformers.integrations import moe
    except ImportError:  # transformers 4.x: no shared experts implementations
        return ()
    names = ("batched_mm_experts_forward", "grouped_mm_experts_forward")
    return tuple(getattr(moe, name) for name in names if hasattr(moe, name))


def routed_experts(call: RelevanceCall, function: Callable[..., Any], experts: Any, hidden_states: Tensor,
                   top_k_index: Tensor, top_k_weights: Tensor, *args: Any, **kwargs: Any) -> Any:
    """The experts of a mixture-of-experts layer, ``sum_k w_k expert_k(x)`` over the chosen
    experts, with the router's top-k weights ``w_k`` held constant: the router is a gate,
    relevance goes only to the chosen experts' outputs (and through them to ``x``), none to the
    router. The experts run with their rules inside (projections by the layer rule, the SwiGLU
    product by the product rule)."""
    if isinstance(top_k_weights, Tensor):
        top_k_weights = top_k_weights.detach()
    return interpret(call, function, experts, hidden_states, top_k_index, top_k_weights, *args, **kwargs)


ROUTED_EXPERTS = register(
    Operation(
        "routed_experts",
        Spelling(functions=_experts_functions(), leaf=True),
        Affine(routed_experts, weighted=True),
        description="mixture-of-experts layer (transformers' batched_mm and grouped_mm experts): the router's "
        "top-k weights held constant (a gate), the experts run with their rules inside",
    )
)
