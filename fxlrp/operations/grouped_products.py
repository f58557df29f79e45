"""Grouped matrix products: ``torch._grouped_mm`` (``F.grouped_mm``), a matrix product per group of rows.

``_grouped_mm(x, w, offs=offs)`` multiplies the rows of ``x`` between consecutive offsets by one
matrix of ``w`` each: the experts of a mixture-of-experts layer in one kernel (transformers 5's
default ``grouped_mm`` experts). With the weights constant it is a linear layer in ``x``, whose
rule the composite gives, run on the same kernel (outputs stay the model's); its native
vector-Jacobian product is the pull-back. Both factors carrying relevance fall to the
:class:`~fxlrp.rules.Product` rule, as for ``matmul``.
"""

from __future__ import annotations

import torch

from fxlrp.operations.products import matrix_product
from fxlrp.registry import Kind, Operation, register

if hasattr(torch, "_grouped_mm"):  # torch >= 2.8
    register(
        Operation(
            "grouped_mm",
            Kind.AFFINE,
            functions=(torch._grouped_mm,),
            relevance=matrix_product,
            weighted=True,
            description="grouped matrix product (mixture-of-experts): a layer in the factor that carries relevance",
        )
    )
