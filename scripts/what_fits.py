"""docs/pretraining.md's "what fits where" table, from `gptkit estimate`'s simulation.

For each published shape, stage (fine-tuning every weight, LoRA rank 8, pre-training) and activation
checkpointing (none, full), on one GPU and on 8 with DDP or FSDP2: the simulated training update's
peak per device (gptkit.train.memory.simulation: two Trainer updates on fake tensors, bf16 with CUDA
autocast's precision per operation, AdamW, attention as a GPU's fused kernels store it) as a
function of the per-device batch (PeakCurve), and each cell the largest batch whose peak fits 90% of
the memory, found by gptkit.train.memory.estimate.largest_batch as `gptkit estimate ... --memory SIZE`
finds it. Memory sizes are GiB (2^30 bytes; what GPU makers sell as "80 GB" is 80 GiB). Below 16
sequences every peak the search asks for is simulated; above 16 the line through the simulated
peaks at 8 and 16 sequences stands in for the simulation (checked on GPT-1: it agrees exactly up to
a few hundred sequences and within 1% beyond). DDP's peak is one process's plus its gradient
buckets, as the estimate computes it. The JSON records on stderr carry each line's bytes per
sequence and fixed bytes (one GPU, FSDP2 at 8).

  python scripts/what_fits.py [--models gpt2,gpt2-medium] > table.md
"""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace

from gptkit.config import GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig
from gptkit.train.memory.estimate import (
    PUBLISHED,
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    finetune_simulation,
    largest_batch,
    pretrain_simulation,
)
from gptkit.train.memory.simulation import simulate
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


class PeakCurve:
    """The simulated peak as a function of the per-device batch b: at least the peak at one sequence
    (more sequences never need less), and the backward pass's, which grows linearly with b once the
    activations set it (they are per sequence), so two such batches give the line. Below 16
    sequences every peak is simulated; above, the line stands in for the simulation."""

    def __init__(self, sim, extra: int = 0, runs: dict | None = None):
        self.sim, self.extra = sim, extra
        self.runs = {} if runs is None else runs  # batch -> simulated Estimate, shareable
        self.at_one = self.simulated(1)
        batch = 8
        while self.simulated(batch).by_category["activations"] == 0:
            batch *= 4  # the optimizer step still sets the peak: go where the activations do
        low, high = self.simulated(batch).peak_bytes, self.simulated(2 * batch).peak_bytes
        self.per_sequence = (high - low) / batch
        self.fixed = low - self.per_sequence * batch

    def simulated(self, batch: int):
        if batch not in self.runs:
            self.runs[batch] = simulate(self.sim, batch)
        return self.runs[batch]

    def run(self, sim, batch: int):
        """``simulate``'s peak (plus ``extra`` bytes), from the line above 16 sequences."""
        if batch <= 16:
            peak = self.simulated(batch).peak_bytes
        else:
            peak = max(self.at_one.peak_bytes, int(self.fixed + self.per_sequence * batch))
        return SimpleNamespace(batch_size=batch, peak_bytes=peak + self.extra)

    def largest(self, gib: int) -> int:
        """The largest batch whose peak fits 90% of ``gib`` GiB (gptkit.train.memory.estimate's search)."""
        return largest_batch(self.sim, gib * GIB, self.run(self.sim, 1), run=self.run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(NAMES))
    models = parser.parse_args().models.split(",")
    header = [f"1 × {g} GiB" for g in SINGLE] + [f"8 × {CLUSTER} GiB DDP", f"8 × {CLUSTER} GiB FSDP2"]
    print("| model | training | checkpointing | " + " | ".join(header) + " |")
    print("|---|---|---|" + "---|" * len(header))
    records = []
    for model in models:
        length = GPTConfig.from_preset(PUBLISHED[model]).context_length
        for stage in STAGES:
            for checkpointing in ("none", "full"):
                alone = simulation(model, stage, checkpointing, 1, False)
                single = PeakCurve(alone)
                buckets = single.at_one.states["gradients"]  # DDP's: one copy of the gradients
                replicated = PeakCurve(alone, extra=buckets, runs=single.runs)  # DDP: buckets added
                sharded = PeakCurve(simulation(model, stage, checkpointing, 8, True))
                cells = [single.largest(g) for g in SINGLE]
                cells += [replicated.largest(CLUSTER), sharded.largest(CLUSTER)]
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
                        # The lines' bytes per sequence and at none, one GPU and FSDP2 at 8.
                        "per_sequence_bytes": [round(single.per_sequence), round(sharded.per_sequence)],
                        "fixed_bytes": [round(single.fixed), round(sharded.fixed)],
                    }
                )
    print(json.dumps(records), file=sys.stderr)


if __name__ == "__main__":
    main()
