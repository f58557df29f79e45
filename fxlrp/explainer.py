"""The converted model: same outputs, relevance in backward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, fx, nn

from fxlrp.report import Report


class Explainer(nn.Module):
    """Computes the model's outputs; ``output.backward(R)`` leaves input relevance in ``.grad``.

    Created by :func:`fxlrp.convert`. ``graph_module`` is the rewritten torch.fx graph.
    """

    def __init__(self, graph_module: fx.GraphModule, report: Report) -> None:
        super().__init__()
        self.graph_module = graph_module
        self._report = report

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.graph_module(*args, **kwargs)

    def report(self) -> Report:
        """Every node of the model with its canonical operation, handling, rule and source."""
        return self._report


def output_relevance(output: Tensor, target: Any) -> Tensor:
    """The relevance to start from: the output times a one-hot mask of ``target``.

    ``target`` may be a class index, a tensor of one index per sample, None (each sample's
    highest output) or a tensor of the output's shape (taken as the relevance itself).
    """
    if isinstance(target, Tensor) and target.shape == output.shape and target.is_floating_point():
        return target
    if output.dim() == 0:
        return output.detach().clone()
    if target is None:
        target = output.detach().argmax(dim=-1)
    mask = torch.zeros_like(output)
    index = torch.as_tensor(target, device=output.device, dtype=torch.long)
    if index.dim() == 0:
        mask[..., index] = 1.0
    else:
        mask.scatter_(-1, index.reshape(*output.shape[:-1], 1), 1.0)
    return output.detach() * mask


def attribute(
    explain: nn.Module,
    inputs: Tensor | Sequence[Tensor],
    target: Any = None,
    *,
    output: Callable[[Any], Tensor] | None = None,
) -> Tensor | tuple[Tensor, ...]:
    """Relevance of each input in one call.

    ``inputs``: a tensor or a sequence of tensors (each gets its relevance).
    ``target``: see :func:`output_relevance`.
    ``output``: picks the explained tensor from the model's output (e.g.
    ``lambda graphs: graphs.global_features``); by default the output itself.
    Relevance is returned with the shapes of the inputs.
    """
    single = isinstance(inputs, Tensor)
    leaves = [value.detach().requires_grad_() for value in ((inputs,) if single else inputs)]
    with torch.enable_grad():
        result = explain(*leaves)
        explained = output(result) if output is not None else result
        if not isinstance(explained, Tensor):
            raise TypeError(
                f"the model returns {type(explained).__name__}; pass output=... to pick the tensor to explain"
            )
        relevance = torch.autograd.grad(
            explained, leaves, output_relevance(explained, target), allow_unused=True
        )
    relevance = tuple(torch.zeros_like(leaf) if r is None else r for r, leaf in zip(relevance, leaves))
    return relevance[0] if single else relevance
