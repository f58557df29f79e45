"""Checks that compute nothing: ``torch._assert`` (torchvision's ViT checks input sizes with it)."""

from __future__ import annotations

import torch

from fxlrp.registry import Kind, Operation, register

register(
    Operation(
        "assert",
        Kind.NATIVE,
        functions=(torch._assert,),
        description="torch._assert: a check, carries no relevance",
    )
)
