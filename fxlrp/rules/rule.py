"""The base of the rules: :class:`Rule`, and :class:`StabilisedRule` with a stabiliser and
zennit's ``zero_params``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from fxlrp.relevance import terms
from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.rule_function import KeptOutput
from fxlrp.relevance.terms import ZeroParams

Stabiliser = float | Callable[[Tensor], Tensor]
"""A number ``eps`` (zennit's sign-preserving shift) or a function ``z -> stabilised z``."""
Relevance = tuple[Tensor | None, ...]


class Rule:
    """Base class of the rules for affine operations.

    The engine's contract is :class:`~fxlrp.relevance.rule_function.AffineRule`: ``prepare``
    computes parameter transforms once per conversion; ``forward`` returns the layer's output and
    the state ``backward`` needs; ``backward`` returns the relevance of each input (None for
    inputs that carry none), given the output relevance and, if :meth:`keeps_output`, the kept
    output (which a ReLU may have rectified; equal to the output wherever relevance arrives).
    Subclasses override these methods; their documentation here holds for the overrides.
    """

    shares_by_input_values: bool = True
    """Whether an input's relevance is its value times a factor, ``R_j = x_j c_j`` (epsilon, z+,
    gamma, alpha-beta): it vanishes with the input. False for rules that share by the weights or
    by bounds (flat, w^2, z^B), which give an input of 0 relevance too."""
    gates_rectified_relevance: bool = False
    """Whether :meth:`backward` applies the gate of a ReLU that rectified the kept output in place
    itself (:attr:`~fxlrp.relevance.rule_function.KeptOutput.ungated`), after its quotient; False:
    the relevance it receives has passed the gate."""

    def prepare(self, layer: AffineLayer) -> Any:
        """Compute what the rule needs of the layer's parameters, once per conversion.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation with its parameters.

        Returns
        -------
        Any
            The prepared state (modified parameters, for instance), handed to :meth:`forward`,
            :meth:`keeps_output` and :meth:`has_gradient_form`; None if the rule needs none.
        """
        return None

    def keeps_output(self, prepared: Any) -> bool:
        """Whether ``backward`` reads the output's values (its denominator or signs).

        Parameters
        ----------
        prepared : Any
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        bool
            True if :meth:`backward` receives the kept output.
        """
        return False

    def forward(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> tuple[Tensor, Any]:
        """Run the layer and keep what the rule's backward needs.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        inputs : sequence
            The operation's inputs (tensors that carry relevance, and other values).
        prepared : Any
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        output : Tensor
            The layer's output, as the layer computes it. Computed outside autograd (under
            ``torch.no_grad``) and not kept (:meth:`keeps_output`), it becomes the relevance
            Function's output itself, so ``state`` must not hold it (a root of the rule's inner
            graph is held by its gradient edge, :func:`~fxlrp.relevance.rule_function.gradient_root`).
        state : Any
            What :meth:`backward` receives as ``state``.
        """
        raise NotImplementedError

    def backward(self, layer: AffineLayer, state: Any, relevance: Tensor, output: KeptOutput | None) -> Relevance:
        """Share the output's relevance among the inputs.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        state : Any
            What :meth:`forward` returned as its state.
        relevance : Tensor
            The relevance of the output, of the output's shape.
        output : KeptOutput or None
            The kept output if :meth:`keeps_output`, else None.

        Returns
        -------
        tuple of (Tensor or None)
            The relevance of each input, None for inputs that carry none.
        """
        raise NotImplementedError

    def builds_graph(self, layer: AffineLayer, inputs: Sequence[Any], prepared: Any) -> bool:
        """Whether :meth:`forward` or :meth:`backward` records an autograd graph of the inputs.

        Where none does, the engine hands the rule the inputs themselves (held for backward by
        autograd, which refuses them if written in place), not aliases of them that are leaves
        of an inner graph: one operation fewer per input.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        inputs : sequence
            The operation's inputs.
        prepared : Any
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        bool
            False where the rule only reads its inputs' values; True by default.
        """
        return True

    def has_gradient_form(self, prepared: Any = None) -> bool:
        """Whether the rule is a modified gradient, ``R_x = x * (modified J)^T (R / z)``.

        See :mod:`fxlrp.relevance.form`; a rule in the gradient form runs
        :meth:`gradient_forward`.

        Parameters
        ----------
        prepared : Any, optional
            What :meth:`prepare` returned for the layer.

        Returns
        -------
        bool
            True if :meth:`gradient_forward` runs the rule.
        """
        return False

    def gradient_forward(self, layer: AffineLayer, inputs: Sequence[Any]) -> Tensor:
        """The layer's output, whose autograd backward is the rule in the gradient form.

        Parameters
        ----------
        layer : AffineLayer
            The affine operation.
        inputs : sequence
            The operation's inputs.

        Returns
        -------
        Tensor
            The output, recorded so that its gradient is the modified gradient of the rule.
        """
        raise NotImplementedError

    def gradient_is_native(self) -> bool:
        """Whether :meth:`gradient_forward` is the layer's own operation.

        Its native gradient is then the rule in the gradient form, and the operation runs as it
        is, with no rule machinery.

        Returns
        -------
        bool
            True if the layer's native gradient is the rule.
        """
        return False

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items() if not name.startswith("_"))
        return f"{type(self).__name__}({fields})"


class StabilisedRule(Rule):
    """A rule with a stabiliser and zennit's ``zero_params``.

    The stabiliser is named ``stabilizer`` as in zennit, ``epsilon`` for the epsilon rule.

    Parameters
    ----------
    stabilizer : float or callable, default 1e-6
        A number ``eps`` (``s(z) = z + eps (sign(z) + [z = 0])``) or a function ``z -> s(z)``.
    zero_params : str or sequence of str, optional
        ``"weight"``, ``"bias"`` or both: set to 0 in every modified copy of the layer.
    """

    stabiliser_name = "stabilizer"

    def __init__(self, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None) -> None:
        setattr(self, self.stabiliser_name, stabilizer if callable(stabilizer) else float(stabilizer))
        self.zero_params = sorted(terms.zero_parameter_names(zero_params))
        self._stabiliser = terms.Stabiliser.of(stabilizer)
        self._zero = frozenset(self.zero_params)

    def scaled(self, relevance: Tensor, denominator: Tensor, layer: AffineLayer, **how: Any) -> Tensor:
        """``R / s(z)`` with this rule's stabiliser ``s``, a fresh tensor.

        Parameters
        ----------
        relevance : Tensor
            The output relevance ``R``.
        denominator : Tensor
            The denominator ``z``.
        layer : AffineLayer
            The operation; its ``warn_lost_relevance`` decides whether dropped relevance warns.
        **how
            Passed on to :func:`fxlrp.relevance.terms.scaled` (``sign``, ``owned``).

        Returns
        -------
        Tensor
            ``R / s(z)``, a tensor the caller owns.
        """
        return terms.scaled(relevance, denominator, self._stabiliser, warn_lost_relevance=layer.warn_lost_relevance,
                            **how)
