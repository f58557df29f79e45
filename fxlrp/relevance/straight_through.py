"""Exact values from the original kernel, relevance from an equivalent decomposition."""

from __future__ import annotations

from torch import Tensor


def with_value_of(exact: Tensor, path: Tensor) -> Tensor:
    """A tensor with the values of ``exact`` whose backward is that of ``path``.

    Used where fxlrp explains an operation through a decomposition that is mathematically the
    same but not bit-identical (fused attention kernels, LayerNorm's fused statistics): the
    model's outputs stay exactly the model's, relevance flows through ``path`` unchanged
    (``exact + (path - path)`` adds an exact zero, whose derivative is the identity).
    """
    return exact.detach() + (path - path.detach())
