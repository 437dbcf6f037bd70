"""LoRA against full fine-tuning on a GPT-2-medium-shaped task model: trainable parameters, peak
memory and update time; gptkit's own LoRA layers against peft's on the same model.

Shape: 24 layers, d 1024, 16 heads, vocabulary 50257 (GPT-2 medium), a classification head, batch 2
of 32-token sequences, dropout 0, fp32, L3 = L2 + 0.5·L1 as `gptkit finetune` trains. One update is
forward + backward + AdamW. Each variant runs in a fresh process (its peak RSS is its own): one
warm-up update, then timed ones; the variants alternate, ROUNDS times, and each keeps its fastest
round. The time is the process's CPU time per update (all threads), which other load on the machine
inflates less than the wall clock; both are printed.

  full   every weight trained (what `gptkit finetune` did before LoRA)
  lora   gptkit.model.lora, rank 8 on c_attn, c_proj, c_fc; special tokens' rows and head trained
  peft   peft's LoraConfig(r=8, same targets, head in modules_to_save) on the same gptkit model
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from common import emit, median, spread_comparison

SHAPE = dict(n_layer=24, d_model=1024, n_head=16, vocab=50257, context=1024, batch=2, tokens=32)
RANK, WARMUP, STEPS, ROUNDS = 8, 1, 2, 5


def task_model(variant: str):
    """SHAPE's classifier (three special tokens added), trained whole (full), through gptkit's LoRA or
    through peft's."""
    from gptkit import GPT, GPTConfig
    from gptkit.data.tasks import TaskSpec
    from gptkit.model.lora import LoRASettings, add_lora
    from gptkit.model.task import TaskModel

    s = SHAPE
    config = GPTConfig(
        vocab_size=s["vocab"],
        context_length=s["context"],
        n_layer=s["n_layer"],
        n_head=s["n_head"],
        d_model=s["d_model"],
        ln_position="pre",
        dropout=0.0,
    )
    gpt = GPT(config)
    specials = {"_start_": s["vocab"], "_delimiter_": s["vocab"] + 1, "_classify_": s["vocab"] + 2}
    gpt.add_special_tokens(3)
    if variant == "lora":
        add_lora(gpt, LoRASettings(RANK, 2.0 * RANK), first_trainable_row=s["vocab"])
    model = TaskModel(gpt, TaskSpec("classification", labels=["0", "1"], specials=specials), 0.0, 0.5)
    if variant == "peft":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=RANK, lora_alpha=2 * RANK, target_modules=["c_attn", "c_proj", "c_fc"], modules_to_save=["head"]
        )
        model = get_peft_model(model, lora)
    return model


def time_updates(model, optimizer, batch: dict) -> tuple[list[float], list[float]]:
    """CPU and wall seconds of each of STEPS updates, after WARMUP untimed ones."""
    cpu_times, wall_times = [], []
    for step in range(WARMUP + STEPS):
        cpu, wall = time.process_time(), time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP:
            cpu_times.append(time.process_time() - cpu)
            wall_times.append(time.perf_counter() - wall)
    return cpu_times, wall_times


def worker(variant: str) -> None:
    """One variant in its own process (its peak RSS is its own): its figures as one JSON line."""
    import torch

    from gptkit.train.memory.allocator import keep_freed_memory
    from gptkit.train.optim import build_optimizer

    keep_freed_memory()  # as gptkit's Trainer does on CPU
    torch.manual_seed(0)
    s = SHAPE
    model = task_model(variant)
    model.train()
    optimizer = build_optimizer(model, 6.25e-5, 0.01)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, s["vocab"], (s["batch"], 1, s["tokens"]))
    batch = dict(
        input_ids=ids,
        clf_positions=torch.full((s["batch"], 1), s["tokens"] - 1),
        lm_labels=ids,
        targets=torch.randint(0, 2, (s["batch"],)),
    )
    cpu_times, wall_times = time_updates(model, optimizer, batch)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "variant": variant,
                "trainable": trainable,
                "parameters": total,
                "peak_rss_mb": round(peak_mb),
                "cpu_s_per_update": round(sorted(cpu_times)[len(cpu_times) // 2], 2),
                "wall_s_per_update": round(sorted(wall_times)[len(wall_times) // 2], 2),
            }
        )
    )


def main() -> None:
    runs: dict[str, list[dict]] = {}
    for _ in range(ROUNDS):  # the variants alternate, so the machine's drift touches all alike
        for variant in ("full", "lora", "peft"):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", variant], capture_output=True, text=True, check=True
            )
            runs.setdefault(variant, []).append(json.loads(out.stdout.strip().splitlines()[-1]))

    def figures(variant: str, key: str) -> list[float]:
        return [run[key] for run in runs[variant]]

    medians = {
        variant: runs[variant][0]
        | {
            key: median(figures(variant, key))
            for key in ("peak_rss_mb", "cpu_s_per_update", "wall_s_per_update")
        }
        for variant in runs
    }
    memory, cpu = ("peak memory", "MB", "peak_rss_mb"), ("CPU time per update", "s", "cpu_s_per_update")
    comparisons = [
        spread_comparison(what, unit, figures("lora", key), peer, figures(other, key), higher_is_better=False)
        for (what, unit, key), peer, other in (
            (memory, "full fine-tuning", "full"),
            (cpu, "full fine-tuning", "full"),
            (cpu, "peft LoRA", "peft"),
        )
    ]
    emit(
        "lora_finetune",
        comparisons,
        shape=SHAPE,
        rank=RANK,
        rounds=ROUNDS,
        results=medians,
        trainable_fraction=round(medians["lora"]["trainable"] / medians["full"]["trainable"], 5),
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
