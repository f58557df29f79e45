"""A stand-in third-party library for tests/integrations/test_extending.py: one function fxlrp does not know."""

import torch


def shifted_sum(x: torch.Tensor, shift: float = 1.0) -> torch.Tensor:
    """``sum(x, -1) + shift``: affine in ``x``."""
    return x.sum(dim=-1) + shift
