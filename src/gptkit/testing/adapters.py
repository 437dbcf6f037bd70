"""A LoRA adapter run as `gptkit finetune --lora-rank` writes it, made without training: for the
serving tests and benchmarks, which need several adapters of one base."""

from __future__ import annotations

from pathlib import Path

import torch

from gptkit import GPT
from gptkit.data.tasks import TaskSpec, special_token_ids
from gptkit.model.lora import LORA_TARGETS, LoRASettings
from gptkit.model.task import TaskModel, lora_task_info, save_task_model
from gptkit.tokenizer import Tokenizer
from gptkit.train.finetune.tasks import ready_for_task


def write_adapter_run(
    directory: Path,
    base_dir: Path,
    task: str,
    labels: list[str] | None,
    seed: int,
    rank: int | None = None,
    targets: tuple[str, ...] = LORA_TARGETS,
) -> None:
    """An adapter directory as `gptkit finetune --lora-rank` writes it, with random (trained-looking)
    matrices, rows and head."""
    tokenizer = Tokenizer.from_pretrained(base_dir)
    specials = special_token_ids(tokenizer)
    settings = LoRASettings(rank or 2 + seed, 4.0, targets)
    gpt = ready_for_task(GPT.from_pretrained(base_dir), specials, settings)
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in gpt.parameters():
            if param.requires_grad:
                param.normal_(0.0, 0.3)
    spec = TaskSpec(
        task,
        labels=labels,
        n_choices=2 if task == "multiple_choice" else None,
        max_length=32,
        specials=specials,
    )
    model = TaskModel(gpt, spec, tokenizer=tokenizer)
    info = {**model.task_info(), **lora_task_info(settings, str(base_dir), min(specials.values()))}
    save_task_model(directory, gpt.config, model.state_dict(), info)
    tokenizer.save_pretrained(directory)
