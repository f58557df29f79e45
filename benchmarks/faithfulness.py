"""Faithfulness side by side: ABPC of fxlrp's composites, Captum's attributions, zennit, autoLRP
and a random map on the same trained models, inputs and perturbation curves (``fxlrp.evaluate``).

Each model is trained here in seconds to a few minutes on generated or package-shipped data, and
``--samples`` held-out inputs are explained for their predicted class. ABPC = AUC(LeRF) - AUC(MoRF)
of deletion curves over the fraction deleted (in logits): the mean over the inputs with its 95%
percentile bootstrap interval.

- ``digits``: ``fxlrp.toys.digits.DigitsCNN`` (8 epochs) on scikit-learn's bundled 8x8 digits;
  pixels deleted in 16 steps of 4, zero baseline (the background).
- ``vit``: a torchvision ``VisionTransformer`` (2 layers, width 32, 4 x 4 patches) on the 20 x 20
  shape images of ``examples/concepts_shapes.py`` (square, plus or ring on a striped texture;
  the class is the shape); pixels deleted in 20 steps of 20, zero baseline.
- ``text``: the two-layer BERT of ``examples/planted_cue.py`` (a cue word decides the class);
  sentences with a cue, tokens (not [CLS], [SEP]) replaced by [MASK] one per step, grouped by
  length (no padding).
- ``graph``: the GCN of ``examples/ba_shapes.py`` on BA-Shapes (house motifs on a Barabasi-Albert
  graph); the motif nodes of the test split, edges of the node's 3-hop receptive field removed
  in 10 steps.
- ``detection``: the Faster R-CNN of ``examples/detection_shapes.py`` (600 steps) on its generated
  squares, disks and triangles; in each test image the detection of the first shape's class that
  overlaps its true box most (where one does by IoU >= 0.5) is explained (its class logit: the
  proposal box held fixed, as fxlrp's rules hold it); the curves follow that box's score
  (:class:`fxlrp.evaluate.DetectionScore`: the matched detection's score, 0 once gone) as 4 x 4
  patches are replaced by the image's mean (the background's grey, not a new dark shape) in 32
  steps. Captum's methods explain the same logit through :class:`ProposalLogits`.

Methods, where they apply: fxlrp composites; Captum (Saliency with absolute gradients,
InputXGradient, IntegratedGradients with 32 steps from the zero input; for text at the word
embeddings with the [PAD] embedding as baseline; for the graph through PyG's ``CaptumExplainer``
on an edge mask) and Captum's own LRP (a failure is printed with its first line); zennit 0.5.1
(EpsilonPlusFlat) on the CNN; autoLRP (``BASE``; ``ATTNLRP`` on the transformers) when it is
importable; a Gaussian random map.

Run: ``python benchmarks/faithfulness.py [--models digits,vit,text,graph,detection] [--samples N]
[--markdown]`` (``--samples``: 200 per model, 64 for the detector, by default).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import sys
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

import fxlrp
from fxlrp.evaluate import graph_curves, image_curves, ranked, table, token_curves
from fxlrp.toys.digits import DigitsCNN, accuracy, load_digits_split, train_classifier

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # examples/

Method = Callable[[Tensor, Tensor], Tensor]
"""(inputs, targets) -> relevance of the inputs' shape."""


def attributed(method: Callable[[], Tensor]) -> Tensor | str:
    """The method's relevance, or the first line of the error it raises."""
    try:
        return method().detach()
    except Exception as error:  # noqa: BLE001  (any failure of another library is a row of the table)
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def random_map(shape: torch.Size) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


def fxlrp_methods(model: nn.Module, composites: dict[str, object]) -> dict[str, Method]:
    methods = {}
    for name, composite in composites.items():
        explain = fxlrp.convert(model, composite)
        methods[f"fxlrp {name}"] = lambda x, t, explain=explain: fxlrp.attribute(explain, x, target=t)
    return methods


def captum_image_methods(model: nn.Module, lrp: bool = True) -> dict[str, Method]:
    from captum.attr import LRP, InputXGradient, IntegratedGradients, Saliency
    from captum.attr._utils.lrp_rules import IdentityRule

    methods: dict[str, Method] = {
        "Captum saliency": lambda x, t: Saliency(model).attribute(x.requires_grad_(), target=t, abs=True),
        "Captum gradient x input": lambda x, t: InputXGradient(model).attribute(x.requires_grad_(), target=t),
        "Captum integrated gradients": lambda x, t: IntegratedGradients(model).attribute(x, target=t, n_steps=32),
    }
    if lrp:
        lrp_model = copy.deepcopy(model)  # Captum's LRP reads a rule from each module: Flatten has none
        for module in lrp_model.modules():
            if isinstance(module, nn.Flatten):
                module.rule = IdentityRule()
        methods["Captum LRP"] = lambda x, t: LRP(lrp_model).attribute(x.requires_grad_(), target=t)
    return methods


def zennit_methods(model: nn.Module, classes: int) -> dict[str, Method]:
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat

    def epsilon_plus_flat(x: Tensor, t: Tensor) -> Tensor:
        with Gradient(model=model, composite=EpsilonPlusFlat()) as attributor:
            return attributor(x, torch.eye(classes)[t])[1]

    return {"zennit EpsilonPlusFlat": epsilon_plus_flat}


def autolrp_methods(model: nn.Module, preset: str | None = None) -> dict[str, Method]:
    """autoLRP's ``.lrp()`` on the sum of the explained logits (the samples do not interact)."""
    try:
        import autolrp
    except ImportError:
        print("autoLRP is not importable here: its rows are left out (pip install autolrp)")
        return {}

    def relevance(x: Tensor, t: Tensor) -> Tensor:
        wrapped = autolrp.tensor(x)
        logits = model(wrapped)
        config = None if preset is None else autolrp.LRPConfig(rule={**autolrp.BASE, **getattr(autolrp, preset)})
        logits[torch.arange(len(t)), t].sum().lrp(config=config)
        return wrapped.relevance

    return {f"autoLRP {preset or 'BASE'}": relevance}


def image_rows(model: nn.Module, images: Tensor, methods: dict[str, Method],
               **curve_options: object) -> dict[str, Tensor]:
    with torch.no_grad():
        targets = model(images).argmax(dim=1)
    methods = {**methods, "random": lambda x, t: random_map(x.shape)}
    results = {}
    for name, method in methods.items():
        relevance = attributed(lambda method=method: method(images.clone(), targets))
        if isinstance(relevance, str):
            print(f"  {name} fails on this model: {relevance}")
            continue
        results[name] = image_curves(model, images, relevance, targets, progress=False, **curve_options).abpc()
    return results


def digits(samples: int) -> tuple[str, dict[str, Tensor]]:
    torch.manual_seed(0)
    split = load_digits_split()
    model = DigitsCNN()
    train_classifier(model, split.train_images, split.train_labels)
    model.eval()
    composites = {"Epsilon": fxlrp.rules.Epsilon(1e-6), "EpsilonPlus": fxlrp.composites.EpsilonPlus(),
                  "EpsilonPlusFlat": fxlrp.composites.EpsilonPlusFlat(),
                  "EpsilonAlpha2Beta1": fxlrp.composites.EpsilonAlpha2Beta1(),
                  "EpsilonGammaBox": fxlrp.composites.EpsilonGammaBox(0.0, 1.0)}
    methods = {**fxlrp_methods(model, composites), **captum_image_methods(model), **zennit_methods(model, 10),
               **autolrp_methods(model)}
    results = image_rows(model, split.test_images[:samples], methods, features_per_step=4)
    heading = (f"digits CNN ({accuracy(model, split.test_images, split.test_labels):.1%} test accuracy), "
               f"{samples} test images, 16 steps of 4 pixels, zero baseline, logit")
    return heading, results


class ShapesViT(nn.Module):
    """A torchvision VisionTransformer on the 1 x 20 x 20 shape images (the channel repeated)."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import VisionTransformer

        self.vit = VisionTransformer(image_size=20, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32,
                                     mlp_dim=64, num_classes=3)

    def forward(self, images: Tensor) -> Tensor:
        return self.vit(images.expand(-1, 3, -1, -1))


def vit(samples: int) -> tuple[str, dict[str, Tensor]]:
    from examples.concepts_shapes import make_images, train

    torch.manual_seed(0)
    model = ShapesViT()
    train(model, STEPS_VIT, torch.Generator().manual_seed(0), lr=2e-3)
    images, labels, _, _ = make_images(samples, torch.Generator().manual_seed(12345))
    with torch.no_grad():
        correct = float((model(images).argmax(dim=1) == labels).float().mean())
    composites = {"Epsilon": fxlrp.rules.Epsilon(1e-6), "AttnLRP": fxlrp.composites.AttnLRP(),
                  "CPLRP": fxlrp.composites.CPLRP()}
    methods = {**fxlrp_methods(model, composites), **captum_image_methods(model), **zennit_methods(model, 3),
               **autolrp_methods(model, "ATTNLRP")}
    results = image_rows(model, images, methods, steps=20)
    heading = (f"ViT on generated shapes ({correct:.1%} test accuracy), {samples} test images, 20 steps of "
               f"20 pixels, zero baseline, logit")
    return heading, results


STEPS_VIT = 600
"""Adam steps of 64 images for the ViT."""


def text(samples: int) -> tuple[str, dict[str, Tensor]]:
    from captum.attr import LRP, LayerGradientXActivation, LayerIntegratedGradients, Saliency

    from examples.planted_cue import STEPS, by_length, make_model, make_sentences, make_tokenizer, train

    torch.manual_seed(0)
    tokenizer, model = make_tokenizer(), make_model()
    train(model, tokenizer, steps=STEPS, rng=random.Random(0))
    sentences = make_sentences(samples, random.Random(12345), neutral=False)
    embeddings = model.get_input_embeddings()
    pad = tokenizer.pad_token_id

    def logits(ids: Tensor) -> Tensor:
        return model(input_ids=ids).logits

    def from_embeddings(embedded: Tensor) -> Tensor:
        return model(inputs_embeds=embedded).logits

    composites = {"Epsilon": fxlrp.rules.Epsilon(1e-6), "AttnLRP": fxlrp.composites.AttnLRP(),
                  "CPLRP": fxlrp.composites.CPLRP()}
    methods: dict[str, Method] = {}
    for name, composite in composites.items():
        explain = fxlrp.convert(model, composite)
        methods[f"fxlrp {name}"] = lambda ids, t, explain=explain: fxlrp.attribute(explain, ids, target=t)
    methods["Captum saliency"] = lambda ids, t: Saliency(from_embeddings).attribute(
        embeddings(ids).detach().requires_grad_(), target=t, abs=True).sum(-1)
    methods["Captum gradient x input"] = lambda ids, t: LayerGradientXActivation(logits, embeddings).attribute(
        ids, target=t).sum(-1)
    methods["Captum integrated gradients"] = lambda ids, t: LayerIntegratedGradients(logits, embeddings).attribute(
        ids, baselines=torch.full_like(ids, pad), target=t, n_steps=32).sum(-1)
    methods["Captum LRP"] = lambda ids, t: LRP(model).attribute(embeddings(ids).detach().requires_grad_(), target=t)
    try:
        import autolrp
    except ImportError:
        pass
    else:
        def autolrp_attnlrp(ids: Tensor, t: Tensor) -> Tensor:
            wrapped = autolrp.tensor(embeddings(ids).detach())
            scores = from_embeddings(wrapped)
            scores[torch.arange(len(t)), t].sum().lrp(config=autolrp.LRPConfig(rule={**autolrp.BASE,
                                                                                      **autolrp.ATTNLRP}))
            return wrapped.relevance.sum(-1)
        methods["autoLRP ATTNLRP"] = autolrp_attnlrp
    methods["random"] = lambda ids, t: random_map(ids.shape)

    results: dict[str, list[Tensor]] = {}
    failures: dict[str, str] = {}
    correct = 0
    for _, members in sorted(by_length(sentences, tokenizer).items()):
        ids = tokenizer([sentences[index].text for index in members], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            targets = logits(ids).argmax(dim=1)
        correct += int((targets == torch.tensor([sentences[index].label for index in members])).sum())
        perturbable = torch.ones_like(ids, dtype=torch.bool)
        perturbable[:, [0, -1]] = False  # [CLS], [SEP]
        for name, method in methods.items():
            if name in failures:
                continue
            relevance = attributed(lambda method=method: method(ids, targets))
            if isinstance(relevance, str):
                failures[name] = relevance
                continue
            curves = token_curves(model, ids, relevance, targets, baseline_token=tokenizer.mask_token_id,
                                  perturbable=perturbable, progress=False)
            results.setdefault(name, []).append(curves.abpc())
    for name, failure in failures.items():
        print(f"  {name} fails on this model: {failure}")
    heading = (f"planted-cue BERT ({correct / samples:.1%} accuracy on the explained sentences), {samples} "
               f"sentences with a cue, tokens replaced by [MASK] one per step, logit")
    return heading, {name: torch.cat(values) for name, values in results.items() if name not in failures}


def graph(samples: int) -> tuple[str, dict[str, Tensor]]:
    from torch_geometric.explain import CaptumExplainer, Explainer
    from torch_geometric.utils import k_hop_subgraph

    from examples.ba_shapes import LAYERS, ba_shapes, make_explainer, train
    from fxlrp.integrations.pyg import LRPExplainer

    data = ba_shapes(0)
    model, test_accuracy = train(data, 300)
    motif = (data.y > 0) & data.test_mask
    nodes = motif.nonzero().view(-1)[:samples]
    with torch.no_grad():
        targets = model(data.x, data.edge_index)[nodes].argmax(dim=1)
    candidates = torch.zeros(len(nodes), data.edge_index.shape[1], dtype=torch.bool)
    for row, node in enumerate(nodes.tolist()):
        candidates[row, k_hop_subgraph(node, LAYERS, data.edge_index, num_nodes=data.num_nodes)[3]] = True

    def edge_masks(algorithm: object) -> Tensor:
        explainer = make_explainer(model, algorithm)
        return torch.stack([explainer(data.x, data.edge_index, index=node).edge_mask.detach()
                            for node in nodes.tolist()])

    def edge_explainer(algorithm: object) -> Callable[[], Tensor]:
        return lambda: edge_masks(algorithm)

    def captum(method: str) -> Callable[[], Tensor]:
        explainer = Explainer(model, algorithm=CaptumExplainer(method), explanation_type="model",
                              node_mask_type=None, edge_mask_type="object",
                              model_config=dict(mode="multiclass_classification", task_level="node",
                                                return_type="raw"))
        return lambda: torch.stack([explainer(data.x, data.edge_index, index=node).edge_mask.detach()
                                    for node in nodes.tolist()])

    methods = {"fxlrp Epsilon": edge_explainer(LRPExplainer(fxlrp.rules.Epsilon(1e-6))),
               "fxlrp EpsilonPlus": edge_explainer(LRPExplainer(fxlrp.composites.EpsilonPlus())),
               "Captum saliency (PyG)": captum("Saliency"),
               "Captum gradient x input (PyG)": captum("InputXGradient"),
               "Captum integrated gradients (PyG)": captum("IntegratedGradients"),
               "random": lambda: random_map(candidates.shape)}
    results = {}
    for name, method in methods.items():
        relevance = attributed(method)
        if isinstance(relevance, str):
            print(f"  {name} fails on this model: {relevance}")
            continue
        results[name] = graph_curves(model, data.x, data.edge_index, relevance, nodes, targets,
                                     candidates=candidates, steps=10, progress=False).abpc()
    heading = (f"BA-Shapes GCN ({test_accuracy:.1%} test accuracy), {len(nodes)} motif nodes, edges of the "
               f"3-hop field removed in 10 steps, logit")
    return heading, results


class ProposalLogits(nn.Module):
    """A detector's class logits of fixed proposal boxes, as a function of the images: the detector's
    transform, backbone, RoIAlign of the boxes and box head - the path fxlrp explains (proposals,
    NMS and top-k selections take no part), so that Captum's methods explain the same logit."""

    def __init__(self, model: nn.Module, proposals: Tensor) -> None:
        super().__init__()
        self.model, self.proposals = model, proposals

    def forward(self, images: Tensor) -> Tensor:
        from collections import OrderedDict

        transformed, _ = self.model.transform(list(images))
        features = self.model.backbone(transformed.tensors)
        features = features if isinstance(features, dict) else OrderedDict([("0", features)])
        heads = self.model.roi_heads
        pooled = heads.box_roi_pool(features, [self.proposals] * len(images), transformed.image_sizes)
        return heads.box_predictor(heads.box_head(pooled))[0]


def detection(samples: int) -> tuple[str, dict[str, Tensor]]:
    from captum.attr import InputXGradient, IntegratedGradients, Saliency
    from torchvision.ops import box_iou

    from examples.detection_shapes import detector, make_images, train
    from fxlrp.evaluate import DetectionScore
    from fxlrp.integrations.torchvision import detection_target, explain_detection

    torch.manual_seed(0)
    model = train(detector(), STEPS_DETECTOR, torch.Generator().manual_seed(0))
    images, targets, _ = make_images(samples, torch.Generator().manual_seed(1))
    with torch.no_grad():
        detections = model(images)
    kept, indices = [], []  # each image's first shape, where a detection of its class overlaps its box by >= 0.5
    for number, (found, target) in enumerate(zip(detections, targets, strict=True)):
        label, box = int(target["labels"][0]), target["boxes"][0]
        same = found["labels"] == label
        if same.any() and box_iou(found["boxes"][same], box[None]).max() >= 0.5:
            kept.append(number)
            indices.append(detection_target(found, label=label, box=box))
    images, detections = images[kept], [detections[number] for number in kept]
    composites = {"Epsilon": fxlrp.rules.Epsilon(1e-6), "EpsilonPlus": fxlrp.composites.EpsilonPlus(),
                  "EpsilonPlusFlat": fxlrp.composites.EpsilonPlusFlat(),
                  "EpsilonAlpha2Beta1": fxlrp.composites.EpsilonAlpha2Beta1(),
                  # (z^B's bounds are those of the normalised image the first convolution reads: (0 - 0.5) / 0.25, ...)
                  "EpsilonGammaBox": fxlrp.composites.EpsilonGammaBox(-2.0, 2.0)}
    explained = [explain_detection(fxlrp.convert(model, fxlrp.rules.Epsilon(1e-6)), x[None], index)
                 for x, index in zip(images, indices, strict=True)]
    proposals: list[Tensor] = []  # the explained detection's proposal box, per image
    handle = model.roi_heads.box_roi_pool.register_forward_pre_hook(lambda module, args: proposals.append(args[1][0]))
    try:
        with torch.no_grad():
            for x in images:
                model(x[None])
    finally:
        handle.remove()
    heads = [(ProposalLogits(model, found[position[0]][None]), position[1])
             for found, position in zip(proposals, (each.position for each in explained), strict=True)]

    def per_image(method: Callable[[Tensor, nn.Module, int, int], Tensor]) -> Callable[[], Tensor]:
        return lambda: torch.stack([method(x[None], head, label, index)[0] for x, (head, label), index
                                    in zip(images, heads, indices, strict=True)])

    methods: dict[str, Callable[[], Tensor]] = {}
    for name, composite in composites.items():
        explain = fxlrp.convert(model, composite)
        methods[f"fxlrp {name}"] = per_image(lambda x, head, label, index, explain=explain:
                                             explain_detection(explain, x, index).relevance)
    methods["Captum saliency"] = per_image(lambda x, head, label, index: Saliency(head).attribute(
        x.clone().requires_grad_(), target=label, abs=True))
    methods["Captum gradient x input"] = per_image(lambda x, head, label, index: InputXGradient(head).attribute(
        x.clone().requires_grad_(), target=label))
    methods["Captum integrated gradients"] = per_image(lambda x, head, label, index: IntegratedGradients(
        head).attribute(x, target=label, n_steps=32))
    methods["random"] = lambda: random_map(images.shape)
    score = DetectionScore.of(detections, indices)
    results = {}
    for name, method in methods.items():
        relevance = attributed(method)
        if isinstance(relevance, str):
            print(f"  {name} fails on this model: {relevance}")
            continue
        results[name] = image_curves(model, images, relevance, score, patch=4, steps=32, baseline="mean",
                                     progress=False).abpc()
    heading = (f"Faster R-CNN on generated shapes ({len(kept)} of {samples} first shapes detected), the class "
               f"logit of the detection of each image's first shape; its matched box's score (IoU >= 0.5, 0 once "
               f"gone) as 4 x 4 patches are replaced by the image's mean in 32 steps")
    return heading, results


STEPS_DETECTOR = 600
"""Adam steps of 8 images for the detector (``examples/detection_shapes.py``'s full run)."""


WORKLOADS = {"digits": digits, "vit": vit, "text": text, "graph": graph, "detection": detection}
SAMPLES = {"detection": 64}
"""Explained inputs of the models whose default is not 200 (the detector's curves cost a second per
image and method on a shared core: its row takes about 15 minutes at 64)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(WORKLOADS))
    parser.add_argument("--samples", type=int, default=None,
                        help="explained inputs per model (default 200; the detector 64)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # small models run fastest on one thread of the shared cores
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}")
    for name in args.models.split(","):
        heading, results = WORKLOADS[name](args.samples or SAMPLES.get(name, 200))
        rows = ranked(results)
        print(heading)
        if args.markdown:
            print("| method | ABPC | 95% interval |\n|---|---:|---|")
            for method, interval in rows:
                print(f"| {method} | {interval.mean:.2f} | [{interval.low:.2f}, {interval.high:.2f}] |")
        else:
            print(table(rows))
        print(flush=True)


if __name__ == "__main__":
    main()
