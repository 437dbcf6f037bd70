"""What every fine-tuning run shares, the discriminative tasks' and generation's: reading the
splits, keeping the best dev model, counting what trains."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch.nn as nn

from gptkit.data.examples import GENERATIVE_TASKS, Example
from gptkit.data.formats import DataError
from gptkit.data.registry import read_dataset
from gptkit.data.tables import parse_columns, read_table
from gptkit.io import read_json, write_json
from gptkit.train.distributed.processes import DistributedContext, full_model_state_dict
from gptkit.train.finetune.config import FinetuneConfig
from gptkit.train.rundir import RunDir

MERGED_DIR = "merged"  # where --merge writes a LoRA run's full model, inside the run directory


class BestModel:
    """Keeps the model with the best dev score at the top of the run directory (and ``best.json``)."""

    def __init__(self, out_dir: Path, metric: str, save_model, ctx: DistributedContext, resume: bool):
        self.out_dir, self.metric, self.save_model, self.ctx = out_dir, metric, save_model, ctx
        self.best: dict = {"score": -math.inf}
        self.run_dir = RunDir(out_dir)
        if resume and self.run_dir.best.exists():  # the best epoch before the interruption
            self.best.update(read_json(self.run_dir.best))

    def __call__(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        score = metrics.get(f"dev_{self.metric}", metrics.get("dev_accuracy", -math.inf))
        # Each rank scores what it evaluated, and floating point may differ between them: all follow
        # rank 0's score, so that all or none enter the gather below (a collective under FSDP2).
        score, metrics = self.ctx.all_gather_object((score, metrics))[0]
        if score <= self.best["score"]:
            return
        self.best.update(score=score, step=step, metrics=metrics)
        # Every rank takes part in gathering the state (FSDP shards it); rank 0 writes it.
        state = {k: v.detach().cpu() for k, v in full_model_state_dict(model, self.ctx).items()}
        if self.ctx.is_main:
            staging = self.run_dir.staging(self.run_dir.best)
            self.save_model(staging, state)
            for path in staging.iterdir():  # the model's files: a full model's, or a LoRA adapter's
                os.replace(path, self.out_dir / path.name)
            shutil.rmtree(staging, ignore_errors=True)
            write_json(self.run_dir.best, self.best)


def load_examples(config: FinetuneConfig, split: str) -> list[Example]:
    """The train or dev split: the user's file or a named public dataset."""
    path = config.train if split == "train" else config.dev
    if path:
        columns = parse_columns(config.columns)
        examples = read_table(path, config.task, columns)
        if not examples:
            raise DataError(
                f"{path}: no examples (the file is empty, or a header alone): nothing to {split} on"
            )
        unlabelled = [e for e in examples if e.label is None or not str(e.label).strip()]
        if len(unlabelled) == len(examples) and config.task not in GENERATIVE_TASKS:
            label_column = columns.get("label", "label")
            raise DataError(
                f"{path}: no example has a label (column {label_column!r}); "
                "name the label column with --columns label=NAME"
            )
        return examples
    if config.dataset:
        return read_dataset(config.dataset, split, config.data_dir)
    raise ValueError(f"no {split} data: give --{split} FILE or --dataset NAME")


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(parameters trained, all parameters)."""
    counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
    return sum(n for n, trained in counts if trained), sum(n for n, _ in counts)
