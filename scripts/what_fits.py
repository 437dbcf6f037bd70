"""docs/pretraining.md's "what fits where" table, from `gptkit estimate`'s simulation.

For each published shape, stage (fine-tuning every weight, LoRA rank 8, pre-training) and activation
checkpointing (none, full), on one GPU and on 8 with DDP or FSDP2: the simulated training update's
peak per device (gptkit.train.estimate: two Trainer updates on fake tensors, bf16 autocast, AdamW,
attention as a GPU's fused kernels store it) as a function of the per-device batch: the optimizer
step's peak, and the backward pass's, which grows linearly with the batch, from three simulated
batches (at 1, 8 and 16 sequences); each cell is the largest batch whose peak fits 90% of the memory.
`gptkit estimate ... --memory SIZE` finds that batch by bisection on the simulated step instead, at
several simulations a cell: checked on GPT-1, the two agree exactly up to a few hundred sequences and
within 1% beyond (1146 against 1139 sequences with checkpointing on 80 GB). DDP's peak is one
process's plus its gradient buckets, as the estimate computes it.

  python scripts/what_fits.py [--models gpt2,gpt2-medium] > table.md
"""

from __future__ import annotations

import argparse
import json
import sys

from gptkit.config import GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.estimate import (
    PUBLISHED,
    USABLE_FRACTION,
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    finetune_simulation,
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


def peak_line(sim) -> tuple[int, float, float]:
    """The simulated peak as a function of the per-device batch b: max(step, fixed + per_sequence·b).
    The optimizer step's peak (``step``, read where it sets the peak, at one sequence) does not
    depend on b; the backward pass's grows linearly with it (the activations are per sequence), so
    two batches whose peak the backward pass sets give the line."""
    one = simulate(sim, 1)
    step = one.peak_bytes if one.by_category["activations"] == 0 else 0
    batch = 8
    while (low := simulate(sim, batch)).by_category["activations"] == 0:
        batch *= 4  # the step still sets the peak: go where the activations do
    high = simulate(sim, 2 * batch)
    per_sequence = (high.peak_bytes - low.peak_bytes) / batch
    return step, low.peak_bytes - per_sequence * batch, per_sequence


def largest(line: tuple[int, float, float], gib: int, extra: int = 0) -> int:
    """The largest batch whose peak (plus ``extra`` bytes) fits 90% of ``gib``."""
    step, fixed, per_sequence = line
    usable = gib * GIB * USABLE_FRACTION - extra
    if step > usable or fixed + per_sequence > usable:
        return 0
    return int((usable - fixed) // per_sequence)


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
                alone = simulation(model, stage, checkpointing, 1, False)
                single = peak_line(alone)
                buckets = simulate(alone, 1).states["gradients"]  # DDP's: one copy of the gradients
                sharded = peak_line(simulation(model, stage, checkpointing, 8, True))
                cells = [largest(single, g) for g in SINGLE]
                cells += [largest(single, CLUSTER, buckets), largest(sharded, CLUSTER)]
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
