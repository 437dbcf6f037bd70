"""docs/pretraining.md's "what fits where" table, from `gptkit estimate`'s simulation.

For each published shape, stage (fine-tuning every weight, LoRA rank 8, pre-training) and activation
checkpointing (none, full), on one GPU and on 8 with DDP or FSDP2: the simulated training update's
peak per device (gptkit.train.estimate: two Trainer updates on fake tensors, bf16 autocast, AdamW,
attention as a GPU's fused kernels store it), and the largest per-device batch whose peak fits 90% of
each memory size, by the bisection of `gptkit estimate ... --memory SIZE`.

  python scripts/what_fits.py [--models gpt2,gpt2-medium] > table.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from gptkit.config import GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.estimate import (
    PUBLISHED,
    Estimate,
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    finetune_simulation,
    largest_batch,
    pretrain_simulation,
    simulate,
)
from gptkit.train.finetune import FinetuneConfig, LoRAConfig
from gptkit.train.run import ModelShape

GIB = 2**30
SINGLE = (16, 24, 40, 80)  # one GPU, GiB
CLUSTER = 80  # 8 × 80 GiB
STAGES = ("finetune", "lora", "pretrain")
NAMES = {"openai-gpt": "GPT-1", "gpt2": "GPT-2 small", "gpt2-medium": "GPT-2 medium"}
NAMES |= {"gpt2-large": "GPT-2 large", "gpt2-xl": "GPT-2 XL"}


def simulation(model: str, stage: str, checkpointing: str, devices: int, fsdp: bool):
    train = TrainConfig(
        batch_size=devices, precision="bf16", activation_checkpointing=checkpointing, fsdp=fsdp
    )
    options = EstimateOptions(devices=devices)
    if stage == "pretrain":
        shape = ModelShape(preset=PUBLISHED[model])
        return pretrain_simulation(PretrainEstimateConfig(shape, train, options))
    lora = LoRAConfig(rank=8) if stage == "lora" else LoRAConfig()
    finetune = FinetuneConfig(model=ModelShape(init=model), lora=lora, training=train)
    return finetune_simulation(FinetuneEstimateConfig(finetune, options))


def largest_batches(model: str, stage: str, checkpointing: str, devices: int, fsdp: bool) -> list[int]:
    """The largest per-device batch for each memory size (one GPU of each of SINGLE and 8 × CLUSTER
    with DDP, or 8 × CLUSTER with FSDP2), by gptkit.train.estimate.largest_batch's bisection; the
    simulated peaks are shared between the sizes. DDP's peak is one process's plus its gradient
    buckets, as the estimate computes it."""
    sim = simulation(model, stage, checkpointing, devices, fsdp)
    peaks: dict[int, Estimate] = {}

    def run(simulation, batch: int) -> Estimate:
        if batch not in peaks:
            peaks[batch] = simulate(simulation, batch)
        return peaks[batch]

    first = run(sim, 1)
    if fsdp:
        return [largest_batch(sim, CLUSTER * GIB, first, run)]
    sizes = [largest_batch(sim, size * GIB, first, run) for size in SINGLE]

    def with_buckets(simulation, batch: int) -> Estimate:
        one = run(simulation, batch)
        return dataclasses.replace(one, peak_bytes=one.peak_bytes + one.states["gradients"])

    return [*sizes, largest_batch(sim, CLUSTER * GIB, with_buckets(sim, 1), with_buckets)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(NAMES))
    models = parser.parse_args().models.split(",")
    header = [f"1 × {g} GB" for g in SINGLE] + [f"8 × {CLUSTER} GB DDP", f"8 × {CLUSTER} GB FSDP2"]
    print("| model | training | checkpointing | " + " | ".join(header) + " |")
    print("|---|---|---|" + "---|" * len(header))
    records = []
    for model in models:
        length = GPTConfig.from_preset(PUBLISHED[model]).context_length
        for stage in STAGES:
            for checkpointing in ("none", "full"):
                cells = largest_batches(model, stage, checkpointing, 1, False)
                cells += largest_batches(model, stage, checkpointing, 8, True)
                shown = [f"{b} × {length}" if b else "—" for b in cells]
                stage_name = {"finetune": "fine-tune", "lora": "LoRA r=8", "pretrain": "pre-train"}[stage]
                print(
                    f"| {NAMES[model]} | {stage_name} | {checkpointing} | " + " | ".join(shown) + " |",
                    flush=True,
                )
                records.append(
                    {
                        "model": model,
                        "stage": stage,
                        "checkpointing": checkpointing,
                        "batches": cells,
                        "length": length,
                    }
                )
    print(json.dumps(records), file=sys.stderr)


if __name__ == "__main__":
    main()
