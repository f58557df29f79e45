"""Registry entries, one file per family of operations. Importing this package registers them."""

from fxlrp.operations import (  # noqa: F401
    attention,
    checks,
    elementwise,
    gating,
    graph,
    layers,
    neutral,
    normalization,
    products,
    scatter,
    sums,
    torchvision_ops,
)
