"""Checks that compute nothing: ``torch._assert`` (torchvision's ViT checks input sizes with it)."""

from __future__ import annotations

import torch

from fxlrp.registry import Native, Operation, Spelling, register

register(
    Operation(
        "assert",
        Spelling(functions=(torch._assert,)),
        Native(),
        description="torch._assert: a check, carries no relevance",
    )
)
