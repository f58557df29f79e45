"""Hugging Face transformers: its activation modules are activations.

Several of transformers' activation modules compute a smooth elementwise activation from
elementary torch operations rather than one torch function: GPT-2's default ``gelu_new``
(``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``), ``gelu_fast``,
``gelu_accurate``, ``quick_gelu`` (``x * sigmoid(1.702 x)``), and the Python forms of ``gelu``,
``gelu_python_tanh`` and ``mish``. Run operation by operation, such a formula is a product of two
relevance-carrying factors, ``x`` and ``1 + tanh(...)``, which the product rule would split, and
part of the relevance would go round the ``tanh``'s argument. AttnLRP (and LXT) explain an
activation as one elementwise map with the identity rule, ``R_in = R_out``. Registering the
modules as activations gives them that rule: a captured graph keeps them as single nodes, and
code run eagerly (every Hugging Face model) hands the call of their ``forward`` to the rule as a
whole. Their output is marked as an activation, so CP-LRP treats it as the constant gating factor
where it gates a product (GeGLU), as it does for ``F.gelu``.

Importing this module registers them. ``fxlrp.convert`` imports it whenever transformers is
imported (:mod:`fxlrp.integrations`); ``import fxlrp`` alone does not (the core never imports
transformers).
"""

from __future__ import annotations

from transformers import activations

from fxlrp.operations.helpers import module_as_function, passes
from fxlrp.registry import Kind, Operation, register
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
)

ACTIVATION_MODULES: tuple[type, ...] = tuple(
    dict.fromkeys(getattr(activations, name) for name in _NAMES if hasattr(activations, name))
)
"""transformers' smooth elementwise activation modules that get the identity rule as a whole."""

TRANSFORMERS_ACTIVATION = register(
    Operation(
        "transformers_activation",
        Kind.PASS,
        # The forward functions are intercepted when a model runs eagerly (their ``self`` carries
        # no relevance, so relevance passes to the input); the module types keep a captured
        # graph's call as one node.
        functions=tuple(dict.fromkeys(module_type.forward for module_type in ACTIVATION_MODULES)),
        modules=ACTIVATION_MODULES,
        relevance=passes(None, role=ACTIVATION),
        module_function=module_as_function,
        leaf=True,
        description="Hugging Face transformers' activation modules (gelu_new, gelu_fast, quick_gelu, ...): "
        "smooth elementwise activations, identity rule R_in = R_out",
    )
)
