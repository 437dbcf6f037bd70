"""The demo's time plan and its fine-tuning planned for statistical power.

A task's comparison is told apart from training noise when pre-trained − from scratch clears the
threshold that its seeds set (:func:`gptkit.data.metrics.seed_standard_error`): with N seeds the
threshold is near t(0.975, N − 1) (12.7 with 2 seeds, 2.8 with 5), so a few cheap seeds beat two
long ones. Each task's candidate run sizes carry what was measured of them on the sample data's
held-out training examples (docs/experiments.md, "The demo's run sizes measured on held-out
training examples"): the effect and the spread of its per-seed differences, and the share of the
error that the scored examples leave however many seeds run. The plan takes the size whose expected
margin (effect over threshold × error) is largest for the seeds that the time holds, and then runs
seeds, one pair at a time, while the time left holds another pair at the pace measured on the
pairs so far.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gptkit.data.metrics import t_quantile

# The time plan. Pre-training's share of what the vocabulary and the shards leave (on 2 cores the
# 5 minutes it had when the demo's settings were chosen). Sampling's time is set aside first, and a
# margin for loading, the continuations and the machine's noise: the sampling sweep runs until the
# margin's start, so the demo ends within it.
PRETRAIN_SHARE = 0.45
SAMPLING_SECONDS = {"recipe": 40.0, "published": 120.0}
MARGIN_SECONDS = 30.0  # the continuations and the summary: the demo ends in its last minute
MIN_BUDGET_SECONDS = 180.0  # the demo's stages need at least this much after set-up
MAX_SEEDS = 12  # past a dozen the threshold is near 2 and more seeds buy little
# Another seed pair starts only where the time left holds this many times the slowest pair so far
# (a loaded machine's pace drifts).
PAIR_SLACK = 1.25


class Deadline:
    """The demo's wall-clock budget: ``seconds`` from ``start`` (Unix time)."""

    def __init__(self, seconds: float, start: float) -> None:
        self.seconds, self.start = seconds, start
        self.end = start + seconds

    def left(self) -> float:
        return self.end - time.time()

    def elapsed(self) -> float:
        return time.time() - self.start


@dataclass(frozen=True)
class RunSize:
    """One fine-tuning run's size, and what was measured of it on the sample data: per seed pair,
    pre-trained − from scratch on the held-out training examples (the training split's last
    ``DemoTask.held_out``, which ``examples`` leave untouched), never on the split the demo reports."""

    examples: int  # the training split's first examples
    epochs: int
    effect: float  # mean per-seed difference measured
    seed_sd: float  # standard deviation of the per-seed differences measured
    shared_se: float  # the examples' share of the error, which more seeds do not shrink
    # A seed's paired standard error over the scored examples: N seeds' error is never below
    # example_se / √N (seed_standard_error's floor), however alike a few seeds happened to be.
    example_se: float = 0.0

    def updates(self, batch_size: int) -> int:
        """Updates a run takes: whole batches an epoch (the sampler drops a ragged last batch)."""
        return self.epochs * (self.examples // batch_size)


def expected_margin(size: RunSize, seeds: int, examples: int) -> float:
    """The effect over threshold × standard error that ``seeds`` pairs of ``size`` should give:
    :func:`~gptkit.data.metrics.seed_standard_error`'s error and threshold with the measured spread
    in place of the sample's. Above 1 the difference is expected to clear its threshold."""
    if seeds < 2:
        return 0.0  # one seed a side gives no error, so no claim
    between = size.seed_sd**2 / seeds
    shared = size.shared_se**2
    over_seeds = float(t_quantile(0.975, seeds - 1))
    over_examples = float(t_quantile(0.975, examples - 1))
    variance = max(between + shared, size.example_se**2 / seeds)
    if variance <= 0:
        return math.inf
    threshold = max(2.0, (between * over_seeds + (variance - between) * over_examples) / variance)
    return abs(size.effect) / (threshold * math.sqrt(variance))


def choose_size(
    sizes: tuple[RunSize, ...],
    seconds: float,
    pair_seconds: dict[RunSize, float],
    examples: int,
    max_seeds: int = MAX_SEEDS,
) -> tuple[RunSize, int]:
    """The size whose seeds, as many as ``seconds`` hold at ``pair_seconds`` a pair (at most
    ``max_seeds``), give the largest expected margin on ``examples`` scored; with those seeds.
    Where no size holds two pairs, the cheapest, once."""
    best: tuple[float, RunSize, int] | None = None
    for size in sizes:
        seeds = min(max_seeds, int(seconds // max(pair_seconds[size], 1e-9)))
        margin = expected_margin(size, seeds, examples)
        if seeds >= 2 and (best is None or margin > best[0]):
            best = (margin, size, seeds)
    if best is None:
        return min(sizes, key=lambda size: pair_seconds[size]), 1
    return best[1], best[2]


def another_pair_fits(seconds_left: float, pair_seconds: list[float], seeds_run: int, limit: int) -> bool:
    """Whether one more seed pair starts: under ``limit`` pairs, and ``PAIR_SLACK`` times the slowest
    pair so far still fits in ``seconds_left`` (the first pair always runs)."""
    if seeds_run == 0:
        return True
    return seeds_run < limit and seconds_left >= PAIR_SLACK * max(pair_seconds)


@dataclass(frozen=True)
class TimePlan:
    """How the time left is spent: pre-training's seconds (none from published weights), the end of
    fine-tuning (Unix time) and the seeds a side asked for (None: as many as the time holds)."""

    pretrain_seconds: float
    finetune_end: float
    seeds: int | None


def plan_time(deadline: Deadline, kind: str, seeds: int | None, quick: bool) -> TimePlan:
    """Share what set-up and data left between pre-training (``kind`` "recipe") and fine-tuning,
    after sampling's time and the margin; printed."""
    if quick:
        return TimePlan(0.0, time.time(), seeds or 1)
    sampling = SAMPLING_SECONDS[kind]
    shared = deadline.left() - sampling - MARGIN_SECONDS
    if shared < MIN_BUDGET_SECONDS / 2:  # the vocabulary and the shards took what training needed
        raise ValueError(
            f"time budget {deadline.seconds:.0f}s leaves {max(0.0, shared):.0f}s to train after "
            f"{deadline.elapsed():.0f}s of set-up and data; give a larger --time-budget"
        )
    pretrain_seconds = PRETRAIN_SHARE * shared if kind == "recipe" else 0.0
    finetune_seconds = max(0.0, shared - pretrain_seconds)
    print(
        f"\n    time plan: {deadline.seconds:.0f}s in all, {deadline.elapsed():.0f}s spent; "
        + (f"pre-training {pretrain_seconds:.0f}s, " if kind == "recipe" else "")
        + f"fine-tuning {finetune_seconds:.0f}s ("
        + (f"{seeds} seed{'s' if seeds > 1 else ''} a side" if seeds else "as many seeds as fit")
        + f"), sampling {sampling:.0f}s, margin {MARGIN_SECONDS:.0f}s",
        flush=True,
    )
    # Fine-tuning ends before the sampling's and the margin's time, whenever pre-training ended.
    return TimePlan(pretrain_seconds, deadline.end - sampling - MARGIN_SECONDS, seeds)
