"""torchvision functions that capture records as single calls (``torch.fx.wrap``).

- ``stochastic_depth``: the identity at explanation time, like dropout;
- Swin's ``shifted_window_attention``: run with relevance functions inside (see
  :mod:`fxlrp.eager.interpret`): linear projections by the layer rule, ``q k^T`` and
  ``attention @ v`` by the :class:`~fxlrp.rules.attention.Product` rule, softmax by its rule, the
  relative position bias and the shift mask as constants added to the scores (z-rule);
- ``_patch_merging_pad``: padding and strided slices, a copy routed by its native backward;
- ``_get_relative_position_bias``: computed from parameters only, it carries no relevance.
"""

from __future__ import annotations

from fxlrp.eager.interpret import interpret
from fxlrp.operations.helpers import identity
from fxlrp.registry import Kind, Operation, register

try:
    from torchvision.models import swin_transformer
    from torchvision.ops import stochastic_depth
except ImportError:  # torchvision is optional for fxlrp's core
    swin_transformer = stochastic_depth = None

if stochastic_depth is not None:
    register(
        Operation(
            "stochastic_depth",
            Kind.NATIVE,
            functions=(stochastic_depth,),
            relevance=identity,
            description="stochastic depth: the identity at explanation time",
        )
    )
if swin_transformer is not None:
    register(
        Operation(
            "window_attention",
            Kind.AFFINE,
            functions=(swin_transformer.shifted_window_attention,),
            relevance=interpret,
            weighted=True,
            description="Swin window attention, run with relevance functions inside",
        )
    )
    register(
        Operation(
            "patch_merging_pad",
            Kind.NATIVE,
            functions=(swin_transformer._patch_merging_pad,),
            description="Swin patch merging: padding and strided slices (a copy)",
        )
    )
    register(
        Operation(
            "relative_position_bias",
            Kind.NATIVE,
            functions=(swin_transformer._get_relative_position_bias,),
            description="Swin relative position bias: from parameters only, carries no relevance",
        )
    )
