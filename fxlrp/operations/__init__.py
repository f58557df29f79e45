"""Registry entries, one file per family of operations. Importing this package registers them.

``torchvision_ops`` is registered when torchvision is in use (see :mod:`fxlrp.registry.integrations`).
"""

from fxlrp.operations import (  # noqa: F401
    affine_maps,
    attention,
    checks,
    elementwise,
    embeddings,
    gating,
    graph,
    layers,
    neutral,
    normalization,
    patches,
    powers,
    products,
    recurrent,
    resampling,
    scatter,
    statistics,
    sums,
)
