"""LRP rules for affine operations, declared over the term engine (:mod:`fxlrp.relevance.terms`).

A rule says how the relevance ``R_k`` of the outputs ``z_k = sum_j x_j w_jk + b_k`` of an affine
operation is shared among its inputs ``x_j``. Rules know nothing of tracing: they receive an
:class:`~fxlrp.relevance.AffineLayer` and its inputs, run what their formula needs in forward and
turn the output relevance into input relevance in backward with native vector-Jacobian products.
Memory is the engine's business (:mod:`fxlrp.relevance.rule_function`): a rule that reads its
output's values in backward says so (:meth:`Rule.keeps_output`) and receives them as a
:class:`~fxlrp.relevance.rule_function.KeptOutput`.

The definitions are zennit 0.5.1's, bias handling included. Notation used in the docstrings:
``x+ = max(x, 0)``, ``x- = min(x, 0)``, likewise ``w+``, ``w-``, ``b+``, ``b-``; ``f(x; w, b)`` is
the layer with parameters ``(w, b)``, and ``s(z)`` the stabiliser (``z + eps (sign(z) + [z = 0])``
for a number ``eps``, or any callable). ``zero_params`` (``"weight"``, ``"bias"`` or both) sets
those parameters to 0 in every modified copy of the layer, as zennit does.

One module per family: :mod:`~fxlrp.rules.rule` (the base classes), :mod:`~fxlrp.rules.epsilon`,
:mod:`~fxlrp.rules.two_halves` (alpha-beta, z+, gamma), :mod:`~fxlrp.rules.bounded` (z^B),
:mod:`~fxlrp.rules.input_independent` (flat, w^2), :mod:`~fxlrp.rules.identity`,
:mod:`~fxlrp.rules.products` and :mod:`~fxlrp.rules.softmax`; this package names them all. Beside
them: :mod:`fxlrp.rules.composites` (which rule each operation of a model gets) and
:mod:`fxlrp.rules.attention` (the conventions for attention and gating, CP-LRP).
"""

from fxlrp.rules.bounded import ZBox, expand_bound
from fxlrp.rules.epsilon import Epsilon, Norm
from fxlrp.rules.identity import Pass
from fxlrp.rules.input_independent import Flat, InputIndependent, WSquare
from fxlrp.rules.products import DEFAULT_PRODUCT_EPSILON, Product
from fxlrp.rules.rule import Rule, StabilisedRule, Stabiliser
from fxlrp.rules.softmax import AttentionAsConstant, SoftmaxRule
from fxlrp.rules.two_halves import AlphaBeta, Gamma, TwoHalves, ZPlus

__all__ = [
    "AlphaBeta",
    "AttentionAsConstant",
    "DEFAULT_PRODUCT_EPSILON",
    "Epsilon",
    "Flat",
    "Gamma",
    "InputIndependent",
    "Norm",
    "Pass",
    "Product",
    "Rule",
    "SoftmaxRule",
    "StabilisedRule",
    "Stabiliser",
    "TwoHalves",
    "WSquare",
    "ZBox",
    "ZPlus",
    "expand_bound",
]
