"""fxlrp support for tests/support/extending_plugin, loaded as an integration (docs/extending.md)."""

from fxlrp.operations.helpers import affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Affine, Operation, Spelling, register
from support import extending_plugin

register(
    Operation(
        "shifted_sum",
        # a Python function: recorded as one call instead of traced into
        Spelling(functions=(extending_plugin.shifted_sum,), leaf=True),
        Affine(affine, default_rule=proportional),
        description="extending_plugin.shifted_sum: a sum plus a constant (the z-rule)",
    )
)
