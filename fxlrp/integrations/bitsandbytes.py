"""bitsandbytes' 8-bit and 4-bit linear layers: refused, in one line saying what to do.

``Linear8bitLt`` quantizes its input as well as its weight (its output is not the linear map of a
dequantized weight) and moves its quantization state between its weight and a state object on its
first call; ``Linear4bit`` repacks its weight for the CPU's kernel when it runs without gradients.
fxlrp has no rule for their kernels (``bnb.matmul``, ``bnb.matmul_4bit``), and a conversion's
trace of their ``forward`` would write symbolic values into that state. So the layers are single
calls that capture does not trace into, and ``bnb.matmul``/``bnb.matmul_4bit`` single calls of the
parts run eagerly (a transformers model loaded with ``BitsAndBytesConfig``); an explanation that
reaches either raises :class:`~fxlrp.errors.UnsupportedOperationError` naming what to do instead.
"""

from __future__ import annotations

from typing import Any

from fxlrp.errors import UnsupportedOperationError
from fxlrp.operations.helpers import module_as_function
from fxlrp.registry import Operation, Routed, Spelling, register
from fxlrp.relevance.call import RelevanceCall

try:
    import bitsandbytes
    from bitsandbytes.nn import Linear4bit, Linear8bitLt
except ImportError:  # (bitsandbytes is optional; the loader imports this module only when it is imported)
    bitsandbytes = None

REFUSED = (
    "bitsandbytes' 8-bit and 4-bit layers (Linear8bitLt, Linear4bit) are not explained by fxlrp: load the model "
    "without bitsandbytes' quantization_config (in bfloat16 or float16 for less memory), or quantize it with torchao "
    "(quantize_(model, Int8WeightOnlyConfig()), TorchAoConfig) or optimum-quanto (QuantoConfig), whose layers fxlrp "
    "explains as the linear map of their dequantized weights (docs/large-models.md)"
)


def refused(call: RelevanceCall, function: Any, *args: Any, **kwargs: Any) -> Any:
    """Raise :class:`~fxlrp.errors.UnsupportedOperationError` with :data:`REFUSED`."""
    raise UnsupportedOperationError(REFUSED)


if bitsandbytes is not None:
    register(
        Operation(
            "bitsandbytes_linear",
            Spelling(
                functions=(bitsandbytes.matmul, bitsandbytes.matmul_4bit),
                module_bases=(Linear8bitLt, Linear4bit),
                module_function=module_as_function,
                leaf=True,  # (not traced into: their forward writes into the layer's quantization state)
            ),
            Routed(refused),
            description="bitsandbytes' 8-bit and 4-bit linear layers: refused (see docs/large-models.md)",
        )
    )
