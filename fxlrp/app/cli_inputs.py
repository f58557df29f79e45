"""What the command line reads: a model from a spec and a weights file, a composite by name,
images (or tensor files) into batches, and what a model's output means. Every problem becomes an
:class:`InputError` whose message is one line naming the input and what to do.

Models: ``torchvision:NAME`` (classification, segmentation and video models, random weights or
``--weights``, preprocessed as their weights' ``transforms()`` say), ``timm:NAME`` (random weights,
preprocessed by the model's own data config), ``hf:DIR`` (a Hugging Face model saved with
``save_pretrained``: text models, :class:`Pretrained`, and image classifiers with their image
processor) and ``package.module:FACTORY``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fxlrp import rules
from fxlrp.app.cli_options import COMPOSITE_NAMES, InputError
from fxlrp.errors import ExplanationInputError
from fxlrp.explain.input_checks import model_consulted, model_of
from fxlrp.rules import composites

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TENSOR_SUFFIXES = (".pt", ".pth", ".npy")


@dataclass(frozen=True)
class Preprocessing:
    """How image files become model inputs: size, channels, ``(x - mean) / std`` per channel.

    ``transform``: the model's own preprocessing of a PIL image (a torchvision weights'
    ``transforms()``, timm's eval transform of the model's data config, a Hugging Face image
    processor), used instead of ``size``, ``mean`` and ``std`` when set (``mean`` and ``std`` then
    repeat its normalisation, for the input bounds); ``description`` says what it does (recorded
    in a data-set run's settings). ``dims``: dimensions of one sample, 3 for images
    ``[channels, height, width]``, 4 for a video model's clips ``[channels, frames, height, width]``.
    """

    size: int | None
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    transform: Callable[[Any], Tensor] | None = field(default=None, compare=False, repr=False)
    description: str | None = None
    dims: int = 3

    def input_bounds(self) -> tuple[Tensor, Tensor]:
        """Lowest and highest normalised input values ``[1, C, 1, ...]`` (pixels 0 and 1)."""
        shape = (1, -1, *[1] * (self.dims - 1))
        mean = torch.tensor(self.mean).reshape(shape)
        std = torch.tensor(self.std).reshape(shape)
        return (0.0 - mean) / std, (1.0 - mean) / std

    @property
    def sample_layout(self) -> str:
        """A sample's dimensions in words, for messages."""
        return "[channels, frames, height, width]" if self.dims == 4 else "[channels, height, width]"


# ---------------------------------------------------------------------------------------------
# models


_REFUSED_FAMILIES = {
    "detection": ("an object detection model", "detection models"),
    "optical_flow": ("an optical flow model", "optical flow models"),
    "quantization": ("a quantized model (int8 kernels: explain its float version, e.g. torchvision:resnet18)",
                     "quantized models"),
}


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


def _torchvision_model(name: str, state_dict: dict[str, Tensor] | None) -> nn.Module:
    """A torchvision classification, segmentation or video model with random weights (no download:
    neither the model's nor its backbone's pretrained weights), with the number of classes (and the
    auxiliary head of a segmentation model) of ``state_dict`` if given."""
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # googlenet / inception_v3: the notice about their initialisation
        return torchvision.models.get_model(name, weights=None, **options)


def _timm_model(name: str, classes: int | None) -> nn.Module:
    """A timm model with random weights (``pretrained=False``: no download)."""
    try:
        import timm
    except ImportError:
        raise InputError("timm: models need the timm package: pip install timm") from None
    if not timm.is_model(name):
        close = timm.list_models(f"{name[:4]}*")[:6]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise InputError(f"unknown timm model {name!r}{hint}; see timm.list_models()")
    options = {} if classes is None else {"num_classes": classes}
    return timm.create_model(name, pretrained=False, **options)


def imported_object(spec: str, kind: type, what: str) -> Any:
    """``package.module:NAME``: the object NAME if it is a ``kind``, else what calling it returns
    (a class or factory function); a one-line :class:`InputError` if it cannot be imported."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(f"cannot import {module_name!r} for {what} {spec!r}: {error}") from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise InputError(f"{module_name!r} has no attribute {attribute!r} ({what} spec {spec!r})")
    return factory if isinstance(factory, kind) else factory()


def _imported_model(spec: str) -> nn.Module:
    model = imported_object(spec, nn.Module, "model")
    if not isinstance(model, nn.Module):
        raise InputError(f"{spec!r} gives a {type(model).__name__}, not a torch.nn.Module")
    return model


def _first_sentence(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text.split(". ")[0][:160]


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """A state dict from ``torch.save(model.state_dict(), path)`` (or ``{"state_dict": ...}``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"weights file {str(path)!r} does not exist")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise InputError(f"cannot read weights {str(path)!r}: {_first_sentence(error)}; expected a file written by "
                         f"torch.save(model.state_dict(), path)") from None
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(isinstance(value, Tensor) for value in loaded.values()):
        raise InputError(f"weights {str(path)!r} are not a state dict; save them with "
                         f"torch.save(model.state_dict(), path)")
    return loaded


def classes_of(state_dict: dict[str, Tensor], prefix: str | None = None) -> int | None:
    """The number of classes of the classifier in a state dict.

    Parameters
    ----------
    state_dict
        A model's state dict.
    prefix
        Only keys starting with it count (``"classifier."`` for a segmentation head); None: all.

    Returns
    -------
    int or None
        The output size of its last matrix-shaped weight (a linear classifier), else of its last
        convolution weight (a 1x1 convolution as classifier: SqueezeNet, S3D, segmentation
        heads); None where it has neither.
    """
    weights = [value for key, value in state_dict.items()
               if key.endswith("weight") and (prefix is None or key.startswith(prefix))]
    matrices = [value for value in weights if value.dim() == 2]
    convolutions = [value for value in weights if value.dim() > 2]
    found = matrices or convolutions
    return int(found[-1].shape[0]) if found else None


def load_model(spec: str, weights: str | Path | None = None) -> nn.Module:
    """The model a ``--model`` spec names, in eval mode.

    Parameters
    ----------
    spec
        ``torchvision:NAME`` (a classification, segmentation or video model), ``timm:NAME`` (random
        weights unless ``weights``), ``hf:DIR`` (a Hugging Face image classifier saved with
        ``save_pretrained``, its weights in DIR) or ``package.module:FACTORY`` (an ``nn.Module``
        class, a function returning one, or a module instance).
    weights
        A state dict file (``torch.save(model.state_dict(), path)``), or None.

    Returns
    -------
    nn.Module
        The model, in eval mode.
    """
    if ":" not in spec:
        raise InputError(f"model {spec!r} is not of the form torchvision:NAME, timm:NAME, hf:DIR or "
                         f"package.module:FACTORY")
    source, _, name = spec.partition(":")
    if source == "hf":
        if weights is not None:
            raise InputError("--weights is for torchvision, timm and factory models; hf:DIR has its weights in DIR")
        pretrained = open_pretrained(name)
        if not pretrained.image:
            raise InputError(f"the model in {name!r} is a text model ({pretrained.architecture}); explain text with "
                             f"--text TEXT")
        return pretrained.load_model()
    state_dict = read_state_dict(weights) if weights is not None else None
    if source == "torchvision":
        model = _torchvision_model(name, state_dict)
    elif source == "timm":
        model = _timm_model(name, classes_of(state_dict) if state_dict is not None else None)
    else:
        model = _imported_model(spec)
    if state_dict is not None:
        try:
            model.load_state_dict(state_dict)
        except RuntimeError as error:
            detail = " ".join(str(error).split())[:300]
            raise InputError(f"weights {str(weights)!r} do not fit {spec}: {detail}") from None
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Hugging Face models saved with save_pretrained

_HF_MODELS = (("ForSequenceClassification", "AutoModelForSequenceClassification"),
              ("ForCausalLM", "AutoModelForCausalLM"), ("LMHeadModel", "AutoModelForCausalLM"),
              ("ForImageClassification", "AutoModelForImageClassification"),
              ("ForConditionalGeneration", "AutoModelForSeq2SeqLM"))
_IMAGE_LOADERS = ("AutoModelForImageClassification",)
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model")
_IMAGE_PROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class Pretrained:
    """What a ``save_pretrained`` directory holds, read before the weights: the config, the Auto
    class the config's ``architectures`` call for, the tokenizer (text models) or the image
    processor (image models; None where the directory has none)."""

    directory: Path
    config: Any
    loader: str
    tokenizer: Any
    architecture: str = ""
    image_processor: Any = None

    @property
    def causal(self) -> bool:
        return self.loader == "AutoModelForCausalLM"

    @property
    def seq2seq(self) -> bool:
        """An encoder-decoder language model (T5, BART): text in, text generated."""
        return self.loader == "AutoModelForSeq2SeqLM"

    @property
    def image(self) -> bool:
        return self.loader in _IMAGE_LOADERS

    @property
    def outputs(self) -> int:
        """Number of logits: classes of a classifier, the vocabulary of a language model."""
        return int(self.config.vocab_size if self.causal or self.seq2seq else self.config.num_labels)

    def load_model(self) -> nn.Module:
        """The model in float32 and eval mode (transformers' loading progress bar kept quiet)."""
        import transformers
        from transformers.utils import logging

        quiet = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            model = getattr(transformers, self.loader).from_pretrained(self.directory, local_files_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable model gets the same one-line answer
            raise InputError(f"cannot load the model in {str(self.directory)!r}: {_first_sentence(error)}") from None
        finally:
            if quiet:
                logging.enable_progress_bar()
        return model.float().eval()


def open_pretrained(directory: str) -> Pretrained:
    """The config and tokenizer (or image processor) of a directory written by
    ``model.save_pretrained(DIR)`` and ``tokenizer.save_pretrained(DIR)`` (or
    ``image_processor.save_pretrained(DIR)``). No downloads.

    Parameters
    ----------
    directory
        The directory: a sequence classifier (``...ForSequenceClassification``), a causal
        language model (``...ForCausalLM``, ``...LMHeadModel``) or an image classifier
        (``...ForImageClassification``).

    Returns
    -------
    Pretrained
        What the directory holds, the weights not yet loaded.
    """
    path = Path(directory)
    if not directory:
        raise InputError("--model hf: needs a directory: hf:DIR, where model.save_pretrained(DIR) wrote the model")
    if not path.is_dir():
        raise InputError(f"model directory {directory!r} does not exist")
    if not (path / "config.json").is_file():
        raise InputError(f"{directory!r} has no config.json; save the model there with model.save_pretrained(DIR)")
    try:
        import transformers
    except ImportError:
        raise InputError("hf: models need the transformers package: pip install 'fxlrp[text]'") from None
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read {str(path / 'config.json')!r}: {_first_sentence(error)}") from None
    architectures = list(getattr(config, "architectures", None) or [])
    found = next(((name, auto) for name in architectures for suffix, auto in _HF_MODELS if name.endswith(suffix)),
                 None)
    if found is None:
        raise InputError(f"the model in {directory!r} is {', '.join(architectures) or 'of no named architecture'}; "
                         f"fxlrp explain takes sequence classifiers (...ForSequenceClassification), causal language "
                         f"models (...ForCausalLM), encoder-decoder language models (...ForConditionalGeneration, "
                         f"with --generate) and image classifiers (...ForImageClassification)")
    architecture, loader = found
    if loader in _IMAGE_LOADERS:
        processor = None
        if (path / _IMAGE_PROCESSOR_FILE).is_file():
            try:
                processor = transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True)
            except Exception as error:  # noqa: BLE001
                raise InputError(f"cannot read the image processor in {directory!r}: {_first_sentence(error)}") \
                    from None
        return Pretrained(path, config, loader, None, architecture, processor)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise InputError(f"no tokenizer in {directory!r}; save it there with tokenizer.save_pretrained(DIR)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read the tokenizer in {directory!r}: {_first_sentence(error)}") from None
    return Pretrained(path, config, loader, tokenizer, architecture)


def first_layer_channels(model: nn.Module, default: int = 3) -> int:
    """Input channels of the first convolution (what images must be turned into)."""
    for module in model.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return int(module.in_channels)
    return default


# ---------------------------------------------------------------------------------------------
# composites


def _composite_factories() -> dict[str, Callable[[Preprocessing], Any]]:
    """The composite for each name of :data:`COMPOSITE_NAMES`; EpsilonGammaBox gets the input's bounds."""
    return {
        "epsilon": lambda _: rules.Epsilon(1e-6),
        "lrp0": lambda _: rules.Epsilon(0.0),
        "epsilon_plus": lambda _: composites.EpsilonPlus(),
        "epsilon_plus_flat": lambda _: composites.EpsilonPlusFlat(),
        "epsilon_alpha2_beta1": lambda _: composites.EpsilonAlpha2Beta1(),
        "epsilon_alpha2_beta1_flat": lambda _: composites.EpsilonAlpha2Beta1Flat(),
        "epsilon_gamma_box": lambda preprocessing: composites.EpsilonGammaBox(*preprocessing.input_bounds()),
        "attnlrp": lambda _: composites.AttnLRP(),
        "cplrp": lambda _: composites.CPLRP(),
    }


def composite_names() -> list[str]:
    """The composite names the command line accepts.

    Returns
    -------
    list of str
        The names its ``--help`` lists, each known to :func:`composite_by_name`.
    """
    return list(COMPOSITE_NAMES)


def composite_by_name(name: str, preprocessing: Preprocessing) -> Any:
    """The composite (or single rule) for a command-line name such as ``epsilon_plus_flat``."""
    factories = _composite_factories()
    key = name.lower().replace("-", "_")
    if key not in factories:
        raise InputError(f"unknown composite {name!r}; choose one of {', '.join(factories)}")
    return factories[key](preprocessing)


# ---------------------------------------------------------------------------------------------
# images


def _read_tensor_file(path: Path) -> Tensor:
    try:
        if path.suffix == ".npy":
            values = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            values = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read tensor file {str(path)!r}: {_first_sentence(error)}") from None
    if not isinstance(values, Tensor):
        raise InputError(f"{str(path)!r} holds a {type(values).__name__}, not a tensor")
    return values.float()


def _read_image_file(path: Path, preprocessing: Preprocessing) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    if preprocessing.dims != 3:
        how = f" ({preprocessing.description})" if preprocessing.description else ""
        raise InputError(f"{str(path)!r} is an image; the model takes video clips: give .pt/.npy tensors "
                         f"{preprocessing.sample_layout}{how}")
    try:
        with Image.open(path) as picture:
            picture = picture.convert("L" if preprocessing.channels == 1 else "RGB")
            if preprocessing.transform is not None:
                values = preprocessing.transform(picture)
                return values if isinstance(values, Tensor) else torch.as_tensor(np.asarray(values))
            if preprocessing.size is not None:
                picture = picture.resize((preprocessing.size, preprocessing.size), Image.Resampling.BILINEAR)
            pixels = np.asarray(picture, dtype=np.float32) / 255.0
    except UnidentifiedImageError:
        raise InputError(f"{str(path)!r} is not an image pillow can read (or a .pt/.npy tensor)") from None
    except (OSError, ValueError, SyntaxError) as error:  # a damaged file: pillow fails while decoding it
        raise InputError(f"{str(path)!r} cannot be decoded: {_first_sentence(error)}") from None
    if pixels.ndim == 2:
        pixels = pixels[None]
    else:
        pixels = pixels.transpose(2, 0, 1)
    if pixels.shape[0] != preprocessing.channels:
        raise InputError(f"{str(path)!r} has {pixels.shape[0]} channels, the model takes {preprocessing.channels}")
    mean = torch.tensor(preprocessing.mean).reshape(-1, 1, 1)
    std = torch.tensor(preprocessing.std).reshape(-1, 1, 1)
    return (torch.from_numpy(pixels.copy()) - mean) / std


def non_finite(values: Tensor) -> str | None:
    """Why a sample cannot be explained if it holds NaN or Inf.

    Parameters
    ----------
    values
        One sample.

    Returns
    -------
    str or None
        How many NaN and Inf it holds (its relevance, and that of every value it meets in the
        model, would be NaN), as the end of a sentence naming it; None when all are finite.
    """
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(values).sum())
    infinite = int((~finite).sum()) - nan
    found = " and ".join(f"{count} {kind}" for count, kind in ((nan, "NaN"), (infinite, "Inf")) if count)
    return f"has {found} among its {values.numel()} values (its relevance would be NaN)"


def read_input(path: str | Path, preprocessing: Preprocessing) -> Tensor:
    """One model input: ``[channels, height, width]`` (``[channels, frames, height, width]`` for
    a video model).

    Parameters
    ----------
    path
        An image file, or a ``.pt``/``.npy`` tensor file.
    preprocessing
        How image files are resized, converted to the model's channels and normalised (the
        model's own transform where it has one); tensor files are taken as they are (already
        preprocessed) and must have the shape of one sample (without the channel dimension for
        one channel).

    Returns
    -------
    Tensor
        The sample, float32; an :class:`InputError` if it cannot be read or holds NaN or Inf.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"image {str(path)!r} does not exist")
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        values = _read_image_file(path, preprocessing)
    else:
        values = _read_tensor_file(path)
        if values.dim() == preprocessing.dims - 1 and preprocessing.channels == 1:
            values = values[None]
        if values.dim() != preprocessing.dims or values.shape[0] != preprocessing.channels:
            layout = preprocessing.sample_layout.replace("channels", str(preprocessing.channels), 1)
            raise InputError(f"{str(path)!r} has shape {tuple(values.shape)}; the model takes {layout}")
    problem = non_finite(values)
    if problem is not None:
        raise InputError(f"{str(path)!r} {problem}; replace them or remove the file")
    return values


def stack_inputs(paths: Sequence[str | Path], preprocessing: Preprocessing) -> Tensor:
    """A batch ``[n, channels, height, width]``; all inputs must end up the same size."""
    return torch.stack([read_input(path, preprocessing) for path in paths])


def check_inputs(paths: Sequence[str | Path], preprocessing: Preprocessing) -> tuple[int, ...]:
    """Read every input once, before any work starts, so that a bad file among many fails
    fast; returns the common shape ``(channels, height, width)``."""
    missing = [str(path) for path in paths if not Path(path).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"image {missing[0]!r} does not exist{more}")
    shapes = {Path(path).name: tuple(read_input(path, preprocessing).shape) for path in paths}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name} {shape[1:]}" for name, shape in list(shapes.items())[:4])
        raise InputError(f"inputs differ in size ({listing}, ...); pass --size to resize images")
    return next(iter(shapes.values()))


# ---------------------------------------------------------------------------------------------
# preprocessing: the model's own


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _torchvision_preprocessing(name: str, model: nn.Module, channels: int) -> Preprocessing:
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
        described = f"torchvision {type(member).__name__}.{member.name}.transforms(): {_one_line(repr(transform))}"
        if family == "video":
            return Preprocessing(None, channels, mean, std, None, f"taken as given: preprocess the clips with "
                                 f"{type(member).__name__}.{member.name}.transforms()", dims=4)
        return Preprocessing(crop[0] if crop else None, channels, mean, std, transform, described)
    size = fixed if isinstance(fixed, int) else 224
    return Preprocessing(size, channels, IMAGENET_MEAN, IMAGENET_STD, dims=4 if family == "video" else 3)


def _timm_preprocessing(model: nn.Module, channels: int) -> Preprocessing:
    """A timm model's preprocessing from its own data config: input size, interpolation, mean,
    std, crop (``timm.data.resolve_model_data_config``), applied by timm's eval transform."""
    import timm.data

    config = timm.data.resolve_model_data_config(model)
    transform = timm.data.create_transform(**config, is_training=False)
    described = "timm data config " + json.dumps({key: list(value) if isinstance(value, tuple) else value
                                                  for key, value in config.items()}, sort_keys=True)
    size = int(config["input_size"][-1])
    return Preprocessing(size, channels, tuple(config["mean"]), tuple(config["std"]), transform, described)


class _ImageProcessorTransform:
    """A Hugging Face image processor as a transform of one PIL image (picklable, for
    ``DataLoader`` workers)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, picture: Any) -> Tensor:
        return self.processor(images=picture, return_tensors="pt")["pixel_values"][0].float()


def _hf_preprocessing(directory: str, channels: int) -> Preprocessing:
    """A Hugging Face image model's preprocessing: its saved image processor; without one, a
    resize to the config's ``image_size`` and pixels in [0, 1]."""
    pretrained = open_pretrained(directory)
    processor = pretrained.image_processor
    size = getattr(pretrained.config, "image_size", None)
    size = size if isinstance(size, int) else None
    if processor is None:
        return Preprocessing(size, channels, (0.0,) * channels, (1.0,) * channels)
    normalises = getattr(processor, "do_normalize", True) and getattr(processor, "image_mean", None) is not None
    mean = tuple(float(value) for value in processor.image_mean) if normalises else (0.0,) * channels
    std = tuple(float(value) for value in processor.image_std) if normalises else (1.0,) * channels
    described = f"image processor {_one_line(processor.to_json_string())}"
    return Preprocessing(size, channels, mean, std, _ImageProcessorTransform(processor), described)


def model_preprocessing(spec: str, model: nn.Module) -> Preprocessing:
    """The preprocessing a model's source prescribes for image files.

    Parameters
    ----------
    spec
        The ``--model`` spec (``torchvision:NAME``, ``timm:NAME``, ``hf:DIR``, ``package.module:FACTORY``).
    model
        The model it gave; a factory's timm model (one with timm's ``pretrained_cfg``) gets timm's
        data config too.

    Returns
    -------
    Preprocessing
        torchvision: its weights' ``transforms()``; timm: its data config; hf: its image processor;
        other models: the image as it is (no resize), pixels in [0, 1].
    """
    channels = first_layer_channels(model)
    source, _, name = spec.partition(":")
    if source == "torchvision":
        return _torchvision_preprocessing(name, model, channels)
    if source == "timm" or isinstance(getattr(model, "pretrained_cfg", None), Mapping):
        return _timm_preprocessing(model, channels)
    if source == "hf":
        return _hf_preprocessing(name, channels)
    return Preprocessing(None, channels, (0.0,) * channels, (1.0,) * channels)


def _preprocessing(args: argparse.Namespace, model: torch.nn.Module) -> Preprocessing:
    """The model's own preprocessing (:func:`model_preprocessing`), or, with ``--size``, ``--mean``
    or ``--std``, a resize to SIZE x SIZE (default: the model's input size) and ``(x - mean) / std``
    (defaults: the model's)."""
    own = model_preprocessing(args.model, model)
    size, mean, std = getattr(args, "size", None), getattr(args, "mean", None), getattr(args, "std", None)
    if size is None and mean is None and std is None:
        return own
    channels = own.channels
    mean, std = mean or own.mean, std or own.std
    for name, values in (("--mean", mean), ("--std", std)):
        if len(values) != channels:
            raise InputError(f"{name} has {len(values)} values; the model takes {channels} channels")
    if any(value <= 0 for value in std):
        raise InputError("--std values must be positive")
    if size is not None and size < 1:
        raise InputError(f"--size must be positive, got {size}")
    return Preprocessing(size or own.size, channels, tuple(mean), tuple(std), dims=own.dims)


# ---------------------------------------------------------------------------------------------
# what the model's output means


def explained_output(result: Any) -> Tensor:
    """The tensor the command line explains in a model's result.

    Parameters
    ----------
    result
        What the model returns.

    Returns
    -------
    Tensor
        The result itself, a torchvision segmentation model's ``"out"`` (not its ``"aux"``
        training head) or a Hugging Face output's ``logits``; an :class:`InputError` for anything
        else.
    """
    if isinstance(result, Tensor):
        return result
    if isinstance(result, Mapping) and isinstance(result.get("out"), Tensor):
        return result["out"]
    logits = getattr(result, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    raise InputError(f"the model returns a {type(result).__name__}; fxlrp explain needs a classifier returning "
                     f"[batch, classes] scores or a segmentation model returning [batch, classes, height, width]")


def class_scores(output: Tensor) -> Tensor:
    """The ``[batch, classes]`` scores of an explained output.

    Parameters
    ----------
    output
        A classifier's ``[batch, classes]`` logits, or an image-shaped output ``[batch, classes,
        height, width]`` (a segmentation model's).

    Returns
    -------
    Tensor
        The logits; for an image-shaped output each class's logits summed over the pixels, which
        is what explaining a class over the image explains. An :class:`InputError` for other
        shapes.
    """
    if output.dim() == 2:
        return output
    if output.dim() >= 4:
        return output.sum(dim=tuple(range(2, output.dim())))
    raise InputError(f"fxlrp explain needs a classifier returning [batch, classes] scores or a segmentation model "
                     f"returning [batch, classes, height, width]; this model returns shape {list(output.shape)}")


def probe_model(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> tuple[Tensor, bool]:
    """The ``[batch, classes]`` scores of ``inputs`` (:func:`class_scores`), without relevance, and
    whether the model's output is image-shaped (a segmentation model's).

    Parameters
    ----------
    explain
        The explainer (or the model).
    inputs
        A batch of inputs.
    paths
        Their names, for the message when the model cannot take them.

    Returns
    -------
    tuple
        The scores and whether they are summed over pixels.
    """
    try:  # (the explainer's forward runs its traced graph; the model's own refusal is what the user can act on)
        with torch.no_grad(), model_consulted(explain, model_of(explain), (inputs,), {}):
            result = explain(inputs)
    except ExplanationInputError as error:
        raise InputError(f"{paths[0]}: {error}") from None
    output = explained_output(result)
    return class_scores(output), output.dim() > 2


def _run_model(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str]) -> torch.Tensor:
    """The ``[batch, classes]`` scores of ``inputs`` (:func:`class_scores`), without relevance."""
    return probe_model(explain, inputs, paths)[0]


def _targets(target: int | tuple[int, int] | None, logits: torch.Tensor) -> torch.Tensor:
    """Each sample's class: ``target``'s (a contrast's first class), or the predicted one; checked to exist."""
    classes = logits.shape[1]
    if target is None:
        return logits.argmax(dim=1)
    for index in target if isinstance(target, tuple) else (target,):
        if not 0 <= index < classes:
            raise InputError(f"--target {index} is out of range: the model has {classes} classes (0..{classes - 1})")
    first = target[0] if isinstance(target, tuple) else target
    return torch.full((logits.shape[0],), first, dtype=torch.long)


def unexplainable(scores: Tensor, relevance: Tensor, dtype: str = "float32") -> list[str | None]:
    """Per sample, why its explanation cannot be used (its scores or relevance NaN or Inf), or None.

    Parameters
    ----------
    scores
        ``[batch, classes]`` scores (:func:`class_scores`).
    relevance
        ``[batch, ...]`` relevance of the inputs.
    dtype
        The precision the model ran in (``--dtype``), for the advice.

    Returns
    -------
    list
        One entry per sample.
    """
    advice = ("; float16 holds values up to 65504: use --dtype bfloat16 or float32" if dtype == "float16"
              else "")
    scores_finite = torch.isfinite(scores.detach()).flatten(1).all(dim=1).tolist()
    relevance_finite = torch.isfinite(relevance.detach()).flatten(1).all(dim=1).tolist()
    reasons: list[str | None] = []
    for scores_ok, relevance_ok in zip(scores_finite, relevance_finite, strict=True):
        if not scores_ok:
            reasons.append(f"the model's output is NaN or Inf for it: an activation overflowed{advice}")
        elif not relevance_ok:
            reasons.append(f"its relevance came out NaN or Inf: relevance divided by a near-zero output overflowed"
                           f"{advice or '; choose a composite with a larger stabiliser (--composite)'}")
        else:
            reasons.append(None)
    return reasons
