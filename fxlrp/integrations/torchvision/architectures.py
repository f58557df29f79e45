"""torchvision functions of its classifiers and video models that capture records as single calls (``torch.fx.wrap``).

- ``stochastic_depth``: the identity at explanation time, like dropout;
- Swin's ``shifted_window_attention`` (and Swin3D's): run with relevance functions inside (see
  :mod:`fxlrp.eager.interpret`): linear projections by the layer rule, ``q k^T`` and
  ``attention @ v`` by the :class:`~fxlrp.rules.attention.Product` rule, softmax by its rule, the
  relative position bias and the shift mask as constants added to the scores (z-rule);
- ``_patch_merging_pad``: padding and strided slices, a copy routed by its native backward;
- ``_get_relative_position_bias``: computed from parameters only, it carries no relevance;
- MViT's ``_unsqueeze``/``_squeeze`` (views) and its relative positions and pooled shortcut (run
  with relevance functions inside).
"""

from __future__ import annotations

from fxlrp.eager.interpret import interpret
from fxlrp.operations.helpers import identity
from fxlrp.registry import Affine, Native, Operation, Routed, Spelling, register

try:
    from torchvision.models import swin_transformer
    from torchvision.models.video import mvit
    from torchvision.models.video import swin_transformer as swin_transformer_3d
    from torchvision.ops import stochastic_depth
except ImportError:  # torchvision is optional for fxlrp's core
    swin_transformer = stochastic_depth = mvit = swin_transformer_3d = None


if stochastic_depth is not None:
    register(
        Operation(
            "stochastic_depth",
            Spelling(functions=(stochastic_depth,)),
            Routed(identity),
            description="stochastic depth: the identity at explanation time",
        )
    )
if swin_transformer is not None:
    register(
        Operation(
            "window_attention",
            Spelling(functions=(swin_transformer.shifted_window_attention,)),
            Affine(interpret, weighted=True),
            description="Swin window attention, run with relevance functions inside",
        )
    )
    register(
        Operation(
            "patch_merging_pad",
            Spelling(functions=(swin_transformer._patch_merging_pad,)),
            Native(),
            description="Swin patch merging: padding and strided slices (a copy)",
        )
    )
    register(
        Operation(
            "relative_position_bias",
            Spelling(functions=(swin_transformer._get_relative_position_bias,)),
            Native(),
            description="Swin relative position bias: from parameters only, carries no relevance",
        )
    )


if swin_transformer_3d is not None:
    register(
        Operation(
            "window_attention_3d",
            Spelling(functions=(swin_transformer_3d.shifted_window_attention_3d,)),
            Affine(interpret, weighted=True),
            description="Swin3D window attention, run with relevance functions inside (as the 2D one)",
        )
    )
if mvit is not None:
    register(
        Operation(
            "mvit_reshape",
            Spelling(functions=(mvit._unsqueeze, mvit._squeeze)),
            Native(),
            description="MViT's adding and removing of a dimension: a view, routed by its native backward",
        )
    )
    register(
        Operation(
            "mvit_attention_pieces",
            Spelling(functions=(mvit._add_rel_pos, mvit._add_shortcut)),
            Affine(interpret, weighted=True),
            description="MViT's relative positions added to the attention scores (q times the position tables: linear "
            "in q) and its pooled shortcut (a sum), run with relevance functions inside",
        )
    )
