"""LXT's relevance the documented way, and fxlrp's on the same weights and inputs.

LXT's efficient mode patches classes and modules globally (``monkey_patch(modeling_llama)``
replaces ``LlamaMLP.forward``, ``nn.Dropout.forward``, the module's attention functions; for
GPT-2 and BERT ``nn.LayerNorm.forward`` itself; for BERT every attribute of ``modeling_bert``).
:func:`lxt_patched` applies a patch map for the time of a ``with`` block and puts back every
attribute it changed, so that fxlrp's explanations (computed before, outside the block) and the
other tests see the unpatched library. A patch LXT reports as failed fails the test.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import lxt.efficient.models as lxt_models
import torch
import transformers.modeling_utils
from families import Family, explainable, tiny_model, token_ids
from lxt.efficient import monkey_patch
from lxt.efficient.patches import patch_method
from lxt.efficient.rules import identity_rule_implicit_fn, stop_gradient
from torch import nn
from torch.overrides import TorchFunctionMode

import fxlrp
import fxlrp.integrations.transformers  # noqa: F401  (transformers' activation modules: GPT-2's gelu_new)
from fxlrp.rules.composites import CPLRP, AttnLRP


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``."""
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def patch_map(family: Family, method: str) -> dict[Any, Callable[[Any], bool]]:
    """LXT's own map for the family: ``attnLRP`` or ``cp_LRP``."""
    return getattr(getattr(lxt_models, family.name), {"attnlrp": "attnLRP", "cplrp": "cp_LRP"}[method])


# -- applying LXT's patches for a while ------------------------------------------------------------


def _patched_objects(mapping: dict[Any, Any], modeling: types.ModuleType) -> list[Any]:
    return list(dict.fromkeys([*mapping, modeling]))


def _snapshot(objects: list[Any]) -> dict[int, tuple[Any, dict[str, Any]]]:
    interface = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS
    state = {id(value): (value, dict(vars(value))) for value in objects}
    state[id(interface)] = (interface, {"_local_mapping": dict(interface._local_mapping),
                                        "_global_mapping": dict(type(interface)._global_mapping)})
    return state


def _restore(state: dict[int, tuple[Any, dict[str, Any]]]) -> None:
    interface = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS
    for value, saved in state.values():
        if value is interface:
            interface._local_mapping = dict(saved["_local_mapping"])
            type(interface)._global_mapping.clear()
            type(interface)._global_mapping.update(saved["_global_mapping"])
            continue
        current = vars(value)
        for name in [name for name in current if name not in saved]:
            delattr(value, name)
        for name, attribute in saved.items():
            if current.get(name) is not attribute:
                setattr(value, name, attribute)


@contextmanager
def lxt_patched(family: Family, mapping: dict[Any, Callable[[Any], bool]]) -> Iterator[types.ModuleType]:
    """``monkey_patch(modeling_<family>, mapping)`` inside the block, undone after it; yields the
    (patched) modeling module."""
    modeling = family.modeling
    state = _snapshot(_patched_objects(mapping, modeling))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            monkey_patch(modeling, mapping)
        failures = [str(warning.message) for warning in caught if "patch" in str(warning.message)]
        assert not failures, f"LXT could not apply its patches: {failures}"
        yield modeling
    finally:
        _restore(state)


def library_state(families: list[Family]) -> dict[str, Any]:
    """What LXT's patches change, to check that a test left the library as it found it."""
    objects: list[Any] = [nn.Dropout, nn.LayerNorm]
    for family in families:
        for method in ("attnlrp", "cplrp") if family.cp_lrp else ("attnlrp",):
            objects += _patched_objects(patch_map(family, method), family.modeling)
    state = {}
    for value, saved in _snapshot(list(dict.fromkeys(objects))).values():
        for name, attribute in saved.items():
            state[f"{getattr(value, '__name__', type(value).__name__)}.{name}"] = (
                attribute if isinstance(attribute, (dict, list)) else id(attribute))
    return state


# -- LXT's stabiliser and the families' float32 norms, for comparisons in float64 ------------------


@contextmanager
def identity_rule_stabiliser(value: float) -> Iterator[None]:
    """LXT's identity rule scales the gradient by ``act(x) / (x + 1e-10)``; set its ``1e-10``."""
    forward = identity_rule_implicit_fn.forward
    saved = forward.__defaults__
    forward.__defaults__ = (value,)
    try:
        yield
    finally:
        forward.__defaults__ = saved


def _norm_in_input_dtype(self, hidden_states):
    """Llama's (and Qwen's) RMSNorm without its float32 upcast."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _lxt_norm_in_input_dtype(self, hidden_states):
    """LXT's ``rms_norm_forward`` (``1 / rms`` a constant) without its float32 upcast."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * stop_gradient(torch.rsqrt(variance + self.variance_epsilon)))


_lxt_norm_in_input_dtype.__module__ = "lxt_norm_in_input_dtype"  # LXT skips patches from its own module


def _gemma3_norm_in_input_dtype(self, x):
    """Gemma 3's RMSNorm without its float32 upcast (LXT patches its ``_norm``)."""
    return self._norm(x) * (1.0 + self.weight)


@contextmanager
def norms_in_input_dtype(family: Family) -> Iterator[None]:
    """The family's RMSNorm computed in the model's dtype (Hugging Face's upcasts to float32)."""
    if family.rms_norm is None:
        yield
        return
    norm = getattr(family.modeling, family.rms_norm)
    saved = norm.forward
    norm.forward = _gemma3_norm_in_input_dtype if family.name == "gemma3" else _norm_in_input_dtype
    try:
        yield
    finally:
        norm.forward = saved


class _SoftmaxInInputDtype(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SOFTMAXES and kwargs.get("dtype") == torch.float32 and args[0].dtype == torch.float64:
            kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


SOFTMAXES = (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax)


@contextmanager
def softmax_in_input_dtype() -> Iterator[None]:
    """Softmaxes asked for in float32 computed in the input's dtype where it is float64 (the Llama
    family's eager attention takes its softmax in float32 whatever the model's dtype), in fxlrp's
    run and LXT's alike."""
    with _SoftmaxInInputDtype():
        yield


def lxt_map_in_input_dtype(family: Family, method: str) -> dict[Any, Callable[[Any], bool]]:
    """LXT's map with its RMSNorm patch computing in the model's dtype (Gemma 3's patch of
    ``_norm`` has no upcast of its own)."""
    mapping = dict(patch_map(family, method))
    if family.rms_norm is not None and family.name != "gemma3":
        mapping[getattr(family.modeling, family.rms_norm)] = partial(patch_method, _lxt_norm_in_input_dtype)
    return mapping


# -- the two explanations --------------------------------------------------------------------------


def lxt_relevance(model: nn.Module, ids: torch.Tensor, target: torch.Tensor,
                  pick: Callable[[Any], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """LXT's README: embed the ids, forward with ``inputs_embeds``, backward the chosen logit
    with itself as the seed, relevance = gradient x input. Returns (relevance per token and
    embedding dimension, the chosen logits)."""
    inputs_embeds = model.get_input_embeddings()(ids)
    inputs_embeds = inputs_embeds.detach().requires_grad_()
    logits = pick(model(inputs_embeds=inputs_embeds))
    chosen = logits.gather(-1, target[:, None]).squeeze(-1)
    chosen.backward(chosen)
    return (inputs_embeds.grad * inputs_embeds).detach(), chosen.detach()


REPLAYED = ("llama", "qwen2", "qwen3", "gpt2")
"""Families whose run with SDPA attention is recorded and replayed from the second call
(fxlrp/eager/replay.py). Not the eager attention of transformers 4.5x, nor Gemma 3's sliding window:
their masks are made under ``torch.vmap``, whose tensors a recording does not see; not BERT,
whose ``warn_if_padding_and_no_attention_mask`` reads the input ids' values."""


def fxlrp_token_relevance(model: nn.Module, ids: torch.Tensor, target: torch.Tensor,
                          pick: Callable[[Any], torch.Tensor], composite: fxlrp.composites.Composite,
                          replays: bool | None = None) -> torch.Tensor:
    """fxlrp's relevance per token, from the token ids (``R_out`` = the chosen logit): the second
    call's, which replays the graph recorded from the model's run where ``replays`` (checked
    against the first call, which ran it under the relevance mode)."""
    explain = fxlrp.convert(explainable(model), composite)
    with torch.no_grad():
        assert torch.equal(pick(explain(ids)), pick(model(ids))), "the explainer's outputs are the model's"
    first = fxlrp.attribute(explain, ids, target=target, output=pick)
    second = fxlrp.attribute(explain, ids, target=target, output=pick)
    recorded = [module.function.recordings for module in explain.modules()
                if getattr(getattr(module, "function", None), "recordings", None) is not None]
    if replays is not None:
        assert recorded and all(bool(recordings.replays) is replays for recordings in recorded), \
            [recordings.refused for recordings in recorded]
    assert torch.allclose(second, first, rtol=1e-12, atol=0.0)
    return second


class FromEmbeddings(nn.Module):
    """The model with ``inputs_embeds`` as its input."""

    def __init__(self, model: nn.Module, pick: Callable[[Any], torch.Tensor]) -> None:
        super().__init__()
        self.model, self.pick = model, pick

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        return self.pick(self.model(inputs_embeds=inputs_embeds))


def fxlrp_embedding_relevance(model: nn.Module, inputs_embeds: torch.Tensor, target: torch.Tensor,
                              pick: Callable[[Any], torch.Tensor], composite: fxlrp.composites.Composite
                              ) -> torch.Tensor:
    """fxlrp's relevance per token and embedding dimension, from ``inputs_embeds``."""
    explain = fxlrp.convert(FromEmbeddings(explainable(model), pick), composite)
    return fxlrp.attribute(explain, inputs_embeds, target=target)


# -- one comparison -------------------------------------------------------------------------------

COMPOSITES = {"attnlrp": AttnLRP, "cplrp": CPLRP}


def lxt_model(family: Family, model: torch.nn.Module, modeling) -> torch.nn.Module:
    """The model LXT explains: the same one, since LXT patches its classes - except for BERT,
    whose classes LXT replaces with its own copy of ``modeling_bert``, so that a BERT made before
    the patch is not LXT's: a new one from the patched module gets the same weights."""
    if family.name != "bert":
        return model
    copy = getattr(modeling, type(model).__name__)(model.config).to(next(model.parameters()).dtype).eval()
    copy.load_state_dict(model.state_dict())
    return copy


def targets(family: Family, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Each sample's highest logit but the first sample's second highest (not always the top)."""
    with torch.no_grad():
        ranked = family.pick(model(ids)).argsort(dim=-1, descending=True)
    return torch.cat([ranked[:1, 1], ranked[1:, 0]])


def compare(family: Family, method: str, attention: str, dtype: torch.dtype, mapping=None) -> float:
    """Relative error of fxlrp's token relevance against LXT's, on one model and one batch."""
    model = tiny_model(family, attention, dtype)
    ids = token_ids()
    target = targets(family, model, ids)
    relevance = fxlrp_token_relevance(model, ids, target, family.pick, COMPOSITES[method](epsilon=0.0),
                                      replays=attention == "sdpa" and family.name in REPLAYED)
    with lxt_patched(family, mapping or patch_map(family, method)) as modeling:
        expected, chosen = lxt_relevance(lxt_model(family, model, modeling), ids, target, family.pick)
    assert relevance.shape == ids.shape and relevance.dtype == dtype
    assert expected.abs().sum(-1).min() > 0  # every sample is explained
    return relative_error(relevance * chosen[:, None], expected.sum(-1))
