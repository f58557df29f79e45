"""``fxlrp.convert``: capture -> canonicalise -> assign rules -> rewrite -> explainer."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import fx, nn

from fxlrp.capture import capture as capture_model
from fxlrp.errors import UnsupportedOperationError
from fxlrp.explain.explainer import Conversion, Explainer
from fxlrp.explain.loader import load_integrations
from fxlrp.explain.model_snapshot import ModelSnapshot
from fxlrp.explain.rank_checks import recorded_rank_checks
from fxlrp.graph.canonicalise import canonicalise
from fxlrp.graph.fold_batchnorm import fold_batch_norms
from fxlrp.graph.report import Report
from fxlrp.graph.rewrite import RewriteOptions, Rewriter
from fxlrp.operations.scatter_library import all_scatter_functions
from fxlrp.registry import REGISTRY
from fxlrp.relevance.form import composite_has_gradient_form
from fxlrp.rules import Rule
from fxlrp.rules.composites import Composite, as_composite


def _is_explained_module(module: nn.Module) -> bool:
    return REGISTRY.for_module(module) is not None


def _unwrapped(model: nn.Module) -> nn.Module:
    """The module that a wrapper which computes the same function runs: ``torch.compile``'s
    (its ``_orig_mod``; fxlrp explains the model's own code, :func:`fxlrp.compile` compiles the
    explanation), ``nn.DataParallel``'s and ``DistributedDataParallel``'s (its ``module``, on the
    device its parameters are on)."""
    # (a model torch.compile made means torch._dynamo is imported; fxlrp does not import it)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    compiled = eval_frame.OptimizedModule if eval_frame is not None else ()
    while True:
        if isinstance(model, compiled):
            model = model._orig_mod
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            return model


def _refuse_quantized(model: nn.Module) -> None:
    """A model of int8 modules (after ``torch.ao.quantization.convert``) is refused in one line: its
    layers have no gradients and no weights in floating point, which every rule is made of."""
    quantized = [(name, module) for name, module in model.named_modules()
                 if type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized",
                                                        "torch.ao.nn.intrinsic.quantized"))]
    if quantized:
        name, module = next(((name, module) for name, module in quantized
                             if type(module).__name__ not in ("Quantize", "DeQuantize")), quantized[0])
        raise UnsupportedOperationError(
            f"the model is quantized ({len(quantized)} int8 modules, e.g. {name or 'the model'}: "
            f"{type(module).__name__}): LRP's rules need the float model's weights and gradients; explain the "
            "float model (torchvision: quantize=False; your own: the model before torch.ao.quantization.convert)")


def _refuse_meta_device(model: nn.Module) -> None:
    """A model whose weights are on the meta device (made under ``torch.device("meta")``,
    accelerate's ``init_empty_weights``, or moved with ``.to("meta")``) is refused in one line: it
    holds shapes but no values, so there is no output and no relevance to compute; the weights
    must be loaded first."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    # A module that a hook hands its weights at each call (accelerate's offloading to CPU or disk,
    # transformers' device_map: the hook is the module's ``_hf_hook``) keeps them on the meta
    # device between calls: they are loaded, not missing.
    hooked = [name for name, module in model.named_modules() if hasattr(module, "_hf_hook")]
    empty = [name for name, tensor in tensors if tensor.is_meta
             and not any(name.startswith(f"{prefix}.") or not prefix for prefix in hooked)]
    if empty:
        raise ValueError(
            f"the model's weights are on the meta device ({len(empty)} of its {len(tensors)} parameters and "
            f"buffers, e.g. {empty[0]!r}): it holds their shapes but no values, so there is nothing to explain. "
            "Load the weights first, then convert: model.to_empty(device='cpu') and "
            "model.load_state_dict(torch.load(FILE)), or accelerate's load_checkpoint_and_dispatch(model, FILE) "
            "for a model made under init_empty_weights()")


def _called_modules(graph: fx.Graph) -> set[str]:
    return {node.target for node in graph.nodes if node.op == "call_module"}


def convert(
    model: nn.Module,
    composite: Composite | Rule | None = None,
    *,
    strict: bool = True,
    concrete_args: dict[str, Any] | None = None,
    warn_lost_relevance: bool = False,
    fold_batch_norm: bool = True,
    capture: str = "auto",
) -> Explainer:
    """Return a module that computes ``model``'s outputs and propagates relevance in backward.

    ``composite``: None (Epsilon(1e-6) on every weighted layer, the z-rule on sums), a single
    rule for every weighted layer (``fxlrp.rules.Epsilon(0.0)`` is LRP-0), or a
    :class:`~fxlrp.rules.composites.Composite`.
    ``strict``: raise :class:`~fxlrp.UnsupportedOperationError` for operations without a rule
    that are not known to be relevance-neutral; with False they follow their gradient and a
    warning lists them.
    ``concrete_args``: fixed values for inputs that steer Python control flow.
    ``warn_lost_relevance``: warn when relevance reaches an output of 0 and is dropped.
    ``fold_batch_norm``: fold BatchNorm into the adjacent linear or convolutional layer (on new
    tensors), so that rules treat its shift as part of that layer's bias, as LRP composites and
    zennit's canonizers do. With False, BatchNorm is a layer of its own with its own rule.
    LRP-0 gives gradient x input either way.
    ``capture``: ``"auto"`` (torch.fx symbolic tracing; each module it cannot trace - Python
    control flow on tensor values, Hugging Face models - is run eagerly, with the same rules, its
    branches taken per input), ``"fx"`` (tracing only: a model it cannot trace is a
    :class:`~fxlrp.CaptureError`) or ``"eager"`` (the whole model run eagerly). ``explain.report()``
    says which parts run eagerly. Operations without a rule inside them are named when the
    explainer first runs them.

    A model wrapped by ``torch.compile``, ``nn.DataParallel`` or ``DistributedDataParallel`` is
    explained as the module it wraps. The model is only read: its parameters are shared
    (detached), never modified or given gradients. Explanations use inference semantics
    (BatchNorm running statistics, no dropout) whatever mode the model is in. What the model's
    BatchNorms check of an input's number of dimensions is recorded, so that explanations refuse
    what the model refuses (:mod:`fxlrp.explain.rank_checks`).

    Parameters
    ----------
    model
        The model (an ``nn.Module``; not an explainer).
    composite, strict, concrete_args, warn_lost_relevance, fold_batch_norm, capture
        As described above.

    Returns
    -------
    Explainer
        The model's outputs in forward, relevance in backward.

    Raises
    ------
    TypeError
        For a model that is no ``nn.Module`` or is already an explainer, a composite that is no
        rule or composite (or their class, not an instance), ``concrete_args`` that is no dict.
    ValueError
        For a model whose weights are on the meta device (not loaded yet).
    fxlrp.CaptureError, fxlrp.UnsupportedOperationError
        For a model that cannot be captured, or operations without a rule (``strict``).
    """
    if isinstance(model, Explainer):
        raise TypeError("the model given to fxlrp.convert is already an explainer (what fxlrp.convert returns): "
                        "explain with it as it is, or convert the original model")
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxlrp.convert expects an nn.Module, got {type(model).__name__}")
    if isinstance(composite, type) and issubclass(composite, (Composite, Rule)):
        raise TypeError(f"composite is the class {composite.__name__}; give an instance of it: "
                        f"{composite.__name__}(...)")
    model = _unwrapped(model)
    _refuse_quantized(model)
    _refuse_meta_device(model)
    composite = as_composite(composite)
    if concrete_args is not None and not isinstance(concrete_args, Mapping):
        raise TypeError(f"concrete_args must be a dict {{input name: value}}, got {type(concrete_args).__name__}")
    load_integrations()
    captured = capture_model(model, _is_explained_module, all_scatter_functions(), concrete_args, capture)
    graph = captured.graph
    original = dict(model.named_modules())
    in_place_modules = canonicalise(graph, original)
    signature = inspect.signature(model.forward)
    positional = [name for name, parameter in signature.parameters.items()
                  if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    rank_checks = recorded_rank_checks(graph, original, positional)  # (before BatchNorm leaves the graph)
    called = _called_modules(graph)
    modules = fold_batch_norms(graph, original) if fold_batch_norm else original
    # Folded BatchNorms left the graph; the layers they went into became copies with new tensors.
    folded = called - _called_modules(graph) | {name for name in called if modules[name] is not original[name]}
    rewriter = Rewriter(model, graph, composite, RewriteOptions(strict=strict, warn_lost_relevance=warn_lost_relevance),
                        in_place_modules=in_place_modules, modules=modules, constants=captured.constants,
                        eager_modules=captured.eager_modules)
    graph_module = rewriter.run()
    report = Report(type(model).__name__, rewriter.reports, captured.eager_modules)
    binds_calls = bool(captured.optional_inputs or captured.settings or concrete_args)
    conversion = Conversion(
        # Nodes without a rule let relevance follow the gradient, which the gradient form would change.
        gradient_form=composite_has_gradient_form(composite) and report.coverage == 1.0,
        input_names=tuple(signature.parameters),
        input_parameters=tuple(parameter.replace(annotation=inspect.Parameter.empty)  # (kept picklable)
                               for parameter in signature.parameters.values()),
        signature=signature if binds_calls else None,
        optional_inputs=tuple(captured.optional_inputs) if binds_calls else (),
        concrete_args=dict(concrete_args or {}) if binds_calls else {},
        settings=dict(captured.settings or {}) if binds_calls else {},
        convert_again=partial(convert, model, composite, strict=strict, warn_lost_relevance=warn_lost_relevance,
                              fold_batch_norm=fold_batch_norm, capture=capture),
        model=model,
        rank_checks=rank_checks,
    )
    explainer = Explainer(graph_module, report, conversion,
                          ModelSnapshot(model, [original[name] for name in sorted(folded)]))
    return explainer
