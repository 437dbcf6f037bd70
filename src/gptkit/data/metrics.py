"""Task metrics: accuracy, F1, Matthews correlation, Pearson and Spearman correlation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


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
