"""One autograd Function for every rule on every affine operation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from fxlrp.errors import UnsupportedOperationError
from fxlrp.relevance.form import gradient_form_active, gradient_is_native, require_relevance_form, scaled_gradient
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.stabilise import constant_like


def carries_relevance(value: Any) -> bool:
    """Whether relevance flows along ``value``: only tensors that depend on the explained inputs.

    The explainer detaches every parameter of the model, so ``requires_grad`` marks exactly those
    tensors - except the parameters of modules the model builds while it runs (BigBird switching
    its attention to a new module, a layer built in ``forward``): an ``nn.Parameter`` never
    carries relevance.

    Parameters
    ----------
    value : Any
        An operation's argument.

    Returns
    -------
    bool
        True for a tensor that requires gradients and is no ``nn.Parameter``.
    """
    return isinstance(value, Tensor) and value.requires_grad and type(value) is not nn.Parameter


def gradient_root(output: Tensor) -> GradientEdge:
    """Where ``torch.autograd.grad`` starts for ``output``, without keeping its values alive.

    A rule that needs the values keeps the tensor itself.

    Parameters
    ----------
    output : Tensor
        A tensor recorded by autograd.

    Returns
    -------
    GradientEdge
        Its gradient edge.
    """
    return get_gradient_edge(output)


@dataclass
class KeptOutput:
    """A layer's output kept from forward for a rule that reads its values in backward.

    The rule reads the epsilon rule's denominator, say, or the gamma rule's output signs. The
    engine owns it, not the rule:

    - a ReLU (or another clipping activation) that is the output's only consumer may replace
      ``values`` by its own output (:func:`hand_over_activation`) or rectify them in place
      (:func:`rectify_in_place`, after which ``sign`` is ``+1.0``: the values are ``>= 0``); the
      two are equal wherever relevance arrives, and the next layer keeps the activation anyway;
    - ``version`` makes a later in-place change of the values an error instead of a silently
      changed denominator;
    - the rule takes the values in backward (:meth:`take`), so that their memory is free once read.
    """

    values: Tensor | None
    """The output's values; None once taken, or where :attr:`recompute` computes them."""
    version: int
    """The values' version counter when they were kept."""
    sign: float | None = None
    """The sign every value has (``+1.0`` after :func:`rectify_in_place`), if known."""
    recompute: Callable[[], Tensor] | None = None
    """Instead of ``values``: computes them again in backward (a normalisation's output, from its
    input, which the rule before it keeps anyway; see :func:`_recompute_from_input`)."""
    ungated: bool = False
    """Whether the relevance the rule receives has not passed the gate of the ReLU that rectified
    ``values`` in place (:func:`rectify_in_place`): a rule that says it gates itself
    (``gates_rectified_relevance``) applies it, ``threshold_backward(q, values, 0)``, to its
    elementwise quotient ``q = R / d``, where it also zeroes the quotient at the outputs the ReLU
    cut off, whatever ``d`` is there (0 included)."""

    def take(self) -> Tensor:
        """The values, which this object then no longer holds.

        Returns
        -------
        Tensor
            The kept values, or the values :attr:`recompute` computes.
        """
        values, self.values = self.values, None
        return self.recompute() if values is None and self.recompute is not None else values


_reusable: ContextVar[bool] = ContextVar("fxlrp_reusable_graph", default=False)
_reused: ContextVar[bool] = ContextVar("fxlrp_graph_reused", default=False)


@runtime_checkable
class AffineRule(Protocol):
    """How the relevance ``R_k`` of an affine operation's outputs is shared among its inputs ``x_j``.

    The outputs are ``z_k = sum_j x_j w_jk + b_k``. ``prepare`` computes parameter transforms
    once per conversion (cached per weight); ``forward`` returns the layer's output and the state
    ``backward`` needs; ``backward`` returns the relevance of each input (None for inputs that
    carry none) from the output relevance and, if ``keeps_output``, the kept output (a
    :class:`KeptOutput`). A rule that is a modified gradient, ``R_x = x * (modified J)^T (R / z)``,
    says so (``has_gradient_form``) and gives the layer whose autograd backward is that gradient
    (``gradient_forward``); ``gradient_is_native``: that layer is the operation itself (LRP-0, the
    z-rule). :class:`fxlrp.rules.Rule` documents each method.
    """

    def prepare(self, layer: AffineLayer) -> Any: ...

    def keeps_output(self, prepared: Any) -> bool: ...

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]: ...

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor,
                 output: KeptOutput | None) -> tuple[Tensor | None, ...]: ...

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool: ...

    def has_gradient_form(self, prepared: Any = None) -> bool: ...

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor: ...

    def gradient_is_native(self) -> bool: ...



@contextmanager
def reusable_graph() -> Iterator[None]:
    """Relevance Functions created while active may go backward more than once.

    By default a rule's inner graph is consumed by its backward (freed as soon as relevance has
    passed). Created under this context, a :class:`RuleFunction` keeps it: the rule's backward
    runs its vector-Jacobian products with ``retain_graph`` (:func:`graph_reused`), so one
    forward can serve several output relevances through ``torch.autograd.grad(...,
    retain_graph=True)`` (one explanation per node of a graph).

    Yields
    ------
    None
    """
    token = _reusable.set(True)
    try:
        yield
    finally:
        _reusable.reset(token)


def graph_reused() -> bool:
    """Whether the rule running its backward now must keep its inner graph.

    Returns
    -------
    bool
        True inside the backward of a :class:`RuleFunction` created under
        :func:`reusable_graph`.
    """
    return _reused.get()


_recomputed_now: ContextVar[tuple[tuple[Tensor, Tensor], ...]] = ContextVar("fxlrp_recomputed_inputs", default=())


def writable_recomputation(value: Any) -> Tensor | None:
    """The values of ``value`` if the rule running its backward now recomputed it for itself.

    See :func:`recomputation_of`. No one else reads these values, and they are freed with the
    rule's state, so the rule may write into them. (Not into the leaf itself: the leaves of every
    rule reading one tensor share its version counter, so a write through one would make the
    others' graphs refuse their saved inputs.)

    Parameters
    ----------
    value : Any
        One of the rule's inputs.

    Returns
    -------
    Tensor or None
        The recomputed values; None if ``value`` is no input recomputed for this rule.
    """
    for leaf, values in _recomputed_now.get():
        if value is leaf:
            return values
    return None


_USED_UP = object()
"""A rule state after a backward pass that freed it."""
_USED_UP_MESSAGE = (
    "fxlrp: this forward's relevance graph was used up by an earlier backward pass (each "
    "layer frees what its rule kept, to save memory). Run the explainer's forward again "
    "for each further explanation, or run that forward inside "
    "fxlrp.relevance.rule_function.reusable_graph() and pass retain_graph=True"
)


def _taken(ctx: Any) -> tuple[Any, KeptOutput | None]:
    """The rule's state and kept output, after which the Function holds neither."""
    state, kept, ctx.state, ctx.kept = ctx.state, ctx.kept, _USED_UP, None
    return state, kept


class RuleFunction(torch.autograd.Function):
    """Forward: the layer's own operation. Backward: the rule's relevance.

    The rule runs the operation (and any modified copies its formula needs) once in forward,
    under autograd, so backward gets native vector-Jacobian products from
    ``torch.autograd.grad`` without recomputing anything.
    """

    @staticmethod
    def forward(ctx, layer: AffineLayer, rule: AffineRule, prepared: Any, *inputs: Any) -> Tensor:
        """Run the rule's forward on leaves of the inputs and keep its state.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        layer : AffineLayer
            The affine operation.
        rule : AffineRule
            Its rule.
        prepared : Any
            What ``rule.prepare`` returned for the layer.
        *inputs
            The operation's inputs.

        Returns
        -------
        Tensor
            The layer's output (detached from the rule's inner graph).
        """
        ctx.reusable = _reusable.get()
        recipes = [] if ctx.reusable else _recomputations(inputs)
        builds_graph = rule.builds_graph(layer, inputs, prepared)
        if builds_graph:
            # Tensors are held as aliases of their own: code run eagerly may give the Python object
            # another tensor afterwards (fxlrp.eager.in_place.replace_values, for an in-place write).
            leaves = tuple(
                value.detach().requires_grad_() if carries_relevance(value)
                else value.detach() if isinstance(value, Tensor) else value
                for value in inputs
            )
            ctx.held = None
        else:
            # The rule reads values only: the inputs themselves, held for backward by autograd, whose
            # saved tensors are immune to that (and refuse a write in place), in a list that backward
            # fills with them (:func:`_held_inputs`) before the rule reads the list it kept; inputs
            # recomputed in backward (:func:`recomputation_of`) are not held.
            leaves = ctx.held = list(inputs)
            ctx.save_for_backward(*(value for index, value in enumerate(inputs)
                                    if isinstance(value, Tensor) and not (recipes and recipes[index])))
        with torch.enable_grad():
            output, state = rule.forward(layer, leaves, prepared)
        ctx.layer, ctx.rule, ctx.state = layer, rule, state
        ctx.rectified = False  # (set by rectify_in_place: this backward then runs the ReLU's gate)
        ctx.carrying = tuple(carries_relevance(value) for value in inputs)
        ctx.kept = KeptOutput(output, output._version) if rule.keeps_output(prepared) else None
        ctx.recomputed = _release_recomputable(leaves, recipes, builds_graph) if any(recipes) else ()
        if not ctx.reusable:
            _recompute_from_input(ctx, layer, inputs)
        kept = ctx.kept is not None and ctx.kept.values is not None  # (not where recomputed in backward)
        if output.requires_grad or kept or output._is_view() or any(output is value for value in (*inputs, *leaves)):
            # Cut from the rule's inner graph, and another object than the one kept (the Function's
            # output refers to its node, which would refer back to it: neither would be freed).
            return output.detach()
        return output  # computed outside autograd and kept by nobody: the Function's output as it is

    @staticmethod
    def backward(ctx, relevance: Tensor) -> tuple[Tensor | None, ...]:
        """The rule's relevance of each input.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        relevance : Tensor
            The relevance of the output.

        Returns
        -------
        tuple of (Tensor or None)
            None for ``layer``, ``rule`` and ``prepared``, then the relevance of each input (None
            for inputs that carry none).

        Raises
        ------
        RuntimeError
            If a backward pass has already used up the rule's state (outside
            :func:`reusable_graph`), or the kept output was modified in place.
        """
        if ctx.state is _USED_UP:
            raise RuntimeError(_USED_UP_MESSAGE)
        if ctx.kept is not None and ctx.kept.values is not None:
            _check_unchanged(ctx.kept.values, ctx.kept.version, "the output of a layer",
                             "its relevance rule would divide by changed values")
        if ctx.held is not None:
            _held_inputs(ctx)
        if ctx.rectified and not ctx.kept.ungated:  # the ReLU rectify_in_place ran unrecorded: its gradient's gate
            relevance = torch.ops.aten.threshold_backward(relevance, ctx.kept.values, 0)
        recomputed = _restore_recomputed(ctx.recomputed, ctx.held)
        # The restored values live as long as the rule's state (taken below), not as long as the
        # whole graph: held here too, every recomputed input of the model would be alive at once
        # by the end of backward.
        ctx.recomputed = ()
        if ctx.reusable:  # (recomputes nothing)
            token = _reused.set(True)
            kept = None if ctx.kept is None else replace(ctx.kept)  # the rule takes from a copy
            try:
                input_relevance = ctx.rule.backward(ctx.layer, ctx.state, relevance, kept)
            finally:
                _reused.reset(token)
        else:
            # State and kept output are handed over, not kept here: a rule may drop what it has
            # read (the epsilon rule frees the kept output before its VJP, lowering backward's peak).
            state, kept = _taken(ctx)
            recomputed_token = _recomputed_now.set(recomputed)
            try:
                input_relevance = ctx.rule.backward(ctx.layer, state, relevance, kept)
            finally:
                _recomputed_now.reset(recomputed_token)
            del state, kept, recomputed
            ctx.held = None  # (the rule's state held the list too: the inputs are free now)
        routed = tuple(
            relevance_of_input if carrying else None
            for relevance_of_input, carrying in zip(input_relevance, ctx.carrying, strict=False)
        )
        return (None, None, None, *routed)


class StabilisedGradient(torch.autograd.Function):
    r"""A rule with a stabiliser in the gradient form (:mod:`fxlrp.relevance.form`): forward, the
    identity on a layer's output ``z``; backward, the gradient times ``share * z / s(z)``.

    The epsilon rule ``R_x = x * J^T (R_z / s(z))``, ``s(z) = z + epsilon (sign(z) + [z = 0])``,
    carries ``g = R / value`` as

    .. math::
        g_x = J^T \Big( g_z \frac{z}{s(z)} \Big), \qquad
        g_z \frac{z}{s(z)} = g_z \frac{|z|}{|z| + \epsilon} = g_z - \frac{\epsilon \, g_z}{|z| + \epsilon}

    (one ``addcdiv`` on ``|z| + epsilon``), with ``J^T`` the layer's native backward; a product of
    ``N`` relevance-carrying factors (:class:`~fxlrp.rules.Product`) takes ``share = 1 / N`` of it.
    No rule divides by its output or multiplies by its input: the layer keeps its output only
    (:class:`KeptOutput`, which a ReLU after it may rectify in place, as under :class:`RuleFunction`:
    the factor is then 0 where the ReLU cut, which is the ReLU's gate). At ``z = 0`` the factor is
    0: the relevance ``z g_z`` of such an output is 0 in the gradient form, where the relevance
    form would share relevance that reached it from a rule that gives a zero input relevance (the
    identity rule of an activation with ``f(0) != 0``) among contributions that sum to
    ``-b / epsilon`` times it.
    """

    @staticmethod
    def forward(ctx, output: Tensor, epsilon: float, share: float, recompute: Callable[[], Tensor] | None) -> Tensor:
        """The identity, keeping ``output``.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        output : Tensor
            The layer's output ``z``.
        epsilon : float
            The stabiliser's ``epsilon`` (> 0).
        share : float
            The share of the gradient the layer's inputs get (1, or ``1 / N`` for a product).
        recompute : callable or None
            Computes ``output`` again in backward, instead of keeping it
            (:func:`output_recomputation`).

        Returns
        -------
        Tensor
            ``output``'s values (another tensor object, whose node this is).
        """
        ctx.epsilon, ctx.share, ctx.rule, ctx.rectified = epsilon, share, None, False
        ctx.reusable = _reusable.get()
        if saved_through_hooks():
            # Under gradient checkpointing (or save_on_cpu) the output goes where autograd's saved
            # tensors go, freed and recomputed with the checkpointed layer; no ReLU then rectifies it
            # in place (``kept`` is None: a ReLU after it runs natively, gating the gradient itself).
            ctx.save_for_backward(output)
            ctx.kept = None
            return output.detach()
        # (the input itself is kept: only this Function reads it, and it refers to the layer's node,
        # not to this one; the output is another tensor object, whose node this is)
        recomputed = recompute is not None and not ctx.reusable
        ctx.kept = KeptOutput(None if recomputed else output, output._version,
                              recompute=recompute if recomputed else None)
        return output.detach()

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor | None, None, None, None]:
        """``share * (g - epsilon g / (|z| + epsilon))``.

        Parameters
        ----------
        ctx : FunctionCtx
            Autograd's context.
        gradient : Tensor
            The gradient ``g_z`` of the output.

        Returns
        -------
        tuple
            The scaled gradient, None for ``epsilon``, ``share`` and ``recompute``.

        Raises
        ------
        RuntimeError
            If a backward pass has already used up the kept output (outside
            :func:`reusable_graph`), or it was modified in place.
        """
        kept = ctx.kept
        saved = ctx.saved_tensors if kept is None else ()  # (read once: a checkpoint unpacks once)
        if saved:  # (saved through saved-tensor hooks, which check the version themselves)
            kept = KeptOutput(saved[0], 0)
        elif kept is None:
            raise RuntimeError(_USED_UP_MESSAGE)
        elif kept.values is not None:
            _check_unchanged(kept.values, kept.version, "the output of a layer",
                             "its relevance rule would divide by changed values")
        if not ctx.reusable:
            ctx.kept = None
        values = replace(kept).take() if ctx.reusable else kept.take()
        # (Rectified in place by a ReLU, the values are 0 where it cut: the factor |z| / (|z| + eps)
        # is 0 there, the ReLU's gate, which needs no pass of its own.)
        if torch.is_grad_enabled():  # (a backward that records, create_graph=True)
            values = values.detach()
        magnitude = values if kept.sign == 1.0 else values.abs()  # (|z| itself where a ReLU rectified it)
        owned = magnitude is not values
        del values  # (a kept output |z| was made from is freed before the stabiliser's result is made)
        return (stabilised(gradient, magnitude, ctx.epsilon, ctx.share, owned=owned, non_negative=True),
                None, None, None)


def stabilised(gradient: Tensor, output: Tensor, epsilon: float, share: float = 1.0, *, owned: bool = False,
               non_negative: bool = False) -> Tensor:
    r"""The epsilon rule's gradient form at a layer's output ``z`` (:class:`StabilisedGradient`):

    .. math::
        \mathrm{share} \cdot g \frac{z}{s(z)} = \mathrm{share} \Big( g - \frac{\epsilon \, g}{|z| + \epsilon} \Big)

    in one ``addcdiv`` on ``|z| + epsilon`` (and a product by ``share`` where it is not 1).
    ``gradient`` is never written into.

    Parameters
    ----------
    gradient : Tensor
        ``g``, the gradient of ``z`` (of ``output``'s shape).
    output : Tensor
        ``z``.
    epsilon : float
        The stabiliser (>= 0), taken as ``output``'s dtype holds it (0: ``share * g``).
    share : float, default 1.0
        The share of the layer's inputs (``1 / N`` for a product of ``N`` relevance-carrying factors).
    owned : bool, default False
        Whether ``output`` may be overwritten (a fresh intermediate of the caller's): ``|z| +
        epsilon`` and the result are then written into it.
    non_negative : bool, default False
        Whether ``output`` is ``|z|`` already (a rectified output).

    Returns
    -------
    Tensor
        The stabilised gradient.
    """
    recording = torch.is_grad_enabled()  # (a backward that records, create_graph=True)
    epsilon = _held_in(epsilon, output.dtype)
    if epsilon == 0.0:  # (or flushed by the dtype)
        return gradient * share if share != 1.0 else gradient
    in_place = owned and not recording
    magnitude = output if non_negative else output.abs_() if in_place else output.abs()
    # |z| + epsilon, written into ``output`` or into a fresh |z|
    stabiliser = constant_like(output, epsilon)
    denominator = (magnitude.add_(stabiliser) if in_place or not recording and magnitude is not output
                   else magnitude + stabiliser)
    del magnitude, output
    writable = not recording and denominator.shape == gradient.shape and denominator.dtype == gradient.dtype
    scaled = (torch.addcdiv(gradient, gradient, denominator, value=-epsilon, out=denominator) if writable
              else torch.addcdiv(gradient, gradient, denominator, value=-epsilon))
    if share != 1.0:
        scaled = scaled * share if recording else scaled.mul_(share)
    return scaled


def stabilised_gradient(output: Tensor, epsilon: float, share: float = 1.0,
                        recompute: Callable[[], Tensor] | None = None) -> Tensor:
    """``output``, whose gradient is ``share * g z / s(z)`` on its way back (:class:`StabilisedGradient`).

    Parameters
    ----------
    output : Tensor
        A layer's output ``z``, recorded by autograd.
    epsilon : float
        The stabiliser's ``epsilon`` (>= 0).
    share : float, default 1.0
        The inputs' share (``1 / N`` for a product of ``N`` relevance-carrying factors).
    recompute : callable, optional
        Computes ``output`` again in backward, which is then not kept (:func:`output_recomputation`).

    Returns
    -------
    Tensor
        ``output`` itself for ``epsilon = 0`` and ``share = 1``; a view scaling its gradient by
        ``share`` for ``epsilon = 0`` (or an ``epsilon`` that ``output``'s dtype flushes to 0);
        else ``output``'s values through :class:`StabilisedGradient`.
    """
    epsilon = _held_in(epsilon, output.dtype)
    if epsilon == 0.0:  # (or flushed by the dtype)
        return scaled_gradient(output, share)
    return StabilisedGradient.apply(output, epsilon, share, recompute)


@functools.lru_cache(maxsize=64)
def _held_in(number: float, dtype: torch.dtype) -> float:
    """``number`` as ``dtype`` holds it: the stabiliser added to ``|z|`` and the one ``addcdiv``
    scales by are then the same number, so that ``g - eps g / (0 + eps)`` is 0 (bfloat16 holds 1e-6
    as 9.98e-7)."""
    return float(torch.tensor(number, dtype=dtype))


def saved_through_hooks() -> bool:
    """Whether saved-tensor hooks are active (``torch.utils.checkpoint``'s, ``save_on_cpu``): what a
    Function saves for backward then goes through them, what it holds itself does not.

    Returns
    -------
    bool
        True inside such hooks.
    """
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def _keeps_output(node: Any) -> bool:
    """Whether ``node`` is the backward node of a relevance Function that may keep its output
    (:class:`RuleFunction`, :class:`StabilisedGradient`), whose ``kept`` a ReLU after it may hand
    over or rectify."""
    return isinstance(node, (RuleFunction._backward_cls, StabilisedGradient._backward_cls))


def _check_unchanged(tensor: Tensor, version: int, what: str, consequence: str) -> None:
    """An error where a tensor kept from forward was modified in place before backward."""
    if tensor._version != version:
        raise RuntimeError(
            f"fxlrp: {what} was modified in place after the forward pass, so {consequence}; do not "
            "modify the explainer's intermediate outputs in place between forward and backward"
        )


def recomputation_of(value: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor] | None:
    """How to compute ``value`` again from a tensor that is kept anyway.

    A rule reading ``value`` may then keep nothing of its own for it and recompute it in backward:
    in an MLP ``fc2(gelu(fc1(x)))`` the epsilon rule of ``fc1`` keeps its output for its
    denominator, and ``fc2`` would otherwise keep the activation beside it (one hidden-sized tensor
    per block of a transformer).

    Parameters
    ----------
    value : Tensor
        A relevance-carrying tensor.

    Returns
    -------
    tuple of (callable, Tensor) or None
        ``(function, source)`` with ``value == function(source)`` where ``value`` is the output
        of a pure elementwise activation (GELU, SiLU, ...; see ``apply_pass(recomputable=True)``)
        whose input ``source`` is kept anyway, as the output of the rule that computed it; else
        None.
    """
    node = value.grad_fn
    function = getattr(node, "recompute_with", None)
    if function is None:
        return None
    producer, _ = node.next_functions[0]
    if not isinstance(producer, RuleFunction._backward_cls) or producer.kept is None:
        return None
    source = producer.kept.values
    if source is None or storage_identity(source) != node.source_identity:
        return None  # the rule keeps another tensor (an activation's output handed over)
    return function, source


def _recompute_from_input(ctx: Any, layer: AffineLayer, inputs: Sequence[Any]) -> None:
    """Let a layer that is cheap to compute again (a normalisation: ``layer.recomputable``) keep
    nothing of its output where :func:`output_recomputation` allows; and let the layers that read
    its output recompute it too (through :func:`recomputation_of`: a transformer's q, k, v
    projections and first MLP layer would each keep it otherwise: one hidden-sized tensor per
    normalisation, which the gradient does not keep).
    """
    recompute = output_recomputation(layer, inputs)
    if recompute is None:
        return
    ctx.recompute_with, ctx.source_identity = recompute.from_values, storage_identity(inputs[0])
    if ctx.kept is not None:
        ctx.kept = KeptOutput(None, ctx.kept.version, recompute=recompute)


def output_recomputation(layer: AffineLayer, inputs: Sequence[Any]) -> Callable[[], Tensor] | None:
    """How a layer cheap to compute again (a normalisation: ``layer.recomputable``) computes its
    output again in backward, where its one input is the kept output of the rule before it (a
    residual sum, as before every LayerNorm of a transformer), instead of keeping it: for its own
    rule's denominator.

    Parameters
    ----------
    layer : AffineLayer
        The layer.
    inputs : sequence
        Its inputs.

    Returns
    -------
    callable or None
        A function of no arguments giving the output (checking that the kept input is unchanged),
        with ``from_values(value)``, the layer on other values; None where the layer is not
        recomputable or its input not kept.
    """
    if not layer.recomputable or len(inputs) != 1 or not carries_relevance(inputs[0]):
        return None
    source = inputs[0]
    producer = source.grad_fn
    if not _keeps_output(producer) or producer.kept is None:
        return None
    kept = producer.kept.values
    if kept is None or storage_identity(kept) != storage_identity(source):
        return None
    version = kept._version

    def from_values(value: Tensor) -> Tensor:
        with torch.no_grad():
            return layer.forward([value])

    def recompute() -> Tensor:
        _check_unchanged(kept, version, "the input of a normalisation",
                         "its output cannot be recomputed for its relevance rule")
        return from_values(kept)

    recompute.from_values = from_values
    return recompute


def storage_identity(tensor: Tensor) -> tuple[int, torch.Size, tuple[int, ...]]:
    """Which values a tensor shows: where they start, their shape and strides.

    Parameters
    ----------
    tensor : Tensor
        The tensor.

    Returns
    -------
    tuple
        ``(data_ptr, shape, stride)``.
    """
    return tensor.data_ptr(), tensor.shape, tensor.stride()


def _held_inputs(ctx: Any) -> None:
    """Fill the list of inputs a rule that builds no graph holds with the tensors autograd saved
    for it (the values of forward, whatever Python objects stand for them now); in a backward that
    records (``create_graph=True``), as leaves of their own, as the rules that build a graph get
    them."""
    try:
        saved = iter(ctx.saved_tensors)
    except RuntimeError as error:  # (autograd's check of the saved tensors' versions)
        raise RuntimeError(
            "fxlrp: the input of a layer was modified in place after the forward pass, so its relevance rule "
            "would multiply by changed values; do not modify the explainer's intermediate outputs in place "
            "between forward and backward"
        ) from error
    recording = torch.is_grad_enabled()
    ctx.held[:] = [
        value if not isinstance(value, Tensor)
        else next(saved).detach().requires_grad_() if recording and carries_relevance(value) else next(saved)
        for value in ctx.held
    ]


def _recomputations(inputs: Sequence[Any]) -> list[tuple[Callable[[Tensor], Tensor], Tensor] | None]:
    """:func:`recomputation_of` each input (None for those that carry no relevance)."""
    return [recomputation_of(value) if carries_relevance(value) else None for value in inputs]


def _release_recomputable(
    leaves: list[Any] | tuple[Any, ...], recipes: Sequence[tuple[Callable[[Tensor], Tensor], Tensor] | None],
    builds_graph: bool,
) -> tuple[Any, ...]:
    """Let go of the values of recomputable inputs: a rule that builds a graph keeps its leaves
    (the roots of its inner graph) without memory; one that reads values only holds None in their
    place in its list of inputs (``leaves``), which autograd did not save. :func:`_restore_recomputed`
    brings them back."""
    released = []
    for index, (leaf, recipe) in enumerate(zip(leaves, recipes, strict=True)):
        if recipe is not None:
            function, source = recipe
            layout = (leaf.shape, leaf.stride(), leaf.dtype)
            released.append((leaf if builds_graph else index, layout, function, source, source._version))
            if builds_graph:
                leaf.data = leaf.new_empty(0)
            else:
                leaves[index] = None
    return tuple(released)


def _restore_recomputed(released: Sequence[Any], held: list[Any] | None) -> tuple[tuple[Tensor, Tensor], ...]:
    """The released inputs' values computed again, into their leaves or their places in ``held``;
    pairs of the input the rule reads and the values it may write into (none in a backward that
    records: there the input is a leaf of its own)."""
    restored = []
    for slot, layout, function, source, version in released:
        _check_unchanged(source, version, "the input of an activation",
                         "the activation's output cannot be recomputed for relevance")
        with torch.no_grad():
            values = function(source)
        if (values.shape, values.stride(), values.dtype) != layout:
            raise RuntimeError(
                f"fxlrp: recomputing {function!r} in backward gave a tensor of another layout than in "
                "forward (was the forward run under autocast or another mode the backward is not?); "
                "run the explainer's forward and backward under the same modes"
            )
        if isinstance(slot, int):  # (a leaf of its own, relevance-carrying as the input it stands for)
            held[slot] = values.requires_grad_()
            if torch.is_grad_enabled():  # a backward that records (create_graph=True) reads it unchanged
                continue
            slot = values
        else:
            slot.data = values
        restored.append((slot, values))
    return tuple(restored)


def hand_over_activation(output: Tensor, activated: Tensor) -> None:
    """Let the rule that computed ``output`` keep ``activated`` in its place.

    For ``activated = relu(output)`` (or another activation that equals its input wherever its
    gradient is not zero: ReLU6, hardtanh, clamp, threshold) whose sole consumer is this
    activation: relevance reaches ``output`` only where ``activated == output``, so the rule's
    denominator may be read from ``activated``. The next layer keeps ``activated`` anyway, and
    ``output`` is freed: one activation-sized tensor less per layer than holding both. Does
    nothing when ``output`` does not come straight from a rule that keeps it.

    Parameters
    ----------
    output : Tensor
        The layer's output, the activation's input.
    activated : Tensor
        The activation's output.
    """
    node = output.grad_fn
    if not _keeps_output(node) or node.kept is None or node.kept.values is None:
        return
    kept = node.kept.values
    if kept.shape != activated.shape or kept.dtype != activated.dtype:
        return
    node.kept = KeptOutput(activated, activated._version)


_outputs_recorded: ContextVar[bool] = ContextVar("fxlrp_outputs_recorded", default=False)


@contextmanager
def outputs_recorded() -> Iterator[None]:
    """Rectify no output in place while the block runs.

    While intermediate outputs are recorded for their relevance (``attribute_nodes``), the
    recorded tensor must keep its values and history.

    Yields
    ------
    None
    """
    token = _outputs_recorded.set(True)
    try:
        yield
    finally:
        _outputs_recorded.reset(token)


def rectify_in_place(output: Tensor) -> bool:
    """``torch.relu_`` on the output of a rule whose only consumer is that ReLU.

    What the model's own ``ReLU(inplace=True)`` does, and as safe here: nothing else reads the
    pre-activation, and a rule that keeps the output sees the activation's values, which is
    :func:`hand_over_activation` without allocating a second tensor. The kept output is then
    known to be ``>= 0`` (``KeptOutput.sign``).

    Where the rule keeps the output itself, the ReLU is not recorded by autograd: the rule's
    Function applies the ReLU's gradient (``threshold_backward`` of the relevance by the kept
    values, the kernel ReLU's own backward runs) before its rule, so a layer and its ReLU are one
    node of the backward graph, not two (each node costs its Python and the saving and
    unpacking of the ReLU's output); a rule with ``gates_rectified_relevance`` applies it itself
    (:attr:`KeptOutput.ungated`).

    Parameters
    ----------
    output : Tensor
        The ReLU's input.

    Returns
    -------
    bool
        True if ``output`` was rectified; False (and nothing done) where the output does not
        come straight from a rule or is being recorded (:func:`outputs_recorded`).
    """
    node = output.grad_fn
    if _outputs_recorded.get() or not _keeps_output(node):
        return False
    kept = node.kept.values if node.kept is not None else None
    if kept is not None and storage_identity(kept) == storage_identity(output):
        with torch.no_grad():
            torch.relu_(output)
        node.rectified = True
    else:
        torch.relu_(output)
    if kept is not None:  # the kept tensor shares storage and version
        ungated = node.rectified and getattr(node.rule, "gates_rectified_relevance", False)  # (no rule: gated)
        node.kept = KeptOutput(kept, kept._version, sign=1.0, ungated=ungated)
    return True


def apply_rule(layer: AffineLayer, rule: AffineRule, prepared: Any, *inputs: Any) -> Tensor:
    """Compute ``layer`` on ``inputs``; in backward, propagate relevance by ``rule``.

    Without any relevance-carrying input (constants, parameters, integer shapes) the operation
    runs natively; in the gradient form (:mod:`fxlrp.relevance.form`) the rule's modified gradient
    runs (natively, for the epsilon rule with ``epsilon = 0``).

    Parameters
    ----------
    layer : AffineLayer
        The affine operation.
    rule : AffineRule
        Its rule.
    prepared : Any
        What ``rule.prepare`` returned for the layer.
    *inputs
        The operation's inputs.

    Returns
    -------
    Tensor
        The layer's output, whose backward propagates relevance by ``rule``.

    Raises
    ------
    GradientFormUnavailable
        In the gradient form, for a rule that has none.
    UnsupportedOperationError
        For complex relevance-carrying inputs the rule cannot explain
        (:func:`refuse_complex_relevance`).
    """
    if not torch.is_grad_enabled() or not any(carries_relevance(value) for value in inputs):
        return layer.forward(inputs)
    if gradient_form_active():
        if not rule.has_gradient_form(prepared) or layer.warn_lost_relevance:
            require_relevance_form(repr(rule))
        if not gradient_is_native(rule):
            refuse_complex_relevance(inputs)
        return rule.gradient_forward(layer, inputs)
    refuse_complex_relevance(inputs)
    return RuleFunction.apply(layer, rule, prepared, *inputs)


def refuse_complex_relevance(inputs: Sequence[Any]) -> None:
    """Refuse relevance-carrying complex inputs of a rule.

    Rules divide relevance by the values they explain, which for complex values mixes their two
    parts: a sum of two complex tensors under the z-rule would not give the relevance of the
    same sum on real pairs. Complex tensors are explained through views and products with
    complex factors (:func:`fxlrp.operations.products.complex_product`), and, where a rule's
    gradient form is the native gradient (epsilon 0), by autograd; anything else is refused.

    Parameters
    ----------
    inputs : sequence
        The operation's inputs.

    Raises
    ------
    UnsupportedOperationError
        If a relevance-carrying input is complex.
    """
    for value in inputs:
        if carries_relevance(value) and value.is_complex():
            raise UnsupportedOperationError(
                "fxlrp has no relevance rule for this operation on complex numbers (it explains them through "
                "views, as view_as_complex and view_as_real, and products, as a rotary embedding's): compute it "
                "on real and imaginary parts (torch.view_as_real), or explain with epsilon 0, whose "
                "relevance is the modified gradient (AttnLRP(0.0), Epsilon(0.0))")
