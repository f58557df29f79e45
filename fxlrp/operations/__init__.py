"""Registry entries, one file per family of operations. Importing this package registers them."""

from fxlrp.operations import (  # noqa: F401
    elementwise,
    graph,
    layers,
    neutral,
    scatter,
    sums,
)
