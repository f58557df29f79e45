"""``--model hf:DIR``: a Hugging Face model saved with ``save_pretrained`` (a sequence classifier, a
causal language model or an image classifier), read without downloads, with its tokenizer or its
image processor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from fxlrp.app.cli_options import InputError, first_sentence, one_line
from fxlrp.app.preprocessing import Preprocessing

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
            raise InputError(f"cannot load the model in {str(self.directory)!r}: {first_sentence(error)}") from None
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
        raise InputError(f"cannot read {str(path / 'config.json')!r}: {first_sentence(error)}") from None
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
                raise InputError(f"cannot read the image processor in {directory!r}: {first_sentence(error)}") \
                    from None
        return Pretrained(path, config, loader, None, architecture, processor)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise InputError(f"no tokenizer in {directory!r}; save it there with tokenizer.save_pretrained(DIR)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"cannot read the tokenizer in {directory!r}: {first_sentence(error)}") from None
    return Pretrained(path, config, loader, tokenizer, architecture)


class _ImageProcessorTransform:
    """A Hugging Face image processor as a transform of one PIL image (picklable, for
    ``DataLoader`` workers)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, picture: Any) -> Tensor:
        return self.processor(images=picture, return_tensors="pt")["pixel_values"][0].float()


def huggingface_preprocessing(directory: str, channels: int) -> Preprocessing:
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
    described = f"image processor {one_line(processor.to_json_string())}"
    return Preprocessing(size, channels, mean, std, _ImageProcessorTransform(processor), described)
