"""Layers with weights: linear, convolution, transposed convolution, BatchNorm, matmul."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fxlrp.operations.helpers import NATIVE_UNDER_NATIVE_RULE, weighted
from fxlrp.operations.normalization import normalisation, scaled_and_shifted
from fxlrp.registry import Affine, NativeInGradientForm, Operation, Spelling, ValueFlow, register
from fxlrp.relevance.call import RelevanceCall
from fxlrp.relevance.form import gradient_form_active
from fxlrp.relevance.rule_function import carries_relevance
from fxlrp.relevance.tracing import values_read_on_host


def as_matrix_rows(input: Tensor) -> Tensor:
    """``F.linear``'s input, contiguous: for an input that requires grad and cannot be viewed as
    one matrix (a batch-first sequence transposed by ``nn.MultiheadAttention``), torch's matmul
    broadcasts the weight into a batched product of ``length`` tiny matrices instead of copying
    the input into one (an order of magnitude slower for ViT-B/16's in-projection), and rounds differently
    from the model's own forward, which runs without gradients."""
    return input.contiguous() if input.dim() > 2 and not input.is_contiguous() else input


def dequantized(weight: Tensor) -> Tensor:
    """A quantized weight as the floating-point weight it stands for; any other weight as it is.

    A quantized weight is a tensor subclass with its own ``dequantize`` (torchao's weight-only
    int8 and int4 tensors, optimum-quanto's ``QTensor``): the layer computes the linear map of the
    dequantized weight, up to its kernel's rounding, and is explained as that map, by the same
    rules as a floating-point weight. (A rule's products with it - ``g @ W``, ``W.clamp(min=0)`` -
    are not kernels such a tensor has.)

    Parameters
    ----------
    weight : Tensor
        A layer's weight.

    Returns
    -------
    Tensor
        ``weight.dequantize()`` for a quantized tensor subclass, else ``weight``.
    """
    own = getattr(type(weight), "dequantize", Tensor.dequantize)
    if own is Tensor.dequantize or type(weight) in (Tensor, nn.Parameter):
        return weight
    return weight.dequantize()


def linear(call: RelevanceCall, function: Any, input: Tensor, weight: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``F.linear`` by the node's rule, on a contiguous input (:func:`as_matrix_rows`); where that is
    the layer's own call (the gradient form under LRP-0), :func:`linear_on_matrix_rows`. A
    quantized weight is explained as the weight it stands for (:func:`dequantized`)."""
    if call.runs_natively():
        return linear_on_matrix_rows(function, input, weight, *args, **kwargs)
    weight = dequantized(weight)
    if gradient_form_active():  # the rule's gradient form records the layer: its backward may skip zeros too
        function = partial(linear_on_matrix_rows, function)
    # (a 1-D weight, F.linear's dot product per row, keeps the inner graph: g @ W is a matrix product)
    matrix = weight.dim() == 2
    return weighted(call, function, as_matrix_rows(input), weight, *args,
                    input_gradient=linear_input_gradient if matrix else None, output_rows_dim=-1 if matrix else None,
                    **kwargs)


def linear_on_matrix_rows(function: Any, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """:func:`linear` in the gradient form under LRP-0: the layer's own call on a contiguous input,
    whose backward is :func:`linear_input_gradient` where that may look for rows and columns of 0
    (:func:`may_skip_zeros`), else autograd's own."""
    input, weight = as_matrix_rows(input), dequantized(weight)
    if (may_skip_zeros(input, input.numel() * weight.shape[0]) and not carries_relevance(weight)
            and not carries_relevance(bias)):
        return LinearInGradientForm.apply(function, input, weight, bias)
    return function(input, weight, bias)  # (a weight computed from the inputs gets its gradient too)


class LinearInGradientForm(torch.autograd.Function):
    """``function(input, weight, bias)`` (``F.linear``); backward: ``g_x = g_y W``
    (:func:`linear_input_gradient`). Weight and bias are constants of the explanation, as under
    every rule; autograd's own backward would multiply every row of ``g_y`` where only some carry
    relevance."""

    @staticmethod
    def forward(ctx, function: Any, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.weight = weight
        return function(input, weight, bias)

    @staticmethod
    def backward(ctx, gradient: Tensor) -> tuple[Tensor | None, ...]:
        input_gradient = linear_input_gradient(gradient, ctx.weight) if ctx.needs_input_grad[1] else None
        return None, input_gradient, None, None


SPARSE_CHECK_MIN_PRODUCT = 2**20
"""Multiply-adds of ``g @ W`` below which :func:`linear_input_gradient` does not look for rows and
columns of 0: below it, looking (and the Function that gives the gradient form's linear layer
that backward) costs about as much as the product itself."""


def may_skip_zeros(tensor: Tensor, products: int) -> bool:
    """Whether a matrix product of ``products`` multiply-adds on ``tensor``'s device may look for
    rows and columns of 0 first: on the CPU (on a GPU the count would make the host wait for the
    device), outside ``torch.compile`` (whose graph cannot branch on values), where large enough
    to gain."""
    return 0 < products and products >= SPARSE_CHECK_MIN_PRODUCT and values_read_on_host(tensor)


def linear_input_gradient(gradient: Tensor, weight: Tensor, input: Tensor | None = None) -> Tensor:
    """``F.linear``'s vector-Jacobian product in its input: ``g @ W`` (``y = x W^T + b``); ``input``
    is not read (:attr:`fxlrp.relevance.AffineLayer.input_gradient`'s third argument).

    Only the rows and columns of ``g`` that are not all 0 are multiplied, where they are few
    (:func:`carrying_rows_and_columns`): the gradient of one explained logit at the
    LM head (one column of ``vocabulary``), and of one explained position in the last layer of a
    transformer (one row of ``sequence``), would otherwise cost a whole product of zeros - for a
    causal LM explained at its last token, the LM head's whole weight read and the last layer's
    MLP and projections multiplied in full. The rows and columns left out contribute exact zeros,
    so the result is the dense product's, up to the order of summation."""
    if not may_skip_zeros(gradient, gradient.numel() * weight.shape[1]):
        return gradient.matmul(weight)  # (no reshape: an operation per layer on a GPU's path)
    matrix = gradient.reshape(-1, gradient.shape[-1])
    rows, columns = carrying_rows_and_columns(matrix, weight.shape[1])
    if rows is None and columns is None:
        return gradient.matmul(weight)
    if rows is not None:
        matrix = matrix.index_select(0, rows)
    if columns is not None:
        matrix, weight = matrix.index_select(1, columns), weight.index_select(0, columns)
    product = matrix.matmul(weight)
    if rows is not None:
        product = product.new_zeros(gradient.numel() // gradient.shape[-1], weight.shape[1]).index_copy_(
            0, rows, product)
    return product.reshape(*gradient.shape[:-1], weight.shape[1])


def carrying_rows_and_columns(matrix: Tensor, inner: int) -> tuple[Tensor | None, Tensor | None]:
    """The indices of the rows and of the columns of ``matrix`` (a gradient ``g`` about to be
    multiplied into ``g @ W`` with ``inner`` columns) that hold anything but 0 (NaN counts): the
    rows where they are at most half of them, the columns where at most a sixteenth (each kept
    column copies a row of ``W``: for one row of ``g``, a product that reads ``W`` once, a copy of
    a quarter of a 4096 x 25088 ``W`` costs more than the whole product); None for all of them.

    Looked for where :func:`may_skip_zeros`, and only where one of three entries - first, middle,
    last - is 0: where at most half the rows (or columns) carry relevance, one of them almost
    always lies in a row (column) of 0, while a dense gradient costs three reads. The rows are
    found by one reduction along them (``any``: no copy, each entry read once); the columns
    among the carrying rows alone where those are few (the last layers of a transformer
    explained at one position: one row), else over the whole matrix, unless one carrying row
    alone holds more than a sixteenth of them (then so do all: a gradient of many rows and
    columns, the product taken whole)."""
    count, width = matrix.shape
    if (not may_skip_zeros(matrix, count * width * inner)
            or (matrix[0, 0].item() != 0 and matrix[count // 2, width // 2].item() != 0
                and matrix[-1, -1].item() != 0)):
        return None, None
    rows = matrix.any(dim=1).nonzero().squeeze(1)
    if 2 * len(rows) <= count:
        columns = matrix.index_select(0, rows).any(dim=0).nonzero().squeeze(1)
        return rows, (columns if 16 * len(columns) <= width else None)
    if 16 * int(matrix[rows[0]].count_nonzero()) > width:
        return None, None
    columns = matrix.any(dim=0).nonzero().squeeze(1)
    return None, (columns if 16 * len(columns) <= width else None)


def linear_module(module: nn.Linear, parameters: dict[str, Any]):
    return F.linear, {"weight": parameters["weight"], "bias": parameters.get("bias")}


register(
    Operation(
        "linear",
        Spelling(functions=(F.linear,), modules=(nn.Linear,), module_function=linear_module),
        Affine(linear, weighted=True, gradient_native=NativeInGradientForm(call=linear_on_matrix_rows)),
        ValueFlow(keeps_rank=True),
        description="y = x W^T + b",
    )
)


CONVOLUTIONS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3, torch.conv1d: 1, torch.conv2d: 2, torch.conv3d: 3}
"""The convolutions by their number of spatial dimensions."""
CONVOLUTION_SETTINGS = ("stride", "padding", "dilation", "groups")
"""Their settings after input, weight and bias, in order."""


def convolution(call: RelevanceCall, function: Any, input: Tensor, weight: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """A convolution by the node's rule, with its vector-Jacobian product in closed form where
    :func:`convolution_input_gradient` gives one (its channels are then the weight's rows, where
    it has one group)."""
    input_gradient = convolution_input_gradient(function, input, weight, args[1:], kwargs)
    rows = 1 if input_gradient is not None and input_gradient.groups == 1 else None
    return weighted(call, function, input, weight, *args, input_gradient=input_gradient, output_rows_dim=rows,
                    **kwargs)


def convolution_input_gradient(
    function: Any, input: Tensor, weight: Tensor, settings: tuple[Any, ...], keywords: dict[str, Any]
) -> Any:
    """The vector-Jacobian product in its input of ``function(input, weight, bias, *settings,
    **keywords)``, a convolution of numeric settings on a batched input: ATen's
    ``convolution_backward`` for the input alone, the kernel autograd runs for the convolution
    (so the relevance is the same, bit for bit, as through an inner graph, without one). None for
    other calls (padding given as ``"same"``, an unbatched input, padding modes other than zeros),
    which keep an inner graph. The product has the convolution's ``groups``."""
    dimensions = CONVOLUTIONS.get(function)
    given = dict(zip(CONVOLUTION_SETTINGS, settings, strict=False)) | keywords
    given.pop("bias", None)
    if (dimensions is None or input.dim() != dimensions + 2 or len(settings) > len(CONVOLUTION_SETTINGS)
            or not set(given) <= set(CONVOLUTION_SETTINGS) or isinstance(given.get("padding"), str)):
        return None
    stride, padding, dilation = (_expanded(given.get(name, default), dimensions)
                                 for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)))
    groups = int(given.get("groups", 1))
    mask = (True, False, False)

    def input_gradient(gradient: Tensor, weight: Tensor, input: Tensor) -> Tensor:
        return torch.ops.aten.convolution_backward(
            gradient, input, weight, None, stride, padding, dilation, False, [0] * dimensions, groups, mask)[0]

    input_gradient.groups = groups
    return input_gradient


def _expanded(setting: int | tuple[int, ...], dimensions: int) -> list[int]:
    """A convolution's setting, one number per spatial dimension."""
    return [int(setting)] * dimensions if isinstance(setting, int) else [int(value) for value in setting]


def _padded_convolution(
    convolution, padding_mode: str, border: tuple[int, ...], input, weight, bias, *settings, **keywords
):
    # Non-zero padding modes are a copy of border values: linear, so it belongs to the layer.
    # ``keywords`` holds the convolution's own settings (stride, padding=0, ...).
    return convolution(F.pad(input, border, mode=padding_mode), weight, bias, *settings, **keywords)


def convolution_module(module: nn.modules.conv._ConvNd, parameters: dict[str, Any]):
    function = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(module.kernel_size)]
    padding = module.padding
    if module.padding_mode != "zeros":
        function = partial(
            _padded_convolution, function, module.padding_mode, module._reversed_padding_repeated_twice
        )
        padding = 0
    return function, {
        "weight": parameters["weight"],
        "bias": parameters.get("bias"),
        "stride": module.stride,
        "padding": padding,
        "dilation": module.dilation,
        "groups": module.groups,
    }


register(
    Operation(
        "conv",
        Spelling(
            functions=tuple(CONVOLUTIONS),
            modules=(nn.Conv1d, nn.Conv2d, nn.Conv3d),
            module_function=convolution_module,
        ),
        Affine(convolution, weighted=True, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        ValueFlow(keeps_rank=True),
        description="convolution, any dimension, groups, stride, padding, dilation",
    )
)


def transposed_convolution_module(module: nn.modules.conv._ConvTransposeNd, parameters: dict[str, Any]):
    function = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(module.kernel_size)]
    return function, {
        "weight": parameters["weight"],
        "bias": parameters.get("bias"),
        "stride": module.stride,
        "padding": module.padding,
        "output_padding": module.output_padding,
        "groups": module.groups,
        "dilation": module.dilation,
    }


register(
    Operation(
        "conv_transpose",
        Spelling(
            functions=(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d),
            modules=(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
            module_function=transposed_convolution_module,
        ),
        Affine(weighted, weighted=True, gradient_native=NATIVE_UNDER_NATIVE_RULE),
        ValueFlow(keeps_rank=True),
        description="transposed convolution",
    )
)


def batch_norm(
    call: RelevanceCall,
    function: Any,
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    r"""BatchNorm. With running statistics, the per-channel affine map ``x * scale + shift``,
    ``scale = gamma / sqrt(running_var + eps)``, ``shift = beta - running_mean * scale``
    (inference semantics, whatever ``training`` says).

    Without them (``track_running_stats=False``, or ``F.batch_norm(x, None, None, training=True)``)
    it normalises by the statistics of the batch, per channel ``c`` over the batch and positions:
    ``y = (x - mean_c(x)) / sigma_c * gamma_c + beta_c``, ``sigma_c = sqrt(var_c(x) + eps)``. It is
    explained like LayerNorm: ``sigma`` is held constant (identity rule), which leaves an affine
    map of ``x`` (centring, scale, shift) for the node's rule:

    .. math::
        R_{x_i} = x_i \sum_k \frac{\partial y_k / \partial x_i |_{\sigma \text{ const}}}{z_k} R_k

    (``z_k`` the rule's stabilised ``y_k``). Forward runs the native kernel only. Batch statistics
    mix the samples of a batch, so a sample's relevance depends on the others explained with it.
    """
    if running_mean is None or running_var is None:
        return _batch_statistics_norm(call, function, input, running_mean, running_var, weight, bias,
                                      training, momentum, eps)

    channel_shape = (1, -1) + (1,) * (input.dim() - 2)

    def scale_and_shift() -> tuple[Tensor, Tensor]:
        # Explanations are of the model at inference: statistics are never updated.
        scale = torch.rsqrt(running_var + eps)
        scale = scale if weight is None else scale * weight
        shift = -running_mean * scale
        shift = shift if bias is None else shift + bias
        return scale.view(channel_shape), shift.view(channel_shape)  # (shaped once, not at every call)

    # Once per conversion: the same tensors each call also let the rule's weight transforms be reused.
    scale, shift = call.cached(("batch_norm", input.dim()), (running_mean, running_var, weight, bias),
                               scale_and_shift)

    def affine_per_channel(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return torch.addcmul(b, x, w)

    def input_gradient(gradient: Tensor, w: Tensor, x: Tensor) -> Tensor:
        # (the vector-Jacobian product in closed form: the rule needs no inner graph)
        return gradient * w

    return call.affine(call.layer(affine_per_channel, scale, shift, has_parameters=True,
                                  input_gradient=input_gradient), input)


def _batch_statistics_norm(
    call: RelevanceCall, function: Any, input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
    weight: Tensor | None, bias: Tensor | None, training: bool, momentum: float, eps: float,
) -> Tensor:
    """BatchNorm by the batch's statistics: the native kernel, relevance through the map with
    each channel's ``sigma`` constant (see :func:`batch_norm`)."""
    channel_shape = (1, -1) + (1,) * (input.dim() - 2)
    dimensions = (0, *range(2, input.dim()))  # all but the channels

    def exact(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        return function(x, running_mean, running_var, w, b, training, momentum, eps)

    def linearised(x: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        inverse_sigma = torch.rsqrt(x.detach().var(dimensions, unbiased=False, keepdim=True) + eps)
        centred = (x - x.mean(dimensions, keepdim=True)) * inverse_sigma
        return scaled_and_shifted(centred, w, b, channel_shape)

    return normalisation(call, exact, linearised, input, weight, bias)


def batch_norm_module(module: nn.modules.batchnorm._BatchNorm, parameters: dict[str, Any]):
    return F.batch_norm, {
        "running_mean": parameters.get("running_mean"),
        "running_var": parameters.get("running_var"),
        "weight": parameters.get("weight"),
        "bias": parameters.get("bias"),
        # A module without running statistics normalises by the batch's, in eval mode too.
        "training": module.running_mean is None or module.running_var is None,
        "eps": module.eps,
    }


register(
    Operation(
        "batch_norm",
        Spelling(
            functions=(F.batch_norm,),
            modules=(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
            module_function=batch_norm_module,
        ),
        Affine(batch_norm, weighted=True),
        description="BatchNorm: with running statistics a per-channel affine map; without, by the batch's "
        "statistics with sigma constant (identity rule), centring, scale and shift as one affine map",
    )
)
