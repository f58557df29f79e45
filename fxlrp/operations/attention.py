"""Softmax and attention: ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention``.

Softmax takes AttnLRP's rule (:class:`~fxlrp.rules.attention.SoftmaxRule`) and marks its output as
attention weights. Fused attention is explained through its decomposition
``softmax(q k^T * scale + mask) @ v``, run by the engine
(:meth:`~fxlrp.relevance.call.RelevanceCall.decompose`) so that the products follow the node's
:class:`~fxlrp.rules.attention.Product` rule (AttnLRP's uniform split by default, CP-LRP with
:func:`~fxlrp.rules.attention.cp_lrp`); the outputs keep the values of the fused kernel.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import bind, module_as_function, never_negative
from fxlrp.operations.products import receiving
from fxlrp.registry import REGISTRY, Affine, Operation, Spelling, ValueFlow, register
from fxlrp.relevance import AffineLayer
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_form_active, scaled_gradient
from fxlrp.relevance.roles import ATTENTION, GATE, SELECTED, role_of
from fxlrp.relevance.rule_function import carries_relevance, stabilised
from fxlrp.relevance.straight_through import Index, Piece, decomposed_in_backward
from fxlrp.rules import Epsilon
from fxlrp.rules.attention import AttentionAsConstant, Product, SoftmaxRule


def softmax(call: RelevanceCall, function: Callable[..., Tensor], input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The node's rule (AttnLRP's softmax rule by default); the output's role is the entry's
    (:func:`weights_role`)."""
    layer = call.layer(bind(function, kwargs), softmax_dim=softmax_dimension(function, input, args, kwargs))
    return call.affine(layer, input, *args)


def weights_role(output: Any, input: Any, *args: Any, **kwargs: Any) -> str:
    """A softmax makes attention weights, or a router's weights, gates, where it normalises the
    scores ``topk`` chose (GPT-OSS)."""
    return GATE if role_of(input) == SELECTED else ATTENTION


def softmax_dimension(function: Any, input: Tensor, args: tuple, kwargs: dict[str, Any]) -> int | None:
    """The dimension ``function(input, *args, **kwargs)`` normalises over (``F.softmax``,
    ``torch.softmax``, ``Tensor.softmax`` and ``nn.Softmax``), or None where it is implicit (the
    deprecated ``dim=None``) or named."""
    dim = function.dim if isinstance(function, nn.Softmax) else args[0] if args else kwargs.get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or not isinstance(input, Tensor) or input.dim() == 0:
        return None
    return dim % input.dim()


register(
    Operation(
        "softmax",
        Spelling(
            functions=(F.softmax, torch.softmax),
            methods=("softmax",),
            modules=(nn.Softmax,),
            module_function=module_as_function,
        ),
        Affine(softmax, default_rule=SoftmaxRule),
        ValueFlow(non_negative=never_negative, role=weights_role, saturates=True),
        description="softmax: AttnLRP rule R_in = x (R - s sum R); output marked as attention weights",
    )
)


def additive_mask(mask: Tensor | None, allowed_when_true: bool, dtype: torch.dtype) -> Tensor | None:
    """A float mask to add to attention scores (``-inf`` where attention is not allowed)."""
    if mask is None or mask.is_floating_point():
        return mask
    blocked = ~mask if allowed_when_true else mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(blocked, float("-inf"))


def decomposed_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
    is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False,
) -> Tensor:
    """``softmax(q k^T * scale + mask) @ v`` in plain torch, as ``F.scaled_dot_product_attention``
    computes it (boolean masks: True = may attend). Dropout is off: explanations are of inference."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    for mask in attention_masks(query, key, attn_mask, is_causal, scores.dtype):
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), value)


_ATTENTION = inspect.signature(decomposed_attention)
"""``F.scaled_dot_product_attention``'s arguments (torch's own function has no signature to read)."""


def attention_masks(query: Tensor, key: Tensor, attn_mask: Tensor | None, is_causal: bool,
                    dtype: torch.dtype) -> list[Tensor]:
    """The float masks added to attention's scores, in order: the causal one, then ``attn_mask``."""
    masks = []
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        masks.append(additive_mask(torch.ones(length, source, dtype=torch.bool, device=query.device).tril(),
                                   True, dtype))
    mask = additive_mask(attn_mask, True, dtype)
    return masks if mask is None else [*masks, mask]


def scaled_dot_product_attention(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Fused attention: values of the kernel, relevance through :func:`decomposed_attention`; in
    the gradient form, the kernel's own backward with the decomposition's shares
    (:attr:`AttentionRules.gradient_shares`); in the relevance form, the decomposition's relevance
    in closed form where its rules have one (:func:`attention_relevance`), else the
    decomposition run under the interpretation in backward. Its dropout is off, whatever
    ``dropout_p`` says (a model in training mode passes its rate), as dropout is the identity at
    explanation time."""
    if len(args) > 4:
        args = (*args[:4], 0.0, *args[5:])
    elif kwargs.get("dropout_p"):
        kwargs = {**kwargs, "dropout_p": 0.0}
    if not any(carries_relevance(value) for value in args[:3]) or not torch.is_grad_enabled():
        return function(*args, **kwargs)
    # every argument by position (the mask, so that each piece gets its part of it), scale and
    # enable_gqa by keyword, as torch takes them
    args, kwargs = _bound(_ATTENTION, args, kwargs)
    factors, mask, is_causal = args[:3], args[3], args[5]
    roles = tuple(role_of(value) for value in factors)
    carrying = tuple(carries_relevance(value) for value in factors)
    masked = is_causal or mask is not None
    # the same for every call of this site with these roles: resolved once
    rules = call.cached(("attention rules", roles, carrying, masked), (),
                        lambda: attention_rules(call, roles, carrying, masked))
    # A mask computed from the input (SAM's relative positions) carries relevance: the sum with the
    # scaled scores hands it the share of the logits (the weights' share of the mixing product).
    mask_carries = carries_relevance(mask)
    if gradient_form_active():
        shares = rules.gradient_shares
        # (with q and k constant, the mask alone would make the weights carry: rules resolved without)
        if shares is not None and not (mask_carries and not (carrying[0] or carrying[1])):
            held = [value if not carrying[index] else scaled_gradient(value, shares[index]) if shares[index]
                    else value.detach() for index, value in enumerate(factors)]
            if mask_carries:
                to_weights = rules.weights_value[0]
                mask = scaled_gradient(mask, to_weights) if to_weights else mask.detach()
            return function(*held, mask, *args[4:], **kwargs)
    closed_form = None
    if (rules.closed_form and _own_heads(*factors, kwargs["enable_gqa"])
            and not (is_causal and mask is not None)):  # (torch takes one of the two: one sum with a mask)
        closed_form = partial(attention_relevance, rules, kwargs["scale"], is_causal, gradient_form_active())
    return decomposed_in_backward(
        partial(function, **kwargs), partial(call.decompose, decomposed_attention, **kwargs), *args,
        pieces=attention_pieces(*args[:4]), closed_form=closed_form)


def _bound(signature: inspect.Signature, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments with their defaults, by position where the signature allows: the
    decomposition hands relevance back to positional inputs only (a mask given by keyword and
    computed from the input carries relevance), and a piece of it takes its part of each.

    Bound by ``signature.bind`` the first time a call site's pattern (how many arguments by
    position, which by keyword) is met, by its plan from then on (a fifth of the time: attention
    runs at every layer of every explanation)."""
    pattern = (id(signature), len(args), tuple(kwargs))
    plan = _BINDINGS.get(pattern)
    if plan is None:
        bound = signature.bind(*args, **kwargs)  # (the call's own TypeError where it does not fit)
        bound.apply_defaults()
        _BINDINGS[pattern] = _binding(signature, len(args))
        return bound.args, bound.kwargs
    by_position, by_keyword = plan
    return ((*args, *(kwargs.get(name, default) for name, default in by_position)),
            {name: kwargs.get(name, default) for name, default in by_keyword})


_BINDINGS: dict[tuple[int, int, tuple[str, ...]], tuple[list[tuple[str, Any]], list[tuple[str, Any]]]] = {}
""":func:`_bound`'s plans: for a signature and a call's pattern, the parameters after those given
by position, with their defaults, that the call takes by position and by keyword."""


def _binding(signature: inspect.Signature, given: int) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """:data:`_BINDINGS`' plan for calls of ``signature`` with ``given`` arguments by position
    (signatures without ``*args`` or ``**kwargs``: every parameter is named)."""
    parameters = list(signature.parameters.values())
    keyword_only = [parameter for parameter in parameters if parameter.kind == parameter.KEYWORD_ONLY]
    positional = [parameter for parameter in parameters if parameter.kind != parameter.KEYWORD_ONLY]
    return ([(parameter.name, parameter.default) for parameter in positional[given:]],
            [(parameter.name, parameter.default) for parameter in keyword_only])


def _own_heads(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> bool:
    """Queries, keys and values of the same samples and heads, or keys and values of groups of
    query heads (grouped-query attention), none broadcast: each piece of the decomposition then
    reads its own part of each."""
    if query.dim() < 3 or not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
        return False
    heads, shared = query.shape[-3], key.shape[-3]
    return value.shape[-3] == shared and (heads == shared or enable_gqa and heads % shared == 0)


@dataclass(frozen=True)
class AttentionRules:
    """The rules the parts of :func:`decomposed_attention` are given in one call (the ones the
    interpretation gives them, so composites that change them are followed) and what follows
    from them: which factors receive relevance, in which shares."""

    scores: Any
    """The rule of ``q @ k^T``; None where the attention weights carry no relevance."""
    mixing: Any
    """The rule of ``weights @ v``."""
    query_key: tuple[float, float]
    """The shares of ``q`` and ``k`` in the relevance of ``q @ k^T`` (``1 / N`` for each of the
    ``N`` receivers, 0 for a factor that is a constant by role)."""
    weights_value: tuple[float, float]
    """The shares of the weights and of ``v`` in the relevance of ``weights @ v``."""
    add: Any
    """The rule of the mask's addition to the scores; None without a mask."""
    gradient_shares: tuple[float, float, float] | None
    """The shares of the fused kernel's gradients of ``q, k, v`` that equal relevance through the
    decomposition in the gradient form (:mod:`fxlrp.relevance.form`), or None if its rules have
    no gradient form there.

    In that form each product passes its gradient to each receiving factor times ``1 / N``
    (AttnLRP's uniform rule: 1/2), the softmax rule is the softmax's gradient, and the scale and
    the mask additions are gradients too, so the decomposition's backward is the fused kernel's
    with ``q`` and ``k`` scaled by the product of the two products' shares (1/4) and ``v`` by
    its share (1/2). With attention weights held constant (CP-LRP) ``v`` takes all and ``q, k``
    none."""
    layer: AffineLayer
    """The products as a layer, for their rules' quotients (which may warn of lost relevance)."""
    closed_form: bool
    """Whether :func:`attention_relevance` computes the decomposition's relevance in the
    relevance form: the epsilon rule or the Product rule (without ``zero_params``) on both
    products and the mask's addition and, where the weights receive relevance, AttnLRP's softmax
    rule."""


def attention_rules(
    call: RelevanceCall, roles: tuple[str | None, ...], carrying: tuple[bool, ...], masked: bool,
) -> AttentionRules:
    """The :class:`AttentionRules` of ``q, k, v`` of these ``roles``, these relevance-``carrying``,
    with a mask or not."""
    interpretation = call.rules_inside()
    # q k^T is the decomposition's first operation: the first layer if the call may hold it
    scores_first = interpretation.holds_first_layer and interpretation.composite.counts_as_first_layer(
        "matmul", REGISTRY.operations["matmul"].propagation.weighted)

    def rule(operation: str, factors: int, first: bool = False) -> Any:
        return interpretation.rule_for(REGISTRY.operations[operation], None, first, factors)

    def shares(product: Any, factor_roles: tuple[str | None, str | None], carried: tuple[bool, bool]):
        chosen = receiving(product, factor_roles, tuple(index for index in range(2) if carried[index]))
        return tuple(1.0 / len(chosen) if index in chosen else 0.0 for index in range(2))

    softmax_rule = rule("softmax", 0)
    weights_carry = (carrying[0] or carrying[1]) and not isinstance(softmax_rule, AttentionAsConstant)
    mixing_rule = rule("matmul", weights_carry + carrying[2])
    to_weights, to_value = shares(mixing_rule, (ATTENTION, roles[2]), (weights_carry, carrying[2]))
    scores_rule = rule("matmul", carrying[0] + carrying[1], scores_first) if weights_carry else None
    to_query, to_key = shares(scores_rule, roles[:2], carrying[:2]) if weights_carry else (0.0, 0.0)
    add_rule = rule("add", 0) if masked else None
    if not weights_carry:
        gradient_shares = (0.0, 0.0, to_value) if _plain_gradient(mixing_rule) else None
    elif all(_plain_gradient(needed) for needed in
             [softmax_rule, scores_rule, mixing_rule] + ([add_rule] if masked else [])):
        gradient_shares = (to_query * to_weights, to_key * to_weights, to_value)
    else:
        gradient_shares = None
    closed_form = (all(carrying) and _epsilon_rule(mixing_rule)
                   and (not to_weights or type(softmax_rule) is SoftmaxRule and _epsilon_rule(scores_rule)
                        and (not masked or _epsilon_rule(add_rule))))
    layer = AffineLayer(torch.matmul, warn_lost_relevance=call.warn_lost_relevance)
    return AttentionRules(scores_rule, mixing_rule, (to_query, to_key), (to_weights, to_value), add_rule,
                          gradient_shares, layer, closed_form)


def _plain_gradient(rule: Any) -> bool:
    """Whether ``rule``'s gradient form is a share of the gradient, without a stabiliser (one
    would act on the scores inside the fused kernel)."""
    return rule.has_gradient_form() and getattr(rule, "epsilon", 0.0) == 0.0


def _epsilon_rule(rule: Any) -> bool:
    """The epsilon rule or the Product rule itself (a subclass may change what they compute)."""
    return type(rule) in (Epsilon, Product) and not rule.zero_params


def attention_relevance(
    rules: AttentionRules, scale: float | None, is_causal: bool, gradient_form: bool, inputs: list[Any],
    relevance: Sequence[Tensor],
) -> list[Tensor | None]:
    r"""The relevance of ``q, k, v`` (the first three ``inputs``, the fourth a mask or None)
    through :func:`decomposed_attention` with at most one mask, for the ``relevance`` ``R`` of its
    output, in closed form: the same rules (``rules``) as the decomposition run under the
    interpretation, without running the interpretation.

    With ``S = q k^T``, logits ``L = S * scale + m`` (``m``: the mask, added under the sum's
    rule), ``A = softmax(L)``, ``o = A v``, shares ``a_A, a_v`` of the mixing product and
    ``a_q, a_k`` of the scores' product, and each rule's stabiliser ``s``:

    .. math::
        Z = R / s(o), \quad R_v = a_v \, v \odot (A^T Z), \quad R_A = a_A \, A \odot (Z v^T),

        R_L = L \odot (R_A - A \textstyle\sum_j R_A), \quad
        R_{S \cdot \mathrm{scale}} = (S \cdot \mathrm{scale}) \odot R_L / s(L),

        Y = R_{S \cdot \mathrm{scale}} / s(S), \quad R_q = a_q \, q \odot (Y k),
        \quad R_k = a_k \, k \odot (Y^T q)

    (the softmax rule, 0 where the mask is ``-inf``; without a mask ``R_L`` goes to ``S * scale``
    as it is, and the product with the scale passes relevance unchanged). Under grouped-query
    attention keys and values are repeated for their groups of query heads, and the relevance of
    the copies summed. Every intermediate is the piece's own: products and quotients are written
    into them.

    In the gradient form (``gradient_form``: ``relevance`` is ``g = R / o``, :mod:`fxlrp.relevance.form`)
    the same rules hand back ``R_q / q``, ``R_k / k``, ``R_v / v`` and the mask's ``R / m``
    (:func:`_gradients_of_heads`).
    """
    query, key, value, attn_mask = inputs[:4]
    of_heads = _gradients_of_heads if gradient_form else _relevance_of_heads
    repeats = query.shape[-3] // key.shape[-3]
    if repeats == 1:
        return of_heads(rules, scale, is_causal, query, key, value, attn_mask, relevance)
    # grouped-query attention: each key and value head serves ``repeats`` query heads
    key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    shares = of_heads(rules, scale, is_causal, query, key, value, attn_mask, relevance)
    return [share.unflatten(-3, (-1, repeats)).sum(-3) if index in (1, 2) and share is not None else share
            for index, share in enumerate(shares)]


def _relevance_of_heads(
    rules: AttentionRules, scale: float | None, is_causal: bool, query: Tensor, key: Tensor, value: Tensor,
    attn_mask: Tensor | None, relevance: Sequence[Tensor],
) -> list[Tensor | None]:
    """:func:`attention_relevance` for keys and values of the queries' own heads: the relevance
    of ``q, k, v`` and, where it carries relevance (a bias computed from the input, as SAM's
    relative positions), of ``attn_mask``.

    The heads of all samples are one batch of matrices (``[samples x heads, length, features]``,
    a view where the layout allows, as ``torch.matmul`` would make for each of its products), so
    that each product is one ``bmm``; the scores take the heads' own shape only to meet a mask."""
    mask_carries = isinstance(attn_mask, Tensor) and attn_mask.requires_grad
    (output_relevance,) = relevance
    to_weights, to_value = rules.weights_value
    layer = rules.layer
    heads = _Heads.of(query, key, value, attn_mask, is_causal, scale)
    query, key, value, masks, given = heads.query, heads.key, heads.value, heads.masks, heads.given
    scores = torch.bmm(query, key.mT)
    scaled = scores * heads.scale
    logits, heads_weights, weights = heads.softmax(scaled)
    if masks:
        scaled = scaled.view(heads.shape)
    output = torch.bmm(weights, value)
    quotient = rules.mixing.scaled(_matrices(output_relevance), output, layer)
    del output
    # The uniform rule's 1 / N is the same for every receiver: taken once on the quotient, which
    # has the output's size, not on the weights' shares (length x length) and the values'.
    quotient = _times(quotient, None, to_weights or to_value)
    value_relevance = _in_layout_of(torch.bmm(weights.mT, quotient), given[2]) if to_value else None
    if not to_weights:
        return [None, None, value_relevance, *([None] if mask_carries else [])]
    weight_relevance = _times(torch.bmm(quotient, value.mT), weights)
    del quotient
    # (logits of -inf occur only where a mask blocks attention: without one, none is looked for)
    logit_relevance = SoftmaxRule.closed_form(weight_relevance.view(heads.shape) if masks else weight_relevance,
                                              heads_weights, logits, -1, owned=True, masked=bool(masks))
    del weights, heads_weights
    mask_relevance = None
    if masks:  # the scaled scores' share of the sum with the mask, and the mask's where it carries relevance
        quotient = rules.add.scaled(logit_relevance, logits, layer)
        if mask_carries:
            mask_relevance = (quotient * masks[-1]).sum_to_size(attn_mask.shape)
        logit_relevance = _times(quotient, scaled).view(scores.shape)
    del logits, scaled
    to_query, to_key = rules.query_key
    # the scores' shares: one product on the quotient where both receivers take the same
    share = to_query if to_query == to_key or not to_key else to_key if not to_query else 1.0
    quotient = _times(rules.scores.scaled(logit_relevance, scores, layer), None, share)
    del scores, logit_relevance
    return [
        _in_layout_of(torch.bmm(quotient, key), given[0], to_query / share) if to_query else None,
        _in_layout_of(torch.bmm(quotient.mT, query), given[1], to_key / share) if to_key else None,
        value_relevance,
        *([mask_relevance] if mask_carries else []),
    ]


def _gradients_of_heads(
    rules: AttentionRules, scale: float | None, is_causal: bool, query: Tensor, key: Tensor, value: Tensor,
    attn_mask: Tensor | None, gradient: Sequence[Tensor],
) -> list[Tensor | None]:
    r""":func:`_relevance_of_heads` in the gradient form: for ``g = R / o``, ``R_q / q``, ``R_k /
    k``, ``R_v / v`` and, where it carries relevance, the mask's ``R / m``.

    Each rule is its gradient form (:mod:`fxlrp.relevance.form`): with ``L = S' + m``, ``S' = S
    \cdot \mathrm{scale}`` and the stabilised factor ``\lceil x \rceil_\epsilon = |x| / (|x| +
    \epsilon)`` (:func:`~fxlrp.relevance.rule_function.stabilised`),

    .. math::
        Z = g \lceil o \rceil_{\epsilon_o}, \quad g_v = a_v A^T Z, \quad
        g_L = J_{\mathrm{softmax}}^T (a_A Z v^T), \quad g_{S'} = g_m = g_L \lceil L \rceil_{\epsilon_m},

        Y = \mathrm{scale} \cdot g_{S'} \lceil S \rceil_{\epsilon_S}, \quad g_q = a_q Y k,
        \quad g_k = a_k Y^T q

    (the product with the scale passes relevance unchanged: ``g_S = scale g_{S'}``; ``\lceil S
    \rceil_\epsilon = \lceil S' \rceil_{\epsilon |\mathrm{scale}|}``). Each score-sized
    intermediate is written into the one before it."""
    mask_carries = isinstance(attn_mask, Tensor) and attn_mask.requires_grad
    (output_gradient,) = gradient
    to_weights, to_value = rules.weights_value
    heads = _Heads.of(query, key, value, attn_mask, is_causal, scale)
    query, key, value, masks, scale, given = heads.query, heads.key, heads.value, heads.masks, heads.scale, heads.given
    scaled = torch.bmm(query, key.mT).mul_(scale)  # S' = S * scale (bmm keeps no output: written into)
    logits, heads_weights, weights = heads.softmax(scaled)
    mixing_share = to_value or to_weights  # (the other factor's share: a ratio to it, taken later)
    output_factor = stabilised(_matrices(output_gradient), torch.bmm(weights, value), rules.mixing.epsilon,
                               mixing_share, owned=True)
    value_gradient = _in_layout_of(torch.bmm(weights.mT, output_factor), given[2], 1.0, False) if to_value else None
    if not to_weights:
        return [None, None, value_gradient, *([None] if mask_carries else [])]
    weights_gradient = torch.bmm(output_factor, value.mT)
    del output_factor, weights
    logits_gradient = torch._softmax_backward_data(weights_gradient.view(heads.shape) if masks else weights_gradient,
                                                   heads_weights, -1, query.dtype)
    del weights_gradient, heads_weights
    mask_gradient = None
    if masks:  # the sum with the mask: the scaled scores' share and the mask's are the same factor
        logits_gradient = stabilised(logits_gradient, logits, rules.add.epsilon, owned=True)
        if mask_carries:
            mask_gradient = logits_gradient.sum_to_size(attn_mask.shape)
        logits_gradient = logits_gradient.view(scaled.shape)
    del logits
    to_query, to_key = rules.query_key
    # the scores' shares: one product on the factor where both receivers take the same
    share = to_query if to_query == to_key or not to_key else to_key if not to_query else 1.0
    scores_factor = stabilised(logits_gradient, scaled, rules.scores.epsilon * abs(scale),
                               scale * share * to_weights / mixing_share, owned=True)
    del scaled, logits_gradient
    return [
        _in_layout_of(torch.bmm(scores_factor, key), given[0], to_query / share, False) if to_query else None,
        _in_layout_of(torch.bmm(scores_factor.mT, query), given[1], to_key / share, False) if to_key else None,
        value_gradient,
        *([mask_gradient] if mask_carries else []),
    ]


@dataclass
class _Heads:
    """The closed forms' view of one attention: ``q``, ``k``, ``v`` as batches of matrices, the
    scores' shape (``[..., heads, length, source]``, which masks broadcast to), the masks added to
    the scores, the scale and the factors as given."""

    query: Tensor
    key: Tensor
    value: Tensor
    shape: tuple[int, ...]
    masks: list[Tensor]
    scale: float
    given: tuple[Tensor, Tensor, Tensor]

    @classmethod
    def of(cls, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, is_causal: bool,
           scale: float | None) -> _Heads:
        return cls(_matrices(query), _matrices(key), _matrices(value), (*query.shape[:-1], key.shape[-2]),
                   attention_masks(query, key, attn_mask, is_causal, query.dtype),
                   1.0 / math.sqrt(query.shape[-1]) if scale is None else scale, (query, key, value))

    def softmax(self, scaled: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The logits (``scaled`` plus the mask), the weights in the scores' shape and as a batch
        of matrices; elementwise in the scores' shape only to meet a mask."""
        if not self.masks:
            weights = torch.softmax(scaled, dim=-1)
            return scaled, weights, weights
        logits = scaled.view(self.shape) + self.masks[0]
        weights = torch.softmax(logits, dim=-1)
        return logits, weights, weights.view(scaled.shape)


def _matrices(tensor: Tensor) -> Tensor:
    """``[..., rows, columns]`` as one batch of matrices, ``[-1, rows, columns]`` (a view where the
    layout allows)."""
    return tensor if tensor.dim() == 3 else tensor.reshape(-1, *tensor.shape[-2:])


def _in_layout_of(gradient: Tensor, factor: Tensor, share: float = 1.0, times_factor: bool = True) -> Tensor:
    """``share * factor * gradient`` for a fresh ``gradient`` of ``factor``'s size (a batch of
    matrices), of ``factor``'s shape and layout: the relevance of ``q``, ``k`` or ``v``, handed back
    laid out as the factor is, as autograd hands a gradient - heads made by a transpose (``[batch,
    length, heads, features]`` seen as ``[batch, heads, length, features]``) then go back through
    the transpose and the view that made them without a copy (two operations each)."""
    shaped = gradient.view(factor.shape)
    if not times_factor:  # (the gradient form: ``share * gradient``)
        return _times(shaped, None, share)
    if factor.is_contiguous() or gradient.requires_grad:
        return _times(shaped, factor, share)  # (written into the product)
    product = torch.mul(factor, shaped)  # (an elementwise result takes its first operand's layout)
    return product.mul_(share) if share != 1.0 else product


def _times(gradient: Tensor, factor: Tensor | None, share: float = 1.0) -> Tensor:
    """``share * factor * gradient`` (no ``factor``: ``share * gradient``) for a fresh ``gradient``,
    written into it unless recorded."""
    in_place = not gradient.requires_grad
    if factor is not None:
        gradient = gradient.mul_(factor) if in_place else gradient * factor
    if share == 1.0:
        return gradient
    return gradient.mul_(share) if in_place else gradient * share


PIECE_SCORES = 1 << 19
"""Attention scores (query x key entries) per piece of the decomposition in backward on the CPU,
about 2 MB in float32. The scores, the weights and their relevance are alive for one piece at a
time (for ViT-Base at 224 x 224, batch 2: one sample's heads, half a layer's). Smaller pieces cost
time: each runs the decomposition's few dozen operations again on less data."""
SCORE_BUFFERS = 8
"""Score-sized tensors a piece holds at once at most (scores, weights, their relevance, quotients
and products), for :func:`piece_scores` on a GPU."""


def piece_scores(query: Tensor) -> int:
    """Attention scores per piece for a query on its device.

    On the CPU :data:`PIECE_SCORES`, sized for its caches. On a CUDA device, where each piece's few
    dozen operations are as many kernel launches the host waits on, as many scores as a quarter of
    the memory free there holds in :data:`SCORE_BUFFERS` tensors (the driver's free memory and the
    allocator's reserved but unused), never fewer than on the CPU: the whole batch's heads at once
    wherever they fit (ViT-Base at batch 32: 60 MB of scores in float32). Reading the free memory
    waits for no kernel. While a CUDA graph is captured (where the driver's query may be refused),
    as on the CPU.

    Parameters
    ----------
    query : Tensor
        The attention's query.

    Returns
    -------
    int
        The number of scores a piece may have.
    """
    if query.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return PIECE_SCORES
    free, _ = torch.cuda.mem_get_info(query.device)
    free += torch.cuda.memory_reserved(query.device) - torch.cuda.memory_allocated(query.device)
    return max(PIECE_SCORES, free // (4 * SCORE_BUFFERS * query.element_size()))


def attention_pieces(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> list[Piece] | None:
    """Independent pieces of ``softmax(q k^T * scale + mask) @ v``: groups of heads of samples,
    each with about :func:`piece_scores` scores (under grouped-query attention whole groups of query
    heads sharing keys and values, or parts of one group where a group's scores do not fit), or
    None where the whole is small or the shapes are not
    ``[..., (batch,) heads, length, features]`` with keys, values and mask of the same or broadcast
    (size 1) batch and heads."""
    if query.dim() < 3:
        return None
    length, source, heads = query.shape[-2], key.shape[-2], query.shape[-3]
    batch = query.shape[-4] if query.dim() >= 4 else 1
    budget = piece_scores(query)
    if batch * heads * length * source <= budget:
        return None
    shared = {tensor.shape[-3] for tensor in (key, value) if tensor.dim() >= 3 and tensor.shape[-3] != 1}
    kv_heads = shared.pop() if len(shared) == 1 else 1 if not shared else 0
    if kv_heads == 0 or heads % kv_heads:
        return None
    if any(tensor is not None and tensor.dim() >= 3 and tensor.shape[-3] not in (1, heads, kv_heads)
           or tensor is not None and tensor.dim() >= 4 and tensor.shape[-4] not in (1, batch)
           for tensor in (key, value, mask)):
        return None
    group = heads // kv_heads if kv_heads > 1 else 1  # size 1: broadcast, every piece reads it whole
    fitting = max(1, budget // (length * source))  # query heads whose scores fit the budget
    # whole groups of query heads, or the most of one group that fit (the group's key and value
    # head is then read by several pieces, each adding its relevance)
    heads_per_piece = (min(heads, fitting // group * group) if fitting >= group
                       else max(size for size in range(1, fitting + 1) if group % size == 0))
    samples_per_piece = max(1, budget // (length * source * heads)) if heads_per_piece == heads else 1

    def where(tensor: Tensor | None, first: int, last: int, sample: int) -> Index | None:
        # the piece's heads (dim -3) and samples (dim -4) of a tensor aligned to the query's last dims
        if tensor is None or tensor.dim() < 3:
            return None
        index = [slice(None)] * tensor.dim()
        size = tensor.shape[-3]
        if size == heads:
            index[-3] = slice(first, last)
        elif size == kv_heads and size != 1:
            index[-3] = slice(first // group, (last - 1) // group + 1)
        if tensor.dim() >= 4 and query.dim() >= 4 and tensor.shape[-4] == batch and batch != 1:
            index[-4] = slice(sample, sample + samples_per_piece)
        return tuple(index)

    pieces = []
    for sample in range(0, batch, samples_per_piece):
        for first in range(0, heads, heads_per_piece):
            last = min(first + heads_per_piece, heads)
            inputs = tuple(where(tensor, first, last, sample) for tensor in (query, key, value, mask))
            pieces.append((*inputs, inputs[0]))  # the output lies where the query does
    return pieces


register(
    Operation(
        "attention",
        Spelling(functions=(F.scaled_dot_product_attention,)),
        Affine(scaled_dot_product_attention, default_rule=Product),
        description="scaled dot-product attention: softmax rule and Product rule on its decomposition",
    )
)


def _heads(projected: Tensor, heads: int) -> Tensor:
    """``[batch, length, embed]`` -> ``[batch, heads, length, embed / heads]``."""
    batch, length, _ = projected.shape
    return projected.reshape(batch, length, heads, -1).transpose(1, 2)


def decomposed_multi_head_attention(
    module: nn.MultiheadAttention | SimpleNamespace, parameters: dict[str, Tensor], query: Tensor, key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
    average_attn_weights: bool = True, is_causal: bool = False, *, self_attention: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``nn.MultiheadAttention`` at inference in plain torch: projections, heads, attention with
    masks (boolean: True = may not attend, as the module defines them), output projection. Without
    the weights asked for, the attention is ``F.scaled_dot_product_attention`` of the heads, whose
    entry explains it by the same decomposition ``softmax(q k^T / sqrt(d) + mask) @ v`` and rules,
    in closed form where they have one (:func:`attention_relevance`). ``self_attention``: the
    module was called with one tensor as query, key and value (which the decomposition, run in
    backward, gets as a leaf each): q, k and v are then one product with the packed projection,
    whose relevance, every rule sharing relevance output by output, is the sum of the three
    products' and goes to ``query`` alone."""
    if module.bias_k is not None or module.add_zero_attn:
        raise NotImplementedError(
            "fxlrp explains nn.MultiheadAttention without add_bias_kv and add_zero_attn; "
            "build the module without them to explain it."
        )
    self_attention = self_attention and module._qkv_same_embed_dim
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
    if not module.batch_first or unbatched:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    in_bias = parameters.get("in_proj_bias")
    heads = module.num_heads
    if self_attention:
        q, k, v = (_heads(projected, heads) for projected in
                   F.linear(query, parameters["in_proj_weight"], in_bias).chunk(3, dim=-1))
    else:
        if module._qkv_same_embed_dim:
            weights = parameters["in_proj_weight"].chunk(3)
        else:
            weights = (parameters["q_proj_weight"], parameters["k_proj_weight"], parameters["v_proj_weight"])
        biases = (None, None, None) if in_bias is None else in_bias.chunk(3)
        q, k, v = (_heads(F.linear(x, w, b), heads)
                   for x, w, b in zip((query, key, value), weights, biases, strict=True))
    batch, length, source = q.shape[0], q.shape[2], k.shape[2]

    mask = additive_mask(attn_mask, False, q.dtype)
    if mask is not None and mask.dim() == 3:
        mask = mask.view(batch, heads, length, source)
    padding = additive_mask(key_padding_mask, False, q.dtype)
    if padding is not None:
        padding = padding.view(batch, 1, 1, source)
        mask = padding if mask is None else mask + padding
    if is_causal and mask is None:
        causal = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        mask = additive_mask(causal, True, q.dtype)

    if need_weights:
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if mask is not None:
            scores = scores + mask
        attention = torch.softmax(scores, dim=-1)
        mixed = torch.matmul(attention, v)
    else:  # the same decomposition, explained by attention's entry (its relevance in closed form where it has one)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    output = mixed.transpose(1, 2).reshape(batch, length, -1)
    output = F.linear(output, parameters["out_proj.weight"], parameters.get("out_proj.bias"))
    if not module.batch_first or unbatched:
        output = output.transpose(0, 1)
    if unbatched:
        output = output.squeeze(1)
    if not need_weights:
        return output, None
    attention = attention.mean(1) if average_attn_weights else attention
    return output, attention.squeeze(0) if unbatched else attention


def decomposed_multi_head_attention_forward(
    query: Tensor, key: Tensor, value: Tensor, embed_dim_to_check: int, num_heads: int,
    in_proj_weight: Tensor | None, in_proj_bias: Tensor | None, bias_k: Tensor | None, bias_v: Tensor | None,
    add_zero_attn: bool, dropout_p: float, out_proj_weight: Tensor, out_proj_bias: Tensor | None,
    training: bool = True, key_padding_mask: Tensor | None = None, need_weights: bool = True,
    attn_mask: Tensor | None = None, use_separate_proj_weight: bool = False, q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None, v_proj_weight: Tensor | None = None, static_k: Tensor | None = None,
    static_v: Tensor | None = None, average_attn_weights: bool = True, is_causal: bool = False, *,
    self_attention: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` calls, in code run
    eagerly) in plain torch, through the module's decomposition: inputs ``[length, batch, embed]``
    (``self_attention``: see :func:`decomposed_multi_head_attention`)."""
    if bias_k is not None or add_zero_attn or static_k is not None or static_v is not None:
        raise NotImplementedError(
            "fxlrp explains multi-head attention without add_bias_kv, add_zero_attn and static keys/values; "
            "build the module without them to explain it."
        )
    # what the decomposition reads of a module (no module is built: its initialisation would run here)
    shape = SimpleNamespace(bias_k=None, add_zero_attn=False, batch_first=False, num_heads=num_heads,
                            _qkv_same_embed_dim=not use_separate_proj_weight)
    parameters = {"in_proj_weight": in_proj_weight, "in_proj_bias": in_proj_bias, "q_proj_weight": q_proj_weight,
                  "k_proj_weight": k_proj_weight, "v_proj_weight": v_proj_weight,
                  "out_proj.weight": out_proj_weight, "out_proj.bias": out_proj_bias}
    return decomposed_multi_head_attention(shape, parameters, query, key, value, key_padding_mask, need_weights,
                                           attn_mask, average_attn_weights, is_causal, self_attention=self_attention)


_MULTI_HEAD_ATTENTION_FORWARD = inspect.signature(decomposed_multi_head_attention_forward)
_MULTI_HEAD_ATTENTION = inspect.signature(nn.MultiheadAttention.forward)


def multi_head_attention_forward(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Any:
    """``F.multi_head_attention_forward``: its own values; relevance through its decomposition."""
    if not torch.is_grad_enabled() or not any(carries_relevance(value) for value in args[:3]):
        return function(*args, **kwargs)
    inputs, _ = _bound(_MULTI_HEAD_ATTENTION_FORWARD, args, kwargs)
    training = list(_MULTI_HEAD_ATTENTION_FORWARD.parameters).index("training")

    def exact(*values: Any) -> Any:  # inference semantics: no dropout
        return function(*values[:training], False, *values[training + 1:])

    decomposition = partial(decomposed_multi_head_attention_forward, self_attention=inputs[0] is inputs[1] is inputs[2])
    return decomposed_in_backward(exact, partial(call.decompose, decomposition), *inputs)


register(
    Operation(
        "multihead_attention_forward",
        Spelling(functions=(F.multi_head_attention_forward,)),
        Affine(multi_head_attention_forward, weighted=True),
        description="F.multi_head_attention_forward (nn.MultiheadAttention in code run eagerly): its decomposition",
    )
)


def multi_head_attention(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
    """The module's own values; relevance through :func:`decomposed_multi_head_attention`."""
    module, parameters = function.args
    if not any(carries_relevance(value) for value in args[:3]) or not torch.is_grad_enabled():
        return module(*args, **kwargs)
    inputs, _ = _bound(_MULTI_HEAD_ATTENTION, (module, *args), kwargs)
    decomposition = partial(function, self_attention=inputs[1] is inputs[2] is inputs[3])
    return decomposed_in_backward(module, partial(call.decompose, decomposition), *inputs[1:])


def multi_head_attention_module(module: nn.MultiheadAttention, parameters: dict[str, Any]):
    # Explanations use inference semantics: attention dropout is off, also after the model was
    # put in training mode (the graph calls this copy, which shares the module's parameters).
    return partial(decomposed_multi_head_attention, _evaluation_copy(module), parameters), {}


def _evaluation_copy(module: nn.Module) -> nn.Module:
    twin = copy.copy(module)
    twin.training = False
    return twin


register(
    Operation(
        "multihead_attention",
        Spelling(modules=(nn.MultiheadAttention,), module_function=multi_head_attention_module),
        Affine(multi_head_attention, weighted=True),
        description="nn.MultiheadAttention: projections by the layer rule, products by the Product rule, softmax rule",
    )
)
