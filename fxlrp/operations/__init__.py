"""Registry entries, one file per family of operations. Importing this package registers them.

torchvision's, PyG's and transformers' operations are registered when the library is in use
(:mod:`fxlrp.integrations`).
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
    sparse,
    statistics,
    sums,
)
