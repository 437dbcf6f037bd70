"""Task metrics: accuracy, F1, Matthews correlation, Pearson and Spearman correlation; paired
differences between two systems on the same examples, and over seeds.

The error of a difference over N seeds (:func:`seed_standard_error`). Model: the difference on
example j with seed i is x_ij = Δ + a_j + t_i + e_ij, with a_j the example's own effect (variance
σ_a², shared by every seed, as every seed scores the same examples), t_i the training noise (σ_t²)
and e_ij the rest (σ_e²); d_i is seed i's mean over the n examples, s_i its paired standard error
over them, P that of the seed-averaged difference. The estimate d̄ = mean_i d_i has

    Var(d̄) = σ_t²/N + σ_a²/n + σ_e²/(nN).

The example term σ_a²/n does not shrink with more seeds, so the spread of the d_i alone misses
it; the s_i alone miss σ_t². Their expected values give each piece:

    E[Var_i(d_i)] = σ_t² + σ_e²/n            (sample variance across seeds)
    E[s_i²]       = (σ_a² + σ_e²)/n
    E[P²]         = (σ_a² + σ_e²/N)/n
    so  σ_a²/n    = (N·P² − mean_i s_i²)/(N − 1)   in expectation, and

    SE² = max(B + E, mean_i s_i²/N),  B = Var_i(d_i)/N,  E = max(0, (N·P² − mean_i s_i²)/(N − 1)).

Without the max this is unbiased (for accuracy it is the two-way random-effects ANOVA's
(MS_seeds + MS_examples − MS_residual)/(nN)); the max keeps a noisy estimate of σ_a²/n from
going below 0, so the error is never below the spread across seeds; and since Var(d̄) is at least
(σ_a² + σ_e²)/(nN), the examples' noise of the seeds' average, whose estimate is mean_i s_i²/N,
SE² never goes below that either (two seeds that agree by chance have no spread, and B + E
would then claim no error at all). Adding mean_i s_i² instead of E would count σ_e² twice.

B rests on N − 1 degrees of freedom: with 3 seeds and training noise that dominates, ±2 SE
covers the true difference only about 82% of the time. The threshold is Cochran and Cox's for a
sum of two variance estimates: each term's two-sided 95% t quantile (N − 1 and n − 1 degrees of
freedom) weighted by its share of SE², and never below 2; 4.30 when B is all of it with 3 seeds,
2 when E is. (Satterthwaite's degrees of freedom, estimated from the same data, covered 92–93%
in simulation when training noise was large: a seed spread low by chance raises them just when
the error is too small.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import torch
from numpy.typing import ArrayLike


def accuracy(predictions: Sequence[int], targets: Sequence[int]) -> float:
    return sum(p == t for p, t in zip(predictions, targets)) / max(len(targets), 1)


def f1(predictions: Sequence[int], targets: Sequence[int], positive: int = 1) -> float:
    tp = sum(p == positive and t == positive for p, t in zip(predictions, targets))
    fp = sum(p == positive and t != positive for p, t in zip(predictions, targets))
    fn = sum(p != positive and t == positive for p, t in zip(predictions, targets))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(predictions: Sequence[int], targets: Sequence[int], positive: int = 1) -> float:
    tp = sum(p == positive and t == positive for p, t in zip(predictions, targets))
    tn = sum(p != positive and t != positive for p, t in zip(predictions, targets))
    fp = sum(p == positive and t != positive for p, t in zip(predictions, targets))
    fn = sum(p != positive and t == positive for p, t in zip(predictions, targets))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return cov / (sx * sy) if sx and sy else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    return pearson(_ranks(xs), _ranks(ys))


def classification_metrics(
    predictions: Sequence[int], targets: Sequence[int], n_classes: int
) -> dict[str, float]:
    out = {"accuracy": accuracy(predictions, targets)}
    if n_classes == 2:
        out["f1"] = f1(predictions, targets)
        out["mcc"] = matthews_corrcoef(predictions, targets)
    return out


def regression_metrics(predictions: Sequence[float], targets: Sequence[float]) -> dict[str, float]:
    return {
        "pearson": pearson(predictions, targets),
        "spearman": spearman(predictions, targets),
        "mse": sum((p - t) ** 2 for p, t in zip(predictions, targets)) / max(len(targets), 1),
    }


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of ``a[i] - b[i]`` and its standard error, for two systems scored on the same examples
    (per-example scores such as 1/0 for correct/wrong).

    The pairing removes the examples' own difficulty from the noise: the error is
    sd(a - b) / sqrt(n), usually far below what two independent accuracies' errors would add up
    to (a paired bootstrap of the mean converges to the same figure).
    """
    if len(a) != len(b):
        raise ValueError(f"paired scores need the same examples: {len(a)} against {len(b)}")
    n = len(a)
    if n < 2:
        raise ValueError(f"a paired standard error needs at least 2 examples, got {n}")
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(variance / n)


def _batched_metric(name: str, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``name`` for every row of (resamples, n) predictions and targets at once (the bootstrap's
    thousand rescorings in one pass); the same definitions as the functions above."""
    if name == "accuracy":
        return (predictions == targets).double().mean(-1)
    if name == "pearson":
        p = predictions - predictions.mean(-1, keepdim=True)
        t = targets - targets.mean(-1, keepdim=True)
        denominator = (p.square().sum(-1) * t.square().sum(-1)).sqrt()
        return torch.where(denominator > 0, (p * t).sum(-1) / denominator.clamp_min(1e-300), 0.0)
    if name not in ("f1", "mcc"):
        raise ValueError(f"no paired bootstrap for metric {name!r}: choose accuracy, f1, mcc or pearson")
    said, true = predictions == 1, targets == 1
    tp = (said & true).sum(-1).double()
    fp = (said & ~true).sum(-1).double()
    fn = (~said & true).sum(-1).double()
    if name == "f1":
        return torch.where(tp > 0, 2 * tp / (2 * tp + fp + fn).clamp_min(1), 0.0)
    tn = (~said & ~true).sum(-1).double()
    denominator = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)).sqrt()
    return torch.where(denominator > 0, (tp * tn - fp * fn) / denominator.clamp_min(1e-300), 0.0)


def paired_bootstrap(
    metric: str,
    a: Sequence[float],
    b: Sequence[float],
    targets: Sequence[float],
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """``metric`` of system ``a``'s predictions less system ``b``'s on the same examples, and the
    standard error of that difference by a paired bootstrap: the examples are resampled with
    replacement ``resamples`` times, both systems rescored on each resample, and the spread of the
    differences is the error (Efron and Tibshirani; Koehn 2004 for comparing two systems). For a
    metric that is not a mean over examples (F1, Matthews, Pearson) no formula such as
    :func:`paired_difference`'s exists; for accuracy the two agree.
    """
    if not len(a) == len(b) == len(targets):
        raise ValueError(
            f"paired scores need the same examples: {len(a)}, {len(b)} and {len(targets)} targets"
        )
    if len(a) < 2:
        raise ValueError(f"a paired standard error needs at least 2 examples, got {len(a)}")
    a_, b_, t_ = (torch.tensor(values, dtype=torch.float64) for values in (a, b, targets))
    difference = float(
        _batched_metric(metric, a_[None], t_[None]) - _batched_metric(metric, b_[None], t_[None])
    )
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(len(a), (resamples, len(a)), generator=generator)
    differences = _batched_metric(metric, a_[rows], t_[rows]) - _batched_metric(metric, b_[rows], t_[rows])
    return difference, float(differences.std())


# Differences over several fine-tuning seeds ---------------------------------------------------------


def t_quantile(p: float, df: ArrayLike) -> np.ndarray:
    """Student's t distribution's ``p`` quantile (0.5 < p < 1) for each of ``df`` degrees of freedom
    (at least 1; ``inf`` gives the normal's). The CDF is the density integrated by Simpson's rule
    from 0, solved by Newton's method from the Cornish–Fisher expansion (Abramowitz and Stegun
    26.7.5): the CDF is concave above 0, so after at most one step the iterates climb to the root
    without overshooting it."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1, got {p}")
    # Past a million degrees of freedom the quantile is the normal's to 7 digits.
    nu = np.minimum(np.asarray(df, dtype=np.float64), 1e6)
    if np.any(~(nu >= 1)):
        raise ValueError(f"t_quantile needs at least 1 degree of freedom, got {df}")
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    log_scale = (lgamma((nu + 1) / 2) - lgamma(nu / 2) - 0.5 * np.log(nu * math.pi))[..., None]

    def density(t: np.ndarray) -> np.ndarray:  # t: (..., points)
        return np.exp(log_scale - (nu[..., None] + 1) / 2 * np.log1p(t * t / nu[..., None]))

    z = NormalDist().inv_cdf(p)
    x = (
        z
        + (z**3 + z) / 4 / nu
        + (5 * z**5 + 16 * z**3 + 3 * z) / 96 / nu**2
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384 / nu**3
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160 / nu**4
    )
    weights = np.ones(257)  # Simpson's 1, 4, 2, 4, ..., 4, 1 over 256 intervals
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    for _ in range(100):  # 1 degree of freedom, the slowest, converges in about 10
        grid = x[..., None] * np.linspace(0, 1, 257)
        cdf = 0.5 + (density(grid) * weights).sum(-1) * x / (3 * 256)
        step = (p - cdf) / density(x[..., None])[..., 0]
        x = x + step
        if np.all(np.abs(step) < 1e-10):
            break
    return x


def seed_standard_error(
    differences: ArrayLike, example_stderrs: ArrayLike, pooled_stderr: ArrayLike, examples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean of N seeds' paired differences, its standard error counting both the training noise
    (which run each seed draws) and the example noise (which examples were scored), and the claim
    threshold: how many of those errors a difference must clear to be claimed at 95%. Arrays
    broadcast over leading axes; the seeds are the last.

    ``differences`` are the per-seed differences d_i (system a − system b, seed i of each, scored on
    the same n = ``examples`` examples), ``example_stderrs`` the per-seed paired standard errors s_i
    over examples, ``pooled_stderr`` P the paired standard error over examples of the seed-averaged
    difference (each resample of examples shared by every seed).

    The error model, its estimate and the threshold are derived in the module's docstring. With
    one seed the error is s_1 alone and the threshold that of n − 1 degrees of freedom: the
    training noise is not counted.
    """
    d = np.asarray(differences, dtype=np.float64)
    s = np.asarray(example_stderrs, dtype=np.float64)
    pooled = np.asarray(pooled_stderr, dtype=np.float64)
    if d.shape != s.shape:
        raise ValueError(f"one example standard error per seed: {s.shape} against {d.shape}")
    if examples < 2:
        raise ValueError(f"a paired standard error needs at least 2 examples, got {examples}")
    seeds = d.shape[-1]
    mean = d.mean(-1)
    over_examples = float(t_quantile(0.975, examples - 1))
    if seeds == 1:
        return mean, s[..., 0], np.full(mean.shape, max(2.0, over_examples))
    between = d.var(-1, ddof=1) / seeds
    shared = np.maximum(0.0, (seeds * pooled**2 - (s**2).mean(-1)) / (seeds - 1))
    # Var(d̄) is never below the examples' noise of N seeds' average, (σ_a² + σ_e²)/(nN) = E[s_i²]/N:
    # a floor for when a few seeds agree by chance (2 seeds with equal differences have no spread,
    # and B + E alone would claim an error of 0). It rests on the examples' degrees of freedom.
    # What the floor adds is examples' noise, weighed as such in the threshold.
    variance = np.maximum(between + shared, (s**2).mean(-1) / seeds)
    over_seeds = float(t_quantile(0.975, seeds - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        weighted = (between * over_seeds + (variance - between) * over_examples) / variance
    # No spread at all (identical systems): no threshold to weigh; 2 keeps the table's rule.
    threshold = np.maximum(2.0, np.where(variance > 0, weighted, 2.0))
    return mean, np.sqrt(variance), threshold


def _mean_and_stderr(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean over the last axis and its standard error, sd / √n (as :func:`paired_difference`)."""
    return values.mean(-1), values.std(-1, ddof=1) / math.sqrt(values.shape[-1])


@dataclass(frozen=True)
class SeedDifference:
    """System a − system b over N seeds on the same examples (see :func:`seed_standard_error`)."""

    difference: float  # mean over seeds
    stderr: float
    threshold: float  # a claim: |difference| > threshold × stderr
    per_seed: list[float]
    per_seed_stderr: list[float]

    @property
    def training_noise_counted(self) -> bool:
        return len(self.per_seed) > 1

    @property
    def claimed(self) -> bool:
        return abs(self.difference) > self.threshold * self.stderr


def seed_paired_difference(
    metric: str,
    a_runs: Sequence[Sequence[float]],
    b_runs: Sequence[Sequence[float]] | None,
    targets: Sequence[float],
    resamples: int = 1000,
    seed: int = 0,
) -> SeedDifference:
    """``metric`` of system a less system b, seed i of one paired with seed i of the other (each
    run's predictions on the same examples), with :func:`seed_standard_error`'s error. The example
    errors are :func:`paired_difference`'s for accuracy and, for F1, Matthews and Pearson,
    :func:`paired_bootstrap`'s, every seed rescored on the same resamples so that the pooled error
    keeps the examples shared. Without ``b_runs``: system a's own score over its seeds, and its
    error."""
    if not a_runs or (b_runs is not None and len(a_runs) != len(b_runs)):
        raise ValueError(f"one run of each system per seed: {len(a_runs)} against {len(b_runs or [])}")
    n = len(targets)
    if any(len(run) != n for run in (*a_runs, *(b_runs or []))):
        raise ValueError(f"every run needs a prediction for each of the {n} examples")
    pairs = list(zip(a_runs, b_runs or [None] * len(a_runs)))
    if metric == "accuracy":
        truth = np.asarray(targets, dtype=np.float64)

        def correct(run: Sequence[float] | None) -> np.ndarray:
            return np.zeros(n) if run is None else (np.asarray(run) == truth) * 1.0

        # (seeds, examples): 1, 0 or -1 where a is right and b wrong, both alike, or b right.
        per_example = np.stack([correct(a) - correct(b) for a, b in pairs])
        differences, stderrs = _mean_and_stderr(per_example)
        pooled = _mean_and_stderr(per_example.mean(0))[1]
    else:
        t_ = torch.tensor(targets, dtype=torch.float64)
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randint(n, (resamples, n), generator=generator)

        def score(run: Sequence[float] | None, rows: torch.Tensor) -> torch.Tensor:
            if run is None:
                return torch.zeros(len(rows), dtype=torch.float64)
            return _batched_metric(metric, torch.tensor(run, dtype=torch.float64)[rows], t_[rows])

        whole = torch.arange(n)[None]
        differences = [float(score(a, whole) - score(b, whole)) for a, b in pairs]
        resampled = [score(a, rows) - score(b, rows) for a, b in pairs]
        stacked = torch.stack(resampled)  # (seeds, resamples)
        stderrs = stacked.std(-1).tolist()
        pooled = float(stacked.mean(0).std())
    mean, stderr, threshold = seed_standard_error(differences, stderrs, pooled, n)
    return SeedDifference(
        difference=float(mean),
        stderr=float(stderr),
        threshold=float(threshold),
        per_seed=[float(d) for d in differences],
        per_seed_stderr=[float(s) for s in stderrs],
    )
