"""The perturbation curves against a per-step loop in float64, the metric's optimum on a linear
model (by enumeration of every order), a random map's ABPC, and the baselines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fxlrp.evaluate import (
    EvaluationInputError,
    gaussian_blur,
    graph_curves,
    image_baseline,
    image_curves,
    mean_interval,
    patch_grid,
    token_curves,
)

BOUND = 1e-12  # two float64 paths through the same model: batching changes the rounding only


def small_model() -> nn.Module:
    """A non-linear model of 2 x 6 x 6 images (no convolution: float64 convolutions of one image at
    a time are slow on the CPU, and the loop below runs one image at a time)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(72, 8), nn.Tanh(), nn.Linear(8, 3)).double().eval()


def loop_curve(model: nn.Module, image: Tensor, features: list[list[tuple[int, int]]], order: list[int],
               counts: list[int], baseline: Tensor, target: int, insertion: bool) -> list[float]:
    """One image's curve, one step at a time: the elements of the first ``k`` features of
    ``order`` set to the baseline (or, for insertion, all others)."""
    scores = []
    for count in counts:
        perturbed = image.clone()
        chosen = order[:count] if not insertion else order[count:]
        for feature in chosen:
            for row, column in features[feature]:
                perturbed[:, row, column] = baseline[:, row, column]
        with torch.no_grad():
            scores.append(float(model(perturbed[None])[0, target]))
    return scores


def reference_order(values: list[float], most_first: bool) -> list[int]:
    key = (lambda i: (-values[i], i)) if most_first else (lambda i: (values[i], i))
    return sorted(range(len(values)), key=key)


@pytest.mark.parametrize(("patch", "baseline"), [(1, "zeros"), (4, "mean"), (1, "blur"), (4, "noise")])
@pytest.mark.parametrize("mode", ["deletion", "insertion"])
def test_batched_curves_equal_a_loop_over_steps(patch: int, baseline: str, mode: str) -> None:
    model = small_model()
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(3, 2, 6, 6, generator=generator, dtype=torch.float64)
    relevance = torch.randn(3, 2, 6, 6, generator=generator, dtype=torch.float64)
    per_step = 3 if patch == 1 else 1
    curves = image_curves(model, images, relevance, target=torch.tensor([0, 2, 1]), patch=patch, baseline=baseline,
                          mode=mode, features_per_step=per_step, batch_size=7, progress=False, seed=5)
    filled = image_baseline(images, baseline, seed=5).expand_as(images)
    # features by hand: pixels, or 4x4 patches on a grid centred on the 6x6 image (offset 1)
    if patch == 1:
        features = [[(row, column)] for row in range(6) for column in range(6)]
    else:
        edges = [(0, 3), (3, 6)]  # rows/columns -1..2 and 3..6 of the padded grid, cut at 0 and 6
        features = [[(row, column) for row in range(*rows) for column in range(*columns)]
                    for rows in edges for columns in edges]
    total = len(features)
    counts = list(range(0, total, per_step)) + [total]
    for sample in range(3):
        values = [float(sum(relevance[sample, :, row, column].sum() for row, column in feature))
                  for feature in features]
        for order in ("morf", "lerf"):
            expected = loop_curve(model, images[sample], features, reference_order(values, order == "morf"), counts,
                                  filled[sample], [0, 2, 1][sample], mode == "insertion")
            got = curves.scores[order][sample]
            assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=BOUND), (order, sample)
        assert curves.counts[sample].tolist() == counts
    assert torch.equal(curves.fractions[0], torch.tensor(counts, dtype=torch.float64) / total)


def linear_image_model(weights: Tensor) -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(weights.numel(), 2)).double().eval()
    with torch.no_grad():
        model[1].weight.copy_(torch.stack([weights.reshape(-1), -weights.reshape(-1)]))
        model[1].bias.fill_(0.3)
    return model


def test_linear_model_relevance_w_x_reaches_the_optimum_of_every_order() -> None:
    """f(x) = w x + b with the zero baseline: deleting feature i lowers f by w_i x_i, so removing
    features by decreasing w_i x_i gives the lowest MoRF curve, by increasing w_i x_i the highest
    LeRF curve. Enumerating all 5! orders (each given as a relevance map) finds no better one."""
    generator = torch.Generator().manual_seed(2)
    weights = torch.randn(1, 1, 5, generator=generator, dtype=torch.float64)
    image = torch.randn(1, 1, 1, 5, generator=generator, dtype=torch.float64)
    model = linear_image_model(weights)
    optimal = image_curves(model, image, weights * image, target=0, progress=False)
    best_morf, best_lerf, best_abpc = float("inf"), -float("inf"), -float("inf")
    for permutation in itertools.permutations(range(5)):
        relevance = torch.zeros(1, 1, 1, 5, dtype=torch.float64)
        relevance[0, 0, 0, list(permutation)] = -torch.arange(5, dtype=torch.float64)  # morf order = permutation
        curves = image_curves(model, image, relevance, target=0, progress=False)
        best_morf = min(best_morf, float(curves.auc("morf")))
        best_lerf = max(best_lerf, float(curves.auc("lerf")))
        best_abpc = max(best_abpc, float(curves.abpc()))
    assert float(optimal.auc("morf")) == pytest.approx(best_morf, abs=BOUND)
    assert float(optimal.auc("lerf")) == pytest.approx(best_lerf, abs=BOUND)
    assert float(optimal.abpc()) == pytest.approx(best_abpc, abs=BOUND)
    # the curve itself: f(x) minus the running sum of the deleted contributions, largest first
    contributions = torch.sort((weights * image).reshape(-1), descending=True).values
    expected = float(model(image)[0, 0]) - torch.cat([torch.zeros(1, dtype=torch.float64), contributions.cumsum(0)])
    assert torch.allclose(optimal.morf[0], expected, rtol=0, atol=BOUND)
    # AUC: the trapezoidal rule over the fraction deleted (numpy's, on the curve of the formula)
    assert float(optimal.auc("morf")) == pytest.approx(float(np.trapezoid(expected.numpy(), np.arange(6) / 5)),
                                                       abs=BOUND)
    # AOPC (Samek et al. 2017): the mean drop from the start over the L + 1 points
    assert float(optimal.aopc()) == pytest.approx(float((expected[0] - expected).mean()), abs=BOUND)


def test_token_deletion_and_insertion_optimum_on_a_linear_model() -> None:
    """A bag-of-embeddings classifier is linear in the tokens: replacing token t at a position by
    the baseline token b changes the score by v.(e_b - e_t), so relevance v.(e_t - e_b) is the
    best deletion order and the best insertion order; enumeration over all orders agrees."""
    torch.manual_seed(3)
    embedding = nn.Embedding(7, 4).double()
    readout = nn.Linear(4, 2).double()
    model = lambda ids: readout(embedding(ids).sum(dim=1))  # noqa: E731
    ids = torch.tensor([[1, 4, 2, 6, 3]])
    baseline = 0
    direction = readout.weight[1].detach()
    relevance = ((embedding.weight[ids] - embedding.weight[baseline]) @ direction).detach()
    for mode in ("deletion", "insertion"):
        optimal = token_curves(model, ids, relevance, target=1, baseline_token=baseline, mode=mode, progress=False)
        best = -float("inf")
        for permutation in itertools.permutations(range(5)):
            ranks = torch.zeros(1, 5, dtype=torch.float64)
            ranks[0, list(permutation)] = -torch.arange(5, dtype=torch.float64)
            curves = token_curves(model, ids, ranks, target=1, baseline_token=baseline, mode=mode, progress=False)
            best = max(best, float(curves.abpc()))
        assert float(optimal.abpc()) == pytest.approx(best, abs=BOUND)
    # insertion starts from all baseline tokens and ends at the sequence
    curves = token_curves(model, ids, relevance, target=1, baseline_token=baseline, mode="insertion", progress=False)
    assert float(curves.morf[0, 0]) == pytest.approx(float(model(torch.zeros_like(ids))[0, 1]), abs=BOUND)
    assert float(curves.morf[0, -1]) == pytest.approx(float(model(ids)[0, 1]), abs=BOUND)


def test_tokens_outside_the_mask_stay_and_lengths_differ() -> None:
    """Padding (attention mask 0) and positions marked not perturbable are never replaced; sequences
    with different numbers of perturbable tokens share fractions of ``steps``."""
    torch.manual_seed(4)
    embedding = nn.Embedding(9, 3).double()
    calls: list[tuple[Tensor, Tensor]] = []

    def model(ids: Tensor, attention_mask: Tensor) -> Tensor:
        calls.append((ids.clone(), attention_mask.clone()))
        return (embedding(ids) * attention_mask[..., None]).sum(dim=1)[:, :2]

    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    perturbable = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)  # (padding: masked out)
    curves = token_curves(model, ids, torch.rand(2, 5), baseline_token=1, attention_mask=mask,
                          perturbable=perturbable, steps=3, progress=False)
    may_change = perturbable & mask.bool()
    replaced = torch.zeros(2, 5, dtype=torch.bool)
    for batch, masks in calls:
        for row, row_mask in zip(batch, masks, strict=True):
            sample = 0 if bool(row_mask[3]) else 1
            changed = row != ids[sample]
            assert not bool((changed & ~may_change[sample]).any())
            assert bool((row[changed] == 1).all())
            replaced[sample] |= changed
    assert torch.equal(replaced, may_change)  # (the mask keeps only what it must)
    assert curves.counts.tolist() == [[0, 1, 2, 3], [0, 1, 1, 2]]  # round(j * 2 / 3)
    assert torch.equal(curves.fractions[0], torch.tensor([0, 1 / 3, 2 / 3, 1], dtype=torch.float64))


class SumGraphNetwork(nn.Module):
    """Two rounds of summed messages (index_add over edge_index), then a linear read-out per node."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.first, self.second, self.out = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for layer in (self.first, self.second):
            messages = layer(x)[edge_index[0]]
            x = torch.relu(layer(x) + torch.zeros_like(layer(x)).index_add(0, edge_index[1], messages))
        return self.out(x)


@pytest.mark.parametrize("perturb", ["edges", "nodes"])
def test_graph_curves_equal_a_loop_over_steps(perturb: str) -> None:
    model = SumGraphNetwork().double().eval()
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 2], [1, 0, 2, 1, 2, 3, 4, 5]])
    size = 8 if perturb == "edges" else 6
    relevance = torch.randn(2, size, generator=generator, dtype=torch.float64)
    candidates = torch.ones(2, size, dtype=torch.bool)
    candidates[1, :2] = False
    curves = graph_curves(model, x, edge_index, relevance, index=[1, 4], perturb=perturb, candidates=candidates,
                          features_per_step=None, steps=4, batch_size=3, progress=False)
    targets = model(x, edge_index)[[1, 4]].argmax(dim=1)
    for sample, node in enumerate([1, 4]):
        allowed = [i for i in range(size) if candidates[sample, i]]
        for order in ("morf", "lerf"):
            ordered = [allowed[i] for i in reference_order([float(relevance[sample, j]) for j in allowed],
                                                           order == "morf")]
            expected = []
            for point in range(5):
                removed = set(ordered[:round(point * len(allowed) / 4)])
                if perturb == "edges":
                    kept = [i for i in range(size) if i not in removed]
                    output = model(x, edge_index[:, kept])
                else:
                    changed = x.clone()
                    changed[sorted(removed)] = 0.0
                    output = model(changed, edge_index)
                expected.append(float(output[node, targets[sample]]))
            assert torch.allclose(curves.scores[order][sample], torch.tensor(expected, dtype=torch.float64),
                                  rtol=0, atol=BOUND)


def test_random_map_abpc_is_zero_within_its_interval_and_w_x_is_not() -> None:
    """A map drawn at random carries no order: the expected ABPC is 0 and its interval holds 0;
    the faithful map w x of the linear model lies far above it."""
    generator = torch.Generator().manual_seed(7)
    weights = torch.randn(1, 4, 4, generator=generator, dtype=torch.float64)
    images = torch.randn(200, 1, 4, 4, generator=generator, dtype=torch.float64)
    model = linear_image_model(weights)
    random_map = torch.randn(200, 1, 4, 4, generator=generator, dtype=torch.float64)
    random_abpc = image_curves(model, images, random_map, target=0, progress=False).abpc()
    faithful = mean_interval(image_curves(model, images, weights * images, target=0, progress=False).abpc())
    interval = mean_interval(random_abpc)
    assert interval.contains(0.0), interval
    assert faithful.low > interval.high + 3 * (interval.high - interval.low), (faithful, interval)


def test_relevance_from_numpy_and_from_float32_gives_the_same_order() -> None:
    model = small_model()
    images = torch.rand(2, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    relevance = np.random.default_rng(0).standard_normal((2, 6, 6)).astype(np.float32)
    from_numpy = image_curves(model, images, relevance, progress=False)
    from_tensor = image_curves(model, images, torch.from_numpy(relevance)[:, None], progress=False)
    assert torch.equal(from_numpy.morf, from_tensor.morf) and torch.equal(from_numpy.lerf, from_tensor.lerf)


def test_blur_is_a_dense_gaussian_filter() -> None:
    """The separable blur against the 2-D Gaussian kernel applied at every pixel of the image
    reflected at its border (numpy, one window at a time)."""
    images = torch.rand(2, 3, 16, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    sigma, radius = 1.5, 5  # radius ceil(3 sigma)
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-(offsets[:, None] ** 2 + offsets[None, :] ** 2) / (2 * sigma ** 2))
    kernel /= kernel.sum()
    padded = np.pad(images.numpy(), ((0, 0), (0, 0), (radius, radius), (radius, radius)), mode="reflect")
    expected = np.zeros(images.shape)
    for row in range(16):
        for column in range(12):
            window = padded[:, :, row:row + 2 * radius + 1, column:column + 2 * radius + 1]
            expected[:, :, row, column] = (window * kernel).sum(axis=(2, 3))
    assert np.allclose(gaussian_blur(images, sigma).numpy(), expected, rtol=0, atol=1e-12)


def test_noise_baseline_is_seeded_with_the_image_statistics() -> None:
    images = torch.rand(1, 2, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    images[:, 1] = images[:, 1] * 3 + 5
    first, again, other = (image_baseline(images, "noise", seed=seed) for seed in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    for channel in range(2):
        mean, std = images[0, channel].mean(), images[0, channel].std()
        # 4096 draws: the sample mean lies within 5 standard errors of the image's mean
        assert abs(float(first[0, channel].mean() - mean)) < 5 * float(std) / 64
        assert float(first[0, channel].std() / std) == pytest.approx(1.0, abs=0.1)


def test_patch_grid_is_centred() -> None:
    grid = patch_grid(5, 7, 3)
    # height 5 padded to 6 (0 above, 1 below), width 7 padded to 9 (1 left, 1 right)
    assert grid[:, 0].tolist() == [0, 0, 0, 3, 3] and grid[0].tolist() == [0, 0, 1, 1, 1, 2, 2]


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, x: image_curves(m, x, torch.zeros(2, 6, 5)), "relevance has shape"),
    (lambda m, x: image_curves(m, x, torch.full((2, 6, 6), float("nan"))), "NaN or Inf"),
    (lambda m, x: image_curves(m, x, torch.zeros(2, 6, 6), baseline="black"), "baseline must be one of"),
    (lambda m, x: image_curves(m, x, torch.zeros(2, 6, 6), orders="best"), "each order must be one of"),
    (lambda m, x: image_curves(m, x, torch.zeros(2, 6, 6), target=3), "out of range"),
    (lambda m, x: image_curves(m.train(), x, torch.zeros(2, 6, 6)), "model.eval()"),
])
def test_bad_input_is_named(call, message: str) -> None:
    model = small_model()
    images = torch.rand(2, 2, 6, 6, dtype=torch.float64)
    with pytest.raises(EvaluationInputError, match=message):
        call(model, images)
    assert model.training in (True, False)


@pytest.mark.parametrize("mode", ["deletion", "insertion"])
def test_the_unperturbed_input_is_run_once_not_once_per_curve(mode: str) -> None:
    """The model sees the unperturbed batch once and each perturbed input once: a deletion curve's
    first point and an insertion curve's last are the unperturbed input, for both orders."""
    model = small_model()
    seen: list[int] = []

    def counted(batch: Tensor) -> Tensor:
        seen.append(len(batch))
        return model(batch)

    images = torch.rand(3, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    relevance = torch.randn(3, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    curves = image_curves(counted, images, relevance, steps=4, batch_size=5, mode=mode, progress=False)
    assert sum(seen) == 3 + 3 * 2 * 4  # the unperturbed batch, then 2 orders x 4 perturbed points per image
    with torch.no_grad():
        unperturbed = model(images)[torch.arange(3), model(images).argmax(dim=1)]
    end = 0 if mode == "deletion" else -1
    for order in ("morf", "lerf"):
        assert torch.allclose(curves.scores[order][:, end], unperturbed, rtol=0, atol=BOUND)


@pytest.mark.parametrize("kind", ["images", "tokens"])
def test_a_callable_target_reading_the_class_score_gives_the_class_targets_curves(kind: str) -> None:
    """A callable target that reads each row's class logit from the output, by the sample it
    perturbs, gives the curves of the per-sample class targets bit for bit (the same batches and
    values, read by indexing instead of gather); one class for all samples gives other curves."""
    classes = torch.tensor([0, 2, 1])

    def read(output: Tensor, samples: Tensor) -> Tensor:
        return output[torch.arange(len(samples)), classes[samples]]

    generator = torch.Generator().manual_seed(12)
    if kind == "images":
        model = small_model()
        images = torch.rand(3, 2, 6, 6, dtype=torch.float64, generator=generator)
        relevance = torch.randn(3, 2, 6, 6, dtype=torch.float64, generator=generator)

        def curves(target: object) -> object:
            return image_curves(model, images, relevance, target, patch=2, batch_size=4, progress=False)
    else:
        torch.manual_seed(5)
        embedding, readout = nn.Embedding(7, 4).double(), nn.Linear(4, 3).double()
        ids = torch.randint(1, 7, (3, 5), generator=generator)
        relevance = torch.randn(3, 5, dtype=torch.float64, generator=generator)

        def curves(target: object) -> object:
            return token_curves(lambda batch: readout(torch.tanh(embedding(batch)).sum(dim=1)), ids, relevance,
                                target, baseline_token=0, batch_size=4, progress=False)
    by_class, by_callable = curves(classes), curves(read)
    for order in ("morf", "lerf"):
        assert torch.equal(by_class.scores[order], by_callable.scores[order])
    assert not torch.equal(by_callable.morf, curves(0).morf)
