"""Activation checkpointing on a CPU training update: peak memory and time per update, none against
selective and full, in one run.

GPT-2 small's shape pre-trained at batch 8 × 256 in fp32 (dropout 0.1, AdamW), one process, through
the Trainer's own step (benchmarks/memory_estimate.py's worker: a fresh process per measurement,
two updates, the second timed; its peak is malloc's bytes in use above the start, its resident set
beside it). The three modes alternate, ROUNDS rounds; medians, with each mode's least and most. The estimate of the same update (`gptkit estimate pretrain ... --target cpu`) is recorded
beside each measurement. ``ratio``: none's figure over the mode's (memory: higher is a larger
saving; time: below 1 is the recomputation's cost).
"""

from __future__ import annotations

import sys

from common import emit, median, spread_comparison
from memory_estimate import BATCH, LENGTH, MB, measured_in_fresh_process, simulation

MODES = ("none", "selective", "full")
SHAPE, STAGE, ROUNDS = "gpt2 small", "pretrain", 5


def main() -> None:
    from gptkit.train.memory.estimate import estimate

    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(ROUNDS):
        for mode in MODES:
            runs[mode].append(measured_in_fresh_process(SHAPE, STAGE, mode))
            print(mode, runs[mode][-1], file=sys.stderr, flush=True)

    def figures(mode: str, key: str, scale: float = 1.0) -> list[float]:
        return [run[key] / scale for run in runs[mode]]

    rows = {}
    for mode in MODES:
        estimated = estimate(simulation(SHAPE, STAGE, mode))
        rows[mode] = {
            "peak_mb": round(median(figures(mode, "peak_bytes", MB))),
            "peak_rss_mb": round(median(figures(mode, "peak_rss_bytes", MB))),
            "estimated_peak_mb": round(estimated.peak_bytes / MB),
            "estimated_activations_mb": round(estimated.by_category["activations"] / MB),
            "cpu_s_per_update": median(figures(mode, "cpu_s_per_update")),
            "wall_s_per_update": median(figures(mode, "wall_s_per_update")),
        }
    comparisons = []
    for mode in ("selective", "full"):
        what = f"{mode} checkpointing, GPT-2 small, batch {BATCH} × {LENGTH}, fp32"
        comparisons += [
            spread_comparison(
                f"peak memory, {what}",
                "MB",
                figures(mode, "peak_bytes", MB),
                "no checkpointing",
                figures("none", "peak_bytes", MB),
                higher_is_better=False,
            ),
            spread_comparison(
                f"CPU time per update, {what}",
                "s",
                figures(mode, "cpu_s_per_update"),
                "no checkpointing",
                figures("none", "cpu_s_per_update"),
                higher_is_better=False,
            ),
        ]
    emit("activation_checkpointing", comparisons, rows=rows, batch=BATCH, length=LENGTH, rounds=ROUNDS)


if __name__ == "__main__":
    main()
