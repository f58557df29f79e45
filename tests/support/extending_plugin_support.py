"""fxlrp support for tests/support/extending_plugin, loaded as an integration (docs/extending.md)."""

from fxlrp.operations.helpers import affine
from fxlrp.operations.sums import proportional
from fxlrp.registry import Kind, Operation, register
from support import extending_plugin

register(
    Operation(
        "shifted_sum",
        Kind.AFFINE,
        functions=(extending_plugin.shifted_sum,),
        leaf=True,  # a Python function: recorded as one call instead of traced into
        relevance=affine,
        default_rule=proportional,
        description="extending_plugin.shifted_sum: a sum plus a constant (the z-rule)",
    )
)
