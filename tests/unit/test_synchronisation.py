"""An explanation reads no tensor values on the host while it runs, where that would make a GPU
wait: at most one read per call (the finiteness checks, together at the end), none with
``check_finite=False``.

Counted on the CPU with a dispatch mode: the operations after which a GPU's host waits for the
device (``_local_scalar_dense``: ``.item()``, ``bool``, ``int``, ``float`` of a tensor;
``is_nonzero``; ``equal``; outputs sized by values: ``nonzero``, ``masked_select``) and
``Tensor.tolist``. The rules that read values on the CPU to skip work (fxlrp/relevance/tracing.py:
``values_read_on_host``) are set to answer as on a GPU (no device type is read on the host).
The relevance so computed is compared with the one of the CPU's own answers: the skipped work is
exact zeros.
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fxlrp
from fxlrp.relevance import tracing
from fxlrp.rules.composites import AttnLRP, EpsilonGammaBox, EpsilonPlusFlat
from tests.support.references import relative_error

SYNCHRONISING = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim"}


class Synchronisations(TorchDispatchMode):
    """The names of the synchronising ATen operations dispatched, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::", 1)[-1].split(".", 1)[0]
        if name in SYNCHRONISING:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


class HostCopies(TorchFunctionMode):
    """``Tensor.tolist`` and ``Tensor.numpy`` calls (a device-to-host copy; nothing dispatched on the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (Tensor.tolist, Tensor.numpy):
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    """Convolution, BatchNorm, ReLU and a residual add, as in a ResNet."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.norm(self.conv(x)) + x)


def _cnn() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), Block(8),
                          Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    for norm in model.modules():
        if isinstance(norm, nn.BatchNorm2d):
            norm.running_mean.uniform_(-0.2, 0.2)
            norm.running_var.uniform_(0.5, 1.5)
    return model


def _vit() -> nn.Module:
    return torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=16, mlp_dim=32, num_classes=5)


class NextToken(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(input_ids=ids).logits[:, -1]


def _lm() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return NextToken(transformers.LlamaForCausalLM(config))


CASES = {
    "cnn EpsilonPlusFlat": (_cnn, EpsilonPlusFlat, lambda: torch.randn(2, 3, 8, 8)),
    "cnn EpsilonGammaBox": (_cnn, lambda: EpsilonGammaBox(low=-3.0, high=3.0), lambda: torch.randn(2, 3, 8, 8)),
    "cnn LRP-0": (_cnn, lambda: fxlrp.rules.Epsilon(0.0), lambda: torch.randn(2, 3, 8, 8)),
    "vit Epsilon": (_vit, lambda: fxlrp.rules.Epsilon(1e-6), lambda: torch.randn(2, 3, 16, 16)),
    "vit AttnLRP(0.0)": (_vit, lambda: AttnLRP(0.0), lambda: torch.randn(2, 3, 16, 16)),
    "lm AttnLRP(0.0)": (_lm, lambda: AttnLRP(0.0), lambda: torch.randint(0, 50, (2, 6))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_explanation_reads_values_on_the_host_once_at_most(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    build, composite, inputs = CASES[case]
    torch.manual_seed(0)
    model = build().double().eval()
    x = inputs()
    x = x.double() if x.is_floating_point() else x
    explain = fxlrp.convert(model, composite())
    on_the_cpu = fxlrp.attribute(explain, x)  # (also the warm-up: the eager path records at its second call)
    fxlrp.attribute(explain, x)
    monkeypatch.setattr(tracing, "HOST_DEVICE_TYPES", frozenset())  # as on a GPU
    for check_finite, most in ((False, 0), (True, 1)):
        with HostCopies() as copies, Synchronisations() as dispatched:
            relevance = fxlrp.attribute(explain, x, check_finite=check_finite)
        assert len(dispatched.names) + len(copies.names) <= most, (check_finite, dispatched.names, copies.names)
        assert relative_error(relevance, on_the_cpu) <= 1e-12


def test_the_checks_read_once_still_refuse_nan_first_in_the_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finiteness checks are read together at the end of the call: an input with NaN is still
    refused as the input (not as the output or relevance it makes NaN), an output that overflowed
    as the output."""
    torch.manual_seed(0)
    explain = fxlrp.convert(_cnn().eval(), EpsilonPlusFlat())
    x = torch.randn(2, 3, 8, 8)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^the input \(shape \[2, 3, 8, 8\]\) contains 1 NaN of its 384 values"):
        fxlrp.attribute(explain, x)
    with pytest.raises(ValueError, match=r"^the model's output is not finite"):
        fxlrp.attribute(explain, torch.full((2, 3, 8, 8), 3e38))
