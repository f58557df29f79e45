"""torchvision's video transformers (Swin3D, MViT v1 and v2) and RAFT optical flow, strictly.

References: the model's own outputs bit for bit; conservation of relevance in bias-free models
under LRP-0 with CP-LRP's products (the sum of the input relevance equals the explained logit,
an independent number: the model's output). Small configurations of the same classes, random
weights, no downloads.
"""

from __future__ import annotations

import pytest
import torch
from support.references import explained_relevance, onehot_relevance, relative_error
from torch import Tensor, nn

import fxlrp
from fxlrp.rules.attention import cp_lrp
from fxlrp.rules.composites import Composite

torchvision = pytest.importorskip("torchvision")
from torchvision.models import optical_flow  # noqa: E402
from torchvision.models.video.mvit import MSBlockConfig, MViT  # noqa: E402
from torchvision.models.video.swin_transformer import SwinTransformer3d  # noqa: E402

CONSERVING = Composite(fxlrp.rules.Epsilon(0.0), operation_rules=cp_lrp(0.0))
"""LRP-0 on layers and products (CP-LRP), the z-rule on sums and norms, identity rules."""
ZEROED = ("bias", "class_token", "pos_embedding", "spatial_pos", "temporal_pos", "class_pos")


def small_swin3d() -> nn.Module:
    torch.manual_seed(0)
    return SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[1, 2],
                             window_size=[2, 4, 4], num_classes=5)


def small_mvit(version: int) -> nn.Module:
    torch.manual_seed(0)
    blocks = [MSBlockConfig(1, 16, 16, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 2, 2]),
              MSBlockConfig(2, 16, 32, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 1, 1])]
    version_settings = {  # (v1: no relative positions, shortcut pooled without the class token's)
        1: dict(rel_pos_embed=False, proj_after_attn=False, residual_pool=False, residual_with_cls_embed=True),
        2: dict(rel_pos_embed=True, proj_after_attn=True, residual_pool=True, residual_with_cls_embed=False),
    }
    return MViT(spatial_size=(32, 32), temporal_size=4, block_setting=blocks, num_classes=5,
                patch_embed_kernel=(3, 7, 7), patch_embed_stride=(2, 4, 4), patch_embed_padding=(1, 3, 3),
                **version_settings[version])


MODELS = {"swin3d": small_swin3d, "mvit_v1": lambda: small_mvit(1), "mvit_v2": lambda: small_mvit(2)}


def clip(dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(2, 3, 4, 32, 32, dtype=dtype, generator=torch.Generator().manual_seed(1))


def bias_free(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.rsplit(".", 1)[-1].endswith(ZEROED):
                tensor.zero_()
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_video_transformers_convert_strictly_and_give_their_own_outputs(name: str) -> None:
    model, x = MODELS[name]().eval(), clip()
    explain = fxlrp.convert(model, strict=True)
    assert torch.equal(explain(x), model(x))
    leaf = x.clone().requires_grad_()
    output = explain(leaf)
    output.backward(onehot_relevance(output, 2))
    assert torch.isfinite(leaf.grad).all() and (leaf.grad != 0).any()
    rows = explain.report().all_rows
    wanted = {"swin3d": "window_attention_3d", "mvit_v1": "mvit_reshape", "mvit_v2": "mvit_attention_pieces"}[name]
    assert any(row.operation == wanted for row in rows)


@pytest.mark.parametrize("name", list(MODELS))
def test_bias_free_video_transformers_conserve_relevance(name: str) -> None:
    model, x = bias_free(MODELS[name]()).double().eval(), clip(torch.float64)
    explain = fxlrp.convert(model, CONSERVING, strict=True)
    [relevance] = explained_relevance(explain, [x], lambda output: onehot_relevance(output, 1))
    with torch.no_grad():
        expected = model(x)[:, 1]
    assert torch.isfinite(relevance).all()
    assert torch.allclose(relevance.sum((1, 2, 3, 4)), expected, rtol=1e-9, atol=0)
    assert (expected != 0).all()


def test_raft_converts_strictly_and_explains_a_region_of_the_flow_over_both_frames() -> None:
    torch.manual_seed(0)
    model = optical_flow.raft_small(weights=None).eval()
    generator = torch.Generator().manual_seed(1)
    first, second = torch.rand(1, 3, 128, 128, generator=generator), torch.rand(1, 3, 128, 128, generator=generator)
    explain = fxlrp.convert(model, strict=True)
    expected = model(first, second, num_flow_updates=2)
    leaves = [first.clone().requires_grad_(), second.clone().requires_grad_()]
    flows = explain(*leaves, num_flow_updates=2)
    assert len(flows) == len(expected)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(flows, expected, strict=True))
    start = torch.zeros_like(flows[-1])
    start[:, 0, 40:60, 50:70] = flows[-1][:, 0, 40:60, 50:70].detach()  # horizontal flow of a region
    flows[-1].backward(start)
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all() and (leaf.grad != 0).any()
    operations = {row.operation: row.handling for row in explain.report().all_rows}
    assert operations["instance_norm"] == "rule" and operations["grid_sample"] == "rule"  # (its encoder, lookups)


@pytest.mark.slow
def test_a_region_of_the_flow_is_the_sum_of_its_parts_over_both_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    # fxlrp.Region with the flow's component as the class: R = u at the region's pixels. Relevance
    # is linear in where it starts, so the region's explanation is the sum of its halves' (each
    # explained on its own), to float64 rounding. (torchvision makes RAFT's coordinate grid in
    # float32 whatever the model's precision: in float64 here, so that the reference is exact.)
    from torchvision.models.optical_flow import raft

    in_float32 = raft.make_coords_grid
    monkeypatch.setattr(raft, "make_coords_grid", lambda *args, **kwargs: in_float32(*args, **kwargs).double())
    torch.manual_seed(0)
    model = optical_flow.raft_small(weights=None).double().eval()
    generator = torch.Generator().manual_seed(1)
    first, second = (torch.rand(1, 3, 128, 128, dtype=torch.float64, generator=generator) for _ in range(2))
    explain = fxlrp.convert(model, strict=True)
    last = lambda flows: flows[-1]  # noqa: E731 - the final flow, after the last update
    whole = fxlrp.Region(0, box=(20, 24, 30, 32))
    halves = [fxlrp.Region(0, box=(20, 24, 25, 32)), fxlrp.Region(0, box=(25, 24, 30, 32))]
    region = fxlrp.attribute(explain, (first, second, 1), target=whole, output=last)[:2]
    parts = fxlrp.attribute(explain, (first, second, 1), target=halves, output=last)[:2]
    for frame, summed in zip(region, parts, strict=True):
        assert torch.isfinite(frame).all() and frame.abs().sum() > 0  # (both frames)
        assert relative_error(frame, summed.sum(dim=0)) < 1e-12


@pytest.mark.slow
def test_raft_conserves_relevance_but_for_the_estimate_it_detaches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bias-free RAFT in float64, LRP-0 with CP-LRP's products, R = u (the horizontal flow) at
    # every pixel of the last prediction. After one update the frames' relevance sums to the flow
    # explained (the correlation's product, its pyramid, grid sampling at constant positions, the
    # GRU's gated sums and the upsampling all conserve). Each later update starts from
    # ``coords1.detach()`` (RAFT's own: no gradient through the previous estimate), so the last
    # flow is upsample(f_prev + delta) with f_prev a constant: its share leaves the explanation,
    # and the last flow head's output keeps exactly sum(upsample(delta)_u) (the upsampling is
    # linear in the flow). (The motion encoder also
    # reads the detached flow, a constant input that takes a bias's share of its convolution.)
    from torchvision.models.optical_flow import raft

    in_float32 = raft.make_coords_grid
    monkeypatch.setattr(raft, "make_coords_grid", lambda *args, **kwargs: in_float32(*args, **kwargs).double())
    torch.manual_seed(0)
    model = bias_free(optical_flow.raft_small(weights=None)).double().eval()
    generator = torch.Generator().manual_seed(1)
    first, second = (torch.rand(1, 3, 128, 128, dtype=torch.float64, generator=generator) for _ in range(2))
    explain = fxlrp.convert(model, CONSERVING)
    sums: dict[str, list[Tensor]] = {"h in": [], "x in": [], "h out": [], "delta": []}
    values: dict[str, list[Tensor]] = {"delta": []}

    def follow(name: str, tensor: Tensor) -> None:
        if tensor.requires_grad:
            tensor.register_hook(lambda relevance: sums[name].append(relevance.sum()))

    def gru(module: nn.Module, args: tuple, output: Tensor) -> None:
        follow("h in", args[0]), follow("x in", args[1]), follow("h out", output)

    def head(module: nn.Module, args: tuple, output: Tensor) -> None:
        values["delta"].append(output.detach())
        follow("delta", output)

    handles = [model.update_block.recurrent_block.register_forward_hook(gru),
               model.update_block.flow_head.register_forward_hook(head)]
    assert model.mask_predictor is None  # (raft_small upsamples bilinearly: 8 x interpolate, linear in the flow)
    try:
        for updates in (1, 2):
            for collected in (*sums.values(), *values.values()):
                collected.clear()
            leaves = [first.clone().requires_grad_(), second.clone().requires_grad_()]
            flow = explain(*leaves, num_flow_updates=updates)[-1]
            start = torch.zeros_like(flow)
            start[:, 0] = flow[:, 0].detach()
            flow.backward(start)
            total = leaves[0].grad.sum() + leaves[1].grad.sum()
            for into_h, into_x, out_of in zip(sums["h in"], sums["x in"], sums["h out"], strict=True):
                assert abs(into_h + into_x - out_of) <= 1e-9 * out_of.abs()  # (each update's GRU)
            kept = raft.upsample_flow(values["delta"][-1])[:, 0].sum()
            assert abs(sums["delta"][0] - kept) <= 1e-9 * kept.abs()  # (the last update's)
            if updates == 1:
                assert abs(total - start.sum()) <= 1e-9 * start.sum().abs()
            else:  # (the detached estimate's share is not small: it is the first update's flow)
                assert abs(start.sum() - kept) > 0.1 * start.sum().abs()
    finally:
        for handle in handles:
            handle.remove()
