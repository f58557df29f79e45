"""What a block of the docs takes from the reader, made small: the setups of
``tests/app/test_docs_examples.py``.

A block preceded by ``<!-- runs after the setup NAME (tests/support/doc_setups.py): REASON -->``
uses something the reader brings (a model folder of their own, a data set, the folder a command
line run wrote). Before the block runs, ``NAME(namespace)`` makes a tiny stand-in in the block's
working folder and namespace: random weights from configs, tokenizers built here, generated
images, the command line run on them with small sizes. The block itself runs as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from support import tokenizers

Namespace = dict[str, Any]


def _save_language_model(folder: str) -> tuple[nn.Module, Any]:
    """A 2-layer GPT-2 with random weights and a byte-level tokenizer, saved to ``folder``."""
    import transformers

    torch.manual_seed(0)
    tokenizer = tokenizers.bytelevel_tokenizer(["once upon a time", "the capital of France is Paris", "a time of day"],
                                               pad_token="<|endoftext|>")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=2, n_head=2,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def sequence_classifier_in_my_model(namespace: Namespace) -> None:
    """The folder ``my-model``: a 2-layer BERT classifier with random weights and its tokenizer."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=2)
    transformers.BertForSequenceClassification(config).save_pretrained("my-model")
    tokenizers.wordpiece_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "plot", "was", "thin", ",",
                                    "but", "acting", "good", "."]).save_pretrained("my-model")


def language_model_in_my_lm(namespace: Namespace) -> None:
    """The folder ``my-lm``: a tiny causal language model and its tokenizer."""
    _save_language_model("my-lm")


def language_model_in_my_model(namespace: Namespace) -> None:
    """The folder ``my-model``: a tiny causal language model and its tokenizer."""
    _save_language_model("my-model")


def generation_explanation(namespace: Namespace) -> None:
    """``tokenizer`` and ``explanation``: a tiny language model's continuation of a prompt, explained."""
    import fxlrp

    model, tokenizer = _save_language_model("my-model")
    inputs = tokenizer("Once upon a time", return_tensors="pt")
    sequences = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP(0.0))
    namespace.update(tokenizer=tokenizer, explanation=fxlrp.explain_generation(
        explain, sequences, start=inputs["input_ids"].shape[1]))


def generated_texts_folder(namespace: Namespace) -> None:
    """The folder ``DIR`` that ``fxlrp explain --data prompts.txt --generate 3`` writes, for two
    prompts and a tiny language model."""
    from fxlrp.app import cli

    _save_language_model("my-model")
    Path("prompts.txt").write_text("Once upon a time\nThe capital of France is\n", encoding="utf-8")
    _command_line(cli, ["explain", "--model", "hf:my-model", "--data", "prompts.txt", "--generate", "3",
                        "--out", "DIR"])


def generated_texts_folder_of_an_encoder_decoder(namespace: Namespace) -> None:
    """The folder ``DIR`` that ``fxlrp explain --data prompts.txt --generate 3`` writes, for two
    prompts and a tiny encoder-decoder model (a one-layer T5 with random weights), in place of one
    an earlier block's setup wrote."""
    import shutil

    import transformers

    from fxlrp.app import cli

    torch.manual_seed(0)
    tokenizer = tokenizers.bytelevel_tokenizer(["once upon a time", "the capital of France is Paris"],
                                               pad_token="<|endoftext|>")
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1, num_heads=2,
        decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id)).eval()
    model.save_pretrained("my-encoder-decoder")
    tokenizer.save_pretrained("my-encoder-decoder")
    Path("prompts.txt").write_text("Once upon a time\nThe capital of France is\n", encoding="utf-8")
    shutil.rmtree("DIR", ignore_errors=True)
    _command_line(cli, ["explain", "--model", "hf:my-encoder-decoder", "--data", "prompts.txt", "--generate", "3",
                        "--out", "DIR"])


class _SmallCNN(nn.Module):
    """Two convolutions and a dense layer over 3 x 32 x 32 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Linear(8 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class _SmallGraphNetwork(nn.Module):
    """One score per node: a dense layer, a sum of messages along the edges, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.score = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x).relu()
        messages = torch.zeros_like(hidden).index_add(0, edge_index[1], hidden[edge_index[0]])
        return self.score(hidden + messages).squeeze(-1)


def image_and_graph_explainers(namespace: Namespace) -> None:
    """``explain`` and ``image`` (a small CNN of 10 classes), ``graph_explain``, ``x``,
    ``edge_index`` and ``nodes`` (a network scoring each of 5 nodes)."""
    import fxlrp

    torch.manual_seed(0)
    namespace.update(explain=fxlrp.convert(_SmallCNN().eval()), image=torch.rand(1, 3, 32, 32),
                     graph_explain=fxlrp.convert(_SmallGraphNetwork().eval()), x=torch.randn(5, 4),
                     edge_index=torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 3]]), nodes=[0, 2, 3])


def classifier_images_target(namespace: Namespace) -> None:
    """``explain``, ``images`` and ``target``: a small CNN, four images and a class."""
    import fxlrp

    torch.manual_seed(0)
    namespace.update(explain=fxlrp.convert(_SmallCNN().eval(), fxlrp.composites.EpsilonPlusFlat()),
                     images=torch.rand(4, 3, 32, 32), target=3)


def _image_folder(folder: str, count: int, size: int = 40) -> None:
    """``count`` PNG images of random pixels in two class sub-folders of ``folder``."""
    from PIL import Image

    generator = np.random.default_rng(0)
    for index in range(count):
        place = Path(folder, f"class{index % 2}")
        place.mkdir(parents=True, exist_ok=True)
        pixels = generator.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(place / f"{index:02d}.png")


def _command_line(cli: Any, arguments: list[str]) -> None:
    code = cli.main(arguments)
    if code:
        raise RuntimeError(f"fxlrp {' '.join(arguments)} exited with {code}")


def data_set_explanations(namespace: Namespace) -> None:
    """The folder ``explanations/`` that ``fxlrp explain --data`` writes: ResNet-18 (random
    weights) over six generated images at 64 x 64, two shards."""
    from fxlrp.app import cli

    _image_folder("val", 6)
    _command_line(cli, ["explain", "--model", "torchvision:resnet18", "--composite", "epsilon_plus_flat",
                        "--data", "val", "--target", "label", "--size", "64", "--batch-size", "4",
                        "--shard-size", "4", "--out", "explanations/"])


def concept_references(namespace: Namespace) -> None:
    """The folder ``explained/`` that ``fxlrp explain --concepts features.30,features.40 --concepts-top 8``
    writes (``explained/concepts/NODE.npz``), and ``dataset``: the reference samples of VGG-16 with
    batch normalisation (random weights, 10 classes) over eight random images at 32 x 32, found by
    the relevance maximisation the command runs and saved as it saves them, without the receptive
    regions it adds (an explanation per reference sample, minutes here). Where the namespace holds
    ``found`` already (the Python run of docs/concepts.md), those are saved."""
    import fxlrp
    from fxlrp.concepts import relevance_maximisation, save_references

    found = namespace.get("found")
    if found is None:
        import torchvision
        _concept_data_set(namespace, count=8, size=32)
        torch.manual_seed(0)
        explain = fxlrp.convert(torchvision.models.vgg16_bn(num_classes=10).eval(),
                                fxlrp.composites.EpsilonPlusFlat())
        found = relevance_maximisation(explain, namespace["loader"], ["features.30", "features.40"], k=8)
    Path("explained/concepts").mkdir(parents=True, exist_ok=True)
    for node, references in found.items():
        save_references(references, f"explained/concepts/{node}.npz")


def _concept_data_set(namespace: Namespace, count: int, size: int) -> None:
    torch.manual_seed(0)
    images = torch.rand(count, 3, size, size)
    dataset = [(images[index], index % 2) for index in range(count)]
    namespace.update(dataset=dataset, loader=torch.utils.data.DataLoader(dataset, batch_size=4))


def concept_data_set(namespace: Namespace) -> None:
    """``dataset`` and ``loader``: eight random images at 32 x 32 with labels, batches of four."""
    _concept_data_set(namespace, count=8, size=32)


def node_classifier(namespace: Namespace) -> None:
    """``model``, ``x``, ``edge_index``, ``node``, ``y_hat`` and ``batch``: PyG's GCN of two layers
    classifying the 6 nodes of one graph (``batch`` None: a single graph), with ``torch_geometric``
    imported."""
    import torch_geometric
    from torch_geometric.nn.models import GCN

    torch.manual_seed(0)
    model = GCN(in_channels=4, hidden_channels=8, num_layers=2, out_channels=3).eval()
    x = torch.randn(6, 4)
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4, 4, 5], [1, 0, 2, 1, 3, 2, 4, 3, 5, 4]])
    node = 2
    namespace.update(torch_geometric=torch_geometric, model=model, x=x, edge_index=edge_index, node=node,
                     y_hat=model(x, edge_index)[node].argmax(), batch=None, pairs=torch.tensor([[0, 1, 2, 4],
                                                                                             [3, 5, 0, 1]]))


def heterogeneous_graph(namespace: Namespace) -> None:
    """``data`` (papers and authors), ``GNN`` (two lazy SAGE convolutions), ``classes`` and ``papers``."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(0)
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(6, 4), torch.randn(4, 3)
    writes = torch.tensor([[0, 0, 1, 1, 2, 3, 3], [0, 1, 1, 2, 3, 4, 5]])
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])

    class GNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = SAGEConv((-1, -1), 64), SAGEConv((-1, -1), 64)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    namespace.update(data=data, GNN=GNN, classes=3, papers=torch.tensor([1, 4]))


def mask_and_keypoint_detectors(namespace: Namespace) -> None:
    """``mask_explain`` and ``keypoint_explain`` (Mask and Keypoint R-CNN on a backbone of two
    convolutions, random weights, every detection kept) and ``images``, one generated image of 64 x 80."""
    from torchvision.models.detection import KeypointRCNN, MaskRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    import fxlrp

    def backbone() -> nn.Module:
        layers = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                               nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
        layers.out_channels = 8
        return layers

    def pooling(size: int) -> MultiScaleRoIAlign:
        return MultiScaleRoIAlign(["0"], size, 2)

    torch.manual_seed(0)
    small = dict(min_size=64, max_size=80, box_score_thresh=0.0, box_detections_per_img=4,
                 rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20, box_roi_pool=pooling(4), representation_size=16,
                 rpn_anchor_generator=AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),)))
    mask = MaskRCNN(backbone(), num_classes=3, mask_roi_pool=pooling(14), **small).eval()
    keypoint = KeypointRCNN(backbone(), num_classes=2, num_keypoints=5, keypoint_roi_pool=pooling(14), **small).eval()
    namespace.update(mask_explain=fxlrp.convert(mask), keypoint_explain=fxlrp.convert(keypoint),
                     images=torch.rand(1, 3, 64, 80))


SETUPS = {setup.__name__: setup for setup in (
    sequence_classifier_in_my_model, language_model_in_my_lm, language_model_in_my_model, generation_explanation,
    generated_texts_folder, generated_texts_folder_of_an_encoder_decoder, image_and_graph_explainers,
    classifier_images_target, data_set_explanations, concept_references, concept_data_set, node_classifier,
    heterogeneous_graph, mask_and_keypoint_detectors)}
"""Every setup by name."""
