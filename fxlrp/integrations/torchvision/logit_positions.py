"""Where the class logit of a detection is in the output of a detector's classification head,
found from where its score's relevance goes back to, or from the model's own gradient of the
score with softmax and sigmoid passing the gradient unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from fxlrp.capture.interception import module_calls_followed
from fxlrp.capture.module_state import MODEL_WRITES, ModuleState, in_evaluation_mode
from fxlrp.registry import REGISTRY


class _PassingGradient(torch.autograd.Function):
    """Forward: a squashing function's value. Backward: the gradient unchanged, so that it reaches
    the logit a score comes from also where the score has saturated (a softmax or sigmoid of 1.0
    in float32 has derivative 0)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, logits: Tensor) -> Tensor:
        return value

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[None, Tensor]:
        return None, gradient


class _SquashingPassesGradients(TorchFunctionMode):
    """Softmax and sigmoid (functions and methods) whose backward passes the gradient unchanged:
    where a detection's score comes from is a matter of which elements it is selected from, not of
    how steep the squashing is there. Which calls squash the registry says
    (:attr:`~fxlrp.registry.ValueFlow.saturates`)."""

    def __init__(self) -> None:
        super().__init__()
        self.squashing = REGISTRY.callables_where(lambda operation: operation.flow.saturates)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        value = func(*args, **(kwargs or {}))
        if func in self.squashing and isinstance(args[0], Tensor) and args[0].requires_grad:
            return _PassingGradient.apply(value.detach(), args[0])
        return value


def logit_positions(explain: nn.Module, images: Any, image: int, index: int, label: int,
                     heads: dict[type, int | None]) -> list[tuple[int, tuple[int, ...]]]:
    """Where the logit of a detection's class is: (which output of a classification head, the
    element), found from the model's own gradient of the detection's score (as the model runs
    it, in evaluation mode; the model is put back as it was), with softmax and sigmoid passing
    the gradient unchanged (a saturated score's derivative is 0)."""
    model = getattr(getattr(explain, "conversion", None), "model", None)
    if model is None:
        raise ValueError("the explainer holds no model (a copy): explain score='score' instead")
    outputs: list[Tensor] = []

    def after(module: nn.Module, args: Any, output: Any) -> None:
        for kind, position in heads.items():
            if isinstance(module, kind):
                outputs.append(output if position is None else output[position])

    detached = ([each.detach().requires_grad_() for each in images] if isinstance(images, list)
                else images.detach().requires_grad_())
    with MODEL_WRITES:
        state = ModuleState(model)
        in_evaluation_mode(state.modules)
        try:
            with torch.enable_grad(), module_calls_followed(after=after), _SquashingPassesGradients():
                detections = model(detached)[image]
        finally:
            state.restore()
    value = detections["scores"][index]
    logits = [output for output in outputs if isinstance(output, Tensor) and output.requires_grad]
    if not value.requires_grad or not logits:
        return []
    return reached_positions(value, logits, label, keep=False)


def reached_positions(value: Tensor, logits: list[Tensor], label: int,
                       keep: bool = True) -> list[tuple[int, tuple[int, ...]]]:
    """The elements of class ``label`` among ``logits`` that ``value`` (a detection's score) comes
    back to in backward: (which tensor, the element). In an explanation's run what comes back is
    the score's relevance, which the softmax's and sigmoid's rules keep in the detection's row."""
    shares = torch.autograd.grad(value, logits, value.detach(), retain_graph=keep, allow_unused=True)
    return [(number, tuple(int(each) for each in where) + (label,))
            for number, share in enumerate(shares) if share is not None
            for where in (share[..., label] != 0).nonzero()]
