"""fxlrp for JAX: LRP for any JAX function (Flax linen and NNX models, graph networks) by rewriting its jaxpr.

``explain = fxlrp.jax.convert(fn, composite, *example_inputs)`` traces ``fn`` and returns a
function with the same outputs whose ``jax.vjp`` gives relevance; ``fxlrp.jax.attribute(explain,
inputs, target=...)`` gives the relevance of the inputs. The rules and composites are those of
:mod:`fxlrp.rules` (their parameters are read, their formulas computed on JAX arrays by
:mod:`fxlrp.jax.formulas`). Importing this package imports :mod:`fxlrp.rules`, hence torch;
``import fxlrp`` never imports JAX.
"""

from fxlrp.jax.explain import Explanation, attribute, convert, start_relevance

__all__ = ["Explanation", "attribute", "convert", "start_relevance"]
