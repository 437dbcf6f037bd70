"""Activation checkpointing on a CPU training update: peak memory and time per update, none against
selective and full, in one run.

GPT-2 small's shape pre-trained at batch 8 × 256 in fp32 (dropout 0.1, AdamW), one process, through
the Trainer's own step (benchmarks/memory_estimate.py's worker: a fresh process per measurement,
two updates, the second timed; its peak is malloc's bytes in use above the start, its resident set
beside it). The three modes alternate, ROUNDS times; each keeps its fastest round (the machine is
shared). The estimate of the same update (`gptkit estimate pretrain ... --target cpu`) is recorded
beside each measurement. ``ratio``: none's figure over the mode's (memory: higher is a larger
saving; time: below 1 is the recomputation's cost).
"""

from __future__ import annotations

import sys

from common import comparison, emit
from memory_estimate import BATCH, LENGTH, MB, measured_in_fresh_process, simulation

MODES = ("none", "selective", "full")
SHAPE, STAGE, ROUNDS = "gpt2 small", "pretrain", 2


def main() -> None:
    from gptkit.train.estimate import estimate

    best: dict[str, dict] = {}
    for _ in range(ROUNDS):
        for mode in MODES:
            result = measured_in_fresh_process(SHAPE, STAGE, mode)
            print(mode, result, file=sys.stderr, flush=True)
            if mode not in best or result["cpu_s_per_update"] < best[mode]["cpu_s_per_update"]:
                best[mode] = result
    rows = {}
    for mode in MODES:
        estimated = estimate(simulation(SHAPE, STAGE, mode))
        rows[mode] = {
            "peak_mb": round(best[mode]["peak_bytes"] / MB),
            "peak_rss_mb": round(best[mode]["peak_rss_bytes"] / MB),
            "estimated_peak_mb": round(estimated.peak_bytes / MB),
            "estimated_activations_mb": round(estimated.by_category["activations"] / MB),
            "cpu_s_per_update": best[mode]["cpu_s_per_update"],
            "wall_s_per_update": best[mode]["wall_s_per_update"],
        }
    none = rows["none"]
    comparisons = []
    for mode in ("selective", "full"):
        row = rows[mode]
        what = f"{mode} checkpointing, GPT-2 small, batch {BATCH} × {LENGTH}, fp32"
        comparisons += [
            comparison(
                f"peak memory, {what}", "MB", row["peak_mb"], "no checkpointing", none["peak_mb"], False
            ),
            comparison(
                f"CPU time per update, {what}",
                "s",
                row["cpu_s_per_update"],
                "no checkpointing",
                none["cpu_s_per_update"],
                False,
            ),
        ]
    emit("activation_checkpointing", comparisons, rows=rows, batch=BATCH, length=LENGTH, rounds=ROUNDS)


if __name__ == "__main__":
    main()
