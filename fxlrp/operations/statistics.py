"""Statistics that normalise: norms, variances, standard deviations and their roots.

ConvNeXt V2's global response normalisation divides by a norm of its input
(``x * (||x|| / mean ||x||)``), EvoNorm by a group's standard deviation (``x / std(x)``), a
hand-written LayerNorm or RMSNorm by ``sqrt(var + eps)`` or multiplies by ``rsqrt(mean(x**2) +
eps)``. fxlrp explains them as it explains ``LayerNorm`` (``normalization.py``): the statistic is
held constant. Its output carries no relevance, so it enters the product or quotient that uses it
as a constant factor, and relevance passes through ``x`` only:

.. math::
    y = x \\cdot c(x) \\ \\text{or}\\ x / c(x) \\quad\\Longrightarrow\\quad
    R_x = x \\frac{\\partial y}{\\partial x}\\Big|_{c \\text{ const}} \\frac{R_y}{y} = R_y

Without that, a product ``x * n(x)`` of two relevance-carrying factors would share its relevance
between them (the uniform product rule), and the half given to ``n(x)`` would return to ``x``
through the statistic's own graph. For a hand-written LayerNorm or RMSNorm under LRP-0 the result
is that of ``F.layer_norm`` / ``F.rms_norm`` (the statistic constant, the centring linear).

``torch.sqrt`` and ``torch.rsqrt`` are held constant as well: models apply them to a variance or a
mean square. A root used as an activation is a power (``x ** 0.5``, ``powers.py``, identity rule).
In ``var_mean`` and ``std_mean`` only the spread is a statistic: the mean is linear, as in
``torch.mean`` and LayerNorm's centring, and takes the z-rule by default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxlrp.operations.helpers import affine, held_constant
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Routed, Spelling, register
from fxlrp.relevance.call import RelevanceCall


def spread_and_mean(
    call: RelevanceCall, function: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``(var or std, mean)``: the spread held constant, the mean by the node's rule (the z-rule
    ``R_j = x_j / (n z) R`` by default), both from the operation's own kernel."""

    def mean_of(*inputs: Any) -> Tensor:
        return function(*inputs, **kwargs)[1]

    spread = held_constant(call, function, *args, **kwargs)[0]
    return spread, affine(call, mean_of, *args)


register(
    Operation(
        "statistic",
        Spelling(
            functions=(
                torch.norm, torch.linalg.norm, torch.linalg.vector_norm, torch.linalg.matrix_norm,
                torch.var, torch.std, torch.sqrt, torch.rsqrt,
            ),
            methods=("norm", "var", "std", "sqrt", "rsqrt"),
        ),
        Routed(held_constant),
        description="norms, var, std, sqrt, rsqrt (normalisers): held constant, like LayerNorm's sigma; "
        "R passes through x in the product or quotient that uses them",
    )
)
register(
    Operation(
        "statistic_and_mean",
        Spelling(functions=(torch.var_mean, torch.std_mean)),
        Affine(spread_and_mean, default_rule=proportional),
        description="var_mean, std_mean: the spread held constant, the mean linear (z-rule)",
    )
)
