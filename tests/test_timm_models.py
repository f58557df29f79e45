"""timm models with random weights on small inputs (no network): capture leaves the model as it
found it (LeViT and EfficientFormerV2 fill an attention-bias cache in forward), and weight
standardisation (BiT's StdConv2d, NFNet's ScaledStdConv2d: ``F.batch_norm`` on the weights) runs
natively, the convolution taking the standardised weight as its constant weight."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import relative_error
from test_model_untouched import proxies_in, state_of_attributes
from torch import nn

import fxlrp

timm = pytest.importorskip("timm")


def timm_model(name: str, **settings) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **settings).double().eval()


def image(size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def convert_quietly(model: nn.Module, **settings) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # strict=False lists operations without a rule
        return fxlrp.convert(model, **settings)


@pytest.mark.parametrize(("name", "strict"), [("levit_128s", True), ("efficientformerv2_s0", False)])
def test_converting_twice_leaves_the_attention_bias_cache_alone(name: str, strict: bool) -> None:
    model = timm_model(name, img_size=64)
    x = image(64)
    with torch.no_grad():
        expected = copy.deepcopy(model)(x)  # the model itself stays unrun: its cache empty
    state = {key: value.clone() for key, value in model.state_dict().items()}
    attributes = state_of_attributes(model)
    caches = [module.attention_bias_cache for module in model.modules() if hasattr(module, "attention_bias_cache")]
    assert caches

    explains = [convert_quietly(model, strict=strict) for _ in range(2)]
    assert state_of_attributes(model) == attributes
    assert all(cache == {} for cache in caches) and proxies_in(model) == []
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state.items())
    with torch.no_grad():
        for explain in explains:
            assert relative_error(explain(x), expected) < 1e-12
        assert torch.equal(model(x), expected)

    # Run once, the model holds real attention biases; capture keeps exactly those.
    filled = state_of_attributes(model)
    assert all(list(cache) == ["cpu"] for cache in caches)
    convert_quietly(model, strict=strict)
    assert state_of_attributes(model) == filled and proxies_in(model) == []
    with torch.no_grad():
        assert torch.equal(model(x), expected)
