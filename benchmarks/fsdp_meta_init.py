"""Meta-device initialisation under FSDP2: each rank's peak resident memory while a GPT-2-medium
shape is built and sharded over 2 processes (gloo, CPU), built the ordinary way (the whole fp32
model on every rank, then ``fully_shard``) against built on ``meta`` and each rank's shards
materialised (:mod:`gptkit.train.distributed.meta_init`), in one run.

Each measurement is a fresh pair of processes (peak RSS only grows), started after the process
group, the imports and a warm-up (a tiny model sharded the same way); the two ways alternate, ROUNDS times, and each
keeps its lowest. The figure per way is the larger of the two ranks' peaks; the whole process is
counted (Python and torch included), as a user's machine sees it. ``ratio``: the ordinary way's
peak over meta init's (higher is a larger saving); ``fraction`` rows: meta init's peak as a
fraction of the ordinary way's, the first measured above the process's resident set before the
model was built, the second of the whole process.
"""

from __future__ import annotations

import os
import resource
import sys

import torch
import torch.multiprocessing as mp
from common import comparison, emit

SHAPE, WORLD_SIZE, ROUNDS = "gpt2-medium", 2, int(os.environ.get("ROUNDS", "2"))
MB = 1024 * 1024


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(rank: int, way: str, port: int, results) -> None:
    from gptkit import GPT, GPTConfig
    from gptkit.testing.processes import torchrun_environment
    from gptkit.train.config import TrainConfig
    from gptkit.train.distributed.meta_init import build_sharded
    from gptkit.train.distributed.processes import init_distributed, shutdown_distributed, wrap_model

    torchrun_environment(rank, WORLD_SIZE, port)
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    try:
        config = GPTConfig.from_preset(SHAPE)
        train = TrainConfig(max_steps=1, fsdp=True)
        # The allocator and the lazy imports both ways need (FSDP2 and DTensor: about 75 MiB) warmed
        # by sharding a tiny model first, so that "above" counts the model alone.
        wrap_model(GPT(GPTConfig.from_preset("tiny")), ctx, train)
        before = current_rss()
        torch.manual_seed(0)
        if way == "meta":
            model, _ = build_sharded(lambda: GPT(config), ctx, train)
        else:
            model = GPT(config)
            wrap_model(model, ctx, train)
        shard_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
        ctx.barrier()
        results[rank] = {"peak": peak_rss(), "before": before, "shard": shard_bytes, "after": current_rss()}
    finally:
        shutdown_distributed()


def measure(way: str) -> dict:
    from gptkit.testing.processes import free_port

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(way, free_port(), results), nprocs=WORLD_SIZE, join=True)
        ranks = [results[r] for r in range(WORLD_SIZE)]
    return {
        "peak": max(r["peak"] for r in ranks),
        "above": max(r["peak"] - r["before"] for r in ranks),
        "shard": max(r["shard"] for r in ranks),
        "after": max(r["after"] - r["before"] for r in ranks),
    }


def main() -> None:
    best: dict[str, dict] = {}
    for _ in range(ROUNDS):
        for way in ("ordinary", "meta"):
            result = measure(way)
            kept = best.setdefault(way, result)
            best[way] = {k: min(kept[k], result[k]) for k in result}
            print(way, {k: round(v / MB) for k, v in result.items()}, "MiB", file=sys.stderr, flush=True)
    meta, ordinary = best["meta"], best["ordinary"]
    what = f"peak RSS per rank, {SHAPE} built and sharded, FSDP2 over {WORLD_SIZE} processes"
    comparisons = [
        comparison(what, "MiB", meta["peak"] / MB, "the whole model built, then fully_shard", ordinary["peak"] / MB, False),
        comparison(
            f"{what}, meta init's over the ordinary way's, above the process before building", "fraction",
            meta["above"] / ordinary["above"], "target", 0.6, False,
        ),
        comparison(
            f"{what}, meta init's over the ordinary way's, whole process", "fraction",
            meta["peak"] / ordinary["peak"], "target", 0.6, False,
        ),
    ]  # fmt: skip
    emit("fsdp_meta_init", comparisons, shard_mib=round(meta["shard"] / MB), rounds=ROUNDS)


if __name__ == "__main__":
    main()
