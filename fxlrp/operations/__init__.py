"""Registry entries, one file per family of operations. Importing this package registers them."""

from fxlrp.operations import (  # noqa: F401
    elementwise,
    layers,
    neutral,
    scatter,
    sums,
)
