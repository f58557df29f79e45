"""What an fxlrp.jax explanation costs against gradient x input, both compiled with ``jax.jit``.

A Flax ResNet-style CNN with random weights (a 3x3 stem, ``--blocks`` residual blocks of two 3x3
convolutions with ReLU, average pooling between stages, a global mean and a dense head), a batch
of ``--batch`` images of 32x32x3 in float32, explained at each image's predicted class:

- ``gxi``: ``x * jax.grad(lambda x: (f(x) * onehot).sum())(x)`` under ``jax.jit``;
- ``lrp``: ``fxlrp.jax.attribute(fxlrp.jax.convert(f, composite, x), x)`` under ``jax.jit``, for
  LRP-0 (``Epsilon(0)``), ``Epsilon(1e-6)`` and ``EpsilonPlusFlat`` (z+ on convolutions: one
  more convolution per layer, ``z+ = conv(x, w+)``; its backward convolution, with ``w+``, takes
  the place of the gradient's).

And a pre-norm Flax transformer (``--layers`` blocks of single-head attention and a GELU MLP with
LayerNorm, width 128, ``--batch`` sequences of 128 tokens' embeddings), explained by ``AttnLRP``
and ``AttnLRP(0)`` against gradient x input at the embeddings.

Reported: the time to trace and convert, the time of the first (compiling) call of each, the
median of ``--repeats`` calls (each waited for with ``block_until_ready``, the two alternating
so that both see the same machine state), and the median of the paired ratios lrp / gxi of calls
that ran one after the other; and, from the compiled programs, the number of convolutions and
matrix products and XLA's count of floating-point operations, against gradient x input's (the
floor of a rule that must compute more than a gradient: z+ needs ``z+ = f(x; w+)`` per layer).

Run: ``.venv/bin/python benchmarks/jax_cost.py [--blocks 4] [--layers 4] [--batch 32] [--repeats 30]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import fxlrp.jax as fxjax
from fxlrp.rules import Epsilon, composites


class ResNetStyle(nn.Module):
    """A small ResNet-style CNN (no BatchNorm)."""

    blocks: int = 4
    width: int = 32

    @nn.compact
    def __call__(self, x: Any) -> Any:
        h = nn.relu(nn.Conv(self.width, (3, 3))(x))
        for block in range(self.blocks):
            residual = h
            h = nn.relu(nn.Conv(self.width, (3, 3))(h))
            h = nn.relu(nn.Conv(self.width, (3, 3))(h) + residual)
            if block % 2 == 1:
                h = nn.avg_pool(h, (2, 2), (2, 2))
        return nn.Dense(10)(h.mean(axis=(1, 2)))


class Transformer(nn.Module):
    """A small pre-norm transformer on embeddings, mean-pooled into a 10-class head."""

    layers: int = 4
    width: int = 128

    @nn.compact
    def __call__(self, x: Any) -> Any:
        for _ in range(self.layers):
            n = nn.LayerNorm()(x)
            q, k, v = (nn.Dense(self.width)(n) for _ in range(3))
            weights = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / self.width ** 0.5, axis=-1)
            x = x + nn.Dense(self.width)(weights @ v)
            x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
        return nn.Dense(10)(x.mean(axis=1))


def compiled_work(function: Callable[[Any], Any], inputs: Any) -> tuple[int, int, float]:
    """Convolutions, matrix products and floating-point operations of ``function`` as XLA compiled it."""
    compiled = function.lower(inputs).compile()
    text = compiled.as_text()
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, list) else costs
    return text.count(" convolution("), text.count(" dot("), float(costs.get("flops", float("nan")))


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--models", default="cnn,transformer", help="which of cnn, transformer to run")
    options = parser.parse_args()

    cnn = ResNetStyle(blocks=options.blocks)
    images = jax.random.normal(jax.random.PRNGKey(0), (options.batch, 32, 32, 3), jnp.float32)
    transformer = Transformer(layers=options.layers)
    tokens = jax.random.normal(jax.random.PRNGKey(2), (options.batch, 128, 128), jnp.float32)
    print(f"device: {jax.devices()[0]}; float32")
    if "cnn" in options.models:
        compare(f"ResNet-style CNN, {options.blocks} blocks, batch {options.batch} x 32 x 32 x 3", cnn, images,
                (("LRP-0", Epsilon(0.0)), ("Epsilon", Epsilon(1e-6)),
                 ("EpsilonPlusFlat", composites.EpsilonPlusFlat())), options.repeats)
    if "transformer" in options.models:
        compare(f"transformer, {options.layers} layers, batch {options.batch} x 128 tokens x 128", transformer,
                tokens, (("AttnLRP", composites.AttnLRP()), ("AttnLRP(0)", composites.AttnLRP(0.0))), options.repeats)


def compare(title: str, model: nn.Module, inputs: Any, rules: Any, repeats: int) -> None:
    """Time gradient x input and each composite's explanation of ``model`` on ``inputs``."""
    apply = functools.partial(model.apply, model.init(jax.random.PRNGKey(1), inputs))

    @jax.jit
    def gxi(x: Any) -> Any:
        def score(x: Any) -> Any:
            out = apply(x)
            return (out * jax.nn.one_hot(jnp.argmax(jax.lax.stop_gradient(out), -1), out.shape[-1])).sum()
        return jax.grad(score)(x) * x

    print(title)
    print(f"  gxi              first call (compiles) {timed(lambda: gxi(inputs)):8.3f} s")
    reference = compiled_work(gxi, inputs)
    print(f"  gxi              compiled: {reference[0]} convolutions, {reference[1]} matrix products, "
          f"{reference[2]:.3g} flops")
    for name, composite in rules:
        start = time.perf_counter()
        explain = fxjax.convert(apply, composite, inputs)
        convert_time = time.perf_counter() - start
        lrp = jax.jit(lambda x, explain=explain: fxjax.attribute(explain, x))
        print(f"  {name:16s} convert (trace) {convert_time:8.3f} s, first call (compiles) "
              f"{timed(lambda: lrp(inputs)):8.3f} s")
        work = compiled_work(lrp, inputs)
        print(f"  {name:16s} compiled: {work[0]} convolutions, {work[1]} matrix products, {work[2]:.3g} flops "
              f"({work[2] / reference[2]:.2f}x gxi's)")
        gxi_times, lrp_times, ratios = [], [], []
        for repeat in range(repeats):
            pair = [timed(lambda: gxi(inputs)), timed(lambda: lrp(inputs))]
            if repeat % 2:
                pair = [timed(lambda: lrp(inputs)), timed(lambda: gxi(inputs))][::-1]
            gxi_times.append(pair[0])
            lrp_times.append(pair[1])
            ratios.append(pair[1] / pair[0])
        print(f"  {name:16s} median call {1e3 * statistics.median(lrp_times):8.2f} ms; gxi "
              f"{1e3 * statistics.median(gxi_times):8.2f} ms; paired ratio lrp / gxi {statistics.median(ratios):.2f}")

if __name__ == "__main__":
    main()
