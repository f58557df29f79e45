"""What the ``fxlrp`` commands do: ``explain`` images, data sets or text, ``report`` a model's
node/rule table, run the ``demo``. :mod:`fxlrp.app.cli` parses the command line and imports this
module (and with it torch) only to run a command, so that ``fxlrp --help`` starts at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import fxlrp
from fxlrp.app.cli_options import HF_PREFIX, InputError, first_sentence
from fxlrp.app.composites import composite_by_name
from fxlrp.app.devices import autocast, device_of, prepare_inputs, prepare_model
from fxlrp.app.explain_dataset import explains_data_set, run_dataset
from fxlrp.app.explain_prompts import run_prompt_data_set
from fxlrp.app.models.huggingface import Pretrained, open_pretrained
from fxlrp.app.models.spec import load_model, preprocessing_from_options
from fxlrp.app.outputs import checked_targets, explained_output, model_scores, probe_model, unexplainable
from fxlrp.app.preprocessing import Preprocessing
from fxlrp.app.readers import check_inputs, stack_inputs
from fxlrp.explain.attribute import attribute
from fxlrp.explain.compiled import compile as fxlrp_compile
from fxlrp.viz import generation as generation_pictures
from fxlrp.viz import text


def _convert(model: torch.nn.Module, composite: object) -> torch.nn.Module:
    return fxlrp.convert(model, composite)


def run_report(args: argparse.Namespace) -> int:
    """``fxlrp report MODEL``: print the explainer's node/operation/rule table.

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    int
        The exit code, 0; bad input raises :class:`InputError`.
    """
    if args.model.startswith(HF_PREFIX):
        print(_report_of_pretrained(args))
        return 0
    model = load_model(args.model, args.weights)
    composite = composite_by_name(args.composite, preprocessing_from_options(args, model))
    print(_convert(model, composite).report())
    return 0


def _report_of_pretrained(args: argparse.Namespace) -> str:
    """The report of an ``hf:DIR`` model after one explanation of an example input (a sentence, or
    a gray image of the model's size): a Hugging Face model runs eagerly, and what its run made is
    what the report lists."""
    if args.weights is not None:
        raise InputError("--weights is for torchvision, timm and factory models; hf:DIR has its weights in DIR")
    pretrained = open_pretrained(args.model[len(HF_PREFIX):])
    size = int(getattr(pretrained.config, "image_size", 224))
    name = args.composite or ("epsilon" if pretrained.image else "attnlrp")
    composite = composite_by_name(name, Preprocessing(size, 3, (0.5,) * 3, (0.5,) * 3))
    if pretrained.image:
        example, said = torch.zeros(1, int(getattr(pretrained.config, "num_channels", 3)), size, size), "a gray image"
    else:
        sentence = "The report explains this sentence."
        example, said = pretrained.tokenizer(sentence, return_tensors="pt")["input_ids"], repr(sentence)
    explain = _convert(pretrained.load_model(), composite)
    attribute(explain, example, target=None)
    explained = "token" if pretrained.causal else "class"
    return f"{explain.report()}\n(after one explanation of {said}, its predicted {explained})"


def _output_names(paths: Sequence[str]) -> list[str]:
    """File stems, numbered where two inputs share one."""
    names: list[str] = []
    for path in paths:
        stem, number = Path(path).stem, 1
        name = stem
        while name in names:
            number += 1
            name = f"{stem}_{number}"
        names.append(name)
    return names


def _explains_text(args: argparse.Namespace) -> bool:
    """Whether ``fxlrp explain`` explains text: ``--text``, or an hf: model that is not an image model."""
    if args.text is not None:
        return True
    return args.model.startswith(HF_PREFIX) and not open_pretrained(args.model[len(HF_PREFIX):]).image


def _as_picture(values: torch.Tensor) -> torch.Tensor:
    """A batch of images ``[n, C, H, W]`` as it is; video clips ``[n, C, T, H, W]`` as their frames
    side by side ``[n, C, H, T * W]``."""
    if values.dim() == 5:
        count, channels, frames, height, width = values.shape
        return values.permute(0, 1, 3, 2, 4).reshape(count, channels, height, frames * width)
    return values


def run_explain(args: argparse.Namespace) -> int:
    """``fxlrp explain``: image files into heatmap PNGs (a data set with ``--data``, text with
    ``--text`` or an hf: text model).

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    int
        The exit code, 0; bad input (a file that cannot be read, NaN or Inf in an input or its
        explanation) raises :class:`InputError` naming it.
    """
    from tqdm import tqdm

    from fxlrp.viz import image

    if args.region is not None and (_explains_text(args) or explains_data_set(args)):
        raise InputError("--region explains image files given on the command line, not --text or --data")
    if getattr(args, "concepts", None) is not None and _explains_text(args):
        raise InputError("--concepts finds the reference samples of concepts in a data set of images (--data), "
                         "not in --text")
    if _explains_text(args):
        if args.compile:
            raise InputError("--compile explains images and data sets, not --text")
        return run_explain_text(args)
    if explains_data_set(args):
        return run_dataset(args)
    if args.out is None:
        raise InputError("the following arguments are required: --out")
    if not args.images:
        raise InputError("the following arguments are required: IMAGE (image files to explain)")
    target = _class_index(args.target)
    region = _region(args)
    if isinstance(target, tuple) and (region is not None or args.compile):
        raise InputError(f"--target {args.target} (a contrast) explains a classifier's logits without "
                         f"{'--region' if region is not None else '--compile'}; give one class, or leave "
                         f"{'--region' if region is not None else '--compile'} out")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be positive, got {args.batch_size}")
    device = device_of(args.device)
    model = load_model(args.model, args.weights)
    preprocessing = preprocessing_from_options(args, model)
    composite = composite_by_name(args.composite or "epsilon", preprocessing)
    model = prepare_model(model, device, args.dtype)
    try:
        image.colour_map(args.cmap)
    except ValueError as error:
        raise InputError(str(error)) from None
    check_inputs(args.images, preprocessing)
    explain = _convert(model, composite)
    compiled = fxlrp_compile(explain, output=explained_output) if args.compile else None
    out = Path(args.out)  # (the first batch's model_scores fails before anything is written)
    names = _output_names(args.images)
    lines = []
    image_shaped = False
    with tqdm(total=len(args.images), unit="image", desc="explaining", file=sys.stderr,
              disable=None) as progress:
        for start in range(0, len(args.images), args.batch_size):
            paths = args.images[start:start + args.batch_size]
            inputs = prepare_inputs(stack_inputs(paths, preprocessing), device, args.dtype)
            with autocast(device, args.dtype):  # (float32 and float64: nothing)
                if start == 0:  # errors in the user's terms (input shape, target, output) before any work
                    logits, image_shaped = probe_model(explain, inputs[:1], paths)
                    if region is not None and not image_shaped:
                        raise InputError(f"--region takes a region of a segmentation model's output [batch, classes, "
                                         f"height, width]; this model's output has no height and width (its scores "
                                         f"have shape {list(logits.shape)}): leave --region out to explain a class")
                    checked_targets(target, logits)
                    if isinstance(target, tuple) and image_shaped:
                        raise InputError(f"--target {args.target} (a contrast of two logits) explains a classifier; "
                                         f"for this model's image-shaped output give one class")
                    if compiled is not None and image_shaped:
                        raise InputError("--compile explains classifiers ([batch, classes] outputs); explain a "
                                         "segmentation model without it")
                if compiled is not None:  # one pass gives the scores and the relevance
                    given = None if target is None else torch.full((len(paths),), target, device=device)
                    relevance, logits = compiled(inputs, given, return_output=True)
                    targets = checked_targets(target, logits)
                elif region is not None:  # the class's logits summed over the region
                    logits, scaled = _region_scores(explain, inputs, paths, region)
                    where = scaled.mask
                    targets = checked_targets(target, logits)
                    relevance = attribute(explain, inputs, target=fxlrp.Region(targets, mask=scaled.mask),
                                          output=explained_output, check_finite=False)
                else:
                    logits = model_scores(explain, inputs, paths)
                    targets = checked_targets(target, logits)
                    relevance = attribute(explain, inputs, target=target if isinstance(target, tuple) else targets,
                                          output=explained_output, check_finite=False)
            for path, problem in zip(paths, unexplainable(logits, relevance, args.dtype), strict=True):
                if problem is not None:
                    raise InputError(f"{path}: {problem}")
            stored = torch.float64 if args.dtype == "float64" else torch.float32  # (autocast's half: float32)
            inputs, relevance, logits = (values.detach().cpu().to(stored) for values in (inputs, relevance, logits))
            heatmaps = image.heatmap(_as_picture(relevance), args.cmap)
            overlays = image.overlay(_as_picture(inputs), _as_picture(relevance), args.cmap)
            for index, name in enumerate(names[start:start + len(paths)]):
                shown = _shown_size(paths[index], preprocessing, _as_picture(inputs).shape[-2:])
                heatmap = image.at_size(heatmaps[index], *shown)
                image.save_png(heatmap, out / f"{name}.heatmap.png", 1)
                image.save_png(image.at_size(overlays[index], *shown), out / f"{name}.overlay.png", 1)
                explained = int(targets[index])  # (not `target`: the next batch needs the option)
                if region is not None:
                    picture = _as_picture(inputs[index:index + 1])[0]
                    outline = _region_in_picture(where[index:index + 1].cpu(), picture.shape[-2:])
                    outlined = image.with_region(
                        picture, _as_picture(relevance[index:index + 1])[0], outline, args.cmap,
                        title=f"{args.model}, class {explained} over the box, {args.composite or 'epsilon'}",
                        label=f"class {explained}", scale=image.readable_scale(*picture.shape[-2:]))
                    image.save_png(outlined, out / f"{name}.region.png", 1)
                what = "logits summed over the pixels" if image_shaped else "output"
                if region is not None:
                    what = "logits summed over the box ({:g}, {:g}, {:g}, {:g})".format(*region.box)
                said, named = f"class {explained} ({what} {logits[index, explained]:.3g})", f"class {explained}"
                if isinstance(target, tuple):
                    said = (f"class {target[0]} minus class {target[1]} (output {logits[index, target[0]]:.3g} - "
                            f"{logits[index, target[1]]:.3g})")
                    named = f"class {target[0]} minus class {target[1]}"
                largest = float(np.abs(image.reduce_channels(_as_picture(relevance[index:index + 1]))).max())
                figure, _ = image.with_colour_bar(heatmap, largest, f"{args.model}, {named}, "
                                                                    f"{args.composite or 'epsilon'}", args.cmap)
                image.save_png(figure, out / f"{name}.figure.png", 1)
                lines.append(f"{paths[index]}: {said}, relevance sum {relevance[index].sum():.3g} -> "
                             f"{out / name}.figure.png")
            progress.update(len(paths))
    print("\n".join(lines))
    return 0


def _shown_size(path: str, preprocessing: Preprocessing, size: Sequence[int]) -> tuple[int, int]:
    """The size an input's pictures are saved at: the image file's aspect where the preprocessing
    squashed it to a square (``--size``, or a model's own size without its transform; a crop's
    aspect is the input's), the input's otherwise; the short side at least
    :data:`fxlrp.viz.image.READABLE_SIDE` pixels."""
    from fxlrp.viz import image

    height, width = int(size[0]), int(size[1])
    side = max(image.READABLE_SIDE, min(height, width))  # (enlarged, never smaller than the input)
    squashed = preprocessing.transform is None and preprocessing.size is not None
    found = _image_file_size(path) if squashed else None
    if found is not None:
        height, width = found
    return image.shown_size(height, width, side)


def _region(args: argparse.Namespace) -> fxlrp.Region | None:
    """``--region X0,Y0,X1,Y1`` as a region (its class given later), checked; None without it."""
    if args.region is None:
        return None
    if args.compile:
        raise InputError("--region explains image files without --compile; leave one of them out")
    if len(args.region) != 4:
        raise InputError(f"--region takes four numbers X0,Y0,X1,Y1 (a box in the image file's pixels), got "
                         f"{len(args.region)}: {','.join(f'{value:g}' for value in args.region)}")
    try:
        return fxlrp.Region(None, box=args.region)
    except fxlrp.ExplanationInputError as error:
        raise InputError(f"--region: {error}") from None


def _region_scores(explain: torch.nn.Module, inputs: torch.Tensor, paths: Sequence[str],
                   region: fxlrp.Region) -> tuple[torch.Tensor, fxlrp.Region]:
    """Each class's logits summed over ``region`` ``[batch, classes]``, and the region in the
    output's pixels (a mask ``[batch, *spatial]``): ``--region`` is a box in each image file's
    pixels, scaled as the model's preprocessing and the model scale the image to the output (a
    tensor file's box is in the output's pixels)."""
    with torch.no_grad():
        output = explained_output(explain(inputs))
    try:
        region.where(output)  # (an output without height and width: the error names it)
        spatial = output.shape[2:]
        masks = []
        for path in paths:
            box = torch.as_tensor(region.box, dtype=torch.float64)
            size = _image_file_size(path)
            if size is not None:
                box = box * torch.tensor([spatial[-1] / size[1], spatial[-2] / size[0]] * 2, dtype=torch.float64)
            masks.append(fxlrp.Region(None, box=box).where(output[:1])[0])
        scaled = fxlrp.Region(None, mask=torch.stack(masks))
    except fxlrp.ExplanationInputError as error:
        raise InputError(f"--region: {error}") from None
    where = scaled.where(output)
    scores = (output * where.unsqueeze(1).to(output.dtype)).sum(dim=tuple(range(2, output.dim())))
    return scores, scaled


def _image_file_size(path: str) -> tuple[int, int] | None:
    """An image file's ``(height, width)`` (read from its header); None for a tensor file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as picture:
            width, height = picture.size
    except (UnidentifiedImageError, OSError):
        return None
    return height, width


def _region_in_picture(where: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """A region of the output ``[1, *spatial]`` as a mask of the picture ``[height, width]`` (video
    frames side by side, as :func:`_as_picture` lays them), resized to it where the output is
    smaller than the image (nearest neighbour)."""
    mask = _as_picture(where[:, None].to(torch.float64))[0]
    if tuple(mask.shape[-2:]) != tuple(size):
        mask = torch.nn.functional.interpolate(mask[None], size=tuple(size), mode="nearest")[0]
    return mask[0] > 0.5


def _class_index(target: str | None) -> int | tuple[int, int] | None:
    """``--target``: a class index, or ``A,B`` (a contrast: logit A minus logit B); None without it."""
    if target is None:
        return None
    try:
        indices = tuple(int(part) for part in target.split(","))
    except ValueError:
        raise InputError(f"--target {target!r} is not a class index (a whole number) nor a contrast A,B of two "
                         f"class indices") from None
    if len(indices) > 2:
        raise InputError(f"--target {target!r} names {len(indices)} classes; give one class, or two A,B: logit A "
                         f"minus logit B")
    return indices[0] if len(indices) == 1 else (indices[0], indices[1])


# ---------------------------------------------------------------------------------------------
# text: Hugging Face models saved with save_pretrained

def _text_target(target: str | None, pretrained: Pretrained) -> int | None:
    """``--target`` as an index of the logits: a number, a label name (classifiers) or a token
    (language models); None without one (the highest logit)."""
    if target is None:
        return None
    size, tokenizer = pretrained.outputs, pretrained.tokenizer
    if target.lstrip("-").isdigit():
        index = int(target)
        if not 0 <= index < size:
            what = "token ids" if pretrained.causal else "classes"
            raise InputError(f"--target {index} is out of range: the model has {size} {what} (0..{size - 1})")
        return index
    if not pretrained.causal:
        names = getattr(pretrained.config, "id2label", None) or {}
        labels = {str(label): int(index) for index, label in names.items()}
        folded = {label.lower(): index for label, index in labels.items()}
        if target in labels or target.lower() in folded:
            return labels.get(target, folded.get(target.lower(), 0))
        raise InputError(f"--target {target!r} is neither a class index (0..{size - 1}) nor a label of the model "
                         f"({', '.join(labels) or 'it names none'})")
    if target in tokenizer.get_vocab():
        return int(tokenizer.convert_tokens_to_ids(target))
    ids = [int(value) for value in tokenizer(target, add_special_tokens=False)["input_ids"]]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    unknown = tokenizer.unk_token_id
    if len(ids) == 1 and (unknown is None or ids[0] != unknown):
        return ids[0]
    listing = " ".join(tokens) if tokens else "no tokens"
    ids_listing = ", ".join(f"{token!r} = {value}" for token, value in zip(tokens, ids, strict=True))
    instead = f"give one token as the vocabulary writes it or a token id (0..{size - 1})"
    if unknown is not None and unknown in ids:
        raise InputError(f"--target {target!r} is not a token of the model's vocabulary: it tokenises to {listing} "
                         f"({ids_listing}), where {tokenizer.unk_token!r} is the unknown token; {instead}")
    if not ids:
        raise InputError(f"--target {target!r} tokenises to no tokens; {instead}")
    raise InputError(f"--target {target!r} is {len(ids)} tokens ({listing}); give one token or a token id: "
                     f"a target is one token of the vocabulary ({ids_listing}), e.g. --target {tokens[0]!r} or "
                     f"--target {ids[0]}")


def run_explain_text(args: argparse.Namespace) -> int:
    """``fxlrp explain --model hf:DIR --text TEXT``: each text's tokens coloured by relevance.

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    int
        The exit code, 0; bad input raises :class:`InputError`.
    """
    if not args.model.startswith(HF_PREFIX):
        raise InputError(f"--text needs a Hugging Face model, --model hf:DIR (got {args.model!r})")
    if args.data is not None and args.generate is None:
        raise InputError("--data with an hf: text model is a file of prompts, one per line, whose continuations "
                         "are explained: give --generate N too")
    if args.data is not None and args.text:
        raise InputError("give --text or --data (a file of prompts), not both")
    if not args.text and args.data is None:
        raise InputError("hf: models explain text: pass --text TEXT")
    if args.images:
        raise InputError(f"give --text or image files, not both (got {args.images[0]!r})")
    if args.weights is not None:
        raise InputError("--weights is for torchvision, timm and factory models; hf:DIR has its weights in DIR")
    if any(not sentence.strip() for sentence in args.text or []):
        raise InputError("--text is empty")
    if args.generate is None and (args.sample or args.seed is not None):
        raise InputError(f"{'--sample' if args.sample else '--seed'} chooses how --generate N generates; give "
                         "--generate N too")
    composite_name = args.composite or "attnlrp"
    if composite_name.lower().replace("-", "_") == "epsilon_gamma_box":
        raise InputError("epsilon_gamma_box needs the value range of image pixels; for text use attnlrp, cplrp "
                         "or epsilon")
    composite = composite_by_name(composite_name, Preprocessing(None, 1, (0.0,), (1.0,)))
    pretrained = open_pretrained(args.model[len(HF_PREFIX):])
    if pretrained.image:
        raise InputError(f"the model in {str(pretrained.directory)!r} is an image classifier "
                         f"({pretrained.architecture}); give it image files or --data, not --text")
    if args.data is not None:
        _check_generation(args, pretrained)
        return run_prompt_data_set(args, pretrained, composite, composite_name,
                                   lambda model, explain, ids, prompt: explained_generation(
                                       args, model, explain, pretrained, ids, prompt))
    if pretrained.seq2seq and args.generate is None:
        raise InputError(f"the model in {str(pretrained.directory)!r} is an encoder-decoder model "
                         f"({pretrained.architecture}): fxlrp explains what it generates; give --generate N")
    tokenizer, limit = pretrained.tokenizer, getattr(pretrained.config, "max_position_embeddings", None)
    inputs = [tokenizer(sentence, return_tensors="pt")["input_ids"] for sentence in args.text]
    added = 0 if args.generate is None else max(args.generate, 0)
    for sentence, ids in zip(args.text, inputs, strict=True):
        if limit is not None and ids.shape[1] + added > limit:
            generated = f" and {added} generated ones" if added else ""
            raise InputError(f"the text {sentence[:30]!r}... has {ids.shape[1]} tokens{generated}; the model takes "
                             f"at most {limit}")
    if args.generate is not None:
        return _run_explain_generation(args, pretrained, inputs, composite, composite_name)
    target = _text_target(args.target, pretrained)
    model = pretrained.load_model()
    explain = _convert(model, composite)
    fragments, lines = [], []
    for sentence, ids in zip(args.text, inputs, strict=True):
        try:
            with torch.no_grad():
                logits = model(input_ids=ids).logits
        except (RuntimeError, IndexError, ValueError) as error:
            raise InputError(f"the model cannot take the text {sentence[:30]!r}: {first_sentence(error)}") from None
        logits = logits[0, -1] if logits.dim() == 3 else logits[0]
        explained = int(logits.argmax()) if target is None else target
        relevance = attribute(explain, ids, target=explained)[0]
        if pretrained.causal:
            what = f"next token {text.token_text(tokenizer, explained)} (id {explained}, "
        else:
            what = f"class {explained} {model.config.id2label.get(explained, explained)!r} ("
        heading = f"{what}logit {logits[explained]:.4g}), relevance sum {relevance.sum():.4g}, {composite_name}"
        tokens = text.tokens_of(tokenizer, ids[0])
        lines += [heading, text.terminal(tokens, relevance, merge_subwords=args.merge_subwords)]
        fragments.append(text.html(tokens, relevance, merge_subwords=args.merge_subwords, title=heading))
    if args.out is not None:
        path = text.save_html(Path(args.out) / "explanation.html", *fragments,
                              title=f"fxlrp: {pretrained.directory.name}")
        lines.append(f"-> {path}")
    print("\n".join(lines))
    return 0


def _run_explain_generation(args: argparse.Namespace, pretrained: Pretrained, inputs: list[torch.Tensor],
                            composite: object, composite_name: str) -> int:
    """``fxlrp explain --model hf:DIR --text TEXT --generate N``: generate N tokens after each text
    and explain each over the tokens before it (:func:`fxlrp.explain_generation`); print the
    continuation with each token's strongest context tokens, and with ``--out`` write the matrix
    (``generation-I.npy``), the page and the matrix picture of each text ``I``."""
    _check_generation(args, pretrained)
    tokenizer = pretrained.tokenizer
    model = pretrained.load_model().to(torch.float64 if args.dtype == "float64" else torch.float32)
    explain = _convert(model, composite)
    out = None if args.out is None else Path(args.out)
    lines = []
    for index, (sentence, ids) in enumerate(zip(args.text, inputs, strict=True)):
        explanation = explained_generation(args, model, explain, pretrained, ids, sentence)
        sequences = explanation.sequences
        tokens = text.tokens_of(tokenizer, sequences[0])
        # (an encoder-decoder model's rows reach its input too)
        source = None if explanation.source_ids is None else text.tokens_of(tokenizer, explanation.source_ids[0])
        continuation = tokenizer.decode(sequences[0, explanation.start:], skip_special_tokens=explanation.source_ids
                                        is not None)
        how = "sampled" if args.sample else "greedy"
        lines.append(f"{sentence!r} + {args.generate} tokens ({how}): {continuation!r}, {composite_name}")
        lines.append(generation_pictures.terminal(explanation, tokens, source_tokens=source).rstrip("\n"))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            matrix = out / f"generation-{index}.npy"
            np.save(matrix, explanation.relevance[0].numpy())  # (in the model's float32 or float64)
            if explanation.source_relevance is not None:  # (an encoder-decoder model: over its input too)
                np.save(out / f"generation-{index}.source.npy", explanation.source_relevance[0].numpy())
            page = generation_pictures.save_html(out / f"generation-{index}.html", explanation, tokens,
                                                 source_tokens=source, title=f"fxlrp: {sentence[:60]}")
            picture = generation_pictures.save_png(out / f"generation-{index}.png", explanation, tokens, sample=0,
                                                   source_tokens=source)
            lines.append(f"-> {matrix}, {page}, {picture}")
    print("\n".join(lines))
    return 0


def _check_generation(args: argparse.Namespace, pretrained: Pretrained) -> None:
    """``--generate N`` and the options that go with it checked (for ``--text`` and ``--data`` alike)."""
    if not (pretrained.causal or pretrained.seq2seq):
        raise InputError(f"--generate needs a causal language model or an encoder-decoder model; the model in "
                         f"{str(pretrained.directory)!r} is {pretrained.architecture}")
    if args.target is not None:
        raise InputError("--target explains one next token; with --generate each generated token is explained "
                         "(leave --target out)")
    if args.merge_subwords:
        raise InputError("--merge-subwords shows the words of one explained text; with --generate each generated "
                         "token is listed with its context tokens (leave --merge-subwords out)")
    if args.generate < 1:
        raise InputError(f"--generate takes the number of tokens to generate, at least 1; got {args.generate}")
    if args.dtype not in ("float32", "float64"):
        raise InputError(f"--dtype {args.dtype}: explaining generated text runs the model in float32 or float64")
    if args.seed is not None and not args.sample:
        raise InputError("--seed seeds --sample; greedy generation (the default) draws nothing")


def explained_generation(args: argparse.Namespace, model: torch.nn.Module, explain: torch.nn.Module,
                         pretrained: Pretrained, ids: torch.Tensor, prompt: str) -> fxlrp.GenerationExplanation:
    """Generate after one prompt (``ids`` [1, length]) and explain each generated token
    (:func:`fxlrp.explain_generation`): over the prompt and the tokens before it for a causal
    language model; for an encoder-decoder model, over the prompt (the encoder's input,
    ``source_relevance``) and the decoder's tokens before it, from the decoder's start token."""
    sequences = generated_sequences(args, model, pretrained.tokenizer, ids, prompt)
    if pretrained.seq2seq:
        return fxlrp.explain_generation(explain, sequences, 1, source=ids, source_mask=torch.ones_like(ids))
    return fxlrp.explain_generation(explain, sequences, ids.shape[1])


def generated_sequences(args: argparse.Namespace, model: torch.nn.Module, tokenizer: object, ids: torch.Tensor,
                        sentence: str) -> torch.Tensor:
    """``model.generate`` of ``--generate N`` tokens after one prompt's ``ids`` [1, length]
    (greedy, or sampled after seeding with ``--seed``): prompt and continuation."""
    if args.sample:
        torch.manual_seed(0 if args.seed is None else args.seed)
    settings = {"do_sample": args.sample, "max_new_tokens": args.generate, "min_new_tokens": args.generate,
                "attention_mask": torch.ones_like(ids)}
    if getattr(tokenizer, "pad_token_id", None) is None and getattr(model.generation_config, "pad_token_id",
                                                                    None) is None:
        settings["pad_token_id"] = tokenizer.eos_token_id  # (one sequence: nothing is padded)
    try:
        with torch.no_grad():
            return model.generate(ids, **settings)
    except (RuntimeError, IndexError, ValueError) as error:
        raise InputError(f"the model cannot generate after the text {sentence[:30]!r}: "
                         f"{first_sentence(error)}") from None


def run_demo(args: argparse.Namespace) -> int:
    """``fxlrp demo``: the README's three explanations.

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    int
        The exit code, 0.
    """
    from fxlrp.app.demo import run

    run(Path(args.out), fast=args.fast)
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """``fxlrp evaluate``: composites ranked by ABPC over a data set (:mod:`fxlrp.app.evaluate_dataset`).

    Parameters
    ----------
    args
        The parsed command line.

    Returns
    -------
    int
        The exit code, 0; bad input raises :class:`InputError`.
    """
    from fxlrp.app.evaluate_dataset import run_evaluate as evaluate

    return evaluate(args)


COMMANDS = {"explain": run_explain, "evaluate": run_evaluate, "report": run_report, "demo": run_demo}
