"""``fxlrp demo``: three explanations in well under a minute, all offline.

1. A small CNN trained for a few seconds on scikit-learn's bundled digits: heatmaps of test
   digits (a meaningful picture: the network has learnt something).
2. A torchvision ResNet-18 with *random* weights on a generated image. Its heatmap shows that
   every layer of a real torchvision architecture is explained, not what a trained network sees;
   the demo checks the engine instead: LRP-0 must equal gradient x input (float64).
3. A graph network written with torch_scatter, trained on generated "infection" graphs: the
   relevance of each node and edge for "this node gets sick", printed and drawn.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

import fxlrp
from fxlrp.toys.digits import DigitsCNN, accuracy, load_digits_split, positive_relevance_on_ink, train_classifier
from fxlrp.toys.infection import (
    NODE_STATES,
    InfectionNetwork,
    explain_node,
    generate_infection_graphs,
    infection_accuracy,
    newly_infected,
    train_infection_network,
)
from fxlrp.viz import image
from fxlrp.viz.graph_image import save_graph_relevance


def digits_demo(out: Path, fast: bool) -> Path:
    torch.manual_seed(0)
    data = load_digits_split()
    model = train_classifier(DigitsCNN(), data.train_images, data.train_labels, epochs=3 if fast else 8)
    print(f"[1] digits CNN: test accuracy {accuracy(model, data.test_images, data.test_labels):.1%}")
    shown = slice(0, 6)
    labels = data.test_labels[shown]
    relevances = {}
    # inputs are grey values in [0, 1]: those are the bounds of the first layer's box rule
    chosen = {"epsilon": fxlrp.rules.Epsilon(1e-6), "epsilon_gamma_box": fxlrp.composites.EpsilonGammaBox(0.0, 1.0)}
    for name, composite in chosen.items():
        relevance = fxlrp.attribute(fxlrp.convert(model, composite), data.test_images, target=data.test_labels)
        on_ink = positive_relevance_on_ink(relevance[:, 0], data.ink()).mean().item()
        print(f"    {name}: {on_ink:.0%} of the positive relevance lies on inked pixels "
              f"(ink covers {data.ink().float().mean().item():.0%} of the pixels)")
        relevances[name] = relevance[shown]
    path = image.figure_grid(data.test_images[shown], list(relevances.values()), ["input", *relevances],
                             out / "digits_heatmaps.png", sample_labels=[f"label {int(label)}" for label in labels])
    print(f"    heatmaps (red: for the class, blue: against) -> {path}")
    return path


def generated_image(size: int = 64) -> torch.Tensor:
    """A bright disc and a dark bar on a soft gradient, ``[1, 3, size, size]``, ImageNet-normalised."""
    axis = torch.linspace(-1, 1, size)
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    disc = ((x + 0.3) ** 2 + (y + 0.2) ** 2 < 0.12).float()
    bar = ((x - 0.45).abs() < 0.1) & ((y - 0.1).abs() < 0.6)
    red = 0.3 + 0.2 * x + 0.6 * disc
    green = 0.4 + 0.2 * y - 0.3 * bar.float()
    blue = 0.5 - 0.1 * x + 0.3 * disc
    pixels = torch.stack([red, green, blue]).clamp(0, 1)[None]
    mean = torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    return (pixels - mean) / std


def torchvision_demo(out: Path) -> Path:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).double().eval()
    inputs = generated_image().double()
    explain = fxlrp.convert(model, fxlrp.rules.Epsilon(0.0))
    report = explain.report()
    target = int(model(inputs).argmax())
    relevance = fxlrp.attribute(explain, inputs, target=target)
    leaf = inputs.clone().requires_grad_()
    gradient = torch.autograd.grad(model(leaf)[0, target], leaf)[0]
    difference = ((relevance - inputs * gradient).abs().max() / (inputs * gradient).abs().max()).item()
    print(f"[2] torchvision resnet18, RANDOM weights (no download): {len(report.rows)} nodes, "
          f"coverage {report.coverage:.0%}")
    print(f"    LRP-0 vs gradient x input, relative difference {difference:.1e} (should be ~1e-15)")
    path = image.save_png(image.overlay(inputs[0], relevance[0]), out / "resnet18_random_weights.png", scale=4)
    print(f"    overlay -> {path} (random weights: this picture shows no learnt knowledge)")
    # the heatmap with its scale: a colour bar from -max|R| to +max|R| (channels summed) and a title
    largest = float(np.abs(image.reduce_channels(relevance)).max())
    shown = image.enlarge(image.heatmap(relevance)[0], image.readable_scale(*relevance.shape[-2:]))
    figure, _ = image.with_colour_bar(shown, largest, f"resnet18, class {target}, LRP-0")
    print(f"    heatmap with colour bar -> {image.save_png(figure, out / 'resnet18_random_weights.figure.png', 1)}")
    return path


def infection_demo(out: Path, fast: bool) -> Path:
    torch.manual_seed(0)
    model = train_infection_network(InfectionNetwork(), steps=40 if fast else 60, graphs_per_step=64)
    node_accuracy, edge_accuracy = infection_accuracy(model, generate_infection_graphs(100, seed=12345))
    print(f"[3] torch_scatter GNN on generated infection graphs: node accuracy {node_accuracy:.1%}, "
          f"edge accuracy {edge_accuracy:.1%}")
    graph = next(graph for graph in (generate_infection_graphs(1, 12, 12, seed=seed) for seed in range(7, 100))
                 if len(newly_infected(graph)) > 0)
    node = int(newly_infected(graph)[0])
    node_relevance, edge_relevance = explain_node(fxlrp.convert(model), graph, node)
    states = [NODE_STATES[int(state)] for state in graph.nodes.argmax(dim=1)]
    print(f"    why does node {node} ({states[node]}) get sick? node relevance:")
    for index in node_relevance.abs().argsort(descending=True)[:5].tolist():
        print(f"      node {index:2d} {states[index]:8s} {node_relevance[index]:+.3f}")
    for label, edge in (("for", int(edge_relevance.argmax())), ("against", int(edge_relevance.argmin()))):
        kind = "real" if graph.edges[edge, 0] == 1 else "virtual"
        print(f"    edge most {label}: {int(graph.senders[edge])} -> {int(graph.receivers[edge])} ({kind} contact, "
              f"{states[int(graph.senders[edge])]} sender) {edge_relevance[edge]:+.3f}")
    labels = {index: f"{index}\n{state[0].upper()}" for index, state in enumerate(states)}
    path = save_graph_relevance(out / "infection_graph.png", graph.edge_index, node_relevance, edge_relevance,
                                labels=labels, highlight=[node], dashed=(graph.edges[:, 1] == 1).tolist(),
                                title=f"relevance for 'node {node} gets sick'\n"
                                      "H healthy, S sick, I immune; dashed: virtual edge")
    print(f"    graph picture -> {path}")
    return path


def run(out: Path, fast: bool = False) -> list[Path]:
    """Run the three demos, writing PNGs to ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for part in (lambda: digits_demo(out, fast), lambda: torchvision_demo(out), lambda: infection_demo(out, fast)):
        start = time.perf_counter()
        paths.append(part())
        print(f"    ({time.perf_counter() - start:.1f} s)")
    return paths
