"""``--model torchvision:NAME``: a torchvision classification, segmentation or video model with
random weights (or ``--weights``), preprocessed as its weights' ``transforms()`` say."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from torch import Tensor, nn

from fxlrp.app.cli_options import InputError, one_line
from fxlrp.app.models.weights import classes_of
from fxlrp.app.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing

_REFUSED_FAMILIES = {
    "detection": ("an object detection model", "detection models"),
    "optical_flow": ("an optical flow model", "optical flow models"),
    "quantization": ("a quantized model (int8 kernels: explain its float version, e.g. torchvision:resnet18)",
                     "quantized models"),
}


TRANSFORMS_INPUT = {"googlenet": "aux1.", "inception_v3": "AuxLogits."}
"""The models whose pretrained weights expect ``transform_input=True`` (their code maps an
ImageNet-normalised image to the normalisation they were trained with), each with the prefix of
its auxiliary head's weights."""


def torchvision_family(name: str) -> str | None:
    """The torchvision family of a model.

    Parameters
    ----------
    name
        A name of ``torchvision.models.list_models()``.

    Returns
    -------
    str or None
        ``"classification"``, ``"segmentation"``, ``"video"``, ``"detection"``, ``"optical_flow"``
        or ``"quantization"``; None for a name torchvision does not know.
    """
    import torchvision

    modules = {"classification": torchvision.models, "segmentation": torchvision.models.segmentation,
               "video": torchvision.models.video, "detection": torchvision.models.detection,
               "optical_flow": torchvision.models.optical_flow, "quantization": torchvision.models.quantization}
    return next((family for family, module in modules.items()
                 if name in torchvision.models.list_models(module=module)), None)


def torchvision_model(name: str, state_dict: dict[str, Tensor] | None) -> nn.Module:
    """A torchvision classification, segmentation or video model with random weights (no download:
    neither the model's nor its backbone's pretrained weights), with the number of classes (and the
    auxiliary head of a segmentation model) of ``state_dict`` if given; GoogLeNet and Inception v3
    with ``state_dict`` built as torchvision builds them for its weights (:data:`TRANSFORMS_INPUT`),
    without as for ``weights=None``, as torchvision does."""
    import torchvision

    family = torchvision_family(name)
    if family is None:
        known = torchvision.models.list_models()
        close = [model for model in known if model.startswith(name[:4])][:6]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise InputError(f"unknown torchvision model {name!r}{hint}; see torchvision.models.list_models()")
    if family in _REFUSED_FAMILIES:
        what, kind = _REFUSED_FAMILIES[family]
        raise InputError(f"torchvision:{name} is {what}; the command line explains classification, segmentation and "
                         f"video models, not {kind} yet")
    builder = torchvision.models.get_model_builder(name)
    options: dict[str, Any] = {}
    if "weights_backbone" in inspect.signature(builder).parameters:
        options["weights_backbone"] = None  # its default downloads ImageNet weights for the backbone
    if state_dict is not None:
        classes = classes_of(state_dict, "classifier." if family == "segmentation" else None)
        if classes is not None:
            options["num_classes"] = classes
        if family == "segmentation" and any(key.startswith("aux_classifier.") for key in state_dict):
            options["aux_loss"] = True
        if name in TRANSFORMS_INPUT:
            # As torchvision builds them for its weights (weights=...): transform_input on, the
            # auxiliary head where the weights have one (torchvision's files do; a state dict saved
            # from torchvision's model does not).
            options.update(transform_input=True, init_weights=False,
                           aux_logits=any(key.startswith(TRANSFORMS_INPUT[name]) for key in state_dict))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # googlenet / inception_v3: the notice about their initialisation
        return torchvision.models.get_model(name, weights=None, **options)


def torchvision_preprocessing(name: str, model: nn.Module, channels: int) -> Preprocessing:
    """A torchvision model's preprocessing from its weights' ``transforms()`` (which downloads
    nothing): the default weights', or, where the model fixes its input size (a ViT built without
    weights takes 224 x 224), those of the weights of that size. Video models take clips as
    tensors (the command line decodes no video files): only their mean and std are used, for
    EpsilonGammaBox's bounds."""
    import torchvision

    family = torchvision_family(name)
    try:
        enum = torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        enum = None
    members = [] if enum is None else [enum.DEFAULT, *[member for member in enum if member is not enum.DEFAULT]]
    fixed = getattr(model, "image_size", None)
    for member in members:
        transform = member.transforms()
        crop = list(getattr(transform, "crop_size", None) or [])
        if isinstance(fixed, int) and crop and set(crop) != {fixed}:
            continue
        mean, std = tuple(float(value) for value in transform.mean), tuple(float(value) for value in transform.std)
        described = f"torchvision {type(member).__name__}.{member.name}.transforms(): {one_line(repr(transform))}"
        if family == "video":
            return Preprocessing(None, channels, mean, std, None, f"taken as given: preprocess the clips with "
                                 f"{type(member).__name__}.{member.name}.transforms()", dims=4)
        return Preprocessing(crop[0] if crop else None, channels, mean, std, transform, described)
    size = fixed if isinstance(fixed, int) else 224
    return Preprocessing(size, channels, IMAGENET_MEAN, IMAGENET_STD, dims=4 if family == "video" else 3)
